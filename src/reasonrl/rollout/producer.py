"""Each training step's rollouts behind one call: `RolloutProducer.next(step)`.

Producing step t's rollouts: draw problems from the sampler (from the sources of the stage in
force, reasonrl.sampling.stages), generate a group per problem (with an adaptive budget, more
samples for the problems the policy still fails), tag every sample with the policy version that
generated it, score the groups (leaving out those whose reward failed, with
reward.on_error=skip_group), and let the run's participants observe them (reasonrl.participants:
the sampler learns, replay may swap a remembered correct completion into an all-wrong group).
With dynamic sampling (DAPO) that is one round, repeated until enough groups are kept
(reasonrl.sampling.dynamic). Each round's seed derives from (run seed, step, round). An engine
whose episodes can fail (an agent's: Group.failures) gives groups without the failed episodes;
a group none of whose episodes finished is left out of the step, and every step reports
`env/failed`, the episodes lost.

Production runs on a AsyncRollouts: in the caller's thread when synchronous, ahead of the learner
in the pipeline's producer thread when rollout.max_staleness > 0 (reasonrl.rollout.asynchronous). What
it calls besides the engine (the sampler, the budget, the observer) must be safe to call from that
thread while the learner's thread runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import torch

from reasonrl.rewards import RewardError, WeightedReward, score_groups
from reasonrl.rewards.compose import OnError
from reasonrl.rewards.summary import summarize
from reasonrl.rollout.asynchronous import AsyncRollouts
from reasonrl.rollout.continuous import BatchStats
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.partial import PartialRollouts
from reasonrl.rollout.tree import TreeSampler
from reasonrl.sampling import fill_batch, generate_with_budget, has_reward_spread
from reasonrl.sampling.stages import Stage, stage_at
from reasonrl.seeds import derive_seed
from reasonrl.types import CORRECT, Group, Problem, RolloutEngine, SamplingParams


@dataclass
class Rollouts:
    """A step's groups, and what producing them took over all rounds of dynamic sampling."""

    sampling: SamplingParams
    groups: list[Group] = field(default_factory=list)
    sampling_metrics: dict[str, float] = field(default_factory=dict)  # dynamic sampling's rounds and drops
    generate_s: float = 0.0
    score_s: float = 0.0  # the reward's seconds
    tokens: int = 0
    # Left out of the step: the reward failed (reward.on_error=skip_group), or every episode did (Group.failures).
    failed: list[Group] = field(default_factory=list)
    episodes_failed: int | None = None  # episodes lost over all rounds (None: the engine's cannot fail)
    waited_s: float = 0.0  # how long the learner waited for them
    learnable: bool = True  # False when dynamic sampling kept no group: the groups are for the logs only


@dataclass(frozen=True)
class Production:
    """How a step's rollouts are produced: `prompts_per_step` groups sampled with `sampling`, its
    seed derived from `seed` and the step, its length and group size set by the stage in force.
    With `keep` (dynamic sampling), only the groups it accepts, from at most `max_rounds` rounds.
    Steps from the one given to `start` up to `last_step` - 1 are produced, at
    most `max_staleness` policy versions behind the learner. With `partial`, a step's groups are
    the first to finish, and the others continue at the next step (reasonrl.rollout.partial)."""

    prompts_per_step: int
    sampling: SamplingParams
    seed: int
    last_step: int
    stages: Sequence[Stage] = ()
    keep: Callable[[Group], bool] | None = None
    max_rounds: int = 1
    on_error: OnError = "stop"
    max_staleness: int = 0
    partial: bool = False  # partial rollouts (reasonrl.rollout.partial)
    max_partial_versions: int = 2


class ProblemSource(Protocol):
    def draw(self, count: int, sources: frozenset[str] | None) -> list[int]:
        """`count` indices of training problems (of `sources` only, when set)."""


class SampleBudget(Protocol):
    def counts(self, indices: Sequence[int], total: int) -> list[int]:
        """How many of `total` samples each problem gets."""


class Observer(Protocol):
    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        """Learn from a round's scored groups (`indices`: their problems' positions); the groups to keep."""


class RolloutProducer:
    """Produces every step's Rollouts of `problems` (the task's training problems) on `engine`,
    scored by `reward_fn`; `sampler` chooses the problems, `budget` (optional) the samples each
    gets, and `observer` sees every round's scored groups.

    The learner's side is the pipeline's: `start(step)`, `next(step)`, `publish(version,
    weights)` after each update, `idle()` around an evaluation or a checkpoint, `close()`."""

    def __init__(self, engine: RolloutEngine, problems: Sequence[Problem], reward_fn: WeightedReward,
                 production: Production, *, sampler: ProblemSource, observer: Observer,
                 budget: SampleBudget | None = None,
                 phase: Callable[[str], AbstractContextManager[None]] = lambda name: nullcontext()):
        self.engine, self.problems, self.reward_fn, self.production = engine, problems, reward_fn, production
        self.sampler, self.observer, self.budget = sampler, observer, budget
        self.phase = phase  # a watchdog's phases, "generate" and "reward" (reasonrl.guards.watchdog)
        self.index_of = {id(problem): index for index, problem in enumerate(problems)}
        self.partial_rollouts = (PartialRollouts(engine, problems, max_versions=production.max_partial_versions)
                                 if production.partial else None)
        self.pipeline: AsyncRollouts[Rollouts] = AsyncRollouts(
            engine, max_staleness=production.max_staleness, last_step=production.last_step)

    @property
    def stateful(self) -> dict[str, Any]:
        """What a checkpoint keeps of production: the steps produced ahead but not trained yet."""
        state: dict[str, Any] = {"pipeline": self.pipeline} if self.production.max_staleness else {}
        if isinstance(self.engine, TreeSampler):
            state["tree_sampler"] = self.engine  # its adaptive segment length
        if self.partial_rollouts is not None:
            state["partial_rollouts"] = self.partial_rollouts  # the groups still being generated
        return state

    def start(self, step: int) -> None:
        self.pipeline.start(self.produce, step)

    def next(self, step: int) -> Rollouts:
        """Step `step`'s rollouts (waiting for them if they are produced ahead)."""
        produced, waited = self.pipeline.next(step)
        return replace(produced.value, waited_s=waited)

    def publish(self, version: int, named_weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.pipeline.publish(version, named_weights)

    def idle(self) -> AbstractContextManager[None]:
        return self.pipeline.idle()

    def close(self) -> None:
        self.pipeline.close()

    def produce(self, step: int, version: int) -> Rollouts:
        """Step `step`'s scored groups, generated by the policy of `version`."""
        p = self.production
        stage = stage_at(p.stages, step)
        spent = Rollouts(sampling=_staged(p.sampling, stage))
        sources = stage.sources if stage else None
        groups, fill_metrics = fill_batch(partial(self._draw, sources),
                                          partial(self._round, step, version, spent, sources), p.prompts_per_step,
                                          max_rounds=p.max_rounds, keep=p.keep or _every_group)
        spent.groups, spent.sampling_metrics = groups, fill_metrics if p.keep else {}
        if spent.episodes_failed is not None:
            spent.sampling_metrics = {**spent.sampling_metrics, "env/failed": float(spent.episodes_failed)}
        if (partial_rollouts := self.partial_rollouts) is not None:
            spent.sampling_metrics = {**spent.sampling_metrics, "rollout/paused": float(partial_rollouts.paused())}
        if (stats := self._batch_stats()) is not None:  # of the step's last generation call
            spent.sampling_metrics = {**spent.sampling_metrics, "rollout/idle_slot_frac": stats.idle_frac}
            if stats.graph_captures:  # on a GPU: what recapturing after each reallocation cost
                spent.sampling_metrics = {**spent.sampling_metrics, "rollout/graph_captures": float(stats.graph_captures),
                                          "rollout/graph_capture_s": stats.graph_capture_s}
        spent.learnable = p.keep is None or any(p.keep(group) for group in groups)
        return spent

    def _batch_stats(self) -> BatchStats | None:
        """What the engine's continuous batch did (reasonrl.rollout.continuous), where there is one."""
        if self.partial_rollouts is not None:
            return self.partial_rollouts.stats
        return self.engine.batch_stats if isinstance(self.engine, HFEngine) else None

    def _draw(self, sources: frozenset[str] | None, count: int) -> list[Problem]:
        return [self.problems[index] for index in self.sampler.draw(count, sources)]

    def _round(self, step: int, version: int, spent: Rollouts, sources: frozenset[str] | None, problems: list[Problem],
               round_index: int) -> list[Group]:
        """One round: the problems' groups generated, tagged, scored and observed; `spent` counts the cost."""
        p = self.production
        seeded = replace(spent.sampling, seed=derive_seed(p.seed, step, *([round_index] if round_index else [])))
        started = time.perf_counter()
        with self.phase("generate"):
            if (partial_rollouts := self.partial_rollouts) is not None:  # the step's groups, and more in flight
                more = self._draw(sources, shortfall) if (shortfall := partial_rollouts.shortfall(len(problems))) else []
                generated = partial_rollouts.generate([*problems, *more], seeded, version, wanted=len(problems))
            elif self.budget is None:
                generated = self.engine.generate(problems, seeded)
            else:
                counts = self.budget.counts([self.index_of[id(problem)] for problem in problems],
                                            len(problems) * seeded.n)
                generated = generate_with_budget(self.engine, problems, seeded, counts)
        generated = [_tagged(group, version, seeded.max_new_tokens) for group in generated]
        spent.generate_s += time.perf_counter() - started
        spent.tokens += sum(group.generated_tokens for group in generated)
        if reports := [group.failures for group in generated if group.failures is not None]:
            spent.episodes_failed = (spent.episodes_failed or 0) + sum(map(len, reports))
        spent.failed.extend(group for group in generated if not group.completions)
        generated = [group for group in generated if group.completions]
        scoring = time.perf_counter()
        with self.phase("reward"):
            scored, failed = _scored(generated, self.reward_fn, p.on_error, step) if generated else ([], [])
        spent.score_s += time.perf_counter() - scoring
        spent.failed.extend(failed)
        return self.observer.observe(step, [self.index_of[id(group.problem)] for group in scored], scored)


def _tagged(group: Group, version: int, max_new_tokens: int) -> Group:
    """The group with the policy version of each completion (a partial rollout's own: its oldest token's)
    and the generation budget it was sampled under."""
    return replace(group, completions=tuple(c if c.token_versions else replace(c, policy_version=version)
                                            for c in group.completions), max_new_tokens=max_new_tokens)


def _scored(groups: list[Group], reward_fn: WeightedReward, on_error: OnError, step: int,
            ) -> tuple[list[Group], list[Group]]:
    """The scored groups, and those whose reward failed (left out of the step when skipped)."""
    scored = score_groups(groups, reward_fn, on_error)
    failed = [group for group in scored if group.reward_error is not None]
    if len(failed) == len(scored):
        raise RewardError(f"the reward failed on every group of step {step + 1}; the first: {failed[0].reward_error}")
    return [group for group in scored if group.reward_error is None], failed


def _staged(sampling: SamplingParams, stage: Stage | None) -> SamplingParams:
    if stage is None:
        return sampling
    return replace(sampling, max_new_tokens=stage.max_new_tokens or sampling.max_new_tokens,
                   n=stage.group_size or sampling.n)


def _every_group(group: Group) -> bool:
    return True


def rollout_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """The step's rollout metrics as the trainer logs them (reward/*, rollout/*), read by the alarms too."""
    metrics = {}
    for key, value in summarize(groups, "").items():
        if key in ("len_mean", "truncated_frac"):
            metrics[f"rollout/{key}"] = value
        else:
            metrics[f"reward/{key.removeprefix('reward_')}"] = value
    rewards = torch.tensor([r for group in groups for r in group.rewards])
    metrics["reward/std"] = rewards.std().item() if rewards.numel() > 1 else 0.0
    metrics["reward/timeouts"] = sum(group.reward_timeouts for group in groups)  # checks stopped at their time bound
    metrics["rollout/zero_std_frac"] = sum(not has_reward_spread(group) for group in groups) / max(len(groups), 1)
    if trees := [group for group in groups if group.tree is not None]:
        # A tree whose answers end before it branches holds fewer completions than its branching's product.
        metrics["rollout/tree_completions_mean"] = sum(group.size for group in trees) / len(trees)
        metrics["rollout/tree_segment_tokens"] = sum(group.tree.segment_tokens for group in trees) / len(trees)
    if all(CORRECT in group.reward_components for group in groups):
        # Lengths of right and wrong answers apart: a length bias shows as wrong answers growing.
        for name, wanted in (("correct", True), ("wrong", False)):
            lengths = [len(c.token_ids) for g in groups for c, solved in zip(g.completions, g.solved)
                       if solved == wanted]
            if lengths:
                metrics[f"rollout/len_{name}_mean"] = sum(lengths) / len(lengths)
    return metrics
