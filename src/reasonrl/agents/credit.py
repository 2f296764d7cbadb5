"""Turn-level credit assignment for multi-turn episodes: per-turn rewards -> per-token advantages.

A group's G episodes of one problem have turns k = 0..K_g-1 with rewards r_{g,k} (tool terms on
each turn, the final answer's score on the last). Each turn gets the discounted return of what
follows it, G_{g,k} = sum_{j >= k} gamma^(j-k) r_{g,j}, normalised with the group statistics of
the episodes' whole returns G_{g,0}, as GRPO normalises outcome rewards (Shao et al. 2024):

    A_{g,k} = (G_{g,k} - mean_g G_{g,0}) / (std_g G_{g,0} + eps)      (0 when std_g G_{g,0} = 0)

and every token of turn k carries A_{g,k}. With one turn per episode, or with gamma = 1 and reward
only on the last turn, this is GRPO exactly; with turn rewards, a turn is credited with its own
and later rewards only (reward-to-go), the per-turn idea of MT-GRPO (Zeng et al. 2025, "Reinforcing
Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment") with the return of REINFORCE.
The std is the unbiased sample std over the group's episodes (torch.std), as in `grpo`.

`turn_grpo` is the same as a token-level advantage estimator (algo.advantage =
reasonrl.agents.credit:turn_grpo): turns are the runs of the loss mask (inserted observations
separate them), a turn's reward is the sum of the token rewards on its tokens, rows come in
groups of `group_size`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reasonrl.spec import declare


def turn_spans(mask_T: torch.Tensor) -> list[tuple[int, int]]:
    """The [start, end) runs of ones of a 0/1 mask: one per model turn."""
    spans, start = [], None
    for t, value in enumerate(mask_T.tolist()):
        if value and start is None:
            start = t
        elif not value and start is not None:
            spans.append((start, t))
            start = None
    if start is not None:
        spans.append((start, len(mask_T)))
    return spans


def turn_returns(turn_rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """G_k = r_k + gamma * G_{k+1}, the discounted reward-to-go of each turn."""
    returns, following = [], 0.0
    for reward in reversed(turn_rewards):
        following = reward + gamma * following
        returns.append(following)
    return returns[::-1]


def turn_level_advantages(turn_rewards_G: Sequence[Sequence[float]], *, gamma: float = 1.0,
                          eps: float = 1e-6) -> list[list[float]]:
    """A_{g,k} of the module docstring for one group: per episode g, one advantage per turn."""
    returns_G = [turn_returns(rewards, gamma) for rewards in turn_rewards_G]
    if len(returns_G) < 2:
        return [[0.0] * len(returns) for returns in returns_G]
    episode_G = torch.tensor([returns[0] if returns else 0.0 for returns in returns_G], dtype=torch.float64)
    mean, std = episode_G.mean().item(), episode_G.std().item()
    if std == 0:
        return [[0.0] * len(returns) for returns in returns_G]
    return [[(value - mean) / (std + eps) for value in returns] for returns in returns_G]


@declare(level="token", knobs={"gamma": "algo.gamma", "eps": "algo.adv_eps"},
         context={"group_size": "rollout.group_size"}, min_group_size=2)
def turn_grpo(token_rewards_NT: torch.Tensor, mask_NT: torch.Tensor, *, group_size: int, gamma: float = 1.0,
              eps: float = 1e-6) -> torch.Tensor:
    """Turn-level group-normalised advantages as a token estimator. (N, T), (N, T) -> adv_NT.

    Rows n*group_size .. (n+1)*group_size - 1 are the episodes of one problem."""
    rows = token_rewards_NT.shape[0]
    if group_size < 1 or rows % group_size:
        raise ValueError(f"turn_grpo: {rows} sequences do not split into groups of {group_size} (the group size "
                         "must be fixed: no adaptive sampling budget or stage changing it)")
    advantages_NT = torch.zeros_like(token_rewards_NT, dtype=torch.float32)
    for first in range(0, rows, group_size):
        spans_G = [turn_spans(mask_NT[n]) for n in range(first, first + group_size)]
        rewards_G = [[float(token_rewards_NT[n, a:b].sum()) for a, b in spans]
                     for n, spans in zip(range(first, first + group_size), spans_G)]
        for n, spans, advantages in zip(range(first, first + group_size), spans_G,
                                        turn_level_advantages(rewards_G, gamma=gamma, eps=eps)):
            for (a, b), advantage in zip(spans, advantages):
                advantages_NT[n, a:b] = advantage
    return advantages_NT * mask_NT
