"""The hang watchdog: a step that hangs looks like a slow one until someone notices hours later.
Each phase of a step (generate, reward, update, sync, checkpoint) runs inside `Watchdog.phase`;
a background thread wakes up every second or so, and a phase running longer than
`factor` x the median of its past durations (at least `floor_s`; before it has finished once,
`factor` x `floor_s`, since a first step includes warm-up) is reported once: which phase, for how
long, against which limit, and the Python stack of every thread (faulthandler), so the line it is
stuck on shows. It only reports: a phase that was merely slow finishes and the run goes on.
"""

from __future__ import annotations

import faulthandler
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

HISTORY = 50  # durations per phase the median is taken over


@dataclass
class _Running:
    name: str
    started: float
    reported: bool = False


@dataclass
class Watchdog:
    """Watches phases (module docstring); `factor` 0 turns it off. `out` receives the report."""

    factor: float
    floor_s: float
    out: TextIO | None = None
    clock: Callable[[], float] = time.monotonic
    durations: dict[str, list[float]] = field(default_factory=dict)
    reports: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._poll_s = min(1.0, max(self.floor_s / 4, 0.01))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.factor <= 0:
            yield
            return
        self._start_thread()
        key = object()
        with self._lock:
            self._running[id(key)] = _Running(name, self.clock())
        try:
            yield
        finally:
            with self._lock:
                running = self._running.pop(id(key))
                history = self.durations.setdefault(name, [])
                history.append(self.clock() - running.started)
                del history[:-HISTORY]

    def limit_s(self, name: str) -> float:
        """How long phase `name` may run before it is reported."""
        history = self.durations.get(name)
        if not history:
            return self.factor * self.floor_s
        return max(self.floor_s, self.factor * statistics.median(history))

    def check(self) -> None:
        """Report every phase past its limit that was not reported yet (the thread calls this)."""
        now = self.clock()
        with self._lock:
            late = [(r, now - r.started, self.limit_s(r.name)) for r in self._running.values()
                    if not r.reported and now - r.started > self.limit_s(r.name)]
            for running, _, _ in late:
                running.reported = True
        for running, elapsed, limit in late:
            self._report(running.name, elapsed, limit)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _start_thread(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            self.check()

    def _report(self, name: str, elapsed: float, limit: float) -> None:
        out = self.out or sys.stderr
        history = self.durations.get(name)
        usual = (f"{self.factor:g} x its median {statistics.median(history):.3g} s" if history else
                 f"{self.factor:g} x run.hang_floor_s on its first run")
        out.write(f"\nwarning: phase '{name}' has been running for {elapsed:.1f} s, past {limit:.1f} s "
                  f"(run.hang_factor={usual}, at least run.hang_floor_s={self.floor_s:g} s): it may hang. "
                  "The stacks of all threads follow (docs/troubleshooting.md); the run goes on.\n")
        out.flush()
        _dump_stacks(out)
        self.reports += 1


def _dump_stacks(out: TextIO) -> None:
    """faulthandler's dump of every thread's stack (it needs a file descriptor), else the same from
    sys._current_frames."""
    try:
        faulthandler.dump_traceback(file=out, all_threads=True)
        return
    except (AttributeError, ValueError, OSError, RuntimeError):
        pass
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"Thread {names.get(ident, ident)} (most recent call first):\n")
        out.write("".join(reversed(traceback.format_stack(frame))))
    out.flush()


def build_watchdog(run_config: Any) -> Watchdog:
    return Watchdog(factor=run_config.hang_factor, floor_s=run_config.hang_floor_s)
