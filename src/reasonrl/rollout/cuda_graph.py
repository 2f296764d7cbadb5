"""Decode steps replayed as CUDA graphs: the FusedDecoder's step launched as one graph instead of
some two thousand kernels.

Why: on a GPU a small model's decode step is bound by launching kernels, not by the GPU's work
(SmolLM2-135M on an H200: 17 ms per step at batch 8 with either this engine's eager decoder or
`model.generate`, in gpu.json). vLLM and SGLang capture their decode step for the same reason.
Why by hand: torch.compile's "reduce-overhead" mode captures too, but recompiles for every cache
length and row count, and its first compile costs more than a short rollout.

How: `FusedDecoder.decode_in_place` is the decode step with static shapes (the token's cache
column is a device tensor, attention reads the cache's whole capacity with the unwritten columns
masked). One graph is captured per cache (its rows and capacity) and replayed for every step;
compacting finished rows or growing the cache makes new tensors, and the next step captures again.
Each replay writes the same numbers the eager step would. StaticDecode is that eager step, on any
device: what a graph replays, and what the CPU tests run in the graph's place.

Both serve a fixed set of rows (the engine's sync path) and the continuous batch, whose admissions,
compactions and column shifts reallocate the cache: the next step then captures again.
"""

from __future__ import annotations

import time

import torch

from reasonrl.rollout.fused import FusedDecoder, KVCache


class StaticDecode:
    """`step(tokens_N, positions_N)`: the logits of one decode step of every cache row through
    `decode_in_place`, launched eagerly, appending one column to the cache (grown first when full)."""

    captures = 0  # graphs captured, and the seconds that took (CapturedDecode): none here
    capture_s = 0.0

    def __init__(self, decoder: FusedDecoder, cache: KVCache):
        self.decoder, self.cache = decoder, cache

    def step(self, tokens_N: torch.Tensor, positions_N: torch.Tensor) -> torch.Tensor:
        self.cache.reserve(self.cache.length + 1)
        column_1 = torch.tensor([self.cache.length], device=self.decoder.device)
        logits_NV = self.decoder.decode_in_place(tokens_N[:, None], positions_N[:, None], column_1, self.cache)
        self.cache.length += 1
        return logits_NV


class CapturedDecode(StaticDecode):
    """The same step from a CUDA graph captured on the first step (and again whenever the cache's
    tensors change). The logits returned are the graph's output buffer, overwritten by the next step."""

    def __init__(self, decoder: FusedDecoder, cache: KVCache):
        super().__init__(decoder, cache)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.captured_for: tuple[int, ...] = ()

    def step(self, tokens_N: torch.Tensor, positions_N: torch.Tensor) -> torch.Tensor:
        self.cache.reserve(self.cache.length + 1)  # growing makes new tensors: captured again below
        if self._cache_key() != self.captured_for:
            # Timed because a capture synchronizes the whole device (torch.cuda.graph): with asynchronous
            # RL it waits for the learner's queued work, a cost the continuous batch pays per reallocation.
            start = time.perf_counter()
            self._capture(len(tokens_N))
            self.captures, self.capture_s = self.captures + 1, self.capture_s + time.perf_counter() - start
        self.tokens_N1.copy_(tokens_N[:, None])
        self.positions_N1.copy_(positions_N[:, None])
        self.column_1.fill_(self.cache.length)
        self.graph.replay()
        self.cache.length += 1
        return self.logits_NV

    def _cache_key(self) -> tuple[int, ...]:
        return (self.cache.keys_LNKSD.data_ptr(), self.cache.values_LNKSD.data_ptr(), self.cache.valid_NS.data_ptr(),
                *self.cache.keys_LNKSD.shape)

    def _capture(self, rows: int) -> None:
        self.graph = None  # the old graph's memory pool goes before the new one is taken
        device = self.decoder.device
        self.tokens_N1 = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions_N1 = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.column_1 = torch.full((1,), self.cache.length, dtype=torch.long, device=device)
        # Warm-up on a side stream (cuBLAS picks its kernels and workspaces outside the capture). It
        # writes a placeholder token's keys and values at the cache's next column, which the first
        # replay overwrites; no earlier column changes.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.decoder.decode_in_place(self.tokens_N1, self.positions_N1, self.column_1, self.cache)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the learner may be on the GPU in another thread meanwhile (asynchronous RL,
        # the sync check); the default mode would fail its CUDA calls while this thread captures.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.logits_NV = self.decoder.decode_in_place(self.tokens_N1, self.positions_N1, self.column_1, self.cache)
        self.graph, self.captured_for = graph, self._cache_key()
