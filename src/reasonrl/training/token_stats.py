"""Log-probability of the sampled token and entropy of the next-token distribution, from the
LM head's logits, in one pass over the vocabulary per direction.

With a 49k vocabulary the (loss tokens x vocabulary) logits are the largest tensors of an
update. Written as autograd ops, float32 upcast, temperature, log-softmax, gather and entropy
each read and write a full float32 copy, and log-softmax keeps one for backward: a dozen passes
over hundreds of megabytes that do no matrix work. Here the logits stay in their own dtype (the
bfloat16 of the head's matmul under autocast) and are the only thing saved; forward and backward
walk them a few rows at a time, so the float32 temporaries of a chunk stay in the CPU's cache,
and backward recomputes the softmax from the saved log-sum-exp. Fused cross-entropy kernels
(Liger's, Apple's cut cross-entropy) are Triton/CUDA only and do not give the entropy; hence this.

With z = logits / T, lse = log sum exp z, p = exp(z - lse):
    log p(y) = z_y - lse,   H = lse - sum_j p_j z_j,
    d log p(y) / dz = onehot(y) - p,   dH / dz = -p (log p + H).

`token_logprobs` applies it to a model and a batch: the decoder over the whole sequences, the LM
head only at the loss positions (`LossPositionStats`), then this pass over the vocabulary. For a
plain linear head the head's matmul joins the pass (`head_logprob_and_entropy`): a block of rows'
logits at a time, recomputed in backward, so a long sequence's (tokens x vocabulary) logits are
never held at once (400 MB in bfloat16 per 4096 tokens of a 49k vocabulary, and as much again for
their gradient); the cost is the head's forward matmul once more in backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from reasonrl.training.packing import VARLEN, PackedRow
from reasonrl.types import TrainBatch

CHUNK_ELEMENTS = 1 << 19  # float32 chunk of 2 MiB: within a core's L2 cache on this class of CPU


def logprob_and_entropy(logits_KV: torch.Tensor, targets_K: torch.Tensor,
                        temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """log softmax(logits / T)[target] and the entropy of softmax(logits / T), per row, (K,) each
    in float32 (float64 for float64 logits); differentiable in both outputs."""
    return _LogprobAndEntropy.apply(logits_KV, targets_K, float(temperature))


def _row_chunks(logits_KV: torch.Tensor) -> list[slice]:
    rows = max(1, CHUNK_ELEMENTS // max(1, logits_KV.shape[1]))
    return [slice(start, start + rows) for start in range(0, logits_KV.shape[0], rows)]


class _LogprobAndEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits_KV, targets_K, temperature):
        logp_K, entropy_K, lse_K = _softmax_stats(logits_KV, targets_K, temperature)
        ctx.save_for_backward(logits_KV, targets_K, lse_K, entropy_K)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an output nobody differentiates gets None, not zeros
        return logp_K, entropy_K

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp_K, grad_entropy_K):
        logits_KV, targets_K, lse_K, entropy_K = ctx.saved_tensors
        return _softmax_stats_grad(logits_KV, targets_K, lse_K, entropy_K, grad_logp_K, grad_entropy_K,
                                   ctx.temperature), None, None


def _softmax_stats(logits_KV: torch.Tensor, targets_K: torch.Tensor,
                   temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """log p(target), entropy and log-sum-exp of softmax(logits / T) per row, (K,) each."""
    dtype = torch.promote_types(logits_KV.dtype, torch.float32)
    logp_K = torch.empty(logits_KV.shape[0], dtype=dtype, device=logits_KV.device)
    entropy_K, lse_K = torch.empty_like(logp_K), torch.empty_like(logp_K)
    for rows in _row_chunks(logits_KV):
        # Shifted by the row's maximum, s = z - max: e = exp(s) is the only exp, p = e / sum e,
        # log p = s - log sum e, and H = log sum e - E_p[s] (no cancellation of large logits).
        max_C1 = (s_CV := _scaled(logits_KV[rows], temperature)).amax(dim=-1, keepdim=True)
        s_CV.sub_(max_C1)
        e_CV = s_CV.exp()
        sum_C = e_CV.sum(-1)
        log_sum_C = sum_C.log()
        lse_K[rows] = max_C1.squeeze(1) + log_sum_C
        logp_K[rows] = s_CV.gather(1, targets_K[rows, None]).squeeze(1) - log_sum_C
        entropy_K[rows] = log_sum_C - e_CV.mul_(s_CV).sum(-1) / sum_C
    return logp_K, entropy_K, lse_K


def _softmax_stats_grad(logits_KV: torch.Tensor, targets_K: torch.Tensor, lse_K: torch.Tensor,
                        entropy_K: torch.Tensor, grad_logp_K: torch.Tensor | None,
                        grad_entropy_K: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """The gradient with respect to the logits, in their dtype, from those of log p and H."""
    # d/dlogits = d/dz / T: the 1/T goes into the per-row coefficients.
    inverse_T = 1.0 / temperature
    g_K = (grad_logp_K if grad_logp_K is not None else torch.zeros_like(lse_K)).to(lse_K.dtype) * inverse_T
    grad_KV = torch.empty_like(logits_KV)
    for rows in _row_chunks(logits_KV):
        logp_CV = _scaled(logits_KV[rows], temperature).sub_(lse_K[rows, None])
        p_CV = logp_CV.exp()
        g_C1 = g_K[rows, None]
        if grad_entropy_K is not None:
            # g (onehot - p) + gH dH/dz, dH/dz = -p (log p + H)
            coefficient_CV = logp_CV.add_(entropy_K[rows, None]).mul_(-inverse_T * grad_entropy_K[rows, None])
            grad_CV = coefficient_CV.sub_(g_C1).mul_(p_CV)
        else:
            grad_CV = p_CV.mul_(-g_C1)
        grad_KV[rows] = grad_CV.scatter_add_(1, targets_K[rows, None], g_C1)
    return grad_KV


def head_logprob_and_entropy(hidden_KH: torch.Tensor, weight_VH: torch.Tensor, targets_K: torch.Tensor,
                             temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`logprob_and_entropy` of the logits hidden @ weight.T (a bias-free LM head), which are
    never all in memory: a block of rows at a time, recomputed in backward. Only the hidden
    states are saved. Under autocast the matmuls run in its dtype, as the head's would."""
    device_type = hidden_KH.device.type
    dtype = (torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type)
             else torch.promote_types(hidden_KH.dtype, weight_VH.dtype))
    return _HeadLogprobAndEntropy.apply(hidden_KH, weight_VH, targets_K, float(temperature), dtype)


# Rows of logits a block holds: 64M elements, 128 MiB in bfloat16 (1365 rows of a 49k vocabulary).
# Large enough that the head's matmuls stay efficient, small against the whole (K x V) logits of a
# long sequence (400 MB per 4096 tokens).
HEAD_BLOCK_ELEMENTS = 1 << 26


# Logits above which the head runs fused: 128M elements, 256 MiB in bfloat16 (2730 loss tokens of a
# 49k vocabulary). Below it a packed micro-batch (train.micro_batch_positions = 2048) keeps its
# logits for backward, which costs less time than the fused path's second head matmul.
FUSED_HEAD_MIN_ELEMENTS = 1 << 27


def _head_blocks(rows: int, vocabulary: int) -> list[slice]:
    size = max(1, HEAD_BLOCK_ELEMENTS // max(1, vocabulary))
    return [slice(start, start + size) for start in range(0, rows, size)]


class _HeadLogprobAndEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_KH, weight_VH, targets_K, temperature, dtype):
        with torch.autocast(hidden_KH.device.type, enabled=False):
            weight_cast_VH = weight_VH.to(dtype)
            stats = [_softmax_stats(hidden_KH[rows].to(dtype) @ weight_cast_VH.T, targets_K[rows], temperature)
                     for rows in _head_blocks(hidden_KH.shape[0], weight_VH.shape[0])]
        logp_K, entropy_K, lse_K = (torch.cat(parts) for parts in zip(*stats)) if stats else (
            hidden_KH.new_empty(0, dtype=torch.float32),) * 3
        ctx.save_for_backward(hidden_KH, weight_VH, targets_K, lse_K, entropy_K)
        ctx.temperature, ctx.dtype = temperature, dtype
        ctx.set_materialize_grads(False)
        return logp_K, entropy_K

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp_K, grad_entropy_K):
        hidden_KH, weight_VH, targets_K, lse_K, entropy_K = ctx.saved_tensors
        wants_hidden, wants_weight = ctx.needs_input_grad[:2]
        with torch.autocast(hidden_KH.device.type, enabled=False):
            weight_cast_VH = weight_VH.to(ctx.dtype)
            grad_hidden_KH = torch.empty_like(hidden_KH) if wants_hidden else None
            grad_weight_VH = torch.zeros_like(weight_VH) if wants_weight else None
            for rows in _head_blocks(hidden_KH.shape[0], weight_VH.shape[0]):
                h_CH = hidden_KH[rows].to(ctx.dtype)
                grad_CV = _softmax_stats_grad(
                    h_CH @ weight_cast_VH.T, targets_K[rows], lse_K[rows], entropy_K[rows],
                    None if grad_logp_K is None else grad_logp_K[rows],
                    None if grad_entropy_K is None else grad_entropy_K[rows], ctx.temperature)
                if wants_hidden:
                    grad_hidden_KH[rows] = grad_CV @ weight_cast_VH
                if wants_weight:
                    grad_weight_VH += grad_CV.T @ h_CH
        return grad_hidden_KH, grad_weight_VH, None, None, None


def _scaled(logits_CV: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T as a new tensor of at least float32 precision (never a view of the saved
    logits: callers write in place)."""
    z_CV = logits_CV.to(torch.promote_types(logits_CV.dtype, torch.float32), copy=True)
    return z_CV.mul_(1.0 / temperature) if temperature != 1.0 else z_CV


def token_logprobs(model: Any, batch: TrainBatch, temperature: float, with_entropy: bool = False,
                   entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(next token) from logits / temperature at the loss positions of the batch (zero
    elsewhere), (N, T-1); and the entropy of that distribution there when asked (with a
    gradient only when `entropy_grad`, for an entropy bonus).

    Only loss positions go through the LM head and the float32 softmax: prompt positions need
    neither, and with a 49k vocabulary the head and its softmax are a large share of the work.
    """
    where_NT = batch.loss_mask_NT.bool()
    logp_K, entropy_K = LossPositionStats.of(model)(batch.input_ids_NT, batch.attention_mask_NT, where_NT,
                                                    temperature if temperature > 0 else 1.0)
    if not (with_entropy and entropy_grad):
        entropy_K = entropy_K.detach()
    return scatter_to_mask(where_NT, logp_K), scatter_to_mask(where_NT, entropy_K) if with_entropy else None


class LossPositionStats(torch.nn.Module):
    """A causal LM's log-probability of each loss token and the entropy of the distribution it
    was drawn from, (K,) each: the decoder over the whole sequences, then the LM head and its
    softmax on the hidden states that predict a loss token only.

    When the (K x V) logits would be large (long sequences), a bias-free linear head (the usual
    one) runs fused with the softmax (`head_logprob_and_entropy`), so the logits are never all
    held. Otherwise, and for any other head (LoRA-wrapped, biased, soft-capped), the head's
    logits go to `logprob_and_entropy`, saved for backward rather than computed twice.

    As a module of its own it gives FSDP2 (`fully_shard`) one forward to hook for the weights
    outside the decoder layers (embeddings, final norm, LM head), which calling the decoder and
    the head one after the other would bypass."""

    def __init__(self, policy: Any):
        super().__init__()
        self.policy = policy

    @staticmethod
    def of(model: Any) -> LossPositionStats:
        return model if isinstance(model, LossPositionStats) else LossPositionStats(model)

    @property
    def config(self) -> Any:
        return self.policy.config

    def set_attn_implementation(self, implementation: str) -> None:
        self.policy.set_attn_implementation(implementation)

    def forward(self, input_ids_NT: torch.Tensor, attention_NT: torch.Tensor, where_NT: torch.Tensor,
                temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        hidden_KH = self.hidden_at(input_ids_NT, attention_NT, where_NT)
        targets_K = input_ids_NT[:, 1:][where_NT]
        head = self.policy.get_output_embeddings()
        softcap = getattr(self.config, "final_logit_softcapping", None)
        fusable = type(head) is torch.nn.Linear and head.bias is None and not softcap
        if fusable and targets_K.numel() * head.weight.shape[0] > FUSED_HEAD_MIN_ELEMENTS:
            return head_logprob_and_entropy(hidden_KH, head.weight, targets_K, temperature)
        logits_KV = head(hidden_KH)
        if softcap:
            logits_KV = torch.tanh(logits_KV.float() / softcap) * softcap
        return logprob_and_entropy(logits_KV, targets_K, temperature)

    def hidden_at(self, input_ids_NT: torch.Tensor, attention_NT: torch.Tensor, where_NT: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden states at the positions that predict a loss token, (K, H)."""
        decoder = self.policy.get_decoder()
        if self.config._attn_implementation == VARLEN:  # set by attention_for: one row, no padding
            row = PackedRow.of(attention_NT, input_ids_NT)
            hidden_1LH = decoder(input_ids=row.pack(input_ids_NT), position_ids=row.positions_1L, use_cache=False,
                                 packed_row=row).last_hidden_state
            return hidden_1LH[0, row.index_of(where_NT)]
        hidden_NTH = decoder(input_ids=input_ids_NT, attention_mask=attention_NT,
                             position_ids=(attention_NT.cumsum(1) - 1).clamp(min=0)).last_hidden_state
        return hidden_NTH[:, :-1][where_NT]


def scatter_to_mask(where_NT: torch.Tensor, values_K: torch.Tensor) -> torch.Tensor:
    """The K values at the True positions of `where_NT`, zero elsewhere, (N, T)."""
    return torch.zeros(where_NT.shape, dtype=values_K.dtype, device=values_K.device).masked_scatter(where_NT, values_K)
