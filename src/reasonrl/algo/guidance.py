"""Guidance's per-token losses and weight schedules (reasonrl.methods.guidance: the method).

Solutions come from the problem (`source="expert"`: `metadata[solution_field]`, e.g. GSM8K's worked
solutions) or from the policy's own earlier verified-correct samples (`source="replay"`). They
were not sampled from the current policy, so the per-token loss can correct for that:

- `weighting="nll"`: -log p, plain supervised learning;
- `weighting="phi"`: -sg(p (1 - p)) log p, CHORD-phi: tokens the policy already predicts (p ~ 1)
  or finds implausible (p ~ 0) get little weight, which keeps off-policy targets from collapsing
  the policy's entropy;
- `weighting="shaped"`: -p / (p + gamma), LUFFY's policy shaping (Yan et al. 2025, "Learning to
  Reason under Off-Policy Guidance"), a regularised importance weight whose gradient
  gamma p / (p + gamma)^2 grad log p emphasises low-probability tokens.

The weight mu_t is constant, or decays to 0 linearly or by a cosine over `decay_steps` (mixed mode).
"""

from __future__ import annotations

import math

import torch

WEIGHTINGS = ("nll", "phi", "shaped")
SCHEDULES = ("constant", "linear", "cosine")


def guidance_objective(logp_NT: torch.Tensor, old_logp_NT: torch.Tensor, advantages_NT: torch.Tensor,
                       mask_NT: torch.Tensor, *, weighting: str = "nll", gamma: float = 0.1,
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss on target tokens, scaled by `advantages_NT` (the guidance weight there);
    the learner's objective signature, so the learner's micro-batching applies unchanged."""
    p_NT = logp_NT.exp()
    if weighting == "nll":
        per_token_NT = -logp_NT
    elif weighting == "phi":
        per_token_NT = -(p_NT * (1 - p_NT)).detach() * logp_NT
    elif weighting == "shaped":
        per_token_NT = -p_NT / (p_NT + gamma)
    else:
        raise ValueError(f"guidance weighting {weighting!r} is not one of {WEIGHTINGS}")
    loss_NT = advantages_NT * per_token_NT * mask_NT
    target_tokens = mask_NT.sum().clamp(min=1)
    return loss_NT, {"guidance_nll": (-logp_NT.detach() * mask_NT).sum() / target_tokens}


def guidance_weight(step: int, weight: float, schedule: str, decay_steps: int) -> float:
    """mu at `step` (0-based): `weight`, constant or decaying to 0 at `decay_steps`."""
    if schedule not in SCHEDULES:
        raise ValueError(f"guidance schedule {schedule!r} is not one of {SCHEDULES}")
    if schedule == "constant":
        return weight
    progress = min(step / max(decay_steps, 1), 1.0)
    if schedule == "linear":
        return weight * (1 - progress)
    return weight * 0.5 * (1 + math.cos(math.pi * progress))
