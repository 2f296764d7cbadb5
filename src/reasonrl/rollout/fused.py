"""A hand-written forward pass for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3), made
for sampling many rows at once with weights that change every training step.

Why not the transformers forward: profiled on 2 CPU cores (SmolLM2-135M, 8 rows, bf16), one
decode step spent a third of its time in the CPU flash-attention kernel, which is slow for a
single query, a fifth in concatenating the growing KV cache, and the rest in un-fused linears
that re-layout their weights on every call. Why not an inference library: llama.cpp needs a
GGUF conversion per weight sync and vLLM does not run on CPUs here. What this module does:

- q/k/v and gate/up projections fused into one GEMM each; on CPUs with bf16 support the weights
  are pre-packed once per sync into oneDNN's blocked layout (about 1.7x faster for few rows);
- a pre-allocated KV cache written in place (grown in chunks, never concatenated per step) and
  attention as two small batched GEMMs over it, with grouped query heads kept grouped;
- LoRA adapters merged into the packed copies at sync time, so the engine decodes at full speed
  while the model's own base weights stay untouched;
- the numerics of the learner's bfloat16 autocast: linears in the weights' dtype, the residual
  stream, normalisation and attention scores in float32, so that what is sampled is what the
  learner's forward scores.

The rotary embedding's angles are the model's own module's, so every rope-scaling variant comes
from transformers; RMS norms run as one `F.rms_norm` call each and queries and keys are rotated in
one pass (a decode step is some 2000 small torch calls: each one removed counts). Architectures it
does not recognise fall back to the transformers forward (`FusedDecoder.supports`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Attention over runs of this many rows, each from the first column one of them reads, when that reads
# at most READ_SHARE of the columns one product over all rows from the earliest would: rows of a
# continuous batch start at very different columns (a resumed partial rollout's long prefix beside a
# fresh prompt), and on a CPU reading the cache is most of a long decode step's attention.
ATTENTION_CHUNK_ROWS = 8
READ_SHARE = 0.8


class PackedLinear:
    """y = x W^T + b with W laid out once for the backend's GEMM (oneDNN on bf16 CPUs); x is cast
    to W's dtype, as autocast does."""

    def __init__(self, weight_OI: torch.Tensor, bias_O: torch.Tensor | None):
        self.bias_O, self.dtype = bias_O, weight_OI.dtype
        self.onednn = weight_OI.device.type == "cpu" and weight_OI.dtype == torch.bfloat16 and _onednn_bf16()
        self.weight_OI = torch.ops.mkldnn._reorder_linear_weight(weight_OI, 8) if self.onednn else weight_OI

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight_OI, self.bias_O, "none", [], "")
        return F.linear(x, self.weight_OI, self.bias_O)


@dataclass
class _Layer:
    input_norm: Any
    qkv: PackedLinear
    q_norm: Any
    k_norm: Any
    out: PackedLinear
    post_norm: Any
    gate_up: PackedLinear
    down: PackedLinear


class KVCache:
    """Keys and values of every layer for N rows, written in place at one shared position.

    Rows are left-aligned to a common width, so step t writes column t of every row; `valid_NS`
    marks which columns hold real tokens (prompts are left-padded). Columns past `length` are
    never read; the cache is zeroed anyway so that its pages fault in once, up front, rather
    than a few at a time inside the decode loop. On CPUs the cache is float32: batched bf16
    GEMMs copy a strided operand (a cache prefix) before multiplying, float32 ones read it in
    place."""

    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (layers, rows, kv_heads, capacity, head_dim)
        self.keys_LNKSD = torch.zeros(shape, dtype=dtype, device=device)
        self.values_LNKSD = torch.zeros(shape, dtype=dtype, device=device)
        self.valid_NS = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.valid_NS.shape[1]

    def reserve(self, length: int) -> None:
        """Make room for `length` columns, at least doubling the capacity when it grows."""
        if length > self.capacity:
            self._reallocate(torch.arange(self.valid_NS.shape[0], device=self.valid_NS.device),
                             max(length, 2 * self.capacity))

    def select_rows(self, rows_N: torch.Tensor, capacity: int) -> None:
        """Keep (reorder, repeat) the given rows in a cache of `capacity` columns."""
        self._reallocate(rows_N, capacity)

    def add_rows(self, count: int) -> None:
        """`count` empty rows after the existing ones (no valid column)."""
        self._reallocate(torch.arange(self.valid_NS.shape[0], device=self.valid_NS.device), self.capacity,
                         extra_rows=count)

    def shift(self, columns: int) -> None:
        """Move every row's filled columns by `columns`: right (positive) to make room for a longer prefix
        before them, left (negative) to drop leading columns no row reads any more."""
        filled = self.length + columns
        if filled < 0:
            raise ValueError(f"cannot drop {-columns} of {self.length} columns")
        self._reallocate(torch.arange(self.valid_NS.shape[0], device=self.valid_NS.device),
                         max(self.capacity, filled), shift=columns)

    def place(self, slots_K: torch.Tensor, source: KVCache, rows_K: torch.Tensor) -> None:
        """Rows `rows_K` of `source` (its filled columns) into rows `slots_K` of this cache, ending at its
        last filled column; the slots' earlier columns stop being valid. Needs `source.length <= length`."""
        width, end = source.length, self.length
        if width > end:
            raise ValueError(f"a {width}-column prefix does not fit before column {end}; shift the cache first")
        start = end - width
        self.keys_LNKSD[:, slots_K, :, start:end] = source.keys_LNKSD[:, rows_K, :, :width].to(self.keys_LNKSD.dtype)
        self.values_LNKSD[:, slots_K, :, start:end] = source.values_LNKSD[:, rows_K, :, :width].to(
            self.values_LNKSD.dtype)
        self.valid_NS[slots_K] = False
        self.valid_NS[slots_K, start:end] = source.valid_NS[rows_K, :width]

    def _reallocate(self, rows_N: torch.Tensor, capacity: int, *, shift: int = 0, extra_rows: int = 0) -> None:
        # Only the filled columns are copied: the cache is mostly empty space when rows finish.
        layers, _, kv_heads, _, head_dim = self.keys_LNKSD.shape
        rows = len(rows_N) + extra_rows
        shape = (layers, rows, kv_heads, capacity, head_dim)
        kept, filled = max(0, -shift), self.length  # source columns [kept, filled) go to [kept + shift, ...)
        target = slice(kept + shift, filled + shift)
        keys, values = self.keys_LNKSD.new_zeros(shape), self.values_LNKSD.new_zeros(shape)
        keys[:, :len(rows_N), :, target] = self.keys_LNKSD[:, :, :, kept:filled].index_select(1, rows_N)
        values[:, :len(rows_N), :, target] = self.values_LNKSD[:, :, :, kept:filled].index_select(1, rows_N)
        valid = self.valid_NS.new_zeros(rows, capacity)
        valid[:len(rows_N), target] = self.valid_NS[:, kept:filled].index_select(0, rows_N)
        self.keys_LNKSD, self.values_LNKSD, self.valid_NS = keys, values, valid
        self.length = filled + shift


class FusedDecoder:
    """Prefill and decode for one Llama-family causal LM, from packed copies of its weights.

    Build it again after the model's weights change (`from_model` is the weight sync)."""

    @staticmethod
    def supports(model: Any) -> bool:
        config = model.config
        return (getattr(config, "model_type", None) in SUPPORTED_MODEL_TYPES
                and getattr(config, "hidden_act", "silu") == "silu"
                and not getattr(config, "mlp_bias", False)
                and getattr(config, "pretraining_tp", 1) == 1
                # One window for every layer (Mistral) is supported; a per-layer mix is not.
                and "sliding_attention" not in (getattr(config, "layer_types", None) or ()))

    def __init__(self, model: Any):
        if not self.supports(model):
            raise ValueError(f"FusedDecoder supports {SUPPORTED_MODEL_TYPES} with full or uniformly sliding "
                             f"attention, not this {type(model).__name__}; use the transformers forward")
        base = model.get_decoder()
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim ** -0.5
        self.window = getattr(config, "sliding_window", None)
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.final_norm = _rms_norm(base.norm)
        self.device = self.embed.weight.device
        self.cache_dtype = torch.float32 if self.device.type == "cpu" else self.embed.weight.dtype
        with torch.no_grad():
            lm_weight, lm_bias = _effective_weight(model.get_output_embeddings())
            self.lm_head = PackedLinear(lm_weight, lm_bias)
            self.layers = [self._pack_layer(layer) for layer in base.layers]

    @staticmethod
    def _pack_layer(layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        return _Layer(input_norm=_rms_norm(layer.input_layernorm),
                      qkv=_fused(attn.q_proj, attn.k_proj, attn.v_proj),
                      q_norm=getattr(attn, "q_norm", None), k_norm=getattr(attn, "k_norm", None),
                      out=_fused(attn.o_proj), post_norm=_rms_norm(layer.post_attention_layernorm),
                      gate_up=_fused(mlp.gate_proj, mlp.up_proj), down=_fused(mlp.down_proj))

    def new_cache(self, rows: int, capacity: int) -> KVCache:
        return KVCache(len(self.layers), rows, self.kv_heads, self.head_dim, capacity, self.cache_dtype,
                       self.device)

    @torch.no_grad()
    def forward(self, tokens_NT: torch.Tensor, positions_NT: torch.Tensor, valid_NT: torch.Tensor,
                cache: KVCache, row_starts: Sequence[int] | None = None) -> torch.Tensor:
        """Logits of the last position of every row, after appending T columns to the cache.

        `valid_NT` is False for left padding; padded positions are never attended to. `row_starts`,
        each row's first valid cache column (or any column before it), lets attention skip the
        leading columns a run of rows does not read (`row_chunks`). Never differentiable: oneDNN's
        packed bf16 linears run about 200x slower when autograd records."""
        start, T = cache.length, tokens_NT.shape[1]
        end = start + T
        cache.reserve(end)
        cache.valid_NS[:, start:end] = valid_NT
        mask_NTS = self._attention_mask(cache.valid_NS[:, :end], valid_NT, start, self.window)
        chunks = row_chunks(row_starts, start, end) if row_starts is not None else ((0, len(tokens_NT), 0),)
        logits_NV = self._layers(tokens_NT, positions_NT, mask_NTS, cache, start, chunks)
        cache.length = end
        return logits_NV

    @torch.no_grad()
    def decode_in_place(self, tokens_N1: torch.Tensor, positions_N1: torch.Tensor, column_1: torch.Tensor,
                        cache: KVCache) -> torch.Tensor:
        """One decode step with static shapes, for capture as a CUDA graph (rollout/cuda_graph.py):
        the token of every row is written at cache column `column_1` (a one-element tensor, so that a
        replay can move it) and attention reads the cache's whole capacity, the columns not yet
        written masked out. The same logits as `forward` up to float rounding; leaves
        `cache.length` to the caller."""
        if self.window is not None:
            raise ValueError("decode_in_place attends to the whole cache: no sliding window")
        cache.valid_NS.index_fill_(1, column_1, True)
        mask_N1S = torch.zeros(cache.valid_NS.shape, dtype=torch.float32, device=self.device).masked_fill_(
            ~cache.valid_NS, float("-inf"))[:, None]
        return self._layers(tokens_N1, positions_N1, mask_N1S, cache, column_1, ((0, len(tokens_N1), 0),))

    def _layers(self, tokens_NT: torch.Tensor, positions_NT: torch.Tensor, mask_NTS: torch.Tensor, cache: KVCache,
                column: int | torch.Tensor, chunks: tuple[tuple[int, int, int], ...]) -> torch.Tensor:
        # The residual stream in float32, as the learner's autocast keeps it: in bfloat16 it would
        # round at every layer, and the sampled log-probs would drift from the ones trained on.
        hidden_NTH = self.embed(tokens_NT).float()
        step = _Step.of(self, hidden_NTH, positions_NT, mask_NTS, cache, column, chunks)
        for index, layer in enumerate(self.layers):  # in place where a result is used once: fewer allocations
            hidden_NTH += self._attention(index, layer, layer.input_norm(hidden_NTH), step)
            gate_NTF, up_NTF = layer.gate_up(layer.post_norm(hidden_NTH)).chunk(2, dim=-1)
            hidden_NTH += layer.down(F.silu(gate_NTF, inplace=True).mul_(up_NTF))
        return self.lm_head(self.final_norm(hidden_NTH[:, -1]))

    @staticmethod
    def _attention_mask(valid_NS: torch.Tensor, valid_NT: torch.Tensor, start: int,
                        window: int | None) -> torch.Tensor:
        """Additive mask [N, T, S]: causal (within the sliding window, if any), real keys only;
        a padded query sees the causal prefix so its (discarded) softmax stays finite."""
        T, S = valid_NT.shape[1], valid_NS.shape[1]
        ones_TS = torch.ones(T, S, dtype=torch.bool, device=valid_NS.device)
        causal_TS = ones_TS.tril(start)
        if window is not None:
            causal_TS &= ~ones_TS.tril(start - window)
        allowed_NTS = causal_TS & (valid_NS[:, None, :] | ~valid_NT[:, :, None])
        return torch.zeros(allowed_NTS.shape, dtype=torch.float32, device=valid_NS.device).masked_fill_(
            ~allowed_NTS, float("-inf"))

    def _attention(self, index: int, layer: _Layer, x_NTH: torch.Tensor, step: _Step) -> torch.Tensor:
        N, T, _ = x_NTH.shape
        H, K, D = self.heads, self.kv_heads, self.head_dim
        qkv_NTXD = layer.qkv(x_NTH).view(N, T, H + 2 * K, D)
        v_NKTD = qkv_NTXD[:, :, H + K:].transpose(1, 2)
        if layer.q_norm is not None:
            q_NHTD = step.rotate(layer.q_norm(qkv_NTXD[:, :, :H]).transpose(1, 2))
            k_NKTD = step.rotate(layer.k_norm(qkv_NTXD[:, :, H:H + K]).transpose(1, 2))
        else:  # queries and keys rotated in one pass: the same elementwise products, half the calls
            q_NHTD, k_NKTD = step.rotate(qkv_NTXD[:, :, :H + K].transpose(1, 2)).split((H, K), dim=1)
        keys_NKSD, values_NKSD = step.keys_L[index], step.values_L[index]
        if isinstance(step.column, int):  # T columns from `column` on; attention reads up to the last of them
            keys_NKSD[:, :, step.column:step.end] = k_NKTD
            values_NKSD[:, :, step.column:step.end] = v_NKTD
        else:  # one column, at a position held on the device; attention reads the whole (masked) capacity
            keys_NKSD.index_copy_(2, step.column, k_NKTD.to(keys_NKSD.dtype))  # a slice assignment casts; this not
            values_NKSD.index_copy_(2, step.column, v_NKTD.to(values_NKSD.dtype))
        # Grouped heads stay grouped: the R = H / K query heads sharing a key head are one GEMM,
        # as plain bmm calls (torch.matmul of 4-d tensors adds expand and reshape calls).
        q_BRD = q_NHTD.reshape(N * K, H // K * T, D).to(keys_NKSD.dtype)
        contexts = [self._attend(q_BRD[low * K:high * K], keys_NKSD[low:high, :, first:step.end],
                                 values_NKSD[low:high, :, first:step.end], step.mask_BRS[low * K:high * K, :, first:])
                    for low, high, first in step.chunks]
        context_BRD = (contexts[0] if len(contexts) == 1 else torch.cat(contexts)).to(x_NTH.dtype)
        context_NTHD = context_BRD.view(N, H, T, D).transpose(1, 2).reshape(N, T, H * D)
        return layer.out(context_NTHD)

    def _attend(self, q_BRD: torch.Tensor, keys_NKSD: torch.Tensor, values_NKSD: torch.Tensor,
                mask_BRS: torch.Tensor) -> torch.Tensor:
        n, k, columns, d = keys_NKSD.shape
        # (n x k) batches of [columns, d] rows, a view of the cache (rows and heads merge into one stride).
        keys_BSD, values_BSD = keys_NKSD.reshape(n * k, columns, d), values_NKSD.reshape(n * k, columns, d)
        if keys_BSD.dtype == torch.float32:  # scaled and masked by the GEMM itself: one call, not four
            scores_BRS = torch.baddbmm(mask_BRS, q_BRD, keys_BSD.transpose(1, 2), alpha=self.scaling)
        else:  # a bfloat16 cache: the scores scaled and masked in float32
            scores_BRS = torch.bmm(q_BRD, keys_BSD.transpose(1, 2)).float().mul_(self.scaling).add_(mask_BRS)
        return torch.bmm(scores_BRS.softmax(dim=-1).to(values_BSD.dtype), values_BSD)


@dataclass
class _Step:
    """What every layer of one forward shares, made once per forward rather than once per layer:
    the rotary factors, the attention mask laid out as the scores are, the cache's per-layer views,
    and where the step writes (`column`, an int or a one-element device tensor) and reads up to (`end`)."""

    cos_N1TD: torch.Tensor
    signed_sin_N1TD: torch.Tensor
    mask_BRS: torch.Tensor
    keys_L: tuple[torch.Tensor, ...]
    values_L: tuple[torch.Tensor, ...]
    column: int | torch.Tensor
    end: int
    chunks: tuple[tuple[int, int, int], ...]  # (first row, row past the last, first column read)

    @staticmethod
    def of(decoder: FusedDecoder, hidden_NTH: torch.Tensor, positions_NT: torch.Tensor, mask_NTS: torch.Tensor,
           cache: KVCache, column: int | torch.Tensor, chunks: tuple[tuple[int, int, int], ...]) -> _Step:
        cos_NTD, sin_NTD = decoder.rotary(hidden_NTH, positions_NT)
        half = cos_NTD.shape[-1] // 2
        # rotate_half(x) * sin == roll(x, half) * (-sin | sin), bit for bit (negation is exact).
        signed_sin_NTD = torch.cat((-sin_NTD[..., :half], sin_NTD[..., half:]), dim=-1)
        N, T, S = mask_NTS.shape
        K, R = decoder.kv_heads, decoder.heads // decoder.kv_heads
        mask_BRS = mask_NTS[:, None, None].expand(N, K, R, T, S).reshape(N * K, R * T, S)
        end = column + T if isinstance(column, int) else cache.capacity
        return _Step(cos_NTD.unsqueeze(1), signed_sin_NTD.unsqueeze(1), mask_BRS, cache.keys_LNKSD.unbind(0),
                     cache.values_LNKSD.unbind(0), column, end, chunks)

    def rotate(self, x_NXTD: torch.Tensor) -> torch.Tensor:
        """transformers' rotary embedding (apply_rotary_pos_emb) of one tensor of heads."""
        return x_NXTD * self.cos_N1TD + x_NXTD.roll(self.cos_N1TD.shape[-1] // 2, dims=-1) * self.signed_sin_N1TD


def row_chunks(row_starts: Sequence[int], first_new: int, end: int) -> tuple[tuple[int, int, int], ...]:
    """Attention's runs of rows, (first row, row past the last, first column read), for rows whose
    valid columns begin at `row_starts` in a cache read up to `end`: runs of ATTENTION_CHUNK_ROWS rows
    when they read at most READ_SHARE of what one run from the earliest start would, else that one run.
    A start is clamped to `first_new`, the first column this step writes (every row attends to it)."""
    starts = [min(max(0, start), first_new) for start in row_starts]
    rows = len(starts)
    whole = ((0, rows, min(starts, default=0)),)
    chunks = tuple((low, min(low + ATTENTION_CHUNK_ROWS, rows), min(starts[low:low + ATTENTION_CHUNK_ROWS]))
                   for low in range(0, rows, ATTENTION_CHUNK_ROWS))
    read = sum((high - low) * (end - first) for low, high, first in chunks)
    return chunks if read <= READ_SHARE * rows * (end - whole[0][2]) else whole


def _rms_norm(norm: Any) -> Any:
    """The model's RMSNorm (x * rsqrt(mean(x^2) + eps) * weight, in float32 for the float32 residual
    stream) as one torch call, or the module itself where it is not that norm."""
    weight, eps = getattr(norm, "weight", None), getattr(norm, "variance_epsilon", None)
    if not type(norm).__name__.endswith("RMSNorm") or weight is None or eps is None or weight.dim() != 1:
        return norm
    weight_f32 = weight.detach().float()
    return functools.partial(F.rms_norm, normalized_shape=(weight.shape[0],), weight=weight_f32, eps=eps)


def _fused(*linears: Any) -> PackedLinear:
    weights, biases = zip(*(_effective_weight(linear) for linear in linears))
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases)])
    return PackedLinear(torch.cat(weights) if len(weights) > 1 else weights[0].contiguous(), bias)


def _effective_weight(linear: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight a (possibly LoRA-wrapped) linear applies: base + active adapters' deltas."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight.detach(), linear.bias.detach() if linear.bias is not None else None
    weight = base.weight.detach()
    if not getattr(linear, "disable_adapters", False) and not getattr(linear, "merged", False):
        for adapter in linear.active_adapters:
            if adapter in linear.lora_A:
                weight = weight + linear.get_delta_weight(adapter).to(weight.dtype)
    return weight, base.bias.detach() if base.bias is not None else None


@functools.cache
def _onednn_bf16() -> bool:
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
