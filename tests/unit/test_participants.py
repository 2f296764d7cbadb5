"""The participant protocol: every call made on each participant in the list's order."""

from __future__ import annotations

from collections.abc import Sequence

from reasonrl.participants import Participant, Participants, PolicyUpdate
from reasonrl.types import Group


class Recorder(Participant):
    def __init__(self, name: str, calls: list[str]):
        self.name, self.calls = name, calls

    def observe(self, step: int, indices: Sequence[int], groups: list[Group]) -> list[Group]:
        self.calls.append(f"observe:{self.name}")
        return groups[1:]

    def contribute(self, step: int, update: PolicyUpdate) -> PolicyUpdate:
        self.calls.append(f"contribute:{self.name}")
        return update

    def after_sync(self, step: int) -> None:
        self.calls.append(f"after_sync:{self.name}:{step}")

    def state_dict(self) -> dict:
        return {"name": self.name}


class Report(Participant):
    def metrics(self, step, rollouts) -> dict[str, float]:
        return {"report/step": float(step)}


def test_calls_follow_the_order_of_the_list_and_chain_the_groups():
    calls: list[str] = []
    parts = Participants([Recorder("a", calls), Report(), Recorder("b", calls)])
    kept = parts.observe(0, [0, 1, 2], ["g0", "g1", "g2"])  # type: ignore[list-item]
    update = parts.contribute(3, PolicyUpdate(loss="the loss"))  # type: ignore[arg-type]
    parts.after_sync(4)
    assert kept == ["g2"]
    assert update.loss == "the loss" and update.auxiliary is None
    assert calls == ["observe:a", "observe:b", "contribute:a", "contribute:b", "after_sync:a:4", "after_sync:b:4"]
    assert parts.metrics(4, None) == {"report/step": 4.0}  # type: ignore[arg-type]


def test_only_named_participants_are_checkpointed():
    parts = Participants([Recorder("a", []), Report()])
    assert list(parts.stateful) == ["a"]
