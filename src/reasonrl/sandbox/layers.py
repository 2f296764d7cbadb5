"""What a sandboxed program sees and which limits bind it on this machine.

The file system it may read (the system libraries and the interpreter's prefix, a few system files
and devices, as binds in "namespaces" isolation and as Landlock rules in "process" isolation), the
process and memory bounds each isolation sets, and the same facts in words for `describe()` and
for the warning when namespaces are missing (docs/sandbox.md explains each layer).
"""

from __future__ import annotations

import functools
import os

from . import cgroups, confine

NPROC = 32  # processes and threads of one program
FALLBACK_PROCESSES = 4  # without a cgroup or a seccomp filter: processes, each with memory_mb / this
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime")  # the dynamic linker's cache; the time zone
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


@functools.cache
def libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def binds(interpreter: str) -> list[str]:
    """Directories the program needs to see (read-only): the system libraries and the interpreter's prefix."""
    own = prefix(interpreter)
    found = [d for d in SYSTEM_DIRS if os.path.lexists(d)]
    if not any(own == d or own.startswith(d + "/") for d in SYSTEM_DIRS):
        found.append(own)
    return found


def prefix(interpreter: str) -> str:
    return os.path.dirname(os.path.dirname(interpreter))


def landlock_rules(interpreter: str, work: str) -> list[tuple[str, int]]:
    rules = [(path, confine.READ_EXECUTE) for path in binds(interpreter)]
    rules += [(path, confine.FS_READ_FILE) for path in SYSTEM_FILES if os.path.exists(path)]
    rules += [(path, confine.FS_READ_FILE | confine.FS_WRITE_FILE | confine.FS_TRUNCATE) for path in DEVICES]
    return [*rules, (work, confine.READ_WRITE)]


def memory_bound() -> str:
    if cgroups.parents() is not None:
        return f"{cgroups.describe()}: memory_mb for all of the program's processes together"
    if confine.native_arch() is not None:
        return "one process: creating processes is refused (seccomp), RLIMIT_AS bounds it and its threads"
    return f"per process: at most {FALLBACK_PROCESSES} processes with memory_mb / {FALLBACK_PROCESSES} each"


def cpu_bound() -> str:
    if cgroups.cpu_bounded():
        return "one CPU for all of the program's processes (the cgroup's quota)"
    processes = (NPROC if cgroups.parents() is not None else 1 if confine.native_arch() is not None
                 else FALLBACK_PROCESSES)
    return f"timeout_s + 1 CPU-seconds per process (RLIMIT_CPU), at most {processes} process(es)"


def process_gaps() -> str:
    """What "process" isolation leaves weaker than namespaces on this machine, in words."""
    abi = confine.landlock_abi(libc())
    gaps = ["no network namespace (seccomp refuses sockets)" if confine.native_arch() else
            "the network is guarded by the audit hook only (no seccomp filter for this architecture)"]
    if abi == 0:
        gaps.append("files outside the run's directory (shared temp directories, the trainer's /proc) are "
                    "guarded by unix permissions and the audit hook only (no Landlock)")
    elif abi < 4:
        gaps.append("TCP is confined by seccomp only (Landlock ABI < 4)")
    if os.geteuid() != 0:
        gaps.append("the program runs as your uid (seccomp lets it name no other process)")
    if cgroups.parents() is None:
        gaps.append("no cgroup (the program may not create processes, so that one address-space limit bounds it)")
    return "Weaker than namespaces here: " + "; ".join(gaps) + "."
