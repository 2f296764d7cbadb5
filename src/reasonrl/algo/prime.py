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

Two defaults differ from Eq. 5, both against rewards for length (measured on reasoning-gym's
chain_sum, where the model starts at 2.6% and nearly every label is 0: with Eq. 5 every completion
grew to the length limit within 7 steps):
- baseline="start": Eq. 5's baseline term, (|y^i| - t + 1) * b with b = the others' mean per-token
  reward, is the return of a constant reward -b on every token: Eq. 5 is the policy gradient of
  sum_t (r_t - b), a bonus of -b per token, a reward for length whenever b < 0, which it is once the
  PRM has learned from mostly wrong answers (-0.02 to -0.1 per token there). It depends on the
  sample's own length, its future, so it is not a baseline. Here the baseline is subtracted at the
  first token only: the first token's return is r_phi(y^i) - 1/(K-1) sum_{j!=i} r_phi(y^j) (RLOO on
  the implicit outcome reward, the quantity the CE loss fits to the labels), a later token's is
  sum_{s>=t} r_phi(y_s^i). Nothing the sample does moves its baseline, so the expected gradient is
  that of the PRM's own reward sum_t r_t, and a token after which the PRM gives nothing earns 0.
  (Spreading the others' sequence reward over the sample's own tokens instead still credited the
  tail of long wrong answers: their first token's return was negative, their later tokens'
  positive.) baseline="token_mean" is Eq. 5.
- reward_last_token=False (verl's recipe/prime zeroes it too): the last completion token earns no
  process reward (it counts in the PRM's loss). Nearly every completion the PRM is shown ends with
  the end-of-sequence token, so CE steps on mostly wrong answers make that token's implicit reward
  the most negative of all (-0.25 against -0.024 for the others after the first step on
  chain_sum); counted, it makes each answer that stops worse than one cut at the length limit.
Differs from verl's recipe/prime also in: its process baseline is r_t * K/(K-1) - sum_j
mean_j/(K-1) (Eq. 5's, plus 1/(K-1) of the sample's own r_t - mean), its per-token means count the
zeroed last token, and it divides the process rewards by the batch's largest absolute return
(prime_norm=batch_norm), which the whitening makes nearly irrelevant.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from reasonrl.algo.advantages import last_token_positions

PROCESS_BASELINES = ("start", "token_mean")


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
                     baseline: str = "start", reward_last_token: bool = False, whiten: bool = True,
                     eps: float = 1e-8) -> torch.Tensor:
    """PRIME's per-token advantages (the module docstring's equation and its two defaults), (N, T): the
    groups are consecutive rows of `group_sizes` samples each (at least 2: a leave-one-out baseline)."""
    if baseline not in PROCESS_BASELINES:
        raise ValueError(f"unknown process baseline {baseline!r}: one of {', '.join(PROCESS_BASELINES)}")
    if sum(group_sizes) != process_NT.shape[0]:
        raise ValueError(f"group sizes {list(group_sizes)} do not add up to the batch's {process_NT.shape[0]} rows")
    if min(group_sizes) < 2:
        raise ValueError("PRIME's leave-one-out baselines need at least 2 samples per problem (rollout.group_size)")
    mask_NT = mask_NT.float()
    rewarded_NT = process_reward_mask(mask_NT, reward_last_token=reward_last_token)
    # What each sample is compared on: its per-token mean (Eq. 5), or its sequence reward (start).
    if baseline == "token_mean":
        compared_N = process_reward_means(process_NT, rewarded_NT)
    else:
        compared_N = (process_NT * rewarded_NT).sum(dim=1)
    compared_baseline_N, outcome_baseline_N = torch.empty_like(compared_N), torch.empty_like(compared_N)
    start = 0
    for size in group_sizes:
        rows = slice(start, start + size)
        compared_baseline_N[rows] = _leave_one_out_mean(compared_N[rows])
        outcome_baseline_N[rows] = _leave_one_out_mean(outcome_N[rows].float())
        start += size
    if baseline == "token_mean":
        process_returns_NT = _reverse_cumsum((process_NT - compared_baseline_N[:, None]) * rewarded_NT)
    else:
        first_NT = mask_NT * (mask_NT.cumsum(dim=1) == 1)
        process_returns_NT = _reverse_cumsum(process_NT * rewarded_NT) - compared_baseline_N[:, None] * first_NT
    advantages_NT = (process_weight * process_returns_NT
                     + outcome_weight * (outcome_N.float() - outcome_baseline_N)[:, None]) * mask_NT
    return masked_whiten(advantages_NT, mask_NT, eps=eps) if whiten else advantages_NT


def process_reward_mask(mask_NT: torch.Tensor, *, reward_last_token: bool = False) -> torch.Tensor:
    """The completion tokens that earn a process reward, (N, T): all of `mask_NT`'s, or all but each
    row's last (the module docstring says why)."""
    mask_NT = mask_NT.float()
    if reward_last_token:
        return mask_NT
    rewarded_NT = mask_NT.clone()
    rewarded_NT[torch.arange(mask_NT.shape[0], device=mask_NT.device), last_token_positions(mask_NT)] = 0.0
    return rewarded_NT


def process_reward_means(process_NT: torch.Tensor, rewarded_NT: torch.Tensor) -> torch.Tensor:
    """Each row's mean process reward per rewarded token, (N,); 0 for a row with none."""
    return (process_NT * rewarded_NT).sum(dim=1) / rewarded_NT.sum(dim=1).clamp(min=1)


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
