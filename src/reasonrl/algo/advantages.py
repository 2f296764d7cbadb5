"""Advantage estimators: how rewards become the weight of each sample's (or token's) gradient.

Three kinds, told apart by their declared level (reasonrl.spec; each estimator declares the inputs
and knobs it takes beside its fixed arguments):

* group estimators, `fn(rewards_BG, **knobs) -> adv_BG`: B problems x G samples of each, one
  outcome reward per sample; optional inputs they may name: `lengths_BG` (completion tokens),
  `greedy_rewards_B` (reward of each problem's greedy completion), `eps`.
* token estimators, `fn(token_rewards_NT, mask_NT, **knobs) -> adv_NT`: a reward per completion
  token (the outcome reward on the last token, minus a KL penalty per token when the KL is put
  in the reward), with `values_NT` from a critic for `gae`.
* tree estimators (reasonrl.algo.tree: `treerl`) take one group's rewards with the shape of the
  tree it was sampled as and give each tree node (a segment of tokens) an advantage.

Papers and equations (r_i: reward of sample i of a group of G; mean/std over the group):
- `grpo`: Shao et al. 2024, "DeepSeekMath", 4.1.2: A_i = (r_i - mean(r)) / (std(r) + eps),
  std the unbiased sample standard deviation (torch.std).
- `grpo_batch_std`: group mean, but the std of every reward in the batch (Liu et al. 2025,
  "Part I: Tricks or Traps", group-level mean with batch-level std):
  A_i = (r_i - mean_group(r)) / (std_batch(r) + eps).
- `dr_grpo`: Liu et al. 2025, "Understanding R1-Zero-Like Training" (Dr. GRPO): A_i = r_i - mean(r).
- `rloo`: Ahmadian et al. 2024, "Back to Basics": A_i = r_i - 1/(G-1) sum_{j != i} r_j
  = G/(G-1) (r_i - mean(r)).
- `reinforce_pp_baseline`: Hu et al. 2025, "REINFORCE++": A_i = r_i - mean(r), then whitened over
  the batch's completion tokens: (A - mean_tok(A)) / sqrt(var_tok(A) + 1e-8), each sample counted
  once per completion token when `lengths_BG` is given (as its tokens carry it), else once.
- `remax`: Li et al. 2023, "ReMax": A_i = r_i - r(greedy completion of the same prompt).
- `opo`: Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline": the variance-minimising
  baseline under sequence-level gradients, b = sum_i |y_i| r_i / sum_i |y_i|; A_i = r_i - b.
- `gdpo`: Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
  Multi-reward RL Optimization": with a reward of several components (e.g. correctness + format
  + length), each component k is normalised within the group on its own,
  A_k = (r_k - mean(r_k)) / (std(r_k) + eps), the weighted sum A = sum_k w_k A_k is then
  normalised over the batch, (A - mean) / (std + eps). GRPO on the weighted total collapses
  distinct combinations into one advantage and lets a component with a large spread drown the
  others; here each weighs by its weight only. Inputs: `components_KBG` (each component's unweighted values, as the
  reward logged them) and `weights_K`.
- `maxrl`: Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning" (MaxRL), for 0/1
  rewards: A_i = (r_i - mean(r)) / mean(r), 0 when no sample of the group is right. With p the
  group's pass rate, E[A grad log pi] = grad p / p = grad log p: the gradient of the log-likelihood
  of success, which weighs hard problems (small p) up, where GRPO's 1/std weighs both ends alike.
- `reinforce_pp`: Hu et al. 2025, "REINFORCE++": token reward r_t (outcome on the last token,
  -beta * KL_t on every token), return G_t = sum_{s >= t} gamma^(s-t) r_s, whitened over every
  completion token of the batch.
- `gae`: Schulman et al. 2016, "Generalized Advantage Estimation": delta_t = r_t + gamma V_{t+1}
  - V_t (V after the last token = 0), A_t = sum_l (gamma lam)^l delta_{t+l}, whitened over the
  batch's completion tokens as PPO does (Ouyang et al. 2022). `lambda_returns` gives the critic's
  regression target A_t + V_t (before whitening).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reasonrl.algo.tree import treerl
from reasonrl.spec import declare, spec_of

WHITEN_EPS = 1e-8


@declare(knobs={"eps": "algo.adv_eps"}, min_group_size=2)
def grpo(rewards_BG: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages. rewards_BG: (B problems, G samples) -> adv_BG."""
    if rewards_BG.shape[1] == 1:
        return torch.zeros_like(rewards_BG)
    return _divide_nonzero(_group_centered(rewards_BG), rewards_BG.std(dim=1, keepdim=True), eps)


@declare(knobs={"eps": "algo.adv_eps"}, min_group_size=2)
def grpo_batch_std(rewards_BG: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """Group-centred, divided by the std of all B*G rewards. (B, G) -> (B, G)."""
    if rewards_BG.numel() == 1:
        return torch.zeros_like(rewards_BG)
    return _divide_nonzero(_group_centered(rewards_BG), rewards_BG.std(), eps)


@declare(min_group_size=2)
def dr_grpo(rewards_BG: torch.Tensor) -> torch.Tensor:
    """Group mean subtracted, no division. (B, G) -> (B, G)."""
    return _group_centered(rewards_BG)


@declare(min_group_size=2)
def rloo(rewards_BG: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: each sample against the mean of the other G-1. (B, G) -> (B, G)."""
    group = rewards_BG.shape[1]
    if group == 1:
        return torch.zeros_like(rewards_BG)
    others_mean_BG = (rewards_BG.sum(dim=1, keepdim=True) - rewards_BG) / (group - 1)
    return rewards_BG - others_mean_BG


@declare(inputs=("lengths_BG",), min_group_size=2)
def reinforce_pp_baseline(rewards_BG: torch.Tensor, *, lengths_BG: torch.Tensor | None = None) -> torch.Tensor:
    """Group mean subtracted, then whitened over the batch (token-weighted with `lengths_BG`).
    (B, G) -> (B, G)."""
    centered_BG = _group_centered(rewards_BG)
    weights_BG = torch.ones_like(rewards_BG) if lengths_BG is None else lengths_BG.to(rewards_BG.dtype)
    return whiten(centered_BG, weights_BG)


@declare(inputs=("greedy_rewards_B",))
def remax(rewards_BG: torch.Tensor, *, greedy_rewards_B: torch.Tensor) -> torch.Tensor:
    """The greedy completion's reward as the baseline. (B, G), (B,) -> (B, G)."""
    return rewards_BG - greedy_rewards_B.to(rewards_BG.dtype)[:, None]


@declare(inputs=("lengths_BG",), min_group_size=2)
def opo(rewards_BG: torch.Tensor, *, lengths_BG: torch.Tensor) -> torch.Tensor:
    """Length-weighted group baseline b = sum |y| r / sum |y|. (B, G), lengths (B, G) -> (B, G)."""
    lengths_BG = lengths_BG.to(rewards_BG.dtype)
    baseline_B1 = (lengths_BG * rewards_BG).sum(dim=1, keepdim=True) / lengths_BG.sum(dim=1, keepdim=True).clamp(min=1)
    return rewards_BG - baseline_B1


@declare(inputs=("components_KBG", "weights_K"), knobs={"eps": "algo.adv_eps"}, min_group_size=2)
def gdpo(rewards_BG: torch.Tensor, *, components_KBG: torch.Tensor, weights_K: torch.Tensor,
         eps: float = 1e-6) -> torch.Tensor:
    """Each reward component group-normalised on its own, weighted, summed, then normalised over
    the batch. rewards_BG (the weighted totals) is not read. (K, B, G), (K,) -> (B, G)."""
    if components_KBG.shape[0] != weights_K.shape[0]:
        raise ValueError(f"{components_KBG.shape[0]} reward components for {weights_K.shape[0]} weights")
    summed_BG = sum(weight * grpo(component_BG, eps=eps)
                    for component_BG, weight in zip(components_KBG.to(rewards_BG.dtype), weights_K.tolist()))
    if rewards_BG.numel() == 1:
        return torch.zeros_like(rewards_BG)
    return _divide_nonzero(summed_BG - summed_BG.mean(), summed_BG.std(), eps)


@declare(min_group_size=2)
def maxrl(rewards_BG: torch.Tensor) -> torch.Tensor:
    """Group-centred, divided by the group's mean reward (its pass rate for 0/1 rewards); 0 where
    that mean is 0. (B, G) -> (B, G)."""
    mean_B1 = rewards_BG.mean(dim=1, keepdim=True)
    if (rewards_BG < 0).any():
        raise ValueError("maxrl's advantage is for rewards in [0, 1] (a pass rate in the denominator); "
                         "these include negative rewards")
    return _divide_nonzero(rewards_BG - mean_B1, mean_B1, eps=0.0)


@declare(level="token", knobs={"gamma": "algo.gamma"})
def reinforce_pp(token_rewards_NT: torch.Tensor, mask_NT: torch.Tensor, *, gamma: float = 1.0) -> torch.Tensor:
    """Whitened discounted return of the token rewards. (N, T), (N, T) -> adv_NT (0 off the mask)."""
    returns_NT = discounted_returns(token_rewards_NT, mask_NT, gamma)
    return whiten(returns_NT, mask_NT) * mask_NT


@declare(level="token", inputs=("values_NT",), knobs={"gamma": "algo.gamma", "lam": "algo.lam"})
def gae(token_rewards_NT: torch.Tensor, mask_NT: torch.Tensor, *, values_NT: torch.Tensor,
        gamma: float = 1.0, lam: float = 0.95) -> torch.Tensor:
    """Whitened generalized advantage estimates. (N, T) each -> adv_NT (0 off the mask)."""
    advantages_NT = lambda_returns(token_rewards_NT, mask_NT, values_NT=values_NT, gamma=gamma, lam=lam) - values_NT
    return whiten(advantages_NT * mask_NT, mask_NT) * mask_NT


def lambda_returns(token_rewards_NT: torch.Tensor, mask_NT: torch.Tensor, *, values_NT: torch.Tensor,
                   gamma: float = 1.0, lam: float = 0.95) -> torch.Tensor:
    """GAE advantage + value: the critic's target. Tokens off the mask are skipped (the next
    value of a token is the value of the next masked token of its row, 0 after the last)."""
    mask_NT = mask_NT.to(token_rewards_NT.dtype)
    values_NT = values_NT * mask_NT
    advantage_N = torch.zeros_like(token_rewards_NT[:, 0])
    next_value_N = torch.zeros_like(advantage_N)
    advantages = [advantage_N] * token_rewards_NT.shape[1]
    for t in reversed(range(token_rewards_NT.shape[1])):
        on_N = mask_NT[:, t]
        delta_N = token_rewards_NT[:, t] + gamma * next_value_N - values_NT[:, t]
        # Off the mask, carry the running estimate through unchanged.
        advantage_N = on_N * (delta_N + gamma * lam * advantage_N) + (1 - on_N) * advantage_N
        next_value_N = on_N * values_NT[:, t] + (1 - on_N) * next_value_N
        advantages[t] = advantage_N
    return (torch.stack(advantages, dim=1) + values_NT) * mask_NT


def discounted_returns(token_rewards_NT: torch.Tensor, mask_NT: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = sum_{s >= t} gamma^(s-t) r_s over the masked tokens of each row; 0 off the mask."""
    mask_NT = mask_NT.to(token_rewards_NT.dtype)
    running_N = torch.zeros_like(token_rewards_NT[:, 0])
    returns = [running_N] * token_rewards_NT.shape[1]
    for t in reversed(range(token_rewards_NT.shape[1])):
        on_N = mask_NT[:, t]
        running_N = on_N * (token_rewards_NT[:, t] + gamma * running_N) + (1 - on_N) * running_N
        returns[t] = running_N * on_N
    return torch.stack(returns, dim=1)


def whiten(x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) with weighted mean and unbiased weighted variance (weights
    are token counts or a 0/1 mask, as in PPO's masked whitening)."""
    weights = weights.to(x.dtype)
    count = weights.sum()
    mean = (x * weights).sum() / count.clamp(min=1)
    variance = ((x - mean) ** 2 * weights).sum() / (count - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(variance + WHITEN_EPS)


def last_token_positions(mask_NT: torch.Tensor) -> torch.Tensor:
    """Each row's last masked position, (N,) (0 for a row with none)."""
    positions_T = torch.arange(mask_NT.shape[1], device=mask_NT.device)
    return (mask_NT * positions_T).argmax(dim=1)


def token_rewards(rewards_N: torch.Tensor, mask_NT: torch.Tensor, kl_NT: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards: the outcome reward on each row's last completion token, minus
    kl_coef * KL on every completion token. (N,), (N, T) -> (N, T)."""
    mask_NT = mask_NT.to(rewards_N.dtype)
    last_N = last_token_positions(mask_NT)
    rewards_NT = torch.zeros_like(mask_NT)
    rewards_NT[torch.arange(len(rewards_N)), last_N] = rewards_N * mask_NT.amax(dim=1)
    if kl_NT is not None and kl_coef:
        rewards_NT = rewards_NT - kl_coef * kl_NT * mask_NT
    return rewards_NT


def is_token_level(estimator: Callable[..., torch.Tensor]) -> bool:
    """Whether the estimator works on per-token rewards or on group rewards (its declared level)."""
    return spec_of(estimator).level == "token"


def is_tree_level(estimator: Callable[..., torch.Tensor]) -> bool:
    """Whether the estimator gives an advantage per tree node (its declared level)."""
    return spec_of(estimator).level == "tree"


def _group_centered(rewards_BG: torch.Tensor) -> torch.Tensor:
    return rewards_BG - rewards_BG.mean(dim=1, keepdim=True)


def _divide_nonzero(centered: torch.Tensor, std: torch.Tensor, eps: float) -> torch.Tensor:
    # Equal rewards carry no signal: advantage 0, even with eps = 0.
    return torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))


ADVANTAGES: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": grpo,
    "grpo_batch_std": grpo_batch_std,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp_baseline": reinforce_pp_baseline,
    "remax": remax,
    "opo": opo,
    "gdpo": gdpo,
    "maxrl": maxrl,
    "treerl": treerl,
    "reinforce_pp": reinforce_pp,
    "gae": gae,
}
