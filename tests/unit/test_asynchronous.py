"""The rollout pipeline's version bookkeeping, hand-checked with a scripted learner and a fake
engine: which policy version produces each step for staleness 0, 1 and 2, that no step is
produced past the bound, that idle() hands the newest weights to the engine, that produced but
untrained steps survive a state round trip, and that a producer's error reaches the learner."""

from __future__ import annotations

import threading

import pytest
import torch

from reasonrl.rollout.asynchronous import AsyncRollouts


class VersionEngine:
    """Remembers which version's weights it holds (the weights are one tensor holding the version)."""

    def __init__(self):
        self.version = 0
        self.loads: list[int] = []

    def load_weights(self, named_tensors):
        ((_, tensor),) = list(named_tensors)
        self.version = int(tensor.item())
        self.loads.append(self.version)

    def generate(self, problems, sampling):  # unused: produce() stands in for generation
        raise NotImplementedError


def weights(version: int):
    return [("w", torch.tensor(float(version)))]


def run(max_staleness: int, steps: int, *, hold_step: int | None = None):
    """Train `steps` scripted steps; return [(step, producing version, engine version seen)] and
    the learner version at which each step's production started.

    When `hold_step` is set, the learner trains that step only after the producer has started
    every step it may start (so the bound, not timing, decides what was produced)."""
    engine = VersionEngine()
    pipeline = AsyncRollouts(engine, max_staleness=max_staleness, last_step=steps)
    learner_version = [0]
    started_at: dict[int, int] = {}
    started = threading.Condition()

    def produce(step: int, version: int):
        with started:
            started_at[step] = learner_version[0]
            started.notify_all()
        return step, version, engine.version

    pipeline.start(produce, 0)
    out = []
    for step in range(steps):
        produced, _ = pipeline.next(step)
        assert produced.step == step and produced.value[0] == step
        out.append(produced.value)
        if max_staleness and step == hold_step:
            with started:  # every step up to step + max_staleness may start at version `step`
                last = min(steps - 1, step + max_staleness)
                assert started.wait_for(lambda last=last: last in started_at, timeout=10)
            assert max(started_at) == last  # and none further
        learner_version[0] = step + 1
        pipeline.publish(step + 1, weights(step + 1))
    pipeline.close()
    return out, started_at, engine


def test_synchronous_produces_each_step_with_the_current_weights():
    out, _, engine = run(0, 4)
    assert out == [(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3)]
    assert engine.loads == [1, 2, 3, 4]


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_async_steps_stay_within_the_staleness_bound(max_staleness):
    out, started_at, engine = run(max_staleness, 6, hold_step=2)
    for step, version, engine_version in out:
        assert version == engine_version  # the tag is the weights the engine held
        assert step - max_staleness <= version <= step
        assert started_at[step] >= step - max_staleness
    # Step 0 is always produced with the initial weights, and so is every step up to the bound.
    assert [v for _, v, _ in out[: max_staleness + 1]] == [0] * (max_staleness + 1)
    assert engine.version == 6  # close() leaves the newest weights in the engine


def test_one_step_off_trains_step_t_on_version_t_minus_1():
    """With a producer that is fast next to the learner, staleness 1 means exactly one behind."""
    engine = VersionEngine()
    pipeline = AsyncRollouts(engine, max_staleness=1, last_step=5)
    pipeline.start(lambda step, version: version, 0)
    versions = []
    for step in range(5):
        produced, _ = pipeline.next(step)
        versions.append(produced.version)
        # Wait until step + 1 is produced (it may be, at the version this step trains with).
        if step + 1 < 5:
            with pipeline._cond:
                assert pipeline._cond.wait_for(lambda: step + 1 in pipeline._ready, timeout=10)  # noqa: B023 - called at once
        pipeline.publish(step + 1, weights(step + 1))
    pipeline.close()
    assert versions == [0, 0, 1, 2, 3]


def test_idle_loads_the_newest_weights_and_pauses_production():
    engine = VersionEngine()
    pipeline = AsyncRollouts(engine, max_staleness=2, last_step=10)
    pipeline.start(lambda step, version: version, 0)
    pipeline.next(0)
    pipeline.publish(1, weights(1))
    with pipeline.idle():
        assert engine.version == 1
        produced_before = set(pipeline._ready)
        pipeline.publish(2, weights(2))  # would allow step 4; nothing is produced while idle
        threading.Event().wait(0.2)
        assert set(pipeline._ready) == produced_before
    pipeline.close()


def test_state_round_trip_keeps_produced_steps():
    engine = VersionEngine()
    pipeline = AsyncRollouts(engine, max_staleness=1, last_step=4)
    pipeline.start(lambda step, version: f"rollouts of step {step} at v{version}", 0)
    pipeline.next(0)
    with pipeline._cond:  # step 1 produced with the initial weights before the update lands
        assert pipeline._cond.wait_for(lambda: 1 in pipeline._ready, timeout=10)
    pipeline.publish(1, weights(1))
    state = pipeline.state_dict()
    pipeline.close()
    assert [p.step for p in state["ready"]] in ([1], [1, 2])

    resumed_engine = VersionEngine()
    resumed = AsyncRollouts(resumed_engine, max_staleness=1, last_step=4)
    resumed.load_state_dict(state)
    calls = []
    resumed.start(lambda step, version: calls.append(step) or f"new {step}", 1)
    produced, _ = resumed.next(1)
    assert produced.value == "rollouts of step 1 at v0" and produced.version == 0
    resumed.publish(2, weights(2))
    resumed.next(2)
    resumed.close()
    assert 1 not in calls  # a restored step is not generated again


def test_a_producer_error_reaches_the_learner():
    pipeline = AsyncRollouts(VersionEngine(), max_staleness=1, last_step=3)

    def produce(step, version):
        if step == 1:
            raise ValueError("bad prompt")
        return step

    pipeline.start(produce, 0)
    pipeline.next(0)
    with pytest.raises(RuntimeError, match="producer thread") as info:
        pipeline.next(1)
    assert isinstance(info.value.__cause__, ValueError)
    pipeline.close()


def test_negative_staleness_is_refused():
    with pytest.raises(ValueError, match="max_staleness"):
        AsyncRollouts(VersionEngine(), max_staleness=-1, last_step=1)
