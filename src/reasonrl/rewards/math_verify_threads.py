"""math-verify off the main thread: its time limit kept, by waiting instead of a signal.

math-verify's `parse`, `verify` and `math_metric` bound their own time with a SIGALRM timer unless
called with their timeouts off, and that timer raises ValueError off the main thread, where
asynchronous rollouts and agent episodes score. Code that calls them with the defaults and takes any
exception for a wrong answer (verifiers' `verify_boxed_math_answer`, a reward of one's own) then
scores every answer 0 on those threads, and nothing says so. After `bound_off_the_main_thread()`,
such a call off the main thread runs in a thread of its own that the caller waits for at most the
call's time limit: past it the caller gets math-verify's own TimeoutException (as the timer would
give it), counted in reward/timeouts, and the call is left running (a thread cannot be stopped: a
check that never ends keeps a core busy, as a blocking call left behind by an async reward does).
On the main thread the timer stays. reasonrl's own math checks run with math-verify's timeouts off,
under `rewards.bounded`. The trainer applies this when it builds the reward, and a verifiers
environment when it is loaded.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from reasonrl.rewards.bounded import count_stopped


def _waiting(func: Callable[..., Any], timeout_s: float, timed_out: type[BaseException]) -> Callable[..., Any]:
    """`func`, run in a daemon thread that the caller waits for at most `timeout_s` seconds."""

    @functools.wraps(func)
    def waited(*args: Any, **kwargs: Any) -> Any:
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = func(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 (re-raised in the caller's thread)
                outcome["error"] = exc

        worker = threading.Thread(target=run, daemon=True, name="reasonrl-math-verify")
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            count_stopped(f"math-verify: {getattr(func, '__name__', 'a check')} ran past its {timeout_s:g} s off the "
                          "main thread; left running, it ends as math-verify's timeout")
            raise timed_out("Operation timed out!")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    return waited


@functools.cache
def bound_off_the_main_thread() -> None:
    """math-verify applies its timer at each call through the name `timeout` in its parser, grader and
    metric modules: off the main thread that name now gives the waiting bound instead (module docstring)."""
    try:
        from math_verify import grader, metric, parser
        from math_verify.errors import TimeoutException
    except ImportError:  # not installed: nothing to mend
        return
    for module in (parser, grader, metric):
        with_signal = module.timeout
        if getattr(with_signal, "main_thread_only", False):
            continue

        def timeout(timeout_seconds: int | None = 10, _with_signal: Any = with_signal) -> Any:
            if threading.current_thread() is threading.main_thread() or not timeout_seconds or timeout_seconds <= 0:
                return _with_signal(timeout_seconds)
            return lambda func: _waiting(func, timeout_seconds, TimeoutException)

        timeout.main_thread_only = True  # type: ignore[attr-defined]
        module.timeout = timeout
