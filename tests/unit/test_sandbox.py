"""The sandbox: each attack is stopped and reported with the right status, the parent is unharmed,
and no process, directory or cgroup of the sandbox is left afterwards (checked after every test).

Attacks run in both isolations ("namespaces", and "process", the fallback without user
namespaces) and with the audit hook on and off: off, the kernel layers must hold alone. The
attack classes (supervisor, audit hook, total memory, the fallback's leaks, bad input, an
unprivileged caller) are in test_sandbox_attacks.py.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
from sandbox_support import (
    AUDIT,
    ISOLATIONS,
    MARKER,
    NAMESPACES_MISSING,
    namespaces_available,
    parent_unharmed_and_nothing_left,
)

from reasonrl.sandbox import SandboxError, cgroups, describe, run_many, run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")
__all__ = ["namespaces_available", "parent_unharmed_and_nothing_left"]  # autouse fixtures


def run(code: str, isolation: str, audit: bool = True, **kwargs):
    return run_python(code, isolation=isolation, audit=audit, **kwargs)


# ---------------------------------------------------------------------------------------------
# Basics.

@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_ok_error_exit_code_and_stdin(isolation):
    result = run("import json, re, hashlib, decimal, fractions, heapq, itertools, datetime, random\n"
                 "print(json.dumps({'n': int(input()) * 2}))", isolation, stdin="21\n")
    assert (result.status, result.stdout, result.returncode, result.truncated) == ("ok", '{"n": 42}\n', 0, False)

    result = run("def f():\n    raise ValueError('bad input')\nf()", isolation)
    assert (result.status, result.returncode) == ("error", 1)
    assert 'File "<program>", line 2, in f' in result.stderr and "ValueError: bad input" in result.stderr

    assert run("import sys; sys.exit(3)", isolation).returncode == 3
    syntax = run("def broken(:\n", isolation)
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_working_directory_is_private_writable_and_removed(isolation):
    code = ("import json, os\nopen('notes.txt', 'w').write('x' * 1000)\n"
            "print(json.dumps({'cwd': os.getcwd(), 'files': os.listdir('.'), 'env': sorted(os.environ)}))")
    first, second = run(code, isolation), run(code, isolation)
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
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_infinite_loop_times_out(isolation, audit):
    result = run("while True:\n    pass", isolation, audit, timeout_s=1)
    assert (result.status, result.returncode) == ("timeout", None)


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_fork_bomb_is_contained(isolation, audit):
    # EAGAIN (BlockingIOError) is RLIMIT_NPROC saying no; the bomb ignores it and keeps trying.
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except BlockingIOError:\n        pass"
    result = run(bomb, isolation, audit, timeout_s=1)
    # With the hook the first fork is refused; without it RLIMIT_NPROC caps the bomb until the
    # wall clock ends it, and the namespace or process group takes every copy down.
    assert result.status == ("error" if audit else "timeout")
    if audit:
        assert "os.fork is not allowed" in result.stderr


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_allocating_10_gb_is_a_memory_error(isolation, audit):
    result = run("blob = bytearray(10 * 2**30)\nprint('allocated')", isolation, audit, memory_mb=256)
    assert (result.status, result.stdout) == ("memory", "")
    assert "MemoryError" in result.stderr


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_writing_1_gb_to_stdout_is_killed(isolation, audit):
    flood = "import os\nchunk = b'x' * 2**20\nfor _ in range(1024):\n    os.write(1, chunk)\nprint('done')"
    result = run(flood, isolation, audit, timeout_s=5, max_output_bytes=2**16)
    assert (result.status, result.truncated, len(result.stdout)) == ("killed", True, 2**16)
    assert "bytes" in result.detail


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_rlimits_cannot_be_raised(isolation, audit):
    code = ("import resource\n"
            "for limit in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_CPU):\n"
            "    try:\n"
            "        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "    except (ValueError, OSError) as exc:\n"
            "        print('refused', type(exc).__name__)\n"
            "blob = bytearray(2 * 2**30)")
    result = run(code, isolation, audit, memory_mb=256)
    if audit:  # the module is not among those a program may import
        assert result.status == "error" and "ModuleNotFoundError: sandbox: import of 'resource'" in result.stderr
    else:
        assert result.status == "memory"
        assert result.stdout.count("refused") == 3


# ---------------------------------------------------------------------------------------------
# Attacks: escaping the sandbox.

@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_background_process_is_killed(isolation, audit):
    code = (f"import os\nif os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '{MARKER}'])\n"
            "print('started')")
    result = run(code, isolation, audit)
    if audit:
        assert result.status == "error" and "os.fork is not allowed" in result.stderr
    else:  # started where a cgroup holds it, refused (seccomp) where none does
        assert (result.status, result.stdout) in (("ok", "started\n"), ("error", ""))
    # the autouse fixture asserts that no `sleep 47.1108` is running any more


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_socket_cannot_reach_the_host(isolation, audit):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (f"import socket\nwith socket.create_connection(('127.0.0.1', {port}), timeout=1) as s:\n"
                "    s.sendall(b'leak')")
        result = run(code, isolation, audit)
        assert result.status == "error"
        # The hook refuses the module; without it seccomp refuses the socket itself.
        assert ("sandbox: import of 'socket'" if audit else "PermissionError") in result.stderr
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing connected


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_socket_of_another_family_reaches_the_host_either(isolation, audit, tmp_path):
    """UDP to a loopback listener, a world-writable unix socket and an abstract one: nothing arrives."""
    unix_path, abstract = str(tmp_path / "listener.sock"), f"\0reasonrl-test-{os.getpid()}"
    with (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as unix,
          socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as hidden):
        udp.bind(("127.0.0.1", 0))
        unix.bind(unix_path)
        os.chmod(unix_path, 0o777)
        hidden.bind(abstract)
        targets = [("AF_INET", ("127.0.0.1", udp.getsockname()[1])), ("AF_UNIX", unix_path), ("AF_UNIX", abstract)]
        code = "import socket\n" + "".join(
            f"try:\n    with socket.socket(socket.{family}, socket.SOCK_DGRAM) as s:\n"
            f"        s.sendto(b'leak', {address!r})\n    print('sent')\n"
            f"except PermissionError:\n    print('refused')\n" for family, address in targets)
        result = run(code, isolation, audit)
        if audit:  # the hook refuses the module
            assert result.status == "error" and "sandbox: import of 'socket'" in result.stderr
        else:  # seccomp refuses each socket itself
            assert (result.status, result.stdout) == ("ok", "refused\n" * 3), result
        for listener in (udp, unix, hidden):
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):
                listener.recv(16)  # nothing arrived


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_files_outside_cannot_be_read(isolation, audit, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    secret.chmod(0o644)  # unix permissions would let anyone read it: only the sandbox's layers stop them
    # World-readable files such as /etc/passwd are hidden by the namespaces' file system, Landlock or the hook.
    for path in (str(secret), "/etc/passwd"):
        result = run(f"print(open({path!r}).read())", isolation, audit)
        assert result.status == "error", (path, result)
        assert "TOPSECRET" not in result.stdout and "root:" not in result.stdout
        if isolation == "namespaces":  # the host's files do not exist there (/tmp is the sandbox's own)
            assert "No such file" in result.stderr or "is not allowed" in result.stderr
        else:
            assert ("is not allowed" if audit else "Permission denied") in result.stderr


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_files_outside_cannot_be_deleted(isolation, audit, tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("still here")
    code = f"import os, shutil\nos.remove({str(victim)!r})"
    assert run(code, isolation, audit).status == "error"
    assert run(f"import shutil\nshutil.rmtree({str(tmp_path)!r})", isolation, audit).status == "error"
    assert victim.read_text() == "still here"


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_link_made_inside_the_run_reaches_no_file_outside(isolation, audit, tmp_path):
    """A symbolic or hard link in the run's directory to a world-writable file outside, then a write
    through it: refused, the file unchanged (unix permissions alone would allow the write)."""
    victim = tmp_path / "victim.txt"
    victim.write_text("unchanged")
    victim.chmod(0o666)
    tmp_path.chmod(0o755)
    code = (f"import os\nfor name, make in (('soft', os.symlink), ('hard', os.link)):\n"
            f"    try:\n        make({str(victim)!r}, name)\n"
            f"        with open(name, 'a') as link:\n            link.write('written')\n"
            f"        print(name, 'written')\n    except OSError:\n        print(name, 'refused')\n")
    result = run(code, isolation, audit)
    assert victim.read_text() == "unchanged", result
    assert result.status == "ok" and result.stdout == "soft refused\nhard refused\n", result


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_parent_environment_is_not_visible(isolation, audit, monkeypatch):
    monkeypatch.setenv("REASONRL_TEST_SECRET", "s3cr3t-value")
    code = ("import os\nprint(dict(os.environ))\n"
            "for pid in [p for p in os.listdir('/proc') if p.isdigit()] if os.path.isdir('/proc') else []:\n"
            "    try:\n"
            "        print(open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError:\n"
            "        pass\n")
    result = run(code, isolation, audit)
    assert "s3cr3t-value" not in result.stdout + result.stderr
    assert "'PATH': '/usr/bin:/bin'" in result.stdout


@pytest.mark.parametrize("audit", AUDIT)
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_interpreter_crashes_are_reported(isolation, audit):
    abort = run("import os\nos.abort()", isolation, audit)
    assert (abort.status, abort.returncode, abort.detail) == ("killed", -6, "killed by SIGABRT")
    segfault = run("import ctypes\nctypes.string_at(0)", isolation, audit)
    if audit:
        assert segfault.status == "error" and "import of 'ctypes'" in segfault.stderr  # native code is refused
    else:
        assert (segfault.status, segfault.returncode) == ("killed", -11)


@pytest.mark.skipif(NAMESPACES_MISSING is not None, reason=str(NAMESPACES_MISSING))
def test_namespace_program_sees_only_its_own_file_system():
    code = "import json, os\nprint(json.dumps([sorted(os.listdir('/')), os.getuid(), os.path.exists('/proc/1')]))"
    result = run_python(code, isolation="namespaces", audit=False)
    assert result.status == "ok", result.stderr
    top, uid, has_proc = json.loads(result.stdout)
    interpreter_top = Path(os.path.realpath(sys.executable)).parts[1]  # e.g. "root" for /root/.pyenv
    assert set(top) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "sandbox", "sbin", "tmp", "usr",
                        interpreter_top}
    assert (uid, has_proc) == (0, False)  # root of its own user namespace, without capabilities; no /proc


def test_describe_names_the_layers_in_force():
    layers = describe()
    assert layers["isolation"] == ("process" if NAMESPACES_MISSING else "namespaces")
    # One of the bounds docs/sandbox.md explains, and the one the machine allows.
    assert layers["memory_bound"].split(":")[0].split(" under ")[0] in ("cgroup v2", "cgroup v1", "one process",
                                                                        "per process")
    assert (layers["cgroup"] == "none") == (not layers["memory_bound"].startswith("cgroup"))
    assert layers["cpu_bound"].startswith("one CPU") == cgroups.cpu_bounded()
    assert layers["cpu_bound"].startswith("one CPU") or layers["cpu_bound"].startswith("timeout_s + 1 CPU-seconds")


@pytest.fixture
def supervisor(monkeypatch):
    """The supervisor module, which imports confine.py as the bootstrap puts it: a top-level module."""
    import importlib

    from reasonrl.sandbox import confine

    monkeypatch.setitem(sys.modules, "confine", confine)
    return importlib.import_module("reasonrl.sandbox.supervisor")


def test_a_layout_with_a_path_inside_a_bind_is_refused(supervisor):
    """Binds take writes until all are made: a directory or file made inside one would be made on the
    machine, so such a layout is refused before anything is bound."""
    supervisor._refuse_nested_binds(["/usr", "/lib"], ["/usr", "/usr2", "/lib", "/libx32", "/etc/ld.so.cache", "/dev/null"])
    with pytest.raises(RuntimeError, match="/usr/local/python lies inside the bind of /usr"):
        supervisor._refuse_nested_binds(["/usr", "/usr/local/python"], ["/usr", "/usr/local/python"])
    with pytest.raises(RuntimeError, match="/etc/ld.so.cache lies inside the bind of /"):
        supervisor._refuse_nested_binds(["/"], ["/", "/etc/ld.so.cache"])


def test_a_read_only_target_missing_from_the_mount_table_is_refused(supervisor, monkeypatch):
    """A bind the mount table does not show would stay writable: refused, before any remount."""
    monkeypatch.setattr(supervisor, "_mount_points", lambda: ["/", "/root/usr"])
    with pytest.raises(RuntimeError, match=r"no mount at \['/root/lib'\]"):
        supervisor._remount_read_only(None, ["/root/usr", "/root/lib"])
