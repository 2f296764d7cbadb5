"""benchmarks/default_wall_time.py: its arms are the jobs they name (each on its allocator), and its
summary's ratios are the per-seed ratios of the seconds of steps and their geometric mean, worked by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from benchmarks import default_wall_time, runs


def test_each_arm_is_its_job_on_the_allocator_make_train_used() -> None:
    arms = {spec.name: spec for spec in default_wall_time.specs((7,))}
    assert arms["filed_seed7"].args == ("train.lr=2e-5", "sampling.mask_truncated=false", "run.seed=7")
    assert arms["previous_seed7"].args == ("sampling.mask_truncated=false", "run.seed=7")
    assert arms["make_train_seed7"].args == ("run.seed=7",)
    assert [arms[name].allocator for name in ("filed_seed7", "previous_seed7", "make_train_seed7")] == [
        "glibc", "glibc", "auto"]
    assert all(spec.config is None for spec in arms.values())  # the default job, no recipe file


def record(steps: list[float], accuracy: float) -> dict:
    return {"curves": {"perf/step_s": steps, "rollout/len_mean": [10.0] * 5, "rollout/generated_tokens": [5] * 2},
            "eval_last": {"eval/sampled_accuracy": accuracy}, "wall_s": sum(steps) + 30, "alarms": [],
            "allocator": {"choice": "glibc", "preloaded": None}, "commit": "c", "source": "s", "device": "cpu"}


def test_the_ratios_are_per_seed_and_their_geometric_mean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runs, "RESULTS", tmp_path)
    seconds = {"filed": (50.0, 100.0), "previous": (100.0, 100.0), "make_train": (200.0, 100.0)}
    for arm, per_seed in seconds.items():
        for seed, total in zip((1, 2), per_seed, strict=True):
            path = tmp_path / default_wall_time.STUDY / f"{arm}_seed{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record([total / 2, total / 2], 0.5)))
    report = default_wall_time.summarize((1, 2, 3))  # seed 3 has no records: left out
    assert report["seeds"] == [1, 2]
    row = report["ratios"]["make_train/previous"]
    assert row["per_seed"] == [2.0, 1.0]
    assert row["geometric_mean"] == pytest.approx(math.sqrt(2))
    # logs ln 2 and 0: mean ln2/2, sd ln2/sqrt(2); t(1 df) = 12.706; half width 12.706 * (ln2/sqrt2) / sqrt2
    half = 12.7062 * math.log(2) / 2
    assert row["ci95"] == pytest.approx([math.exp(math.log(2) / 2 - half), math.exp(math.log(2) / 2 + half)], rel=1e-3)
    assert report["ratios"]["make_train/filed"]["per_seed"] == [4.0, 1.0]
    assert report["table"]["filed"]["step_s"] == [50.0, 100.0]
    assert report["table"]["filed"]["sampled_accuracy"] == [50.0, 50.0]
