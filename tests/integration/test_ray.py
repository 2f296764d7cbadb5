"""Rollout workers as Ray actors on a tiny model: two workers sample exactly what one local engine
samples (both seed each problem by its index in the step), weights synced after an update reach every worker, and a worker
killed in the middle of a step is restarted with its chunk re-queued, nothing lost or doubled."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from reasonrl.distributed.ray import HFEngineFactory, RayRolloutEngine, wait_until_alive
from reasonrl.models import copy_weights
from reasonrl.types import Problem, SamplingParams

PROBLEMS = [Problem(id=str(i), prompt=f"What is {i} + {i * 3}?", answer=str(4 * i)) for i in range(5)]
SAMPLING = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=7)


@dataclass(frozen=True)
class SlowWhileFlagged:
    """Builds the hf engine; while `flag` exists, each generate call first sleeps `delay_s`, so a
    test can kill a worker while it is surely in the middle of a chunk."""

    make: HFEngineFactory
    flag: str
    delay_s: float = 0.5

    def __call__(self):
        engine, flag, delay_s = self.make(), self.flag, self.delay_s
        generate = engine.generate

        def slow_generate(problems, sampling, seeds=None):
            if os.path.exists(flag):
                time.sleep(delay_s)
            return generate(problems, sampling, seeds=seeds)

        engine.generate = slow_generate
        return engine


def wide_tiny_model(directory: Path, seed: int) -> Path:
    """A tiny random model whose samples vary with the prompt (the default one repeats a token)."""
    from helpers import build_tiny_model

    return build_tiny_model(directory, seed=seed, initializer_range=0.5)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    return (wide_tiny_model(tmp_path_factory.mktemp("ray-model"), seed=0),
            wide_tiny_model(tmp_path_factory.mktemp("ray-other-model"), seed=1))


@pytest.fixture(scope="module")
def flag(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("ray-flag") / "slow"


@pytest.fixture(scope="module")
def engines(models, flag):
    """(two Ray workers, a local engine), both on the first model."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the test module
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}})
    torch.set_num_threads(1)
    make = HFEngineFactory(str(models[0]))
    try:
        remote = RayRolloutEngine(SlowWhileFlagged(make, str(flag)), workers=2)
        yield remote, make()
    finally:
        ray.shutdown()


def samples(groups):
    """What was sampled, exactly: problem, prompt, and per completion its tokens, text, finish."""
    return [(g.problem, g.prompt_ids, [(c.token_ids, c.text, c.finish_reason) for c in g.completions])
            for g in groups]


def assert_same_samples(groups, expected):
    """The same samples; log-probs equal up to float rounding (an engine batching problems with
    per-problem seeds computes them in batches of other shapes)."""
    assert samples(groups) == samples(expected)
    for group, reference in zip(groups, expected):
        for completion, other in zip(group.completions, reference.completions):
            torch.testing.assert_close(torch.tensor(completion.logprobs), torch.tensor(other.logprobs),
                                       atol=1e-4, rtol=0)


def test_two_workers_sample_what_the_local_engine_samples(engines):
    remote, local = engines
    expected = local.generate(PROBLEMS, SAMPLING)
    assert_same_samples(remote.generate(PROBLEMS, SAMPLING), expected)
    # Not vacuous: problems and the samples of a group differ from one another.
    assert len({tuple(c.token_ids for c in g.completions) for g in expected}) == len(PROBLEMS)
    assert all(len({c.token_ids for c in g.completions}) > 1 for g in expected)


def test_synced_weights_reach_every_worker(engines, models):
    remote, local = engines
    before = samples(remote.generate(PROBLEMS, SAMPLING))
    other = HFEngineFactory(str(models[1]))().model
    for engine in (remote, local):
        engine.load_weights(other.named_parameters())
    # Chunks of one problem: every worker generates some of them.
    remote.chunk_size = 1
    try:
        after = remote.generate(PROBLEMS, SAMPLING)
    finally:
        remote.chunk_size = 0
    assert_same_samples(after, local.generate(PROBLEMS, SAMPLING))
    assert samples(after) != before


def test_a_worker_killed_mid_step_is_restarted_and_its_problems_requeued(engines, flag):
    remote, local = engines
    expected = local.generate(PROBLEMS, SAMPLING)  # with whatever weights the engines now share
    first_pid = remote.worker_pids()[0]
    restarts = remote.restarts
    flag.touch()
    try:
        pending = remote.submit(PROBLEMS, SAMPLING)  # chunks of 3 and 2 problems, 0.5 s a problem
        ray.kill(remote.workers[0], no_restart=False)
        groups = remote.collect(pending)
    finally:
        flag.unlink()
    assert remote.restarts == restarts + 1
    assert_same_samples(groups, expected)  # all problems, once each, in order
    wait_until_alive(remote, timeout_s=180)  # a restart builds a whole engine: slow on a loaded machine
    assert remote.worker_pids()[0] != first_pid
    # The restarted worker came back with its initial weights and reloads the synced ones itself.
    remote.chunk_size = 1
    try:
        assert_same_samples(remote.generate(PROBLEMS, SAMPLING), expected)
    finally:
        remote.chunk_size = 0


@dataclass(frozen=True)
class OneWorkerKeepsOldWeights:
    """Builds the hf engine; the first worker to claim `claim` (a path) ignores every weight sync."""

    make: HFEngineFactory
    claim: str

    def __call__(self):
        engine = self.make()
        try:
            os.close(os.open(self.claim, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return engine
        engine.load_weights = lambda named_tensors: None
        return engine


def test_the_sync_check_passes_synced_workers_and_stops_at_one_that_keeps_old_weights(engines, models, tmp_path):
    from reasonrl.guards.sync_check import SyncCheck, SyncCheckError, describe_backend
    from reasonrl.training.learner import Learner, OptimConfig

    remote, local = engines
    learner = Learner(HFEngineFactory(str(models[0]))().model.float(), OptimConfig(), temperature=1.0)
    other = HFEngineFactory(str(models[1]))().model.named_parameters()
    probe = SamplingParams(n=1, temperature=1.0, max_new_tokens=8, seed=3)
    backend = describe_backend(ray_workers=2, fused=True)
    broken = RayRolloutEngine(OneWorkerKeepsOldWeights(HFEngineFactory(str(models[0])), str(tmp_path / "claim")),
                              workers=2, cpus_per_worker=0)  # the fixture's workers hold both CPUs
    try:
        for engine in (remote, local):
            engine.load_weights(learner.named_weights())
        checks = [SyncCheck(engine, learner, PROBLEMS[:4], probe, backend=backend, max_gap=1e-3)
                  for engine in (remote, broken)]
        for check in checks:
            check.after_sync(0)  # the baseline probe
        copy_weights(learner.model, other)  # an update: the learner now holds another model
        for engine in (remote, local, broken):
            engine.load_weights(learner.named_weights())
        checks[0].after_sync(1)
        synced = checks[0].metrics(0, None)
        assert synced["sync/changed"] == 1.0 and synced["sync/logp_gap"] < 1e-3, synced
        with pytest.raises(SyncCheckError, match=r"after step 1 \(backend: Ray rollout workers \(2\).*2 of 4 probe "
                                                 r"sequences.*Likely cause: a rollout worker kept its old weights"):
            checks[1].after_sync(1)
    finally:
        broken.close()


def test_the_workers_engines_get_the_configs_engine_settings(models, monkeypatch):
    import reasonrl.distributed.ray as ray_backend
    from reasonrl import load_config
    from reasonrl.build import build_ray_engine
    from reasonrl.models import load_model

    made = {}

    class Recorded:
        def __init__(self, factory, **kwargs):
            made["factory"] = factory

        def load_weights(self, named):
            list(named)

    monkeypatch.setattr(ray_backend, "RayRolloutEngine", Recorded)
    cfg = load_config(overrides=[f"model.name={models[0]}", "run.backend=ray", "rollout.max_batch_rows=3",
                                 "rollout.cuda_graphs=false"])
    build_ray_engine(cfg, load_model(str(models[0]), dtype=torch.float32, device=torch.device("cpu")), torch.device("cpu"))
    engine = made["factory"]()  # what a worker builds
    assert engine.max_rows == 3 and engine.fused is not None and engine.cuda_graphs is False
