"""Replay of correct completions (sampling.replay): correct completions are remembered per problem,
and one is put into a group whose samples are all wrong when the problem was solved before (the
group is scored again), so that it has an advantage to learn from. The buffer is
reasonrl.sampling.ReplayBuffer."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from reasonrl.config import Config
from reasonrl.methods.parts import Added, RunParts
from reasonrl.rewards import WeightedReward, score_groups
from reasonrl.rewards.compose import OnError
from reasonrl.rollout.producer import Rollouts
from reasonrl.sampling import ReplayBuffer
from reasonrl.types import Group, Participant


class Replay(Participant):
    """Remembers each round's correct completions and mixes one into an all-wrong group of a problem
    solved before (rescored with `reward_fn`; a rescoring that fails keeps the group as it was)."""

    name = "replay"

    def __init__(self, buffer: ReplayBuffer, reward_fn: WeightedReward, on_error: OnError):
        self.buffer, self.reward_fn, self.on_error = buffer, reward_fn, on_error
        self.lock = threading.Lock()

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        with self.lock:
            return [self._with_replay(index, group, step) for index, group in zip(indices, groups)]

    def _with_replay(self, index: int, group: Group, step: int) -> Group:
        self.buffer.add(index, group)
        mixed = self.buffer.mixed(index, group, step)
        if mixed is None:
            return group
        rescored = score_groups([mixed], self.reward_fn, self.on_error)[0]
        return group if rescored.reward_error is not None else rescored

    def metrics(self, step: int, rollouts: Rollouts) -> dict[str, float]:
        with self.lock:
            return self.buffer.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state)


def build(cfg: Config, parts: RunParts) -> Added:
    """Replay's participant, when sampling.replay keeps completions."""
    s = cfg.sampling
    if not s.replay:
        return Added()
    return Added(participants=(Replay(ReplayBuffer(s.replay, seed=cfg.run.seed), parts.reward_fn,
                                      cfg.reward.on_error),))
