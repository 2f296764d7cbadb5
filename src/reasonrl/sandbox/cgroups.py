"""A cgroup per sandbox run: one memory limit (swap included), one process limit and, where the
cpu controller is at hand, one CPU's worth of time for all the processes of the program together,
and a way to kill every one of them at the end.

Why a CPU bound: each process's RLIMIT_CPU counts that process only, so a program of 32 busy
processes could take 32 cores for its whole timeout; with the cgroup's quota a run takes at most
one core (the share `runner.MAX_PARALLEL` plans with), however many processes it makes.

cgroup v2 where this process may create cgroups with the memory and pids controllers enabled: as
root, or in a subtree delegated to the user (systemd's user@UID.service, `systemd-run --user
--scope -p Delegate=yes`), as a child of this process's cgroup or a sibling of it. Else cgroup v1
(its memory and pids hierarchies, in practice as root). Else none: the sandbox then refuses to let
the program create processes (see confine.py), so that one address-space limit bounds it.

The supervisor joins the cgroup before it forks anything; the program's processes ask the
cgroup's OOM killer to take them first (oom_score_adj). Cgroups of a trainer that died are killed
and removed when the next one starts (their names hold the creating pid).
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass

_PREFIX = "reasonrl-sandbox-"
_CPU_PERIOD_US = 100_000
_CPU_QUOTA_US = 100_000  # one CPU: the quota's time per period, for all the run's processes together
_counter = itertools.count()
_discovery_lock = threading.Lock()


@dataclass(frozen=True)
class Cgroup:
    version: int  # 1 or 2
    dirs: tuple[str, ...]  # v2: the cgroup; v1: its directory in the memory hierarchy, then in pids and cpu (if any)

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def oom_kills(self) -> int:
        """Processes the kernel killed because the cgroup ran out of memory."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            with open(os.path.join(self.dirs[0], name)) as f:
                fields = dict(line.split() for line in f if line.strip())
        except OSError:
            return 0
        return int(fields.get("oom_kill", 0))

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup until none is left (new ones are bounded by pids.max)."""
        kill_file = os.path.join(self.dirs[0], "cgroup.kill")
        if self.version == 2 and os.path.exists(kill_file):
            _write(kill_file, "1")
        deadline = time.monotonic() + 5.0
        while pids := self._pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise OSError(f"processes {sorted(pids)} of cgroup {self.dirs[0]} survive SIGKILL")
            time.sleep(0.002)

    def remove(self) -> None:
        for directory in self.dirs:
            for attempt in range(50):  # a killed process leaves its cgroup a moment after it is reaped
                try:
                    os.rmdir(directory)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt == 49:
                        raise
                    time.sleep(0.01)

    def _pids(self) -> set[int]:
        pids: set[int] = set()
        for procs in self.procs_files:
            try:
                with open(procs) as f:
                    pids.update(int(line) for line in f if line.strip())
            except FileNotFoundError:
                continue
        return pids


def create(memory_bytes: int, tasks: int) -> Cgroup | None:
    """A new cgroup limited to `memory_bytes` (no swap beyond it) and `tasks` processes and threads,
    None when this process cannot create one (see `parents`)."""
    found = parents()
    if found is None:
        return None
    version, bases = found
    name = f"{_PREFIX}{os.getpid()}-{next(_counter)}"
    dirs = tuple(os.path.join(base, name) for base in bases)
    for directory in dirs:
        os.mkdir(directory)
    cgroup = Cgroup(version, dirs)
    try:
        _set_limits(cgroup, memory_bytes, tasks)
    except BaseException:
        cgroup.remove()
        raise
    return cgroup


def describe() -> str:
    found = parents()
    if found is None:
        return "none"
    version, bases = found
    return f"cgroup v{version} under {', '.join(bases)}"


def parents() -> tuple[int, tuple[str, ...]] | None:
    """(version, directories to create run cgroups in), found and checked once per process."""
    with _discovery_lock:  # the first runs of run_many ask from several threads at once
        return _parents()


@functools.cache
def _parents() -> tuple[int, tuple[str, ...]] | None:
    for version, candidates in ((2, _v2_candidates()), (1, _v1_candidates())):
        for bases in candidates:
            if _works(version, bases):
                _sweep_stale(version, bases)
                return version, bases
    return None


def _set_limits(cgroup: Cgroup, memory_bytes: int, tasks: int) -> None:
    if cgroup.version == 2:
        directory = cgroup.dirs[0]
        _write(os.path.join(directory, "memory.max"), str(memory_bytes))
        _write_if_present(os.path.join(directory, "memory.swap.max"), "0")
        _write(os.path.join(directory, "pids.max"), str(tasks))
        _write_if_present(os.path.join(directory, "cpu.max"), f"{_CPU_QUOTA_US} {_CPU_PERIOD_US}")  # cpu delegated
        return
    memory_dir = cgroup.dirs[0]
    _write(os.path.join(memory_dir, "memory.limit_in_bytes"), str(memory_bytes))
    _write_if_present(os.path.join(memory_dir, "memory.memsw.limit_in_bytes"), str(memory_bytes))
    for directory in cgroup.dirs:  # each hierarchy's files say which it is (hierarchies may be co-mounted)
        if directory != memory_dir:
            _write_if_present(os.path.join(directory, "pids.max"), str(tasks))
        if os.path.exists(os.path.join(directory, "cpu.cfs_quota_us")):
            _write(os.path.join(directory, "cpu.cfs_period_us"), str(_CPU_PERIOD_US))
            _write(os.path.join(directory, "cpu.cfs_quota_us"), str(_CPU_QUOTA_US))


def cpu_bounded() -> bool:
    """Whether runs' cgroups bound their CPU (one CPU for all of a run's processes): the cpu
    controller is delegated (v2) or its hierarchy is among the run cgroups' (v1)."""
    found = parents()
    if found is None:
        return False
    version, bases = found
    if version == 2:
        return "cpu" in _controllers(bases[0])
    return any(os.path.exists(os.path.join(base, "cpu.cfs_quota_us")) for base in bases)


def _works(version: int, bases: tuple[str, ...]) -> bool:
    """Whether a run cgroup can be made, limited and removed under `bases` (tried once)."""
    probe = f"{_PREFIX}{os.getpid()}-probe"
    made = []
    try:
        for base in bases:
            os.mkdir(os.path.join(base, probe))
            made.append(os.path.join(base, probe))
        _set_limits(Cgroup(version, tuple(made)), 64 << 20, 8)
        return True
    except OSError:
        return False
    finally:
        for directory in made:
            try:
                os.rmdir(directory)
            except OSError:
                pass


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per controller ("" for the unified hierarchy), from /proc/self/cgroup."""
    own = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(",") if controllers else [""]:
                    own[controller] = path
    except OSError:
        pass
    return own


def _mounts(fstype: str) -> list[tuple[str, str, set[str]]]:
    """(mount point, root inside the hierarchy, super options) of each mount of `fstype`."""
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                before, _, after = line.partition(" - ")
                fields, tail = before.split(), after.split()
                if tail and tail[0] == fstype:
                    found.append((fields[4], fields[3], set(tail[2].split(",")) if len(tail) > 2 else set()))
    except OSError:
        pass
    return found


def _in_mount(mount_point: str, root: str, path: str) -> str | None:
    if root != "/" and not (path == root or path.startswith(root + "/")):
        return None
    relative = path[len(root):] if root != "/" else path
    return os.path.normpath(mount_point + relative)


def _v2_candidates() -> list[tuple[str, ...]]:
    own = _own_cgroups().get("")
    candidates = []
    for mount_point, root, _ in _mounts("cgroup2"):
        here = _in_mount(mount_point, root, own) if own is not None else None
        if here is None:
            continue
        # A cgroup with processes in it cannot enable controllers for children (except the root):
        # runs go below this cgroup if it already delegates memory and pids, else beside it.
        for base in (here, os.path.dirname(here)):
            # Moving the supervisor in needs write access to the common ancestor's cgroup.procs: `base`.
            if (base.startswith(mount_point) and {"memory", "pids"} <= _controllers(base)
                    and os.access(os.path.join(base, "cgroup.procs"), os.W_OK)):
                candidates.append((base,))
    return candidates


def _v1_candidates() -> list[tuple[str, ...]]:
    """The memory hierarchy's directory, then those of pids and cpu where they are mounted: with all
    of them first, then without cpu (a run without a CPU bound beats a run without a cgroup)."""
    own = _own_cgroups()
    found: dict[str, str | None] = {}
    for mount_point, root, options in _mounts("cgroup"):
        for controller in ("memory", "pids", "cpu"):
            if controller in options and controller in own:
                found[controller] = _in_mount(mount_point, root, own[controller])
    memory, pids, cpu = found.get("memory"), found.get("pids"), found.get("cpu")
    if memory is None:
        return []
    without_cpu = tuple(d for d in (memory, pids) if d is not None)
    with_cpu = tuple(dict.fromkeys(d for d in (memory, pids, cpu) if d is not None))  # co-mounted: once
    return [with_cpu, without_cpu] if with_cpu != without_cpu else [without_cpu]


def _controllers(cgroup_dir: str) -> set[str]:
    try:
        with open(os.path.join(cgroup_dir, "cgroup.subtree_control")) as f:
            return set(f.read().split())
    except OSError:
        return set()


def _sweep_stale(version: int, bases: tuple[str, ...]) -> None:
    """Kill and remove run cgroups whose trainer is gone (it was killed before it could clean up)."""
    for base in bases:
        try:
            names = [n for n in os.listdir(base) if n.startswith(_PREFIX)]
        except OSError:
            continue
        for name in names:
            pid = name[len(_PREFIX):].split("-", 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}"):
                continue
            stale = Cgroup(version, (os.path.join(base, name),))
            try:
                stale.kill_all()
                stale.remove()
            except OSError:
                pass


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _write_if_present(path: str, value: str) -> None:
    if os.path.exists(path):
        _write(path, value)
