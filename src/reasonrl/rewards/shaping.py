"""Shaping rewards: terms added next to the correctness reward to steer length and repetition,
and a guard that bounds a component.

- `SoftOverlongPunishment`: DAPO's length penalty near and past the generation limit
  (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", eq. 13).
- `CosineLengthReward`: correctness and length folded into one reward on a cosine schedule, with a
  penalty for truncated completions (Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning
  in LLMs", the Cosine Reward).
- `RepetitionPenalty`: the share of repeated n-grams times a negative maximum (Yeo et al. 2025, the
  N-gram repetition penalty).
- `ClippedReward`: bounds another component to [low, high] and refuses non-finite values.

Lengths are counted in tokens (`len(Completion.token_ids)`), so the length rewards are group
rewards (`types.GroupReward`): they need the engine's completions, not just the text.

No per-group whitening or rank transform lives here: group-relative advantage estimators
(GRPO, RLOO, ...) already centre and scale rewards within each group, so doing it again in a reward
would silently change what the estimator sees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Literal

from reasonrl.rewards.compose import score_completions
from reasonrl.rewards.math import MathReward
from reasonrl.spec import declare
from reasonrl.types import Completion, GroupReward, Problem, RewardFn


def _budget(reward_name: str, group_budget: int | None, max_length: int | None) -> int:
    """The generation budget a length is measured against: the group's, else the reward's own."""
    budget = group_budget if group_budget is not None else max_length
    if budget is None:
        raise ValueError(f"{reward_name} measures length against the generation budget: give it max_length, or "
                         "score groups that carry theirs (Group.max_new_tokens)")
    return budget


def completion_length(completion: Completion, reward_name: str) -> int:
    """The completion's length in tokens; an error when it was scored from its text alone."""
    if not completion.token_ids and completion.text:
        raise ValueError(f"{reward_name} measures length in tokens, but the completion {completion.text[:80]!r} has "
                         "no token ids (it was scored from its text alone, e.g. WeightedReward.score); score the "
                         "groups a rollout engine returns")
    return len(completion.token_ids)


@declare(inputs=("max_new_tokens",))
@dataclass(frozen=True)
class SoftOverlongPunishment:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the correctness reward.

    With L_max = `max_length`, L_cache = `cache_length` and |y| the completion's length in tokens:

        R_length(y) = 0                                  if |y| <= L_max - L_cache
                      ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                      -1                                 if |y| > L_max

    The penalty grows linearly from 0 to -1 across the last L_cache tokens before L_max. DAPO
    generates up to L_max = 20480 tokens with L_cache = 4096 (16384 tokens "expected"). L_max is the
    generation budget the group was sampled under (`max_new_tokens`, which training passes: the
    step's, a stage's when stages change it), else `max_length` (the generation limit, or below it
    for a harder cap).
    """

    max_length: int | None
    cache_length: int

    def __post_init__(self) -> None:
        if not 0 < self.cache_length <= (self.max_length or self.cache_length):
            raise ValueError(f"SoftOverlongPunishment: need 0 < cache_length <= max_length, got cache_length="
                             f"{self.cache_length}, max_length={self.max_length}")

    def penalty(self, length: int, max_length: int | None = None) -> float:
        max_length = _budget("SoftOverlongPunishment", max_length, self.max_length)
        if self.cache_length > max_length:
            raise ValueError(f"SoftOverlongPunishment: cache_length={self.cache_length} is longer than the generation "
                             f"budget {max_length}")
        expected = max_length - self.cache_length
        if length <= expected:
            return 0.0
        if length <= max_length:
            return (expected - length) / self.cache_length
        return -1.0

    def score_group(self, problem: Problem, completions: Sequence[Completion], *,
                    max_new_tokens: int | None = None) -> list[float]:
        return [self.penalty(completion_length(c, "SoftOverlongPunishment"), max_new_tokens) for c in completions]


def cosine_schedule(length: int, max_length: int, at_zero: float, at_max: float) -> float:
    """`at_zero` at length 0, `at_max` at `max_length`, half a cosine period in between."""
    return at_max + 0.5 * (at_zero - at_max) * (1.0 + math.cos(math.pi * length / max_length))


@declare(inputs=("max_new_tokens",))
@dataclass(frozen=True)
class CosineLengthReward:
    """Yeo et al. 2025's Cosine Reward: correctness and length in one reward.

    With CosFn(t, T, eta_min, eta_max) = eta_min + 1/2 (eta_max - eta_min)(1 + cos(t pi / T)),
    L_gen the completion's length in tokens and L_max = `max_length`:

        R(C, L_gen) = CosFn(L_gen, L_max, r_L^c, r_0^c)   if correct (C = 1)
                      CosFn(L_gen, L_max, r_L^w, r_0^w)   if wrong (C = 0)
                      r_e                                if L_gen = L_max (the completion was cut off)

    so a reward starts at r_0 for an empty completion and moves to r_L at L_max. The defaults are
    the paper's (and its released run scripts'): r_0^c = 2, r_L^c = 1 (shorter correct answers
    earn more), r_0^w = -10, r_L^w = 0 (a wrong answer costs less the longer the model thought),
    r_e = -10. A completion counts as cut off when the engine stopped it (`finish_reason ==
    "length"`) or it reached `max_length` tokens; its correctness is then not checked. Otherwise
    it is correct when `correct` (a plain reward, by default `MathReward()`) scores it above 0.
    L_max is the generation budget the group was sampled under (`max_new_tokens`, which training
    passes), else `max_length` (the generation limit).
    """

    max_length: int | None
    correct: RewardFn = field(default_factory=MathReward)
    r0_correct: float = 2.0
    rL_correct: float = 1.0
    r0_wrong: float = -10.0
    rL_wrong: float = 0.0
    exceed_penalty: float = -10.0

    def __post_init__(self) -> None:
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"CosineLengthReward: max_length must be >= 1, got {self.max_length}")
        values = (self.r0_correct, self.rL_correct, self.r0_wrong, self.rL_wrong, self.exceed_penalty)
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"CosineLengthReward: reward constants must be finite, got {values}")

    def score(self, completion: Completion, problem: Problem, max_new_tokens: int | None = None) -> float:
        max_length = _budget("CosineLengthReward", max_new_tokens, self.max_length)
        length = completion_length(completion, "CosineLengthReward")
        if completion.finish_reason == "length" or length >= max_length:
            return self.exceed_penalty
        if self.correct(completion.text, problem) > 0:
            return cosine_schedule(length, max_length, self.r0_correct, self.rL_correct)
        return cosine_schedule(length, max_length, self.r0_wrong, self.rL_wrong)

    def score_group(self, problem: Problem, completions: Sequence[Completion], *,
                    max_new_tokens: int | None = None) -> list[float]:
        return [self.score(c, problem, max_new_tokens) for c in completions]


def repeated_fraction(units: Sequence[object], n: int) -> float:
    """1 - (distinct n-grams) / (n-grams): the share of n-gram occurrences that repeat an earlier one.
    0 when the sequence has fewer than n units."""
    ngrams = [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]
    return 1.0 - len(set(ngrams)) / len(ngrams) if ngrams else 0.0


@dataclass(frozen=True)
class RepetitionPenalty:
    """Yeo et al. 2025's N-gram repetition penalty, in the form of their released
    `get_repetition_penalty`:

        P(y) = max_penalty * (1 - |distinct n-grams of y| / |n-grams of y|)

    a value in [max_penalty, 0]. `unit="tokens"` takes n-grams over the completion's token ids (what
    the policy actually repeats); `unit="words"` over its lower-cased, whitespace-split words (the
    authors' text version). The authors' released runs use n = 40 and put -0.05 on every token of a
    repeated n-gram (a per-token variant not offered here); this bounded form is scaled by
    `max_penalty` or the component weight. The authors' code adds it to wrong answers only; as a
    separate component it applies to every completion.
    """

    ngram_size: int = 40
    max_penalty: float = -1.0
    unit: Literal["tokens", "words"] = "tokens"

    def __post_init__(self) -> None:
        if self.ngram_size < 1:
            raise ValueError(f"RepetitionPenalty: ngram_size must be >= 1, got {self.ngram_size}")
        if not (math.isfinite(self.max_penalty) and self.max_penalty <= 0):
            raise ValueError(f"RepetitionPenalty: max_penalty must be a finite number <= 0 (a penalty), "
                             f"got {self.max_penalty}")
        if self.unit not in ("tokens", "words"):
            raise ValueError(f"RepetitionPenalty: unit must be 'tokens' or 'words', got {self.unit!r}")

    def penalty(self, completion: Completion) -> float:
        if self.unit == "words":
            units: Sequence[object] = completion.text.lower().split()
        else:
            completion_length(completion, "RepetitionPenalty(unit='tokens')")
            units = completion.token_ids
        return self.max_penalty * repeated_fraction(units, self.ngram_size)

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        return [self.penalty(c) for c in completions]


@dataclass(frozen=True)
class ClippedReward:
    """`reward` (a plain or a group reward) clipped to [low, high].

    A bounded component cannot dominate the total however far the policy pushes it, which caps
    what exploiting one flawed component can buy. A non-finite or non-numeric value is a bug in
    `reward`, not a score: it raises instead of being clipped into range, where it would hide.
    """

    reward: RewardFn | GroupReward
    low: float
    high: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high):
            raise ValueError(f"ClippedReward: need finite low <= high, got low={self.low}, high={self.high}")

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        values = score_completions(self.reward, problem, completions)
        for value in values:
            if not isinstance(value, Real) or not math.isfinite(value):
                raise ValueError(f"ClippedReward: {self.reward!r} returned {value!r} on problem {problem.id!r}; "
                                 "a reward must be a finite number")
        return [min(max(float(value), self.low), self.high) for value in values]
