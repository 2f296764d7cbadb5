"""Process reward models: the step scorers (`process.StepScorer`) that read a model.

`ModelPRM` is a generative process reward model in Math-Shepherd's form (Wang et al. 2024,
"Math-Shepherd: Verify and Reinforce LLMs Step-by-step without Human Annotations"): the model reads
the question and the steps, each step followed by a step tag, and the score of a step is the
probability of the "good" token against the "bad" one at the tag's position,
softmax(z[+], z[-])[+]. `ClassifierPRM` reads a token-classification head at the same tags (as
Qwen2.5-Math-PRM does: Zhang et al. 2025, "The Lessons of Developing Process Reward Models in
Mathematical Reasoning"). `StepTagFormat` lays the steps out and finds the tags' tokens;
`load_process_model` picks the class from a checkpoint's architecture. `reasonrl prm`
(stages/prm.py) trains either kind.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl.rewards.judge import question_text
from reasonrl.types import Problem


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


class _StepTagged:
    """What both PRM forms share: the layout their `step_tag`, `step_separator` and `template` fields give, and
    the checks of their settings when one is made rather than at its first step."""

    step_tag: str
    step_separator: str
    template: str
    tokenizer: Any
    batch_size: int

    @property
    def fmt(self) -> StepTagFormat:
        return StepTagFormat(step_tag=self.step_tag, step_separator=self.step_separator, template=self.template)

    def __post_init__(self) -> None:
        self.fmt  # noqa: B018  (a wrong layout fails here, not mid-run)
        require_offsets(self.tokenizer)
        if self.batch_size < 1:
            raise ValueError(f"{type(self).__name__}: batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class ModelPRM(_StepTagged):
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

    def __post_init__(self) -> None:
        super().__post_init__()
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
class ClassifierPRM(_StepTagged):
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


def load_process_model(path_or_id: str) -> ModelPRM | ClassifierPRM:
    """A process reward model by its architecture: `ClassifierPRM` for a token-classification
    model, else `ModelPRM` (a causal LM read at its "+"/"-" tokens)."""
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(path_or_id).architectures or []
    if any(name.endswith("ForTokenClassification") for name in architectures):
        return ClassifierPRM.from_pretrained(path_or_id)
    return ModelPRM.from_pretrained(path_or_id)
