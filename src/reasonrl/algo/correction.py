"""Off-policy corrections between the rollout engine and the learner.

The engine samples with pi_sampler (its own kernels, a stale copy of the weights under
asynchronous training, a replayed sample's old policy); the learner scores the same tokens with
pi_old, its weights before the update. Per token, r_t = pi_old(y_t) / pi_sampler(y_t) =
exp(old_logp_t - sampling_logp_t); per sequence, the product of its tokens' ratios, or their
geometric mean. Two ways to correct for r != 1, usable together:

- `truncated_is_weights` (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training"): multiply each token's loss by sg(min(r, cap)), per token or with the
  sequence's ratio.
- `rejection_mask` (masked importance sampling, MIS, a.k.a. rejection sampling; Yao et al.'s
  follow-up and verl's rollout correction): drop the samples whose ratio lies outside
  [low, high], per token, per sequence (the product of the token ratios) or per sequence by the
  geometric mean of its token ratios, exp(mean_t log r_t), which does not grow with the length.
  A dropped token leaves the loss *and its normaliser*: the learner multiplies the loss mask by
  the keep mask before the optimizer step counts its tokens and sequences, so the kept tokens'
  gradient is not diluted by tokens that contribute nothing (Learner.update).
- IcePop (Ling Team 2025, Ring-1T, "Every Step Evolves"): M(r) = r inside [alpha, beta], 0 outside,
  per token, i.e. a token rejection mask on [alpha, beta] together with token TIS capped at beta
  (algo.mis=token, algo.mis_low=0.5, algo.mis_high=5, algo.tis=token, algo.tis_cap=5).

`rejection_stats` describes the ratios a batch had before masking: the shares of tokens and
sequences masked and quantiles of the token ratio.
"""

from __future__ import annotations

import math

import torch

REJECTION_LEVELS = ("token", "sequence", "geometric")


def _log_ratio(old_logp_NT: torch.Tensor, sampling_logp_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    return (old_logp_NT - sampling_logp_NT).detach() * mask_NT


def truncated_is_weights(old_logp_NT: torch.Tensor, sampling_logp_NT: torch.Tensor, mask_NT: torch.Tensor, *,
                         cap: float = 2.0, level: str = "token") -> torch.Tensor:
    """min(pi_learner / pi_sampler, cap) per token, or per sequence from the summed log-ratio
    (broadcast over its tokens); 0 off the mask, no gradient. (N, T) -> w_NT."""
    log_ratio_NT = _log_ratio(old_logp_NT, sampling_logp_NT, mask_NT)
    if level == "sequence":
        log_ratio_NT = log_ratio_NT.sum(dim=1, keepdim=True).expand_as(mask_NT)
    elif level != "token":
        raise ValueError(f"truncated importance sampling level must be 'token' or 'sequence', got {level!r}")
    return torch.exp(log_ratio_NT.clamp(max=math.log(cap))) * mask_NT


def rejection_mask(old_logp_NT: torch.Tensor, sampling_logp_NT: torch.Tensor, mask_NT: torch.Tensor, *,
                   level: str = "token", low: float = 0.5, high: float = 2.0) -> torch.Tensor:
    """1 where a token is kept, 0 where it is masked or off `mask_NT`: kept when its ratio (token,
    sequence product, or sequence geometric mean, by `level`) lies in [low, high]. (N, T) -> keep_NT."""
    if level not in REJECTION_LEVELS:
        raise ValueError(f"rejection level must be one of {', '.join(REJECTION_LEVELS)}, got {level!r}")
    if not 0.0 <= low <= 1.0 <= high:
        raise ValueError(f"the kept ratio band [{low}, {high}] must contain 1 (low <= 1 <= high)")
    log_ratio_NT = _log_ratio(old_logp_NT, sampling_logp_NT, mask_NT)
    if level == "sequence":
        log_ratio_NT = log_ratio_NT.sum(dim=1, keepdim=True)
    elif level == "geometric":
        log_ratio_NT = log_ratio_NT.sum(dim=1, keepdim=True) / mask_NT.sum(dim=1, keepdim=True).clamp(min=1)
    log_low = math.log(low) if low > 0 else -math.inf
    keep = (log_ratio_NT >= log_low) & (log_ratio_NT <= math.log(high))
    return keep.to(mask_NT.dtype).expand_as(mask_NT) * mask_NT


def rejection_stats(old_logp_NT: torch.Tensor, sampling_logp_NT: torch.Tensor, mask_NT: torch.Tensor,
                    keep_NT: torch.Tensor, prefix: str = "rollout/") -> dict[str, float]:
    """Shares of the tokens and sequences masked (a sequence counts when all its tokens are) and
    the 5/50/95% quantiles and maximum of the token ratio, over the tokens of `mask_NT`."""
    on = mask_NT.bool()
    ratios = torch.exp(_log_ratio(old_logp_NT, sampling_logp_NT, mask_NT)[on]).double()
    if ratios.numel() == 0:
        return {}
    quantiles = torch.quantile(ratios, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
    sequences = on.any(dim=1)
    dropped = sequences & ~(keep_NT.bool() & on).any(dim=1)
    return {f"{prefix}masked_token_frac": 1.0 - float(keep_NT[on].sum()) / ratios.numel(),
            f"{prefix}masked_seq_frac": float(dropped.sum()) / max(int(sequences.sum()), 1),
            f"{prefix}is_ratio_p05": quantiles[0], f"{prefix}is_ratio_p50": quantiles[1],
            f"{prefix}is_ratio_p95": quantiles[2], f"{prefix}is_ratio_max": float(ratios.max())}
