"""Problems in a fresh random order every epoch, like a shuffled data loader, but with its
position as explicit state so that a resumed run draws exactly the problems it would have."""

from __future__ import annotations

import random
from typing import Any


class EpochSampler:
    def __init__(self, num_problems: int, seed: int = 0):
        if num_problems < 1:
            raise ValueError("EpochSampler needs at least one problem")
        self.num_problems, self.seed = num_problems, seed
        self.epoch, self.position = 0, 0

    def _order(self) -> list[int]:
        order = list(range(self.num_problems))
        random.Random(f"epoch-sampler-{self.seed}-{self.epoch}").shuffle(order)
        return order

    def next(self, count: int) -> list[int]:
        """The next `count` problem indices, continuing into the next epoch when one ends."""
        chosen: list[int] = []
        order = self._order()
        while len(chosen) < count:
            if self.position == self.num_problems:
                self.epoch, self.position = self.epoch + 1, 0
                order = self._order()
            take = min(count - len(chosen), self.num_problems - self.position)
            chosen.extend(order[self.position : self.position + take])
            self.position += take
        return chosen

    def observe(self, indices: list[int], accuracies: list[float]) -> None:
        pass  # the order does not depend on results

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "num_problems": self.num_problems, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["num_problems"], state["seed"]) != (self.num_problems, self.seed):
            raise ValueError(f"sampler state is for {state['num_problems']} problems with seed {state['seed']}, "
                             f"not {self.num_problems} with seed {self.seed}: the task or seed changed since the checkpoint")
        self.epoch, self.position = state["epoch"], state["position"]
