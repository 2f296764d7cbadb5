"""The rollout engine for a transformers causal LM (CPU or CUDA).

A hand-written decode loop rather than `model.generate`, because RL needs what `generate` does
not give cheaply: the log-probability of each sampled token under the tempered distribution,
each prompt prefilled once and its KV cache shared by the G samples of its group, and finished
sequences dropped from the batch. The forward pass is the FusedDecoder for Llama-family models
(see rollout/fused.py for why), its rows held in a continuous batch (rollout/continuous.py), and the
model's own forward with a DynamicCache otherwise. Drawing each row's next token and telling when a
row is done are shared by both (rollout/next_token.py).
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
from reasonrl.rollout.continuous import BatchStats, ContinuousBatch, left_padded
from reasonrl.rollout.cuda_graph import CapturedDecode
from reasonrl.rollout.fused import FusedDecoder
from reasonrl.rollout.next_token import DecodeRow, RowEnds, StopChecker, advance, eos_token_ids, live_slots
from reasonrl.seeds import derive_seed, problem_seed
from reasonrl.types import Completion, SamplingParams


class HFEngine(PrefixContinuation):
    """RolloutEngine around a transformers causal LM it owns (a copy of the policy)."""

    def __init__(self, model: Any, tokenizer: Any, *, chat_template: bool = True, fused: bool = True,
                 cuda_graphs: bool = True, max_rows: int = 0):
        self.model = model.eval()
        self.fused = FusedDecoder(model) if fused and FusedDecoder.supports(model) else None
        self.cuda_graphs, self.max_rows = cuda_graphs, max_rows
        self.batch_stats: BatchStats | None = None  # of the last continuous batch
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.device = next(model.parameters()).device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = eos_token_ids(model, tokenizer)

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
        rows = self.rows_for(prefixes, sampling, seeds)
        self.decode(rows, sampling)
        return [[self.completion(row, sampling) for row in rows[b * sampling.n:(b + 1) * sampling.n]]
                for b in range(len(prefixes))]

    def rows_for(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams,
                 seeds: Sequence[int] | None = None) -> list[DecodeRow]:
        """`sampling.n` rows per prefix (row b*n + g is sample g of prefix b), each with its random stream."""
        if not prefixes or any(len(prefix) == 0 for prefix in prefixes):
            raise ValueError("continue_from needs at least one prefix, and no empty prefix (nothing to continue)")
        if seeds is None:
            seeds = [problem_seed(sampling.seed, index) for index in range(len(prefixes))]
        elif len(seeds) != len(prefixes):
            raise ValueError(f"{len(seeds)} seeds for {len(prefixes)} prefixes")
        return [DecodeRow(prompt=tuple(prefix), stream=None if sampling.greedy else random.Random(derive_seed(seed, g)))
                for prefix, seed in zip(prefixes, seeds) for g in range(sampling.n)]

    def completion(self, row: DecodeRow, sampling: SamplingParams) -> Completion:
        return Completion(token_ids=tuple(row.tokens), text=completion_text(self.tokenizer, row.tokens, sampling.stop),
                          logprobs=tuple(row.logprobs), finish_reason=row.finish or "length")

    def ends(self, sampling: SamplingParams) -> RowEnds:
        return RowEnds(self.eos_ids, StopChecker(self.tokenizer, sampling.stop), sampling)

    def decode(self, rows: list[DecodeRow], sampling: SamplingParams) -> None:
        """Generate every row to its end: through a continuous batch of the fused decoder when there is
        one (rollout/continuous.py; bounded by `max_rows` slots), else all rows at once."""
        if self.fused is not None and not self._captured():
            batch = ContinuousBatch(self.fused, self.ends(sampling), max_rows=self.max_rows,
                                    steps=self.continuous_steps())
            batch.run(rows)
            self.batch_stats = batch.stats
        else:
            self._decode_at_once(rows, sampling)

    def continuous_steps(self) -> type[CapturedDecode] | None:
        """How a continuous batch's decode steps run: replayed as CUDA graphs where the fused decoder
        can be captured (CUDA, `cuda_graphs`, no sliding window), else through its forward."""
        if self.cuda_graphs and self.device.type == "cuda" and self.fused is not None and self.fused.window is None:
            return CapturedDecode
        return None

    def _captured(self) -> bool:
        """Whether all rows decode at once with captured steps (no row limit): a fixed set of rows, one
        prefill, compaction at half, and no admissions to schedule."""
        return self.continuous_steps() is not None and not self.max_rows

    def _decode_at_once(self, rows: list[DecodeRow], sampling: SamplingParams) -> None:
        """Every row of the batch in its own cache slot from the start (rows of a prompt consecutive,
        `sampling.n` each). A finished row's slot keeps decoding (its tokens are ignored)
        until half of the slots are dead; then the live ones are compacted. Per-step
        compaction would copy the whole KV cache each time a row ends, while a dead slot costs
        little: GEMMs with few rows are bound by reading the weights, not by the row count."""
        forward = self._forward_kind([list(row.prompt) for row in rows[::sampling.n]], sampling.max_new_tokens)
        logits_SV = forward.prefill(sampling.n)
        slot_rows: list[DecodeRow | None] = list(rows)
        ends = self.ends(sampling)
        while True:
            next_S = advance(slot_rows, logits_SV, ends)
            live = live_slots(slot_rows)
            if not live:
                return
            if len(live) <= len(slot_rows) // 2:
                live_S = torch.tensor(live, device=self.device)
                forward.select(live_S, columns_left=max(sampling.max_new_tokens - len(slot_rows[s].tokens)
                                                        for s in live))
                next_S = next_S[live_S]
                slot_rows = [slot_rows[slot] for slot in live]
            logits_SV = forward.step(next_S)

    def _forward_kind(self, prompts: list[list[int]], max_new_tokens: int) -> _CapturedForward | _TransformersForward:
        input_ids_BP, valid_BP, positions_BP = left_padded(prompts, self.pad_id, self.device)
        if self.fused is not None:  # only when captured: `decode` gives the others to the continuous batch
            return _CapturedForward(self.fused, input_ids_BP, valid_BP, positions_BP, max_new_tokens)
        return _TransformersForward(self.model, input_ids_BP, valid_BP, positions_BP)


class _CapturedForward:
    """Prefill and decode steps through the FusedDecoder and its in-place KV cache, the decode steps
    replayed as a CUDA graph (rollout/cuda_graph.py): a fixed set of rows, all admitted at once (the
    fused decoder's other path is the continuous batch)."""

    def __init__(self, decoder: FusedDecoder, input_ids_BP: torch.Tensor, valid_BP: torch.Tensor,
                 positions_BP: torch.Tensor, max_new_tokens: int):
        self.decoder, self.input_ids_BP, self.valid_BP, self.positions_BP = decoder, input_ids_BP, valid_BP, positions_BP
        self.cache = decoder.new_cache(rows=input_ids_BP.shape[0], capacity=input_ids_BP.shape[1] + max_new_tokens)
        self.captured = CapturedDecode(decoder, self.cache)

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
        logits_SV = self.captured.step(tokens_S, self.position_S)
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
