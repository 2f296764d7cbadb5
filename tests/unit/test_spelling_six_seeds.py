"""benchmarks/spelling_six_seeds.py: the verdicts of S1-S4 from a reading built by hand, and the
count of steps that updated the policy under dynamic sampling."""

from __future__ import annotations

import pytest
from benchmarks.spelling_six_seeds import NEW_SEEDS, S3_KEEP_BY_CORRECTNESS, plot, read, updated_steps

RECIPES = [f"r{i}" for i in range(18)] + ["sapo", "topr", "opo", "gdpo", "luspo", "dr_grpo", "maxrl",
                                          "reinforce_pp_baseline", "dapo", "clip_cov", "kl_cov", "prime"]


def record(name: str, after: float, updates: int = 40, alarms: tuple[str, ...] = ()) -> dict:
    # 40 steps of one round each, 4 groups a round (every recipe's prompts_per_step on this task):
    # all 4 dropped on the steps that did not update.
    return {"config": name if name in S3_KEEP_BY_CORRECTNESS else "grpo", "args": [],
            "eval_last": {"eval/sampled_accuracy": after}, "alarms": list(alarms),
            "curves": {"sampling/rounds": [1.0] * 40, "sampling/dropped_groups": [0.0] * updates + [4.0] * (40 - updates)}}


def reading(clearing: set[str]) -> dict:
    def result(name: str) -> dict:
        met = name in clearing
        return {"target_met": met, "after_mean": 0.1, "after_ci_low": 0.06 if met else 0.04, "after_ci_high": 0.2,
                "seeds": []}

    return {"before": {"spelling": 0.055}, "tasks": {"spelling": {name: result(name) for name in RECIPES}}}


def test_updated_steps_counts_steps_with_a_kept_group():
    rounds = [3.0, 3.0, 1.0, 2.0]
    dropped = [12.0, 11.0, 3.0, 8.0]  # 4 groups a round: all dropped, one kept, one kept, all dropped
    assert updated_steps({"curves": {"sampling/rounds": rounds, "sampling/dropped_groups": dropped}}, 4) == 2


def test_the_verdicts_of_a_reading_made_by_hand():
    # 16 of 30 clear, the five S2 names among them; the four correctness-keeping recipes update on 2 steps
    # with no_gradient, but dapo's seed 5 on 6 steps; 9 of the 90 new runs end at 11% or more (10%).
    clearing = {*RECIPES[:11], "sapo", "topr", "opo", "gdpo", "luspo"}
    records = {}
    for name in RECIPES:
        for seed in NEW_SEEDS:
            stuck = name in S3_KEEP_BY_CORRECTNESS
            updates = 6 if (name, seed) == ("dapo", 5) else 2 if stuck else 40
            high = name in RECIPES[:3]
            records[name, seed] = record(name, 0.15 if high else 0.07, updates, ("no_gradient",) if stuck else ())
    verdicts = read(reading(clearing), records)
    assert verdicts["S1"]["clearing"] == 16 and verdicts["S1"]["held"]
    assert verdicts["S2"]["held"]
    assert verdicts["S2"]["likeliest_below_that_stayed_below"] == ["dr_grpo", "reinforce_pp_baseline", "maxrl"]
    assert verdicts["S3"]["runs"]["dapo_seed5"]["updated_steps"] == 6 and not verdicts["S3"]["held"]
    assert verdicts["S3"]["runs"]["prime_seed3"] == {"updated_steps": 2, "no_gradient": True}
    assert verdicts["S4"]["high"] == 9 and verdicts["S4"]["share"] == pytest.approx(0.1) and not verdicts["S4"]["held"]

    fewer = read(reading(clearing - {"sapo"}), records)
    assert fewer["S1"]["clearing"] == 15 and fewer["S1"]["held"] and not fewer["S2"]["held"]
    assert not read(reading(set(RECIPES)), records)["S1"]["held"]  # 30 clear: outside 13-19


def test_the_picture_of_both_looks(tmp_path):
    pytest.importorskip("matplotlib")
    six = reading({"sapo"})
    assert plot(six, reading(set()), tmp_path / "six.png")
    assert (tmp_path / "six.png").stat().st_size > 10_000
