"""PRIME (prime.enabled; Cui et al. 2025, docs/algorithms.md): an implicit process reward model,
updated every step on the outcome labels, whose dense rewards join the outcome rewards in PRIME's
advantages. The math is reasonrl.algo.prime; the implicit PRM (its model, reference and optimizer)
reasonrl.training.prime; here, the estimation step that uses it and its state in checkpoints.

Each step, in the paper's order (verl's recipe/prime, reward_model.update=before): the PRM is
first updated on the step's rollouts with their outcome labels (`Group.outcomes`, the verifier's
"correct" component; one optimizer step of the CE loss), then it scores the same rollouts, and the
dense rewards join the outcome rewards in PRIME's advantages. The accuracy logged is the PRM's
before its update: on rollouts it has not seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from reasonrl.algo.prime import prime_advantages, process_reward_mask, process_reward_means
from reasonrl.config import Config
from reasonrl.methods.parts import Added, RunParts
from reasonrl.models import load_model, resolve_dtype
from reasonrl.training.learner import OptimConfig
from reasonrl.training.prime import ImplicitPRM
from reasonrl.types import Estimation, Group, Participant, TrainBatch


def outcome_labels(groups: Sequence[Group]) -> torch.Tensor:
    """The implicit PRM's label of each completion, (N,): its outcome, not its total reward, which
    would carry bonuses such as the format's (a correct boxed answer earns 1.1) and leave the CE
    loss's [0, 1]."""
    return torch.tensor([value for group in groups for value in group.outcomes], dtype=torch.float32)


@dataclass
class PrimeEstimation:
    """An advantage estimation (for the batch and its loss mask) whose advantages are replaced by
    PRIME's: the PRM updated on the step's outcome labels, then its dense rewards and the outcome
    rewards, each with a leave-one-out baseline (reasonrl.algo.prime)."""

    estimate: Estimation
    prm: ImplicitPRM
    process_weight: float = 1.0
    outcome_weight: float = 1.0
    process_baseline: str = "start"
    reward_last_token: bool = False
    whiten: bool = True
    steps: int = 0  # PRM updates so far: the step index of its optimizer's mini-batch seed

    def __call__(self, groups: Sequence[Group], pad_id: int, kl_coef: float) -> tuple[TrainBatch, dict[str, float]]:
        batch, metrics = self.estimate(groups, pad_id, kl_coef)
        outcome_N = torch.tensor([r for group in groups for r in group.rewards], dtype=torch.float32)
        ref_logp_NT = self.prm.reference_logprobs(batch)
        metrics |= self.prm.update(batch, outcome_labels(groups), ref_logp_NT, step=self.steps)
        self.steps += 1
        process_NT = self.prm.process_rewards(batch, ref_logp_NT)
        advantages_NT = prime_advantages(process_NT, outcome_N, batch.loss_mask_NT, [g.size for g in groups],
                                         process_weight=self.process_weight, outcome_weight=self.outcome_weight,
                                         baseline=self.process_baseline, reward_last_token=self.reward_last_token,
                                         whiten=self.whiten)
        rewarded_NT = process_reward_mask(batch.loss_mask_NT, reward_last_token=self.reward_last_token)
        metrics["prime/process_reward_mean"] = process_reward_means(process_NT, rewarded_NT).mean().item()
        return replace(batch, advantages_NT=advantages_NT.float()), metrics

    @property
    def critic(self) -> Any:
        return self.estimate.critic

    def state_dict(self) -> dict[str, Any]:
        return self.prm.state_dict() | {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prm.load_state_dict(state)
        self.steps = state["steps"]


class ImplicitPRMState(Participant):
    """The estimation step updates the implicit PRM before the policy's update; its weights,
    optimizer and update count go into checkpoints from here."""

    name = "prime"

    def __init__(self, estimation: PrimeEstimation):
        self.estimation = estimation

    def state_dict(self) -> dict[str, Any]:
        return self.estimation.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.estimation.load_state_dict(state)


def build(cfg: Config, parts: RunParts) -> Added:
    """PRIME's estimation, when prime.enabled: the implicit PRM a fresh copy of the start model, its
    reference the run's (when it stays the start model) or another frozen copy."""
    p, t = cfg.prime, cfg.train
    if not p.enabled:
        return Added()
    ref_model = parts.ref_model
    if ref_model is None or cfg.algo.ref_reset_every:
        ref_model = parts.reference()
    autocast = resolve_dtype(t.dtype, parts.device)
    prm = ImplicitPRM(load_model(cfg.model.name, dtype=torch.float32, device=parts.device), ref_model,
                      OptimConfig(lr=p.lr, betas=(t.beta1, t.beta2), weight_decay=0.0, grad_clip=t.grad_clip,
                                  state=t.optimizer_state),
                      beta=p.beta, micro_batch_size=t.micro_batch_size, seed=cfg.run.seed,
                      autocast_dtype=autocast if autocast != torch.float32 else None)
    estimate = PrimeEstimation(parts.estimate, prm, process_weight=p.process_weight, outcome_weight=p.outcome_weight,
                               process_baseline=p.process_baseline, reward_last_token=p.reward_last_token,
                               whiten=p.whiten)
    return Added(estimate=estimate, participants=(ImplicitPRMState(estimate),))
