"""The critic's loss: PPO's clipped value regression (Schulman et al. 2017, as used for language
models by Ouyang et al. 2022 and verl): with returns R (the lambda-returns of advantages.py) and
the values V_old before the update,
    loss = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -value_clip, value_clip) - R)^2),
so one update cannot move a value further than `value_clip` from where it was to fit R.
"""

from __future__ import annotations

import torch

from reasonrl.algo.objectives import Metrics, masked_mean


def clipped_value_loss(values_NT: torch.Tensor, old_values_NT: torch.Tensor, returns_NT: torch.Tensor,
                       mask_NT: torch.Tensor, *, value_clip: float = 0.2) -> tuple[torch.Tensor, Metrics]:
    """Per-token clipped value loss. All (N, T) -> loss_NT."""
    clipped_NT = old_values_NT + (values_NT - old_values_NT).clamp(-value_clip, value_clip)
    unclipped_loss_NT = (values_NT - returns_NT) ** 2
    clipped_loss_NT = (clipped_NT - returns_NT) ** 2
    with torch.no_grad():
        metrics = {"value_clip_frac": masked_mean((clipped_loss_NT > unclipped_loss_NT).float(), mask_NT),
                   "value_mean": masked_mean(values_NT, mask_NT)}
    return 0.5 * torch.maximum(unclipped_loss_NT, clipped_loss_NT), metrics
