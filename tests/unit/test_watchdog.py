"""The hang watchdog: a phase past `factor` x its median duration (at least the floor; on its first
run, factor x floor) is reported once, with its name, how long, and the stack of every thread."""

from __future__ import annotations

import io
import time

from reasonrl.guards.watchdog import Watchdog


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_is_factor_times_the_median_with_a_floor():
    dog = Watchdog(factor=3, floor_s=2.0)
    assert dog.limit_s("update") == 6.0  # first run: factor x floor
    dog.durations["update"] = [0.1, 0.2, 0.3]
    assert dog.limit_s("update") == 2.0  # the floor
    dog.durations["update"] = [1.0, 4.0, 5.0]
    assert dog.limit_s("update") == 12.0


def test_a_phase_past_its_limit_is_reported_once_with_the_stacks_of_all_threads():
    out, clock = io.StringIO(), Clock()
    dog = Watchdog(factor=3, floor_s=1.0, out=out, clock=clock)
    dog.durations["reward"] = [1.0, 1.0, 2.0]
    try:
        with dog.phase("reward"), dog.phase("update"):
            clock.now = 2.9  # reward's limit is 3 s, update's (first run) 3 s
            dog.check()
            assert out.getvalue() == ""
            clock.now = 3.5
            dog.check()
            dog.check()
            text = out.getvalue()
    finally:
        dog.close()
    assert text.count("warning: phase 'reward' has been running for 3.5 s, past 3.0 s") == 1
    assert text.count("warning: phase 'update' has been running for 3.5 s") == 1
    assert "3 x its median 1 s" in text and "on its first run" in text
    assert dog.reports == 2
    assert "test_a_phase_past_its_limit_is_reported_once" in text  # this thread's stack
    assert "hang-watchdog" in text or "_run" in text  # and the watchdog's own thread
    assert dog.durations["reward"][-1] == 3.5 and dog.durations["update"] == [3.5]


def test_the_thread_reports_a_phase_that_sleeps_and_nothing_when_off():
    out = io.StringIO()
    dog = Watchdog(factor=2, floor_s=0.05, out=out)
    try:
        for _ in range(3):
            with dog.phase("generate"):
                pass
        with dog.phase("generate"):
            time.sleep(0.5)
    finally:
        dog.close()
    assert out.getvalue().count("phase 'generate' has been running for") == 1
    assert "time.sleep" in out.getvalue() or "sleep(0.5)" in out.getvalue()
    off = Watchdog(factor=0, floor_s=0.0, out=out)
    with off.phase("generate"):
        time.sleep(0.05)
    assert off.durations == {} and off._thread is None
