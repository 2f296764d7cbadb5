"""Rollouts produced ahead of the learner: synchronous, one-step-off and bounded-staleness
asynchronous RL with one loop.

Versions: version v is the policy after v updates, so the learner is at version t when it
trains step t. With `max_staleness` k, step t's batch is generated with the weights of some
version v >= t - k, and every batch carries the version that produced it:

- k = 0: synchronous. The batch is produced when the learner asks for it, in the caller's
  thread, with the current weights (the loop of `reasonrl.trainer` as if there were no pipeline).
- k = 1: one-step-off (Noukhovitch et al. 2025, "Asynchronous RLHF"): step t + 1 is generated
  while step t trains, with version t's weights.
- k > 1: bounded staleness (as in AReaL, Fu et al. 2025): a background producer runs ahead,
  starting step j as soon as version j - k has been published, always with the newest weights.

The learner corrects for the gap between the sampling policy and its own with truncated
importance weights against the engine's sampling log-probs (algo.tis; the trainer turns it on
when k > 0), the current policy serving as the proximal one of decoupled PPO (Hilton et al. 2022).

Why a thread: generation with the Ray engine runs in worker processes, and the thread only
waits for them; with the local engine the thread and the learner share the machine's cores.
The pipeline's lock guards its own bookkeeping only. Whatever else `produce` touches must be
safe to call from the producer thread while the learner's thread runs: the trainer's
participants (reasonrl.participants) guard the state they share, and what only production
touches is called from one thread. While `idle()` nothing is produced, so a checkpoint taken
inside it sees every part at rest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from reasonrl.types import RolloutEngine

T = TypeVar("T")


@dataclass(frozen=True)
class Produced(Generic[T]):
    """A step's rollouts and the policy version that generated them."""

    step: int
    version: int
    value: T


class AsyncRollouts(Generic[T]):
    """Produces step j's rollouts with `produce(j, version)` on `engine`, at most `max_staleness`
    policy versions behind the learner, from the step given to `start` to `last_step` - 1.

    The learner's side: `next(t)` returns step t's rollouts (waiting for them if needed),
    `publish(v, weights)` hands over version v's weights after an update, and `idle()` stops
    the producer (with the newest weights loaded into the engine) for an evaluation or a
    checkpoint. `state_dict()` holds the steps produced but not yet trained, so a resumed run
    trains on exactly them.
    """

    def __init__(self, engine: RolloutEngine, *, max_staleness: int, last_step: int):
        if max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness} must be >= 0")
        self.engine, self.max_staleness, self.last_step = engine, max_staleness, last_step
        self._produce: Callable[[int, int], T] | None = None
        self._cond = threading.Condition()
        self._ready: dict[int, Produced[T]] = {}
        self._next_step = 0  # the next step to produce
        self._published_version = self._engine_version = 0
        self._published: dict[str, torch.Tensor] | None = None  # newer than the engine's, when set
        self._pauses = 0  # idle() may nest (a checkpoint's state includes the pipeline's own)
        self._busy = self._closed = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, produce: Callable[[int, int], T], step: int) -> None:
        """Produce with `produce(step, version)` from `step` on, the engine holding version `step`'s
        weights (steps restored by `load_state_dict` are not produced again)."""
        self._produce = produce
        self._published_version = self._engine_version = step
        self._next_step = max([step, *(s + 1 for s in self._ready)])
        if self.max_staleness > 0:
            self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
            self._thread.start()

    def next(self, step: int) -> tuple[Produced[T], float]:
        """Step `step`'s rollouts, and the seconds the learner waited for them."""
        started = time.perf_counter()
        if self._thread is None:
            if step in self._ready:  # restored from a checkpoint
                return self._ready.pop(step), 0.0
            produced = Produced(step, self._engine_version, self._produce(step, self._engine_version))
            return produced, time.perf_counter() - started
        with self._cond:
            while step not in self._ready:
                self._raise_error()
                if self._next_step > step:  # neither ready nor in production: a bug in the caller
                    raise RuntimeError(f"step {step} was asked for twice or out of order")
                self._cond.wait()
            produced = self._ready.pop(step)
            self._cond.notify_all()
        return produced, time.perf_counter() - started

    def publish(self, version: int, named_weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The learner's weights after `version` updates. Synchronously they go straight into
        the engine; asynchronously a copy waits for the producer (the learner changes its
        tensors in place at the next update)."""
        if self._thread is None:
            self.engine.load_weights(named_weights)
            self._engine_version = version
            return
        snapshot = {name: tensor.detach().clone() for name, tensor in named_weights}
        with self._cond:
            self._published, self._published_version = snapshot, version
            self._cond.notify_all()

    @contextmanager
    def idle(self) -> Iterator[None]:
        """No production while inside; the engine holds the newest published weights."""
        if self._thread is None:
            yield
            return
        with self._cond:
            self._pauses += 1
            while self._busy:
                self._cond.wait()
            self._load_published()
        try:
            yield
        finally:
            with self._cond:
                self._pauses -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Stop producing and leave the newest published weights in the engine."""
        if self._thread is None:
            return
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._load_published()

    def state_dict(self) -> dict[str, Any]:
        with self.idle():
            return {"ready": [self._ready[step] for step in sorted(self._ready)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Before `start`: the steps a checkpoint held produced but not trained."""
        self._ready = {produced.step: produced for produced in state["ready"]}

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._may_produce():
                    self._cond.wait()
                if self._closed:
                    return
                step = self._next_step
                self._busy = True
                self._load_published()
            try:
                produced = Produced(step, self._engine_version, self._produce(step, self._engine_version))
            except BaseException as error:  # noqa: BLE001 - handed to the learner's thread, which raises it
                with self._cond:
                    self._error, self._busy = error, False
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready[step] = produced
                self._next_step, self._busy = step + 1, False
                self._cond.notify_all()

    def _may_produce(self) -> bool:
        return (not self._pauses and self._next_step < self.last_step
                and self._next_step - self._published_version <= self.max_staleness)

    def _load_published(self) -> None:
        """Called with the condition held and no production running."""
        if self._published is not None:
            self.engine.load_weights(self._published.items())
            self._engine_version, self._published = self._published_version, None

    def _raise_error(self) -> None:
        if self._error is not None:
            raise RuntimeError("generating rollouts failed in the producer thread") from self._error
