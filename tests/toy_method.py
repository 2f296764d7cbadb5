"""Advantages clipped to [-LIMIT, LIMIT] after the estimation of every method before, with a count
of the tokens clipped and of the updates made (a toy: one module using the seams a method has)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from reasonrl.config import Config
from reasonrl.methods.parts import Added, RunParts
from reasonrl.rollout.producer import Rollouts
from reasonrl.types import Estimation, Group, Participant, TrainBatch

LIMIT = 0.5


@dataclass
class ClippedEstimation:
    estimate: Estimation

    def __call__(self, groups: Sequence[Group], pad_id: int, kl_coef: float) -> tuple[TrainBatch, dict[str, float]]:
        batch, metrics = self.estimate(groups, pad_id, kl_coef)
        clipped_NT = batch.advantages_NT.clamp(-LIMIT, LIMIT)
        changed = float((clipped_NT != batch.advantages_NT).sum())
        return replace(batch, advantages_NT=clipped_NT), metrics | {"clip/tokens": changed}

    @property
    def critic(self) -> Any:
        return self.estimate.critic


class Updates(Participant):
    name = "clip"  # the key of its state in checkpoints

    def __init__(self) -> None:
        self.updates = 0

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        self.updates += 1

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return {"clip/updates": float(self.updates)}

    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = state["updates"]


def build(cfg: Config, parts: RunParts) -> Added:
    return Added(estimate=ClippedEstimation(parts.estimate), participants=(Updates(),))
