"""Choosing problems by how hard they are for the current policy: online difficulty filtering and
curricula. Each sampler draws problem indices with `next(count)`, learns from scored groups with
`observe(indices, accuracies)`, and keeps its whole state in `state_dict()` (saved in checkpoints,
so a resumed run draws the problems it would have drawn).

- `PassRates`: each problem's running pass rate, an exponential moving average of the accuracy of
  its groups (recent attempts count most: the policy changes).
- `BandSampler`: online difficulty filtering. Problems whose running pass rate is known and lies
  outside [low, high] are skipped: solved ones teach nothing, hopeless ones neither (Kimi k1.5's
  and Polaris' filtering of easy problems; PRIME's accuracy band, Cui et al. 2025, section 3.3,
  keeps 0.2 <= accuracy <= 0.8, applied there to each fresh group rather than to a running rate).
  Problems not yet attempted are always kept.
- `CompetenceCurriculum`: difficulty-ordered, competence-based curriculum (Platanios et al. 2019,
  "Competence-based Curriculum Learning", eq. 7, the square-root schedule): at step t of T the
  sampler draws uniformly from the easiest c(t) share of the problems,
      c(t) = min(1, sqrt(t (1 - c0^2) / T + c0^2)).
- `PassRateCurriculum`: pass-rate-driven stages. Problems are grouped by difficulty level; the
  sampler draws from the current level and moves to the next once the running accuracy of the
  level's groups reaches `advance_at`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from reasonrl.sampling.epochs import EpochSampler
from reasonrl.types import Group


def group_accuracy(group: Group) -> float:
    """The share of the group's completions that solved its problem (`Group.solved`)."""
    return sum(group.solved) / group.size


class PassRates:
    """Running pass rate of each problem index (exponential moving average with weight `decay` on the past)."""

    def __init__(self, decay: float = 0.5):
        if not 0 <= decay < 1:
            raise ValueError(f"PassRates: decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.rates: dict[int, float] = {}

    def update(self, index: int, accuracy: float) -> None:
        previous = self.rates.get(index)
        self.rates[index] = accuracy if previous is None else self.decay * previous + (1 - self.decay) * accuracy

    def get(self, index: int) -> float | None:
        return self.rates.get(index)

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "rates": {str(k): v for k, v in self.rates.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = state["decay"]
        self.rates = {int(k): v for k, v in state["rates"].items()}


class BandSampler:
    """Epoch order over the problems, skipping those whose running pass rate is outside [low, high].

    When every remaining problem of a full pass is outside the band the sampler stops skipping
    for that draw (a run whose problems are all solved keeps training rather than stalling);
    `skipped` counts the problems passed over, `exhausted` the draws that had to give up skipping.
    """

    def __init__(self, num_problems: int, *, low: float, high: float, seed: int = 0, decay: float = 0.5):
        if not 0 <= low <= high <= 1:
            raise ValueError(f"BandSampler: need 0 <= low <= high <= 1, got low={low}, high={high}")
        self.low, self.high = low, high
        self.order = EpochSampler(num_problems, seed=seed)
        self.pass_rates = PassRates(decay)
        self.skipped = self.exhausted = 0

    def in_band(self, index: int) -> bool:
        rate = self.pass_rates.get(index)
        return rate is None or self.low <= rate <= self.high

    def next(self, count: int) -> list[int]:
        chosen: list[int] = []
        looked_at, gave_up = 0, False
        while len(chosen) < count:
            index = self.order.next(1)[0]
            looked_at += 1
            if self.in_band(index):
                chosen.append(index)
            elif looked_at > self.order.num_problems:  # a full pass found too few: stop skipping
                chosen.append(index)
                gave_up = True
            else:
                self.skipped += 1
        self.exhausted += gave_up
        return chosen

    def observe(self, indices: Sequence[int], accuracies: Sequence[float]) -> None:
        for index, accuracy in zip(indices, accuracies):
            self.pass_rates.update(index, accuracy)

    def metrics(self) -> dict[str, float]:
        rates = list(self.pass_rates.rates.values())
        outside = sum(not self.low <= rate <= self.high for rate in rates)
        return {"sampling/skipped_problems": float(self.skipped), "sampling/outside_band": float(outside),
                "sampling/band_exhausted": float(self.exhausted)}

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order.state_dict(), "pass_rates": self.pass_rates.state_dict(),
                "skipped": self.skipped, "exhausted": self.exhausted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state["order"])
        self.pass_rates.load_state_dict(state["pass_rates"])
        self.skipped, self.exhausted = state["skipped"], state["exhausted"]


def competence(step: int, total_steps: int, initial: float) -> float:
    """Platanios et al.'s square-root competence: the share of the easiest problems open at `step`."""
    return min(1.0, math.sqrt(step * (1 - initial**2) / max(total_steps, 1) + initial**2))


def _difficulty_order(difficulties: Sequence[float]) -> list[int]:
    if not difficulties:
        raise ValueError("a curriculum needs at least one problem")
    return sorted(range(len(difficulties)), key=lambda i: (difficulties[i], i))


class CompetenceCurriculum:
    """Draws uniformly (without repeats inside a draw) from the easiest `competence(step)` share of the problems."""

    def __init__(self, difficulties: Sequence[float], *, total_steps: int, initial: float = 0.1, seed: int = 0):
        if not 0 < initial <= 1:
            raise ValueError(f"CompetenceCurriculum: initial competence must be in (0, 1], got {initial}")
        self.by_difficulty = _difficulty_order(difficulties)
        self.total_steps, self.initial, self.seed = total_steps, initial, seed
        self.step = 0

    def open_count(self) -> int:
        share = competence(self.step, self.total_steps, self.initial)
        return max(1, math.ceil(share * len(self.by_difficulty)))

    def next(self, count: int) -> list[int]:
        pool = self.by_difficulty[: self.open_count()]
        rng = random.Random(f"competence-{self.seed}-{self.step}")
        self.step += 1
        picks = rng.sample(pool, len(pool)) if count >= len(pool) else rng.sample(pool, count)
        while len(picks) < count:  # fewer open problems than asked for: repeat them
            picks.extend(rng.sample(pool, min(len(pool), count - len(picks))))
        return picks

    def observe(self, indices: Sequence[int], accuracies: Sequence[float]) -> None:
        pass  # the schedule depends on the step only

    def metrics(self) -> dict[str, float]:
        return {"sampling/open_problems": float(self.open_count())}

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "num_problems": len(self.by_difficulty)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["num_problems"] != len(self.by_difficulty):
            raise ValueError(f"curriculum state is for {state['num_problems']} problems, not "
                             f"{len(self.by_difficulty)}: the task changed since the checkpoint")
        self.step = state["step"]


class PassRateCurriculum:
    """Stages by difficulty level, easiest first; the next level opens when the running accuracy
    (moving average with weight `decay` on the past) of the current level's groups reaches `advance_at`."""

    def __init__(self, difficulties: Sequence[float], *, advance_at: float = 0.8, decay: float = 0.8, seed: int = 0):
        if not 0 < advance_at <= 1:
            raise ValueError(f"PassRateCurriculum: advance_at must be in (0, 1], got {advance_at}")
        order = _difficulty_order(difficulties)
        self.levels = sorted(set(difficulties))
        self.members = [[i for i in order if difficulties[i] == level] for level in self.levels]
        self.member_sets = [frozenset(m) for m in self.members]
        self.advance_at, self.decay, self.seed = advance_at, decay, seed
        self.level, self.accuracy = 0, 0.0
        self.samplers = [EpochSampler(len(m), seed=seed + k) for k, m in enumerate(self.members)]

    def next(self, count: int) -> list[int]:
        members = self.members[self.level]
        return [members[i] for i in self.samplers[self.level].next(count)]

    def observe(self, indices: Sequence[int], accuracies: Sequence[float]) -> None:
        for index, accuracy in zip(indices, accuracies):
            if index not in self.member_sets[self.level]:
                continue
            self.accuracy = self.decay * self.accuracy + (1 - self.decay) * accuracy
            if self.accuracy >= self.advance_at and self.level + 1 < len(self.levels):
                self.level, self.accuracy = self.level + 1, 0.0

    def metrics(self) -> dict[str, float]:
        return {"sampling/level": float(self.levels[self.level]), "sampling/level_accuracy": self.accuracy}

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "accuracy": self.accuracy, "levels": list(self.levels),
                "samplers": [s.state_dict() for s in self.samplers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if list(state["levels"]) != list(self.levels):
            raise ValueError(f"curriculum state has levels {state['levels']}, the task has {self.levels}")
        self.level, self.accuracy = state["level"], state["accuracy"]
        for sampler, sampler_state in zip(self.samplers, state["samplers"]):
            sampler.load_state_dict(sampler_state)
