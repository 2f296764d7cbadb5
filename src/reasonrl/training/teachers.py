"""Teachers for on-policy distillation (reasonrl.algo.distill; the method: reasonrl.methods.distill):
models that score the student's own sampled tokens.

A teacher is a local causal LM (a hub id, a model directory, a checkpoint, or the policy's own start
or earlier checkpoint: self-distillation), or a server with an OpenAI-compatible completions API
that returns prompt log-probs (`reasonrl serve`, vLLM). Either way it returns log p_teacher(y_t) of
every completion token at temperature 1: the teacher's own distribution. Teacher and student must
share one tokenizer (the student's token ids are scored as they are); a mismatch is refused.

The HTTP client is hand-written with urllib (as reasonrl.rollout.openai is): one POST per chunk of
sequences, no dependency on the `openai` package.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from reasonrl.rollout.openai import OpenAIServerError, post_json
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import TrainBatch

PROBE = "Tokenizer probe: 12 + 30 = 42, \\boxed{42}. Ünïcödé ✓"


class TokenizerMismatchError(ValueError):
    """Teacher and student tokenize differently: the student's token ids mean other tokens to the teacher."""


class Teacher(Protocol):
    """Scores sequences: log p_teacher of each loss token of a batch, (N, T-1), zero elsewhere."""

    def logprobs(self, batch: TrainBatch) -> torch.Tensor: ...

    def check_tokenizer(self, student_tokenizer: Any) -> None: ...


@dataclass
class LocalTeacher:
    """A causal LM in this process, run without gradient in chunks of `micro_batch_size` sequences."""

    model: Any
    tokenizer: Any
    name: str
    micro_batch_size: int = 8

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        device = next(self.model.parameters()).device
        out_NT = torch.zeros_like(batch.loss_mask_NT)
        with torch.no_grad():
            for index in torch.arange(batch.num_sequences).split(self.micro_batch_size):
                micro = batch.select(index)
                out_NT[index, : micro.loss_mask_NT.shape[1]] = token_logprobs(self.model, micro.to(device), 1.0)[0].cpu()
        return out_NT

    def check_tokenizer(self, student_tokenizer: Any) -> None:
        check_same_tokenizer(student_tokenizer, self.tokenizer, self.name)


def check_same_tokenizer(student: Any, teacher: Any, teacher_name: str) -> None:
    """Refuse a teacher whose tokenizer differs from the student's: vocabulary size, token -> id map,
    and the ids of a probe string."""
    problems = []
    if len(student) != len(teacher):
        problems.append(f"vocabulary sizes {len(student)} (student) and {len(teacher)} (teacher)")
    elif student.get_vocab() != teacher.get_vocab():
        differing = sorted(set(student.get_vocab().items()) ^ set(teacher.get_vocab().items()))[:3]
        problems.append(f"token ids differ, e.g. {differing}")
    if student.encode(PROBE, add_special_tokens=False) != teacher.encode(PROBE, add_special_tokens=False):
        problems.append(f"the probe {PROBE!r} tokenizes differently")
    if problems:
        raise TokenizerMismatchError(
            f"the teacher {teacher_name!r} does not share the student's tokenizer ({'; '.join(problems)}): it would "
            "score other tokens than the student sampled. Use a teacher of the same model family and tokenizer "
            "(cross-tokenizer distillation is not supported)")


@dataclass
class ServedTeacher:
    """A model behind an OpenAI-compatible /v1/completions endpoint (`reasonrl serve`, vLLM): each
    sequence is sent as token ids with max_tokens=0, echo=true, logprobs=1, and the log-prob of every
    prompt token is read back (`logprobs.token_logprobs`, or vLLM's `prompt_logprobs`)."""

    url: str
    model: str = ""
    request_size: int = 16
    timeout_s: float = 300.0
    max_retries: int = 2  # a busy (429) or failing (5xx) server, or a dropped connection, is asked again

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        lengths = batch.attention_mask_NT.sum(1).tolist()
        sequences = [batch.input_ids_NT[n, :length].tolist() for n, length in enumerate(lengths)]
        out_NT = torch.zeros_like(batch.loss_mask_NT)
        for start in range(0, len(sequences), self.request_size):
            chunk = sequences[start : start + self.request_size]
            for n, (ids, scored) in enumerate(zip(chunk, self.score(chunk)), start=start):
                if len(scored) != len(ids):
                    raise ValueError(f"the teacher at {self.url} returned {len(scored)} log-probs for a prompt of "
                                     f"{len(ids)} tokens: it must echo the prompt's log-probs (echo=true, logprobs)")
                # Position t predicts token t + 1: the first token has no log-prob.
                out_NT[n, : len(ids) - 1] = torch.tensor([0.0 if v is None else v for v in scored[1:]])
        return out_NT * batch.loss_mask_NT

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float | None]]:
        """Each sequence's per-token log-probs (None for the first token), in order."""
        reply = self._post({"model": self.model, "prompt": [list(s) for s in sequences], "max_tokens": 0,
                            "echo": True, "logprobs": 1, "temperature": 1.0})
        choices = sorted(reply.get("choices", []), key=lambda choice: choice.get("index", 0))
        if len(choices) != len(sequences):
            raise ValueError(f"the teacher at {self.url} answered {len(choices)} choices for {len(sequences)} prompts")
        return [_prompt_logprobs(choice, self.url) for choice in choices]

    def tokens(self, ids: Sequence[int]) -> list[str]:
        """The teacher's text of each of `ids` (its tokenizer's pieces, as the server reports them)."""
        reply = self._post({"model": self.model, "prompt": [list(ids)], "max_tokens": 0, "echo": True, "logprobs": 1})
        return list(reply["choices"][0]["logprobs"]["tokens"])

    def check_tokenizer(self, student_tokenizer: Any) -> None:
        """The server decodes a probe's ids, and the last id of the student's vocabulary, as the student does."""
        ids = [*student_tokenizer.encode(PROBE, add_special_tokens=False), len(student_tokenizer) - 1]
        try:
            served = self.tokens(ids)
        except OpenAIServerError as exc:
            if exc.status is None:  # not reached: no answer about the ids
                raise
            raise TokenizerMismatchError(f"the teacher at {self.url} could not score the student's token ids "
                                         f"(a smaller or different vocabulary?): {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenizerMismatchError(f"the teacher at {self.url} could not score the student's token ids "
                                         f"(a smaller or different vocabulary?): {exc}") from exc
        student = [student_tokenizer.decode([i]) for i in ids]
        if served != student:
            differing = [(i, s, t) for i, s, t in zip(ids, student, served) if s != t][:3]
            raise TokenizerMismatchError(
                f"the teacher at {self.url} does not share the student's tokenizer: ids decode differently, e.g. "
                f"(id, student, teacher) {differing}. Serve a model with the student's tokenizer (cross-tokenizer "
                "distillation is not supported)")

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        return post_json(f"{self.url.rstrip('/')}/completions", body, timeout_s=self.timeout_s,
                         max_retries=self.max_retries, what="the teacher's prompt log-probs")


def _prompt_logprobs(choice: dict[str, Any], url: str) -> list[float | None]:
    if choice.get("prompt_logprobs") is not None:  # vLLM: [None, {token_id: {"logprob": ...}}, ...]
        return [None if entry is None else _sampled_logprob(entry) for entry in choice["prompt_logprobs"]]
    logprobs = choice.get("logprobs") or {}
    if "token_logprobs" not in logprobs:
        raise ValueError(f"the teacher at {url} returned no prompt log-probs; it must support echo=true with "
                         "logprobs and max_tokens=0 (reasonrl serve, vLLM)")
    return list(logprobs["token_logprobs"])


def _sampled_logprob(entry: dict[str, Any]) -> float:
    """vLLM lists the prompt token first among its top log-probs of a position."""
    first = next(iter(entry.values()))
    return float(first["logprob"] if isinstance(first, dict) else first)
