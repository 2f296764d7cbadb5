"""The optional parts of a training step, behind one small protocol, so that the loop has no
branch per feature: the problem sampler, pass rates for an adaptive sampling budget, the critic,
guidance, replay of correct completions, the KL controller, resets of the reference, and reports
on the step's rollouts. The loop calls every participant at the same points, in the order of the
list (reasonrl.trainer.build_participants):

- `observe(step, indices, groups)`: during production, each round's scored groups (`indices`:
  their problems' positions in the task); the groups to train on (replay may swap a remembered
  correct completion into an all-wrong group);
- `contribute(step, update)`: what it adds to the policy's update (a KL coefficient, an auxiliary
  loss);
- `after_update(step, batch, metrics)`: its own work after the policy's update (the critic's
  update, a supervised step, adapting the KL coefficient), adding its metrics;
- `metrics(step, rollouts)`: what it reports about the step;
- `state_dict()` / `load_state_dict()`: its state in checkpoints, under `name` ("": none).

Threads: with asynchronous rollouts (rollout.max_staleness > 0) `observe` runs in the rollout
pipeline's producer thread while the loop calls the rest. A participant whose state both threads
touch guards it with its own lock (the sampler, replay, guidance); the others are touched by one
thread only (pass rates by production; the critic, the KL controller, the reference and the
reports by the loop). Checkpoints are taken while the pipeline is idle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import torch

from reasonrl.algo.kl import AdaptiveKLCoef
from reasonrl.rewards import WeightedReward, score_groups
from reasonrl.rewards.compose import OnError
from reasonrl.rewards.summary import by_source
from reasonrl.rollout.producer import Rollouts
from reasonrl.sampling import PassRates, ReplayBuffer, allocate_samples, group_accuracy
from reasonrl.sampling.stages import from_sources
from reasonrl.stages.guidance import Guidance
from reasonrl.training.critic import Critic
from reasonrl.training.learner import Learner, PolicyLoss
from reasonrl.training.prime import PrimeEstimation
from reasonrl.types import Group, Problem, TrainBatch


@dataclass(frozen=True)
class PolicyUpdate:
    """What the policy's update optimises: `loss`, and an `auxiliary` (batch, loss) whose gradient
    joins every optimizer step (Learner.update)."""

    loss: PolicyLoss
    auxiliary: tuple[TrainBatch, PolicyLoss] | None = None


class Participant(Protocol):
    """A part of every training step (see the module docstring); each method defaults to doing nothing."""

    name: str = ""

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        return groups

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        return update

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        return None

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


P = TypeVar("P", bound=Participant)


class Participants:
    """A run's participants, each call made on every one in order: the order is part of the
    behaviour (guidance sees a group before replay changes it; metrics are logged in this order)."""

    def __init__(self, parts: Sequence[Participant]):
        self.parts = tuple(parts)

    def first(self, kind: type[P]) -> P | None:
        return next((part for part in self.parts if isinstance(part, kind)), None)

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

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        reported: dict[str, float] = {}
        for part in self.parts:
            reported |= part.metrics(step, rollouts)
        return reported


class ProblemSampler(Participant):
    """The sampler of sampling.problems: draws each round's problems, learns from their groups'
    accuracy, and reports its state with how dynamic sampling filled the step's batch."""

    name = "sampler"

    def __init__(self, sampler: Any, problems: Sequence[Problem]):
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


class CriticUpdate(Participant):
    """PPO's critic (GAE): after the policy, its value model fits the batch's returns with the same
    epochs, mini-batches and micro-batches (`sizes`)."""

    name = "critic"

    def __init__(self, critic: Critic, sizes: Mapping[str, int]):
        self.critic, self.sizes = critic, sizes

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        metrics |= self.critic.update(batch, step=step, **self.sizes)

    def state_dict(self) -> dict[str, Any]:
        return self.critic.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state)


class ImplicitPRMState(Participant):
    """PRIME (reasonrl.training.prime): the estimation step updates the implicit PRM before the
    policy's update; its weights, optimizer and update count go into checkpoints from here."""

    name = "prime"

    def __init__(self, estimation: PrimeEstimation):
        self.estimation = estimation

    def state_dict(self) -> dict[str, Any]:
        return self.estimation.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.estimation.load_state_dict(state)


class GuidanceSteps(Participant):
    """Guidance (reasonrl.stages.guidance): it sees the groups before replay changes them; mixed, its loss
    joins the policy's update as the auxiliary; interleaved, a supervised step of `learner` follows
    the update every guidance.every steps. Its loss is logged as loss/guidance."""

    name = "guidance"

    def __init__(self, guidance: Guidance, learner: Learner, micro_batch_size: int):
        self.guidance, self.learner, self.micro_batch_size = guidance, learner, micro_batch_size
        self.lock = threading.Lock()

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        with self.lock:
            self.guidance.observe(indices, groups, step)
        return groups

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        with self.lock:
            return replace(update, auxiliary=self.guidance.auxiliary(step))

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        with self.lock:
            interleaved = self.guidance.interleaved(step + 1)
        if interleaved is not None:
            supervised = self.learner.update(*interleaved, micro_batch_size=self.micro_batch_size, step=step)
            metrics["loss/guidance"] = supervised["loss/policy"]
        if "loss/auxiliary" in metrics:
            metrics["loss/guidance"] = metrics.pop("loss/auxiliary")
        with self.lock:
            metrics |= self.guidance.metrics(step)

    def state_dict(self) -> dict[str, Any]:
        return self.guidance.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.guidance.load_state_dict(state)


class Replay(Participant):
    """sampling.replay: remembers correct completions, and puts one into a group whose samples are
    all wrong when the problem was solved before (the group is scored again)."""

    name = "replay"

    def __init__(self, buffer: ReplayBuffer, reward_fn: WeightedReward, on_error: OnError):
        self.buffer, self.reward_fn, self.on_error = buffer, reward_fn, on_error
        self.lock = threading.Lock()

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        with self.lock:
            return [self._with_replay(index, group, step) for index, group in zip(indices, groups)]

    def _with_replay(self, index: int, group: Group, step: int) -> Group:
        self.buffer.add(index, group)
        mixed = self.buffer.mixed(index, group, step)
        if mixed is None:
            return group
        rescored = score_groups([mixed], self.reward_fn, self.on_error)[0]
        return group if rescored.reward_error is not None else rescored

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        with self.lock:
            return self.buffer.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)


class KLController(Participant):
    """The KL coefficient (algo.kl_coef, adapted towards algo.kl_target when set): a term of the
    loss (algo.kl_in=loss), or read as `value` by the advantage estimation (kl_in=reward)."""

    name = "kl_coef"

    def __init__(self, coef: AdaptiveKLCoef, *, in_loss: bool):
        self.coef, self.in_loss = coef, in_loss

    @property
    def value(self) -> float:
        return self.coef.value

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        return replace(update, loss=replace(update.loss, kl_coef=self.coef.value if self.in_loss else 0.0))

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        if "kl/mean" in metrics:
            metrics["kl/coef"] = self.coef.value
            self.coef.update(metrics["kl/mean"], samples=batch.num_sequences)

    def state_dict(self) -> dict[str, Any]:
        return self.coef.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef.load_state_dict(state)


class ReferenceReset(Participant):
    """algo.ref_reset_every: the reference becomes the current policy (`policy_weights()`) every
    that many steps. (Its weights are checkpointed by reasonrl.training.runs.trainer_state.)"""

    def __init__(self, reference: Any, policy_weights: Callable[[], Mapping[str, torch.Tensor]], every: int):
        self.reference, self.policy_weights, self.every = reference, policy_weights, every

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        if (step + 1) % self.every == 0:
            self.reference.load_state_dict(self.policy_weights())


class SourceMetrics(Participant):
    """A mixture of sources: the reward and accuracy of each metadata["source"], as source/<metric>/<source>."""

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return by_source(rollouts.groups, _source_key)


def _source_key(metric: str) -> str:
    return f"source/{metric}/"


class SkippedGroups(Participant):
    """reward.on_error=skip_group: how many of the step's groups were left out, their reward failing."""

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return {"reward/error_groups": len(rollouts.failed)}


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
    """Asynchronous rollouts: how many updates behind the learner the trained samples were (replayed
    ones included), and how long the learner waited for them."""

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        behind = [step - c.policy_version for g in rollouts.groups for c in g.completions
                  if c.policy_version is not None]
        return {"async/staleness_mean": sum(behind) / max(len(behind), 1),
                "async/staleness_max": float(max(behind, default=0)), "async/wait_s": rollouts.waited_s}
