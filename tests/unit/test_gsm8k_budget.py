"""benchmarks/gsm8k.py: the names its arms may take, its seed given once, and its time budget over
resumes: the minutes behind a checkpoint are its steps' times, a step run again after a resume counted
once (as its last run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.gsm8k import minutes_trained


def test_minutes_behind_a_checkpoint_count_each_step_once(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "perf/step_s": 60.0}, {"step": 2, "perf/step_s": 30.0},
            {"step": 2, "eval/greedy_accuracy": 0.5},  # a row without a step time
            {"step": 3, "perf/step_s": 45.0},          # lost: the run stopped before step 4's checkpoint
            {"step": 3, "perf/step_s": 40.0}, {"step": 4, "perf/step_s": 20.0}]  # resumed from step 2
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert minutes_trained(metrics, 2) == pytest.approx((60 + 30) / 60)
    assert minutes_trained(metrics, 4) == pytest.approx((60 + 30 + 40 + 20) / 60)
    assert minutes_trained(tmp_path / "none.jsonl", 0) == 0.0
    with pytest.raises(ValueError, match=r"no step time for steps \[5\]"):
        minutes_trained(metrics, 5)


@pytest.mark.parametrize("arm", ["../elsewhere", "a/b", "", "name with space", "..", ".", ".hidden"])
def test_an_arm_name_that_is_not_a_plain_file_name_is_refused(arm: str, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.gsm8k import main

    with pytest.raises(SystemExit):
        main(["--arm", arm])
    assert "--arm must be a plain file name" in capsys.readouterr().err


def test_a_seed_among_the_overrides_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.gsm8k import main

    with pytest.raises(SystemExit):
        main(["--recipe", "grpo", "run.seed=3"])
    assert "give the seed as --seed N" in capsys.readouterr().err
