"""PRIME's implicit process reward model in training (reasonrl.algo.prime; Cui et al. 2025): the
implicit PRM pi_phi (a trainable copy of the policy's start model, with its own AdamW) beside the
frozen reference pi_ref (the start model): its update on outcome labels and its dense rewards. The
estimation step that uses it, in the paper's order: reasonrl.methods.prime.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from reasonrl.algo.prime import implicit_prm_loss, implicit_process_rewards, sign_accuracy
from reasonrl.training.learner import Learner, OptimConfig, backward_finite
from reasonrl.training.token_stats import token_logprobs
from reasonrl.types import TrainBatch


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
