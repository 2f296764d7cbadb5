"""Each row's next token, and when a row is done: what every decode loop of the transformers engine
shares (the plain one in rollout/hf.py and the continuous batch in rollout/continuous.py).

A row (`DecodeRow`) is one sample being generated: its prompt, the tokens and log-probs generated so
far, the policy version that sampled each token, and its own random stream, so that what a row
draws does not depend on which other rows share its batch, or on whether it was paused on the way.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl.types import SamplingParams


def sample_next_tokens(logits_NV: torch.Tensor, sampling: SamplingParams,
                       uniform_N: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-probability under logits / temperature (untruncated);
    `uniform_N` holds each row's uniform draw in [0, 1) (unused when greedy).

    top-k / top-p only restrict which tokens can be drawn; the reported log-prob is the one the
    learner recomputes from the same logits and temperature. Drawing inverts the CDF with one
    uniform number per row: a third of the vocabulary-wide passes of the Gumbel-max trick or
    `multinomial`, which matters because with a 49k vocabulary and a 135M model sampling
    otherwise costs as much as the forward pass.
    """
    scaled_NV = logits_NV.float()
    if sampling.greedy:
        tokens_N = scaled_NV.argmax(dim=-1)
        return tokens_N, _logprob_of(scaled_NV, tokens_N)
    scaled_NV = scaled_NV.div_(sampling.temperature)
    candidates_NV = scaled_NV
    if 0 < sampling.top_k < scaled_NV.shape[-1]:
        kth_N1 = torch.topk(scaled_NV, sampling.top_k, dim=-1).values[:, -1:]
        candidates_NV = candidates_NV.masked_fill(candidates_NV < kth_N1, float("-inf"))
    if sampling.top_p < 1.0:
        candidates_NV = _nucleus(candidates_NV, sampling.top_p)
    cdf_NV = torch.softmax(candidates_NV, dim=-1).cumsum_(dim=-1)
    uniform_N1 = uniform_N.to(cdf_NV)[:, None] * cdf_NV[:, -1:]
    # side="right" never lands on a zero-probability token (its CDF equals its predecessor's).
    tokens_N = torch.searchsorted(cdf_NV, uniform_N1, side="right").squeeze(1).clamp_(max=cdf_NV.shape[-1] - 1)
    return tokens_N, _logprob_of(scaled_NV, tokens_N)


def _logprob_of(scaled_NV: torch.Tensor, tokens_N: torch.Tensor) -> torch.Tensor:
    return (scaled_NV.gather(1, tokens_N[:, None]) - torch.logsumexp(scaled_NV, dim=-1, keepdim=True)).squeeze(1)


def _nucleus(logits_NV: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    sorted_NV, order_NV = torch.sort(logits_NV, dim=-1, descending=True)
    probs_NV = torch.softmax(sorted_NV, dim=-1)
    mass_before_NV = probs_NV.cumsum(dim=-1) - probs_NV
    sorted_NV = sorted_NV.masked_fill(mass_before_NV > top_p, float("-inf"))
    return logits_NV.scatter(1, order_NV, sorted_NV)


class StopChecker:
    """Whether a completion's decoded tail contains a stop string (decoding only the tail)."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]):
        self.tokenizer, self.stop = tokenizer, stop
        self.tail_tokens = max((len(s) for s in stop), default=0) + 2

    def hit(self, ids: list[int]) -> bool:
        if not self.stop:
            return False
        tail = self.tokenizer.decode(ids[-self.tail_tokens:], skip_special_tokens=True)
        return any(s in tail for s in self.stop)


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a completion: the tokenizer's end-of-sequence and the generation config's."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return frozenset(ids)


@dataclass(eq=False)
class DecodeRow:
    """One sample being generated. `tokens` may hold what an earlier call generated (a paused
    partial rollout): the row then continues after them, its prefix being `prompt + tokens`."""

    prompt: tuple[int, ...]
    stream: random.Random | None  # None: greedy
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version that sampled each token
    finish: str | None = None  # "stop" or "length" once done

    @property
    def prefix(self) -> list[int]:
        return [*self.prompt, *self.tokens]


@dataclass(frozen=True)
class RowEnds:
    """When a row is done: an end-of-sequence id (unless ignored), a stop string, or its budget."""

    eos_ids: frozenset[int]
    stop: StopChecker
    sampling: SamplingParams

    def finish_of(self, row: DecodeRow) -> str | None:
        token = row.tokens[-1]
        if (token in self.eos_ids and not self.sampling.ignore_eos) or self.stop.hit(row.tokens):
            return "stop"
        return "length" if len(row.tokens) >= self.sampling.max_new_tokens else None


def advance(slot_rows: list[DecodeRow | None], logits_SV: torch.Tensor, ends: RowEnds, version: int = 0,
            ) -> torch.Tensor:
    """Sample every slot's next token from its logits, append it to the slot's row (None: an empty
    slot, whose token is drawn but unused), and empty the slots whose rows finished. The tokens."""
    uniform_S = None
    if not ends.sampling.greedy:  # a live row draws once per token; an empty slot's draw is never used
        uniform_S = torch.tensor([0.0 if row is None else row.stream.random() for row in slot_rows],
                                 dtype=torch.float64)
    next_S, logp_S = sample_next_tokens(logits_SV, ends.sampling, uniform_S)
    for slot, (token, logp) in enumerate(zip(next_S.tolist(), logp_S.tolist())):
        row = slot_rows[slot]
        if row is None:
            continue
        row.tokens.append(token)
        row.logprobs.append(logp)
        row.versions.append(version)
        if finish := ends.finish_of(row):
            row.finish, slot_rows[slot] = finish, None
    return next_S


def live_slots(slot_rows: Sequence[DecodeRow | None]) -> list[int]:
    return [slot for slot, row in enumerate(slot_rows) if row is not None]
