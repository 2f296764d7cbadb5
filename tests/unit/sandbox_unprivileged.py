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

from sandbox_attack_programs import DAEMON, DISK_QUOTA, MANY_CHILDREN, MARKER, SIGNAL_ATTACKS


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
    except sandbox.SandboxError as exc:
        return {"status": "SandboxError", "error": str(exc)[-300:]}
    return {"status": result.status, "stdout": result.stdout[-300:], "stderr": result.stderr[-300:],
            "detail": result.detail}


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
            for name, code in SIGNAL_ATTACKS.items():
                seen = outcome(sandbox, code, isolation=isolation, audit=audit, python=python)
                cases[f"{isolation} audit={audit} signal {name}"] = {
                    "ok": seen["status"] in ("ok", "error", "killed"), **seen}
        seen = outcome(sandbox, MANY_CHILDREN, isolation=isolation, audit=False, memory_mb=160, timeout_s=8,
                       python=python)
        alive = int(seen.get("stdout", "0 0").split()[1]) if seen.get("stdout") else 0
        cases[f"{isolation} memory"] = {"ok": seen["status"] in ("ok", "memory", "killed") and alive <= 1, **seen}
        seen = outcome(sandbox, DAEMON, isolation=isolation, audit=False, python=python)
        cases[f"{isolation} daemon"] = {"ok": seen["status"] in ("ok", "error") and not marker_processes(), **seen}
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
    for audit, code in ((False, f"import os\nos.symlink({victim!r}, 'link')\nos.chmod('.', 0o500)"),
                        (True, "import os\nos.mkdir('d')\nos.chmod('d', 0)\nos.chmod('.', 0)")):
        seen = outcome(sandbox, code, isolation="process", audit=audit, python=python)
        cases[f"process cleanup audit={audit}"] = {"ok": seen["status"] == "ok", **seen}
    print(json.dumps({"isolation": mode, "skipped": skipped, "cases": cases}))


if __name__ == "__main__":
    main()
