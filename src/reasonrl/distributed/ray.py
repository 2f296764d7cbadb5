"""Rollout workers as Ray actors (Moritz et al. 2018, "Ray: A Distributed Framework for Emerging
AI Applications"): the same engine objects as the local loop, one per worker, behind the same
RolloutEngine protocol, so the trainer does not know whether generation is local or spread
over processes and machines.

- Sharding: a step's problems are cut into chunks, handed to idle workers from a queue.
- Determinism: every problem is sampled with its own seed, derived from (sampling.seed, its
  index in the step), so its samples do not depend on which worker generates it: W workers
  give the samples of the local `SeededEngine`. Today the hf engine draws from one generator
  per call, so each problem gets a call of its own (exact, but unbatched across problems); an
  engine whose `generate` takes per-problem `seeds=` is called once per chunk (the same tokens;
  log-probs equal up to float rounding, as batch shapes differ).
- Weight sync: after each update the learner's weights are put in Ray's object store once and
  every worker loads them from there; each generate call also carries the weights' version,
  so a worker that came back from a restart with its initial weights reloads before sampling.
- Failures: a worker that dies is restarted by Ray (`max_restarts`), and the chunk it held is
  queued again; a problem is never lost nor generated twice into the result. Other errors in
  a worker (a bug, a bad prompt) are not retried: they stop the step with their traceback.

This is the only module that imports ray.
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError

from reasonrl.rollout.base import RolloutEngine
from reasonrl.trainer import derive_seed
from reasonrl.types import Group, Problem, SamplingParams

EngineFactory = Callable[[], RolloutEngine]
"""Builds a worker's engine inside the worker; must be picklable (a module-level function, a
functools.partial of one, or a frozen dataclass such as HFEngineFactory)."""


def problem_seed(seed: int, index: int) -> int:
    """The sampling seed of the index-th problem of a step whose sampling seed is `seed`."""
    return derive_seed(seed, "problem", index)


def generate_seeded(engine: RolloutEngine, indexed: Sequence[tuple[int, Problem]],
                    sampling: SamplingParams) -> list[Group]:
    """Each (index, problem) sampled with its own seed: the same groups whichever process
    generates them and whatever else it generates. An engine whose `generate` takes one seed per
    problem (`seeds=`) does them in one batched call; any other engine, one call per problem."""
    seeds = [problem_seed(sampling.seed, index) for index, _ in indexed]
    problems = [problem for _, problem in indexed]
    if "seeds" in inspect.signature(engine.generate).parameters:
        return engine.generate(problems, sampling, seeds=seeds)
    return [engine.generate([problem], replace(sampling, seed=seed))[0] for problem, seed in zip(problems, seeds)]


class SeededEngine:
    """A local engine with per-problem seeds: what RayRolloutEngine's workers compute, in one process."""

    def __init__(self, engine: RolloutEngine):
        self.engine = engine

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        return generate_seeded(self.engine, list(enumerate(problems)), sampling)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.load_weights(named_tensors)


@dataclass(frozen=True)
class HFEngineFactory:
    """An hf engine on a model name or directory, built where it is called (in the worker)."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"  # "cuda": the GPU Ray gave the worker (gpus_per_worker), seen as device 0
    chat_template: bool = True
    fused: bool = True

    def __call__(self) -> RolloutEngine:
        from reasonrl.models import load_model, load_tokenizer
        from reasonrl.rollout import HFEngine

        model = load_model(self.model, dtype=getattr(torch, self.dtype), device=torch.device(self.device))
        return HFEngine(model, load_tokenizer(self.model), chat_template=self.chat_template, fused=self.fused)


class RolloutWorker:
    """One engine in one Ray actor process."""

    def __init__(self, make_engine: EngineFactory, threads: int):
        torch.set_num_threads(threads)
        self.engine = make_engine()
        self.version = 0  # the initial weights

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "tokenizer": getattr(self.engine, "tokenizer", None),
                "pad_id": getattr(self.engine, "pad_id", None), "version": self.version}

    def load_weights(self, named_tensors: dict[str, torch.Tensor], version: int) -> None:
        self.engine.load_weights(named_tensors.items())
        self.version = version

    def generate(self, indexed: list[tuple[int, Problem]], sampling: SamplingParams, version: int,
                 weights: list[ray.ObjectRef]) -> list[Group]:
        # `weights` is wrapped in a list so Ray does not fetch it unless this worker needs it.
        if version != self.version:
            self.load_weights(ray.get(weights[0]), version)
        return generate_seeded(self.engine, indexed, sampling)


@dataclass
class PendingStep:
    """A step's generation in flight: chunks queued, running on a worker, or done."""

    problems: list[Problem]
    sampling: SamplingParams
    queue: deque[list[tuple[int, Problem]]]
    running: dict[ray.ObjectRef, tuple[int, list[tuple[int, Problem]]]] = field(default_factory=dict)
    groups: dict[int, Group] = field(default_factory=dict)
    failures: int = 0


class RayRolloutEngine:
    """RolloutEngine over `workers` Ray actors, each holding an engine built by `make_engine`.

    Call `ray.init(...)` first (or let this connect to a running cluster, `ray start`).
    `chunk_size` problems go to a worker at a time (default: the step split evenly); smaller
    chunks balance uneven completions better and lose less work to a dying worker.
    """

    def __init__(self, make_engine: EngineFactory, *, workers: int = 2, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, threads_per_worker: int = 1, chunk_size: int = 0,
                 max_failures: int = 3, restart_timeout_s: float = 300.0):
        if workers < 1:
            raise ValueError(f"workers={workers}: a Ray rollout engine needs at least one worker")
        if not ray.is_initialized():
            ray.init()
        actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
                           max_restarts=-1, max_task_retries=0)(RolloutWorker)
        self.workers = [actor.remote(make_engine, threads_per_worker) for _ in range(workers)]
        self.chunk_size = chunk_size
        self.max_failures = max_failures
        self.version = 0
        self.weights_ref: ray.ObjectRef | None = None
        self.restarts = 0
        self.restart_timeout_s = restart_timeout_s
        self.probes: dict[int, ray.ObjectRef] = {}  # workers back from the dead once these answer
        self.probe_since: dict[int, float] = {}
        info = ray.get(self.workers[0].info.remote())
        self.tokenizer, self.pad_id = info["tokenizer"], info["pad_id"]

    def generate(self, problems: Sequence[Problem], sampling: SamplingParams) -> list[Group]:
        return self.collect(self.submit(problems, sampling))

    def submit(self, problems: Sequence[Problem], sampling: SamplingParams) -> PendingStep:
        """Start generating; `collect` waits for the groups (generation overlaps whatever runs between)."""
        if not problems:
            raise ValueError("generate needs at least one problem")
        indexed = list(enumerate(problems))
        size = self.chunk_size or math.ceil(len(indexed) / len(self.workers))
        chunks = deque(indexed[i : i + size] for i in range(0, len(indexed), size))
        pending = PendingStep(list(problems), sampling, chunks)
        self._dispatch(pending)
        return pending

    def collect(self, pending: PendingStep) -> list[Group]:
        """The groups of a submitted step in problem order, re-queueing the chunks of dead workers."""
        while pending.running or pending.queue:
            self._dispatch(pending)
            ready, _ = ray.wait(list(pending.running) + list(self.probes.values()), num_returns=1)
            if ready[0] not in pending.running:
                self._probed(ready[0])
                continue
            worker, chunk = pending.running.pop(ready[0])
            try:
                groups = ray.get(ready[0])
            except RayActorError as exc:
                pending.failures += 1
                self.restarts += 1
                if pending.failures > self.max_failures:
                    raise RuntimeError(f"rollout workers died {pending.failures} times in one step (last: worker "
                                       f"{worker}); see the Ray logs (`ray logs` or /tmp/ray/session_latest/logs) "
                                       "for the cause, e.g. out of memory") from exc
                pending.queue.appendleft(chunk)
                self._probe(worker, since=time.monotonic())
                continue
            for (index, problem), group in zip(chunk, groups, strict=True):
                if index in pending.groups or group.problem != problem:
                    raise RuntimeError(f"problem {index} came back twice or as another problem: a worker bug")
                pending.groups[index] = group
        if sorted(pending.groups) != list(range(len(pending.problems))):
            raise RuntimeError("a step's generation ended with problems missing: a scheduling bug")
        return [pending.groups[i] for i in range(len(pending.problems))]

    def _dispatch(self, pending: PendingStep) -> None:
        """Give queued chunks to the workers that are alive and hold no chunk."""
        busy = {worker for worker, _ in pending.running.values()} | set(self.probes)
        for worker in range(len(self.workers)):
            if not pending.queue:
                return
            if worker not in busy:
                chunk = pending.queue.popleft()
                ref = self.workers[worker].generate.remote(chunk, pending.sampling, self.version, [self.weights_ref])
                pending.running[ref] = (worker, chunk)

    def _probe(self, worker: int, since: float) -> None:
        """Ask a dead worker whether Ray has restarted it; it gets no chunk until it answers.
        (A call to an actor that is still restarting fails at once instead of waiting.)"""
        if time.monotonic() - since > self.restart_timeout_s:
            raise RuntimeError(f"rollout worker {worker} did not come back within {self.restart_timeout_s} s of "
                               "dying; see the Ray logs for why its engine cannot be built")
        self.probes[worker] = self.workers[worker].info.remote()
        self.probe_since[worker] = since

    def _probed(self, ref: ray.ObjectRef) -> None:
        worker = next(w for w, probe in self.probes.items() if probe == ref)
        del self.probes[worker]
        try:
            ray.get(ref)
        except RayActorError:
            time.sleep(0.2)
            self._probe(worker, since=self.probe_since[worker])

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Put the weights in the object store once; every worker loads them before this returns."""
        weights = {name: tensor.detach().cpu() for name, tensor in named_tensors}
        self.version += 1
        self.weights_ref = ray.put(weights)
        try:
            ray.get([w.load_weights.remote(self.weights_ref, self.version) for w in self.workers])
        except RayActorError:
            pass  # a worker restarting: it loads this version before its next chunk (see generate)

    def worker_pids(self) -> list[int]:
        return [info["pid"] for info in ray.get([w.info.remote() for w in self.workers])]

    def shutdown(self) -> None:
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []


def wait_until_alive(engine: RayRolloutEngine, timeout_s: float = 60.0) -> None:
    """Block until every worker answers (after restarts), or raise after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            engine.worker_pids()
            return
        except RayActorError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
