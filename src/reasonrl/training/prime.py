"""PRIME's implicit process reward model in training (reasonrl.algo.prime; Cui et al. 2025): the
implicit PRM pi_phi (a trainable copy of the policy's start model, with its own AdamW) beside the
frozen reference pi_ref (the start model), and the estimation step that uses them.

Each step, in the paper's order (verl's recipe/prime, reward_model.update=before): the PRM is
first updated on the step's rollouts with their outcome labels (`Group.outcomes`, the verifier's
"correct" component; one optimizer step of the CE loss), then it scores the same rollouts, and the
dense rewards join the outcome rewards in PRIME's advantages. The accuracy logged is the PRM's
before its update: on rollouts it has not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from reasonrl.algo.prime import (
    implicit_prm_loss,
    implicit_process_rewards,
    prime_advantages,
    process_reward_mask,
    process_reward_means,
    sign_accuracy,
)
from reasonrl.training.learner import Learner, OptimConfig, backward_finite
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import Group, TrainBatch


class ImplicitPRM:
    """pi_phi with its optimizer, and the frozen pi_ref: r_t = beta * (log pi_phi - log pi_ref)."""

    def __init__(self, model: Any, ref_model: Any, optim: OptimConfig, *, beta: float, micro_batch_size: int,
                 autocast_dtype: torch.dtype | None = None, seed: int = 0):
        # Log-probs at temperature 1: the PRM's own distribution, whatever the policy samples at.
        self.learner = Learner(model, optim, autocast_dtype=autocast_dtype, seed=seed)
        self.ref_model, self.beta, self.micro_batch_size = ref_model, beta, micro_batch_size

    @property
    def model(self) -> Any:
        return self.learner.model

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.learner.logprobs(self.ref_model, batch, self.micro_batch_size)

    def process_rewards(self, batch: TrainBatch, ref_logp_NT: torch.Tensor) -> torch.Tensor:
        """The dense rewards of the batch's completion tokens, (N, T-1)."""
        self.model.eval()
        prm_logp_NT = self.learner.logprobs(self.model, batch, self.micro_batch_size)
        return implicit_process_rewards(prm_logp_NT, ref_logp_NT, batch.loss_mask_NT, beta=self.beta)

    def update(self, batch: TrainBatch, labels_N: torch.Tensor, ref_logp_NT: torch.Tensor,
               step: int) -> dict[str, float]:
        """One optimizer step of the CE loss (mean over the sequences) towards `labels_N`; the loss, and
        the accuracy of the implicit reward's sign before the step."""
        self.model.train()
        # The label rides in returns_NT, the field of a model's regression targets, to reach each micro-batch.
        batch = replace(batch, ref_logp_NT=ref_logp_NT, returns_NT=labels_N[:, None].expand_as(batch.loss_mask_NT))
        accuracy: list[torch.Tensor] = []

        def backward(micro: TrainBatch, total_tokens: float, total_sequences: int, generator: torch.Generator):
            with self.learner.autocast():
                prm_logp_NT = token_logprobs(self.model, micro, 1.0)[0]
            labels = micro.returns_NT[:, 0]
            loss_N, logits_N = implicit_prm_loss(prm_logp_NT.float(), micro.ref_logp_NT, micro.loss_mask_NT, labels,
                                                 beta=self.beta)
            accuracy.append(sign_accuracy(logits_N.detach(), labels).cpu())
            return backward_finite(loss_N.sum() / total_sequences), {}

        metrics = self.learner.optimize(batch, backward, micro_batch_size=self.micro_batch_size, step=step,
                                        loss_key="prime/loss", prefix="prime")
        return metrics | {"prime/accuracy": torch.cat(accuracy).mean().item()}

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "learner": self.learner.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.learner.load_state_dict(state["learner"])


def outcome_labels(groups: Sequence[Group]) -> torch.Tensor:
    """The implicit PRM's label of each completion, (N,): its outcome, not its total reward, which
    would carry bonuses such as the format's (a correct boxed answer earns 1.1) and leave the CE
    loss's [0, 1]."""
    return torch.tensor([value for group in groups for value in group.outcomes], dtype=torch.float32)


@dataclass
class PrimeEstimation:
    """An advantage estimation (reasonrl.training.estimation, for the batch and its loss mask) whose
    advantages are replaced by PRIME's: the PRM updated on the step's outcome labels, then its dense
    rewards and the outcome rewards, each with a leave-one-out baseline (reasonrl.algo.prime)."""

    estimate: Callable[[Sequence[Group], int, float], tuple[TrainBatch, dict[str, float]]]
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
        return getattr(self.estimate, "critic", None)

    def state_dict(self) -> dict[str, Any]:
        return self.prm.state_dict() | {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prm.load_state_dict(state)
        self.steps = state["steps"]
