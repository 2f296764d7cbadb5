"""Whether two math answers are equal: `math_equal` for one pair, `check_many` for many, each check
within a time bound. Plain numbers are compared directly (this runs thousands of times per training
step), anything else symbolically with math-verify (Kydlíček 2025, github.com/huggingface/Math-Verify),
the checker Open-R1 uses. An unparseable answer is not equal to anything; that is a legitimate verdict,
not an error.

What counts as equal (beyond math-verify's own rules):
- Thousands separators ("1,234", "1{,}234", "10\\!000") and scientific notation ("1.5e3") are numbers.
- Units are dropped where that cannot change the number: "\\text{...}" suffixes, a leading "$"
  or "\\$", and trailing words after a plain number ("5 dollars", "3 apples"), except words that
  are mathematics ("5 pi" stays 5*pi).
- Percent follows math-verify: "50\\%" equals 0.5 (its value) and, for an integer percentage, 50 (the
  same number with the sign dropped or added); "0.5\\%" equals 0.005 only. 0.5 never equals 50.
- A set written with braces never equals a bracketed tuple or interval ("\\{1,2\\}" vs "(1,2)"),
  which math-verify would otherwise accept; sets compare without order, tuples with it.

Bounded time. Every symbolic check has a time bound, `timeout_s` seconds (default `CHECK_TIMEOUT_S`), on any thread:
- On the main thread `math_equal` runs sympy here under a SIGALRM timer, which fires again every
  `EXPIRY_REPEAT_S` until the check stops: an expiry that lands in a garbage collection's weakref
  callback is dropped by the interpreter. (math-verify's own timeouts are alarms too, but they swallow
  their expiry, so a stopped check could not be told from a wrong answer; they stay off.)
- On any other thread no signal can stop it, and a thread cannot be killed, so the check goes to
  `check_many`'s pool (one worker), whose worker is killed at the deadline. That costs a round trip
  to the worker per symbolic check (plain numbers and the other cheap verdicts never leave the thread)
  and, once per process, the worker's start (about a second). Without it, a check such as
  (x+1)^{10000} against (x+2)^{10000} on a rollout thread ran for over a minute.
- `check_many` checks many pairs in a pool of worker processes (fresh interpreters, reused across
  calls, shut down at exit): a check past `timeout_s` is killed with its worker, which is replaced.
  `PooledMathReward` (reasonrl.rewards.math) scores a whole group through it.
A check stopped at its bound, or whose worker died (out of memory), scores 0 and is counted:
`timeouts_on_this_thread()`, which `rewards.compose` reads into each scored group (the trainer logs
`reward/timeouts`). Before any of this, size limits keep sympy from known blow-ups (`_cost_refusal`):
at most `MAX_ANSWER_CHARS` characters a side, no nested exponents (power towers like 10^{10^{10}}),
integer exponents up to 10^4, factorials of at most 10^5. An answer beyond them scores 0 at once.
Answers past `MAX_NORMALIZED_CHARS` are not even normalised: they equal only the same text.

This module imports no other reasonrl module: `check_many`'s workers load this file alone (not the
package, whose import pulls in torch and takes seconds).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from multiprocessing.connection import Connection, wait
from typing import TypeVar

from math_verify import parse, verify

logger = logging.getLogger(__name__)
T = TypeVar("T")


class _OwnTimeouts(logging.Filter):
    """Drops math-verify's one-time warning that, its timeouts being off, the caller must bound the time: we do."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _module in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_module).addFilter(_OwnTimeouts())

_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def strip_thousands_commas(text: str) -> str:
    return _THOUSANDS_COMMA.sub("", text)



# --- normalisation and the cheap verdicts ----------------------------------------------------------------------------

MAX_ANSWER_CHARS = 400
MAX_NORMALIZED_CHARS = 10 * MAX_ANSWER_CHARS  # longer: compared as text only (see `_quick_verdict`)
"""Longer answers (after normalisation) score 0 without reaching sympy; boxed answers are far shorter."""
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 100_000
CHECK_TIMEOUT_S = 5.0
"""The default time bound of one symbolic check, in seconds (the module docstring says how it is kept)."""

_LATEX_SPACING = re.compile(r"(?<!\\)\\[!,;: ]|~")  # not the "\\ " of a matrix row break
_DIGIT_GROUPING = re.compile(r"(?<=\d)(?:\{,\}|\\,|\\!|\\ )(?=\d{3})")
_CURRENCY = re.compile(r"^(?:\\\$|\$)\s*(?=[-+]?\.?\d)")
_TEXT_SUFFIX = re.compile(r"^(.*?[\d}])\s*\\(?:text|textbf|mbox|mathrm)\{\s*[A-Za-z][A-Za-z .]*\}\s*$")
# Words after a plain number that are mathematics, not a unit: "5 pi" is 5*pi.
_MATH_WORDS = frozenset({"pi", "e", "i", "sqrt", "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "and",
                         "or", "percent", "percentage", "degree", "degrees", "times", "over", "plus", "minus"})
_UNIT_WORDS = re.compile(r"^(.*?\d)\s+([A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*)\.?$")
_SET_LITERAL = re.compile(r"^(?:\\left)?\\\{.*(?:\\right)?\\\}$", re.DOTALL)
# The "\right" of "\left( ... \right)" is part of what ".*" takes; "[^,]*," (not ".*,") keeps the match linear.
_ORDERED_LITERAL = re.compile(r"^(?:\\left)?[(\[][^,]*,.*[)\]]$", re.DOTALL)
_INTEGER = re.compile(r"\d+")


def _normalize(text: str) -> str:
    """The answer with math-mode dollars, LaTeX spacing, digit grouping and safe-to-drop units removed."""
    text = text.strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    text = _DIGIT_GROUPING.sub("", text)
    text = _LATEX_SPACING.sub(" ", text).strip()
    text = _CURRENCY.sub("", text)
    if match := _TEXT_SUFFIX.match(text):
        text = match.group(1).strip()
    if ((match := _UNIT_WORDS.match(text)) and as_plain_number(match.group(1)) is not None
            and not set(match.group(2).lower().split()) & _MATH_WORDS):
        text = match.group(1).strip()
    return text


def as_plain_number(text: str) -> float | None:
    text = strip_thousands_commas(text.strip())
    return float(text) if _PLAIN_NUMBER.fullmatch(text) else None


def _scientific_as_latex(text: str) -> str:
    """"6.02e23" as "6.02 \\times 10^{23}": math-verify would read the former as 6.02 * e * 23."""
    if not _PLAIN_NUMBER.fullmatch(text) or not re.search(r"[eE]", text):
        return text
    mantissa, exponent = re.split(r"[eE]", text)
    return f"{mantissa} \\times 10^{{{exponent}}}"


def _braced_group(text: str, open_at: int) -> str:
    """The text inside the bracket that opens at `open_at`, up to its matching close (or the end)."""
    closer = {"{": "}", "(": ")", "[": "]"}[text[open_at]]
    depth = 0
    for index in range(open_at, len(text)):
        depth += text[index] == text[open_at]
        depth -= text[index] == closer
        if depth == 0:
            return text[open_at + 1 : index]
    return text[open_at + 1 :]


def _matching_open(text: str, close_at: int) -> int:
    opener = {"}": "{", ")": "(", "]": "["}[text[close_at]]
    depth = 0
    for index in range(close_at, -1, -1):
        depth += text[index] == text[close_at]
        depth -= text[index] == opener
        if depth == 0:
            return index
    return 0


def _cost_refusal(text: str) -> str | None:
    """Why sympy might not finish on `text` in reasonable time, or None: the limits of the module docstring."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    for caret in (index for index, char in enumerate(text) if char == "^"):
        rest = text[caret + 1 :].lstrip()
        if not rest:
            continue
        if rest[0] in "{([":
            exponent = _braced_group(rest, 0)
            after = rest[len(exponent) + 2 :]
        else:
            exponent = re.match(r"\\?[^\s\\]?\w*", rest).group()
            after = rest[len(exponent) :]
        if "^" in exponent or "!" in exponent or after.lstrip().startswith("^"):  # 10^{10^{10}} or 2^2^2
            return "nested exponent"
        if any(int(digits) > MAX_EXPONENT for digits in _INTEGER.findall(exponent)):
            return f"exponent above {MAX_EXPONENT}"
    for bang in (index for index, char in enumerate(text) if char == "!" and index > 0):
        before = text[:bang].rstrip()
        if before and before[-1] in "})]":
            argument = before[_matching_open(before, len(before) - 1) :]
        else:
            argument = re.search(r"\d*$", before).group()
        if "^" in argument or any(int(digits) > MAX_FACTORIAL for digits in _INTEGER.findall(argument)):
            return f"factorial of a power or of more than {MAX_FACTORIAL}"
    return None


def _quick_verdict(prediction: str | None, gold: str) -> tuple[bool | None, str, str]:
    """(verdict, normalised prediction, normalised gold); verdict None means "ask sympy"."""
    if prediction is None or not prediction.strip():
        return False, "", gold
    if max(len(prediction), len(gold)) > MAX_NORMALIZED_CHARS:  # no number or formula; G^2 pairs of them add up
        return prediction.strip() == gold.strip(), prediction, gold
    prediction, gold = _normalize(prediction), _normalize(gold)
    prediction_number, gold_number = as_plain_number(prediction), as_plain_number(gold)
    if prediction_number is not None and gold_number is not None and math.isfinite(prediction_number + gold_number):
        return math.isclose(prediction_number, gold_number, rel_tol=1e-9, abs_tol=1e-12), prediction, gold
    if prediction == gold:
        return True, prediction, gold
    prediction, gold = _scientific_as_latex(prediction), _scientific_as_latex(gold)
    if _cost_refusal(prediction) or _cost_refusal(gold):
        return False, prediction, gold
    # math-verify reads "(1,2)" as an interval and lets it equal the set {1,2}; a written set is not a tuple.
    if (_SET_LITERAL.match(prediction) and _ORDERED_LITERAL.match(gold)) or (
        _ORDERED_LITERAL.match(prediction) and _SET_LITERAL.match(gold)
    ):
        return False, prediction, gold
    return None, prediction, gold


# Cached because every completion in a group is checked against the same gold answer.
@lru_cache(maxsize=65536)
def _parse_latex(text: str) -> tuple:
    # Unwrapped LaTeX such as "x+1" is not recognised by math_verify's parser, so wrap it.
    wrapped = text if text.startswith("$") and text.endswith("$") else f"${text}$"
    return tuple(parse(wrapped, parsing_timeout=None))


def _symbolic_equal(prediction: str, gold: str) -> bool:
    """math-verify's verdict, without its own timeouts: the caller bounds the time."""
    gold_parsed, prediction_parsed = _parse_latex(gold), _parse_latex(prediction)
    if not gold_parsed or not prediction_parsed:
        return False
    return verify(list(gold_parsed), list(prediction_parsed), timeout_seconds=None)


class _TimeoutTally(threading.local):
    count = 0


_timeouts = _TimeoutTally()


def timeouts_on_this_thread() -> int:
    """How many checks this thread has stopped at their time bound (or lost to a dying worker) so far, each scored
    0. A caller counts those of a call as the difference before and after it, as `rewards.compose` does."""
    return _timeouts.count


def count_stopped(what: str) -> None:
    """Log and count (in `timeouts_on_this_thread`) a piece of reward work stopped at its time bound."""
    logger.warning("%s", what)
    _timeouts.count += 1


def _stopped(prediction: str, gold: str, why: str) -> bool:
    count_stopped(f"math check {why} and scores 0: prediction {prediction[:200]!r}, gold {gold[:200]!r}")
    return False


class _Expired(BaseException):
    """The timer of a check on the main thread ran out. Not an Exception, so that no `except Exception` in sympy or
    math-verify takes it for a failed parse and goes on."""


def _expire(signum: int, frame: object) -> None:
    raise _Expired


EXPIRY_REPEAT_S = 0.05
"""After a check's bound, its timer fires again every this many seconds until the check has stopped: an
expiry raised while the interpreter runs a weakref callback or a finaliser (a garbage collection inside
sympy) is printed and dropped there, and a timer that fired once would leave the check unbounded."""


def _equal_within(prediction: str, gold: str, timeout_s: float) -> bool:
    """`_symbolic_equal`, stopped (False, counted) after `timeout_s` seconds: main thread only."""
    return call_within(lambda: _symbolic_equal(prediction, gold), timeout_s,
                       lambda: _stopped(prediction, gold, f"exceeded {timeout_s:g} s"))


def call_within(work: Callable[[], T], timeout_s: float, on_expiry: Callable[[], T]) -> T:
    """`work()`, or `on_expiry()` once a SIGALRM timer has stopped it after `timeout_s` seconds (the
    timer fires again every `EXPIRY_REPEAT_S` until it has): main thread only, where signals arrive.
    A timer that was running (pytest-timeout's, say) is set again afterwards, less the time spent here."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("call_within bounds work on the main thread only (signals reach no other)")
    handler = signal.signal(signal.SIGALRM, _expire)
    started = time.monotonic()
    outer_delay = outer_interval = 0.0
    try:
        try:
            outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, timeout_s, EXPIRY_REPEAT_S)
            return work()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Expired:
        return on_expiry()
    finally:
        signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)
        if outer_delay:
            remaining = max(outer_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, remaining, outer_interval)


def math_equal(prediction: str | None, gold: str, *, timeout_s: float = CHECK_TIMEOUT_S) -> bool:
    """Whether `prediction` is mathematically equal to `gold` (e.g. "0.5" and "\\frac{1}{2}").

    Safe on any thread. A symbolic check runs for at most `timeout_s` seconds (then it is False and counted in
    `timeouts_on_this_thread`): under a timer on the main thread, in a worker process on any other (the module
    docstring says why). For many pairs at once use `check_many`.
    """
    if not timeout_s > 0:
        raise ValueError(f"math_equal: timeout_s must be > 0, got {timeout_s}")
    verdict, prediction, gold = _quick_verdict(prediction, gold)
    if verdict is not None:
        return verdict
    if threading.current_thread() is threading.main_thread():
        return _equal_within(prediction, gold, timeout_s)
    return _pool_verdicts({0: (prediction, gold)}, timeout_s, workers=1)[0]


# --- the process pool ------------------------------------------------------------------------------------------------

_STARTUP_TIMEOUT_S = 120.0
# Run by a fresh interpreter: load this file alone (not the reasonrl package, whose import pulls in torch and
# takes seconds) under a private name, then serve checks on the socket whose descriptor is argv[2].
_WORKER_BOOT = """
import importlib.util, json, sys
sys.path[:] = json.loads(sys.argv[3])
spec = importlib.util.spec_from_file_location("_reasonrl_math_worker", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
module._serve(int(sys.argv[2]))
"""


def _serve(fd: int) -> None:
    """A worker's loop: receive (task id, prediction, gold), send back (task id, verdict) until the parent hangs up."""
    # math-verify warns once that its timeout is off; here the parent's deadline is the timeout.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    connection = Connection(fd)
    try:
        connection.send(("ready", os.getpid()))
        while True:
            task_id, prediction, gold = connection.recv()
            try:
                # No alarm here: the parent's deadline is the timer, and it is not limited to whole seconds.
                verdict = _symbolic_equal(prediction, gold)
            except Exception:  # noqa: BLE001 (a bug: hand the traceback to the parent, which raises it)
                connection.send(("error", traceback.format_exc()))
            else:
                connection.send((task_id, verdict))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent hung up: the pool was shut down or the parent exited


@dataclass
class _Worker:
    process: subprocess.Popen
    connection: Connection
    ready: bool = False
    task: int | None = None  # index into the pairs being checked
    deadline: float = 0.0

    def kill(self) -> None:
        self.connection.close()
        self.process.kill()
        self.process.wait()


def _start_worker() -> _Worker:
    parent_end, child_end = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-c", _WORKER_BOOT, os.path.abspath(__file__), str(child_end.fileno()),
             json.dumps(sys.path)],
            pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,  # no Ctrl-C noise
        )
    finally:
        child_end.close()
    return _Worker(process, Connection(parent_end.detach()), deadline=time.monotonic() + _STARTUP_TIMEOUT_S)


@dataclass
class _Pool:
    owner_pid: int = field(default_factory=os.getpid)
    workers: list[_Worker] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    replaced: int = 0  # workers killed for exceeding their deadline or dying, over the pool's life
    closed: bool = False

    def grow(self, size: int) -> None:
        while len(self.workers) < size:
            self.workers.append(_start_worker())

    def replace(self, worker: _Worker) -> None:
        worker.kill()
        self.workers[self.workers.index(worker)] = _start_worker()
        self.replaced += 1

    def run(self, tasks: dict[int, tuple[str, str]], timeout_s: float, size: int) -> dict[int, bool]:
        """Verdicts for `tasks` (index -> normalised (prediction, gold)) from the first `size` workers; a check past
        `timeout_s` is False."""
        self.grow(size)
        try:
            return self._run(tasks, timeout_s, size)
        except BaseException:
            # A worker still busy would later answer a task of this call as if it were one of the next call's;
            # one still starting may be the cause. Both go; the next call starts new ones.
            for worker in [w for w in self.workers if w.task is not None or not w.ready]:
                worker.kill()
                self.workers.remove(worker)
            raise

    def _run(self, tasks: dict[int, tuple[str, str]], timeout_s: float, size: int) -> dict[int, bool]:
        # Tasks sharing a gold answer go to one worker, which then parses that gold once (its parse cache);
        # an idle worker with nothing left of its own takes a new gold, or the last task of the longest queue.
        by_gold: dict[str, deque[int]] = {}
        for index, (_, gold) in tasks.items():
            by_gold.setdefault(gold, deque()).append(index)
        unclaimed, queues = deque(by_gold.values()), [deque() for _ in range(size)]

        def next_task(slot: int) -> int | None:
            if not queues[slot]:
                if unclaimed:
                    queues[slot] = unclaimed.popleft()
                elif donor := max(queues, key=len):
                    queues[slot].append(donor.pop())
            return queues[slot].popleft() if queues[slot] else None

        results: dict[int, bool] = {}
        while unclaimed or any(queues) or any(w.task is not None for w in self.workers):
            now = time.monotonic()
            for slot, worker in enumerate(self.workers[:size]):
                if worker.ready and worker.task is None and (task := next_task(slot)) is not None:
                    try:
                        worker.connection.send((task, *tasks[task]))
                    except OSError:  # it died idle (killed from outside): its replacement takes the task
                        queues[slot].appendleft(task)
                        self.replace(worker)
                        continue
                    worker.task, worker.deadline = task, now + timeout_s
            waiting = [w for w in self.workers if not w.ready or w.task is not None]
            earliest = min(w.deadline for w in waiting)
            readable = wait([w.connection for w in waiting], timeout=max(0.0, earliest - time.monotonic()))
            for worker in [w for w in waiting if w.connection in readable]:
                self._receive(worker, tasks, results)
            now = time.monotonic()
            for worker in [w for w in self.workers if (not w.ready or w.task is not None) and w.deadline < now]:
                if not worker.ready:
                    raise RuntimeError(f"a math verifier worker did not start within {_STARTUP_TIMEOUT_S:.0f} s; "
                                       "its stderr (above) says why, e.g. math_verify missing from this interpreter")
                results[worker.task] = _stopped(*tasks[worker.task], f"exceeded {timeout_s:g} s (worker restarted)")
                self.replace(worker)
        return results

    def _receive(self, worker: _Worker, tasks: dict[int, tuple[str, str]], results: dict[int, bool]) -> None:
        try:
            message = worker.connection.recv()
        except (EOFError, OSError):
            if not worker.ready:
                raise RuntimeError(f"a math verifier worker exited with code {worker.process.wait()} while starting; "
                                   "its stderr (above) says why") from None
            # Killed from outside or out of memory on a pathological answer: the check scores 0, like a timeout.
            results[worker.task] = _stopped(*tasks[worker.task],
                                            f"lost its worker (exit code {worker.process.poll()}; restarted)")
            worker.task = None
            self.replace(worker)
            return
        if message[0] == "ready":
            worker.ready = True
        elif message[0] == "error":
            worker.task = None
            raise RuntimeError(f"math verification raised in a worker process:\n{message[1]}")
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


_pool: _Pool | None = None
_pool_guard = threading.Lock()


def _shared_pool() -> _Pool:
    global _pool
    with _pool_guard:
        if _pool is None or _pool.owner_pid != os.getpid():  # a forked child must not use its parent's workers
            _pool = _Pool()
        return _pool


@atexit.register
def shutdown_pool() -> None:
    """Stop `check_many`'s worker processes (also run at interpreter exit); the next call starts new ones."""
    global _pool
    with _pool_guard:
        pool, _pool = _pool, None
    if pool is not None and pool.owner_pid == os.getpid():
        with pool.lock:
            pool.close()


def check_many(pairs: Sequence[tuple[str | None, str]], *, workers: int = 0, timeout_s: float = 5.0) -> list[bool]:
    """`math_equal(prediction, gold)` for every (prediction, gold) pair, each within `timeout_s` seconds.

    Plain numbers and the other cheap verdicts are decided here; the rest go to a pool of `workers` worker
    processes (0: one per CPU core), started on first use and kept for later calls (a call asking for fewer
    workers than the pool holds uses some of them). A check that exceeds `timeout_s` is False and its worker is
    killed and replaced (counted in `timeouts_on_this_thread`, as is a worker that dies). Safe to call from any thread;
    concurrent calls take turns on the pool. POSIX only (the workers inherit a socket).
    """
    if workers < 0 or not timeout_s > 0:
        raise ValueError(f"check_many: need workers >= 0 and timeout_s > 0, got workers={workers}, "
                         f"timeout_s={timeout_s}")
    results: list[bool | None] = []
    tasks: dict[int, tuple[str, str]] = {}
    for index, (prediction, gold) in enumerate(pairs):
        verdict, prediction, gold = _quick_verdict(prediction, gold)
        results.append(verdict)
        if verdict is None:
            tasks[index] = (prediction, gold)
    if tasks:
        for index, verdict in _pool_verdicts(tasks, timeout_s, workers).items():
            results[index] = verdict
    return [bool(verdict) for verdict in results]


def _pool_verdicts(tasks: dict[int, tuple[str, str]], timeout_s: float, workers: int) -> dict[int, bool]:
    """The shared pool's verdicts for `tasks` (index -> normalised (prediction, gold)), from `workers` workers (0: one
    per CPU core)."""
    while True:
        pool = _shared_pool()
        with pool.lock:
            if not pool.closed:  # else shut down by another thread between the two lines above: take the new pool
                return pool.run(tasks, timeout_s, size=workers or os.cpu_count() or 1)


# --- the reward ------------------------------------------------------------------------------------------------------
