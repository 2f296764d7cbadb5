"""KL control: the coefficient of the KL penalty to the reference (algo.kl_coef, adapted towards
algo.kl_target when set; Ziegler et al. 2019), in the loss (algo.kl_in=loss) or read by the
estimation (kl_in=reward), and resets of the reference to the current policy
(algo.ref_reset_every). The reference itself is a core object of the run (reasonrl.build); the KL
estimators and the adaptive coefficient are reasonrl.algo.kl."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from reasonrl.algo.kl import AdaptiveKLCoef
from reasonrl.config import Config
from reasonrl.methods.parts import Added, RunParts
from reasonrl.models import is_lora
from reasonrl.types import Participant, PolicyUpdate, TrainBatch


class KLController(Participant):
    """The KL coefficient: a term of the loss (in_loss), or read as `value` by the advantage
    estimation (the penalty in the reward); adapted after each update that measured the KL."""

    name = "kl_coef"

    def __init__(self, coef: AdaptiveKLCoef, *, in_loss: bool):
        self.coef, self.in_loss = coef, in_loss

    @property
    def value(self) -> float:
        return self.coef.value

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        return replace(update, loss=replace(update.loss, kl_coef=self.coef.value if self.in_loss else 0.0))

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        if "kl/mean" in metrics:
            metrics["kl/coef"] = self.coef.value
            self.coef.update(metrics["kl/mean"], samples=batch.num_sequences)

    def state_dict(self) -> dict[str, Any]:
        return self.coef.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.coef.load_state_dict(state)


class ReferenceReset(Participant):
    """The reference becomes the current policy (`policy_weights()`) every `every` steps. (Its
    weights are checkpointed by reasonrl.training.runs.trainer_state.)"""

    def __init__(self, reference: Any, policy_weights: Callable[[], Mapping[str, torch.Tensor]], every: int):
        self.reference, self.policy_weights, self.every = reference, policy_weights, every

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        if (step + 1) % self.every == 0:
            self.reference.load_state_dict(self.policy_weights())


def merged_state_dict(policy: Any) -> dict[str, torch.Tensor]:
    """The policy's weights as a plain model's state dict (LoRA adapters merged in)."""
    if is_lora(policy):
        return copy.deepcopy(policy).merge_and_unload().state_dict()
    return policy.state_dict()


def build(cfg: Config, parts: RunParts) -> Added:
    """The KL coefficient's holder (every run has one: the estimation reads it), and the reference's
    resets when algo.ref_reset_every is set."""
    a = cfg.algo
    controller = KLController(AdaptiveKLCoef(a.kl_coef, target=a.kl_target, horizon=a.kl_horizon),
                              in_loss=a.kl_in == "loss")
    resets = ((ReferenceReset(parts.ref_model, partial(merged_state_dict, parts.policy), a.ref_reset_every),)
              if a.ref_reset_every else ())
    return Added(participants=(controller, *resets), kl=controller)
