"""Shared by the sandbox tests: the isolations to run each attack in, the check after every test
that the trainer is unharmed and nothing of a sandbox is left (processes, directories, cgroups), and
deep directory trees for the run directory's walks."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reasonrl.sandbox import NOBODY, SandboxError, isolation_mode

AS_ROOT = os.geteuid() == 0
MARKER = "47.1108"  # an argument of the processes the attacks leave behind, to find them in /proc
SANDBOX_UIDS = range(0x60000000, 0x70000000)  # uids of "process" runs of a root caller (runner._UID_BASE)



def _namespaces_missing() -> str | None:
    """Why "namespaces" isolation cannot run here (its cases skip, the "process" ones still run)."""
    try:
        mode = isolation_mode()
    except SandboxError:
        return None  # nothing runs: the fixture below fails every test, with the reason
    return None if mode == "namespaces" else "user namespaces are not available here (the sandbox runs 'process')"


NAMESPACES_MISSING = _namespaces_missing()
ISOLATIONS = [pytest.param("namespaces", id="namespaces",
                           marks=pytest.mark.skipif(NAMESPACES_MISSING is not None, reason=str(NAMESPACES_MISSING))),
              pytest.param("process", id="process")]
AVAILABLE_ISOLATIONS = ("process",) if NAMESPACES_MISSING else ("namespaces", "process")
AUDIT = [pytest.param(True, id="audit"), pytest.param(False, id="kernel-only")]


@pytest.fixture(scope="module", autouse=True)
def namespaces_available():
    """Fails every test where the sandbox cannot run at all (no isolation works)."""
    try:
        isolation_mode()
    except SandboxError as exc:
        pytest.fail(f"the sandbox cannot run at all: {exc}")


def leftovers() -> list[str]:
    """Live processes of a sandbox: its supervisor, a sandbox uid (when root), or the attacks' marker."""
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
        if ("reasonrl sandbox supervisor" in cmdline or "sandbox/supervisor.py" in cmdline or MARKER in cmdline
                or (AS_ROOT and (uid == NOBODY or uid in SANDBOX_UIDS))):
            found.append(f"{pid} (uid {uid}): {cmdline[:120]}")
    return found


def own_cgroups() -> list[str]:
    try:
        from reasonrl.sandbox import cgroups
    except ImportError:  # a sandbox without cgroups
        return []
    found = cgroups.parents()
    bases = found[1] if found else ()
    prefix = f"reasonrl-sandbox-{os.getpid()}-"
    return [os.path.join(base, name) for base in bases for name in os.listdir(base) if name.startswith(prefix)]


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
    assert own_cgroups() == [], "a run's cgroup was left"


def system_python() -> str | None:
    """An interpreter an unprivileged user can run (the project's may live under /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", sys.executable):
        real = os.path.realpath(candidate)
        if not os.path.exists(real) or not _world_readable(real):
            continue
        version = subprocess.run([real, "-c", "import sys; print(sys.version_info[:2] >= (3, 11))"],
                                 capture_output=True, text=True, check=False).stdout.strip()
        if version == "True":
            return real
    return None


def _world_readable(path: str) -> bool:
    """Every directory above `path` searchable by others, and `path` readable and runnable by them."""
    searchable = all(os.stat(p).st_mode & 0o001 for p in Path(path).parents)
    return searchable and os.stat(path).st_mode & 0o005 == 0o005


def chain(top: str, depth: int, name: str = "d") -> None:
    """`depth` nested directories below `top`, built at the top (mkdir, rename) so no path grows long."""
    os.mkdir(os.path.join(top, name))
    for _ in range(depth - 1):
        os.mkdir(os.path.join(top, "up"))
        os.rename(os.path.join(top, name), os.path.join(top, "up", name))
        os.rename(os.path.join(top, "up"), os.path.join(top, name))
