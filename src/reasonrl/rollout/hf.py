"""The rollout engine for a transformers causal LM (CPU or CUDA).

A hand-written decode loop rather than `model.generate`, because RL needs what `generate` does
not give cheaply: the log-probability of each sampled token under the tempered distribution,
each prompt prefilled once and its KV cache shared by the G samples of its group, and finished
sequences dropped from the batch. The forward pass is the FusedDecoder for Llama-family models
(see rollout/fused.py for why) and the model's own forward with a DynamicCache otherwise.
"""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from reasonrl.models import copy_weights
from reasonrl.rollout.base import PrefixContinuation, completion_text
from reasonrl.rollout.cuda_graph import CapturedDecode
from reasonrl.rollout.fused import FusedDecoder
from reasonrl.seeds import derive_seed, problem_seed
from reasonrl.types import Completion, SamplingParams


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


class HFEngine(PrefixContinuation):
    """RolloutEngine around a transformers causal LM it owns (a copy of the policy)."""

    def __init__(self, model: Any, tokenizer: Any, *, chat_template: bool = True, fused: bool = True,
                 cuda_graphs: bool = True):
        self.model = model.eval()
        self.fused = FusedDecoder(model) if fused and FusedDecoder.supports(model) else None
        self.cuda_graphs = cuda_graphs
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = _eos_token_ids(model, tokenizer)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights(self.model, named_tensors)
        if self.fused is not None:
            self.fused = FusedDecoder(self.model)

    @torch.inference_mode()
    def continue_from(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams,
                      seeds: Sequence[int] | None = None) -> list[list[Completion]]:
        """`sampling.n` continuations of each token-id prefix, taken as is (no re-tokenisation, no
        template): what a multi-turn rollout needs to continue an episode after inserting an
        observation's tokens. One list of n completions per prefix, in order.

        Each prefix is sampled with its own seed (default: derived from sampling.seed and its
        index), and each of its n rows draws from its own random stream, so a prefix's samples do
        not depend on what else is in the batch (up to float rounding of the batched forward)."""
        if not prefixes or any(len(prefix) == 0 for prefix in prefixes):
            raise ValueError("continue_from needs at least one prefix, and no empty prefix (nothing to continue)")
        if seeds is None:
            seeds = [problem_seed(sampling.seed, index) for index in range(len(prefixes))]
        elif len(seeds) != len(prefixes):
            raise ValueError(f"{len(seeds)} seeds for {len(prefixes)} prefixes")
        streams = None if sampling.greedy else [random.Random(derive_seed(seed, g)) for seed in seeds
                                                for g in range(sampling.n)]
        tokens, logprobs, finish = self._decode([list(prefix) for prefix in prefixes], sampling, streams)
        return [[Completion(token_ids=tuple(tokens[i]), text=self._text(tokens[i], sampling.stop),
                            logprobs=tuple(logprobs[i]), finish_reason=finish[i])
                 for i in range(b * sampling.n, (b + 1) * sampling.n)] for b in range(len(prefixes))]

    def _text(self, ids: list[int], stop: tuple[str, ...]) -> str:
        return completion_text(self.tokenizer, ids, stop)

    def _decode(self, prompts: list[list[int]], sampling: SamplingParams,
                streams: list[random.Random] | None) -> tuple[list[list[int]], list[list[float]], list[str]]:
        """Sample sampling.n continuations of every prompt; row b*n + g is sample g of prompt b.

        Rows live in cache slots. A finished row's slot keeps decoding (its tokens are ignored)
        until half of the slots are dead; then the live ones are compacted. Per-step
        compaction would copy the whole KV cache each time a row ends, while a dead slot costs
        little: GEMMs with few rows are bound by reading the weights, not by the row count."""
        n = sampling.n
        forward = self._forward_kind(prompts, sampling.max_new_tokens)
        logits_SV = forward.prefill(n)
        rows = len(prompts) * n
        slot_rows: list[int | None] = list(range(rows))
        tokens: list[list[int]] = [[] for _ in range(rows)]
        logprobs: list[list[float]] = [[] for _ in range(rows)]
        finish = ["length"] * rows
        stop_check = _StopChecker(self.tokenizer, sampling.stop)
        for step in range(sampling.max_new_tokens):
            uniform_S = None
            if streams is not None:  # a live row draws once per token; a dead slot's draw is never used
                uniform_S = torch.tensor([0.0 if row is None else streams[row].random() for row in slot_rows],
                                         dtype=torch.float64)
            next_S, logp_S = sample_next_tokens(logits_SV, sampling, uniform_S)
            for slot, (token, logp) in enumerate(zip(next_S.tolist(), logp_S.tolist())):
                row = slot_rows[slot]
                if row is None:
                    continue
                tokens[row].append(token)
                logprobs[row].append(logp)
                if (token in self.eos_ids and not sampling.ignore_eos) or stop_check.hit(tokens[row]):
                    finish[row] = "stop"
                    slot_rows[slot] = None
            live_slots = [slot for slot, row in enumerate(slot_rows) if row is not None]
            if step + 1 == sampling.max_new_tokens or not live_slots:
                break
            if len(live_slots) <= len(slot_rows) // 2:
                live_S = torch.tensor(live_slots, device=self.device)
                forward.select(live_S, columns_left=sampling.max_new_tokens - step - 1)
                next_S = next_S[live_S]
                slot_rows = [slot_rows[slot] for slot in live_slots]
            logits_SV = forward.step(next_S)
        return tokens, logprobs, finish

    def _forward_kind(self, prompts: list[list[int]], max_new_tokens: int) -> _FusedForward | _TransformersForward:
        width = max(len(p) for p in prompts)
        input_ids_BP = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        valid_BP = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=self.device)
        positions_BP = (valid_BP.cumsum(1) - 1).clamp(min=0)
        if self.fused is not None:
            captured = self.cuda_graphs and self.device.type == "cuda" and self.fused.window is None
            return _FusedForward(self.fused, input_ids_BP, valid_BP, positions_BP, max_new_tokens, captured)
        return _TransformersForward(self.model, input_ids_BP, valid_BP, positions_BP)


class _FusedForward:
    """Prefill and decode steps through the FusedDecoder and its in-place KV cache; with `captured`,
    the decode steps replay a CUDA graph (rollout/cuda_graph.py)."""

    def __init__(self, decoder: FusedDecoder, input_ids_BP: torch.Tensor, valid_BP: torch.Tensor,
                 positions_BP: torch.Tensor, max_new_tokens: int, captured: bool = False):
        self.decoder, self.input_ids_BP, self.valid_BP, self.positions_BP = decoder, input_ids_BP, valid_BP, positions_BP
        self.cache = decoder.new_cache(rows=input_ids_BP.shape[0], capacity=input_ids_BP.shape[1] + max_new_tokens)
        self.captured = CapturedDecode(decoder, self.cache) if captured else None

    def prefill(self, n: int) -> torch.Tensor:
        """Prefill once per prompt, then give each of the group's n samples a copy of its cache."""
        logits_BV = self.decoder.forward(self.input_ids_BP, self.positions_BP, self.valid_BP, self.cache)
        self.cache.select_rows(torch.arange(len(logits_BV), device=logits_BV.device).repeat_interleave(n),
                               capacity=self.cache.capacity)
        self.position_S = (self.positions_BP[:, -1] + 1).repeat_interleave(n)
        return logits_BV.repeat_interleave(n, dim=0)

    def select(self, slots_S: torch.Tensor, columns_left: int) -> None:
        self.cache.select_rows(slots_S, capacity=self.cache.length + columns_left)
        self.position_S = self.position_S[slots_S]

    def step(self, tokens_S: torch.Tensor) -> torch.Tensor:
        if self.captured is not None:
            logits_SV = self.captured.step(tokens_S, self.position_S)
        else:
            valid_S1 = torch.ones(len(tokens_S), 1, dtype=torch.bool, device=tokens_S.device)
            logits_SV = self.decoder.forward(tokens_S[:, None], self.position_S[:, None], valid_S1, self.cache)
        self.position_S = self.position_S + 1
        return logits_SV


class _TransformersForward:
    """The same steps through the model's own forward and a transformers DynamicCache, for
    architectures the FusedDecoder does not cover."""

    def __init__(self, model: Any, input_ids_BP: torch.Tensor, valid_BP: torch.Tensor, positions_BP: torch.Tensor):
        self.model, self.input_ids_BP, self.positions_BP = model, input_ids_BP, positions_BP
        self.attention_BP = valid_BP.long()
        self.cache = DynamicCache(config=model.config)
        self.cache_keyword = _cache_keyword(type(model))

    def prefill(self, n: int) -> torch.Tensor:
        out = self.model(input_ids=self.input_ids_BP, attention_mask=self.attention_BP,
                         position_ids=self.positions_BP, use_cache=True, logits_to_keep=1,
                         **{self.cache_keyword: self.cache})
        self.cache.batch_repeat_interleave(n)
        self.attention_SP = self.attention_BP.repeat_interleave(n, dim=0)
        self.position_S = (self.positions_BP[:, -1] + 1).repeat_interleave(n)
        return out.logits[:, -1].repeat_interleave(n, dim=0)

    def select(self, slots_S: torch.Tensor, columns_left: int) -> None:
        self.cache.batch_select_indices(slots_S)
        self.attention_SP, self.position_S = self.attention_SP[slots_S], self.position_S[slots_S]

    def step(self, tokens_S: torch.Tensor) -> torch.Tensor:
        self.attention_SP = torch.cat([self.attention_SP, self.attention_SP.new_ones(len(tokens_S), 1)], dim=1)
        out = self.model(input_ids=tokens_S[:, None], attention_mask=self.attention_SP,
                         position_ids=self.position_S[:, None], use_cache=True, **{self.cache_keyword: self.cache})
        self.position_S = self.position_S + 1
        return out.logits[:, -1]


@functools.cache
def _cache_keyword(model_type: type) -> str:
    """The forward's cache argument: `cache` in newer transformers 5 releases, where
    `past_key_values` is deprecated; `past_key_values` in older ones (5.17)."""
    return "cache" if "cache" in inspect.signature(model_type.forward).parameters else "past_key_values"


class _StopChecker:
    """Whether a completion's decoded tail contains a stop string (decoding only the tail)."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...]):
        self.tokenizer, self.stop = tokenizer, stop
        self.tail_tokens = max((len(s) for s in stop), default=0) + 2

    def hit(self, ids: list[int]) -> bool:
        if not self.stop:
            return False
        tail = self.tokenizer.decode(ids[-self.tail_tokens:], skip_special_tokens=True)
        return any(s in tail for s in self.stop)


def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(generation_eos)
    return frozenset(ids)
