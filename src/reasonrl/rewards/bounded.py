"""Work on model text within a time bound, on any thread: the math checks of `rewards.equivalence`, the
scorers of reasoning-gym environments, anything a completion can make slow.

- On the main thread `call_within` runs the work here under a SIGALRM timer, which fires again every
  `EXPIRY_REPEAT_S` until the work stops: an expiry that lands in a garbage collection's weakref
  callback is dropped by the interpreter, and a timer that fired once would leave the work unbounded.
- On any other thread no signal arrives and a thread cannot be killed, so the work goes to a
  `WorkerPool`: worker processes (fresh interpreters, reused across calls, shut down at exit) that run
  the functions (`Handler`s) of one module whose file imports no reasonrl module (a worker loads that
  file alone, not the package, whose import pulls in torch and takes seconds). A task past its deadline
  is killed with its worker, which is replaced. `call_bounded` picks between the two.
What is not bounded: the wait for a pool that another thread's call holds (calls on one pool take
turns), and the start of a worker (its own, longer, bound: `_STARTUP_TIMEOUT_S`).
Work stopped at its bound, or whose worker died (out of memory), is counted by the caller's `on_expiry`
(`count_stopped`): `timeouts_on_this_thread()`, which `rewards.compose` reads into each scored group
(the trainer logs `reward/timeouts`).

Written by hand: `concurrent.futures.ProcessPoolExecutor` and `multiprocessing.Pool` cannot kill the one
worker whose task is past its deadline (a stuck task holds its worker until it returns), and a forked
worker would inherit the trainer's threads and torch state.

This module imports no other reasonrl module: the workers load it alone.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


# --- counting what was stopped ---------------------------------------------------------------------------------------

class _TimeoutTally(threading.local):
    count = 0


_timeouts = _TimeoutTally()


def timeouts_on_this_thread() -> int:
    """How many pieces of reward work this thread has stopped at their time bound (or lost to a dying worker) so far,
    each scored 0. A caller counts those of a call as the difference before and after it, as `rewards.compose` does."""
    return _timeouts.count


def count_stopped(what: str) -> None:
    """Log and count (in `timeouts_on_this_thread`) a piece of reward work stopped at its time bound."""
    logger.warning("%s", what)
    _timeouts.count += 1


def count_stopped_elsewhere(count: int) -> None:
    """Count here work another thread stopped (and logged) for this one, e.g. an environment's verifier
    run in a pool thread during an episode, whose reward is read on this thread."""
    _timeouts.count += count


# --- the main thread: a timer ----------------------------------------------------------------------------------------

class _Expired(BaseException):
    """The timer of work on the main thread ran out. Not an Exception, so that no `except Exception` in sympy or
    a scorer takes it for a failed parse and goes on."""


class _Armed:
    depth = 0  # calls of call_within whose work is running (the main thread's only)


def _expire(signum: int, frame: object) -> None:
    # A repeat of the timer can be delivered after the work has stopped (while its stack unwinds, or in on_expiry):
    # raised there, the expiry would escape call_within and stop the caller.
    if _Armed.depth:
        raise _Expired


EXPIRY_REPEAT_S = 0.05
"""After the bound, the timer fires again every this many seconds until the work has stopped (module docstring)."""


def call_within(work: Callable[[], T], timeout_s: float, on_expiry: Callable[[], T]) -> T:
    """`work()`, or `on_expiry()` once a SIGALRM timer has stopped it after `timeout_s` seconds (the
    timer fires again every `EXPIRY_REPEAT_S` until it has): main thread only, where signals arrive.
    A timer that was running (an enclosing call's, pytest-timeout's) is set again afterwards, less the time spent
    here; when it is due before `timeout_s`, it bounds this work too, so an inner call never extends an outer
    deadline. Work that returns past its deadline caught the expiry (a bare `except:` in a scorer turns it
    into a 0 score): its result is dropped for `on_expiry()`, so that it is counted as stopped."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("call_within bounds work on the main thread only (signals reach no other); "
                           "call_bounded works on any thread")
    handler = signal.signal(signal.SIGALRM, _expire)
    started = time.monotonic()
    outer_delay = outer_interval = 0.0
    try:
        _Armed.depth += 1
        try:
            outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s, EXPIRY_REPEAT_S)
            if 0 < outer_delay < timeout_s:
                signal.setitimer(signal.ITIMER_REAL, outer_delay, EXPIRY_REPEAT_S)
            result = work()
        finally:
            _Armed.depth -= 1
            signal.setitimer(signal.ITIMER_REAL, 0)
        deadline_s = min(timeout_s, outer_delay) if outer_delay > 0 else timeout_s
        return on_expiry() if time.monotonic() - started >= deadline_s else result
    except _Expired:
        return on_expiry()
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)
        if outer_delay:
            remaining = max(outer_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, remaining, outer_interval)


# --- any thread: worker processes ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Handler:
    """The function `function` of module `module`, whose file imports no reasonrl module: a worker loads that
    file alone (one pool of workers per module serves all its functions). Its arguments and result cross a
    socket, so they must pickle."""

    module: str
    function: str

    def resolve(self) -> Callable[..., Any]:
        """The function in this process (looked up at each call, so that a replaced module attribute is seen)."""
        return getattr(importlib.import_module(self.module), self.function)


def call_bounded(handler: Handler, args: tuple, timeout_s: float, on_expiry: Callable[[str], T]) -> T:
    """`handler(*args)` within `timeout_s` seconds on any thread, else `on_expiry(why it stopped)`: here under a
    timer on the main thread, in a worker process on any other (a round trip per call, and once per process the
    worker's start)."""
    if threading.current_thread() is threading.main_thread():
        function = handler.resolve()
        return call_within(lambda: function(*args), timeout_s, lambda: on_expiry(f"exceeded {timeout_s:g} s"))
    return run_in_workers(handler, {0: args}, timeout_s, workers=1, on_stopped=lambda task, why: on_expiry(why))[0]


_STARTUP_TIMEOUT_S = 120.0
# Run by a fresh interpreter: load this file and the handlers' module file alone under private names, then serve
# tasks on the socket whose descriptor is argv[4].
_WORKER_BOOT = """
import importlib.util, json, sys
sys.path[:] = json.loads(sys.argv[1])
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
bounded = load(sys.argv[2], "_reasonrl_bounded")
bounded._serve(int(sys.argv[4]), load(sys.argv[3], "_reasonrl_handlers"))
"""


def _serve(fd: int, module: Any) -> None:
    """A worker's loop: receive (task id, function name, args), send back (task id, module.function(*args)) until
    the parent hangs up. A task that raises, or whose arguments or result do not cross the socket, is a bug: its
    traceback goes to the parent, which raises it."""
    connection = Connection(fd)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    try:
        connection.send(("ready", os.getpid()))
        while True:
            message = connection.recv_bytes()
            try:
                task_id, function, args = pickle.loads(message)
                # No alarm here: the parent's deadline is the timer, and it is not limited to whole seconds.
                reply = pickle.dumps((task_id, getattr(module, function)(*args)))
            except Exception:  # noqa: BLE001 (see above)
                reply = pickle.dumps(("error", traceback.format_exc()))
            connection.send_bytes(reply)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent hung up: the pool was shut down or the parent exited


_PARENT_CHECK_S = 1.0


def _exit_with_parent(parent: int) -> None:
    """A worker's watch: a parent that was killed (SIGKILL: no EOF until the task ends) leaves a worker busy on an
    endless task behind; it exits once it is another process's child. (A task in C code that never releases the
    interpreter lock keeps this thread from running.)"""
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_S)
    os._exit(1)


@dataclass
class _Worker:
    process: subprocess.Popen
    connection: Connection
    ready: bool = False
    task: int | None = None  # the id of the task it runs
    deadline: float = 0.0

    def kill(self) -> None:
        self.connection.close()
        self.process.kill()
        self.process.wait()


def _start_worker(module: str) -> _Worker:
    parent_end, child_end = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER_BOOT, json.dumps(sys.path), os.path.abspath(__file__),
             os.path.abspath(importlib.util.find_spec(module).origin), str(child_end.fileno())],
            pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,  # no Ctrl-C noise
        )
    finally:
        child_end.close()
    return _Worker(process, Connection(parent_end.detach()), deadline=time.monotonic() + _STARTUP_TIMEOUT_S)


@dataclass
class WorkerPool:
    """Worker processes serving the handlers of one module; `run` hands them tasks, each with a deadline."""

    module: str
    workers: list[_Worker] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    replaced: int = 0  # workers killed for exceeding their deadline or dying, over the pool's life
    closed: bool = False

    def grow(self, size: int) -> None:
        while len(self.workers) < size:
            self.workers.append(_start_worker(self.module))

    def replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = _start_worker(self.module)
        self.replaced += 1

    def run(self, function: str, tasks: dict[int, tuple], timeout_s: float, size: int,
            on_stopped: Callable[[int, str], Any], affinity: Callable[[tuple], Hashable] | None = None) -> dict[int, Any]:
        """`function`'s result for each task (id -> args) from the first `size` workers; a task past `timeout_s`,
        or whose worker dies, gets `on_stopped(task id, why)`. Tasks with one `affinity(args)` go to one worker
        while it has them (the math checks' gold answer: that worker parses it once)."""
        self.grow(size)
        try:
            return self._run(function, tasks, timeout_s, size, on_stopped, affinity)
        except BaseException:
            # A worker still busy would later answer a task of this call as if it were one of the next call's;
            # one still starting may be the cause. Both go; the next call starts new ones.
            for worker in [w for w in self.workers if w.task is not None or not w.ready]:
                worker.kill()
                self.workers.remove(worker)
            raise

    def _run(self, function: str, tasks: dict[int, tuple], timeout_s: float, size: int,
             on_stopped: Callable[[int, str], Any], affinity: Callable[[tuple], Hashable] | None) -> dict[int, Any]:
        # An idle worker with nothing left of its own takes a new key, or the last task of the longest queue.
        by_key: dict[Hashable, deque[int]] = {}
        for task_id, args in tasks.items():
            by_key.setdefault(task_id if affinity is None else affinity(args), deque()).append(task_id)
        unclaimed, queues = deque(by_key.values()), [deque() for _ in range(size)]

        def next_task(slot: int) -> int | None:
            if not queues[slot]:
                if unclaimed:
                    queues[slot] = unclaimed.popleft()
                elif donor := max(queues, key=len):
                    queues[slot].append(donor.pop())
            return queues[slot].popleft() if queues[slot] else None

        results: dict[int, Any] = {}
        while unclaimed or any(queues) or any(w.task is not None for w in self.workers):
            now = time.monotonic()
            for slot, worker in enumerate(self.workers[:size]):
                if worker.ready and worker.task is None and (task := next_task(slot)) is not None:
                    try:
                        worker.connection.send((task, function, tasks[task]))
                    except OSError:  # it died idle (killed from outside): its replacement takes the task
                        queues[slot].appendleft(task)
                        self.replace(worker)
                        continue
                    worker.task, worker.deadline = task, now + timeout_s
            waiting = [w for w in self.workers if not w.ready or w.task is not None]
            earliest = min(w.deadline for w in waiting)
            readable = wait([w.connection for w in waiting], timeout=max(0.0, earliest - time.monotonic()))
            for worker in [w for w in waiting if w.connection in readable]:
                self._receive(worker, function, results, on_stopped)
            now = time.monotonic()
            for worker in [w for w in self.workers if (not w.ready or w.task is not None) and w.deadline < now]:
                if not worker.ready:
                    raise RuntimeError(f"a worker for {self.module} did not start within {_STARTUP_TIMEOUT_S:.0f} s; "
                                       "its stderr (above) says why")
                results[worker.task] = on_stopped(worker.task, f"exceeded {timeout_s:g} s (worker restarted)")
                self.replace(worker)
        return results

    def _receive(self, worker: _Worker, function: str, results: dict[int, Any],
                 on_stopped: Callable[[int, str], Any]) -> None:
        try:
            message = worker.connection.recv()
        except (EOFError, OSError):
            if not worker.ready:
                raise RuntimeError(f"a worker for {self.module} exited with code {worker.process.wait()} while "
                                   "starting; its stderr (above) says why") from None
            # Killed from outside or out of memory on a pathological input: scored like a timeout.
            results[worker.task] = on_stopped(worker.task,
                                              f"lost its worker (exit code {worker.process.poll()}; restarted)")
            worker.task = None
            self.replace(worker)
            return
        if message[0] == "ready":
            worker.ready = True
        elif message[0] == "error":
            worker.task = None
            raise RuntimeError(f"{self.module}.{function} failed in a worker process:\n{message[1]}")
        else:
            results[message[0]] = message[1]
            worker.task = None

    def close(self) -> None:
        self.closed = True
        for worker in self.workers:
            worker.connection.close()  # the worker reads EOF and exits
        for worker in self.workers:
            try:
                worker.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                worker.kill()
        self.workers.clear()


_pools: dict[str, WorkerPool] = {}
_pools_guard = threading.Lock()


def _forget_parent_pools() -> None:
    """In a forked child: its parent's workers are not its own, and the guard may have been held at the fork."""
    global _pools, _pools_guard
    _pools, _pools_guard = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_parent_pools)


def shared_pool(handler: Handler) -> WorkerPool:
    """This process's pool for `handler`'s module, made on first use."""
    with _pools_guard:
        pool = _pools.get(handler.module)
        if pool is None:
            pool = _pools[handler.module] = WorkerPool(handler.module)
        return pool


def run_in_workers(handler: Handler, tasks: dict[int, tuple], timeout_s: float, *, workers: int,
                   on_stopped: Callable[[int, str], Any],
                   affinity: Callable[[tuple], Hashable] | None = None) -> dict[int, Any]:
    """`WorkerPool.run` on the shared pool for `handler`, with `workers` workers (0: one per CPU core). Safe on any
    thread; concurrent calls take turns on the pool. POSIX only (the workers inherit a socket)."""
    while True:
        pool = shared_pool(handler)
        with pool.lock:
            if not pool.closed:  # else shut down by another thread between the two lines above: take the new pool
                return pool.run(handler.function, tasks, timeout_s, workers or os.cpu_count() or 1, on_stopped,
                                affinity)


@atexit.register
def shutdown_pools(handler: Handler | None = None) -> None:
    """Stop the worker processes of `handler`'s module's pool, or of every pool (also run at interpreter exit); the
    next call starts new ones."""
    with _pools_guard:
        chosen = [module for module in _pools if handler is None or module == handler.module]
        pools = [_pools.pop(module) for module in chosen]
    for pool in pools:
        with pool.lock:
            pool.close()
