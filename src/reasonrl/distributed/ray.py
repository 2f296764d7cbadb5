"""Rollout workers and learner ranks as Ray actors (Moritz et al. 2018, "Ray: A Distributed
Framework for Emerging AI Applications"): the same engine and learner objects as the local loop,
one per actor, behind the same interfaces, so the trainer does not know whether generation and
updates are local or spread over processes and machines.

Rollout workers (RayRolloutEngine):

- Sharding: a step's problems are cut into chunks, handed to idle workers from a queue.
- Determinism: every problem is sampled with its own seed, derived from (sampling.seed, its
  index in the step), so its samples do not depend on which worker generates it nor on what
  else is in the worker's batch: W workers give the samples of one local engine (the hf and
  vllm engines seed per problem the same way; the log-probs agree up to the float rounding of
  different batch shapes). An engine whose `generate` takes no `seeds=` is called once per
  problem instead.
- Weight sync: after each update the learner's weights are put in Ray's object store once and
  every worker loads them from there; each generate call also carries the weights' version,
  so a worker that came back from a restart with its initial weights reloads before sampling.
- Failures: a worker that dies is restarted by Ray (`max_restarts`), and the chunk it held is
  queued again; a problem is never lost nor generated twice into the result. Other errors in
  a worker (a bug, a bad prompt) are not retried: they stop the step with their traceback.

Learner ranks (RayLearner): DataParallelLearner ranks in one torch.distributed process group
(gloo between CPU processes, nccl between GPUs), fed the same batch; rank 0's weights come back
to the driver after each update for the engine and the checkpoints.

This is the only module that imports ray.
"""

from __future__ import annotations

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

from reasonrl.distributed.data_parallel import DataParallelLearner, default_backend, rank_share
from reasonrl.models import copy_weights, load_model, with_lora
from reasonrl.rollout.base import RolloutEngine, prompt_token_ids
from reasonrl.seeds import problem_seed
from reasonrl.training import recompute
from reasonrl.training.learner import OptimConfig, Scorer
from reasonrl.types import Group, Problem, SamplingParams

EngineFactory = Callable[[], RolloutEngine]
"""Builds a worker's engine inside the worker; must be picklable (a module-level function, a
functools.partial of one, or a frozen dataclass such as HFEngineFactory)."""


def generate_seeded(engine: RolloutEngine, indexed: Sequence[tuple[int, Problem]],
                    sampling: SamplingParams) -> list[Group]:
    """Each (index, problem) sampled with its own seed: the same groups whichever process
    generates them and whatever else it generates. An engine whose `generate` takes one seed per
    problem (`seeds=`, which it says with `seeds_per_problem = True`) does them in one batched call; any
    other engine, one call per problem."""
    seeds = [problem_seed(sampling.seed, index) for index, _ in indexed]
    problems = [problem for _, problem in indexed]
    if getattr(engine, "seeds_per_problem", False):
        return engine.generate(problems, sampling, seeds=seeds)
    return [engine.generate([problem], replace(sampling, seed=seed))[0] for problem, seed in zip(problems, seeds)]


@dataclass(frozen=True)
class HFEngineFactory:
    """An hf engine on a model name or directory, built where it is called (in the worker)."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"  # "cuda": the GPU Ray gave the worker (gpus_per_worker), seen as device 0
    chat_template: bool = True
    fused: bool = True
    cuda_graphs: bool = True
    lora_rank: int = 0  # > 0: the model wrapped with LoRA adapters as the learner's (weights synced after)
    lora_alpha: float = 16.0
    max_rows: int = 0  # rows decoded at once (rollout.max_batch_rows; 0: all of a call's)

    def __call__(self) -> RolloutEngine:
        from reasonrl.models import load_model, load_tokenizer, with_lora
        from reasonrl.rollout import HFEngine

        model = load_model(self.model, dtype=getattr(torch, self.dtype), device=torch.device(self.device))
        if self.lora_rank:
            model = with_lora(model, rank=self.lora_rank, alpha=self.lora_alpha)
        return HFEngine(model, load_tokenizer(self.model), chat_template=self.chat_template, fused=self.fused,
                        cuda_graphs=self.cuda_graphs, max_rows=self.max_rows)


class RolloutWorker:
    """One engine in one Ray actor process."""

    def __init__(self, make_engine: EngineFactory, threads: int):
        torch.set_num_threads(threads)
        self.engine = make_engine()
        self.version = 0  # the initial weights

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "tokenizer": getattr(self.engine, "tokenizer", None),
                "pad_id": getattr(self.engine, "pad_id", None), "version": self.version,
                "chat_template": getattr(self.engine, "chat_template", True)}

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

    Connects to Ray at `address` ('auto': the cluster `ray start` runs on this machine) unless
    `ray.init` was called already; with neither, starts Ray here (and stops it at `shutdown`).
    `chunk_size` problems go to a worker at a time (default: the step split evenly); smaller
    chunks balance uneven completions better and lose less work to a dying worker.
    """

    def __init__(self, make_engine: EngineFactory, *, workers: int = 2, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0, threads_per_worker: int = 1, chunk_size: int = 0,
                 max_failures: int = 3, restart_timeout_s: float = 300.0, address: str | None = None):
        if workers < 1:
            raise ValueError(f"workers={workers}: a Ray rollout engine needs at least one worker")
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            local = {"_node_ip_address": "127.0.0.1"} if address is None else {}  # a new instance: loopback only
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
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
        self.tokenizer, self.pad_id, self.chat_template = info["tokenizer"], info["pad_id"], info["chat_template"]

    def prompt_ids(self, problem: Problem) -> list[int]:
        return prompt_token_ids(self.tokenizer, problem, chat_template=self.chat_template)

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
                pending.groups[index] = replace(group, problem=problem)  # the caller's object, not a copy
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

    def close(self) -> None:
        """Stop the workers (and Ray, if this engine started it)."""
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False


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


@dataclass(frozen=True)
class LearnerRankSpec:
    """What a data-parallel learner rank is made of, built inside its Ray actor (`make_rank`) from
    these values alone: the policy `model` (LoRA-wrapped when `lora_rank`), activation recompute, the
    optimizer and the learner's settings. Nothing is called back in the driver's builders."""

    model: str
    optim: OptimConfig
    temperature: float
    pack: bool
    micro_batch_positions: int
    autocast_dtype: str  # "" for float32
    seed: int
    gradient_checkpointing: str
    shard: bool = False
    lora_rank: int = 0
    lora_alpha: float = 32.0
    device: str = "cpu"  # "cuda": the GPU Ray gave the rank, seen as device 0
    threads: int = 1


def make_rank(spec: LearnerRankSpec, weights: dict[str, torch.Tensor]) -> DataParallelLearner:
    """A DataParallelLearner rank of `spec` (in a joined process group) whose trainable weights are
    `weights` (the driver's), set before FSDP shards them."""
    device = torch.device(spec.device)
    policy = load_model(spec.model, dtype=torch.float32, device=device)
    if spec.lora_rank:
        policy = with_lora(policy, rank=spec.lora_rank, alpha=spec.lora_alpha)
    copy_weights(policy, weights.items())
    recompute.enable(policy, spec.gradient_checkpointing, spec.micro_batch_positions)
    return DataParallelLearner(policy, spec.optim, shard=spec.shard, temperature=spec.temperature, pack=spec.pack,
                               micro_batch_positions=spec.micro_batch_positions, seed=spec.seed,
                               autocast_dtype=getattr(torch, spec.autocast_dtype) if spec.autocast_dtype else None)


class RankScorer(Scorer):
    """The driver's scorer for `world_size` learner ranks: its no-grad log-probs (the reference's,
    which stays here) are taken in the micro-batches each rank's share of each optimizer step uses
    (`rank_share`), so they equal what the ranks would compute, bit for bit."""

    def __init__(self, model: Any, *, world_size: int, **settings: Any):
        super().__init__(model, **settings)
        self.world_size = world_size

    def per_token(self, model: Any, batch: Any, micro_batch_size: int, forward: Callable[[Any, Any], torch.Tensor],
                  parts: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        parts = [torch.arange(batch.num_sequences)] if parts is None else parts
        shares = [rank_share(batch, part, rank, self.world_size) for part in parts for rank in range(self.world_size)]
        return super().per_token(model, batch, micro_batch_size, forward, shares)


class LearnerRank:
    """One rank of the data-parallel learner in a Ray actor."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)
        self.learner: Any = None

    def address(self) -> str:
        """A free TCP address on this rank's node, for the process group's rendezvous."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def join(self, spec: LearnerRankSpec, address: str, rank: int, world_size: int,
             weights: dict[str, torch.Tensor]) -> None:
        import torch.distributed as dist

        dist.init_process_group(default_backend(spec.device), init_method=address, rank=rank, world_size=world_size)
        self.learner = make_rank(spec, weights)

    def update(self, batch: Any, loss: Any, kwargs: dict[str, Any]) -> tuple[dict[str, float], list[dict[str, float]]]:
        """The update's metrics, and those of each of its optimizer steps."""
        import resource

        metrics = self.learner.update(batch, loss, **kwargs)
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return metrics | {"perf/learner_rank_peak_rss_mb": peak_rss}, self.learner.optimizer_steps

    # Called on every rank (with FSDP gathering the whole weights and state is a collective);
    # only rank 0 sends them back.
    def trainable_weights(self) -> dict[str, torch.Tensor] | None:
        weights = {name: tensor.detach().cpu().clone() for name, tensor in self.learner.named_weights()}
        return weights if self.learner.rank == 0 else None

    def state_dict(self) -> dict[str, Any] | None:
        state = self.learner.state_dict()
        return state if self.learner.rank == 0 else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)


class RayLearner:
    """The learner as `workers` data-parallel ranks in Ray actors (DataParallelLearner, one
    torch.distributed process group), behind the Learner interface the trainer uses.

    `local` scores with this process's copy of the policy (a RankScorer, no optimizer: only the
    ranks train): the no-grad log-probs that need the reference model (which stays here), in the
    ranks' own micro-batches; after each update it receives rank 0's weights, so the engine's weight
    sync, the checkpoints and the reference resets read the trained policy as they do without Ray.
    Every rank trains on the whole batch's share it is dealt and gradients are summed before
    clipping, so an update does not depend on `workers` (up to the order of float sums).
    """

    def __init__(self, local: RankScorer, spec: LearnerRankSpec, *, workers: int = 2, cpus_per_worker: float = 1,
                 gpus_per_worker: float = 0):
        if workers < 1:
            raise ValueError(f"workers={workers}: a Ray learner needs at least one rank")
        if local.world_size != workers:
            raise ValueError(f"the driver's scorer follows {local.world_size} ranks' micro-batches, not {workers}")
        if not ray.is_initialized():
            raise RuntimeError("start Ray first (the rollout engine of run.backend=ray does)")
        self.local = local
        self.optimizer_steps: list[dict[str, float]] = []  # the last update's, from rank 0
        actor = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(LearnerRank)
        self.ranks = [actor.remote(spec.threads) for _ in range(workers)]
        address = ray.get(self.ranks[0].address.remote())
        weights = ray.put({name: tensor.detach().cpu() for name, tensor in local.named_weights()})
        ray.get([rank.join.remote(spec, address, index, workers, weights) for index, rank in enumerate(self.ranks)])

    def update(self, batch: Any, loss: Any, *, micro_batch_size: int, ref_model: Any = None, mini_batches: int = 1,
               step: int = 0, **kwargs: Any) -> dict[str, float]:
        batch = self.local.with_reference(batch, loss, ref_model, micro_batch_size=micro_batch_size,
                                          mini_batches=mini_batches, step=step)
        batch_ref = ray.put(batch)
        sizes = {"micro_batch_size": micro_batch_size, "mini_batches": mini_batches, "step": step, **kwargs}
        try:
            every_rank = ray.get([rank.update.remote(batch_ref, loss, sizes) for rank in self.ranks])
        except ray.exceptions.RayTaskError as error:
            raise error.as_instanceof_cause() from None  # e.g. NonFiniteLossError, as the local learner raises it
        trained = ray.get([rank.trainable_weights.remote() for rank in self.ranks])[0]
        copy_weights(self.local.model, trained.items())
        peak_rss = max(metrics["perf/learner_rank_peak_rss_mb"] for metrics, _ in every_rank)
        metrics, self.optimizer_steps = every_rank[0]
        return metrics | {"perf/learner_rank_peak_rss_mb": peak_rss}  # the largest rank's memory

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self.local.named_weights()

    def state_dict(self) -> dict[str, Any]:
        return ray.get([rank.state_dict.remote() for rank in self.ranks])[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ray.get([rank.load_state_dict.remote(state) for rank in self.ranks])

    @property
    def model(self) -> Any:
        """The driver's copy of the policy, equal to the ranks' after each update."""
        return self.local.model

    def logprobs(self, model: Any, batch: Any, micro_batch_size: int,
                 parts: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """No-grad log-probs under `model` (the policy's copy or the reference), in the driver."""
        return self.local.logprobs(model, batch, micro_batch_size, parts)

    def close(self) -> None:
        """Stop the learner ranks."""
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)
        self.ranks = []
