"""The "math" reward: the answer pulled out of a completion (`reasonrl.rewards.answers`) checked
against the gold answer (`reasonrl.rewards.equivalence`: plain numbers directly, anything else with
math-verify, each check within a time bound). The names of both modules that users call are
importable from here too, as they were before the split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reasonrl.rewards.answers import (
    EXTRACTORS,
    answer_phrases,
    answer_tags,
    boxed_contents,
    boxed_spans,
    extract_answer,
    extract_answer_phrase,
    extract_answer_tag,
    extract_auto,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    is_blank,
)
from reasonrl.rewards.bounded import timeouts_on_this_thread
from reasonrl.rewards.equivalence import (
    CHECK_TIMEOUT_S,
    MAX_ANSWER_CHARS,
    MAX_EXPONENT,
    MAX_FACTORIAL,
    as_plain_number,
    check_many,
    math_equal,
    shutdown_pool,
)

if TYPE_CHECKING:
    from reasonrl.types import Completion, Problem

__all__ = [
    "CHECK_TIMEOUT_S", "EXTRACTORS", "MAX_ANSWER_CHARS", "MAX_EXPONENT", "MAX_FACTORIAL", "MathReward",
    "PooledMathReward", "answer_phrases", "answer_tags", "boxed_contents", "boxed_spans", "check_many",
    "extract_answer", "extract_answer_phrase", "extract_answer_tag", "extract_auto", "extract_boxed",
    "extract_gsm8k", "extract_last_number", "is_blank", "math_equal", "shutdown_pool", "timeouts_on_this_thread",
]


@dataclass(frozen=True)
class MathReward:
    """1.0 if the answer extracted from the completion equals `problem.answer`, else 0.0.

    A problem whose metadata says `answer_type="number"` only accepts a plain number: math-verify
    evaluates expressions, so restating the question ("\\boxed{74 + 20}") would otherwise count as
    the answer to "What is 74 + 20?", and a policy learns that within a few steps. A symbolic check past
    `timeout_s` seconds scores 0 (`math_equal`).
    """

    extract: str = "auto"
    timeout_s: float = CHECK_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.extract not in EXTRACTORS:
            raise ValueError(
                f"MathReward: unknown extract {self.extract!r}; allowed: {sorted(EXTRACTORS)}"
            )
        if not self.timeout_s > 0:
            raise ValueError(f"MathReward: timeout_s must be > 0, got {self.timeout_s}")

    def __call__(self, completion: str, problem: Problem) -> float:
        prediction = self.prediction(completion, problem)
        return 1.0 if math_equal(prediction, problem.answer, timeout_s=self.timeout_s) else 0.0

    def prediction(self, completion: str, problem: Problem) -> str | None:
        """The answer to check, or None when there is none or the problem wants a number and this is not one."""
        prediction = EXTRACTORS[self.extract](completion)
        if prediction is not None and problem.metadata.get("answer_type") == "number":
            return prediction if as_plain_number(prediction) is not None else None
        return prediction


@dataclass(frozen=True)
class PooledMathReward:
    """`MathReward` for a whole group at once, checked by `check_many`: in `workers` worker processes (0: one per
    CPU core), each check bounded by `timeout_s` seconds (past it the completion scores 0). A `GroupReward`."""

    extract: str = "auto"
    workers: int = 0
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        MathReward(self.extract)  # validates the extractor's name
        if self.workers < 0 or not self.timeout_s > 0:
            raise ValueError(f"PooledMathReward: need workers >= 0 and timeout_s > 0, got workers={self.workers}, "
                             f"timeout_s={self.timeout_s}")

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        single = MathReward(self.extract)
        pairs = [(single.prediction(completion.text, problem), problem.answer) for completion in completions]
        return [1.0 if equal else 0.0 for equal in check_many(pairs, workers=self.workers, timeout_s=self.timeout_s)]
