"""The weight-sync check: after every sync of the learner's weights to the rollout engine, the
engine samples a small fixed probe (a few prompts, a couple of tokens each, one seed: the
prompts go through the engine's whole forward, and a token more costs a decode step, the dearest
part) and the learner recomputes the log-probs of what it sampled. Two things are checked:

- the gap: the mean |engine log-prob - learner log-prob| over the probe's tokens. Both hold the
  same weights, so it is float rounding (~1e-6 in float32, a few hundredths of a nat with a
  bfloat16 engine); more means the engine samples from another policy than the one trained
  (a partial sync, a module or adapter skipped, another temperature or model);
- the change: a sequence whose engine output (tokens and log-probs) is bit-identical to the
  previous sync's while the learner's log-probs on it moved means the weights never reached the
  engine (a no-op load, a fused decoder keeping its packed copy of the old weights, a worker
  keeping its own).

Either stops the run with a SyncCheckError naming the backend and the likely cause. Metrics:
`sync/logp_gap`, `sync/changed` (the share of probe sequences whose
engine output moved since the previous sync), `perf/sync_check_s`.

The probe draws no number from any shared random stream (the engine seeds it, the learner's
forward is deterministic), so a run with the check samples and trains exactly as one without.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from reasonrl.rollout.producer import Rollouts
from reasonrl.training.learner import make_train_batch
from reasonrl.types import Group, Participant, Problem, SamplingParams

LEARNER_MOVED = 1e-4
"""Mean nats by which the learner's log-probs on a probe sequence must move for an unchanged
engine output to count as a failed sync (below it, nothing visible was trained)."""


class SyncCheckError(RuntimeError):
    """The engine does not hold the learner's weights after a sync."""


@dataclass(frozen=True)
class Probe:
    """One sync's probe: per sequence, its tokens, the engine's and the learner's log-probs."""

    tokens: tuple[tuple[int, ...], ...]
    engine_logp: tuple[torch.Tensor, ...]
    learner_logp: tuple[torch.Tensor, ...]

    def gap(self) -> float:
        """The mean |engine - learner| log-prob over every probe token."""
        diffs = [(e - l).abs() for e, l in zip(self.engine_logp, self.learner_logp) if len(e)]
        return float(torch.cat(diffs).mean()) if diffs else 0.0


@dataclass(frozen=True)
class Backend:
    """What syncs the weights, in words for the error message, and its likely failures."""

    name: str
    stale_cause: str
    gap_cause: str


def describe_backend(*, ray_workers: int = 0, lora: bool = False, fused: bool = False, asynchronous: bool = False,
                     dtype: str = "float32") -> Backend:
    """The backend of a run, with the likely cause of each failure there."""
    parts = [f"Ray rollout workers ({ray_workers})" if ray_workers else "local hf engine"]
    if fused:
        parts.append("fused decoder")
    if lora:
        parts.append("LoRA adapters")
    if asynchronous:
        parts.append("asynchronous pipeline")
    parts.append(dtype)
    if ray_workers:
        stale = "a rollout worker kept its old weights (its load_weights did nothing or failed)"
    elif lora:
        stale = "the adapters were not copied into the engine's adapters (no-op load_weights, or names that differ)"
    elif fused:
        stale = ("load_weights did not reach the decoder: the fused decoder holds a packed copy of the weights and "
                 "must be rebuilt after a copy")
    else:
        stale = "the engine's load_weights copied nothing into the model it samples from"
    if asynchronous:
        stale += "; or the pipeline never loaded the published weights"
    gap = "part of the weights was not synced (a module or adapter skipped)"
    if lora:
        gap = "the sync skipped some adapter modules, or the engine's LoRA scaling differs from the learner's"
    elif fused:
        gap += ", e.g. the fused decoder kept its packed copy of the old projection weights (not rebuilt after the copy)"
    gap += ", or the engine samples another model or temperature than the learner scores"
    if dtype != "float32":
        gap += f" (a {dtype} engine differs by rounding: raise run.sync_max_gap if this gap is expected)"
    return Backend(", ".join(parts), stale, gap)


class SyncCheck(Participant):
    """The weight-sync check (module docstring), a participant of the loop: `after_sync` probes the
    engine and the learner each time the engine has received the weights (the first time, before
    the first update, it takes the baseline) and raises a SyncCheckError; `metrics` reports the
    last check. `pause` is the producer's `idle`: no generation meanwhile, the engine holding the
    newest published weights."""

    def __init__(self, engine: Any, learner: Any, problems: Sequence[Problem], sampling: SamplingParams, *,
                 backend: Backend, max_gap: float, micro_batch_size: int = 8,
                 pause: Callable[[], AbstractContextManager[None]] = nullcontext):
        if not problems:
            raise ValueError("the sync check needs at least one probe problem")
        self.engine, self.learner, self.problems, self.sampling = engine, learner, list(problems), sampling
        self.backend, self.max_gap, self.micro_batch_size, self.pause = backend, max_gap, micro_batch_size, pause
        self.previous: Probe | None = None
        self.reported: dict[str, float] = {}

    def after_sync(self, step: int) -> None:
        started = time.perf_counter()
        with self.pause():
            probe = self.probe()
        previous, self.previous = self.previous, probe
        if previous is None:  # the baseline
            self._check_gap(probe, step, "before the first update")
            return
        self.reported = self.check(previous, probe, step) | {"perf/sync_check_s": time.perf_counter() - started}

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        reported, self.reported = self.reported, {}
        return reported

    def probe(self) -> Probe:
        groups = self.engine.generate(self.problems, self.sampling)
        completions = [(group, completion) for group in groups for completion in group.completions]
        kept = [Group(problem=g.problem, prompt_ids=g.prompt_ids, completions=(c,)) for g, c in completions
                if c.token_ids]
        learner_logp: list[torch.Tensor] = []
        if kept:
            batch = make_train_batch(kept, [0.0] * len(kept), pad_id=0)
            logp_NT = self.learner.logprobs(self.learner.model, batch, self.micro_batch_size)
            mask_NT = batch.loss_mask_NT.bool()
            learner_logp = [logp_NT[i][mask_NT[i]].double() for i in range(len(kept))]
        by_tokens = iter(learner_logp)
        return Probe(tokens=tuple(c.token_ids for _, c in completions),
                     engine_logp=tuple(torch.tensor(c.logprobs, dtype=torch.float64) for _, c in completions),
                     learner_logp=tuple(next(by_tokens) if c.token_ids else torch.zeros(0, dtype=torch.float64)
                                        for _, c in completions))

    def check(self, previous: Probe, probe: Probe, step: int) -> dict[str, float]:
        """`probe`'s metrics after the sync that ended step `step`, against the `previous` sync's, or a
        SyncCheckError."""
        changed, stale = 0, []
        for i, tokens in enumerate(probe.tokens):
            if tokens != previous.tokens[i] or not torch.equal(probe.engine_logp[i], previous.engine_logp[i]):
                changed += 1
                continue
            learner_moved = float((probe.learner_logp[i] - previous.learner_logp[i]).abs().mean()) if tokens else 0.0
            if learner_moved > LEARNER_MOVED:
                stale.append(learner_moved)
        if stale:
            raise SyncCheckError(
                f"weight sync check failed after step {step} (backend: {self.backend.name}): the engine's outputs on "
                f"{len(stale)} of {len(probe.tokens)} probe sequences are exactly those of the previous sync while "
                f"the learner's log-probs on them moved by {max(stale):.3g} nats: the new weights did not reach the "
                f"engine, and rollouts keep coming from the old policy. Likely cause: {self.backend.stale_cause}. "
                "(run.sync_check=false turns this check off.)")
        gap = self._check_gap(probe, step, f"after step {step}'s sync")
        return {"sync/logp_gap": gap, "sync/changed": changed / len(probe.tokens)}

    def _check_gap(self, probe: Probe, step: int, when: str) -> float:
        gap = probe.gap()
        if gap > self.max_gap:
            raise SyncCheckError(
                f"weight sync check failed {when} (backend: {self.backend.name}): the engine's log-probs on the probe "
                f"differ from the learner's by {gap:.3g} nats per token (mean over the probe), above "
                f"run.sync_max_gap={self.max_gap:g}: rollouts come from another policy than the one trained. Likely "
                f"cause: {self.backend.gap_cause}. (run.sync_check=false turns this check off.)")
        return gap


def build_sync_check(cfg: Any, problems: Sequence[Problem], *, engine: Any, learner: Any,
                     pause: Callable[[], AbstractContextManager[None]]) -> SyncCheck | None:
    """The sync check cfg.run asks for (None when off), probing with the first training problems,
    production paused by `pause` (the producer's `idle`)."""
    from reasonrl.agents.engine import AgentEngine
    from reasonrl.agents.openai_agents import OpenAIAgentEngine
    from reasonrl.models import resolve_dtype

    r = cfg.run
    if not r.sync_check:
        return None
    device = next(learner.model.parameters()).device
    engine_dtype = resolve_dtype(cfg.rollout.dtype, device)
    full_precision = engine_dtype == torch.float32 and resolve_dtype(cfg.train.dtype, device) == torch.float32
    sampler = engine.engine if isinstance(engine, (AgentEngine, OpenAIAgentEngine)) else engine  # not episodes
    fused = getattr(sampler, "fused", None) is not None or (r.backend == "ray" and cfg.rollout.fused)
    backend = describe_backend(ray_workers=r.ray_workers if r.backend == "ray" else 0, lora=cfg.train.lora_rank > 0,
                               fused=fused, asynchronous=cfg.rollout.max_staleness > 0,
                               dtype=str(engine_dtype).removeprefix("torch."))
    sampling = SamplingParams(n=1, temperature=cfg.rollout.temperature, max_new_tokens=r.sync_probe_tokens,
                              seed=cfg.run.seed + 7919)
    prompts = max(r.sync_probe_prompts, r.ray_workers if r.backend == "ray" else 0)  # a probe for every worker
    return SyncCheck(sampler, learner, list(problems)[:prompts], sampling, backend=backend,
                     max_gap=r.sync_max_gap or (1e-3 if full_precision else 0.5),
                     micro_batch_size=cfg.train.micro_batch_size, pause=pause)
