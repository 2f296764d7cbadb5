"""Rollout engines: problems in, groups of sampled completions with their log-probs out; and the
OpenAI API served in front of one (openai_protocol, openai_server: reasonrl serve, the agent endpoint)."""

from reasonrl.rollout.base import RolloutEngine, prompt_token_ids
from reasonrl.rollout.hf import HFEngine

__all__ = ["HFEngine", "RolloutEngine", "prompt_token_ids"]
