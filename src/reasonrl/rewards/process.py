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

`ModelPRM` is a generative process reward model in Math-Shepherd's form: the model reads the
question and the steps, each step followed by a step tag, and the score of a step is the
probability of the "good" token against the "bad" one at the tag's position,
softmax(z[+], z[-])[+]. `ClassifierPRM` reads a token-classification head at the same tags (as
Qwen2.5-Math-PRM does: Zhang et al. 2025, "The Lessons of Developing Process Reward Models in
Mathematical Reasoning"). `process_grpo` is DeepSeekMath's process-supervision advantage
(normalise the step rewards over the group, a token's advantage is the sum of the normalised
rewards of its step and the steps after it).

Outcome gating (`gated_by`): the process reward counts only for completions the outcome
verifier scores above 0, in both views: a wrong answer gets score 0 and all its step rewards are 0
too. The process reward then ranks the reasoning of correct answers only, and a fluent but wrong
solution cannot collect step rewards from a reward model it fools (the reward hacking of model
rewards that Lightman et al. and DeepSeek-R1 warn of). This is also what `WeightedReward`'s
gates do to a token-level component.
"""

from __future__ import annotations

import inspect
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from reasonrl.rewards.bounded import count_stopped
from reasonrl.rewards.compose import score_completions
from reasonrl.rewards.judge import question_text
from reasonrl.types import Completion, GroupReward, Problem, RewardFn

SplitMode = Literal["lines", "double_newline", "step_markers", "delimiter"]
Aggregate = Literal["min", "mean", "last", "product"]

PLACEMENT_BUDGET_S = 2.0
"""Seconds `step_end_tokens` may spend on one completion (see there)."""
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


@dataclass(frozen=True)
class StepTagFormat:
    """How a PRM reads a completion: `template` with {question} (the problem's text,
    `judge.question_text`) and {steps}, every step followed by `step_tag` and the steps joined by
    `step_separator`. A step is scored at the token holding its tag's last character, located
    through the tokenizer's character offsets (a fast tokenizer), so a tag string that also appears
    inside a step adds no score. A tag that merges with the following text into one token lets the
    model see the next step's start: prefer a tag that is a token of its own."""

    step_tag: str = "\n\n"
    step_separator: str = ""
    template: str = "{question} {steps}"

    def __post_init__(self) -> None:
        if not self.step_tag:
            raise ValueError("a PRM's step_tag must be a non-empty string, e.g. '\\n\\n' or the PRM's special token")
        if "{steps}" not in self.template:
            raise ValueError(f"a PRM's template {self.template!r} has no {{steps}} field")

    def encode(self, tokenizer: Any, problem: Problem, steps: Sequence[str]) -> tuple[list[int], list[int]]:
        """The PRM's input ids for one completion's steps, and the position of each step's tag."""
        require_offsets(tokenizer)
        before, after = self.template.split("{steps}", 1)
        question = question_text(problem)
        text = before.replace("{question}", question)
        tag_ends = []
        for k, step in enumerate(steps):
            text += (self.step_separator if k else "") + step + self.step_tag
            tag_ends.append(len(text))
        text += after.replace("{question}", question)
        encoded = tokenizer(text, return_offsets_mapping=True)
        ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
        owner = _token_of_each_character(offsets, len(text))
        return ids, [_token_at(owner, end - 1, text) for end in tag_ends]


def require_offsets(tokenizer: Any) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("a PRM's tokenizer must be a fast (Rust) tokenizer, which reports character offsets to find "
                         "the step tags; load it with AutoTokenizer.from_pretrained(..., use_fast=True)")


def _token_of_each_character(offsets: Sequence[tuple[int, int]], length: int) -> list[int]:
    """For each character of a text of `length`, the index of the first token whose span holds it
    (-1: none): one pass, so that finding thousands of step tags costs the text's length."""
    owner = [-1] * length
    for index, (start, end) in enumerate(offsets):
        for char in range(start, min(end, length)):
            if owner[char] < 0:
                owner[char] = index
    return owner


def _token_at(owner: Sequence[int], char: int, text: str) -> int:
    """The index of the token whose character span holds `char`."""
    if owner[char] >= 0:
        return owner[char]
    raise ValueError(f"no token of the PRM input covers character {char} ({text[char]!r}); the tokenizer drops it "
                     "(e.g. strips whitespace): choose a step_tag the tokenizer keeps")


def tag_logits(model: Any, tokenizer: Any, fmt: StepTagFormat, problem: Problem,
               steps_per_completion: Sequence[Sequence[str]], batch_size: int) -> list[torch.Tensor]:
    """For completion g, the model's output logits at its step tags, (steps_g, C) with C the
    vocabulary (a causal LM) or the labels (a token classifier). Completions are run `batch_size`
    at a time, right-padded with an attention mask, no gradient: under causal attention padding
    changes no logit."""
    out = [torch.zeros((0, 0)) for _ in steps_per_completion]
    rows = [(g, *fmt.encode(tokenizer, problem, steps)) for g, steps in enumerate(steps_per_completion) if steps]
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for first in range(0, len(rows), batch_size):
        batch = rows[first:first + batch_size]
        input_ids_BT, attention_BT = right_padded([ids for _, ids, _ in batch], pad)
        with torch.inference_mode():
            logits_SC = logits_at(model, input_ids_BT.to(device), attention_BT.to(device), [tags for _, _, tags in batch])
        for (g, _, tags), z_KC in zip(batch, logits_SC.float().cpu().split([len(tags) for _, _, tags in batch])):
            out[g] = z_KC
    return out


def logits_at(model: Any, input_ids_BT: torch.Tensor, attention_BT: torch.Tensor,
              positions: Sequence[Sequence[int]]) -> torch.Tensor:
    """The model's output logits at positions[b] of each row b, row after row: (S, C), S the
    number of positions. A causal LM whose forward takes `logits_to_keep` runs its head at the
    union of the positions only: the whole vocabulary at every position would be most of a short
    input's head cost and its largest activation, for the two entries a PRM reads at a few tags."""
    kept = sorted({t for row in positions for t in row})
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        column_of = {t: i for i, t in enumerate(kept)}
        logits_BUC = model(input_ids=input_ids_BT, attention_mask=attention_BT,
                           logits_to_keep=torch.tensor(kept, dtype=torch.long, device=input_ids_BT.device)).logits
        return at_positions(logits_BUC, [[column_of[t] for t in row] for row in positions])
    return at_positions(model(input_ids=input_ids_BT, attention_mask=attention_BT).logits, positions)


def at_positions(values_BTC: torch.Tensor, positions: Sequence[Sequence[int]]) -> torch.Tensor:
    """values_BTC[b, t] for t in positions[b], row after row: (B, T, C) -> (S, C)."""
    rows = torch.tensor([b for b, row in enumerate(positions) for _ in row], dtype=torch.long, device=values_BTC.device)
    columns = torch.tensor([t for row in positions for t in row], dtype=torch.long, device=values_BTC.device)
    return values_BTC[rows, columns]


def right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows right-padded to one width, and their attention mask: (B, T), (B, T)."""
    width = max(len(ids) for ids in rows)
    input_ids_BT = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_BT = torch.zeros((len(rows), width), dtype=torch.long)
    for b, ids in enumerate(rows):
        input_ids_BT[b, :len(ids)] = torch.tensor(list(ids))
        attention_BT[b, :len(ids)] = 1
    return input_ids_BT, attention_BT


def _token_id(tokenizer: Any, token: str | int, role: str) -> int:
    if isinstance(token, int):
        return token
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"ModelPRM: the {role} token {token!r} is {len(ids)} tokens {ids} for this tokenizer; a PRM "
                         "scores a single token: give one that encodes to one id, or its id as an int")
    return ids[0]


@dataclass(frozen=True)
class ModelPRM:
    """A generative process reward model (Wang et al. 2024, Math-Shepherd, its released scoring code).

    The model reads the question and the steps laid out by `step_tag`, `step_separator` and
    `template` (`StepTagFormat`: by default "{question} {steps}" with each step followed by
    "\\n\\n"; Math-Shepherd's checkpoint wants step_tag=" ки", step_separator="\\n" and the tokens
    "+"/"-"). With z the model's logits at the position of a step's tag (its prediction of what
    follows the tag), the step scores

        P(good) = softmax(z[positive], z[negative])[positive] = sigmoid(z[positive] - z[negative]).
    """

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    step_tag: str = "\n\n"
    positive_token: str | int = "+"
    negative_token: str | int = "-"
    step_separator: str = ""
    template: str = "{question} {steps}"
    batch_size: int = 8

    @property
    def fmt(self) -> StepTagFormat:
        return StepTagFormat(step_tag=self.step_tag, step_separator=self.step_separator, template=self.template)

    def __post_init__(self) -> None:
        self.fmt  # noqa: B018  (a wrong layout fails here, not mid-run)
        require_offsets(self.tokenizer)
        if self.batch_size < 1:
            raise ValueError(f"ModelPRM: batch_size must be >= 1, got {self.batch_size}")
        if self.candidate_ids[0] == self.candidate_ids[1]:
            raise ValueError(f"ModelPRM: positive and negative tokens are the same id {self.candidate_ids[0]}")

    @classmethod
    def from_pretrained(cls, path_or_id: str, *, step_tag: str = "\n\n", positive_token: str | int = "+",
                        negative_token: str | int = "-", step_separator: str = "",
                        template: str = "{question} {steps}", batch_size: int = 8,
                        device: str | torch.device | None = None, **model_kwargs: Any) -> ModelPRM:
        """Load a causal-LM PRM and its tokenizer (a hub id or a directory); model_kwargs go to
        `AutoModelForCausalLM.from_pretrained` (e.g. torch_dtype)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path_or_id, **model_kwargs)
        model = (model if device is None else model.to(device)).eval()
        return cls(model=model, tokenizer=AutoTokenizer.from_pretrained(path_or_id), step_tag=step_tag,
                   positive_token=positive_token, negative_token=negative_token, step_separator=step_separator,
                   template=template, batch_size=batch_size)

    @property
    def candidate_ids(self) -> tuple[int, int]:
        return (_token_id(self.tokenizer, self.positive_token, "positive"),
                _token_id(self.tokenizer, self.negative_token, "negative"))

    def score_steps(self, problem: Problem, steps_per_completion: Sequence[Sequence[str]]) -> list[list[float]]:
        logits = tag_logits(self.model, self.tokenizer, self.fmt, problem, steps_per_completion, self.batch_size)
        candidates = list(self.candidate_ids)
        return [(z_KV[:, candidates].softmax(dim=-1)[:, 0].tolist() if len(z_KV) else []) for z_KV in logits]


@dataclass(frozen=True)
class ClassifierPRM:
    """A discriminative process reward model: a token classifier (transformers
    `AutoModelForTokenClassification`, or any model whose output `.logits` are (B, T, labels)) read
    at each step's tag, as Qwen2.5-Math-PRM scores steps at its "<extra_0>" separators (Zhang et
    al. 2025, "The Lessons of Developing Process Reward Models in Mathematical Reasoning"). With z
    the logits at the tag, a step scores softmax(z)[label], or sigmoid(z[0]) for a one-label head.
    """

    model: Any = field(repr=False)
    tokenizer: Any = field(repr=False)
    step_tag: str = "\n\n"
    label: int = 1
    step_separator: str = ""
    template: str = "{question} {steps}"
    batch_size: int = 8

    @property
    def fmt(self) -> StepTagFormat:
        return StepTagFormat(step_tag=self.step_tag, step_separator=self.step_separator, template=self.template)

    def __post_init__(self) -> None:
        self.fmt  # noqa: B018  (a wrong layout fails here, not mid-run)
        require_offsets(self.tokenizer)
        if self.batch_size < 1:
            raise ValueError(f"ClassifierPRM: batch_size must be >= 1, got {self.batch_size}")

    @classmethod
    def from_pretrained(cls, path_or_id: str, *, step_tag: str = "\n\n", label: int = 1, step_separator: str = "",
                        template: str = "{question} {steps}", batch_size: int = 8,
                        device: str | torch.device | None = None, **model_kwargs: Any) -> ClassifierPRM:
        """Load a token-classification PRM and its tokenizer (a hub id or a directory)."""
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        model = AutoModelForTokenClassification.from_pretrained(path_or_id, **model_kwargs)
        model = (model if device is None else model.to(device)).eval()
        return cls(model=model, tokenizer=AutoTokenizer.from_pretrained(path_or_id), step_tag=step_tag, label=label,
                   step_separator=step_separator, template=template, batch_size=batch_size)

    def score_steps(self, problem: Problem, steps_per_completion: Sequence[Sequence[str]]) -> list[list[float]]:
        logits = tag_logits(self.model, self.tokenizer, self.fmt, problem, steps_per_completion, self.batch_size)
        scores = []
        for z_KL in logits:
            if not len(z_KL):
                scores.append([])
            elif z_KL.shape[1] == 1:
                scores.append(torch.sigmoid(z_KL[:, 0]).tolist())
            elif 0 <= self.label < z_KL.shape[1]:
                scores.append(z_KL.softmax(dim=-1)[:, self.label].tolist())
            else:
                raise ValueError(f"ClassifierPRM: label {self.label} is not one of the model's {z_KL.shape[1]} labels")
        return scores


AGGREGATES: dict[str, Callable[[Sequence[float]], float]] = {
    "min": min,
    "mean": lambda scores: math.fsum(scores) / len(scores),
    "last": lambda scores: scores[-1],
    "product": math.prod,
}
"""How step scores become one score per completion (never called with no steps: those score 0)."""


def step_end_tokens(steps: Sequence[Step], completion: Completion, tokenizer: Any,
                    budget_s: float = PLACEMENT_BUDGET_S) -> list[int]:
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
    steps costs steps x tokens. Past `budget_s` the steps not yet placed end at the last token, and
    the completion is counted in `timeouts_on_this_thread` (reward/timeouts).
    """
    ids = list(completion.token_ids)
    decode = lambda count: tokenizer.decode(ids[:count], skip_special_tokens=True)
    if steps and not decode(len(ids)).startswith(completion.text):
        raise ValueError(f"ProcessReward: the completion's text {completion.text[:80]!r} is not a prefix of the "
                         f"decode of its token ids {decode(len(ids))[:80]!r}, so its steps cannot be placed on its "
                         "tokens; give ProcessReward the policy's tokenizer and an engine whose text is the decode "
                         "of its token ids (cut at stop strings)")
    deadline = time.monotonic() + budget_s
    ends: list[int] = []
    for k, step in enumerate(steps):
        if time.monotonic() > deadline:
            count_stopped(f"placing {len(steps)} steps on {len(ids)} tokens took over {budget_s:g} s: the last "
                          f"{len(steps) - k} steps end at the last token")
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
        dense = []
        for completion, row_steps, row_scores in zip(completions, steps, scores):
            values = [0.0] * len(completion.token_ids)
            for end, score in zip(step_end_tokens(row_steps, completion, self.tokenizer), row_scores):
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


def load_process_model(path_or_id: str) -> ModelPRM | ClassifierPRM:
    """A process reward model by its architecture: `ClassifierPRM` for a token-classification
    model, else `ModelPRM` (a causal LM read at its "+"/"-" tokens)."""
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(path_or_id).architectures or []
    if any(name.endswith("ForTokenClassification") for name in architectures):
        return ClassifierPRM.from_pretrained(path_or_id)
    return ModelPRM.from_pretrained(path_or_id)
