"""Reward composition: a weighted sum of named components, gates, and per-source routing.

A component is a plain `RewardFn` (text and problem in, float out), a `GroupReward` (sees the
whole group and each completion's tokens) or a `TokenReward` (also a value per token). The
components' unweighted values are kept so they can be logged separately
(`Group.reward_components`). A component that raises or returns a non-finite value is a bug,
not a score: it becomes a `RewardError` naming the component, problem and completion; what the
run does with it is `score_groups`'s `on_error`. So is a value, or a weighted total, beyond
`MAX_REWARD` in magnitude: finite, but the statistics computed from it (group and batch means and
standard deviations, in float32 as the advantages are) would overflow to inf and NaN, and the run
would learn nothing without a word; and so is an integer too large for a float at all (10**400).

A check stopped at its time bound is not an error: the verifier scores it 0 and counts it
(`rewards.math.timeouts_on_this_thread`), and `WeightedReward` reports how many of a group's checks
were stopped (`GroupScores.timeouts`, then `Group.reward_timeouts`, logged as `reward/timeouts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from numbers import Real
from typing import Literal

from reasonrl.rewards.bounded import timeouts_on_this_thread
from reasonrl.spec import spec_of
from reasonrl.types import Completion, Group, GroupReward, Problem, RewardFn

_MAX_COMPLETION_CHARS = 500
# Squares of deviations up to 2 * MAX_REWARD, summed over millions of samples, stay below float32's
# largest value (3.4e38): the mean and variance of any group or batch of rewards are finite.
MAX_REWARD = 1e15

Component = RewardFn | GroupReward
OnError = Literal["stop", "skip_group"]


class RewardError(RuntimeError):
    """A reward component failed on a specific completion or group."""


def is_group_reward(fn: object) -> bool:
    return callable(getattr(fn, "score_group", None))


def is_token_reward(fn: object) -> bool:
    return callable(getattr(fn, "score_tokens", None))


def score_completions(fn: RewardFn | GroupReward, problem: Problem, completions: Sequence[Completion]) -> list[float]:
    """`fn`'s values for `completions`, whether it scores a group or one text at a time."""
    if is_group_reward(fn):
        return list(fn.score_group(problem, completions))
    return [fn(c.text, problem) for c in completions]


def _shown(completion: str) -> str:
    shown = completion[:_MAX_COMPLETION_CHARS]
    if len(completion) > _MAX_COMPLETION_CHARS:
        shown += f"... [{len(completion) - _MAX_COMPLETION_CHARS} more chars]"
    return repr(shown)


def _describe(name: str, problem: Problem, completions: Sequence[str]) -> str:
    shown = (f"completion {_shown(completions[0])}" if len(completions) == 1
             else f"its group of {len(completions)} completions, the first {_shown(completions[0])}")
    return f"reward component {name!r} on problem {problem.id!r} (gold answer {problem.answer!r}), {shown}"


def _shown_value(value: object) -> str:
    try:
        shown = repr(value)
    except ValueError:  # an int beyond the interpreter's limit on the digits it converts to text
        if not isinstance(value, int):
            raise
        return f"an integer of {value.bit_length()} bits"
    return shown if len(shown) <= 60 else f"{shown[:25]}...{shown[-10:]} ({len(shown)} characters)"


def _checked(name: str, problem: Problem, texts: Sequence[str], values: object, count: int) -> list[float]:
    """`values` as floats; texts[i] is the completion of values[i] (one text: all values are its)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) != count:
        raise RewardError(f"{_describe(name, problem, texts)} returned {values!r}; expected {count} numbers")
    numbers = []
    for index, value in enumerate(values):
        sample = [texts[index]] if len(texts) == count else texts
        try:
            number = float(value) if isinstance(value, Real) else math.nan
        except OverflowError:
            raise RewardError(f"{_describe(name, problem, sample)} returned {_shown_value(value)}, too large for a "
                              f"float; a reward must lie within +-{MAX_REWARD:g}: scale it down") from None
        if not math.isfinite(number):
            raise RewardError(f"{_describe(name, problem, sample)} returned {_shown_value(value)}; "
                              "a reward must be a finite number")
        if abs(number) > MAX_REWARD:
            raise RewardError(f"{_describe(name, problem, sample)} returned {_shown_value(value)}: the group's "
                              f"statistics (mean, standard deviation, in float32) would overflow; a reward must lie "
                              f"within +-{MAX_REWARD:g}: scale it down")
        numbers.append(number)
    return numbers


@dataclass(frozen=True)
class GroupScores:
    """A group's scores: `totals[g]` the weighted sum for completion g, `components[name][g]` each
    component's unweighted value, and `token_rewards[g]` one value per token of completion g when a
    component is token-level (the other components' weighted sum sits on the last token). `timeouts`
    counts the checks stopped at their time bound while scoring the group (each scored 0)."""

    totals: tuple[float, ...]
    components: Mapping[str, tuple[float, ...]]
    token_rewards: tuple[tuple[float, ...], ...] | None = None
    timeouts: int = 0


def _finite(number: Real) -> bool:
    """Whether `number` is a finite float's worth (an int past float's range is not: isfinite raises on it)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


class WeightedReward:
    """total = sum(weight * component) over the named components.

    `gates` maps a component to another one that must score above 0 for it to count (e.g. a
    format bonus for correct answers only); the gate's value is the one already computed. A gated
    plain reward is not called where it does not count; a gated group reward is called on the
    whole group and zeroed there.
    """

    def __init__(self, components: Mapping[str, tuple[Component, float]],
                 gates: Mapping[str, str] | None = None) -> None:
        if not components:
            raise ValueError("WeightedReward needs at least one component")
        for name, (fn, weight) in components.items():
            if not isinstance(weight, Real) or not _finite(weight):
                raise ValueError(f"reward component {name!r}: weight {weight!r} is not finite")
            if not callable(fn) and not is_group_reward(fn):
                raise TypeError(f"reward component {name!r}: {fn!r} is neither a function (completion, problem) "
                                "-> float nor an object with score_group(problem, completions)")
        self._gates = dict(gates or {})
        order = list(components)
        for gated, gate in self._gates.items():
            if gated not in components or gate not in components or gate in self._gates:
                raise ValueError(f"gate {gated!r} -> {gate!r}: both must be components ({', '.join(order)}), "
                                 "and a gate cannot itself be gated")
        # Gates are scored first so that gated components can read their values.
        self._components = {name: components[name] for name in sorted(order, key=lambda n: n in self._gates)}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._components)

    @property
    def weights(self) -> dict[str, float]:
        """Each component's weight in the total, by name."""
        return {name: float(weight) for name, (_, weight) in self._components.items()}

    @property
    def token_level(self) -> bool:
        return any(is_token_reward(fn) for fn, _ in self._components.values())

    def score_group(self, problem: Problem, completions: Sequence[Completion], *,
                    max_new_tokens: int | None = None) -> GroupScores:
        """Every component's values and the weighted totals; `max_new_tokens`, the generation budget the
        completions were sampled under, goes to the components that declare it (length rewards)."""
        timeouts_before = timeouts_on_this_thread()
        values: dict[str, list[float]] = {}
        token_values: dict[str, list[list[float]]] = {}
        for name, (fn, _) in self._components.items():
            counts = ([value > 0 for value in values[self._gates[name]]] if name in self._gates
                      else [True] * len(completions))
            values[name] = self._component_values(name, fn, problem, completions, counts, max_new_tokens)
            if is_token_reward(fn):
                token_values[name] = self._token_values(name, fn, problem, completions, counts)
        totals = tuple(sum(weight * values[name][g] for name, (_, weight) in self._components.items())
                       for g in range(len(completions)))
        _checked("(weighted total)", problem, [c.text for c in completions], totals, len(completions))
        token_rewards = None
        if token_values:
            token_rewards = tuple(self._dense(g, completion, values, token_values)
                                  for g, completion in enumerate(completions))
        return GroupScores(totals=totals, components={name: tuple(v) for name, v in values.items()},
                           token_rewards=token_rewards, timeouts=timeouts_on_this_thread() - timeouts_before)

    def _component_values(self, name: str, fn: Component, problem: Problem, completions: Sequence[Completion],
                          counts: list[bool], max_new_tokens: int | None) -> list[float]:
        texts = [c.text for c in completions]
        if is_group_reward(fn):
            budget = {"max_new_tokens": max_new_tokens} if "max_new_tokens" in spec_of(fn).inputs else {}
            try:
                scores = fn.score_group(problem, completions, **budget)
            except RewardError:
                raise
            except Exception as exc:
                raise RewardError(f"{_describe(name, problem, texts)} raised {type(exc).__name__}: {exc}") from exc
            return [value if count else 0.0
                    for value, count in zip(_checked(name, problem, texts, scores, len(texts)), counts)]
        scored = []
        for text, count in zip(texts, counts):
            if not count:
                scored.append(0.0)
                continue
            try:
                value = fn(text, problem)
            except RewardError:
                raise
            except Exception as exc:
                raise RewardError(f"{_describe(name, problem, [text])} raised {type(exc).__name__}: {exc}") from exc
            scored.extend(_checked(name, problem, [text], [value], 1))
        return scored

    def _token_values(self, name: str, fn: GroupReward, problem: Problem, completions: Sequence[Completion],
                      counts: list[bool]) -> list[list[float]]:
        texts = [c.text for c in completions]
        try:
            per_completion = fn.score_tokens(problem, completions)
        except Exception as exc:
            raise RewardError(f"{_describe(name, problem, texts)} raised {type(exc).__name__}: {exc}") from exc
        if len(per_completion) != len(completions):
            raise RewardError(f"{_describe(name, problem, texts)} returned token values for "
                              f"{len(per_completion)} completions; expected {len(completions)}")
        return [_checked(name, problem, [c.text], values, len(c.token_ids)) if count else [0.0] * len(c.token_ids)
                for c, values, count in zip(completions, per_completion, counts)]

    def _dense(self, g: int, completion: Completion, values: Mapping[str, list[float]],
               token_values: Mapping[str, list[list[float]]]) -> tuple[float, ...]:
        dense = [0.0] * len(completion.token_ids)
        if not dense:
            return ()
        for name, (_, weight) in self._components.items():
            if name in token_values:
                dense = [d + weight * v for d, v in zip(dense, token_values[name][g])]
            else:
                dense[-1] += weight * values[name][g]
        return tuple(dense)

    def score(self, completion: str, problem: Problem) -> tuple[float, dict[str, float]]:
        """The weighted total and each component's unweighted value for one completion's text
        (rewards that need the completion's tokens or its group see a text-only completion)."""
        scores = self.score_group(problem, [Completion(token_ids=(), text=completion, logprobs=(),
                                                       finish_reason="stop")])
        return scores.totals[0], {name: values[0] for name, values in scores.components.items()}

    def __call__(self, completion: str, problem: Problem) -> float:
        return self.score(completion, problem)[0]


@dataclass(frozen=True)
class RoutedReward:
    """Each problem names its verifier: `routes[problem.metadata[key]]` scores its group (a
    mixture of math and code problems, say). A problem without the key uses `default`: a route's
    name, or a function of the problem that names one (e.g. `rewards.code.default_verifier`); an
    unknown name is an error in the data, not a score of 0. Routed token-level rewards give their
    per-completion scores only."""

    routes: Mapping[str, Component]
    key: str = "verifier"
    default: str | Callable[[Problem], str] | None = None

    def __post_init__(self) -> None:
        if not self.routes:
            raise ValueError("RoutedReward needs at least one route")
        if isinstance(self.default, str) and self.default not in self.routes:
            raise ValueError(f"RoutedReward: default {self.default!r} is not a route ({', '.join(self.routes)})")

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        name = problem.metadata.get(self.key)
        if name is None:  # no key, or a null one (a row of a mixed export that names no verifier)
            name = self.default(problem) if callable(self.default) else self.default
        if name not in self.routes:
            raise ValueError(f"problem {problem.id!r} names verifier {name!r} in metadata[{self.key!r}]; "
                             f"known: {', '.join(sorted(self.routes))}")
        return score_completions(self.routes[name], problem, completions)


def score_groups(groups: Sequence[Group], reward: WeightedReward, on_error: OnError = "stop") -> list[Group]:
    """The groups with `rewards`, `reward_components` (and `token_rewards`) filled in.

    A failing component raises (`on_error="stop"`), or (`"skip_group"`) leaves that group
    unscored with the failure in `Group.reward_error`, for the caller to leave out and count."""
    if on_error not in ("stop", "skip_group"):
        raise ValueError(f"on_error must be 'stop' or 'skip_group', got {on_error!r}")
    scored = []
    for group in groups:
        try:
            scores = reward.score_group(group.problem, group.completions, max_new_tokens=group.max_new_tokens)
        except RewardError as exc:
            if on_error == "stop":
                raise
            scored.append(replace(group, reward_error=f"{exc}" + (f" ({exc.__cause__!r})" if exc.__cause__ else "")))
            continue
        scored.append(replace(group, rewards=scores.totals, reward_components=scores.components,
                              token_rewards=scores.token_rewards, reward_timeouts=scores.timeouts))
    return scored
