"""The sandbox: each attack is stopped and reported with the right status, the parent is unharmed,
and no process of the sandbox is left running afterwards (checked after every test by scanning /proc).

Attacks run in both isolations ("namespaces", and "process", the fallback without user
namespaces) and with the audit hook on and off: off, the kernel layers must hold alone. Where the
"process" isolation is documented not to stop an attack without the hook, that case is skipped.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reasonrl import sandbox
from reasonrl.sandbox import NOBODY, SandboxError, isolation_mode, run_many, run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")

AS_ROOT = os.geteuid() == 0
MARKER = "47.1108"  # an argument of the processes the attacks leave behind, to find them in /proc


def _readable_by_others(path: str) -> bool:
    parts = Path(path).parents
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in parts) and bool(os.stat(path).st_mode & stat.S_IROTH)


def _process_python() -> str | None:
    """An interpreter `nobody` can run (the "process" isolation drops root to it without a private file system)."""
    candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
    for candidate in candidates:
        real = os.path.realpath(candidate)
        stdlib = os.path.join(os.path.dirname(os.path.dirname(real)), "lib")
        if os.path.exists(real) and (not AS_ROOT or (_readable_by_others(real) and _readable_by_others(stdlib))):
            version = subprocess.run([real, "-c", "import sys; print(sys.version_info[:2] >= (3, 11))"],
                                     capture_output=True, text=True, check=False).stdout.strip()
            if version == "True":
                return real
    return None


PROCESS_PYTHON = _process_python()
ISOLATIONS = [
    pytest.param("namespaces", None, id="namespaces"),
    pytest.param("process", PROCESS_PYTHON, id="process", marks=pytest.mark.skipif(
        PROCESS_PYTHON is None, reason="no Python >= 3.11 that the unprivileged sandbox uid can read")),
]
AUDIT = [pytest.param(True, id="audit"), pytest.param(False, id="kernel-only")]


@pytest.fixture(scope="module", autouse=True)
def namespaces_available():
    try:
        if isolation_mode() != "namespaces":
            pytest.skip("user namespaces are not available here; the sandbox runs with 'process' isolation")
    except SandboxError as exc:
        pytest.fail(f"the sandbox cannot run at all: {exc}")


def leftovers() -> list[str]:
    """Live processes of a sandbox: its supervisor script, the sandbox uid (when root), or the attacks' marker."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].split()[0] in ("Z", "X") or int(pid) == os.getpid():
            continue
        uid = int(fields["Uid"].split()[0])
        if "reasonrl/sandbox.py" in cmdline or MARKER in cmdline or (AS_ROOT and uid == NOBODY):
            found.append(f"{pid} (uid {uid}): {cmdline[:120]}")
    return found


@pytest.fixture(autouse=True)
def parent_unharmed_and_nothing_left():
    limits = {name: resource.getrlimit(getattr(resource, name)) for name in ("RLIMIT_AS", "RLIMIT_NPROC", "RLIMIT_CPU")}
    before = set(Path(tempfile.gettempdir()).glob("reasonrl-sandbox-*"))
    yield
    # A killed process may take a moment to be torn down; this waits for it, and fails if it stays.
    deadline = time.monotonic() + 3.0
    while (remaining := leftovers()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert remaining == [], f"sandbox processes still running: {remaining}"
    assert {name: resource.getrlimit(getattr(resource, name)) for name in limits} == limits
    assert subprocess.run(["true"], check=False).returncode == 0  # the parent can still start processes
    assert set(Path(tempfile.gettempdir()).glob("reasonrl-sandbox-*")) <= before, "a working directory was left"


def run(code: str, isolation: str, python: str | None, audit: bool = True, **kwargs):
    return run_python(code, isolation=isolation, python=python, audit=audit, **kwargs)


# ---------------------------------------------------------------------------------------------
# Basics.

@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_ok_error_exit_code_and_stdin(isolation, python):
    result = run("import json, re, hashlib, decimal, fractions, heapq, itertools, datetime, random\n"
                 "print(json.dumps({'n': int(input()) * 2}))", isolation, python, stdin="21\n")
    assert (result.status, result.stdout, result.returncode, result.truncated) == ("ok", '{"n": 42}\n', 0, False)

    result = run("def f():\n    raise ValueError('bad input')\nf()", isolation, python)
    assert (result.status, result.returncode) == ("error", 1)
    assert 'File "<program>", line 2, in f' in result.stderr and "ValueError: bad input" in result.stderr

    assert run("import sys; sys.exit(3)", isolation, python).returncode == 3
    syntax = run("def broken(:\n", isolation, python)
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr


@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_working_directory_is_private_writable_and_removed(isolation, python):
    code = ("import json, os\nopen('notes.txt', 'w').write('x' * 1000)\n"
            "print(json.dumps({'cwd': os.getcwd(), 'files': os.listdir('.'), 'env': sorted(os.environ)}))")
    first, second = run(code, isolation, python), run(code, isolation, python)
    assert first.status == second.status == "ok", first.stderr
    seen = json.loads(first.stdout)
    # Nothing of another run, nor the program's own source or input, is in the directory.
    assert seen["files"] == json.loads(second.stdout)["files"] == ["notes.txt"]
    assert seen["env"] == ["HOME", "LANG", "PATH", "TMPDIR"]
    assert seen["cwd"] == "/sandbox" if isolation == "namespaces" else not os.path.exists(seen["cwd"])


def test_output_beyond_the_cap_is_truncated_not_killed():
    result = run_python("import sys\nsys.stdout.write('a' * 3000)\nsys.stderr.write('b' * 10)", max_output_bytes=1000)
    assert (result.status, result.truncated, result.stdout, result.stderr) == ("ok", True, "a" * 1000, "b" * 10)


def test_parallel_runs_keep_their_order_and_limits():
    programs = [f"import time\ntime.sleep(0.2)\nprint({i} * {i})" for i in range(6)] + ["while True: pass"]
    results = run_many(programs, stdins=[""] * 7, max_workers=2, timeout_s=1)
    assert [r.stdout for r in results[:6]] == [f"{i * i}\n" for i in range(6)]
    assert [r.status for r in results] == ["ok"] * 6 + ["timeout"]
    assert run_many([]) == []
    with pytest.raises(ValueError, match="2 programs but 1 stdins"):
        run_many(["print(1)", "print(2)"], stdins=["x"])


def test_infrastructure_failures_raise():
    with pytest.raises(SandboxError, match="not executable"):
        run_python("print(1)", python="/nonexistent/python3")
    with pytest.raises(ValueError, match="unknown isolation"):
        run_python("print(1)", isolation="container")
    with pytest.raises(ValueError, match="must all be positive"):
        run_python("print(1)", timeout_s=0)


# ---------------------------------------------------------------------------------------------
# Attacks: resource exhaustion.

@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_infinite_loop_times_out(isolation, python, audit):
    result = run("while True:\n    pass", isolation, python, audit, timeout_s=1)
    assert (result.status, result.returncode) == ("timeout", None)


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_fork_bomb_is_contained(isolation, python, audit):
    # EAGAIN (BlockingIOError) is RLIMIT_NPROC saying no; the bomb ignores it and keeps trying.
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except BlockingIOError:\n        pass"
    result = run(bomb, isolation, python, audit, timeout_s=1)
    # With the hook the first fork is refused; without it RLIMIT_NPROC caps the bomb until the
    # wall clock ends it, and the namespace or process group takes every copy down.
    assert result.status == ("error" if audit else "timeout")
    if audit:
        assert "os.fork is not allowed" in result.stderr


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_allocating_10_gb_is_a_memory_error(isolation, python, audit):
    result = run("blob = bytearray(10 * 2**30)\nprint('allocated')", isolation, python, audit, memory_mb=256)
    assert (result.status, result.stdout) == ("memory", "")
    assert "MemoryError" in result.stderr


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_writing_1_gb_to_stdout_is_killed(isolation, python, audit):
    flood = "import os\nchunk = b'x' * 2**20\nfor _ in range(1024):\n    os.write(1, chunk)\nprint('done')"
    result = run(flood, isolation, python, audit, timeout_s=5, max_output_bytes=2**16)
    assert (result.status, result.truncated, len(result.stdout)) == ("killed", True, 2**16)
    assert "bytes" in result.detail


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_rlimits_cannot_be_raised(isolation, python, audit):
    code = ("import resource\n"
            "for limit in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_CPU):\n"
            "    try:\n"
            "        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "    except (ValueError, OSError) as exc:\n"
            "        print('refused', type(exc).__name__)\n"
            "blob = bytearray(2 * 2**30)")
    result = run(code, isolation, python, audit, memory_mb=256)
    assert result.status == "memory"
    assert result.stdout.count("refused") == 3


# ---------------------------------------------------------------------------------------------
# Attacks: escaping the sandbox.

@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_background_process_is_killed(isolation, python, audit):
    code = f"import subprocess\nsubprocess.Popen(['/bin/sleep', '{MARKER}'])\nprint('started')"
    result = run(code, isolation, python, audit)
    if audit:
        assert result.status == "error" and "subprocess.Popen is not allowed" in result.stderr
    else:
        assert (result.status, result.stdout) == ("ok", "started\n")
    # the autouse fixture asserts that no `sleep 47.1108` is running any more


@pytest.mark.parametrize("audit", AUDIT)
def test_daemon_leaving_the_session_is_killed_with_the_namespace(audit):
    code = (f"import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '{MARKER}'])\n"
            "print('daemonized')")
    result = run(code, "namespaces", None, audit)
    assert result.status == ("error" if audit else "ok")


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_socket_cannot_reach_the_host(isolation, python, audit):
    if isolation == "process" and not audit:
        pytest.skip("without namespaces, only the audit hook keeps programs off the network (documented)")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (f"import socket\nwith socket.create_connection(('127.0.0.1', {port}), timeout=1) as s:\n"
                "    s.sendall(b'leak')")
        result = run(code, isolation, python, audit)
        assert result.status == "error"
        assert ("sandbox: socket." if audit else "Network is unreachable") in result.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_files_outside_cannot_be_read(isolation, python, audit, tmp_path):
    if isolation == "process" and not audit and not AS_ROOT:
        pytest.skip("without namespaces or a uid change, only the audit hook guards the user's files (documented)")
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    # World-readable files such as /etc/passwd are hidden by the namespaces' file system or the hook only.
    paths = [str(secret)] if isolation == "process" and not audit else [str(secret), "/etc/passwd"]
    for path in paths:
        result = run(f"print(open({path!r}).read())", isolation, python, audit)
        assert result.status == "error", (path, result)
        assert "TOPSECRET" not in result.stdout and "root:" not in result.stdout
        if isolation == "namespaces":  # the host's files do not exist there (/tmp is the sandbox's own)
            assert "No such file" in result.stderr or "is not allowed" in result.stderr
        else:
            assert ("is not allowed" if audit else "Permission denied") in result.stderr


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_files_outside_cannot_be_deleted(isolation, python, audit, tmp_path):
    if isolation == "process" and not audit and not AS_ROOT:
        pytest.skip("without namespaces or a uid change, only the audit hook guards the user's files (documented)")
    victim = tmp_path / "keep.txt"
    victim.write_text("still here")
    code = f"import os, shutil\nos.remove({str(victim)!r})"
    assert run(code, isolation, python, audit).status == "error"
    assert run(f"import shutil\nshutil.rmtree({str(tmp_path)!r})", isolation, python, audit).status == "error"
    assert victim.read_text() == "still here"


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_parent_environment_is_not_visible(isolation, python, audit, monkeypatch):
    monkeypatch.setenv("REASONRL_TEST_SECRET", "s3cr3t-value")
    code = ("import os\nprint(dict(os.environ))\n"
            "for pid in [p for p in os.listdir('/proc') if p.isdigit()] if os.path.isdir('/proc') else []:\n"
            "    try:\n"
            "        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError:\n"
            "        pass\n")
    result = run(code, isolation, python, audit)
    assert "s3cr3t-value" not in result.stdout + result.stderr
    assert "'PATH': '/usr/bin:/bin'" in result.stdout


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize(("isolation", "python"), ISOLATIONS)
def test_interpreter_crashes_are_reported(isolation, python, audit):
    abort = run("import os\nos.abort()", isolation, python, audit)
    assert (abort.status, abort.returncode, abort.detail) == ("killed", -6, "killed by SIGABRT")
    segfault = run("import ctypes\nctypes.string_at(0)", isolation, python, audit)
    if audit:
        assert segfault.status == "error" and "ctypes" in segfault.stderr  # native code is refused
    else:
        assert (segfault.status, segfault.returncode) == ("killed", -11)


def test_namespace_program_sees_only_its_own_file_system():
    code = "import json, os\nprint(json.dumps([sorted(os.listdir('/')), os.getuid(), os.path.exists('/proc/1')]))"
    result = run_python(code, isolation="namespaces", audit=False)
    assert result.status == "ok", result.stderr
    top, uid, has_proc = json.loads(result.stdout)
    interpreter_top = Path(os.path.realpath(sys.executable)).parts[1]  # e.g. "root" for /root/.pyenv
    assert set(top) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "sandbox", "sbin", "tmp", "usr",
                        interpreter_top}
    assert (uid, has_proc) == (0, False)  # root of its own user namespace, without capabilities; no /proc


@pytest.mark.skipif(not AS_ROOT or not os.path.exists("/usr/bin/setpriv"), reason="needs root to become another user")
def test_unprivileged_caller_gets_namespaces_too():
    """The path real users take: no root, the sandbox maps its own uid into a user namespace."""
    python = PROCESS_PYTHON or pytest.skip("no interpreter readable by an unprivileged user")
    script = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('sandbox_under_test', {sandbox.__file__!r})\n"
        "sb = importlib.util.module_from_spec(spec); sys.modules[spec.name] = sb; spec.loader.exec_module(sb)\n"
        f"python = {python!r}\n"
        "results = [sb.isolation_mode(python)]\n"
        "for code in ('import os; print(os.getuid())', 'print(open(\"/etc/passwd\").read())'):\n"
        "    r = sb.run_python(code, python=python, audit=False)\n"
        "    results.append([r.status, r.stdout])\n"
        "print(json.dumps(results))\n")
    completed = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c",
                                script], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                               timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout) == ["namespaces", ["ok", "0\n"], ["error", ""]]
