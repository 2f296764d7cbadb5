"""The participants of a training step, called by the loop at fixed points so that it has no
branch per feature. The protocol (`reasonrl.types.Participant`) has one hook per point, each
called on every participant in the order of the run's list (reasonrl.trainer.build_run: the
sampler and pass rates, then each method's participants in the order of reasonrl.methods.METHODS,
then the reports here, then the guards, then the user's: `train(cfg, participants=[...])`):

- `observe(step, indices, groups)`: during production, each round's scored groups (`indices`:
  their problems' positions in the task); the groups to train on (replay may swap a remembered
  correct completion into an all-wrong group);
- `contribute(step, update)`: what it adds to the policy's update (a KL coefficient, an auxiliary
  loss);
- `after_update(step, batch, metrics)`: its own work after the policy's update (the critic's
  update, a supervised step, adapting the KL coefficient), adding its metrics;
- `after_sync(step)`: the engine now holds the weights step `step` starts from (called once
  before the first step, then after each step's weights are published: the weight-sync check);
- `metrics(step, rollouts)`: what it reports about the step;
- `stop_reason(step)`: after the step is logged (`step`: the steps done), why the run ends there
  ('': it goes on); the run then saves its checkpoint and stops, as when a budget is spent;
- `state_dict()` / `load_state_dict()`: its state in checkpoints, under `name` ("": none).

Here: the container, and the participants every run has or that report on its rollouts (the
problem sampler, pass rates for an adaptive sampling budget, reports on sources, skipped groups,
staleness and generated tokens). A method's participants live in its module (reasonrl.methods).

Threads: with asynchronous rollouts (rollout.max_staleness > 0) `observe` runs in the rollout
pipeline's producer thread while the loop calls the rest. A participant whose state both threads
touch guards it with its own lock (the sampler, replay, guidance); the others are touched by one
thread only (pass rates by production; the critic, the KL controller, the reference and the
reports by the loop). Checkpoints are taken while the pipeline is idle.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from typing import Any

from reasonrl.rewards.summary import by_source
from reasonrl.rollout.producer import Rollouts
from reasonrl.sampling import PassRates, allocate_samples, group_accuracy
from reasonrl.sampling.stages import from_sources
from reasonrl.types import Group, Participant, PolicyUpdate, Problem, Sampler, TrainBatch


class Participants:
    """A run's participants, each call made on every one in order: the order is part of the
    behaviour (guidance sees a group before replay changes it; metrics are logged in this order)."""

    def __init__(self, parts: Sequence[Participant]):
        self.parts = tuple(parts)

    @property
    def stateful(self) -> dict[str, Participant]:
        return {part.name: part for part in self.parts if part.name}

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        for part in self.parts:
            groups = part.observe(step, indices, groups)
        return groups

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        for part in self.parts:
            update = part.contribute(step, update)
        return update

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        for part in self.parts:
            part.after_update(step, batch, metrics)

    def after_sync(self, step: int) -> None:
        for part in self.parts:
            part.after_sync(step)

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        reported: dict[str, float] = {}
        for part in self.parts:
            reported |= part.metrics(step, rollouts)
        return reported

    def stop_reason(self, step: int) -> str:
        """Why the run ends after `step` steps, each participant's reason ('': none asks)."""
        return "; ".join(reason for part in self.parts if (reason := part.stop_reason(step)))


HOOKS = ("observe", "contribute", "after_update", "after_sync", "metrics", "stop_reason", "state_dict",
         "load_state_dict")


def check_participants(parts: Sequence[Participant], taken: Collection[str] = ()) -> None:
    """Refuse, before a step runs, a participant of the user's without every hook or with a `name`
    (the key of its state in checkpoints) that another part of the run has: `taken`, or another's."""
    for part in parts:
        missing = [hook for hook in HOOKS if not callable(getattr(part, hook, None))]
        if missing or not isinstance(getattr(part, "name", None), str):
            lacks = ", ".join(missing) or "a str `name`"
            raise TypeError(f"participant {part!r} has no {lacks}: subclass reasonrl.Participant, whose hooks "
                            "default to doing nothing, and override the ones it needs")
    names = [part.name for part in parts if part.name]
    for name in dict.fromkeys(names):
        if name in taken or names.count(name) > 1:
            raise ValueError(f"two parts of the run keep their state in checkpoints under the name {name!r}: give "
                             f"the participant another `name` (taken: {', '.join(sorted({*taken, *names}))})")


class ProblemSampler(Participant):
    """The sampler of sampling.problems: draws each round's problems, learns from their groups'
    accuracy, and reports its state with how dynamic sampling filled the step's batch."""

    name = "sampler"

    def __init__(self, sampler: Sampler, problems: Sequence[Problem]):
        self.sampler, self.problems = sampler, problems
        self.lock = threading.Lock()

    def draw(self, count: int, sources: frozenset[str] | None) -> list[int]:
        with self.lock:
            return from_sources(self.sampler.next, self.problems, sources, count)

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        accuracies = [group_accuracy(group) for group in groups]
        with self.lock:
            self.sampler.observe(list(indices), accuracies)
        return groups

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        with self.lock:
            return self.sampler.metrics() | rollouts.sampling_metrics

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


class PassRateBudget(Participant):
    """sampling.adaptive_budget: each problem's running pass rate, by which a round's samples are
    shared out (reasonrl.sampling.budget). Only production touches it."""

    name = "pass_rates"

    def __init__(self, rates: PassRates, min_samples: int):
        self.rates, self.min_samples = rates, min_samples

    def counts(self, indices: Sequence[int], total: int) -> list[int]:
        return allocate_samples([self.rates.get(index) for index in indices], total, min_samples=self.min_samples)

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        for index, group in zip(indices, groups):
            self.rates.update(index, group_accuracy(group))
        return groups

    def state_dict(self) -> dict[str, Any]:
        return self.rates.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rates.load_state_dict(state)


class SourceMetrics(Participant):
    """A mixture of sources: the reward and accuracy of each metadata["source"], as source/<metric>/<source>."""

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return by_source(rollouts.groups, _source_key)


def _source_key(metric: str) -> str:
    return f"source/{metric}/"


class SkippedGroups(Participant):
    """reward.on_error=skip_group: how many of the step's groups were left out, their reward failing."""

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return {"reward/error_groups": sum(group.reward_error is not None for group in rollouts.failed)}


class GeneratedTokens(Participant):
    """The tokens the run has generated so far (a tree's shared segments once), for a budget in
    tokens (train.max_generated_tokens) and to plot against: rollout/generated_tokens_total."""

    name = "generated_tokens"

    def __init__(self) -> None:
        self.total = 0

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        self.total += rollouts.tokens
        return {"rollout/generated_tokens_total": self.total}

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total = state["total"]


class Staleness(Participant):
    """Asynchronous or partial rollouts: how many updates behind the learner the trained samples were
    (replayed ones included; a partial rollout counts its oldest token), and how long the learner waited
    for them; with partial rollouts, per token too, and the share of samples spanning several versions."""

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        completions = [c for g in rollouts.groups for c in g.completions]
        behind = [step - c.policy_version for c in completions if c.policy_version is not None]
        metrics = {"async/staleness_mean": sum(behind) / max(len(behind), 1),
                   "async/staleness_max": float(max(behind, default=0)), "async/wait_s": rollouts.waited_s}
        if partial := [c.token_versions for c in completions if c.token_versions]:
            tokens_behind = [step - version for versions in partial for version in versions]
            metrics["async/token_staleness_mean"] = sum(tokens_behind) / max(len(tokens_behind), 1)
            metrics["async/partial_frac"] = sum(len(set(versions)) > 1 for versions in partial) / len(completions)
        return metrics
