"""The classes of attack on the sandbox, each written as a model-written program would be:
the supervisor stopped by a signal, the audit hook walked around in plain Python, memory summed
over many processes, the "process" isolation's leaks between runs, input that is not text, and all
of it again from an unprivileged caller (sandbox_unprivileged.py, run as a fresh uid).

Each class runs in both isolations, with the audit hook on and off where the kernel layers are
meant to hold alone. After every test the fixtures of sandbox_support check that nothing of a
sandbox is left running and that the trainer is unharmed.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Self

import pytest
from sandbox_attack_programs import (
    BUSY_CHILDREN,
    DAEMON,
    DEEP_TREE,
    DESCRIPTOR_OWNERS,
    DISK_QUOTA,
    FORK_EXEC,
    MANY_CHILDREN,
    MARKER,
    MOUNT_FLAGS,
    NEW_NAMESPACES,
    PREALLOCATE_AND_PARK,
    RENAMED_EXTENSION,
    SIGNAL_ATTACKS,
    TAMPER_WITH_THE_HOOK,
    metadata_attack,
    mounts_as_bound,
)
from sandbox_support import (
    AS_ROOT,
    AUDIT,
    AVAILABLE_ISOLATIONS,
    ISOLATIONS,
    NAMESPACES_MISSING,
    namespaces_available,
    parent_unharmed_and_nothing_left,
    system_python,
)
from sandbox_unprivileged import copy_interpreter, metadata_held, metadata_of

import reasonrl
from reasonrl.sandbox import cgroups, run_many, run_python, runner

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")
__all__ = ["namespaces_available", "parent_unharmed_and_nothing_left"]  # autouse fixtures

VICTIM = "import time\ntime.sleep(6)\nprint('alive')"  # outlives the attacks run beside it


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_program_cannot_stop_its_supervisor_or_another_run(isolation, audit):
    """Whatever a program sends to its parent, init, group or everyone, its own result comes back
    (killed, error or ok) and a run beside it is untouched."""
    with ThreadRun(VICTIM, isolation=isolation, audit=audit, timeout_s=15) as victim:
        time.sleep(0.3)  # the victim is running
        results = {name: run_python(code, isolation=isolation, audit=audit) for name, code in SIGNAL_ATTACKS.items()}
        assert victim.running  # it was beside every attack
    for name, result in results.items():
        assert result.status in ("ok", "error", "killed"), (name, result)
    assert (victim.result.status, victim.result.stdout) == ("ok", "alive\n"), victim.result
    assert run_python("print(1)", isolation=isolation, audit=audit).stdout == "1\n"


def without_landlock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs as on a kernel without Landlock (or before 6.12, whose Landlock lets signals out)."""
    fixed_spec = runner._fixed_spec
    monkeypatch.setattr(runner, "_fixed_spec", lambda *args: {**fixed_spec(*args), "landlock_rules": None})


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_seccomp_alone_refuses_naming_a_process_for_the_kernel_to_signal(isolation, monkeypatch):
    """A descriptor's owner is signalled on I/O with the setter's rights (SIGKILL by F_SETSIG): no
    kill() is made for a filter to see. With Landlock and the audit hook off, seccomp refuses it."""
    without_landlock(monkeypatch)
    result = run_python(DESCRIPTOR_OWNERS, isolation=isolation, audit=False)
    names = ("F_SETOWN", "F_SETSIG", "F_SETOWN_EX", "FIOSETOWN", "SIOCSPGRP")
    assert result.stdout.splitlines() == [f"{name} 1" for name in names], result  # EPERM
    result = run_python(SIGNAL_ATTACKS["descriptor owner"], isolation=isolation, audit=False)
    assert result.status == "error" and "PermissionError" in result.stderr, result


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_clone_makes_no_new_namespace(isolation):
    """unshare and setns are refused; clone with a CLONE_NEW* flag too, and clone3 (whose flags seccomp
    cannot read) is ENOSYS, so that libc falls back to clone."""
    result = run_python(NEW_NAMESPACES, isolation=isolation, audit=False)
    assert result.stdout.splitlines() == ["0x10000000 1", "0x20000 1", "0x40000000 1", "0x20000000 1",
                                          "clone3 38"], result
    assert run_python("import subprocess\nprint(subprocess.run(['true']).returncode)",
                      isolation=isolation, audit=False).stdout == "0\n"


class ThreadRun:
    """`run_python` in a background thread, for a run that must be in flight beside others."""

    def __init__(self, code: str, **options: object) -> None:
        self.result = None
        self._thread = threading.Thread(target=self._run, args=(code, options))

    def _run(self, code: str, options: dict) -> None:
        self.result = run_python(code, **options)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


# ---------------------------------------------------------------------------------------------
# The audit hook: plain Python (no ctypes) that walked around it, and its default.

@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_audit_hook_refuses_what_it_does_not_know(isolation, tmp_path):
    stdlib = sysconfig.get_paths()["stdlib"]
    fifo = f"/tmp/reasonrl-test-{uuid.uuid4().hex}"
    programs = {
        "process through _posixsubprocess": FORK_EXEC + f"spawn(['/bin/echo', 'ESCAPED-{MARKER}'])",
        "process through a renamed copy of it": RENAMED_EXTENSION.format(marker=MARKER),
        "write through a directory descriptor": (  # the standard library's directory, as the program sees it
            "import os\nfd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
            "os.close(os.open('reasonrl_planted.py', os.O_WRONLY | os.O_CREAT, dir_fd=fd))"),
        "fifo outside": f"import os\nos.mkfifo({fifo!r})",
        "pidfd": "import os, signal\nprint(hasattr(os, 'pidfd_open'), hasattr(signal, 'pidfd_send_signal'))",
        "an event no one listed": "import sys\nsys.audit('reasonrl.test.unlisted')\nprint('passed')",
        "a module no one listed": "import mmap\nprint('imported')",
        "tamper with the hook": TAMPER_WITH_THE_HOOK,
    }
    results = {name: run_python(code, isolation=isolation) for name, code in programs.items()}
    for name, refusal in (("process through _posixsubprocess", "ModuleNotFoundError: sandbox: import of"),
                          ("process through a renamed copy of it", "ModuleNotFoundError: sandbox: loading the extension"),
                          ("write through a directory descriptor", "PermissionError: sandbox: open"),
                          ("an event no one listed", "PermissionError: sandbox: reasonrl.test.unlisted"),
                          ("a module no one listed", "ModuleNotFoundError: sandbox: import of 'mmap'")):
        assert results[name].status == "error", (name, results[name])
        assert refusal in results[name].stderr, (name, results[name].stderr)
    assert "ESCAPED" not in results["process through _posixsubprocess"].stdout
    assert "ESCAPED" not in results["process through a renamed copy of it"].stdout
    assert not os.path.exists(os.path.join(stdlib, "reasonrl_planted.py"))
    assert not os.path.exists(fifo)
    assert results["fifo outside"].status == "error"
    assert results["pidfd"].stdout == "False False\n"  # the interpreter raises no event for them: removed
    assert results["tamper with the hook"].stdout.startswith("second attempt: PermissionError sandbox: open"), \
        results["tamper with the hook"]


def test_the_hook_holds_nothing_a_program_could_change():
    """A program reaches the hook's frame through a refusal's traceback (test above): the hook looks
    nothing up at call time and its closure holds only immutable values and C functions."""
    import dis

    from reasonrl.sandbox import program

    hook = program.make_hook("/work", ("/work", "/usr/lib/python3"))
    assert [i.argval for i in dis.get_instructions(hook) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")] == []
    immutable = (str, int, tuple, frozenset, type, type(len), type(str.startswith), type(str.__str__))
    changeable = [type(cell.cell_contents).__name__ for cell in hook.__closure__
                  if not isinstance(cell.cell_contents, immutable)]
    assert changeable == []


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_hook_leaves_ordinary_programs_alone(isolation):
    program = (
        "import collections, dataclasses, decimal, enum, fractions, functools, heapq, itertools, json, math\n"
        "import random, re, statistics, string, tempfile, threading, typing, unittest, traceback, os\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "Point = collections.namedtuple('Point', 'x y')\n"
        "@dataclasses.dataclass\nclass Box:\n    size: int = 1\n"
        "class Color(enum.Enum):\n    RED = 1\n"
        "with ThreadPoolExecutor(2) as pool:\n    squares = list(pool.map(lambda v: v * v, range(4)))\n"
        "with tempfile.TemporaryDirectory() as d:\n"
        "    os.makedirs(os.path.join(d, 'a', 'b'))\n"
        "    open(os.path.join(d, 'a', 'b', 'f.txt'), 'w').write('x')\n"
        "    names = sorted(os.listdir(os.path.join(d, 'a')))\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    trace = traceback.format_exc()\n"
        "print(json.dumps([Point(1, 2).x, Box().size, Color.RED.value, squares, names, 'ZeroDivision' in trace,\n"
        "                  str(decimal.Decimal('1.1') + 1), str(fractions.Fraction(1, 3)), statistics.mean([1, 3])]))")
    result = run_python(program, isolation=isolation)
    assert result.status == "ok", result.stderr
    assert json.loads(result.stdout) == [1, 1, 1, [0, 1, 4, 9], ["b"], True, "2.1", "1/3", 2]


# ---------------------------------------------------------------------------------------------
# Memory: one limit for all of a program's processes.

def test_memory_is_bounded_for_the_whole_program():
    """12 children of 440 MB reached 5.3 GB with memory_mb=512: here 6 children of 100 MB with
    memory_mb=160 may hold at most one block at a time (cgroup), or cannot exist (no cgroup)."""
    if NAMESPACES_MISSING:
        pytest.skip(NAMESPACES_MISSING)
    with ThreadRun(MANY_CHILDREN, isolation="namespaces", audit=False, memory_mb=160, timeout_s=8) as namespaced:
        in_process = run_python(MANY_CHILDREN, isolation="process", audit=False, memory_mb=160, timeout_s=8)
    for result in (namespaced.result, in_process):
        assert result.status in ("ok", "memory", "killed"), result
        if result.stdout:
            _allocated, alive = map(int, result.stdout.split())
            assert alive <= 1, result.stdout  # never two 100 MB blocks at once


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_cpu_is_bounded_for_the_whole_program(isolation):
    """4 children busy for 1.5 s took 2.95 CPU-seconds of two idle cores (each one's RLIMIT_CPU counts
    only itself); with the cgroup's quota, one CPU's worth at most (1.54), however many processes.
    (On a single core, or with the cores busy, the unbounded program takes less, and this passes.)"""
    result = run_python(BUSY_CHILDREN, isolation=isolation, audit=False, timeout_s=8)
    assert result.status == "ok", result
    children, cpu_s = result.stdout.split()
    if cgroups.parents() is None:
        assert children == "0"  # no cgroup: no processes, and RLIMIT_CPU bounds the one there is
        return
    if not cgroups.cpu_bounded():
        pytest.skip("the cpu controller is not delegated to this process's cgroup: runs have no CPU quota")
    assert children == "4"
    assert float(cpu_s) <= 1.5 * 1.25, cpu_s


# ---------------------------------------------------------------------------------------------
# "process" isolation: what it leaked between runs and to the machine.

@pytest.mark.parametrize("audit", AUDIT)
def test_process_runs_share_no_writable_place(audit):
    names = [f"reasonrl-leak-{uuid.uuid4().hex}" for _ in range(3)]
    places = [os.path.join(d, name) for d, name in zip(("/tmp", "/dev/shm", "/var/tmp"), names)]
    writer = (f"import os\nfor path in {places!r}:\n    try:\n        open(path, 'w').write('SECRET')\n"
              "        os.chmod(path, 0o644)\n    except OSError as exc:\n        print(type(exc).__name__)\n"
              "open('notes.txt', 'w').write('SECRET')\nimport time\ntime.sleep(1.5)")
    reader = ("import glob, os\n"
              "for path in glob.glob('/tmp/reasonrl-sandbox-*/*') + glob.glob('/tmp/reasonrl-sandbox-*/*/*'):\n"
              "    try:\n        print(path, open(path).read() if os.path.isfile(path) else os.listdir(path))\n"
              "    except OSError as exc:\n        print(type(exc).__name__)\n"
              "print('uid', os.getuid())")
    with ThreadRun(writer, isolation="process", audit=audit) as first:
        time.sleep(0.5)
        second = run_python(reader, isolation="process", audit=audit)
    assert first.result.stdout.count("Error") == 3, first.result  # every shared place refused
    assert [p for p in places if os.path.lexists(p)] == []
    assert "SECRET" not in second.stdout and "notes.txt" not in second.stdout, second.stdout


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_daemon_that_leaves_the_session_is_killed(isolation):
    result = run_python(DAEMON, isolation=isolation, audit=False)
    assert result.status in ("ok", "error"), result  # error: no cgroup here, so no new processes at all
    # the autouse fixture asserts that no `sleep 47.1108` is left


def test_the_trainers_command_line_is_not_readable():
    code = f"print(open('/proc/{os.getpid()}/cmdline').read())"
    for audit in (True, False):
        result = run_python(code, isolation="process", audit=audit)
        assert result.status == "error", result
        assert "pytest" not in result.stdout


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_the_disk_is_bounded_in_total(isolation):
    """Files under the per-file limit, far more of them than the directory may hold (disk_mb=64)."""
    fill = "for i in range(2000):\n    open(f'f{i}', 'wb').write(b'x' * 2**20)\nprint('wrote 2 GB')"
    result = run_python(fill, isolation=isolation, audit=False, timeout_s=20)
    assert result.status in ("killed", "error") and "wrote 2 GB" not in result.stdout, result
    if isolation == "process":  # measured and stopped by the trainer's side
        assert "disk_mb=64" in result.detail
    else:  # a tmpfs of that size
        assert "No space left" in result.stderr


@pytest.mark.parametrize("attack", list(DISK_QUOTA))
def test_the_disk_quota_counts_what_it_cannot_see(attack):
    """Files below a directory the program made unreadable (a root caller reads it anyway; the
    unprivileged caller's case is in sandbox_unprivileged.py) and files held open after unlinking."""
    result = run_python(DISK_QUOTA[attack], isolation="process", audit=False, disk_mb=16, timeout_s=10)
    assert result.status == "killed" and "disk_mb=16" in result.detail, result


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_disk_space_cannot_be_taken_ahead_of_the_quota(isolation, audit):
    """fallocate reserves gigabytes between two measurements of the quota (seccomp refuses it, and the
    audit hook has no posix_fallocate to offer); a socket pair could hide descriptors in flight."""
    result = run_python(PREALLOCATE_AND_PARK, isolation=isolation, audit=audit, disk_mb=16)
    lines = result.stdout.splitlines()
    assert result.status == "ok" and len(lines) == 2, result
    assert lines[0] in ("fallocate PermissionError 1", "fallocate AttributeError None"), result  # EPERM, or removed
    assert lines[1] in ("socketpair PermissionError", "socketpair ModuleNotFoundError"), result


@pytest.mark.parametrize("where", ["run directory", "code and stdin files"])
def test_a_full_disk_is_the_runs_failure_not_the_callers(where, monkeypatch):
    """A run beside this one may fill the disk up to its quota: this run ends "killed", it does not
    raise into the trainer (where an exception stops training)."""
    def no_space(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if where == "run directory":
        monkeypatch.setattr(runner.workdir, "create", no_space)
    else:
        monkeypatch.setattr(runner, "_sealed_file", no_space)
    for isolation in AVAILABLE_ISOLATIONS:
        result = run_python("print(1)", isolation=isolation)
        assert result.status == "killed" and "no space left" in result.detail, result


def test_process_isolation_runs_the_trainers_own_interpreter():
    """As root the program runs as a uid of its own, which cannot read /root/.pyenv: it reaches the
    interpreter through a descriptor (it used to fail with "No module named 'resource'")."""
    results = run_many(["import json, os\nprint(json.dumps([os.getuid(), os.getgid()]))"] * 2, max_workers=2,
                       isolation="process", python=sys.executable)
    assert [r.status for r in results] == ["ok", "ok"], results
    uids = [json.loads(r.stdout)[0] for r in results]
    if AS_ROOT:
        assert uids[0] != uids[1] and 0 not in uids and 65534 not in uids  # one uid per run, never a shared one


def test_trainers_draw_their_uid_blocks_at_random_not_from_their_pid():
    """Two trainers with one pid (in two PID namespaces) used to get the same per-run uids: the block
    is drawn at random per process, again in a forked child, and stays in the sandbox's uid range."""
    from reasonrl.sandbox import runner

    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, str(runner._uid_block).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    child_block = int(os.read(read, 64))
    os.close(read)
    with runner._UidSlot() as uid:
        assert runner._UID_BASE <= uid < runner._UID_BASE + (runner._UID_BLOCKS << 6)
        assert (uid - runner._UID_BASE) >> 6 == runner._uid_block
    assert child_block != runner._uid_block  # equal by chance with probability 2^-22


@pytest.fixture(scope="module")
def installed_interpreter(tmp_path_factory) -> tuple[str, str]:
    """An interpreter with its standard library in a directory of its own (as pyenv, conda or uv
    install one): its executable and its os.py."""
    python = system_python()
    if python is None:
        pytest.skip("needs a self-contained Python >= 3.11 to copy (e.g. /usr/bin/python3)")
    prefix = tmp_path_factory.mktemp("interpreter")
    prefix.chmod(0o755)  # as installed; the directories above stay the trainer's alone
    return copy_interpreter(python, prefix)


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_nothing_outside_the_run_changes_mode_owner_times_or_stdin(isolation, audit, installed_interpreter,
                                                                    tmp_path):
    """chmod, chown, utime and xattr on the interpreter's files (through a descriptor opened for
    reading) and on a directory outside, and writes to stdin: all refused, nothing changed, and the
    interpreter runs the next program. The unprivileged caller's case is in sandbox_unprivileged.py."""
    python, os_py = installed_interpreter
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    for target, interpreter in ((os_py, python), (str(victim), sys.executable)):
        before = metadata_of(target)
        result = run_python(metadata_attack(target), isolation=isolation, audit=audit, python=interpreter)
        assert metadata_held({"status": result.status, "stdout": result.stdout}, before, target), (target, result)
    assert run_python("print(1)", isolation=isolation, audit=audit, python=python).stdout == "1\n"


SEND_TO_QUEUE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
queue = libc.mq_open(NAME, os.O_WRONLY | os.O_NONBLOCK)
if queue < 0:
    print('refused', ctypes.get_errno())
else:
    print('sent' if libc.mq_send(queue, b'leak', 4, 0) == 0 else 'not sent')
"""


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_message_queue_of_the_trainer_s_cannot_be_opened(isolation, audit):
    """A POSIX message queue made outside, open to everyone: the program cannot open it, nothing arrives."""
    libc = ctypes.CDLL(None, use_errno=True)
    name = f"/reasonrl-test-{uuid.uuid4().hex[:8]}".encode()
    umask = os.umask(0)  # world-writable, as a careless service might make it
    try:
        queue = libc.mq_open(name, os.O_CREAT | os.O_RDONLY | os.O_NONBLOCK, 0o666, None)
    finally:
        os.umask(umask)
    assert queue >= 0, os.strerror(ctypes.get_errno())
    try:
        result = run_python(SEND_TO_QUEUE.replace("NAME", repr(name)), isolation=isolation, audit=audit)
        attributes = (ctypes.c_long * 8)()  # struct mq_attr: flags, maxmsg, msgsize, curmsgs, reserved
        assert libc.mq_getattr(queue, attributes) == 0
        assert attributes[3] == 0, result  # no message in the queue
        if audit:  # the hook refuses ctypes
            assert result.status == "error" and "sandbox:" in result.stderr, result
        else:  # seccomp refuses mq_open
            assert (result.status, result.stdout) == ("ok", f"refused {errno.EPERM}\n"), result
    finally:
        os.close(queue)
        libc.mq_unlink(name)


WRITE_BELOW = """
import sys
try:
    open(sys.argv[1] + '/planted', 'w').write('x')
    print('written')
except OSError as exc:
    print('refused', exc.errno)
"""


@pytest.mark.skipif(not AS_ROOT or shutil.which("unshare") is None, reason="mounts a tmpfs: needs root and unshare")
@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_writable_mount_below_the_interpreter_is_read_only_to_the_program(isolation, audit, installed_interpreter):
    """A world-writable tmpfs mounted below the interpreter's prefix (a volume under /usr/local, say),
    in a private mount namespace of the test's own so that the machine's mounts stay as they are: the
    program cannot write there, although the recursive bind of the prefix brings the mount along."""
    python, _ = installed_interpreter
    below = Path(python).parent.parent / f"volume-{uuid.uuid4().hex[:8]}"
    below.mkdir()
    program = WRITE_BELOW.replace("sys.argv[1]", repr(str(below)))
    trial = (f"import json, os\nfrom reasonrl.sandbox import run_python\n"
             f"result = run_python({program!r}, isolation={isolation!r}, audit={audit!r}, python={python!r})\n"
             f"print(json.dumps([result.status, result.stdout, sorted(os.listdir({str(below)!r}))]))")
    ran = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          'mount -t tmpfs -o mode=0777 tmpfs "$1" && exec "$2" -c "$3"', "sh", str(below),
                          sys.executable, trial], check=False, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    status, stdout, planted = json.loads(ran.stdout.splitlines()[-1])
    assert planted == [], (status, stdout)
    # the audit hook refuses the open itself (a PermissionError without an errno); without it the kernel
    # does (EROFS in "namespaces", Landlock's EACCES in "process")
    refused = {"refused None"} if audit else {f"refused {errno.EROFS}", f"refused {errno.EACCES}"}
    assert status == "ok" and stdout.strip() in refused, (status, stdout)


@pytest.mark.skipif(NAMESPACES_MISSING is not None, reason=str(NAMESPACES_MISSING))
def test_everything_bound_from_the_machine_is_mounted_read_only_but_the_devices():
    """In "namespaces" the program's root holds binds of the machine's directories and files: each one
    read-only at the mount, whatever the file's permissions say (a root caller's program may own them
    in its user namespace); only the devices take writes."""
    result = run_python(MOUNT_FLAGS, isolation="namespaces", audit=False)
    assert result.status == "ok" and mounts_as_bound(result.stdout), result


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_tree_deeper_than_any_recursion_limit_is_measured_and_removed(isolation, audit):
    """3000 nested directories made while the trainer measures them: the run ends as the program did,
    and the autouse fixture checks that its directory is gone."""
    result = run_python(DEEP_TREE, isolation=isolation, audit=audit, timeout_s=20)
    assert (result.status, result.stdout) == ("ok", "built\n"), result


# ---------------------------------------------------------------------------------------------
# Input that is not text.

def test_a_lone_surrogate_is_a_clear_error():
    result = run_python("print('\ud800')")
    assert result.status == "error" and "not valid text" in result.stderr and "line 1" in result.stderr
    with pytest.raises(ValueError, match="stdin cannot be encoded as UTF-8"):
        run_python("print(input())", stdin="\udc80")


# ---------------------------------------------------------------------------------------------
# An unprivileged caller: most users do not run as root.

def _unprivileged_user() -> tuple[list[str], int] | None:
    """The command prefix that runs as a fresh uid (setpriv, from root), or [] when already not root."""
    if not AS_ROOT:
        return [], os.getuid()
    if shutil.which("setpriv") is None:
        return None
    uid = 50000 + os.getpid() % 10000  # no account needed: a uid nothing else uses
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"], uid


@pytest.mark.timeout(120)
def test_unprivileged_caller(tmp_path):
    """Everything above from a caller without root: namespaces without privilege, and a "process"
    isolation that shares the caller's uid (Landlock, seccomp and the supervisor hold instead)."""
    user = _unprivileged_user()
    python = system_python()
    if user is None or python is None:
        pytest.skip("needs root and setpriv to become a fresh uid, and a Python >= 3.11 that uid can run")
    prefix, uid = user
    home = Path(tempfile.mkdtemp(prefix="reasonrl-unprivileged-"))
    try:
        os.chmod(home, 0o755)
        victim = home / "victim"
        victim.mkdir(mode=0o755)
        for path in (home, victim):
            os.chown(path, uid, uid)
        script = Path(__file__).with_name("sandbox_unprivileged.py")
        src = str(Path(reasonrl.__file__).parent.parent)
        completed = subprocess.run([*prefix, python, str(script), src, str(victim)], capture_output=True, text=True,
                                   env={"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home)},
                                   cwd=str(home), timeout=110, check=False)
        assert completed.returncode == 0, f"the unprivileged caller died ({completed.returncode}): {completed.stderr}"
        report = json.loads(completed.stdout)
        assert stat.S_IMODE(home.stat().st_mode) == 0o755  # the run directory's parent: never chmodded
        assert stat.S_IMODE(victim.stat().st_mode) == 0o755  # a planted link's target: never followed
        assert [p.name for p in home.iterdir() if p.name != "victim"] == []
    finally:
        shutil.rmtree(home, ignore_errors=True)
    for case, outcome in report["cases"].items():
        assert outcome["ok"], (case, outcome)
    if report["isolation"] != "namespaces":  # the "process" cases above ran and held
        pytest.skip(f"namespaces cases skipped for an unprivileged uid: {report['skipped']}")


def test_sigterm_before_the_program_has_its_own_group_still_kills_it():
    """The trainer's SIGTERM may come before the program's setsid: there is no group to kill yet."""
    script = ("import os, signal, time\nimport supervisor\n"
              "child = supervisor._fork_with_sigterm_held()\nif child == 0:\n    time.sleep(5)\n    os._exit(0)\n"
              "supervisor._stop_on_sigterm(child, group=True)\nos.kill(os.getpid(), signal.SIGTERM)\n"
              "print(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))")
    package = str(Path(reasonrl.__file__).parent / "sandbox")  # the supervisor runs as a script beside confine.py
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20, check=False,
                          env={**os.environ, "PYTHONPATH": package})
    assert done.stdout.strip() == str(-signal.SIGKILL), done
