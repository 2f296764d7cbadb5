"""Experience replay of verified-correct completions into groups that got everything wrong.

A group whose G completions all fail has zero group-relative advantage: the problem teaches
nothing this step, although the policy may have solved it before. Keeping earlier correct
completions and putting one back into such a group gives it a positive example, as in ExGRPO
(Zhan et al. 2025, "ExGRPO: Learning to Reason from Experience") and RePO (Li et al. 2025,
"RePO: Replay-Enhanced Policy Optimization"), which mix replayed successes into fresh groups.

A replayed completion keeps the token log-probabilities of the policy that sampled it, so it is
off-policy: train with truncated importance sampling (`algo.tis=token` or `sequence`) to weight
its loss by min(pi_now / pi_then, cap). The group is scored again after the swap, so its rewards
are those of the current reward function. The buffer is part of the checkpoint.
"""

from __future__ import annotations

import random
from dataclasses import asdict, replace
from typing import Any

from reasonrl.types import Completion, Group


class ReplayBuffer:
    """Up to `per_problem` correct completions of each problem index (the newest kept)."""

    def __init__(self, per_problem: int = 2, seed: int = 0):
        if per_problem < 1:
            raise ValueError(f"ReplayBuffer: per_problem must be >= 1, got {per_problem}")
        self.per_problem, self.seed = per_problem, seed
        self.stored: dict[int, list[Completion]] = {}
        self.replayed = 0

    def add(self, index: int, group: Group) -> None:
        """Remember the group's correct completions (fresh ones only: replayed ones are already here)."""
        correct = [c for c, solved in zip(group.completions, group.solved) if solved]
        if correct:
            kept = self.stored.get(index, []) + correct
            self.stored[index] = kept[-self.per_problem:]

    def all_wrong(self, group: Group) -> bool:
        return not any(group.solved)

    def mixed(self, index: int, group: Group, step: int) -> Group | None:
        """The unscored group with its last completion replaced by a stored correct one, or None
        when the group has a correct completion or nothing is stored for the problem."""
        if not self.all_wrong(group) or not self.stored.get(index):
            return None
        stored = self.stored[index]
        pick = stored[random.Random(f"replay-{self.seed}-{step}-{index}").randrange(len(stored))]
        self.replayed += 1
        return replace(group, completions=(*group.completions[:-1], pick), rewards=None, reward_components={},
                       token_rewards=None)

    def metrics(self) -> dict[str, float]:
        return {"sampling/replayed": float(self.replayed),
                "sampling/replay_problems": float(len(self.stored))}

    def state_dict(self) -> dict[str, Any]:
        return {"per_problem": self.per_problem, "seed": self.seed, "replayed": self.replayed,
                "stored": {str(k): [asdict(c) for c in v] for k, v in self.stored.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.per_problem, self.seed, self.replayed = state["per_problem"], state["seed"], state["replayed"]
        self.stored = {int(k): [Completion(**{**c, "token_ids": tuple(c["token_ids"]), "logprobs": tuple(c["logprobs"])})
                                for c in v] for k, v in state["stored"].items()}
