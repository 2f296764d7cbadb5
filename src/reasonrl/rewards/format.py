"""Format rewards: does the completion present its answer in the requested layout?

Used as a small shaping term next to the correctness reward (see `compose.WeightedReward`),
so that the answer extractor has something to find early in training.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from reasonrl.rewards.answers import boxed_spans, is_blank
from reasonrl.types import Problem

_NON_SPACE = re.compile(r"\S")
# Tempered dots: a tag's content may not open or close the same tag again, so a second
# <answer> block cannot hide inside the first one. Matched against the stripped completion: a
# leading "\s*" would be retried from every position of a run of white space by a search.
_THINK_ANSWER = re.compile(
    r"<think>(?:(?!</?think>).)*</think>\s*<answer>\s*(?:(?!</?answer>)\S)(?:(?!</?answer>).)*</answer>",
    re.DOTALL,
)


def has_boxed(completion: str) -> bool:
    return any(not is_blank(completion, start, end) for start, end in boxed_spans(completion))


def has_answer_tag(completion: str) -> bool:
    """An <answer> followed by something other than white space and then a </answer> (the first <answer> decides:
    a later one has no more after it); a forward scan, as the lazy regex of it is quadratic in repeated tags."""
    start = completion.find("<answer>")
    if start < 0:
        return False
    content = _NON_SPACE.search(completion, start + len("<answer>"))
    return content is not None and completion.find("</answer>", content.end()) >= 0


def is_think_answer(completion: str) -> bool:
    return _THINK_ANSWER.fullmatch(completion.strip()) is not None


@dataclass(frozen=True)
class FormatReward:
    """1.0 if the completion follows `style` (a key of `FORMAT_CHECKS`), else 0.0.

    "boxed": a non-empty `\\boxed{...}` is present; "answer_tag": a non-empty
    `<answer>...</answer>` is present; "think_answer": the whole completion is
    `<think>...</think>` then a non-empty `<answer>...</answer>`, whitespace allowed around them.
    """

    style: str = "boxed"

    def __post_init__(self) -> None:
        if self.style not in FORMAT_CHECKS:
            raise ValueError(
                f"FormatReward: unknown style {self.style!r}; allowed: {sorted(FORMAT_CHECKS)}"
            )

    def __call__(self, completion: str, problem: Problem) -> float:
        return 1.0 if FORMAT_CHECKS[self.style](completion) else 0.0


FORMAT_CHECKS: dict[str, Callable[[str], bool]] = {
    "boxed": has_boxed,
    "answer_tag": has_answer_tag,
    "think_answer": is_think_answer,
}

# What a system message says so that the model writes the layout a check rewards (model.reasoning_format):
# DeepSeek-R1-Zero's template (Guo et al. 2025, Table 1) addressed to the model, and what the check also asks:
# nothing after </answer>.
FORMAT_INSTRUCTIONS: dict[str, str] = {
    "think_answer": "First think about the reasoning process, then give the answer. The reasoning process and the "
                    "answer are enclosed within <think> </think> and <answer> </answer> tags, respectively, i.e., "
                    "<think> reasoning process here </think> <answer> answer here </answer>. Write nothing after "
                    "</answer>.",
}
