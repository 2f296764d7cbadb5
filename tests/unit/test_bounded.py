"""rewards.bounded: work within a time bound on any thread, through a timer or worker processes that serve the
functions of one module."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from reasonrl.rewards import bounded
from reasonrl.rewards.bounded import Handler, call_bounded, run_in_workers, shared_pool, shutdown_pools

HANDLERS = '''
import time


def echo(value):
    return value


def unpicklable_result():
    return lambda: 1


def raises():
    raise ValueError("a bug in the handler")


def spins(seconds):
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        pass
    return "finished"
'''


@pytest.fixture
def handlers(tmp_path, monkeypatch):
    """A module of handlers on sys.path (which the workers inherit), under a name no other test uses."""
    name = f"bounded_handlers_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(HANDLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    shutdown_pools(Handler(name, "echo"))


def stopped(task: int, why: str) -> str:
    return f"stopped: {why}"


@pytest.mark.timeout(120)
def test_one_pool_serves_every_function_of_its_module_and_survives_a_task_past_its_deadline(handlers):
    echo, spins = Handler(handlers, "echo"), Handler(handlers, "spins")
    assert run_in_workers(echo, {0: ("a",), 1: ({"b": [1]},)}, 5.0, workers=1, on_stopped=stopped) == {
        0: "a", 1: {"b": [1]}}
    pool = shared_pool(echo)
    assert shared_pool(spins) is pool  # the module's pool, whichever function
    replaced = pool.replaced
    started = time.monotonic()
    assert run_in_workers(spins, {0: (30.0,)}, 0.5, workers=1, on_stopped=stopped) == {
        0: "stopped: exceeded 0.5 s (worker restarted)"}
    assert time.monotonic() - started < 0.5 + 5.0
    assert pool.replaced == replaced + 1
    assert run_in_workers(spins, {0: (0.0,)}, 5.0, workers=1, on_stopped=stopped) == {0: "finished"}


@pytest.mark.timeout(120)
def test_a_handler_that_raises_or_whose_result_cannot_cross_is_an_error_not_a_timeout(handlers):
    with pytest.raises(RuntimeError, match=r"raises failed in a worker process:\n(.|\n)*a bug in the handler"):
        run_in_workers(Handler(handlers, "raises"), {0: ()}, 5.0, workers=1, on_stopped=stopped)
    with pytest.raises(RuntimeError, match=r"unpicklable_result failed in a worker process:\n(.|\n)*pickle"):
        run_in_workers(Handler(handlers, "unpicklable_result"), {0: ()}, 5.0, workers=1, on_stopped=stopped)
    replaced = shared_pool(Handler(handlers, "echo")).replaced
    assert run_in_workers(Handler(handlers, "echo"), {0: (7,)}, 5.0, workers=1, on_stopped=stopped) == {0: 7}
    assert shared_pool(Handler(handlers, "echo")).replaced == replaced  # no worker was lost to either


@pytest.mark.timeout(120)
def test_call_bounded_says_why_it_stopped_on_the_main_thread_and_on_another(handlers):
    spins = Handler(handlers, "spins")
    assert call_bounded(spins, (30.0,), 0.3, lambda why: why) == "exceeded 0.3 s"
    assert call_bounded(spins, (0.0,), 5.0, lambda why: why) == "finished"
    seen = {}

    def on_a_thread() -> None:
        seen["slow"] = call_bounded(spins, (30.0,), 0.5, lambda why: why)
        seen["quick"] = call_bounded(spins, (0.0,), 5.0, lambda why: why)

    thread = threading.Thread(target=on_a_thread, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert seen == {"slow": "exceeded 0.5 s (worker restarted)", "quick": "finished"}


def test_call_within_refuses_other_threads():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_error_of(lambda: bounded.call_within(
        lambda: 1, 1.0, lambda: 0))))
    thread.start()
    thread.join()
    assert "main thread only" in str(errors[0]) and "call_bounded" in str(errors[0])


def _error_of(call):
    try:
        call()
    except RuntimeError as exc:
        return exc
    return None


def test_a_repeat_of_the_timer_after_the_work_stopped_does_not_escape(monkeypatch):
    """The timer repeats every EXPIRY_REPEAT_S until the work has stopped; one that lands while `on_expiry` runs
    (or while the work's stack unwinds) must not raise there, where nothing catches it."""
    import signal

    def on_expiry() -> str:
        signal.setitimer(signal.ITIMER_REAL, 0.01)  # a repeat, due while on_expiry still runs
        stop = time.monotonic() + 0.2
        while time.monotonic() < stop:
            pass
        return "stopped"

    def work() -> str:
        while True:
            pass

    assert bounded.call_within(work, 0.1, on_expiry) == "stopped"


def test_an_inner_bound_does_not_extend_an_outer_deadline():
    """An inner call with a longer bound than the outer one has left stops at the outer deadline, and the
    outer call then reports its own expiry; with the inner bound longer than the outer, the old code let
    the work run the inner bound's full 5 s."""
    def slow() -> str:
        time.sleep(5)
        return "finished"

    def outer() -> str:
        inner = bounded.call_within(slow, 5.0, lambda: "inner stopped")
        time.sleep(5)  # the outer deadline has passed: its timer is due at once
        return inner

    started = time.monotonic()
    assert bounded.call_within(outer, 0.3, lambda: "outer stopped") == "outer stopped"
    assert time.monotonic() - started < 1.5
    # The other way round, the inner bound is the shorter one and the outer call goes on.
    assert bounded.call_within(lambda: bounded.call_within(slow, 0.2, lambda: "inner stopped"), 5.0,
                               lambda: "outer stopped") == "inner stopped"


@pytest.mark.timeout(120)
def test_a_worker_busy_on_an_endless_task_exits_when_its_parent_is_killed(handlers, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    parent = subprocess.Popen(
        [sys.executable, "-c", f"""
import sys, threading
sys.path.insert(0, {str(tmp_path)!r})
from reasonrl.rewards.bounded import Handler, run_in_workers, shared_pool
handler = Handler({handlers!r}, "spins")
def report():
    import time
    while not any(w.task is not None for w in shared_pool(handler).workers):
        time.sleep(0.05)
    print(shared_pool(handler).workers[0].process.pid, flush=True)
threading.Thread(target=report, daemon=True).start()
run_in_workers(handler, {{0: (600.0,)}}, 600.0, workers=1, on_stopped=lambda task, why: None)
"""], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)  # no atexit, no EOF: the worker spins on
    parent.wait()
    deadline = time.monotonic() + 30
    while _alive(worker):
        assert time.monotonic() < deadline, "the worker outlived its killed parent"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie has exited
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_an_inner_bound_gives_the_outer_timer_back_less_the_time_it_spent():
    import signal

    outer_handler = signal.signal(signal.SIGALRM, lambda *args: None)
    outer_timer = signal.getitimer(signal.ITIMER_REAL)  # pytest-timeout's, if it set one
    try:
        signal.setitimer(signal.ITIMER_REAL, 20.0)
        assert bounded.call_within(lambda: time.sleep(0.5) or "done", 5.0, lambda: "stopped") == "done"
        assert 19.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 19.55
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer_timer)
        signal.signal(signal.SIGALRM, outer_handler)
