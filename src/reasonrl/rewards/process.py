"""Process rewards: a score for each reasoning step, not just for the final answer.

A completion is cut into steps (`split_steps`), a step scorer (`StepScorer`) gives each step a
score, and `ProcessReward` turns them into the two views of a `types.TokenReward`:

- per completion (`score_group`): the step scores aggregated into one number, "min" (Wang et al.
  2024, "Math-Shepherd: Verify and Reinforce LLMs Step-by-step without Human Annotations", which
  ranks a solution by its weakest step), "product" (Lightman et al. 2023, "Let's Verify Step by
  Step": the probability that every step is correct), "mean" or "last";
- per token (`score_tokens`): each step's score on the last token of that step, 0 elsewhere: the
  dense rewards of process supervision (Shao et al. 2024, "DeepSeekMath", 4.1.3; also the implicit
  process rewards of Cui et al. 2025, "Process Reinforcement through Implicit Rewards" (PRIME),
  which are likewise credited token by token).

The step scorers that read a model, `ModelPRM` and `ClassifierPRM`, live in `rewards.prm`.
`process_grpo` is DeepSeekMath's process-supervision advantage (normalise the step rewards over the
group, a token's advantage is the sum of the normalised rewards of its step and the steps after it).

Outcome gating (`gated_by`): the process reward counts only for completions the outcome
verifier scores above 0, in both views: a wrong answer gets score 0 and all its step rewards are 0
too. The process reward then ranks the reasoning of correct answers only, and a fluent but wrong
solution cannot collect step rewards from a reward model it fools (the reward hacking of model
rewards that Lightman et al. and DeepSeek-R1 warn of). This is also what `WeightedReward`'s
gates do to a token-level component.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from reasonrl.rewards.bounded import count_stopped
from reasonrl.rewards.compose import score_completions
from reasonrl.types import Completion, GroupReward, Problem, RewardFn

SplitMode = Literal["lines", "double_newline", "step_markers", "delimiter"]
Aggregate = Literal["min", "mean", "last", "product"]

PLACEMENT_BUDGET_S = 2.0
"""Seconds `step_end_tokens` may spend on the completions of one group (see there)."""
STEP_MARKER = r"(?im)^[ \t#*]*step[ \t]*\d+[ \t]*[:.)]"
"""Where a step begins in "step_markers" mode: a line opening with "Step 1:", "Step 2.", "## Step 3)",
"**Step 4:" (any case)."""


@dataclass(frozen=True)
class Step:
    """One reasoning step: `text` is `source[start:end]` of the text it was split from, stripped of
    surrounding whitespace, so `end` is one past the step's last visible character."""

    text: str
    start: int
    end: int


def split_steps(text: str, *, mode: SplitMode = "lines", delimiter: str | None = None,
                marker: str = STEP_MARKER) -> list[Step]:
    """The non-blank steps of `text`, in order.

    mode="lines": one step per line. "double_newline": steps are paragraphs, separated by one or
    more blank lines. "step_markers": a step begins at each `marker` match (a regex; by default a
    line opening with "Step N:"), the marker staying in its step; text before the first marker is
    a step of its own. "delimiter": steps are separated by the literal string `delimiter`.
    """
    if mode == "lines":
        pieces = _between(text, re.compile(r"\n"))
    elif mode == "double_newline":
        pieces = _between(text, re.compile(r"\n[ \t\r]*\n\s*"))
    elif mode == "delimiter":
        if not delimiter:
            raise ValueError("split_steps: mode='delimiter' needs a non-empty delimiter, e.g. delimiter='ки'")
        pieces = _between(text, re.compile(re.escape(delimiter)))
    elif mode == "step_markers":
        starts = sorted({0, *(match.start() for match in re.finditer(marker, text))})
        pieces = list(zip(starts, [*starts[1:], len(text)]))
    else:
        raise ValueError(f"split_steps: unknown mode {mode!r}; use 'lines', 'double_newline', 'step_markers' "
                         "or 'delimiter'")
    steps = []
    for start, end in pieces:
        piece = text[start:end]
        stripped = piece.strip()
        if stripped:
            first = start + len(piece) - len(piece.lstrip())
            steps.append(Step(text=stripped, start=first, end=first + len(stripped)))
    return steps


def _between(text: str, separator: re.Pattern[str]) -> list[tuple[int, int]]:
    """The (start, end) spans of the pieces of `text` between matches of `separator`."""
    spans, start = [], 0
    for match in separator.finditer(text):
        spans.append((start, match.start()))
        start = match.end()
    spans.append((start, len(text)))
    return spans


class StepScorer(Protocol):
    """Scores the steps of each completion of a problem: `result[g][k]` is the score of step k of
    completion g (one score per step given, a finite number, typically a probability in [0, 1])."""

    def score_steps(self, problem: Problem, steps_per_completion: Sequence[Sequence[str]]) -> list[list[float]]: ...


AGGREGATES: dict[str, Callable[[Sequence[float]], float]] = {
    "min": min,
    "mean": lambda scores: math.fsum(scores) / len(scores),
    "last": lambda scores: scores[-1],
    "product": math.prod,
}
"""How step scores become one score per completion (never called with no steps: those score 0)."""


def step_end_tokens(steps: Sequence[Step], completion: Completion, tokenizer: Any,
                    deadline: float | None = None) -> list[int]:
    """For each step, the index in `completion.token_ids` of the token that completes its text.

    The token ids are never re-tokenised: prefixes of them are decoded (as the engine decodes,
    special tokens skipped) and the step ends at the first prefix whose decode holds
    `completion.text[:step.end]`, found by a galloping search from the previous step's end (steps
    are short, so a few decodes per step). The text may be shorter than the decode of all ids: an
    engine that stops at a stop string keeps the string's tokens but cuts it from the text; tokens
    past the text then end no step. A text that is not a prefix of the decode (an engine that
    post-processes its text, or a tokenizer other than the policy's) is an error: the steps cannot
    be placed on the tokens.

    Bounded time: each decode costs the prefix's length, so a completion of thousands of one-token
    steps costs steps x tokens. Past `deadline` (a `time.monotonic()`; by default PLACEMENT_BUDGET_S
    from now; `score_tokens` gives a group's completions one) the steps not yet placed end at the last
    token, and the completion is counted in `timeouts_on_this_thread` (reward/timeouts).
    """
    ids = list(completion.token_ids)
    decode = lambda count: tokenizer.decode(ids[:count], skip_special_tokens=True)
    if steps and not decode(len(ids)).startswith(completion.text):
        raise ValueError(f"ProcessReward: the completion's text {completion.text[:80]!r} is not a prefix of the "
                         f"decode of its token ids {decode(len(ids))[:80]!r}, so its steps cannot be placed on its "
                         "tokens; give ProcessReward the policy's tokenizer and an engine whose text is the decode "
                         "of its token ids (cut at stop strings)")
    deadline = time.monotonic() + PLACEMENT_BUDGET_S if deadline is None else deadline
    ends: list[int] = []
    for k, step in enumerate(steps):
        if time.monotonic() > deadline:
            count_stopped(f"placing {len(steps)} steps on {len(ids)} tokens ran past the time for placing its group's "
                          f"steps: the last {len(steps) - k} steps end at the last token")
            return ends + [len(ids) - 1] * (len(steps) - k)
        ends.append(_first_prefix_holding(completion.text[:step.end], decode, ends[-1] + 1 if ends else 1, len(ids)))
    return ends


def _first_prefix_holding(wanted: str, decode: Callable[[int], str], low: int, high: int) -> int:
    """The index of the last token of the shortest prefix (of at least `low` tokens, at most `high`)
    whose decode starts with `wanted`: galloping from `low`, then bisecting the bracket found."""
    step = 1
    while low + step - 1 < high and not decode(low + step - 1).startswith(wanted):
        low, step = low + step, step * 2
    high = min(high, low + step - 1)
    while low < high:
        middle = (low + high) // 2
        if decode(middle).startswith(wanted):
            high = middle
        else:
            low = middle + 1
    return low - 1


@dataclass(frozen=True)
class ProcessReward:
    """A process reward (`types.TokenReward`): each completion split into steps (`split`, a
    `split_steps` mode or a function text -> steps), the steps scored by `scorer`, and

    - `score_group`: AGGREGATES[aggregate] of the step scores; 0 for a completion without steps;
    - `score_tokens`: step k's score on the last token of step k (`step_end_tokens`, which needs
      the policy's `tokenizer`), 0 on the other tokens.

    With `gated_by` (an outcome verifier, a `RewardFn` or `GroupReward`) a completion it scores
    at or below 0 gets 0 in both views (the module docstring says why). The scores of the last
    group scored are kept, so the two views of one group call the scorer once.
    """

    scorer: StepScorer
    split: SplitMode | Callable[[str], Sequence[Step]] = "lines"
    aggregate: Aggregate = "min"
    gated_by: RewardFn | GroupReward | None = None
    tokenizer: Any = field(default=None, repr=False)
    delimiter: str | None = None
    _last: dict[tuple, tuple] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"ProcessReward: unknown aggregate {self.aggregate!r}; use one of "
                             f"{', '.join(AGGREGATES)}")
        if not callable(self.split):
            split_steps("", mode=self.split, delimiter=self.delimiter)  # an unknown mode fails here, not mid-run

    def steps(self, text: str) -> list[Step]:
        if callable(self.split):
            return list(self.split(text))
        return split_steps(text, mode=self.split, delimiter=self.delimiter)

    def step_scores(self, problem: Problem, completions: Sequence[Completion],
                    ) -> tuple[list[list[Step]], list[list[float]]]:
        """Each completion's steps and their scores, zeroed where the outcome gate says wrong."""
        key = (problem.id, repr(problem.prompt), problem.answer, tuple(c.text for c in completions))
        if key in self._last:
            return self._last[key]
        steps = [self.steps(c.text) for c in completions]
        scores = self.scorer.score_steps(problem, [[s.text for s in row] for row in steps])
        if len(scores) != len(completions) or any(len(s) != len(row) for s, row in zip(scores, steps)):
            raise ValueError(f"ProcessReward: the step scorer returned {[len(s) for s in scores]} scores for "
                             f"{[len(row) for row in steps]} steps of problem {problem.id!r}; it must score every "
                             "step of every completion")
        scores = [[float(value) for value in row] for row in scores]
        if not all(math.isfinite(value) for row in scores for value in row):
            raise ValueError(f"ProcessReward: the step scorer returned a non-finite score for problem {problem.id!r}: "
                             f"{scores}")
        if self.gated_by is not None:
            correct = [value > 0 for value in score_completions(self.gated_by, problem, completions)]
            scores = [row if ok else [0.0] * len(row) for row, ok in zip(scores, correct)]
        self._last.clear()
        self._last[key] = (steps, scores)
        return steps, scores

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        _, scores = self.step_scores(problem, completions)
        return [AGGREGATES[self.aggregate](row) if row else 0.0 for row in scores]

    def score_tokens(self, problem: Problem, completions: Sequence[Completion]) -> list[list[float]]:
        if self.tokenizer is None:
            raise ValueError("ProcessReward: per-token rewards need the policy's tokenizer to map steps to tokens; "
                             "build ProcessReward(..., tokenizer=policy_tokenizer)")
        steps, scores = self.step_scores(problem, completions)
        dense, deadline = [], time.monotonic() + PLACEMENT_BUDGET_S
        for completion, row_steps, row_scores in zip(completions, steps, scores):
            values = [0.0] * len(completion.token_ids)
            for end, score in zip(step_end_tokens(row_steps, completion, self.tokenizer, deadline), row_scores):
                values[end] += score  # two steps ending in one token share it
            dense.append(values)
        return dense


def process_grpo(token_rewards_NT: torch.Tensor, mask_NT: torch.Tensor, *, step_mask_NT: torch.Tensor,
                 group_N: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO with process supervision (Shao et al. 2024, DeepSeekMath, 4.1.3).

    The step rewards r_i^index(j) (token_rewards_NT where step_mask_NT is 1: the last token of each
    step) of all completions of a group (rows with the same group_N) are normalised together,
    r~ = (r - mean(R)) / (std(R) + eps), std the unbiased sample std as in `algo.advantages.grpo`
    (0 when the group's step rewards are all equal or it has one step); then

        A_{i,t} = sum over steps j of completion i with index(j) >= t of r~_i^index(j).

    Tokens after a completion's last step get 0. (N, T), (N, T), step_mask (N, T), group (N,) -> (N, T).
    """
    steps_NT = step_mask_NT.bool() & mask_NT.bool()
    normalized_NT = torch.zeros_like(token_rewards_NT, dtype=torch.float32)
    for group in group_N.unique():
        in_group_NT = steps_NT & (group_N == group)[:, None]
        rewards = token_rewards_NT[in_group_NT].float()
        if rewards.numel() > 1 and rewards.std() > 0:
            normalized_NT[in_group_NT] = (rewards - rewards.mean()) / (rewards.std() + eps)
    return normalized_NT.flip(1).cumsum(1).flip(1) * mask_NT
