"""Two runs that convert the built-in model at once: the second to finish keeps the first's copy
instead of failing (a rename onto a full directory), and any other failure still raises."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from reasonrl.models import publish


def staged(root: Path, name: str, weights: bytes) -> Path:
    directory = root / name
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(weights)
    return directory


def test_the_first_copy_is_published(tmp_path):
    target = tmp_path / "model"
    publish(staged(tmp_path, ".convert-a", b"a"), target)
    assert (target / "model.safetensors").read_bytes() == b"a"
    assert not (tmp_path / ".convert-a").exists()


def test_a_second_copy_finishing_later_is_dropped_and_the_first_kept(tmp_path):
    target = tmp_path / "model"
    publish(staged(tmp_path, ".convert-a", b"a"), target)
    publish(staged(tmp_path, ".convert-b", b"b"), target)
    assert (target / "model.safetensors").read_bytes() == b"a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_target_that_is_not_a_model_still_fails(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "notes.txt").write_text("a user's file")
    with pytest.raises(OSError) as failure:
        publish(staged(tmp_path, ".convert-a", b"a"), target)
    assert failure.value.errno in (errno.ENOTEMPTY, errno.EEXIST)
    assert (target / "notes.txt").exists()
