"""benchmarks/runs.py `run_all`: with a start deadline, runs whose turn comes after it are not
started (those going finish) and are handed back in order; without one, every run starts. The
clock is a fake that each run advances, so the outcome does not depend on this machine's load."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from benchmarks import runs


@dataclass(frozen=True)
class TimedSpec:
    """A stand-in for a `RunSpec` whose run takes `seconds` on the fake clock."""

    study: str
    name: str
    clock: list[float]
    started: list[str]
    seconds: float = 10.0

    def run(self, *, rerun: bool = False, threads: int | None = None) -> dict:
        self.started.append(self.name)
        self.clock[0] += self.seconds
        return {}


def specs(clock: list[float], started: list[str], count: int) -> list[TimedSpec]:
    return [TimedSpec("study", f"run{i}", clock, started) for i in range(count)]


def test_no_run_starts_after_the_deadline(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock, started = [100.0], []
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    planned = specs(clock, started, 5)
    # One at a time, 10 s each: runs start at +0, +10, +20 (< 25) and the fourth's turn comes at +30.
    unstarted = runs.run_all(planned, jobs=1, start_within_s=25)
    assert started == ["run0", "run1", "run2"]
    assert unstarted == planned[3:]
    assert "2 of 5 runs not started (past 25 s): study/run3, study/run4" in capsys.readouterr().err


def test_without_a_deadline_every_run_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, started = [0.0], []
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    assert runs.run_all(specs(clock, started, 4), jobs=1) == []
    assert started == ["run0", "run1", "run2", "run3"]


def test_a_deadline_already_past_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, started = [0.0], []
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    planned = specs(clock, started, 3)
    assert runs.run_all(planned, jobs=2, start_within_s=0) == planned
    assert started == []
