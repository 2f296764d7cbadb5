"""Padding-free packing: a micro-batch's sequences laid end to end in one row for the learner's
forward and backward, attention kept within each sequence.

Why by hand: transformers recognises packed sequences from restarting position ids, but on the
CPU its eager and sdpa attention then score every query of the row against every key and mask
the other sequences out (work quadratic in the whole row), and its per-sequence ("varlen") path
is flash-attention, which needs CUDA. Here the attention runs sequence by sequence through an
attention function registered with transformers, so the decoder's linear layers see one row of
real tokens only (no padding) while attention costs what it costs per sequence.

Used on the CPU for the decoder families the rollout engine's fused decoder knows (their
attention passes the extra keyword arguments through), without a sliding window; `attention_for`
in learner.py switches a model to it for the duration of a micro-batch.

Samples of one group start with the same prompt, and a causal model's hidden states of a prefix do
not depend on what follows it, so the row holds each shared prompt once: every sample's remaining
tokens form a segment of their own that attends to the prompt's keys and to itself, its position
ids continuing the prompt's. The log-probs and gradients are those of the separate sequences
(the prompt's activations receive the sum of the samples' gradients), while a group of G samples
costs one prompt instead of G. With 8 samples of 40 tokens after a 55-token prompt that is 375
positions instead of 760.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

VARLEN = "reasonrl_varlen"
PACKABLE_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
NO_PREFIX = -1


def varlen_attention(module: Any, query_BHLD: torch.Tensor, key_BKLD: torch.Tensor, value_BKLD: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     cu_seq_lens_q: torch.Tensor | None = None, packed_row: PackedRow | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each segment of a packed row, a segment that continues a shared
    prompt also attending to all of the prompt. The layout comes from `packed_row`, or for
    separate sequences from `cu_seq_lens_q`, their boundaries ([0, end of the first, ..., L]).
    Output [B, L, H, D], as transformers expects."""
    if packed_row is not None:
        bounds, prefix_of = packed_row.bounds, packed_row.prefix_of
    elif cu_seq_lens_q is not None:
        bounds, prefix_of = cu_seq_lens_q, (NO_PREFIX,) * (len(cu_seq_lens_q) - 1)
    else:
        raise ValueError(f"the {VARLEN} attention needs the packed row's layout (packed_row or cu_seq_lens_q)")
    if dropout and module.training:
        raise ValueError(f"the {VARLEN} attention has no attention dropout; set the model's attention_dropout to 0")
    lengths = bounds.diff().tolist()
    scale = scaling if scaling is not None else query_BHLD.shape[-1] ** -0.5
    # One cast and one split per tensor, not one per segment: under autocast the rotated query
    # and key are float32, and each slice would be cast (and its gradient zero-padded back to
    # the whole row) on its own.
    dtype = value_BKLD.dtype
    queries = query_BHLD.to(dtype).split(lengths, dim=2)
    keys, values = key_BKLD.to(dtype).split(lengths, dim=2), value_BKLD.split(lengths, dim=2)
    outputs = []
    for query, key, value, prefix in zip(queries, keys, values, prefix_of):
        if not query.shape[2]:
            continue
        if prefix != NO_PREFIX:
            key, value = torch.cat([keys[prefix], key], dim=2), torch.cat([values[prefix], value], dim=2)
        outputs.append(_causal_attention(query, key, value, scale).transpose(1, 2))
    return torch.cat(outputs, dim=1), None


def _causal_attention(query_BHnD: torch.Tensor, key_BKmD: torch.Tensor, value_BKmD: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Matmul attention of n queries, the last n of m positions, over those m keys; the query
    heads sharing a key head (G of them) as one group: on the CPU, for sequences of a few hundred
    tokens, faster forward and backward than the flash-attention kernel (see
    learner.EAGER_ATTENTION_MAX_SCORES)."""
    B, H, n, D = query_BHnD.shape
    K, m = key_BKmD.shape[1], key_BKmD.shape[2]
    query_BKGnD = query_BHnD.view(B, K, H // K, n, D)
    scores_BKGnm = torch.matmul(query_BKGnD, key_BKmD[:, :, None].transpose(-1, -2)) * scale
    scores_BKGnm = scores_BKGnm.masked_fill(_future(n, m, query_BHnD.device), float("-inf"))
    weights_BKGnm = scores_BKGnm.softmax(dim=-1, dtype=torch.float32).to(query_BHnD.dtype)
    return torch.matmul(weights_BKGnm, value_BKmD[:, :, None]).view(B, H, n, D)


@functools.lru_cache(maxsize=256)
def _future(n: int, m: int, device: torch.device) -> torch.Tensor:
    """[n, m], True where a key comes after the query: query i sits at position m - n + i."""
    return torch.ones(n, m, dtype=torch.bool, device=device).triu(m - n + 1)


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

    The row is a list of segments: a whole sequence, or a prompt shared by several sequences, or
    the rest of one of those sequences (which continues its prompt's segment)."""

    slot_NT: torch.Tensor  # each real token's position in the row (a shared prompt's tokens: the prompt's)
    source_L: torch.Tensor  # each row position's token, as a flat index into the [N, T] batch
    positions_1L: torch.Tensor  # position ids: each sequence's own, a continuation carrying on its prompt's
    bounds: torch.Tensor  # [S + 1]: where each segment starts in the row, then L
    prefix_of: tuple[int, ...]  # per segment: the prompt segment it continues, or NO_PREFIX

    @staticmethod
    def of(attention_NT: torch.Tensor, input_ids_NT: torch.Tensor | None = None,
           loss_NT: torch.Tensor | None = None) -> PackedRow:
        """The row of the real tokens in `attention_NT`. Given the token ids and the loss mask
        ([N, T-1]), sequences whose tokens up to their first loss position are the same share
        those tokens (their prompt)."""
        real_NT = attention_NT.bool()
        N, T = real_NT.shape
        first_N, length_N = real_NT.int().argmax(1).tolist(), real_NT.sum(1).tolist()
        prompts = prompts_of(input_ids_NT, attention_NT, loss_NT) if loss_NT is not None else [()] * N
        members: dict[tuple[int, ...], list[int]] = {}
        for n, prompt in enumerate(prompts):
            if prompt:
                members.setdefault(prompt, []).append(n)
        shared = {n: group for group in members.values() if len(group) > 1 for n in group}
        prompt_N = [len(prompt) for prompt in prompts]

        segments: list[tuple[int, int, int]] = []  # (sequence, first token, end), in the sequence's own positions
        prefix_of: list[int] = []
        prompt_segment: dict[int, int] = {}  # a group's first sequence -> its prompt's segment
        for n in range(N):
            if n not in shared:
                segments.append((n, 0, length_N[n]))
                prefix_of.append(NO_PREFIX)
                continue
            leader, prompt = shared[n][0], prompt_N[n]
            if n == leader:
                prompt_segment[leader] = len(segments)
                segments.append((n, 0, prompt))
                prefix_of.append(NO_PREFIX)
            segments.append((n, prompt, length_N[n]))
            prefix_of.append(prompt_segment[leader])

        sizes = [end - begin for _, begin, end in segments]
        bounds = F.pad(torch.tensor(sizes).cumsum(0), (1, 0))
        slot_NT = torch.zeros(N, T, dtype=torch.long)
        source, positions = [], []
        for (n, begin, end), row_start in zip(segments, bounds.tolist()):
            own = torch.arange(begin, end)
            slot_NT[n, first_N[n] + own] = row_start + own - begin
            source.append(n * T + first_N[n] + own)
            positions.append(own)
        for n, group in shared.items():
            if n != group[0]:  # its prompt's tokens are the first sequence's
                prompt = torch.arange(prompt_N[n])
                slot_NT[n, first_N[n] + prompt] = slot_NT[group[0], first_N[group[0]] + prompt]
        return PackedRow(slot_NT=slot_NT.to(attention_NT.device), source_L=torch.cat(source).to(attention_NT.device),
                         positions_1L=torch.cat(positions)[None].to(attention_NT.device), bounds=bounds,
                         prefix_of=tuple(prefix_of))

    def pack(self, values_NT: torch.Tensor) -> torch.Tensor:
        return values_NT.flatten()[self.source_L][None]

    def index_of(self, where_NT: torch.Tensor) -> torch.Tensor:
        """Row positions of the real (n, t) entries marked in `where_NT` ([N, T'], T' <= T), in the
        row-major order in which boolean indexing of an [N, T'] tensor lists them (positions in a
        shared prompt repeat, once per sequence)."""
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
