"""The critic of PPO with GAE (an advantage estimator that reads `values_NT`, e.g. algo.advantage=gae):
a value model whose values the estimation reads, fitted to the batch's returns after the policy's
update with the same epochs, mini-batches and micro-batches. Its settings are the critic section;
the value model and its learner are reasonrl.training.critic, the value loss reasonrl.algo.value.

The critic joins the advantage estimation itself (GAE reads its values between the rewards and the
advantages), so it is built before any method wraps the estimation: first in METHODS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from reasonrl.config import Config
from reasonrl.methods.parts import Added, RunParts
from reasonrl.models import load_value_model, resolve_dtype
from reasonrl.training.critic import Critic
from reasonrl.training.estimation import AdvantageEstimation
from reasonrl.training.learner import OptimConfig
from reasonrl.types import Participant, TrainBatch


class CriticUpdate(Participant):
    """After the policy, the critic's value model fits the batch's returns with the same epochs,
    mini-batches and micro-batches (`sizes`)."""

    name = "critic"

    def __init__(self, critic: Critic, sizes: Mapping[str, int]):
        self.critic, self.sizes = critic, sizes

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        metrics |= self.critic.update(batch, step=step, **self.sizes)

    def state_dict(self) -> dict[str, Any]:
        return self.critic.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.critic.load_state_dict(state)


def build_critic(cfg: Config, device: torch.device) -> Critic:
    """The value model of cfg.critic (its head initialised from torch's generator) with its optimizer."""
    c, t = cfg.critic, cfg.train
    autocast = resolve_dtype(t.dtype, device)
    return Critic(load_value_model(c.model or cfg.model.name, device=device),
                  OptimConfig.of(t, lr=c.lr, weight_decay=c.weight_decay),
                  value_clip=c.value_clip, autocast_dtype=autocast if autocast != torch.float32 else None,
                  seed=cfg.run.seed, pack=t.pack_sequences, micro_batch_positions=t.micro_batch_positions)


def build(cfg: Config, parts: RunParts) -> Added:
    """A critic for the estimation and its update, when the advantage estimator reads values."""
    estimate = parts.estimate
    if not isinstance(estimate, AdvantageEstimation):
        raise TypeError(f"the critic joins the advantage estimation itself, but the estimation is already wrapped "
                        f"({type(estimate).__name__}): list reasonrl.methods.critic before the methods that wrap "
                        "the estimation in reasonrl.methods.METHODS")
    if "values_NT" not in estimate.inputs:
        return Added()
    critic = build_critic(cfg, parts.device)
    return Added(estimate=replace(estimate, critic=critic), participants=(CriticUpdate(critic, parts.update_sizes),))
