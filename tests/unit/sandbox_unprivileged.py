"""Run by test_sandbox_attacks.py as an unprivileged uid (the trainer of most users): the attack
classes in both isolations, printed as JSON. Loads reasonrl's sandbox package by path (the rest
of reasonrl needs torch, which this interpreter need not have).

    python sandbox_unprivileged.py SRC_DIR VICTIM_DIR
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from sandbox_attack_programs import (
    DAEMON,
    DEEP_TREE,
    DISK_QUOTA,
    MANY_CHILDREN,
    MARKER,
    METADATA_BY_DESCRIPTOR,
    METADATA_BY_PATH,
    MOUNT_FLAGS,
    SIGNAL_ATTACKS,
    metadata_attack,
    mounts_as_bound,
)

VICTIM = "import time\ntime.sleep(6)\nprint('alive')"  # outlives the signal attacks run beside it


def load_sandbox(src: str):
    package = Path(src) / "reasonrl" / "sandbox"
    if package.is_dir():
        spec = importlib.util.spec_from_file_location("sandbox_under_test", package / "__init__.py",
                                                      submodule_search_locations=[str(package)])
    else:  # a single module, as in older versions
        spec = importlib.util.spec_from_file_location("sandbox_under_test", package.with_suffix(".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def outcome(sandbox, code: str, **options) -> dict:
    try:
        result = sandbox.run_python(code, **options)
    except Exception as exc:  # noqa: BLE001 (SandboxError, or what run_python should never raise: the case fails)
        return {"status": type(exc).__name__, "error": str(exc)[-300:]}
    return {"status": result.status, "stdout": result.stdout[-300:], "stderr": result.stderr[-300:],
            "detail": result.detail}


def beside_a_victim(sandbox, attacks: dict[str, str], **options) -> tuple[dict, dict]:
    """Each attack's outcome, run while another program runs beside them with the same options (in
    "process" isolation, as the same uid: the caller's), and that program's outcome, with
    "outlived": whether it was still running when the last attack ended."""
    import threading
    import time

    victim: dict = {}
    thread = threading.Thread(target=lambda: victim.update(outcome(sandbox, VICTIM, timeout_s=20, **options)))
    thread.start()
    time.sleep(0.5)  # the victim is running
    seen = {name: outcome(sandbox, code, **options) for name, code in attacks.items()}
    outlived = thread.is_alive()
    thread.join()
    return seen, {**victim, "outlived": outlived}


def copy_interpreter(python: str, destination: Path) -> tuple[str, str]:
    """A copy of `python` (a self-contained build such as /usr/bin/python3) and its standard library
    under `destination`, owned by the caller as a pyenv, conda or uv install is: its executable and
    its os.py."""
    import shutil
    import subprocess

    stdlib = subprocess.run([python, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    skipped = shutil.ignore_patterns("test", "tests", "site-packages", "dist-packages", "__pycache__", "idlelib",
                                     "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data")
    copied = destination / "lib" / os.path.basename(stdlib)
    shutil.copytree(stdlib, copied, symlinks=True, ignore=skipped)
    (destination / "bin").mkdir()
    shutil.copy2(os.path.realpath(python), destination / "bin" / "python3")
    return str(destination / "bin" / "python3"), str(copied / "os.py")


def metadata_of(path: str) -> tuple:
    info = os.stat(path)
    try:
        attributes = sorted(os.listxattr(path))
    except OSError:  # a file system without extended attributes
        attributes = []
    return info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns, info.st_atime_ns, attributes


def metadata_held(seen: dict, before: tuple, target: str) -> bool:
    """Every attempt of METADATA was made and refused, and the target is as it was."""
    lines = seen.get("stdout", "").splitlines()
    made = [line.split()[0] for line in lines]
    return (seen["status"] == "ok" and made in ([*METADATA_BY_PATH, *METADATA_BY_DESCRIPTOR], [*METADATA_BY_PATH, "open"])
            and not any(line.endswith("changed") for line in lines) and metadata_of(target) == before)


def metadata_attacks(sandbox, isolations: tuple[str, ...], python: str, owned: tuple[str, str], victim: str) -> dict:
    """A program changes nothing of what lies outside its run, whether the caller owns it (an
    interpreter installed by the user, a directory of theirs) or not; that interpreter still works;
    a tree deeper than any recursion limit is measured and removed."""
    owned_python, owned_os = owned
    cases = {}
    for isolation in isolations:
        for audit in (True, False):
            for target, interpreter in ((owned_os, owned_python), (victim, python)):
                before = metadata_of(target)
                seen = outcome(sandbox, metadata_attack(target), isolation=isolation, audit=audit, python=interpreter)
                cases[f"{isolation} audit={audit} metadata of {os.path.basename(target)}"] = {
                    "ok": metadata_held(seen, before, target), **seen}
            seen = outcome(sandbox, "print(1)", isolation=isolation, audit=audit, python=owned_python)
            cases[f"{isolation} audit={audit} owned interpreter still runs"] = {"ok": seen["status"] == "ok", **seen}
            seen = outcome(sandbox, DEEP_TREE, isolation=isolation, audit=audit, python=python, timeout_s=20)
            cases[f"{isolation} audit={audit} deep tree"] = {"ok": seen["status"] == "ok", **seen}
    return cases


def marker_processes() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if MARKER in cmdline and int(pid) != os.getpid():
            found.append(cmdline)
    return found


def main() -> None:
    src, victim = sys.argv[1], sys.argv[2]
    sandbox = load_sandbox(src)
    cases: dict[str, dict] = {}
    python = os.path.realpath(sys.executable)
    mode = sandbox.isolation_mode(python)
    skipped = None if mode == "namespaces" else "user namespaces are not available to this uid"
    for isolation in ("namespaces", "process") if skipped is None else ("process",):
        for audit in (True, False):
            attacks, beside = beside_a_victim(sandbox, SIGNAL_ATTACKS, isolation=isolation, audit=audit, python=python)
            for name, seen in attacks.items():
                cases[f"{isolation} audit={audit} signal {name}"] = {
                    "ok": seen["status"] in ("ok", "error", "killed"), **seen}
            cases[f"{isolation} audit={audit} signals: the run beside them"] = {
                "ok": (beside.get("status"), beside.get("stdout"), beside["outlived"]) == ("ok", "alive\n", True),
                **beside}
        seen = outcome(sandbox, MANY_CHILDREN, isolation=isolation, audit=False, memory_mb=160, timeout_s=8,
                       python=python)
        alive = int(seen.get("stdout", "0 0").split()[1]) if seen.get("stdout") else 0
        cases[f"{isolation} memory"] = {"ok": seen["status"] in ("ok", "memory", "killed") and alive <= 1, **seen}
        seen = outcome(sandbox, DAEMON, isolation=isolation, audit=False, python=python)
        cases[f"{isolation} daemon"] = {"ok": seen["status"] in ("ok", "error") and not marker_processes(), **seen}
    if skipped is None:
        seen = outcome(sandbox, MOUNT_FLAGS, isolation="namespaces", audit=False, python=python)
        cases["namespaces binds read-only"] = {"ok": seen["status"] == "ok" and mounts_as_bound(seen["stdout"]), **seen}
    # The fallback's own leaks: a shared writable place, the trainer's /proc, the cleanup of a tree
    # whose permissions the program took away and where it planted a link to a directory of yours.
    leak = os.path.join(victim, "leak.txt")
    seen = outcome(sandbox, f"open({leak!r}, 'w').write('x')", isolation="process", audit=False, python=python)
    cases["process shared place"] = {"ok": seen["status"] == "error" and not os.path.exists(leak), **seen}
    seen = outcome(sandbox, f"print(open('/proc/{os.getpid()}/cmdline').read())", isolation="process", audit=False,
                   python=python)
    cases["process trainer's /proc"] = {"ok": seen["status"] == "error" and "sandbox_unprivileged" not in
                                        seen.get("stdout", ""), **seen}
    import resource

    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    seen = outcome(sandbox, f"import resource\nresource.prlimit({os.getpid()}, resource.RLIMIT_NOFILE, (3, 3))",
                   isolation="process", audit=False, python=python)
    cases["process prlimit of the trainer"] = {
        "ok": seen["status"] == "error" and resource.getrlimit(resource.RLIMIT_NOFILE) == before, **seen}
    for name, code in DISK_QUOTA.items():
        seen = outcome(sandbox, code, isolation="process", audit=False, python=python, disk_mb=16, timeout_s=10)
        cases[f"process disk quota: {name}"] = {"ok": seen["status"] == "killed" and "disk_mb" in seen["detail"],
                                                **seen}
    # The caller's uid: no chmod at all (seccomp), but directories made without permissions.
    for audit, code in ((False, (f"import os\nos.symlink({victim!r}, 'link')\nos.mkdir('d', 0)\n"
                                 "try:\n    os.chmod('.', 0o500)\nexcept PermissionError:\n    print('refused')")),
                        (True, "import os\nos.mkdir('d')\nos.mkdir('d/e', 0)\nos.mkdir('f', 0)\nprint('refused')")):
        seen = outcome(sandbox, code, isolation="process", audit=audit, python=python)
        cases[f"process cleanup audit={audit}"] = {"ok": seen["status"] == "ok" and seen["stdout"] == "refused\n",
                                                   **seen}
    owned = copy_interpreter(python, Path(victim) / "python")
    cases.update(metadata_attacks(sandbox, ("namespaces", "process") if skipped is None else ("process",), python,
                                  owned, victim))
    print(json.dumps({"isolation": mode, "skipped": skipped, "cases": cases}))


if __name__ == "__main__":
    main()
