"""A config file that cannot be read (not UTF-8, nested deeper than tomllib can parse) is a
ConfigError naming the file, and `reasonrl eval --config` says so in one line."""

from __future__ import annotations

import pytest

from reasonrl.cli import main
from reasonrl.config import ConfigError, load_config

UNREADABLE = [
    (b"[train]\nsteps = 3\n# r\xe9sum\xe9 in Latin-1\n", "not UTF-8 text (line 3)"),
    (b"[task]\nname = " + b"[" * 5000 + b"]" * 5000 + b"\n", "arrays or inline tables nested too deep to read"),
    (b"[task]\nname = " + b"{a = " * 5000 + b"1" + b"}" * 5000 + b"\n", "nested too deep"),
]


@pytest.mark.parametrize(("content", "named"), UNREADABLE)
def test_an_unreadable_config_file_is_a_config_error_naming_it(tmp_path, content, named):
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="nested too deep|not UTF-8") as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: ") and named in str(raised.value)


def test_a_deeply_nested_override_is_a_wrong_value_not_a_crash():
    with pytest.raises(ConfigError, match="train.steps: expected int"):
        load_config(overrides=["train.steps=" + "[" * 5000 + "]" * 5000])


@pytest.mark.parametrize(("content", "named"), UNREADABLE[:2])
def test_eval_names_an_unreadable_config_in_one_line(tmp_path, capsys, content, named):
    path = tmp_path / "run.toml"
    path.write_bytes(content)
    assert main(["eval", str(tmp_path / "no-model"), "--config", str(path), "--out", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"reasonrl eval: {path}: ") and named in err
