"""Per-token policy objectives: log-probs and advantages in, a per-token loss to minimise out.

Every objective has the signature
    fn(logp_NT, old_logp_NT, adv_NT, mask_NT, **hyper) -> (loss_NT, metrics)
with `metrics` a dict of scalar tensors averaged over the masked tokens (e.g. clip fraction).
Aggregating the per-token loss into a scalar is the job of aggregation.py.

`ppo_clip`: Schulman et al. 2017, "Proximal Policy Optimization", eq. 7, with separate lower and
upper clip ranges (Yu et al. 2025, "DAPO", clip-higher): with ratio rho = exp(logp - old_logp),
    loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A).
`reinforce`: the vanilla policy gradient, loss = -A * logp (REINFORCE, Williams 1992).
"""

from collections.abc import Callable

import torch

Metrics = dict[str, torch.Tensor]


def masked_mean(x_NT: torch.Tensor, mask_NT: torch.Tensor) -> torch.Tensor:
    return (x_NT * mask_NT).sum() / mask_NT.sum().clamp(min=1)


def ppo_clip(
    logp_NT: torch.Tensor,
    old_logp_NT: torch.Tensor,
    adv_NT: torch.Tensor,
    mask_NT: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate with asymmetric clip range. All inputs (N, T); returns loss_NT."""
    ratio_NT = torch.exp(logp_NT - old_logp_NT)
    unclipped_NT = ratio_NT * adv_NT
    clipped_NT = torch.clamp(ratio_NT, 1.0 - clip_low, 1.0 + clip_high) * adv_NT
    loss_NT = -torch.minimum(unclipped_NT, clipped_NT)
    with torch.no_grad():
        was_clipped_NT = (clipped_NT < unclipped_NT).float()
        metrics = {
            "clip_frac": masked_mean(was_clipped_NT, mask_NT),
            "ratio_mean": masked_mean(ratio_NT, mask_NT),
        }
    return loss_NT, metrics


def reinforce(
    logp_NT: torch.Tensor,
    old_logp_NT: torch.Tensor,
    adv_NT: torch.Tensor,
    mask_NT: torch.Tensor,
) -> tuple[torch.Tensor, Metrics]:
    """Vanilla policy gradient: loss = -A * logp (old_logp unused: no importance ratio)."""
    return -adv_NT * logp_NT, {}


OBJECTIVES: dict[str, Callable[..., tuple[torch.Tensor, Metrics]]] = {
    "ppo_clip": ppo_clip,
    "reinforce": reinforce,
}
