"""A continuous batch: rows decoded through the FusedDecoder in a bounded number of cache slots, a
finished row's slot refilled by a waiting row, so the batch stays full while rows of very different
lengths come and go (as vLLM and SGLang schedule their decode batches).

How it fits the fused decoder's cache, whose rows share one column per step: a waiting row's prefix
(its prompt, and for a resumed partial rollout what it had generated) is prefilled on its own
(identical prefixes, a group's samples, once), then copied into free slots so that it ends at the
cache's current column, left-padded like any prompt; its position ids are its own. When a prefix is
longer than the columns filled so far, the cache moves right to make room; when the capacity runs
out, the leading columns no live row reads any more are dropped before the cache grows. Without a
row limit every row is admitted at once and the batch is the plain engine's: one prefill per
prompt, finished rows dropped once half the slots are dead.

Exactness is the engine's: a row's computation reads only its own valid columns and draws from its
own random stream, so what it samples does not depend on which rows share its batch, up to the float
rounding of batched products. A decode step is the fused forward with attention by runs of rows, or,
with `steps` (rollout/cuda_graph.py), the static-shape step a CUDA graph replays: one launch per step
on a GPU, where a small model's step is bound by launching kernels; a change of the cache's rows or
capacity captures again. A paused row (partial rollouts, reasonrl.rollout.partial) keeps its
tokens but not its cache; it is prefilled again when it resumes, under the weights of that moment.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from reasonrl.rollout.cuda_graph import StaticDecode
from reasonrl.rollout.fused import FusedDecoder
from reasonrl.rollout.next_token import DecodeRow, RowEnds, advance, live_slots


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-id prompts left-padded to the longest: their ids, which positions are real, and each real
    token's position id (0 on the padding)."""
    width = max(map(len, prompts))
    ids_BP = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    valid_BP = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=device)
    return ids_BP, valid_BP, (valid_BP.cumsum(1) - 1).clamp(min=0)


@dataclass
class BatchStats:
    """What a continuous batch did: decode steps, slot-steps of live and of empty slots, prefills, and
    the CUDA graphs its steps captured (with the seconds spent capturing)."""

    steps: int = 0
    live_slot_steps: int = 0
    idle_slot_steps: int = 0
    prefills: int = 0
    prefill_tokens: int = 0
    graph_captures: int = 0
    graph_capture_s: float = 0.0

    @property
    def idle_frac(self) -> float:
        """The share of decoded slot-steps that held no live row."""
        total = self.live_slot_steps + self.idle_slot_steps
        return self.idle_slot_steps / total if total else 0.0


class ContinuousBatch:
    """Decodes rows through `decoder` in at most `max_rows` slots (0: as many as there are rows),
    tagging each sampled token with `version`; its decode steps through `steps` (CapturedDecode,
    StaticDecode) when given, else through the decoder's forward."""

    def __init__(self, decoder: FusedDecoder, ends: RowEnds, *, max_rows: int = 0, version: int = 0,
                 steps: type[StaticDecode] | None = None):
        if max_rows < 0:
            raise ValueError(f"max_rows={max_rows} must be >= 0 (0: no limit)")
        self.decoder, self.ends, self.max_rows, self.version = decoder, ends, max_rows, version
        self.cache = decoder.new_cache(rows=0, capacity=0)
        self.static = steps(decoder, self.cache) if steps is not None else None  # the cache object is kept
        self.slot_rows: list[DecodeRow | None] = []
        self.start_S: list[int] = []  # each slot's first valid column
        self.position_S = torch.zeros(0, dtype=torch.long, device=decoder.device)
        self.logits_SV: torch.Tensor | None = None
        self.stats = BatchStats()

    def run(self, rows: Sequence[DecodeRow], enough: Callable[[], bool] = lambda: False) -> None:
        """Decode `rows` until each has finished, or until `enough()` (asked after every token) says to
        stop: the unfinished rows then keep what they generated, to be resumed by a later run."""
        try:
            self._decode(rows, enough)
        finally:
            if self.static is not None:
                self.stats.graph_captures, self.stats.graph_capture_s = self.static.captures, self.static.capture_s

    def _decode(self, rows: Sequence[DecodeRow], enough: Callable[[], bool]) -> None:
        budget = self.ends.sampling.max_new_tokens
        for row in rows:  # a resumed row whose budget shrank meanwhile (a curriculum stage) is done
            if row.finish is None and len(row.tokens) >= budget:
                row.finish = "length"
        waiting = deque(row for row in rows if row.finish is None)
        while True:
            if waiting and self._should_admit(len(waiting)):
                self._admit([waiting.popleft() for _ in range(min(self._free_slots(), len(waiting)))])
            if not live_slots(self.slot_rows):
                return
            next_S = advance(self.slot_rows, self.logits_SV, self.ends, self.version)
            if enough():
                return
            live = live_slots(self.slot_rows)
            if not live:
                continue  # every slot is free: the waiting rows come in, or the run is over
            if not waiting and len(live) <= len(self.slot_rows) // 2:
                next_S = self._compact(live, next_S)
            self._decode_step(next_S, len(live))

    def _free_slots(self) -> int:
        free = sum(row is None for row in self.slot_rows)
        return free + (self.max_rows - len(self.slot_rows) if self.max_rows else 1 << 30)

    def _should_admit(self, waiting: int) -> bool:
        """Admit when all that wait fit, when nothing is decoding, or when a quarter of the slots are
        free: a prefill of several prompts costs about what one costs on weight-bound hardware."""
        free = self._free_slots()
        if free <= 0:
            return False
        return free >= waiting or not live_slots(self.slot_rows) or free >= max(1, self.max_rows // 4)

    def _admit(self, rows: list[DecodeRow]) -> None:
        # Longest prefix first: slots added at the end then start at ascending columns, so that runs of
        # neighbouring rows read few columns before their own (fused.row_chunks).
        rows = sorted(rows, key=lambda row: -len(row.prefix))
        prefixes = [row.prefix for row in rows]
        unique: dict[tuple[int, ...], int] = {}
        index_K = torch.tensor([unique.setdefault(tuple(p), len(unique)) for p in prefixes], device=self.decoder.device)
        device = self.decoder.device
        ids_UP, valid_UP, positions_UP = left_padded(list(unique), 0, device)
        width = ids_UP.shape[1]
        source = self.decoder.new_cache(rows=len(unique), capacity=width)
        logits_UV = self.decoder.forward(ids_UP, positions_UP, valid_UP, source)
        self.stats.prefills += 1
        self.stats.prefill_tokens += sum(map(len, unique))
        if self.cache.length < width:
            shift = width - self.cache.length
            self.cache.shift(shift)
            self.start_S = [start + shift for start in self.start_S]
        slots = self._slots_for(len(rows), logits_UV)
        slots_K = torch.tensor(slots, device=device)
        self.cache.place(slots_K, source, index_K)
        for slot, row, prefix in zip(slots, rows, prefixes):
            self.slot_rows[slot], self.start_S[slot] = row, self.cache.length - len(prefix)
        self.position_S[slots_K] = torch.tensor([len(p) for p in prefixes], device=device)
        self.logits_SV[slots_K] = logits_UV[index_K].to(self.logits_SV.dtype)
        budget = self.ends.sampling.max_new_tokens
        self.cache.reserve(self.cache.length + max(budget - len(row.tokens) for row in rows))

    def _slots_for(self, count: int, logits_UV: torch.Tensor) -> list[int]:
        """`count` free slots: the emptied ones first, then new ones."""
        slots = [slot for slot, row in enumerate(self.slot_rows) if row is None][:count]
        added = count - len(slots)
        if added:
            first = len(self.slot_rows)
            self.cache.add_rows(added)
            self.slot_rows += [None] * added
            self.start_S += [self.cache.length] * added
            self.position_S = torch.cat([self.position_S, self.position_S.new_zeros(added)])
            old = self.logits_SV if self.logits_SV is not None else logits_UV.new_zeros(0, logits_UV.shape[1])
            self.logits_SV = torch.cat([old, old.new_zeros(added, old.shape[1])])
            slots += range(first, first + added)
        return slots

    def _compact(self, live: list[int], next_S: torch.Tensor) -> torch.Tensor:
        """Keep the live slots only (copying the cache), in the order of their first column (see
        `_admit`): once half are dead, and nothing waits."""
        live = sorted(live, key=lambda slot: self.start_S[slot])
        live_S = torch.tensor(live, device=self.decoder.device)
        budget = self.ends.sampling.max_new_tokens
        left = max(budget - len(self.slot_rows[slot].tokens) for slot in live)
        self.cache.select_rows(live_S, capacity=max(self.cache.length + left, 1))
        self.slot_rows = [self.slot_rows[slot] for slot in live]
        self.start_S = [self.start_S[slot] for slot in live]
        self.position_S = self.position_S[live_S]
        return next_S[live_S.to(next_S.device)]

    def _decode_step(self, next_S: torch.Tensor, live: int) -> None:
        if self.cache.length + 1 > self.cache.capacity:
            self._drop_leading_columns()
        if self.static is not None:
            self.logits_SV = self.static.step(next_S, self.position_S)
        else:
            valid_S1 = torch.ones(len(next_S), 1, dtype=torch.bool, device=next_S.device)
            # An empty slot's (unused) output needs only the column it writes: it does not widen its run.
            starts = [start if row is not None else self.cache.length
                      for start, row in zip(self.start_S, self.slot_rows)]
            self.logits_SV = self.decoder.forward(next_S[:, None], self.position_S[:, None], valid_S1, self.cache,
                                                  row_starts=starts)
        self.position_S = self.position_S + 1
        self.stats.steps += 1
        self.stats.live_slot_steps += live
        self.stats.idle_slot_steps += len(next_S) - live

    def _drop_leading_columns(self) -> None:
        """Before the cache grows, drop the columns before every live row's first one, if they are
        a quarter of it or more (rows admitted late leave the early columns to the finished ones)."""
        first = min(self.start_S[slot] for slot in live_slots(self.slot_rows))
        if first >= max(1, self.cache.capacity // 4):
            self.cache.shift(-first)
            self.start_S = [max(0, start - first) for start in self.start_S]
