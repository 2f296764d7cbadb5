"""`reasonrl inspect`: a step's rollouts as a terminal table, on a run directory written by hand
(test_report's: 3 steps; step 3 holds correct a, c, f, wrong b, d, e, truncated b, c), with an
alarm at step 2."""

from __future__ import annotations

import json

import pytest
from helpers import write_run
from rich.console import Console

from reasonrl.commands.cli import main
from reasonrl.commands.inspect_run import inspect_run


@pytest.fixture
def run_dir(tmp_path):
    directory = write_run(tmp_path / "run")
    with (directory / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "alarm/entropy_collapse": 1.0}) + "\n")
    return directory


def shown(run_dir, **options) -> str:
    console = Console(record=True, width=200, color_system=None)
    assert inspect_run(run_dir, console=console, **options) == 0
    return console.export_text()


def completions(text: str) -> set[str]:
    """The step-3 completions (a to f) whose text shows in the table."""
    return {letter for letter in "abcdef" if f"│ {letter}: " in text}


def test_the_newest_step_with_every_completion_and_its_numbers(run_dir):
    text = shown(run_dir)
    assert text.startswith("step 3 of 3: 6 completions, reward mean 0.567, correct 3/6, truncated 2")
    assert completions(text) == set("abcdef")
    for column in ("problem", "answer", "reward", "correct", "format", "adv", "tokens", "end", "completion"):
        assert column in text
    assert "length" in text and "ALARM" not in text


@pytest.mark.parametrize("kind,expected", [("wrong", "bde"), ("truncated", "bc")])
def test_filters_keep_the_wrong_or_the_truncated(run_dir, kind, expected):
    assert completions(shown(run_dir, kind=kind)) == set(expected)


def test_the_alarm_filter_picks_the_step_an_alarm_held_and_marks_it(run_dir):
    text = shown(run_dir, kind="alarm")
    assert text.startswith("step 2 of 3: 6 completions") and "ALARM: entropy_collapse" in text
    assert "alarm steps: 2: entropy_collapse" in text
    assert "step 2 p1 0" in text and completions(text) == set()
    assert "ALARM" in shown(run_dir, step=2) and "ALARM" not in shown(run_dir, step=1)


def test_long_completions_are_cut_and_rows_limited(run_dir):
    text = shown(run_dir, chars=5, limit=2)
    assert "a: \\b [... 7 more characters]" in text
    assert "4 more completions not shown (--limit)" in text


def test_the_command_line_and_its_errors(run_dir, tmp_path, capsys):
    assert main(["inspect", str(run_dir), "--step", "1", "--filter", "wrong"]) == 0
    out = capsys.readouterr().out
    assert "step 1 of 3" in out
    # the four wrong completions of step 1 (each problem's first is the right one), and only those
    assert all(f"step 1 {problem} {i}" in out for problem in ("p1", "p2") for i in (1, 2))
    assert "step 1 p1 0" not in out and "step 1 p2 0" not in out
    assert main(["inspect", str(run_dir), "--step", "7"]) == 2
    err = capsys.readouterr().err
    assert "step 7 is not in" in err and "logged steps: 1-3" in err
    assert main(["inspect", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
