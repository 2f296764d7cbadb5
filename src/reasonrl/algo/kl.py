"""Per-token KL estimators between the policy and a frozen reference, from samples of the policy.

Schulman 2020, "Approximating KL Divergence": with log-ratio d = ref_logp - logp,
    k1 = -d,   k2 = d^2 / 2,   k3 = exp(d) - d - 1   (unbiased, always >= 0; GRPO's choice).
"""

from collections.abc import Callable

import torch


def k1(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    return logp_NT - ref_logp_NT


def k2(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp_NT - logp_NT) ** 2


def k3(logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor) -> torch.Tensor:
    log_ratio_NT = ref_logp_NT - logp_NT
    return torch.exp(log_ratio_NT) - log_ratio_NT - 1.0


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
}
