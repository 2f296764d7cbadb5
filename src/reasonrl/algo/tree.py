"""Advantages of a group sampled as a tree (rollout.tree): each segment's credit comes from the
rewards of the completions that pass through it.

TreeRL (Hou et al. 2025, "TreeRL: LLM Reinforcement Learning with On-Policy Tree Search",
Sec. 3.2, process supervision from the tree). With V(s) the mean reward of the leaves (the
completions) under node s, and the root the prompt (V(root): the group's mean reward),
    global advantage  V(s) - V(root),   local advantage  V(s) - V(parent(s)),
and every token of segment s gets
    A(s) = (V(s) - V(root) + V(s) - V(parent(s))) / sqrt(|L(s)|),
|L(s)| the number of completions under s. A segment shared by k completions is trained in each
of them (k copies of its tokens' gradient, or one copy weighted k in the packed learner), so its
total weight is sqrt(k) (global + local): more than a leaf's, less than k times.

A group sampled flat is the tree whose nodes are its completions, all children of the root:
A_i = 2 (r_i - mean(r)), twice Dr. GRPO's advantage.
"""

from __future__ import annotations

import torch

from reasonrl.spec import declare
from reasonrl.types import TreeShape


@declare(level="tree", min_group_size=2)
def treerl(rewards_G: torch.Tensor, *, under_SG: torch.Tensor, parent_S: torch.Tensor) -> torch.Tensor:
    """Each node's advantage, (S,). `rewards_G`: the G completions' rewards; `under_SG[s, g]`:
    whether completion g passes through node s; `parent_S[s]`: node s's parent, -1 for the root."""
    counts_S = under_SG.sum(dim=1).to(rewards_G.dtype)
    if (counts_S == 0).any():
        raise ValueError("every node of the tree needs at least one completion under it")
    values_S = (under_SG.to(rewards_G.dtype) @ rewards_G) / counts_S
    root = rewards_G.mean()
    parent_values_S = torch.where(parent_S >= 0, values_S[parent_S.clamp(min=0)], root)
    return (2 * values_S - root - parent_values_S) / counts_S.sqrt()


def flat_tree(lengths: list[int]) -> TreeShape:
    """The tree of a group sampled flat: one node per completion, each under the root."""
    return TreeShape(parents=(-1,) * len(lengths), sizes=tuple(lengths), paths=tuple((g,) for g in range(len(lengths))))


def membership_SG(tree: TreeShape) -> torch.Tensor:
    """(S, G) bool: whether completion g's path passes through node s."""
    under_SG = torch.zeros(len(tree.parents), len(tree.paths), dtype=torch.bool)
    for g, path in enumerate(tree.paths):
        under_SG[list(path), g] = True
    return under_SG
