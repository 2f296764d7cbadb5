"""What a method's `build(cfg, parts)` is given and gives back (reasonrl.methods).

`RunParts` holds the run's core objects, built before any method (reasonrl.build), and what the
methods walked before it added. A method returns what it adds as `Added`: the estimation from
here on (a wrapper of `parts.estimate`), its participants, the engine production generates with
from here on (a wrapper of `parts.producer_engine`), the holder of the KL coefficient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from reasonrl.rewards import WeightedReward
from reasonrl.tasks import Task
from reasonrl.types import Estimation, KLCoefficient, Learner, Participant, RolloutEngine

if TYPE_CHECKING:
    from reasonrl.config import Config


@dataclass(frozen=True)
class Added:
    """What one method adds to the run; each field left at its default adds nothing."""

    estimate: Estimation | None = None  # the run's estimation from here on (usually wrapping parts.estimate)
    participants: tuple[Participant, ...] = ()  # called after those of the methods before
    producer_engine: RolloutEngine | None = None  # what production generates with (wrapping parts.producer_engine)
    kl: KLCoefficient | None = None  # the KL coefficient the estimation reads each step (one method holds it)
    # Alarm thresholds ([alarm]) the method's signal makes wrong, with the value that fits it: e.g. a
    # teacher's term trains groups whose rewards are all equal, so no_gradient may not fire on them.
    alarm_thresholds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RunParts:
    """The run's core objects, and what the methods walked so far added (`add`).

    `engine` is the engine evaluation and the weight-sync check sample from (its tokenizer and pad
    id are the run's); `ref_model` the frozen reference of the KL penalty (None without one);
    `reference()` loads another frozen copy of the start model; `update_sizes` the epochs,
    mini-batches and micro-batch size of the policy's update."""

    task: Task
    tokenizer: Any
    policy: Any
    engine: Any
    ref_model: Any
    reward_fn: WeightedReward
    learner: Learner
    device: torch.device
    run_dir: Path
    update_sizes: Mapping[str, int]
    reference: Callable[[], Any]
    estimate: Estimation
    producer_engine: RolloutEngine
    participants: tuple[Participant, ...] = ()
    kl: KLCoefficient | None = None
    alarm_thresholds: Mapping[str, float] = field(default_factory=dict)

    def add(self, added: Added) -> RunParts:
        if added.kl is not None and self.kl is not None:
            raise ValueError("two methods hold the KL coefficient: exactly one method of reasonrl.methods.METHODS "
                             "may set Added.kl")
        return replace(self, estimate=self.estimate if added.estimate is None else added.estimate,
                       participants=(*self.participants, *added.participants),
                       producer_engine=self.producer_engine if added.producer_engine is None else added.producer_engine,
                       kl=self.kl if added.kl is None else added.kl,
                       alarm_thresholds={**self.alarm_thresholds, **added.alarm_thresholds})


class Method(Protocol):
    """A method's module: `build` says what it adds to a run of `cfg` (nothing when cfg does not ask for it)."""

    def build(self, cfg: Config, parts: RunParts) -> Added: ...
