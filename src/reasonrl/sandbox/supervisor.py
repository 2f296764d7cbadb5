"""The sandbox's supervisor: the process between the trainer and the program.

runner.py (in the trainer) starts it as `python -I -S -B` in a session of its own, with this file
and confine.py compiled by that interpreter and a spec (marshalled dict, last argument). It joins
the run's cgroups, enters the namespaces ("namespaces" isolation: it forks the namespace's init,
which builds the program's file system), and forks the program's process, which leaves for a
session of its own, confines itself (confine.py) and becomes the program's interpreter
(program.py). It reports how the program ended on a private pipe: the exit code, or "setup" when
the program never started (an infrastructure failure, never the program's). SIGTERM from the
trainer means "stop the program now" (wall clock, output cap, disk quota).

The program cannot stop its supervisor: its session and process group are its own (no killpg or
session signal reaches the supervisor); with namespaces the supervisor is outside the program's
PID namespace and the namespace's init takes the default action for every signal, which the
kernel then drops when it comes from inside; without them the supervisor runs as another uid
(root callers) or is outside the program's Landlock domain, or seccomp refuses the calls that signal
another process (kill and its kind by pid, pidfds, a descriptor's owner: see confine.py). Runs standard library only: nothing from reasonrl is imported here.
"""

from __future__ import annotations

import _signal as signal  # the module behind `signal`, without its enums (4 ms less per run)
import ctypes
import marshal
import os
import sys

import confine  # put in sys.modules by runner.py's bootstrap: the supervisor runs without reasonrl on its path

SANDBOX_DIR = "/sandbox"

# Linux constants (uapi headers; identical on every architecture).
_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 1, 4, 38, 36


def main(spec_hex: str) -> None:
    spec = marshal.loads(bytes.fromhex(spec_hex))
    libc = ctypes.CDLL(None, use_errno=True)
    # Dies with the thread that started it, so a crashed trainer leaves no sandbox behind.
    confine.call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != spec["parent_pid"]:
        os._exit(1)
    for procs in spec["cgroup_procs"]:  # before anything forks: every process of the run is counted
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    if spec["mode"] == "process":
        supervise(spec, libc)  # never returns
    sources = enter_namespaces(spec, libc)
    init = _fork_with_sigterm_held()
    if init == 0:
        namespace_init(spec, libc, sources)
    _stop_on_sigterm(init, group=False)
    for fd in (spec["status_fd"], spec["code_fd"], *sources.values()):
        os.close(fd)
    _, wait_status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(wait_status) & 0xFF)


def enter_namespaces(spec: dict, libc: ctypes.CDLL) -> dict[str, int]:
    """Move into new namespaces as their root (mapped to `spec["uid"]` outside, without any privilege
    there) and return O_PATH descriptors of what the program's file system will bind."""
    mapper = _fork_id_mapper(spec) if spec["drop_uid"] else None
    if spec["drop_uid"]:
        os.setgroups([])  # root's supplementary groups would still open root-group files
    confine.call(libc.unshare, _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC
                 | _CLONE_NEWUTS)
    # Opened now: binds cannot cross mount namespaces, and the interpreter may live where only the
    # calling uid can look (/root/.pyenv), which the namespace's root will not be.
    sources = {path: os.open(path, os.O_PATH) for path in (*spec["binds"], *spec["files"], *spec["devices"])
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
        confine.call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        confine.call(libc.prctl, _PR_SET_DUMPABLE, 1, 0, 0, 0)
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


def namespace_init(spec: dict, libc: ctypes.CDLL, sources: dict[str, int]) -> None:
    """Pid 1 of the new namespaces: builds the program's file system, then supervises it.

    `sources` are O_PATH descriptors of what to bind, mounted through /proc/self/fd.
    """
    confine.call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    root = spec["workdir"]
    confine.call(libc.mount, None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    confine.call(libc.mount, b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                 b"size=1m,nr_inodes=4096,mode=0755")
    _refuse_nested_binds([path for path in spec["binds"] if path in sources],
                         [*spec["binds"], *spec["files"], *spec["devices"]])
    read_only = [root + path for path in (*spec["binds"], *spec["files"]) if path in sources]
    for path in spec["binds"]:
        target = root + path
        if path not in sources:  # e.g. /lib -> usr/lib on merged-/usr systems
            os.symlink(os.readlink(path), target)
            continue
        os.makedirs(target, exist_ok=True)
        _bind(libc, sources[path], target)
    os.makedirs(root + "/etc", exist_ok=True)
    os.makedirs(root + "/dev", exist_ok=True)
    for path in (*spec["files"], *spec["devices"]):
        with open(root + path, "w"):  # a file to mount the file on
            pass
        _bind(libc, sources[path], root + path)
    for fd in sources.values():
        os.close(fd)
    _remount_read_only(libc, read_only)
    os.mkdir(root + SANDBOX_DIR)
    # noexec: what the program writes there can be read, never run or mapped as code.
    confine.call(libc.mount, b"tmpfs", (root + SANDBOX_DIR).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                 f"size={spec['disk_mb']}m,nr_inodes=4096,mode=0700".encode())
    if not os.path.lexists(root + "/tmp"):  # else the interpreter lives under /tmp, bound above
        os.symlink(SANDBOX_DIR, root + "/tmp")
    confine.call(libc.mount, None, root.encode(), None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None)
    # The kernel drops a signal sent from inside the namespace to its init when init has no handler:
    # with every disposition at its default, nothing the program sends can stop init.
    for number in signal.valid_signals():
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(number, signal.SIG_DFL)
            except (OSError, ValueError):  # signals reserved by the C library
                pass
    confine.call(libc.prctl, _PR_SET_DUMPABLE, 0, 0, 0, 0)  # not traceable by the namespace's other processes
    supervise(spec, libc, chroot=root)


def _bind(libc: ctypes.CDLL, source_fd: int, target: str) -> None:
    confine.call(libc.mount, f"/proc/self/fd/{source_fd}".encode(), target.encode(), None, _MS_BIND | _MS_REC, None)


def _refuse_nested_binds(bound: list[str], paths: list[str]) -> None:
    """Binds stay writable until all are made: a path made inside an earlier bind (a directory to
    mount on, a file to mount a file on) would be made on the machine itself. None lies inside
    another today (layers.binds leaves out a prefix inside a system directory); this keeps it so."""
    for path in paths:
        for outer in bound:
            if path != outer and path.startswith(outer.rstrip("/") + "/"):
                raise RuntimeError(f"sandbox layout: {path} lies inside the bind of {outer}")


def _remount_read_only(libc: ctypes.CDLL, targets: list[str]) -> None:
    """Makes every mount at or below each target read-only, outermost first.

    A read-only remount applies to one mount only, and a recursive bind brings along every mount
    below its source (a volume under /usr/local, say), each with its own flags: each one is made
    read-only, or a writable one below would stay writable to the program.
    """
    points = _mount_points()
    if missing := [target for target in targets if target not in points]:
        raise RuntimeError(f"sandbox layout: no mount at {missing} to make read-only")
    below = [target.rstrip("/") + "/" for target in targets]
    for mount_point in sorted({point for point in points
                               if point in targets or point.startswith(tuple(below))}, key=len):
        # A user namespace may not clear flags its parent set on a mount: keep them.
        flags = os.statvfs(mount_point).f_flag
        kept = sum(ms for st, ms in ((os.ST_NOEXEC, _MS_NOEXEC), (os.ST_NOATIME, _MS_NOATIME),
                                     (os.ST_NODIRATIME, _MS_NODIRATIME), (os.ST_RELATIME, _MS_RELATIME))
                   if flags & st)
        confine.call(libc.mount, None, os.fsencode(mount_point), None,
                     _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | kept, None)


def _mount_points() -> list[str]:
    """The mount points of this mount namespace (from /proc/self/mountinfo, whose fifth field is the
    mount point with space, tab, newline and backslash written as octal escapes)."""
    with open("/proc/self/mountinfo", "rb") as mountinfo:
        return [os.fsdecode(line.split(b" ")[4].replace(b"\\040", b" ").replace(b"\\011", b"\t")
                            .replace(b"\\012", b"\n").replace(b"\\134", b"\\")) for line in mountinfo]


def supervise(spec: dict, libc: ctypes.CDLL, chroot: str | None = None) -> None:
    """Start the program, wait for it, make sure nothing it started is left, report, exit."""
    if chroot is None:
        # Whatever the program leaves behind (daemons that left its session included) is re-parented
        # here rather than to the system's init, to be killed below.
        confine.call(libc.prctl, _PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    started_read, started_write = os.pipe()
    program = _fork_with_sigterm_held() if chroot is None else os.fork()
    if program == 0:
        os.close(started_read)
        start_program(spec, libc, chroot, started_write)  # never returns
    if chroot is None:  # init itself has no handler (see namespace_init): the outer supervisor kills init
        _stop_on_sigterm(program, group=True)
    os.close(started_write)
    os.close(spec["code_fd"])
    started = os.read(started_read, 1) == b"1"  # written by program.py just before the program; EOF if not
    os.close(started_read)
    _, wait_status = os.waitpid(program, 0)
    if chroot is None:
        _kill_descendants()
    report = str(os.waitstatus_to_exitcode(wait_status)) if started else "setup"
    os.write(spec["status_fd"], report.encode())
    # Namespaces: exiting as init makes the kernel kill what the program left running.
    os._exit(0)


def _fork_with_sigterm_held() -> int:
    """fork, SIGTERM held back in the parent until `_stop_on_sigterm` knows the child (a SIGTERM that
    came before would kill the supervisor and leave the child running); the child gets it at once."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    child = os.fork()
    if child == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return child


def _stop_on_sigterm(child: int, group: bool) -> None:
    """SIGTERM (from the trainer: wall clock or output cap) kills `child`: the program's process group
    (its descendants are killed once it is reaped), or the namespace's init and with it the namespace.
    Releases the SIGTERM `_fork_with_sigterm_held` held back."""
    def stop(_signum: int, _frame: object) -> None:
        try:
            os.killpg(child, signal.SIGKILL) if group else os.kill(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # no group yet (before setsid), or not yet the sandbox uid's
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:  # already gone
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _kill_descendants() -> None:
    """Kill and reap every process left below this one (orphans come here: a child subreaper)."""
    while True:
        killed = 0
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        try:
            pid, _ = os.waitpid(-1, 0 if killed else os.WNOHANG)
        except ChildProcessError:
            return
        if not killed and pid == 0:  # a child not listed yet (re-parented just now): look again
            os.sched_yield()


def _children() -> list[int]:
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except FileNotFoundError:  # kernels without CONFIG_PROC_CHILDREN
        children = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == pid:
                        children.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
        return children


def start_program(spec: dict, libc: ctypes.CDLL, chroot: str | None, started_fd: int) -> None:
    """In the program's process: leave the session, confine, become the program's interpreter."""
    try:
        os.setsid()  # signals to the program's group or session stay among its own processes
        os.close(spec["status_fd"])
        os.umask(0o077)
        if spec["cgroup_procs"]:
            confine.call(libc.prctl, _PR_SET_DUMPABLE, 1, 0, 0, 0)  # init's children do not own /proc/self
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # the cgroup's OOM killer takes the program's processes before the supervisor
        use_landlock = chroot is None and spec["landlock_rules"] is not None
        landlock_abi = confine.landlock_abi(libc) if use_landlock else 0
        ruleset = confine.landlock_ruleset(libc, landlock_abi, spec["landlock_rules"]) if landlock_abi else None
        prefix_fd = None
        if chroot is not None:
            os.chroot(chroot)
            os.chdir(SANDBOX_DIR)
            confine.drop_capabilities(libc)
        elif spec["drop_uid"]:
            # The interpreter may live where the sandbox uid cannot look (/root/.pyenv): it is reached
            # through this descriptor (/proc/self/fd/N), opened while the path is still visible.
            prefix_fd = os.open(spec["prefix"], os.O_PATH | os.O_DIRECTORY)
            os.set_inheritable(prefix_fd, True)
            os.setgroups([])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        confine.call(libc.prctl, _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        confine.call(libc.prctl, _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # Without a namespace or a uid of its own, RLIMIT_NPROC counts every process of the caller's uid.
        shared_uid = chroot is None and not spec["drop_uid"]
        tasks = spec["tasks"] + (confine.tasks_of(os.getuid()) if shared_uid else 0)
        confine.set_limits(memory_bytes=spec["memory_bytes"], cpu_s=spec["cpu_s"], file_bytes=spec["disk_mb"] << 20,
                           open_files=spec["open_files"], tasks=tasks)
        if ruleset is not None:
            confine.landlock_restrict(libc, ruleset)
        arch = confine.native_arch()
        if arch is not None:
            confine.install_seccomp(libc, confine.seccomp_filter(arch, no_processes=spec["no_processes"],
                                                                 own_pid=os.getpid() if shared_uid else None))
        _become_interpreter(spec, started_fd, SANDBOX_DIR if chroot is not None else spec["workdir"], prefix_fd)
    except BaseException as exc:  # noqa: BLE001 (the child must never run the program half-confined)
        _report_failure(exc)
        os._exit(1)


def _become_interpreter(spec: dict, started_fd: int, workdir: str, prefix_fd: int | None) -> None:
    """exec a fresh interpreter running program.py (its code from the spec) on the program."""
    os.set_inheritable(started_fd, True)
    settings = {"code_fd": spec["code_fd"], "started_fd": started_fd, "audit": spec["audit"], "workdir": workdir,
                "read_roots": spec["read_roots"]}
    argv_tail = ["-c", "import marshal, sys; exec(marshal.loads(bytes.fromhex(sys.argv[1])))", spec["boot"],
                 marshal.dumps(settings).hex()]
    if prefix_fd is None:
        executable = spec["interpreter"]
        os.execve(executable, [executable, "-I", "-S", "-B", *argv_tail], spec["env"])
    home = f"/proc/self/fd/{prefix_fd}"
    executable = home + spec["interpreter"][len(spec["prefix"]):]
    # -I would ignore PYTHONHOME; -s -P -B are its other parts, and the environment is ours alone.
    os.execve(executable, [executable, "-s", "-S", "-B", "-P", *argv_tail], {**spec["env"], "PYTHONHOME": home})


def _report_failure(exc: BaseException) -> None:
    """The traceback, without importing anything: the uid may no longer see the standard library."""
    lines = ["sandbox setup failed in the program's process:"]
    tb = exc.__traceback__
    while tb is not None:
        lines.append(f"  {tb.tb_frame.f_code.co_filename}, line {tb.tb_lineno}, in {tb.tb_frame.f_code.co_name}")
        tb = tb.tb_next
    lines.append(f"{type(exc).__name__}: {exc}")
    os.write(2, ("\n".join(lines) + "\n").encode(errors="replace"))


if __name__ == "__main__":
    main(sys.argv[-1])  # never returns
