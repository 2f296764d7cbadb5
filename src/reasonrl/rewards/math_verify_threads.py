"""math-verify off the main thread: without its timer, where the timer raises.

math-verify's `parse` and `verify` bound their own time with a SIGALRM timer unless called with their
timeouts off, and that timer raises ValueError off the main thread, where asynchronous rollouts and
agent episodes score. Code that calls them with the defaults and takes any exception for a wrong
answer (verifiers' `verify_boxed_math_answer`, a reward of one's own) then scores every answer 0 on
those threads, and nothing says so. `untimed_off_the_main_thread()` makes both run without the timer
off the main thread (on it they keep it): answers score as on the main thread, and such a check is
bounded only by what calls it (reasonrl's own math checks run with math-verify's timeouts off, under
`rewards.bounded`). The trainer applies it when it builds the reward, and a verifiers environment
when it is loaded.
"""

from __future__ import annotations

import functools
import threading
from typing import Any


@functools.cache
def untimed_off_the_main_thread() -> None:
    """math-verify applies its timer at each call through the name `timeout` in its parser and grader:
    off the main thread that name now gives none (module docstring)."""
    try:
        from math_verify import grader, parser
    except ImportError:  # not installed: nothing to mend
        return
    for module in (parser, grader):
        with_signal = module.timeout
        if getattr(with_signal, "main_thread_only", False):
            continue

        def timeout(timeout_seconds: int | None = 10, _with_signal: Any = with_signal) -> Any:
            on_main = threading.current_thread() is threading.main_thread()
            return _with_signal(timeout_seconds if on_main else None)

        timeout.main_thread_only = True  # type: ignore[attr-defined]
        module.timeout = timeout
