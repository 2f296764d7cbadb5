"""Verifiable rewards: functions `(completion, problem) -> float` (see `types.RewardFn`).

`build_reward` turns a config string into a reward: a name from `REWARDS`, or
"package.module:function" for user code.
"""

from __future__ import annotations

from collections.abc import Callable

from reasonrl.registry import is_import_path, lookup
from reasonrl.rewards.compose import RewardError, WeightedReward, score_groups
from reasonrl.rewards.format import FormatReward
from reasonrl.rewards.math import EXTRACTORS, MathReward, extract_answer, math_equal
from reasonrl.types import RewardFn

__all__ = [
    "EXTRACTORS",
    "REWARDS",
    "FormatReward",
    "MathReward",
    "RewardError",
    "WeightedReward",
    "build_reward",
    "extract_answer",
    "math_equal",
    "score_groups",
]


def build_reward(spec: str, **options: object) -> RewardFn:
    """The reward named `spec` in `REWARDS`, or the object at "package.module:attr".

    Options are keyword arguments of the factory. A user object is used as-is when no options
    are given, and called with them as a factory otherwise.
    """
    factory = lookup(REWARDS, spec, "reward")
    if is_import_path(spec) and not options:
        return factory
    return factory(**options)


REWARDS: dict[str, Callable[..., RewardFn]] = {
    "math": MathReward,
    "format": FormatReward,
}
