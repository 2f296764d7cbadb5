"""Kernel confinement of a sandboxed program: resource limits, capabilities, Landlock and seccomp.

Applied by the supervisor (see supervisor.py) in the program's process, after it has left the
trainer's session and before it starts the program's interpreter; all of it survives `execve` and
none of it can be undone by the program. Runs in `python -I -S`: standard library and `ctypes` only,
no imports from the rest of reasonrl.

- Landlock (Linux >= 5.13, no privilege needed): file access is denied by default; the rules allow
  reading and executing the system directories and the interpreter's prefix, reading and writing the
  program's own directory (without executing what is written there) and the few devices a program
  uses. From ABI 4 (Linux 6.7) TCP bind and connect are denied; from ABI 6 (Linux 6.12) signals and
  abstract unix sockets cannot reach any process outside the program's own Landlock domain.
- seccomp: system calls are filtered by class, each class denied whole: other processes' memory and
  tracing, kernel state (mounts, modules, keys, BPF, perf, clocks), namespaces (unshare, setns, clone
  with any CLONE_NEW* flag, and clone3, whose flags a filter cannot read: ENOSYS, libc falls back to
  clone), signals delivered later by the kernel (fcntl F_SETOWN/F_SETOWN_EX/F_SETSIG, ioctl
  FIOSETOWN/SIOCSPGRP: a descriptor's owner, signalled on I/O with the setter's rights), what an
  owner may do through a descriptor opened for reading (fcntl F_SETLEASE; ioctl FS_IOC_SETFLAGS,
  FS_IOC_SETVERSION, FS_IOC_FSSETXATTR), io_uring,
  userfaultfd, sockets and socket pairs, preallocation of disk space (fallocate: gigabytes between
  two measurements of the quota), System V IPC and POSIX message queues, and every call of a foreign
  ABI (32-bit or x32 entry points on x86_64, whose numbers differ). An allowlist of calls would break interpreters across libc versions;
  a class left out here is left to the other layers. With `no_processes` (no cgroup bounds the
  program's memory), creating processes and memory files is denied too: one process, bounded by its
  address-space limit, and its threads. With `own_pid` (the program shares its uid with the caller's
  other processes), calls that act on a process by pid (signals, rlimits, scheduling, I/O
  priority) may only name the program's own process or its own process group, and no file's mode,
  owner, times or extended attributes may change (the chmod, chown, utime and xattr families, by path
  or by descriptor): everything the caller owns outside the run (its interpreter, checkpoints, home)
  would otherwise be the program's to change, as Landlock does not cover metadata.
- Resource limits: set soft = hard, so they cannot be raised again.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import stat
import struct

_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_PR_CAPBSET_READ, _PR_CAPBSET_DROP = 23, 24
_CAPABILITY_VERSION_3 = 0x20080522

# Landlock (linux/landlock.h). Its system calls have the same numbers on every architecture.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION, _LANDLOCK_RULE_PATH_BENEATH = 1, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
# The rights a rule on a file (not a directory) may hold.
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
READ_EXECUTE = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# The program's directory: everything but executing, device nodes and (no sockets exist) socket files.
READ_WRITE = ((1 << 16) - 1) & ~(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK | FS_MAKE_SOCK | FS_IOCTL_DEV)

# seccomp (linux/seccomp.h, linux/filter.h, linux/audit.h).
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JA, _JEQ, _JSET, _RET = 0x20, 0x05, 0x15, 0x45, 0x06
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16  # struct seccomp_data; arguments are 64-bit, little-endian
_X32_SYSCALL_BIT = 0x40000000
_OFFSET_ARG1 = _OFFSET_ARG0 + 8
_CLONE_THREAD = 0x00010000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: clone's way into new namespaces.
_CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
# Commands naming a process that the kernel signals later (SIGIO/SIGURG, or any signal set by F_SETSIG)
# with the credentials of the caller at the time: a signal no kill() filter sees.
# F_SETLEASE too: a lease on a file makes whoever opens it next wait (up to lease-break-time).
_FCNTL_OWNER_COMMANDS = (8, 10, 15, 1024)  # F_SETOWN, F_SETSIG, F_SETOWN_EX, F_SETLEASE
# ...and inode flags and project ids, which the owner sets through a descriptor opened only for reading.
_IOCTL_OWNER_COMMANDS = (0x8901, 0x8902,  # FIOSETOWN, SIOCSPGRP
                         0x40086602, 0x40046602,  # FS_IOC_SETFLAGS (and its 32-bit form): chattr
                         0x40087602, 0x40047602,  # FS_IOC_SETVERSION
                         0x401C5820)  # FS_IOC_FSSETXATTR


class _Arch:
    """One architecture's seccomp identity and the numbers of the calls the filter names."""

    def __init__(self, audit_arch: int, numbers: dict[str, int]) -> None:
        self.audit_arch, self.numbers = audit_arch, numbers


# Denied in every sandbox, by class. Names missing on an architecture (fork on aarch64) are skipped.
DENIED_CLASSES = {
    "other processes": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "move_pages",
                        "migrate_pages", "process_madvise", "process_mrelease"),
    "kernel state": ("mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
                     "open_tree", "move_mount", "mount_setattr", "init_module", "finit_module", "delete_module",
                     "kexec_load", "kexec_file_load", "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
                     "acct", "swapon", "swapoff", "reboot", "syslog", "quotactl", "quotactl_fd", "fanotify_init",
                     "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "settimeofday", "clock_settime",
                     "adjtimex", "clock_adjtime", "sethostname", "setdomainname", "vhangup", "personality",
                     "iopl", "ioperm", "modify_ldt", "uselib"),
    "namespaces": ("unshare", "setns"),
    "asynchronous kernel work": ("io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd"),
    "network": ("socket", "socketpair"),  # a unix socket pair could also hide descriptors in flight
    # Disk blocks without writing them: gigabytes within one quota measurement (writes take time).
    "disk space ahead of writes": ("fallocate",),
    "System V IPC": ("shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget",
                     "semop", "semctl", "semtimedop"),
    # A queue is named system-wide (per IPC namespace): RLIMIT_MSGQUEUE = 0 stops creating one, not
    # opening one that another process made.
    "POSIX message queues": ("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"),
}
_PROCESS_CALLS = ("fork", "vfork", "memfd_create")  # with no_processes; clone is filtered on its flags
# With own_pid: changes of a file's mode, owner, times or extended attributes. Landlock does not cover
# them and seccomp cannot read a path, so they are refused whole, inside the run's directory too:
# the caller's uid owns its interpreter, its runs and its checkpoints.
_METADATA_CALLS = ("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "utime",
                   "utimes", "futimesat", "utimensat", "setxattr", "lsetxattr", "fsetxattr", "removexattr",
                   "lremovexattr", "fremovexattr", "setxattrat", "removexattrat")
# With own_pid: calls whose first argument is the process they act on (0: itself, or its group)...
_SELF_CALLS = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "prlimit64", "sched_setaffinity",
               "sched_setscheduler", "sched_setparam", "sched_setattr")
# ...and those whose first argument says what the second names (only "a process" is allowed).
_WHO_CALLS = (("setpriority", 0), ("ioprio_set", 1))  # PRIO_PROCESS, IOPRIO_WHO_PROCESS

_X86_64 = _Arch(0xC000003E, {
    "socket": 41, "socketpair": 53, "fallocate": 285, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_getfd": 438, "move_pages": 279, "migrate_pages": 256, "process_madvise": 440, "process_mrelease": 448,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "open_tree": 428, "move_mount": 429, "mount_setattr": 442, "init_module": 175,
    "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "bpf": 321,
    "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249, "acct": 163, "swapon": 167,
    "swapoff": 168, "reboot": 169, "syslog": 103, "quotactl": 179, "quotactl_fd": 443, "fanotify_init": 300,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "lookup_dcookie": 212, "settimeofday": 164,
    "clock_settime": 227, "adjtimex": 159, "clock_adjtime": 305, "sethostname": 170, "setdomainname": 171,
    "vhangup": 153, "personality": 135, "iopl": 172, "ioperm": 173, "modify_ldt": 154, "uselib": 134,
    "unshare": 272, "setns": 308, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "userfaultfd": 323, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "msgget": 68, "msgsnd": 69,
    "msgrcv": 70, "msgctl": 71, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220,
    "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
    "mq_getsetattr": 245, "fork": 57, "vfork": 58, "memfd_create": 319, "clone": 56, "clone3": 435, "fcntl": 72, "ioctl": 16,
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "pidfd_send_signal": 424, "prlimit64": 302, "setpriority": 141, "sched_setaffinity": 203,
    "sched_setscheduler": 144, "sched_setparam": 142, "sched_setattr": 314, "ioprio_set": 251,
    "chmod": 90, "fchmod": 91, "fchmodat": 268, "fchmodat2": 452, "chown": 92, "fchown": 93, "lchown": 94,
    "fchownat": 260, "utime": 132, "utimes": 235, "futimesat": 261, "utimensat": 280, "setxattr": 188,
    "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
    "setxattrat": 463, "removexattrat": 466,
})
_AARCH64 = _Arch(0xC00000B7, {  # the generic table (asm-generic/unistd.h)
    "socket": 198, "socketpair": 199, "fallocate": 47, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
    "pidfd_getfd": 438, "move_pages": 239, "migrate_pages": 238, "process_madvise": 440, "process_mrelease": 448,
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "open_tree": 428, "move_mount": 429, "mount_setattr": 442, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "bpf": 280,
    "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218, "acct": 89, "swapon": 224,
    "swapoff": 225, "reboot": 142, "syslog": 116, "quotactl": 60, "quotactl_fd": 443, "fanotify_init": 262,
    "open_by_handle_at": 265, "name_to_handle_at": 264, "lookup_dcookie": 18, "settimeofday": 170,
    "clock_settime": 112, "adjtimex": 171, "clock_adjtime": 266, "sethostname": 161, "setdomainname": 162,
    "vhangup": 58, "personality": 92, "unshare": 97, "setns": 268, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "userfaultfd": 282, "shmget": 194, "shmat": 196, "shmctl": 195, "shmdt": 197,
    "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "semget": 190, "semop": 193, "semctl": 191,
    "semtimedop": 192, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183,
    "mq_notify": 184, "mq_getsetattr": 185, "memfd_create": 279, "clone": 220, "clone3": 435, "fcntl": 25, "ioctl": 29,
    "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
    "pidfd_send_signal": 424, "prlimit64": 261, "setpriority": 140, "sched_setaffinity": 122,
    "sched_setscheduler": 119, "sched_setparam": 118, "sched_setattr": 274, "ioprio_set": 30,
    "fchmod": 52, "fchmodat": 53, "fchmodat2": 452, "fchown": 55, "fchownat": 54, "utimensat": 88, "setxattr": 5,
    "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15, "fremovexattr": 16, "setxattrat": 463,
    "removexattrat": 466,
})
_ARCHES = {"x86_64": _X86_64, "aarch64": _AARCH64}


def native_arch() -> _Arch | None:
    """The seccomp description of this machine, None where the filter is not written for it."""
    return _ARCHES.get(os.uname().machine)


# ---------------------------------------------------------------------------------------------
# seccomp

def seccomp_filter(arch: _Arch, *, no_processes: bool, own_pid: int | None) -> bytes:
    """The classic-BPF program (struct sock_filter[]) of the module docstring's policy."""
    numbers = arch.numbers
    deny = [numbers[name] for names in DENIED_CLASSES.values() for name in names if name in numbers]
    if no_processes:
        deny += [numbers[name] for name in _PROCESS_CALLS if name in numbers]
    if own_pid is not None:
        deny.append(numbers["pidfd_send_signal"])  # a descriptor names any process: nothing to check
        deny += [numbers[name] for name in _METADATA_CALLS if name in numbers]
    eperm = _RET_ERRNO | errno.EPERM
    program: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        (_JEQ, 1, 0, arch.audit_arch),
        (_RET, 0, 0, eperm),  # a foreign ABI: its numbers mean other calls
        (_LD_W_ABS, 0, 0, _OFFSET_NR),
    ]
    if arch is _X86_64:
        program += [(_JSET, 0, 1, _X32_SYSCALL_BIT), (_RET, 0, 0, eperm)]
    for number in sorted(set(deny)):
        program += [(_JEQ, 0, 1, number), (_RET, 0, 0, eperm)]
    program += _process_creation(numbers, no_processes) + _descriptor_owners(numbers)
    if own_pid is not None:
        # pids are 32-bit: the low word of the argument; -pid is the process's own group.
        own = (own_pid, -own_pid & 0xFFFFFFFF, 0)
        for name in _SELF_CALLS:
            program += [(_JEQ, 0, 6, numbers[name]),
                        (_LD_W_ABS, 0, 0, _OFFSET_ARG0),
                        (_JEQ, 3, 0, own[0]), (_JEQ, 2, 0, own[1]), (_JEQ, 1, 0, own[2]),
                        (_RET, 0, 0, eperm),
                        (_RET, 0, 0, _RET_ALLOW)]
        for name, which_process in _WHO_CALLS:
            program += [(_JEQ, 0, 7, numbers[name]),
                        (_LD_W_ABS, 0, 0, _OFFSET_ARG0),
                        (_JEQ, 0, 3, which_process),
                        (_LD_W_ABS, 0, 0, _OFFSET_ARG0 + 8),
                        (_JEQ, 2, 0, own_pid), (_JEQ, 1, 0, 0),
                        (_RET, 0, 0, eperm),
                        (_RET, 0, 0, _RET_ALLOW)]
    program.append((_RET, 0, 0, _RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


def _process_creation(numbers: dict[str, int], no_processes: bool) -> list[tuple[int, int, int, int]]:
    """clone: never into new namespaces; with `no_processes`, threads only. Every path returns."""
    # clone3 hides its flags in memory a filter cannot read: ENOSYS makes libc fall back to clone.
    return [(_JEQ, 0, 1, numbers["clone3"]), (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),
            (_JEQ, 0, 6, numbers["clone"]),
            (_LD_W_ABS, 0, 0, _OFFSET_ARG0),
            (_JSET, 2, 0, _CLONE_NEW_ANY),
            # a thread shares the address space: allowed; a process only without no_processes
            (_JSET, 2, 0, _CLONE_THREAD) if no_processes else (_JA, 0, 0, 2),
            (_RET, 0, 0, _RET_ERRNO | errno.EAGAIN),
            (_RET, 0, 0, _RET_ERRNO | errno.EPERM),
            (_RET, 0, 0, _RET_ALLOW)]


def _descriptor_owners(numbers: dict[str, int]) -> list[tuple[int, int, int, int]]:
    """fcntl and ioctl: never name a process to be signalled on a descriptor's I/O. Every path returns
    once the call matched (the accumulator then holds an argument, not the call's number)."""
    program = []
    for name, commands in (("fcntl", _FCNTL_OWNER_COMMANDS), ("ioctl", _IOCTL_OWNER_COMMANDS)):
        checks = [(_JEQ, len(commands) - i, 0, command) for i, command in enumerate(commands)]
        program += [(_JEQ, 0, len(checks) + 3, numbers[name]),
                    (_LD_W_ABS, 0, 0, _OFFSET_ARG1), *checks,
                    (_RET, 0, 0, _RET_ALLOW),
                    (_RET, 0, 0, _RET_ERRNO | errno.EPERM)]
    return program


def install_seccomp(libc: ctypes.CDLL, program: bytes) -> None:
    """Load `program` for this process and all it starts (needs no_new_privs)."""
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(buffer))
    call(libc.prctl, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0)


# ---------------------------------------------------------------------------------------------
# Landlock

def landlock_abi(libc: ctypes.CDLL) -> int:
    """The Landlock ABI version of the running kernel, 0 when Landlock is missing or disabled."""
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_CREATE_RULESET_VERSION)
    return max(0, int(version))


def landlock_ruleset(libc: ctypes.CDLL, abi: int, rules: list[tuple[str, int]]) -> int:
    """A Landlock ruleset (a descriptor) denying every file access but `rules` (path, rights), and TCP
    (ABI >= 4), and signals and abstract sockets leaving the domain (ABI >= 6). Made while the paths
    are visible (before a uid change); `landlock_restrict` enforces it."""
    handled_fs = _FS_BY_ABI[min(abi, 5)]
    handled_net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled_fs, handled_net, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    libc.syscall.restype = ctypes.c_long
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), 0)
    if ruleset < 0:
        raise _errno_error("landlock_create_ruleset")
    try:
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                allowed = rights if stat.S_ISDIR(os.fstat(fd).st_mode) else rights & _FILE_RIGHTS
                rule = struct.pack("=Qi", allowed & handled_fs, fd)
                if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, rule, 0) != 0:
                    raise _errno_error(f"landlock_add_rule({path!r})")
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return int(ruleset)


def landlock_restrict(libc: ctypes.CDLL, ruleset: int) -> None:
    """Enforce `ruleset` on this process and all it starts (needs no_new_privs)."""
    try:
        if libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise _errno_error("landlock_restrict_self")
    finally:
        os.close(ruleset)


# ---------------------------------------------------------------------------------------------
# Capabilities and limits

def drop_capabilities(libc: ctypes.CDLL) -> None:
    """Empty the bounding, effective, permitted and inheritable sets (uid 0 of a user namespace keeps none)."""
    cap = 0
    while libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if libc.prctl(_PR_CAPBSET_READ, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "could not empty the capability bounding set")
    header = (ctypes.c_uint32 * 2)(_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all empty
    call(libc.capset, header, data)


def set_limits(*, memory_bytes: int, cpu_s: int, file_bytes: int, open_files: int, tasks: int) -> None:
    limits = {
        resource.RLIMIT_AS: (memory_bytes, memory_bytes),
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),  # SIGXCPU first, SIGKILL a second later
        resource.RLIMIT_FSIZE: (file_bytes, file_bytes),
        resource.RLIMIT_NOFILE: (open_files, open_files),
        resource.RLIMIT_NPROC: (tasks, tasks),
        # 1, not 0: the kernel skips a core dump piped to a handler (core_pattern "|...") only at 1, and
        # one byte is below any file dump's minimum. The program's exec made it dumpable again.
        resource.RLIMIT_CORE: (1, 1),
        resource.RLIMIT_MEMLOCK: (0, 0),
        resource.RLIMIT_MSGQUEUE: (0, 0),
    }
    for which, pair in limits.items():
        resource.setrlimit(which, pair)


def tasks_of(uid: int) -> int:
    """Processes and threads of `uid` now (what RLIMIT_NPROC counts outside a user namespace)."""
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


def call(function, *args) -> int:
    result = function(*args)
    if result != 0:
        raise _errno_error(f"{function.__name__}{args}")
    return result


def _errno_error(what: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{what}: {os.strerror(code)}")
