"""`reasonrl.train` with rollouts in Ray workers and with asynchronous rollouts, on a tiny model:
backend=ray with 2 workers trains on the samples of backend=local and ends at the same
parameters; a Ray run resumed from a checkpoint continues exactly; one-step-off training
tags each sample with the policy version that produced it, stays within the staleness bound,
and still learns (while a flipped advantage sign does not)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import TASK, negated_grpo, parameters, reward_curve, share_of_a, tiny_config

from reasonrl import train


def rollouts(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def samples(run_dir: Path) -> list[tuple]:
    return [(r["step"], r["problem_id"], r["completion"], r["num_tokens"], r["reward"]) for r in rollouts(run_dir)]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_parameters(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return parameters(run_dir / "checkpoints" / f"step_{step:06d}" / "policy")


RAY = ("run.backend=ray", "run.ray_workers=2", "run.ray_cpus_per_worker=0.5")


@pytest.fixture(scope="module")
def ray_available():
    """One local Ray instance, without the dashboard, for every Ray run of this module: each train()
    finds it started and uses it (starting and stopping one per run cost ~9 s each, nine times)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}})
    try:
        yield
    finally:
        ray.shutdown()


def test_ray_backend_trains_on_the_samples_of_the_local_backend(ray_available, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train(tiny_config(tiny_model_dir, tmp_path / "local", "train.steps=3"), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "ray", "train.steps=3", *RAY), task=TASK, reward=share_of_a)
    local, remote = samples(tmp_path / "local"), samples(tmp_path / "ray")
    assert len(local) == 3 * 4 * 8 and len({s[2] for s in local}) > 8  # not vacuous: varied samples
    assert remote == local
    straight, other = final_parameters(tmp_path / "local", 3), final_parameters(tmp_path / "ray", 3)
    assert any(not torch.equal(straight[n], parameters(tiny_model_dir)[n]) for n in straight)
    for name in straight:  # on-policy updates read the learner's log-probs, not the engine's
        assert torch.equal(straight[name], other[name]), name


LEARNER_RANKS = ("run.learner_workers=2", "run.ray_cpus_per_learner=0.5")


@pytest.mark.parametrize("shard", [False, True], ids=["replicated", "fsdp"])
def test_two_ray_learner_ranks_update_as_one_local_learner(ray_available, tiny_model_dir, tmp_path, monkeypatch,
                                                          shard):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Two epochs x two mini-batches: the ranks also share the old-policy log-probs and the optimizer steps.
    extra = ("train.steps=3", "train.ppo_epochs=2", "train.mini_batches=2", "train.micro_batch_size=5")
    train(tiny_config(tiny_model_dir, tmp_path / "local", *extra), task=TASK, reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "ranks", *extra, *RAY, *LEARNER_RANKS,
                      f"run.learner_shard={str(shard).lower()}"), task=TASK, reward=share_of_a)
    local, ranks = final_parameters(tmp_path / "local", 3), final_parameters(tmp_path / "ranks", 3)
    initial = parameters(tiny_model_dir)
    for name in local:  # equal up to the order of float sums in the all-reduce
        torch.testing.assert_close(ranks[name], local[name], atol=2e-5, rtol=0)
    moved = max((local[name] - initial[name]).abs().max().item() for name in local)
    assert moved > 100 * 2e-5  # the tolerance is far below what training changed
    assert samples(tmp_path / "ranks") == samples(tmp_path / "local")
    logged_local = [m["loss/policy"] for m in metrics(tmp_path / "local") if "loss/policy" in m]
    logged_ranks = [m["loss/policy"] for m in metrics(tmp_path / "ranks") if "loss/policy" in m]
    assert logged_ranks == pytest.approx(logged_local, abs=1e-5)


@pytest.mark.parametrize("learner", [(), (*LEARNER_RANKS, "run.learner_shard=true")], ids=["local-learner", "fsdp"])
def test_ray_run_resumes_exactly(ray_available, tiny_model_dir, tmp_path, monkeypatch, learner):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ray = (*RAY, *learner, "run.save_every=2")
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=4", *ray), task=TASK, reward=share_of_a)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")  # as if stopped after its step-2 checkpoint
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000004")
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=4", "run.resume=true", *ray),
          task=TASK, reward=share_of_a)
    assert samples(tmp_path / "straight") == samples(tmp_path / "resumed")
    straight, resumed = final_parameters(tmp_path / "straight", 4), final_parameters(tmp_path / "resumed", 4)
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


def test_one_step_off_tags_versions_within_the_bound_and_learns(tiny_model_dir, tmp_path):
    steps = "train.steps=30"
    train(tiny_config(tiny_model_dir, tmp_path / "up", steps, "rollout.max_staleness=1"), task=TASK,
          reward=share_of_a)
    train(tiny_config(tiny_model_dir, tmp_path / "down", steps, "rollout.max_staleness=1",
                      f"algo.advantage={negated_grpo.__module__}:negated_grpo"), task=TASK, reward=share_of_a)
    records = rollouts(tmp_path / "up")
    for record in records:  # logged step s trained as update s - 1, at learner version s - 1
        behind = (record["step"] - 1) - record["policy_version"]
        assert 0 <= behind <= 1, record
    first_two = sorted({(r["step"], r["policy_version"]) for r in records if r["step"] <= 2})
    assert first_two == [(1, 0), (2, 0)]  # step 2 was generated with the initial weights while step 1 trained
    logged = [m for m in metrics(tmp_path / "up") if "async/staleness_max" in m]
    assert len(logged) == 30 and all(m["async/staleness_max"] <= 1 for m in logged)
    assert all("rollout/tis_weight" in m for m in logged)  # algo.tis=auto corrects the stale samples
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
    straight, resumed = rollouts(tmp_path / "straight"), rollouts(tmp_path / "resumed")
    assert [(r["step"], r["completion"], r["policy_version"]) for r in straight] == \
        [(r["step"], r["completion"], r["policy_version"]) for r in resumed]
    assert {r["policy_version"] for r in straight if r["step"] == 3} == {1}
    ours, theirs = final_parameters(tmp_path / "straight", 4), final_parameters(tmp_path / "resumed", 4)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


@pytest.mark.parametrize(("knobs", "message"), [
    (("run.learner_shard=true",), "run.learner_shard=True has no effect: .* only when run.learner_workers > 0"),
    ((*RAY, *LEARNER_RANKS, "run.learner_shard=true", "train.lora_rank=4"), "does not combine with train.lora_rank"),
])
def test_fsdp_refuses_what_it_cannot_shard(tiny_model_dir, tmp_path, knobs, message):
    with pytest.raises(ValueError, match=message):
        train(tiny_config(tiny_model_dir, tmp_path / "x", *knobs), task=TASK, reward=share_of_a)


def test_async_refuses_a_reward_that_runs_the_trained_policy(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="max_staleness"):
        train(tiny_config(tiny_model_dir, tmp_path / "x", "rollout.max_staleness=1", "reward.confidence=neg_entropy"),
              task=TASK)  # the config's reward: a Python one would replace reward.confidence
