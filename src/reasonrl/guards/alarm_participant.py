"""The alarms (reasonrl.guards.alarms) as a participant of the loop: after each step it hands the
step's metrics to the monitor and adds the alarm/<name> metrics of the alarms that hold."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from reasonrl.guards.alarms import AlarmMonitor
from reasonrl.rollout.producer import Rollouts, rollout_metrics
from reasonrl.sampling.dynamic import ACCURACY_ALL, DROPPED_FRAC, DROPPED_GRADED_FRAC, REWARD_MEAN_ALL
from reasonrl.types import CORRECT, Participant, TrainBatch


class Alarms(Participant):
    """run.alarms as a participant: the update's metrics (entropy, clipping, KL, gradient norm) are
    kept after the update, the rollouts' (reward, correctness, length, truncation, groups without
    spread) are read from the step's groups (and, under dynamic sampling, from every group it
    sampled), and together they go to the monitor."""

    name = "alarms"

    def __init__(self, monitor: AlarmMonitor):
        self.monitor = monitor
        self.update_metrics: dict[str, float] = {}

    def after_update(self, step: int, batch: TrainBatch, metrics: dict[str, float]) -> None:
        self.update_metrics = dict(metrics)

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        return self.monitor.observe(step + 1, self.update_metrics | rollout_signals(rollouts))

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)


def rollout_signals(rollouts: Rollouts) -> dict[str, float]:
    """The step's rollout metrics the alarms read, named as the trainer logs them."""
    logged = rollout_metrics(rollouts.groups)
    signals = {key: logged[key] for key in ("reward/mean", f"reward/{CORRECT}", "rollout/len_mean",
                                            "rollout/truncated_frac", "rollout/zero_std_frac") if key in logged}
    # Dynamic sampling: the kept groups all have spread and were chosen by their correctness, so the
    # alarms read the dropped share and the numbers over every completion sampled.
    all_rounds = (DROPPED_FRAC, DROPPED_GRADED_FRAC, REWARD_MEAN_ALL, ACCURACY_ALL)
    signals |= {key: rollouts.sampling_metrics[key] for key in all_rounds if key in rollouts.sampling_metrics}
    return signals


def build_alarms(cfg: Any, overrides: Mapping[str, float] | None = None) -> Alarms | None:
    """The alarms cfg.run asks for (None when off), with cfg.alarm's thresholds and the `overrides`
    the run's methods set (reasonrl.methods.parts.Added.alarm_thresholds)."""
    if not cfg.run.alarms:
        return None
    thresholds = dataclasses.replace(cfg.alarm, **(overrides or {}))
    return Alarms(AlarmMonitor(thresholds, stop_on=cfg.run.stop_on))
