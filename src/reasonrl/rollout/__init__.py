"""Rollout engines: problems in, groups of sampled completions with their log-probs out."""

from reasonrl.rollout.base import RolloutEngine, prompt_token_ids
from reasonrl.rollout.hf import HFEngine

__all__ = ["HFEngine", "RolloutEngine", "prompt_token_ids"]
