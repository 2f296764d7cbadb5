"""A weighted sum of named reward components, e.g. correctness + 0.1 * format.

The components' unweighted values are kept so they can be logged separately
(`Group.reward_components`). A component that raises or returns a non-finite value is a bug,
not a score: it becomes a `RewardError` naming the component, problem and completion.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from numbers import Real

from reasonrl.types import Group, Problem, RewardFn

_MAX_COMPLETION_CHARS = 500


class RewardError(RuntimeError):
    """A reward component failed on a specific completion."""


def _describe(name: str, problem: Problem, completion: str) -> str:
    shown = completion[:_MAX_COMPLETION_CHARS]
    if len(completion) > _MAX_COMPLETION_CHARS:
        shown += f"... [{len(completion) - _MAX_COMPLETION_CHARS} more chars]"
    return (
        f"reward component {name!r} on problem {problem.id!r} "
        f"(gold answer {problem.answer!r}), completion {shown!r}"
    )


class WeightedReward:
    """total = sum(weight * fn(completion, problem)) over the named components.

    `gates` maps a component to another one that must score above 0 for it to count (e.g. a
    format bonus for correct answers only); the gate's value is the one already computed, and
    a gated component that does not count is 0 and is not called.
    """

    def __init__(self, components: Mapping[str, tuple[RewardFn, float]],
                 gates: Mapping[str, str] | None = None) -> None:
        if not components:
            raise ValueError("WeightedReward needs at least one component")
        for name, (_, weight) in components.items():
            if not isinstance(weight, Real) or not math.isfinite(weight):
                raise ValueError(f"reward component {name!r}: weight {weight!r} is not finite")
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

    def score(self, completion: str, problem: Problem) -> tuple[float, dict[str, float]]:
        """The weighted total and each component's unweighted value."""
        values: dict[str, float] = {}
        for name, (fn, _) in self._components.items():
            if name in self._gates and values[self._gates[name]] <= 0:
                values[name] = 0.0
                continue
            try:
                value = fn(completion, problem)
            except Exception as exc:
                raise RewardError(
                    f"{_describe(name, problem, completion)} raised {type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(value, Real) or not math.isfinite(value):
                raise RewardError(
                    f"{_describe(name, problem, completion)} returned {value!r}; "
                    "a reward must be a finite number"
                )
            values[name] = float(value)
        total = sum(weight * values[name] for name, (_, weight) in self._components.items())
        return total, values

    def __call__(self, completion: str, problem: Problem) -> float:
        return self.score(completion, problem)[0]


def score_groups(groups: Sequence[Group], reward: WeightedReward) -> list[Group]:
    """The groups with `rewards` and `reward_components` filled in."""
    scored = []
    for group in groups:
        totals, components = [], {name: [] for name in reward.names}
        for completion in group.completions:
            total, values = reward.score(completion.text, group.problem)
            totals.append(total)
            for name, value in values.items():
                components[name].append(value)
        scored.append(replace(group, rewards=tuple(totals),
                              reward_components={name: tuple(v) for name, v in components.items()}))
    return scored
