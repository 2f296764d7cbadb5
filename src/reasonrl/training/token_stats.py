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
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

CHUNK_ELEMENTS = 1 << 19  # float32 chunk of 2 MB: within a core's L2 cache on this class of CPU


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
        ctx.save_for_backward(logits_KV, targets_K, lse_K, entropy_K)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an output nobody differentiates gets None, not zeros
        return logp_K, entropy_K

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp_K, grad_entropy_K):
        logits_KV, targets_K, lse_K, entropy_K = ctx.saved_tensors
        # d/dlogits = d/dz / T: the 1/T goes into the per-row coefficients.
        inverse_T = 1.0 / ctx.temperature
        g_K = (grad_logp_K if grad_logp_K is not None else torch.zeros_like(lse_K)).to(lse_K.dtype) * inverse_T
        grad_KV = torch.empty_like(logits_KV)
        for rows in _row_chunks(logits_KV):
            logp_CV = _scaled(logits_KV[rows], ctx.temperature).sub_(lse_K[rows, None])
            p_CV = logp_CV.exp()
            g_C1 = g_K[rows, None]
            if grad_entropy_K is not None:
                # g (onehot - p) + gH dH/dz, dH/dz = -p (log p + H)
                coefficient_CV = logp_CV.add_(entropy_K[rows, None]).mul_(-inverse_T * grad_entropy_K[rows, None])
                grad_CV = coefficient_CV.sub_(g_C1).mul_(p_CV)
            else:
                grad_CV = p_CV.mul_(-g_C1)
            grad_KV[rows] = grad_CV.scatter_add_(1, targets_K[rows, None], g_C1)
        return grad_KV, None, None


def _scaled(logits_CV: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T as a new tensor of at least float32 precision (never a view of the saved
    logits: callers write in place)."""
    z_CV = logits_CV.to(torch.promote_types(logits_CV.dtype, torch.float32), copy=True)
    return z_CV.mul_(1.0 / temperature) if temperature != 1.0 else z_CV
