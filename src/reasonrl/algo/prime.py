"""PRIME's implicit process reward (Cui et al. 2025, "Process Reinforcement through Implicit
Rewards", arXiv 2502.01456): pure tensor math.

An implicit PRM pi_phi is a causal LM; with a frozen reference pi_ref its reward of token t is
    r_phi(y_t) = beta * (log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t)),
and their sum over the completion is its sequence-level reward (an outcome reward model). It is
trained online on the policy's rollouts with the outcome label y in [0, 1] only (the paper's CE loss):
    L = -[y log sigmoid(beta * sum_t (log pi_phi - log pi_ref)) + (1 - y) log(1 - sigmoid(...))].
Advantages (the paper's Eq. 5, RLOO on each reward source, gamma = 1): for sample i of K,
    A_t^i = w_p * sum_{s>=t} [r_phi(y_s^i) - 1/(K-1) sum_{j!=i} r_phi(y^j) / |y^j|]
            + w_o * [r_o(y^i) - 1/(K-1) sum_{j!=i} r_o(y^j)],
whitened over the batch's tokens as in verl's recipe/prime (masked_whiten). The weights w_p, w_o
are verl's reward_dpo_coef and reward_gt_coef (5 and 5 there: the same 1:1 ratio).
Differs from verl's recipe/prime: its process baseline is r_t * K/(K-1) - sum_j mean_j/(K-1) (it
also subtracts 1/(K-1) of the sample's own mean and adds back 1/(K-1) of r_t), it drops the process
reward of the last token, and it divides the process rewards by the batch's largest absolute
return (prime_norm=batch_norm); here the paper's equation, on every completion token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def implicit_process_rewards(prm_logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor, mask_NT: torch.Tensor, *,
                             beta: float) -> torch.Tensor:
    """r_t = beta * (log pi_phi(y_t) - log pi_ref(y_t)) on the completion tokens, zero elsewhere, (N, T)."""
    return beta * (prm_logp_NT - ref_logp_NT) * mask_NT


def implicit_prm_loss(prm_logp_NT: torch.Tensor, ref_logp_NT: torch.Tensor, mask_NT: torch.Tensor,
                      labels_N: torch.Tensor, *, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The CE loss of each sequence, (N,), on its implicit outcome reward's logit
    beta * sum_t (log pi_phi - log pi_ref) against its label in [0, 1]; and those logits, (N,)."""
    if ((labels_N < 0) | (labels_N > 1)).any():
        raise ValueError(f"the implicit PRM's labels are outcome rewards in [0, 1]; got {labels_N.tolist()} "
                         "(give the reward a 'correct' component in [0, 1]: it is the label when present)")
    logits_N = beta * ((prm_logp_NT - ref_logp_NT) * mask_NT).sum(dim=1)
    return F.binary_cross_entropy_with_logits(logits_N, labels_N.to(logits_N.dtype), reduction="none"), logits_N


def sign_accuracy(logits_N: torch.Tensor, labels_N: torch.Tensor) -> torch.Tensor:
    """Per sequence: 1 where the implicit reward's sign says what the label does (positive for a label
    above 1/2), 0 where it says the opposite, 1/2 where it is 0 (no opinion: the untrained PRM), (N,)."""
    predicted_N = torch.sign(logits_N)
    wanted_N = torch.where(labels_N > 0.5, 1.0, -1.0)
    return torch.where(predicted_N == 0, 0.5, (predicted_N == wanted_N).float())


def prime_advantages(process_NT: torch.Tensor, outcome_N: torch.Tensor, mask_NT: torch.Tensor,
                     group_sizes: Sequence[int], *, process_weight: float = 1.0, outcome_weight: float = 1.0,
                     whiten: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """PRIME's per-token advantages (the module docstring's equation), (N, T): the groups are
    consecutive rows of `group_sizes` samples each (at least 2: a leave-one-out baseline)."""
    if sum(group_sizes) != process_NT.shape[0]:
        raise ValueError(f"group sizes {list(group_sizes)} do not add up to the batch's {process_NT.shape[0]} rows")
    if min(group_sizes) < 2:
        raise ValueError("PRIME's leave-one-out baselines need at least 2 samples per problem (rollout.group_size)")
    mask_NT = mask_NT.float()
    lengths_N = mask_NT.sum(dim=1).clamp(min=1)
    process_mean_N = (process_NT * mask_NT).sum(dim=1) / lengths_N
    process_baseline_N, outcome_baseline_N = torch.empty_like(process_mean_N), torch.empty_like(process_mean_N)
    start = 0
    for size in group_sizes:
        rows = slice(start, start + size)
        process_baseline_N[rows] = _leave_one_out_mean(process_mean_N[rows])
        outcome_baseline_N[rows] = _leave_one_out_mean(outcome_N[rows].float())
        start += size
    process_returns_NT = _reverse_cumsum((process_NT - process_baseline_N[:, None]) * mask_NT)
    advantages_NT = (process_weight * process_returns_NT
                     + outcome_weight * (outcome_N.float() - outcome_baseline_N)[:, None]) * mask_NT
    return masked_whiten(advantages_NT, mask_NT, eps=eps) if whiten else advantages_NT


def masked_whiten(values_NT: torch.Tensor, mask_NT: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """(values - mean) / sqrt(var + eps) over the masked tokens (unbiased variance), zero off the mask."""
    mask_NT = mask_NT.float()
    count = mask_NT.sum()
    mean = (values_NT * mask_NT).sum() / count
    variance = (((values_NT - mean) ** 2) * mask_NT).sum() / (count - 1).clamp(min=1)
    return (values_NT - mean) * torch.rsqrt(variance + eps) * mask_NT


def _leave_one_out_mean(values_G: torch.Tensor) -> torch.Tensor:
    return (values_G.sum() - values_G) / (values_G.numel() - 1)


def _reverse_cumsum(values_NT: torch.Tensor) -> torch.Tensor:
    """sum_{s >= t} values[s]: the undiscounted return from each token."""
    return values_NT.flip(dims=[1]).cumsum(dim=1).flip(dims=[1])
