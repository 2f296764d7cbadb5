"""How the learner's batch is laid out for the forward and backward: cut into micro-batches, and
on the CPU packed without padding.

Micro-batches (`micro_batches`): sequences of similar length together, the cuts chosen to compute
the fewest padded positions (plus a fixed cost per micro-batch); packed, the samples of a prompt
together. `attention_for` switches a model's attention for the duration of one micro-batch: to the
packed attention below, or to matmul attention where that beats the CPU's fused kernel.

Padding-free packing: a micro-batch's sequences laid end to end in one row for the learner's
forward and backward, attention kept within each sequence.

Why by hand: transformers recognises packed sequences from restarting position ids, but on the
CPU its eager and sdpa attention then score every query of the row against every key and mask
the other sequences out (work quadratic in the whole row), and its per-sequence ("varlen") path
is flash-attention, which needs CUDA. Here an attention function registered with transformers
scores each sequence against itself only, sequences of similar length batched together (padded
within their bucket), so the decoder's linear layers see one row of real tokens only (no
padding) while attention costs about what it costs per sequence. A long sequence runs alone
through PyTorch's scaled_dot_product_attention, whose CPU kernel never holds the whole score
matrix: the buckets' softmax, kept for the backward pass, would grow with the square of its length
(a 4096-token sequence: 1.3 GB per layer at SmolLM2-135M's 9 heads, against 0.1 GB).

Used on the CPU for the decoder families the rollout engine's fused decoder knows (their
attention passes the extra keyword arguments through), without a sliding window; `attention_for`
switches a model to it for the duration of a micro-batch.

A causal model's hidden states of a prefix do not depend on what follows it, so the row holds every
token prefix that sequences of the micro-batch share once: a group's prompt, and with tree rollouts
the generated tokens its completions share at several depths (reasonrl.training.prefix_tree). The
row is a list of segments, each a run of tokens shared by the same sequences or a sequence's
unshared remainder; a segment attends to the keys of all its ancestors (the chain of segments from
the root) and causally to its own, its position ids continuing its parent's. The log-probs and
gradients are those of the separate sequences (a shared token's activations receive the sum of its
sequences' gradients; the logits at a segment's last position predict each sequence's own next
token, as the learner gathers targets per (n, t)), while a group of G samples costs one prompt
instead of G. With 8 samples of 40 tokens after a 55-token prompt that is 375 positions instead of
760; 8 leaves of a binary tree of 32-token segments after the same prompt, 55 + 14 x 32 = 503
instead of 8 x (55 + 96) = 1208. Every shared run is shared, however short (the prefix tree's
module says why, and what becomes of a sequence that is a prefix of another).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from reasonrl.training.prefix_tree import ROOT, Segment, aligned_tokens, prefix_tree, shared_lengths
from reasonrl.types import TrainBatch

VARLEN = "reasonrl_varlen"
PACKABLE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def varlen_attention(module: Any, query_BHLD: torch.Tensor, key_BKLD: torch.Tensor, value_BKLD: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     cu_seq_lens_q: torch.Tensor | None = None, packed_row: PackedRow | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each segment of a packed row, a segment that continues shared
    prefixes also attending to all of their tokens (its ancestors'). The layout comes from
    `packed_row`, or for separate sequences from `cu_seq_lens_q`, their boundaries ([0, end of
    the first, ..., L]). Output [B, L, H, D], as transformers expects.

    Segments of similar length run together as one padded batch (an `AttentionPlan` bucket): a
    few large batched matmuls per layer instead of a few small ones per segment, whose fixed
    costs dominated on the CPU."""
    B, H, L, D = query_BHLD.shape
    K = key_BKLD.shape[1]
    if B != 1 or H % K:
        raise ValueError(f"the {VARLEN} attention takes one packed row (batch 1, got {B}) and a whole number of "
                         f"query heads per key head (got {H} over {K})")
    if packed_row is not None:
        plan = packed_row.attention_plan(H, K, query_BHLD.device)
    elif cu_seq_lens_q is not None:
        plan = AttentionPlan.of(cu_seq_lens_q, ((),) * (len(cu_seq_lens_q) - 1), H, K, query_BHLD.device)
    else:
        raise ValueError(f"the {VARLEN} attention needs the packed row's layout (packed_row or cu_seq_lens_q)")
    if dropout and module.training:
        raise ValueError(f"the {VARLEN} attention has no attention dropout; set the model's attention_dropout to 0")
    scale = scaling if scaling is not None else D ** -0.5
    # Rows of D values, one per (position, head): the projections' own memory order, so the
    # transposes below are views. Under autocast the rotated query and key arrive in float32.
    dtype = value_BKLD.dtype
    query_rows = query_BHLD[0].transpose(0, 1).to(dtype).reshape(L * H, D)
    key_rows = key_BKLD[0].transpose(0, 1).to(dtype).reshape(L * K, D)
    value_rows = value_BKLD[0].transpose(0, 1).reshape(L * K, D)
    outputs = []
    query_LHD, key_LKD, value_LKD = query_rows.view(L, H, D), key_rows.view(L, K, D), value_rows.view(L, K, D)
    for segment in plan.long_segments:
        own = slice(segment.start, segment.start + segment.size)
        keys_mKD, values_mKD = key_LKD[own], value_LKD[own]
        if segment.prefix_keys is not None:
            keys_mKD = torch.cat([key_LKD.index_select(0, segment.prefix_keys), keys_mKD])
            values_mKD = torch.cat([value_LKD.index_select(0, segment.prefix_keys), values_mKD])
        attended_BHnD = F.scaled_dot_product_attention(
            query_LHD[own].transpose(0, 1)[None], keys_mKD.transpose(0, 1)[None], values_mKD.transpose(0, 1)[None],
            attn_mask=segment.sees_nm, is_causal=segment.sees_nm is None, scale=scale, enable_gqa=True)
        outputs.append(attended_BHnD[0].transpose(0, 1).reshape(-1, D))
    for bucket in plan.buckets:
        query_bnD = query_rows.index_select(0, bucket.query_rows).view(bucket.batch, -1, D)
        key_bmD = key_rows.index_select(0, bucket.key_rows).view(bucket.batch, -1, D)
        value_bmD = value_rows.index_select(0, bucket.key_rows).view(bucket.batch, -1, D)
        scores_bnm = torch.baddbmm(bucket.mask(dtype), query_bnD, key_bmD.transpose(1, 2), alpha=scale)
        outputs.append(torch.bmm(scores_bnm.softmax(dim=-1), value_bmD).view(-1, D))
    if not outputs:
        return query_BHLD.new_zeros(1, L, H, D, dtype=dtype), None
    return torch.cat(outputs).index_select(0, plan.output_rows).view(1, L, H, D), None


# A bucket's scores per head at most (2 MB in float32), and what one more bucket costs in scores:
# its dozen kernel launches and index tensors (measured on SmolLM2-135M shapes, 2 CPU cores). A
# segment with more scores than a bucket holds (about 700 tokens without a prefix) runs alone
# through scaled_dot_product_attention, which is as fast from there on and keeps no scores.
BUCKET_MAX_SCORES = 1 << 19
BUCKET_OVERHEAD_SCORES = 16384
LONG_SEGMENT_SCORES = BUCKET_MAX_SCORES


@dataclass(frozen=True)
class LongSegment:
    """A segment attended to alone: its `size` queries from row position `start`, the keys of its
    ancestors (their row positions, or None) and its own."""

    start: int
    size: int
    prefix_keys: torch.Tensor | None
    sees_nm: torch.Tensor | None  # with ancestors: True where a query sees a key; without: plain causal


@dataclass(frozen=True)
class AttentionBucket:
    """Segments whose attention runs as one padded batch. Each of the S segments has its n
    queries (padded to the bucket's longest, n) and m keys: its ancestors' (padded to the most
    among them, p), then its own (padded to n). The batch is (key head, segment): b = K x S
    matrices, each query row holding the G query heads of its key head one after the other."""

    batch: int  # K x S
    query_rows: torch.Tensor  # [K * S * G * n]: the (position, head) row of each query
    key_rows: torch.Tensor  # [K * S * m]: the (position, key head) row of each key
    blocked_Snm: torch.Tensor  # True where a query must not see a key (the future, padding)
    heads_per_key: int  # G
    masks: dict = field(default_factory=dict, compare=False, repr=False)

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """[K * S, G * n, m]: 0 where a query sees a key, -inf where it must not; added to the scores."""
        if dtype not in self.masks:
            S, n, m = self.blocked_Snm.shape
            additive = torch.zeros(S, n, m, dtype=dtype, device=self.blocked_Snm.device).masked_fill_(
                self.blocked_Snm, float("-inf"))
            self.masks[dtype] = (additive[None, :, None].expand(self.batch // S, S, self.heads_per_key, n, m)
                                 .reshape(self.batch, self.heads_per_key * n, m))
        return self.masks[dtype]


@dataclass(frozen=True)
class AttentionPlan:
    """How a packed row's segments are attended to, for H query heads over K key heads: the long
    ones alone, the others in buckets; and for each (position, head) of the row the row of their
    concatenated outputs that holds it."""

    buckets: tuple[AttentionBucket, ...]
    long_segments: tuple[LongSegment, ...]
    output_rows: torch.Tensor  # [L * H]: the long segments' outputs first, then the buckets'

    @staticmethod
    def of(bounds: torch.Tensor, ancestors_of: tuple[tuple[int, ...], ...], heads: int, key_heads: int,
           device: torch.device | str = "cpu") -> AttentionPlan:
        """The plan of the segments between `bounds`, each also attending to its `ancestors_of`'s keys."""
        starts, sizes = bounds[:-1].tolist(), bounds.diff().tolist()
        prefix_keys = [torch.cat([torch.arange(starts[a], starts[a] + sizes[a]) for a in ancestors])
                       if ancestors else torch.zeros(0, dtype=torch.long) for ancestors in ancestors_of]
        prefix_sizes = [len(keys) for keys in prefix_keys]
        H = heads
        output_rows = torch.empty(int(bounds[-1]) * H, dtype=torch.long)
        is_long = [size * (prefix + size) > LONG_SEGMENT_SCORES for size, prefix in zip(sizes, prefix_sizes)]
        long_segments, offset = [], 0
        for s in (s for s, long in enumerate(is_long) if long):
            start, size, prefix = starts[s], sizes[s], prefix_sizes[s]
            sees_nm = torch.ones(size, prefix + size, dtype=torch.bool, device=device).tril(prefix) if prefix else None
            long_segments.append(LongSegment(start, size, prefix_keys[s].to(device) if prefix else None, sees_nm))
            output_rows[start * H:(start + size) * H] = offset + torch.arange(size * H)
            offset += size * H
        buckets = []
        for members in _buckets([0 if long else size for size, long in zip(sizes, is_long)], prefix_sizes):
            bucket = _bucket([(starts[s], sizes[s], prefix_keys[s]) for s in members], heads, key_heads,
                             output_rows, offset, device)
            buckets.append(bucket)
            offset += bucket.query_rows.numel()
        return AttentionPlan(buckets=tuple(buckets), long_segments=tuple(long_segments),
                             output_rows=output_rows.to(device))


def _bucket(segments: list[tuple[int, int, torch.Tensor]], heads: int, key_heads: int, output_rows: torch.Tensor,
            offset: int, device: torch.device | str) -> AttentionBucket:
    """The bucket of `segments` (row start, size, ancestors' key positions), its outputs from row
    `offset` of the concatenated outputs; writes where each real query's output is into `output_rows`."""
    H, K = heads, key_heads
    G = H // K
    S, n = len(segments), max(size for _, size, _ in segments)
    p = max(len(prefix) for _, _, prefix in segments)
    query_Sn = torch.zeros(S, n, dtype=torch.long)
    key_Sm = torch.zeros(S, p + n, dtype=torch.long)
    blocked_Snm = torch.ones(S, n, p + n, dtype=torch.bool)
    for i, (start, size, prefix_keys) in enumerate(segments):
        own = torch.arange(start, start + size)
        query_Sn[i] = own[-1]  # padding queries: a real position, their output unused
        query_Sn[i, :size] = own
        key_Sm[i] = own[-1]
        key_Sm[i, p : p + size] = own
        key_Sm[i, : len(prefix_keys)] = prefix_keys
        blocked_Snm[i, :, : len(prefix_keys)] = False
        causal = torch.ones(size, size, dtype=torch.bool).tril()
        blocked_Snm[i, :size, p : p + size] = ~causal
        blocked_Snm[i, size:, p : p + size] = ~causal[-1]  # a padding query sees what the last one sees
    head_K = torch.arange(K)
    query_rows = (query_Sn[None, :, None] * H + (head_K[:, None] * G + torch.arange(G))[:, None, :, None])
    key_rows = key_Sm[None] * K + head_K[:, None, None]
    # This bucket's output row of (position, head), for the real queries.
    out_KSGn = offset + torch.arange(query_rows.numel()).view(K, S, G, n)
    for i, (start, size, _) in enumerate(segments):
        targets = torch.arange(start, start + size)[:, None] * H + torch.arange(H)
        output_rows[targets.flatten()] = out_KSGn[:, i, :, :size].permute(2, 0, 1).flatten()
    return AttentionBucket(batch=K * S, query_rows=query_rows.flatten().to(device),
                           key_rows=key_rows.flatten().to(device), blocked_Snm=blocked_Snm.to(device),
                           heads_per_key=G)


def _buckets(sizes: list[int], prefix_sizes: list[int]) -> list[list[int]]:
    """The non-empty segments cut into buckets by length, minimising the padded scores plus a
    fixed cost per bucket."""
    order = sorted((s for s in range(len(sizes)) if sizes[s]), key=lambda s: (sizes[s], prefix_sizes[s]))

    def bucket_cost(start: int, end: int) -> float | None:
        n, p = sizes[order[end - 1]], max(prefix_sizes[s] for s in order[start:end])
        scores = (end - start) * n * (p + n)
        return None if scores > BUCKET_MAX_SCORES and start < end - 1 else scores + BUCKET_OVERHEAD_SCORES

    return [order[start:end] for start, end in cheapest_partition(len(order), bucket_cost)]


def cheapest_partition(count: int, chunk_cost: Callable[[int, int], float | None]) -> list[tuple[int, int]]:
    """[start, end) chunks covering range(count) in order, minimising the sum of
    chunk_cost(start, end), by dynamic programming over the cut points. For each end, starts are
    tried from end - 1 down until chunk_cost says None (too large); the nearest wins a tie."""
    best_cost = [0.0] + [math.inf] * count
    best_start = [0] * (count + 1)
    for end in range(1, count + 1):
        for start in range(end - 1, -1, -1):
            cost = chunk_cost(start, end)
            if cost is None:
                break
            if best_cost[start] + cost < best_cost[end]:
                best_cost[end], best_start[end] = best_cost[start] + cost, start
    chunks, end = [], count
    while end > 0:
        chunks.append((best_start[end], end))
        end = best_start[end]
    return chunks[::-1]


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The attention above is causal per sequence by construction; no mask tensor is built."""


AttentionInterface.register(VARLEN, varlen_attention)
AttentionMaskInterface.register(VARLEN, _no_mask)


def packable(model: Any) -> bool:
    """Whether the learner packs this model's micro-batches (on the CPU, a supported family)."""
    config = model.config
    return (next(model.parameters()).device.type == "cpu"
            and getattr(config, "model_type", None) in PACKABLE_MODEL_TYPES
            and getattr(config, "sliding_window", None) is None
            and config._attn_implementation in ("sdpa", "eager", VARLEN))


@dataclass(frozen=True)
class PackedRow:
    """Where the real tokens of an (N, T) batch (padded on either side) go in one row of L positions.

    The row is a list of segments (reasonrl.training.prefix_tree), each parent before its
    children: a run of tokens that several sequences share, or the rest of one sequence."""

    slot_NT: torch.Tensor  # each real token's position in the row (a shared token's: the one they share)
    source_L: torch.Tensor  # each row position's token, as a flat index into the [N, T] batch
    positions_1L: torch.Tensor  # position ids: each token's position in its sequences
    bounds: torch.Tensor  # [S + 1]: where each segment starts in the row, then L
    ancestors_of: tuple[tuple[int, ...], ...]  # per segment: the segments it continues, from the root
    plans: dict = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(attention_NT: torch.Tensor, input_ids_NT: torch.Tensor | None = None) -> PackedRow:
        """The row of the real tokens in `attention_NT`. Given the token ids, sequences that start
        with the same tokens share them."""
        real_NT = attention_NT.bool()
        N, T = real_NT.shape
        first_N, length_N = real_NT.int().argmax(1).tolist(), real_NT.sum(1).tolist()
        if input_ids_NT is None:
            segments = [Segment(0, length, (n,), ROOT) for n, length in enumerate(length_N) if length]
        else:
            segments = prefix_tree(aligned_tokens(input_ids_NT, attention_NT), length_N)
        ancestors_of: list[tuple[int, ...]] = []
        for segment in segments:
            parent = segment.parent
            ancestors_of.append(() if parent == ROOT else (*ancestors_of[parent], parent))

        bounds = F.pad(torch.tensor([segment.end - segment.begin for segment in segments]).cumsum(0), (1, 0))
        # Flat [N * T] indices as Python ints, then one tensor each: small tensor ops per segment
        # and sequence cost more than the rest of the row.
        tokens, slots, source, positions = [], [], [], []
        for segment, row_start in zip(segments, bounds.tolist()):
            size = segment.end - segment.begin
            for n in segment.members:
                tokens.extend(range(n * T + first_N[n] + segment.begin, n * T + first_N[n] + segment.end))
            slots.extend(list(range(row_start, row_start + size)) * len(segment.members))
            supplier = segment.members[0]
            source.extend(range(supplier * T + first_N[supplier] + segment.begin,
                                supplier * T + first_N[supplier] + segment.end))
            positions.extend(range(segment.begin, segment.end))
        slot_NT = torch.zeros(N * T, dtype=torch.long).index_copy_(0, torch.tensor(tokens, dtype=torch.long),
                                                                   torch.tensor(slots, dtype=torch.long))
        device = attention_NT.device
        return PackedRow(slot_NT=slot_NT.view(N, T).to(device), source_L=torch.tensor(source, dtype=torch.long,
                                                                                      device=device),
                         positions_1L=torch.tensor([positions], dtype=torch.long, device=device), bounds=bounds,
                         ancestors_of=tuple(ancestors_of))

    def attention_plan(self, heads: int, key_heads: int, device: torch.device | str = "cpu") -> AttentionPlan:
        """The attention buckets of this row, built once and shared by every layer, forward and backward."""
        key = (heads, key_heads, str(device))
        if key not in self.plans:
            self.plans[key] = AttentionPlan.of(self.bounds, self.ancestors_of, heads, key_heads, device)
        return self.plans[key]

    def pack(self, values_NT: torch.Tensor) -> torch.Tensor:
        return values_NT.flatten()[self.source_L][None]

    def index_of(self, where_NT: torch.Tensor) -> torch.Tensor:
        """Row positions of the real (n, t) entries marked in `where_NT` ([N, T'], T' <= T), in the
        row-major order in which boolean indexing of an [N, T'] tensor lists them (a shared token's
        position repeats, once per sequence)."""
        return self.slot_NT[:, : where_NT.shape[1]][where_NT]


def prompts_of(input_ids_NT: torch.Tensor, attention_NT: torch.Tensor, loss_NT: torch.Tensor) -> list[tuple[int, ...]]:
    """Each sequence's prompt: its real tokens before the first one it learns (the loss mask,
    [N, T-1], marks position t for token t + 1); () for a sequence with no loss position."""
    learned_NT = loss_NT.bool()
    first_N, first_loss_N = attention_NT.bool().int().argmax(1).tolist(), learned_NT.int().argmax(1).tolist()
    return [tuple(input_ids_NT[n, first_N[n]:first_loss_N[n] + 1].tolist()) if learned_NT[n].any() else ()
            for n in range(len(first_N))]


def grouped_by_prompt(prompts: list[tuple[int, ...]]) -> list[int]:
    """An order of the sequences that puts those with the same prompt next to each other (groups
    in order of first appearance), so that micro-batches cut from it share their prompts."""
    first_seen: dict[tuple[int, ...], int] = {}
    for n, prompt in enumerate(prompts):
        first_seen.setdefault(prompt, n)
    return sorted(range(len(prompts)), key=lambda n: (first_seen[prompts[n]] if prompts[n] else n, n))


# Below this many attention scores per head (sequences x length^2), plain matmul attention
# beats the CPU flash-attention kernel, forward and backward (measured on SmolLM2-135M:
# 1.2x at 8 x 128 tokens, 1.3x at 2 x 512, even at 1 x 1024) at bounded memory.
EAGER_ATTENTION_MAX_SCORES = 8 * 256 * 256


@contextmanager
def attention_for(model: Any, shape_NT: torch.Size, pack: bool = False) -> Iterator[None]:
    """For CPU micro-batches: packed sequences (reasonrl.training.packing) when asked, else matmul ("eager")
    attention when an sdpa model's micro-batch is small; else as is."""
    sequences, length = shape_NT
    implementation = model.config._attn_implementation
    if pack and implementation != VARLEN:
        switch = VARLEN
    elif (next(model.parameters()).device.type == "cpu" and implementation == "sdpa"
          and sequences * length * length <= EAGER_ATTENTION_MAX_SCORES):
        switch = "eager"
    else:
        yield
        return
    model.set_attn_implementation(switch)
    try:
        yield
    finally:
        model.set_attn_implementation(implementation)


# What one more micro-batch costs beyond its tokens (weight casts, kernel launches), in padded
# token positions: about 60 ms against ~1.4 ms per position for SmolLM2-135M on 2 CPU cores.
MICRO_BATCH_OVERHEAD_TOKENS = 48


def micro_batches(batch: TrainBatch, index_N: torch.Tensor, size: int, packed: bool = False,
                  max_positions: int = 0) -> list[torch.Tensor]:
    """`index_N` split into micro-batches of at most `size` sequences of similar length.

    Packed (no padding), every micro-batch costs its positions, so the fewest micro-batches are
    the cheapest, and sequences with the same prompt go together (a packed row holds a shared
    prefix once). With `max_positions`, packed micro-batches are instead filled up to that many
    row positions (counted as the packed row counts them: each shared prefix once; a longer
    sequence alone), whatever their count.
    Padded, sequences are sorted by length, each micro-batch is as long as its longest sequence,
    and the cuts minimise the padded positions computed plus a fixed cost per micro-batch: one
    long completion does not pad seven short ones to its length. The loss is
    normalised over the whole batch, so the split does not change it."""
    attention_NT = batch.attention_mask_NT[index_N]
    if packed:
        input_ids_NT = batch.input_ids_NT[index_N]
        order = grouped_by_prompt(prompts_of(input_ids_NT, attention_NT, batch.loss_mask_NT[index_N]))
        if max_positions:
            return _filled_to(max_positions, index_N, order, aligned_tokens(input_ids_NT, attention_NT),
                              attention_NT.sum(1).tolist())
        return list(index_N[order].split(size))
    lengths_N = attention_NT.sum(1)
    order_N = torch.argsort(lengths_N, stable=True)
    by_length_N, sorted_lengths = index_N[order_N], lengths_N[order_N].tolist()
    return [by_length_N[start:end] for start, end in cheapest_cuts(sorted_lengths, size, MICRO_BATCH_OVERHEAD_TOKENS)]


def _filled_to(max_positions: int, index_N: torch.Tensor, order: list[int], tokens_NT: torch.Tensor,
               lengths: list[int]) -> list[torch.Tensor]:
    """Consecutive runs of `order` whose packed rows hold at most `max_positions` positions each.
    A sequence adds the tokens past its longest common prefix with a sequence already in the run:
    summed, the nodes of the run's prefix tree, which is what its row holds."""
    runs: list[list[int]] = [[]]
    positions = 0
    for n in order:
        run = runs[-1]
        added = lengths[n] - (int(shared_lengths(tokens_NT.index_select(0, torch.tensor(run)), tokens_NT[n]).max())
                              if run else 0)
        if run and positions + added > max_positions:
            runs.append([])
            positions, added = 0, lengths[n]
        runs[-1].append(n)
        positions += added
    return [index_N[run] for run in runs if run]


def cheapest_cuts(sorted_lengths: Sequence[int], size: int, overhead: int) -> list[tuple[int, int]]:
    """[start, end) chunks of an ascending list, each at most `size` long, minimising
    sum(chunk length x its last value + overhead)."""
    return cheapest_partition(len(sorted_lengths), lambda start, end: None if end - start > size
                              else (end - start) * sorted_lengths[end - 1] + overhead)
