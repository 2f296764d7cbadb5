"""`reasonrl.train` with rollouts in Ray workers, on a tiny model: backend=ray with 2 workers trains on
the samples of backend=local and ends at the same parameters; two learner ranks (replicated or FSDP)
update as one local learner; a Ray run resumed from a checkpoint continues exactly. (Asynchronous
rollouts without Ray: test_async_train.py, outside the Ray group so that another worker takes it.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import TASK, checkpoint_parameters, parameters, run_metrics, run_rollouts, share_of_a, tiny_config

from reasonrl import train


def samples(run_dir: Path) -> list[tuple]:
    return [(r["step"], r["problem_id"], r["completion"], r["num_tokens"], r["reward"]) for r in run_rollouts(run_dir)]


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
    straight, other = checkpoint_parameters(tmp_path / "local", 3), checkpoint_parameters(tmp_path / "ray", 3)
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
    local, ranks = checkpoint_parameters(tmp_path / "local", 3), checkpoint_parameters(tmp_path / "ranks", 3)
    initial = parameters(tiny_model_dir)
    for name in local:  # equal up to the order of float sums in the all-reduce
        torch.testing.assert_close(ranks[name], local[name], atol=2e-5, rtol=0)
    moved = max((local[name] - initial[name]).abs().max().item() for name in local)
    assert moved > 100 * 2e-5  # the tolerance is far below what training changed
    assert samples(tmp_path / "ranks") == samples(tmp_path / "local")
    logged_local = [m["loss/policy"] for m in run_metrics(tmp_path / "local") if "loss/policy" in m]
    logged_ranks = [m["loss/policy"] for m in run_metrics(tmp_path / "ranks") if "loss/policy" in m]
    assert logged_ranks == pytest.approx(logged_local, abs=1e-5)


@pytest.mark.parametrize("learner", [(), (*LEARNER_RANKS, "run.learner_shard=true")], ids=["local-learner", "fsdp"])
def test_ray_run_resumes_exactly(ray_available, tiny_model_dir, tmp_path, monkeypatch, learner):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Two steps, resumed after the first: the second step's update reads the optimizer's moments, the
    # sampler's state and the workers' weights as the checkpoint restored them.
    ray = (*RAY, *learner, "run.save_every=1")
    train(tiny_config(tiny_model_dir, tmp_path / "straight", "train.steps=2", *ray), task=TASK, reward=share_of_a)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")  # as if stopped after its step-1 checkpoint
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_000002")
    train(tiny_config(tiny_model_dir, tmp_path / "resumed", "train.steps=2", "run.resume=true", *ray),
          task=TASK, reward=share_of_a)
    assert samples(tmp_path / "straight") == samples(tmp_path / "resumed")
    straight, resumed = checkpoint_parameters(tmp_path / "straight", 2), checkpoint_parameters(tmp_path / "resumed", 2)
    assert any(not torch.equal(straight[n], parameters(tiny_model_dir)[n]) for n in straight)  # not vacuous
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name


@pytest.mark.parametrize(("knobs", "message"), [
    (("run.learner_shard=true",), "run.learner_shard=True has no effect: .* only when run.learner_workers > 0"),
    ((*RAY, *LEARNER_RANKS, "run.learner_shard=true", "train.lora_rank=4"), "does not combine with train.lora_rank"),
])
def test_fsdp_refuses_what_it_cannot_shard(tiny_model_dir, tmp_path, knobs, message):
    with pytest.raises(ValueError, match=message):
        train(tiny_config(tiny_model_dir, tmp_path / "x", *knobs), task=TASK, reward=share_of_a)
