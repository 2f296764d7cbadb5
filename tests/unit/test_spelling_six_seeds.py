"""benchmarks/spelling_six_seeds.py: the verdicts of S1-S4 from a reading built by hand, and the
count of steps that updated the policy under dynamic sampling."""

from __future__ import annotations

import pytest
from benchmarks.spelling_six_seeds import NEW_SEEDS, S3_KEEP_BY_CORRECTNESS, as_stated, plot, read, updated_steps

# 23 recipes, as the reading has: 11 of no part in a prediction, then the named ones.
RECIPES = [f"r{i}" for i in range(11)] + ["sapo", "topr", "opo", "gdpo", "luspo", "dr_grpo", "maxrl",
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


def runs(updates: dict[tuple[str, int], int], high: int) -> dict[tuple[str, int], dict]:
    """The 69 new runs: the first `high` end at exactly 11%, the rest at 7%; the correctness-keeping
    recipes update on 2 steps with no_gradient unless `updates` says otherwise."""
    made = {}
    for index, (name, seed) in enumerate((name, seed) for name in RECIPES for seed in NEW_SEEDS):
        stuck = name in S3_KEEP_BY_CORRECTNESS
        made[name, seed] = record(name, 0.11 if index < high else 0.07, updates.get((name, seed), 2 if stuck else 40),
                                  ("no_gradient",) if stuck else ())
    return made


def test_each_prediction_at_its_stated_ends():
    named = {"sapo", "topr", "opo", "gdpo", "luspo"}
    others = [name for name in RECIPES if name not in named]

    def clearing(count: int) -> set[str]:
        return named | set(others[: count - 5])

    at_ends = runs({("dapo", 5): 5}, high=21)  # 5 updates: at most 5; 21 of 69 at 11%: 30.4%
    verdicts = read(reading(clearing(13)), at_ends)
    assert verdicts["S1"]["clearing"] == 13 and verdicts["S1"]["held"]
    assert read(reading(clearing(19)), at_ends)["S1"]["held"]
    assert not read(reading(clearing(12)), at_ends)["S1"]["held"]
    assert not read(reading(clearing(20)), at_ends)["S1"]["held"]
    assert verdicts["S2"]["held"] and verdicts["S2"]["likeliest_below_that_stayed_below"] == [
        "dr_grpo", "reinforce_pp_baseline", "maxrl"]
    assert verdicts["S3"]["runs"]["dapo_seed5"] == {"updated_steps": 5, "no_gradient": True} and verdicts["S3"]["held"]
    assert verdicts["S4"]["high"] == 21 and verdicts["S4"]["held"]
    assert read(reading(clearing(13)), runs({}, high=41))["S4"]["held"]  # 59.4%
    assert not read(reading(clearing(13)), runs({}, high=42))["S4"]["held"]  # 60.9%
    assert not read(reading(clearing(13)), runs({}, high=20))["S4"]["held"]  # 29.0%


def test_each_prediction_failing():
    verdicts = read(reading({*RECIPES[:11], "topr", "opo", "gdpo", "luspo", "dr_grpo"}), runs({("dapo", 5): 6}, high=9))
    assert verdicts["S1"]["clearing"] == 16 and verdicts["S1"]["held"]
    assert verdicts["S2"]["cleared_of_five"] == ["topr", "opo", "gdpo", "luspo"] and not verdicts["S2"]["held"]
    assert verdicts["S2"]["likeliest_below_that_stayed_below"] == ["reinforce_pp_baseline", "maxrl"]
    assert verdicts["S3"]["runs"]["dapo_seed5"]["updated_steps"] == 6 and not verdicts["S3"]["held"]
    assert verdicts["S4"]["share"] == pytest.approx(9 / 69) and not verdicts["S4"]["held"]
    silent = runs({}, high=21)
    silent["prime", 4]["alarms"] = []  # every run updated on 2 steps, but one without the alarm
    assert not read(reading({*RECIPES[:13]}), silent)["S3"]["held"]


def test_only_the_stated_reading_is_read():
    stated = {**reading(set()), "seeds": [0, 1, 2, 3, 4, 5], "steps": 40, "variant": {"name": "own_rate"},
              "complete": True}
    assert as_stated(stated) is None
    assert "seeds [0, 1, 2]" in as_stated({**stated, "seeds": [0, 1, 2]})  # a --summary-only at the default seeds
    assert "22 of 23" in as_stated({**stated, "tasks": {"spelling": dict(list(stated["tasks"]["spelling"].items())[1:])}})
    assert "complete=False" in as_stated({**stated, "complete": False})
    assert as_stated({**stated, "variant": {"name": "own_rate_keep_reward"}}) is not None


def test_the_picture_of_both_looks(tmp_path):
    pytest.importorskip("matplotlib")
    six = reading({"sapo"})
    assert plot(six, reading(set()), tmp_path / "six.png")
    assert (tmp_path / "six.png").stat().st_size > 10_000
