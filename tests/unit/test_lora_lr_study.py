"""benchmarks/lora_lr.py: the runs it makes (seed-major, the first learning rate of each seed
evaluating before training for all) and the rule stated in docs/benchmarks.md before its runs."""

from __future__ import annotations

import pytest
from benchmarks.lora_lr import LEARNING_RATES, choose, specs, summarize


def row(median: float, low: float, *, seeds: int = 3, alarms: tuple[str, ...] = ()) -> dict:
    return {"seeds": seeds, "gain_median": median, "ci95": [low, low + 10.0], "alarms": list(alarms)}


def test_runs_are_seed_major_and_the_first_rate_of_a_seed_evaluates_before_training():
    runs = specs(LEARNING_RATES, (0, 1))
    assert [spec.name for spec in runs[:5]] == ["lr2e-5_seed0", "lr1e-4_seed0", "lr3e-4_seed0", "lr1e-3_seed0",
                                               "lr2e-5_seed1"]
    assert [spec.args[-1] for spec in runs[:5]] == ["eval.before=true", "eval.before=false", "eval.before=false",
                                                    "eval.before=false", "eval.before=true"]
    assert "train.lora_rank=16" in runs[0].args and "train.lr=3e-4" in runs[2].args


def test_the_rule_takes_the_highest_median_gain_whose_interval_is_above_zero_without_alarms():
    table = {"2e-5": row(0.5, -4.0), "1e-4": row(4.0, 1.0), "3e-4": row(20.0, -2.0),
             "1e-3": row(30.0, 5.0, alarms=("no_gradient",))}
    # 1e-3 alarms and 3e-4's interval reaches below 0: 1e-4 is the clear winner.
    assert choose(table, 3) == {"chosen": "1e-4", "clear": True,
                                "why": "highest median gain whose interval is above 0, without alarms"}
    table["3e-4"] = row(20.0, 0.1)
    assert choose(table, 3)["chosen"] == "3e-4"
    table["1e-4"] = row(20.0, 3.0)
    assert choose(table, 3)["chosen"] == "1e-4"  # a tie goes to the lower rate


def test_without_a_clear_winner_the_highest_quiet_median_is_named_and_incomplete_rates_are_left_out():
    table = {"2e-5": row(0.5, -4.0), "1e-4": row(4.0, -1.0), "3e-4": row(26.0, -50.0, seeds=2)}
    assert choose(table, 3) == {"chosen": "1e-4", "clear": False,
                                "why": "no learning rate's interval is above 0: highest median gain without alarms"}
    assert choose({"1e-4": row(4.0, 1.0, alarms=("clip_outliers",))}, 3)["chosen"] is None


def record(seed: int, after: float) -> dict:
    return {"args": ["train.lr=1e-4", f"run.seed={seed}"], "eval_last": {"eval/sampled_accuracy": after},
            "alarms": [], "curves": {"perf/step_s": [1.0, 2.0]}, "commit": "c", "device": "cpu"}


def test_a_rows_gains_are_after_minus_each_seeds_accuracy_before():
    summary = summarize([record(0, 0.155), record(1, 0.11), record(2, 0.15)], {0: 11.5, 1: 7.5, 2: 7.0})
    assert summary["per_seed"] == {0: 4.0, 1: 3.5, 2: 8.0}
    assert summary["gain_median"] == 4.0 and summary["gain_mean"] == pytest.approx(15.5 / 3)
    # Student t, 2 degrees of freedom: 5.167 -/+ 4.303 x stdev(4, 3.5, 8) / sqrt(3) = 5.167 -/+ 4.303 x 2.4664 / 1.7321.
    assert summary["ci95"] == pytest.approx([15.5 / 3 - 6.1275, 15.5 / 3 + 6.1275], abs=1e-3)
    assert summary["train_wall_s_median"] == 3.0
