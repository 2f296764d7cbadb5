"""`reasonrl.train` with asynchronous (one-step-off) rollouts, on a tiny model and without Ray: each
sample is tagged with the policy version that produced it, stays within the staleness bound, and
still learns (while a flipped advantage sign does not); a run stopped with rollouts in flight
resumes exactly; a reward that runs the trained policy is refused."""

from __future__ import annotations

import shutil

import pytest
import torch
from helpers import (
    TASK,
    checkpoint_parameters,
    negated_grpo,
    reward_curve,
    run_metrics,
    run_rollouts,
    share_of_a,
    tiny_config,
)

from reasonrl import train


def test_one_step_off_tags_versions_within_the_bound_and_learns(tiny_model_dir, tmp_path):
    steps = "train.steps=30"
    train(tiny_config(tiny_model_dir, tmp_path / "up", steps, "rollout.max_staleness=1"), task=TASK,
          reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "down", steps, "rollout.max_staleness=1",
                      f"algo.advantage={negated_grpo.__module__}:negated_grpo"), task=TASK, reward=share_of_a)
    records = run_rollouts(tmp_path / "up")
    for record in records:  # logged step s trained as update s - 1, at learner version s - 1
        behind = (record["step"] - 1) - record["policy_version"]
        assert 0 <= behind <= 1, record
    first_two = sorted({(r["step"], r["policy_version"]) for r in records if r["step"] <= 2})
    assert first_two == [(1, 0), (2, 0)]  # step 2 was generated with the initial weights while step 1 trained
    logged = [m for m in run_metrics(tmp_path / "up") if "async/staleness_max" in m]
    assert len(logged) == 30 and all(m["async/staleness_max"] <= 1 for m in logged)
    # algo.tis=auto corrects the stale samples: a weight of 1 (to the float rounding of engine and learner)
    # while the sampler's weights are the learner's (step 1), other than 1 once they lag (step 2 on)
    weights = [m["rollout/tis_weight"] for m in logged]
    assert abs(weights[0] - 1) < 1e-3 and max(abs(w - 1) for w in weights[1:]) > 1e-2, weights
    up, down = reward_curve(tmp_path / "up"), reward_curve(tmp_path / "down")
    start = sum(up[:3]) / 3
    assert sum(up[-5:]) / 5 > start + 0.5, up
    assert sum(down[-5:]) / 5 < start, down


def test_async_run_resumes_with_the_rollouts_it_had_in_flight(tiny_model_dir, tmp_path):
    """A run stopped right after its step-2 checkpoint (step 3's rollouts, generated with version 1
    while step 2 trained, were in flight) continues as if it had not stopped."""
    extra = ("rollout.max_staleness=1", "run.save_every=2")
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", *extra), task=TASK, reward=share_of_a)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *extra),
          task=TASK, reward=share_of_a)
    straight, resumed = run_rollouts(tmp_path / "straight"), run_rollouts(tmp_path / "resumed")
    assert [(r["step"], r["completion"], r["policy_version"]) for r in straight] == \
        [(r["step"], r["completion"], r["policy_version"]) for r in resumed]
    assert {r["policy_version"] for r in straight if r["step"] == 3} == {1}
    ours, theirs = checkpoint_parameters(tmp_path / "straight", 4), checkpoint_parameters(tmp_path / "resumed", 4)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_async_refuses_a_reward_that_runs_the_trained_policy(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="max_staleness"):
        train(tiny_config(tiny_model_dir, tmp_path / "x", "rollout.max_staleness=1", "reward.confidence=neg_entropy"),
              task=TASK)  # the config's reward: a Python one would replace reward.confidence
