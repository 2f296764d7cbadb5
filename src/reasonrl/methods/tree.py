"""Tree sampling (rollout.tree; TreeRL-style): each problem's completions are sampled as a tree whose
branches share their first segments (reasonrl.rollout.tree.TreeSampler, which wraps the engine
production generates with); a tree-level advantage estimator credits each segment
(reasonrl.algo.tree). What rollout.tree cannot be combined with is refused by the config
(reasonrl.config.consistency)."""

from __future__ import annotations

from reasonrl.config import Config, tree_branching
from reasonrl.methods.parts import Added, RunParts
from reasonrl.rollout.tree import TreeSampler


def build(cfg: Config, parts: RunParts) -> Added:
    """Production's engine sampling trees of rollout.tree's branching factors, when it is set."""
    branching = tree_branching(cfg.rollout.tree)
    if not branching:
        return Added()
    return Added(producer_engine=TreeSampler(parts.producer_engine, branching, cfg.rollout.tree_segment_tokens))
