"""The trainer's side of the sandbox: `run_python`, `run_many`, `isolation_mode`, `describe`.

A run makes the program's private directory (workdir.py) and its cgroup (cgroups.py), starts the
supervisor (supervisor.py) in a session of its own with a spec, feeds it the program and stdin as
unnamed files in memory sealed against writing, reads stdout and stderr up to their caps, enforces the wall clock (and, without
namespaces, the disk quota) by asking the supervisor to stop the program (SIGTERM), then kills
whatever is left in the cgroup and removes the directory. The program's status comes from the
supervisor's report on a private pipe; only a sandbox that cannot work raises `SandboxError`.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import logging
import marshal
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import cgroups, confine, layers, output, workdir
from .program import EXIT_MEMORY

logger = logging.getLogger("reasonrl.sandbox")

STATUSES = ("ok", "error", "timeout", "memory", "killed")
ISOLATIONS = ("auto", "namespaces", "process")

NOBODY = 65534
_DISK_MB = 64  # default size of the program's directory, and of its largest file
_DISK_ENTRIES = 4096  # files and directories in it
_NOFILE = 64
# Sandbox uids of root callers in "process" isolation: base + (block << 6 | slot), the block drawn at
# random per trainer process: trainers in different PID namespaces share pids, not random blocks.
_UID_BASE, _UID_BLOCKS, _UID_SLOTS = 0x60000000, 1 << 22, 64
_HERE = os.path.dirname(os.path.abspath(__file__))

# Starts the supervisor from code compiled once per interpreter (`_compiled`): compiling its two
# files at every start would cost ~12 ms of a ~70 ms run.
_BOOTSTRAP = ("# reasonrl sandbox supervisor\nimport marshal, sys; code = marshal.loads(bytes.fromhex(sys.argv[1])); "
              "confine = sys.modules['confine'] = type(sys)('confine'); exec(code['confine'], confine.__dict__); "
              "exec(code['supervisor'], {'__name__': '__main__'})")

# Runs in flight across all threads of this process: each may hold `memory_mb` and a CPU core.
MAX_PARALLEL = max(1, min(_UID_SLOTS, os.cpu_count() or 1))
_SLOTS = threading.BoundedSemaphore(MAX_PARALLEL)
_free_uid_slots: list[int] = []
_uid_slots_lock = threading.Lock()
_uid_block = 0


def _draw_uid_block() -> None:
    """This process's block of uids; a forked child draws its own (and must not share the lock)."""
    global _uid_block, _uid_slots_lock
    _uid_block = secrets.randbelow(_UID_BLOCKS)
    _free_uid_slots[:] = range(_UID_SLOTS)
    _uid_slots_lock = threading.Lock()


_draw_uid_block()
os.register_at_fork(after_in_child=_draw_uid_block)


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): it could not be set up or its supervisor died."""


@dataclass(frozen=True)
class ExecResult:
    """How one run ended.

    `returncode` is the program's exit code (negative: the signal that ended it), None when the
    parent stopped it (timeout, output cap, disk quota). `truncated` says that stdout or stderr was
    cut at the cap; `detail` explains a status other than "ok" / "error" in words.
    """

    status: str
    stdout: str
    stderr: str
    duration_s: float
    returncode: int | None = None
    truncated: bool = False
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run_python(code: str, *, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512, disk_mb: int = _DISK_MB,
               max_output_bytes: int = 1 << 20, audit: bool = True, isolation: str = "auto",
               python: str | None = None) -> ExecResult:
    """Run `code` as a Python program in the sandbox and report how it ended.

    `memory_mb` bounds all of the program's processes together, `disk_mb` what it writes.
    `isolation` is "namespaces", "process" or "auto" (the strongest this machine allows, see
    `isolation_mode`). `python` is the interpreter (default: the one running this process, without
    its site-packages). Code that is not valid text (a lone surrogate) is the program's error, not
    run; stdin that is not is the caller's (ValueError). Raises `SandboxError` when the sandbox
    cannot run, never for the program.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0 or disk_mb <= 0:
        raise ValueError(f"run_python: timeout_s={timeout_s}, memory_mb={memory_mb}, disk_mb={disk_mb} and "
                         f"max_output_bytes={max_output_bytes} must all be positive")
    if isolation not in ISOLATIONS:
        raise ValueError(f"run_python: unknown isolation {isolation!r}; allowed: {', '.join(ISOLATIONS)}")
    stdin_bytes = _encoded_stdin(stdin)
    try:
        code_bytes = code.encode()
    except UnicodeEncodeError as exc:
        return _not_text(code, exc)
    interpreter = _interpreter(python)
    mode = _auto_mode(interpreter) if isolation == "auto" else _verified(isolation, interpreter)
    with _SLOTS:
        return _run(code_bytes, stdin_bytes, limits=_Limits(timeout_s, memory_mb, disk_mb, max_output_bytes),
                    audit=audit, mode=mode, interpreter=interpreter)


def run_many(programs: Sequence[str], *, stdins: Sequence[str] | None = None, max_workers: int | None = None,
             **options: object) -> list[ExecResult]:
    """`run_python` on each program (with `stdins[i]`), in parallel, results in order.

    At most `max_workers` run at once in this call, and at most one per CPU core across the whole
    process whatever the callers; `options` are `run_python`'s keywords.
    """
    if stdins is not None and len(stdins) != len(programs):
        raise ValueError(f"run_many: {len(programs)} programs but {len(stdins)} stdins")
    inputs = list(stdins) if stdins is not None else [""] * len(programs)
    if not programs:
        return []
    workers = max(1, min(len(programs), max_workers or MAX_PARALLEL))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        futures = [pool.submit(run_python, code, stdin=stdin, **options) for code, stdin in zip(programs, inputs)]
        return [future.result() for future in futures]


def isolation_mode(python: str | None = None) -> str:
    """The isolation "auto" picks here: "namespaces" if a probe program runs in them, else
    "process" (with a warning naming what is missing and how to enable namespaces)."""
    return _auto_mode(_interpreter(python))


def describe(python: str | None = None) -> dict[str, object]:
    """The layers in force on this machine for this process (docs/sandbox.md explains each)."""
    mode = isolation_mode(python)
    libc = layers.libc()
    abi = confine.landlock_abi(libc)
    arch = confine.native_arch()
    return {
        "isolation": mode,
        "memory_bound": layers.memory_bound(),
        "cpu_bound": layers.cpu_bound(),
        "cgroup": cgroups.describe(),
        "landlock_abi": abi if mode == "process" else f"{abi} (not used: namespaces)",
        "seccomp": os.uname().machine if arch is not None else "none (no filter for this architecture)",
        "sandbox_uid": ("a uid of its own per run" if mode == "process" and os.geteuid() == 0 else
                        "nobody, mapped to root of a user namespace" if os.geteuid() == 0 else
                        "the caller's, mapped to root of a user namespace" if mode == "namespaces" else
                        "the caller's (signals and files guarded by Landlock, seccomp and the audit hook)"),
    }


@functools.cache
def log_layers() -> None:
    """Log, once per trainer, the isolation and the memory bound in force (docs/sandbox.md)."""
    in_force = describe()
    logger.info("sandbox: %s isolation; memory bound: %s", in_force["isolation"], in_force["memory_bound"])


@functools.cache
def _auto_mode(interpreter: str) -> str:
    # Cached for the trainer's life: a transient failure (a busy machine) gets a second try before
    # the weaker isolation is chosen for good.
    for attempt in range(2):
        try:
            return _verified("namespaces", interpreter)
        except SandboxError as exc:
            reason = str(exc)
            if attempt == 0:
                logger.info("sandbox: namespaces probe failed, trying once more: %s", reason)
    try:
        _verified("process", interpreter)
    except SandboxError as exc:
        raise SandboxError(f"no isolation works on this machine. namespaces: {reason}; process: {exc}") from exc
    logger.warning("sandbox: user namespaces are unavailable (%s); running untrusted code with 'process' "
                   "isolation. %s Fix: allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                   "user.max_user_namespaces > 0, kernel.apparmor_restrict_unprivileged_userns=0) or run outside a "
                   "container that forbids unshare. See docs/sandbox.md.", reason, layers.process_gaps())
    return "process"


@functools.cache
def _verified(mode: str, interpreter: str) -> str:
    """`mode`, once a probe program that imports from the standard library has run in it."""
    probe = b"import json, re, collections, math\nprint(json.dumps([1]))"
    with _SLOTS:
        result = _run(probe, b"", limits=_Limits(10.0, 512, _DISK_MB, 1 << 16), audit=True, mode=mode,
                      interpreter=interpreter)
    if result.status != "ok" or result.stdout != "[1]\n":
        raise SandboxError(f"a probe program in {mode!r} isolation with {interpreter} ended {result.status!r} "
                           f"({result.detail or result.returncode}); stderr: {result.stderr[-1000:]!r}")
    return mode


@dataclass(frozen=True)
class _Limits:
    timeout_s: float
    memory_mb: int
    disk_mb: int
    max_output_bytes: int


def _encoded_stdin(stdin: str) -> bytes:
    try:
        return stdin.encode()
    except UnicodeEncodeError as exc:
        raise ValueError(f"run_python: stdin cannot be encoded as UTF-8: {exc.reason} "
                         f"{stdin[exc.start:exc.end]!r} at character {exc.start}; pass text without lone "
                         "surrogates (e.g. stdin.encode('utf-8', 'replace').decode())") from None


def _not_text(code: str, exc: UnicodeEncodeError) -> ExecResult:
    line = code.count("\n", 0, exc.start) + 1
    message = (f"sandbox: the program is not valid text ({exc.reason} {code[exc.start:exc.end]!r} at line {line}, "
               f"character {exc.start}); it was not run\n")
    return ExecResult(status="error", stdout="", stderr=message, duration_s=0.0, detail=message.strip())


def _interpreter(python: str | None) -> str:
    path = os.path.realpath(python or sys.executable)
    if not os.access(path, os.X_OK):
        raise SandboxError(f"sandbox interpreter {path!r} is not executable; pass python= an interpreter path")
    return path


@dataclass(frozen=True)
class _Compiled:
    """What a sandbox interpreter needs, computed by that interpreter once (marshal formats and
    standard library locations differ between interpreters)."""

    supervisor: str  # hex of the marshalled {"supervisor": code, "confine": code}
    program: str  # hex of program.py's marshalled code
    read_roots: tuple[str, ...]  # its standard library directories (the audit hook lets programs read them)


_COMPILE = """\
import marshal, sys
def compiled(name):
    path = sys.argv[1] + '/' + name + '.py'
    with open(path) as f:
        return compile(f.read(), path, 'exec')
print(marshal.dumps({'supervisor': compiled('supervisor'), 'confine': compiled('confine')}).hex())
print(marshal.dumps(compiled('program')).hex())
print('\\0'.join(p for p in sys.path if p))
"""


@functools.cache
def _compiled(interpreter: str) -> _Compiled:
    done = subprocess.run([interpreter, "-I", "-S", "-B", "-c", _COMPILE, _HERE], capture_output=True, text=True,
                          env={}, check=False, timeout=60)
    if done.returncode != 0:
        raise SandboxError(f"sandbox interpreter {interpreter} cannot prepare the sandbox: {done.stderr[-1000:]}")
    supervisor, program, roots = done.stdout.split("\n")[:3]
    return _Compiled(supervisor, program, tuple(os.path.realpath(p) for p in roots.split("\0")))


class _UidSlot:
    """A uid of its own for one run of a root caller without namespaces (released after the run)."""

    def __enter__(self) -> int:
        with _uid_slots_lock:
            self.slot = _free_uid_slots.pop()
        return _UID_BASE + (_uid_block << 6 | self.slot)

    def __exit__(self, *_exc: object) -> None:
        with _uid_slots_lock:
            _free_uid_slots.append(self.slot)


def _run(code: bytes, stdin: bytes, *, limits: _Limits, audit: bool, mode: str, interpreter: str) -> ExecResult:
    as_root = os.geteuid() == 0
    if mode == "process" and as_root:
        with _UidSlot() as uid:
            return _run_as(code, stdin, limits=limits, audit=audit, mode=mode, interpreter=interpreter, uid=uid)
    uid = NOBODY if as_root else os.geteuid()
    return _run_as(code, stdin, limits=limits, audit=audit, mode=mode, interpreter=interpreter, uid=uid)


def _run_as(code: bytes, stdin: bytes, *, limits: _Limits, audit: bool, mode: str, interpreter: str,
            uid: int) -> ExecResult:
    memory_bytes, tasks = limits.memory_mb << 20, layers.NPROC
    try:
        cgroup = cgroups.create(memory_bytes, tasks + 4)  # + the supervisor, init and the id mapper
    except OSError as exc:
        raise SandboxError(f"could not create the run's cgroup ({cgroups.describe()}): {exc}") from exc
    no_processes = cgroup is None and confine.native_arch() is not None
    if cgroup is None and not no_processes:  # neither: the product of the two limits is the bound
        memory_bytes, tasks = memory_bytes // layers.FALLBACK_PROCESSES, layers.FALLBACK_PROCESSES
    oom_kills = 0
    try:
        owner = (uid, uid) if mode == "process" and os.geteuid() == 0 else None
        try:
            directory = workdir.create(owner=owner, nested=mode == "process")
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                return _no_space(exc)
            raise SandboxError(f"could not create the run's directory in {tempfile.gettempdir()}: {exc}; "
                               "free space there or point TMPDIR elsewhere") from exc
        try:
            spec = {
                "mode": mode, "workdir": directory.work, "uid": uid, "gid": uid if owner else os.getegid(),
                "drop_uid": os.geteuid() == 0, "memory_bytes": memory_bytes, "tasks": tasks,
                "no_processes": no_processes, "cgroup_procs": cgroup.procs_files if cgroup else [],
                **_fixed_spec(interpreter, directory.work, mode), "cpu_s": int(limits.timeout_s) + 1,
                "disk_mb": limits.disk_mb, "audit": audit,
            }
            watch = workdir.quota_watch(directory.work, limits.disk_mb, _DISK_ENTRIES) if mode == "process" else None
            try:
                result = _supervised(code, stdin, spec, limits, disk_over=watch)
            except OSError as exc:
                if exc.errno not in _NO_SPACE:
                    raise
                result = _no_space(exc)
        finally:
            # What the program left running is killed first: nothing may still write while its directory goes.
            ended, cgroup = cgroup, None
            try:
                if ended is not None:
                    oom_kills = _end(ended)
            finally:
                _remove(directory)
    finally:
        if cgroup is not None:  # the run's directory could not be made
            oom_kills = _end(cgroup)
    if result.status == "killed" and oom_kills:
        return ExecResult(status="memory", stdout=result.stdout, stderr=result.stderr, duration_s=result.duration_s,
                          returncode=result.returncode, truncated=result.truncated,
                          detail=f"out of memory: the program's processes together reached {limits.memory_mb} MB")
    return result


def _no_space(exc: OSError) -> ExecResult:
    """A full disk (a program beside this one may have filled it up to its quota): this run's failure,
    never an exception that stops the caller."""
    logger.warning("sandbox: no space for a run's files in %s: %s", tempfile.gettempdir(), exc)
    return ExecResult(status="killed", stdout="", stderr="", duration_s=0.0,
                      detail=f"no space left for the run's files in {tempfile.gettempdir()} ({exc.strerror})")


def _fixed_spec(interpreter: str, work: str, mode: str) -> dict[str, object]:
    """The parts of a supervisor's spec that depend on the machine, the interpreter and the directory only."""
    home = "/sandbox" if mode == "namespaces" else work
    compiled = _compiled(interpreter)
    return {
        "interpreter": interpreter, "prefix": layers.prefix(interpreter), "binds": layers.binds(interpreter),
        "files": [f for f in layers.SYSTEM_FILES if os.path.exists(f)], "devices": list(layers.DEVICES),
        "open_files": _NOFILE, "parent_pid": os.getpid(), "read_roots": list(compiled.read_roots),
        "landlock_rules": layers.landlock_rules(interpreter, work), "boot": compiled.program,
        "env": {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"},
    }


def _end(cgroup: cgroups.Cgroup) -> int:
    """Kill what is left in the run's cgroup and remove it; the number of OOM kills it saw."""
    try:
        cgroup.kill_all()
    except OSError as exc:
        raise SandboxError(f"a run's processes survive SIGKILL: {exc}") from exc
    oom_kills = cgroup.oom_kills()
    try:
        cgroup.remove()
    except OSError as exc:
        logger.warning("sandbox: could not remove the run's cgroup %s: %s", cgroup.dirs, exc)
    return oom_kills


def _remove(directory: workdir.RunDirectory) -> None:
    try:
        workdir.remove(directory.parent)
    except OSError as exc:
        logger.warning("sandbox: could not remove the run directory %s: %s", directory.parent, exc)


def _supervised(code: bytes, stdin: bytes, spec: dict, limits: _Limits,
                disk_over: Callable[[int, set], str | None] | None) -> ExecResult:
    status_read, status_write = os.pipe()
    try:
        code_fd = _sealed_file(code, "program")
        try:
            stdin_fd = _sealed_file(stdin, "stdin")
        except BaseException:
            os.close(code_fd)
            raise
        try:
            # Held open by the program without a name, but not its writing.
            ours = {(info.st_dev, info.st_ino) for info in map(os.fstat, (code_fd, stdin_fd))}
            spec = {**spec, "code_fd": code_fd, "status_fd": status_write}
            command = [spec["interpreter"], "-I", "-S", "-B", "-c", _BOOTSTRAP,
                       _compiled(spec["interpreter"]).supervisor, marshal.dumps(spec).hex()]
            start = time.monotonic()
            try:
                process = subprocess.Popen(command, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           pass_fds=(code_fd, status_write), env={},
                                           cwd=spec["workdir"], start_new_session=True)
            except OSError as exc:
                raise SandboxError(f"could not start the sandbox supervisor {spec['interpreter']!r}: {exc}") from exc
        finally:
            os.close(code_fd)
            os.close(stdin_fd)
        os.close(status_write)
        status_write = None
        try:
            quota = functools.partial(disk_over, process.pid, ours) if disk_over is not None else None
            verdict, stdout, stderr, truncated = output.collect(process, start + limits.timeout_s,
                                                                limits.max_output_bytes, quota)
            if verdict is None and quota is not None:  # a burst between two measurements, or at the end
                verdict = quota()
            duration = time.monotonic() - start
            report = output.read_all(status_read).decode(errors="replace").strip()
        finally:
            output.kill_group(process)
            process.wait()
            process.stdout.close()
            process.stderr.close()
    finally:
        os.close(status_read)
        if status_write is not None:
            os.close(status_write)
    out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    made = functools.partial(ExecResult, stdout=out, stderr=err, duration_s=duration, truncated=truncated)
    if verdict == "timeout":
        return made(status="timeout", detail=f"wall clock limit of {limits.timeout_s:g} s")
    if verdict is not None:
        return made(status="killed", detail=verdict)
    return _classify(report, made, process.returncode, err)


def _sealed_file(data: bytes, name: str) -> int:
    """`data` in an unnamed file in memory, at offset 0, sealed against every change: the program's
    code and stdin, which it reads and can neither write (outside any quota) nor find on a disk."""
    fd = os.memfd_create(f"reasonrl-sandbox-{name}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _classify(report: str, made: functools.partial, supervisor_code: int | None, stderr: str) -> ExecResult:
    if report == "setup":
        raise SandboxError(f"sandbox setup failed before the program started: {stderr[-2000:]}")
    if not report.lstrip("-").isdigit():
        raise SandboxError(f"the sandbox supervisor ended (exit code {supervisor_code}) without reporting "
                           f"the program's end; stderr: {stderr[-2000:]!r}")
    code = int(report)
    if code == 0:
        return made(status="ok", returncode=0)
    if code == EXIT_MEMORY:
        return made(status="memory", returncode=code, detail="MemoryError (address-space limit)")
    if code > 0:
        return made(status="error", returncode=code)
    if -code == signal.SIGXCPU:
        return made(status="timeout", returncode=code, detail="CPU time limit (SIGXCPU)")
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return made(status="killed", returncode=code, detail=f"killed by {name}")
