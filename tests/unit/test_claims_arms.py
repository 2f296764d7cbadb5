"""benchmarks/claims.py's covariance claim compares like with like: its PPO-clip arm has the
covariance recipes' schedule and sampling, so that the objective is all that differs (when the
recipes took the authors' dynamic sampling, a baseline without it would have credited the sampling
to the covariance methods)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from benchmarks.claims import CLAIMS, Arm

from reasonrl.config.loading import load_config
from reasonrl.recipes import config_path


def arm_config(arm: Arm) -> dict:
    return asdict(load_config(config_path(arm.config) if arm.config else None, arm.overrides))


@pytest.mark.parametrize("recipe", ["clip_cov", "kl_cov"])
def test_the_cov_baseline_differs_from_each_covariance_recipe_only_in_its_objective(recipe):
    arms = CLAIMS["cov"].arms
    baseline, method = arm_config(arms["ppo_clip"]), arm_config(arms[recipe])
    assert baseline["sampling"]["dynamic"] and baseline["train"]["mini_batches"] == 4  # the recipes' own
    for section in method:
        if section != "algo":
            assert method[section] == baseline[section], section
    for knob in ("advantage", "aggregation", "kl_coef"):
        assert method["algo"][knob] == baseline["algo"][knob], knob
    assert (baseline["algo"]["objective"], method["algo"]["objective"]) == ("ppo_clip", recipe)
    assert (baseline["algo"]["clip_low"], baseline["algo"]["clip_high"]) == (0.2, 0.2)
