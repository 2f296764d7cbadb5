"""How many CPU threads a run takes when other reasonrl runs share the machine's cores.

PyTorch starts one intra-op thread per core in every process. Two training runs on the same two
cores then run four spinning OpenMP threads, and each step of each run became 5-40x slower
(7.6 s -> 85-315 s). With run.threads=0 (the default) every run registers itself in a directory
of the user's (`<tmp>/reasonrl-<uid>/cpu`: one small file per process, naming its threads) and
takes an equal share of the cores it may use, at least one thread; the share is re-divided at
every step, as runs start and finish, through torch.set_num_threads. A run given run.threads=N
keeps N, and OMP_NUM_THREADS in the environment is taken as the user's own N. When the threads
of the runs it sees add up to more than the cores, the run says so once, with the fix.

What it cannot see: processes of other users, of other frameworks, or reasonrl used without a run
(e.g. `reasonrl eval`); for those the docs say what to set (docs/configuration.md).

Written here because neither torch nor the usual process libraries share cores between unrelated
processes; psutil would only list them, and this needs no extra dependency.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (a
    container's --cpus); 1 when neither can be read."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, quota)) if quota else max(1, cores)


def _cgroup_quota() -> int:
    """The CPUs a cgroup v2 quota allows, rounded up (0: no quota, or not readable)."""
    try:
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return 0
    if limit == "max":
        return 0
    return math.ceil(int(limit) / int(period))


def default_directory() -> Path:
    """Where this user's runs register (per user: another user's files cannot steer our threads)."""
    return Path(tempfile.gettempdir()) / f"reasonrl-{os.getuid() if hasattr(os, 'getuid') else 'user'}" / "cpu"


class CpuShare:
    """This process's entry among the registered runs, and the threads it takes.

    `requested` is run.threads (0: share); `cores` the cores to share; `say` shows a line to the
    user. `rebalance()` applies the current share and returns the threads taken."""

    def __init__(self, requested: int, *, directory: Path | None = None, cores: int | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.cores = cores or usable_cores()
        self.directory = directory or default_directory()
        environment = os.environ.get("OMP_NUM_THREADS", "")
        self.fixed = requested or (int(environment) if environment.isdigit() and int(environment) > 0 else 0)
        self.say = say or (lambda line: tqdm.write(line, file=sys.stderr))
        self.threads = 0
        self._entry = self.directory / str(os.getpid())
        self._warned_for: tuple[int, int] | None = None

    def join(self) -> CpuShare:
        """Register and take this process's share now."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            self.directory = Path()  # unwritable: no sharing, the share of a lone run
        self._write(self.fixed or 1)  # seen by the others before this run sizes its own share
        # Left on every exit; a process that dies leaves a file the others recognise as dead.
        weakref.finalize(self, self._entry.unlink, missing_ok=True)
        self.rebalance()
        return self

    def rebalance(self) -> int:
        """Take the current share (set torch's threads when it changed) and warn once per new
        oversubscription; the threads taken."""
        others = self._others()
        runs = len(others) + 1
        share = max(1, self.cores // runs)
        threads = self.fixed or share
        if threads != self.threads:
            if self.threads:
                self.say(f"reasonrl: {runs} runs share {self.cores} cores: this one now uses {threads} thread(s)")
            torch.set_num_threads(threads)
            self.threads = threads
            self._write(threads)
        # The runs that share take `share` at their next step; the others keep what they were given.
        total = threads + sum(share if auto else fixed for auto, fixed in others.values())
        if total > self.cores and self._warned_for != (total, runs):
            self._warned_for = (total, runs)
            self.say(f"reasonrl: warning: {runs} reasonrl runs take {total} threads on {self.cores} cores (this one "
                     f"{threads}): oversubscribed cores make every step several times slower. Leave run.threads=0 "
                     f"(an equal share) and OMP_NUM_THREADS unset on each, or give run.threads=N adding up to at "
                     f"most {self.cores}" + (", or run fewer at once" if runs > self.cores else ""))
        return threads

    def leave(self) -> None:
        """Remove this process's entry (the others take its share at their next step)."""
        self._entry.unlink(missing_ok=True)

    def _write(self, threads: int) -> None:
        if self.directory == Path():
            return
        temporary = self._entry.with_suffix(".tmp")
        try:
            temporary.write_text(json.dumps({"threads": threads, "auto": not self.fixed,
                                             "started": _start_time(os.getpid())}))
            os.replace(temporary, self._entry)
        except OSError:
            pass  # a full or read-only disk costs the sharing, not the run

    def _others(self) -> dict[int, tuple[bool, int]]:
        """Whether every other live registered process shares, and its threads, by pid; dead ones'
        entries removed."""
        if self.directory == Path():
            return {}
        others = {}
        for entry in self.directory.glob("[0-9]*"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                record = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue  # being replaced, or not ours to read
            pid = int(entry.name)
            if _alive(pid, record.get("started")):
                others[pid] = (bool(record.get("auto", True)), max(1, int(record.get("threads", 1))))
            else:
                entry.unlink(missing_ok=True)
        return others


def _start_time(pid: int) -> str | None:
    """When `pid` started, in clock ticks since boot (Linux), so that a reused pid is not taken for
    the run that had it; None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # field 22; the name in parentheses may hold spaces


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    return started is None or _start_time(pid) in (started, None)
