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


def varlen_attention(module: Any, query_BHLD: torch.Tensor, key_BKLD: torch.Tensor, value_BKLD: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     cu_seq_lens_q: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each sequence of a packed row; `cu_seq_lens_q` holds the sequences'
    boundaries ([0, end of the first, ..., L]). Output [B, L, H, D], as transformers expects."""
    if cu_seq_lens_q is None:
        raise ValueError(f"the {VARLEN} attention needs the packed sequences' boundaries (cu_seq_lens_q)")
    if dropout and module.training:
        raise ValueError(f"the {VARLEN} attention has no attention dropout; set the model's attention_dropout to 0")
    lengths = cu_seq_lens_q.diff().tolist()
    scale = scaling if scaling is not None else query_BHLD.shape[-1] ** -0.5
    # One cast and one split per tensor, not one per sequence: under autocast the rotated query
    # and key are float32, and each slice would be cast (and its gradient zero-padded back to
    # the whole row) on its own.
    dtype = value_BKLD.dtype
    pieces = zip(query_BHLD.to(dtype).split(lengths, dim=2), key_BKLD.to(dtype).split(lengths, dim=2),
                 value_BKLD.split(lengths, dim=2))
    outputs = [_causal_attention(query, key, value, scale).transpose(1, 2) for query, key, value in pieces
               if query.shape[2]]
    return torch.cat(outputs, dim=1), None


def _causal_attention(query_BHnD: torch.Tensor, key_BKnD: torch.Tensor, value_BKnD: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """Matmul attention of one sequence, the query heads sharing a key head (G of them) as one
    group: on the CPU, for sequences of a few hundred tokens, faster forward and backward than
    the flash-attention kernel (see learner.EAGER_ATTENTION_MAX_SCORES)."""
    B, H, n, D = query_BHnD.shape
    K = key_BKnD.shape[1]
    query_BKGnD = query_BHnD.view(B, K, H // K, n, D)
    scores_BKGnn = torch.matmul(query_BKGnD, key_BKnD[:, :, None].transpose(-1, -2)) * scale
    scores_BKGnn = scores_BKGnn.masked_fill(_future(n, query_BHnD.device), float("-inf"))
    weights_BKGnn = scores_BKGnn.softmax(dim=-1, dtype=torch.float32).to(query_BHnD.dtype)
    return torch.matmul(weights_BKGnn, value_BKnD[:, :, None]).view(B, H, n, D)


@functools.lru_cache(maxsize=64)
def _future(n: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal of an n x n score matrix: the keys a causal query must not see."""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)


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
    """Where the real tokens of an (N, T) batch (padded on either side) go in one row of L = their count."""

    real_NT: torch.Tensor
    slot_NT: torch.Tensor  # each real token's position in the row
    positions_1L: torch.Tensor  # position ids, restarting at 0 with every sequence
    bounds: torch.Tensor  # [N + 1]: where each sequence starts in the row, then L

    @staticmethod
    def of(attention_NT: torch.Tensor) -> PackedRow:
        real_NT = attention_NT.bool()
        slot_NT = (real_NT.flatten().cumsum(0) - 1).view(real_NT.shape)
        positions_1L = (real_NT.cumsum(1) - 1)[real_NT][None]
        bounds = F.pad(real_NT.sum(1).cumsum(0), (1, 0))
        return PackedRow(real_NT=real_NT, slot_NT=slot_NT, positions_1L=positions_1L, bounds=bounds)

    def pack(self, values_NT: torch.Tensor) -> torch.Tensor:
        return values_NT[self.real_NT][None]

    def index_of(self, where_NT: torch.Tensor) -> torch.Tensor:
        """Row positions of the real (n, t) entries marked in `where_NT` ([N, T'], T' <= T), in the
        row-major order in which boolean indexing of an [N, T'] tensor lists them."""
        return self.slot_NT[:, : where_NT.shape[1]][where_NT]
