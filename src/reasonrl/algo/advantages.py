"""Advantage estimators: rewards of a group of samples in, one advantage per sample out.

`grpo`: Shao et al. 2024, "DeepSeekMath" (GRPO), eq. in section 4.1.2 (outcome supervision):
A_i = (r_i - mean(r)) / std(r), std being the group's sample standard deviation (torch.std,
unbiased), plus `eps` so that a group of equal rewards gets advantage 0 instead of 0/0.
"""

from collections.abc import Callable

import torch


def grpo(rewards_BG: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages. rewards_BG: (B problems, G samples) -> adv_BG."""
    centered_BG = rewards_BG - rewards_BG.mean(dim=1, keepdim=True)
    if rewards_BG.shape[1] == 1:
        return torch.zeros_like(rewards_BG)
    std_B1 = rewards_BG.std(dim=1, keepdim=True)
    # A group of equal rewards carries no signal: advantage 0, even with eps = 0.
    return torch.where(std_B1 > 0, centered_BG / (std_B1 + eps), torch.zeros_like(centered_BG))


ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": grpo,
}
