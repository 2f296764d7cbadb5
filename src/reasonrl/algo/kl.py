"""Per-token KL estimators between the policy and a frozen reference, from samples of the policy,
and the adaptive KL coefficient.

Schulman 2020, "Approximating KL Divergence": with log-ratio d = ref_logp - logp,
    k1 = -d,   k2 = d^2 / 2,   k3 = exp(d) - d - 1   (unbiased, always >= 0; GRPO's choice).

`AdaptiveKLCoef`: Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences",
sec. 2.2: after each step with measured KL, e = clip(KL / target - 1, -0.2, 0.2) and
beta <- beta * (1 + e * n / horizon), n the samples of the step. A fixed coefficient is the
same object with target 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def k1(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    return logp_NT - ref_logp_NT


def k2(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp_NT - logp_NT) ** 2


def k3(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    log_ratio_NT = ref_logp_NT - logp_NT
    return torch.exp(log_ratio_NT) - log_ratio_NT - 1.0


class AdaptiveKLCoef:
    """The KL coefficient: fixed (target 0), or adapted towards a target KL per step."""

    def __init__(self, initial: float, *, target: float = 0.0, horizon: int = 10_000):
        if target < 0 or horizon <= 0:
            raise ValueError(f"the KL target must be >= 0 and the horizon > 0, got {target} and {horizon}")
        self.value, self.target, self.horizon = initial, target, horizon

    def update(self, measured_kl: float, samples: int) -> float:
        """Adapt to the KL measured on a step of `samples` sequences; the new coefficient."""
        if self.target:
            error = min(max(measured_kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * samples / self.horizon
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
}
