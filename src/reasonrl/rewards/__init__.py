"""Verifiable rewards: plain functions `(completion, problem) -> float` (`types.RewardFn`), group
rewards with `score_group(problem, completions)` and token rewards (`types.GroupReward`,
`types.TokenReward`), composed by `WeightedReward` (docs/rewards.md).

`build_reward` turns a config string into a reward: a name from `REWARDS`, or
"package.module:function" for user code. `VERIFIERS` are the rewards that can score an answer
on their own (reward.verifier). `reasonrl.rewards.components` builds the reward cfg.reward asks
for from a registry of components (`COMPONENTS`).
"""

from __future__ import annotations

from collections.abc import Callable

from reasonrl.registry import is_import_path, lookup
from reasonrl.rewards.code import CodeReward
from reasonrl.rewards.compose import GroupScores, RewardError, RoutedReward, WeightedReward, score_groups
from reasonrl.rewards.format import FormatReward
from reasonrl.rewards.judge import ClassifierReward, JudgeReward
from reasonrl.rewards.math import EXTRACTORS, MathReward, PooledMathReward, check_many, extract_answer, math_equal
from reasonrl.rewards.shaping import ClippedReward, CosineLengthReward, RepetitionPenalty, SoftOverlongPunishment
from reasonrl.rewards.unsupervised import MajorityVoteReward, SelfCertaintyReward, SequenceLogProbReward
from reasonrl.types import GroupReward, RewardFn

__all__ = [
    "EXTRACTORS",
    "REWARDS",
    "VERIFIERS",
    "ClassifierReward",
    "ClippedReward",
    "CodeReward",
    "CosineLengthReward",
    "FormatReward",
    "GroupScores",
    "JudgeReward",
    "MajorityVoteReward",
    "MathReward",
    "PooledMathReward",
    "RepetitionPenalty",
    "RewardError",
    "RoutedReward",
    "SelfCertaintyReward",
    "SequenceLogProbReward",
    "SoftOverlongPunishment",
    "WeightedReward",
    "build_reward",
    "check_many",
    "extract_answer",
    "math_equal",
    "score_groups",
]


def build_reward(spec: str, **options: object) -> RewardFn | GroupReward:
    """The reward named `spec` in `REWARDS`, or the object at "package.module:attr".

    Options are keyword arguments of the factory. A user object is used as-is when no options
    are given, and called with them as a factory otherwise.
    """
    factory = lookup(REWARDS, spec, "reward")
    if is_import_path(spec) and not options:
        return factory
    return factory(**options)


VERIFIERS: dict[str, Callable[..., RewardFn | GroupReward]] = {
    "math": MathReward,
    "majority_vote": MajorityVoteReward,
    "code": CodeReward,
}

REWARDS: dict[str, Callable[..., RewardFn | GroupReward]] = {
    **VERIFIERS,
    "format": FormatReward,
    "overlong": SoftOverlongPunishment,
    "cosine_length": CosineLengthReward,
    "repetition": RepetitionPenalty,
    "sequence_logprob": SequenceLogProbReward,
}
