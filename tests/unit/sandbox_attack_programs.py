"""The attack programs of test_sandbox_attacks.py, shared with sandbox_unprivileged.py (which runs
as another uid without pytest or torch): plain strings, no imports."""

MARKER = "47.1108"  # an argument of the processes the attacks leave behind, to find them in /proc

# A shell started without the subprocess module: the low-level call subprocess itself makes (3.11).
FORK_EXEC = ("import _posixsubprocess, os\n"
             "def spawn(argv):\n"
             "    read, write = os.pipe()\n"
             "    pid = _posixsubprocess.fork_exec([a.encode() for a in argv], [argv[0].encode()], True, (), None, "
             "None, -1, -1, -1, -1, -1, -1, read, write, False, False, -1, None, None, None, -1, None, False)\n"
             "    os.waitpid(pid, 0)\n")

# The process-starting extension copied into the working directory under an allowed name, and loaded
# by path: its init function is named after the module name's last part, not after its file.
RENAMED_EXTENSION = (
    "import glob, importlib.machinery, importlib.util, os, shutil\n"
    "source = glob.glob(os.path.join(os.path.dirname(os.__file__), 'lib-dynload', '_posixsubprocess*.so'))[0]\n"
    "shutil.copyfile(source, 'json.so')\n"
    "loader = importlib.machinery.ExtensionFileLoader('json._posixsubprocess', os.path.abspath('json.so'))\n"
    "spawner = importlib.util.module_from_spec(importlib.util.spec_from_loader('json._posixsubprocess', loader))\n"
    "read, write = os.pipe()\n"
    "spawner.fork_exec([b'/bin/echo', b'ESCAPED-' + {marker!r}.encode()], [b'/bin/echo'], True, (), None, None, -1, "
    "-1, -1, -1, -1, -1, read, write, False, False, -1, None, None, None, -1, None, False)\n"
    "os.wait()\n")

SIGNAL_ATTACKS = {
    "everyone": "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('sent')",
    "parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('sent')",
    "own group": "import os, signal\nos.killpg(0, signal.SIGKILL)",
    "init": ("import os, signal\nfor s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):\n"
             "    os.kill(1, s)"),
    "pidfd": ("import os, signal\nfor pid in (os.getppid(), 1):\n"
              "    signal.pidfd_send_signal(os.pidfd_open(pid), signal.SIGINT)\n"
              "signal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)"),
    "shell": "import os\nos.execv('/bin/sh', ['sh', '-c', 'kill -INT 1; kill -9 $PPID; kill -9 0; kill -9 -1'])",
    # The kernel signals a descriptor's owner on I/O, with the rights of whoever set the owner.
    "descriptor owner": ("import fcntl, os, signal\n"
                         "for target in (os.getppid(), 1, -os.getpgid(os.getppid())):\n"
                         "    read, write = os.pipe()\n"
                         "    fcntl.fcntl(read, fcntl.F_SETOWN, target)\n"
                         "    fcntl.fcntl(read, fcntl.F_SETSIG, signal.SIGKILL)\n"
                         "    fcntl.fcntl(read, fcntl.F_SETFL, fcntl.fcntl(read, fcntl.F_GETFL) | os.O_ASYNC)\n"
                         "    os.write(write, b'x')\n"
                         "print('sent')"),
    "shell via fork_exec": FORK_EXEC + "spawn(['/bin/sh', '-c', 'kill -INT 1; kill -9 $PPID; kill -9 0; kill -9 -1'])",
}

# Six children of 100 MB each, held for a while: prints how many allocated and how many are alive
# together 1.5 s later.
MANY_CHILDREN = """\
import os, time
children, wrote = [], os.pipe()
for _ in range(6):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        block = b'x' * (100 << 20)  # resident: every page written
        os.write(wrote[1], b'1')
        time.sleep(3)
        os._exit(0)
    children.append(pid)
time.sleep(1.5)
alive = [pid for pid in children if os.waitpid(pid, os.WNOHANG) == (0, 0)]
os.set_blocking(wrote[0], False)
try:
    allocated = len(os.read(wrote[0], 100))
except BlockingIOError:
    allocated = 0
print(allocated, len(alive))
"""

# Four children, each busy for 1.5 s of wall time: prints how many were made and the CPU seconds they
# took together (what each one's RLIMIT_CPU cannot bound, as it counts only its own process).
BUSY_CHILDREN = """\
import os, time
children = []
for _ in range(4):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
times = os.times()
print(len(children), round(times.children_user + times.children_system, 2))
"""

# Each way of naming a process for the kernel to signal later: prints what each call did.
DESCRIPTOR_OWNERS = """\
import fcntl, os, struct
read, write = os.pipe()
for name, call in (("F_SETOWN", lambda: fcntl.fcntl(read, fcntl.F_SETOWN, os.getppid())),
                   ("F_SETSIG", lambda: fcntl.fcntl(read, fcntl.F_SETSIG, 9)),
                   ("F_SETOWN_EX", lambda: fcntl.fcntl(read, 15, struct.pack('ii', 1, os.getppid()))),
                   ("FIOSETOWN", lambda: fcntl.ioctl(read, 0x8901, struct.pack('i', os.getppid()))),
                   ("SIOCSPGRP", lambda: fcntl.ioctl(read, 0x8902, struct.pack('i', os.getppid())))):
    try:
        call()
        print(name, 'allowed')
    except OSError as exc:
        print(name, exc.errno)
"""

# clone into new namespaces, straight and through clone3: prints what each returned.
NEW_NAMESPACES = """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
clone, clone3 = (56, 435) if os.uname().machine == 'x86_64' else (220, 435)
for flags in (0x10000000, 0x20000, 0x40000000, 0x20000000):
    pid = libc.syscall(clone, flags | 17, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid > 0:
        os.waitpid(pid, 0)
    print(hex(flags), 'created' if pid > 0 else ctypes.get_errno())
args = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, 17)
pid = libc.syscall(clone3, ctypes.byref(args), ctypes.c_size_t(88))
if pid == 0:
    os._exit(0)
print('clone3', 'created' if pid > 0 else ctypes.get_errno())
"""

# Past disk_mb=16 where the trainer's measurement used not to look: files under a directory the
# program made unreadable, and files held open after unlinking them (held long enough to be seen).
DISK_QUOTA = {
    "unreadable directory": ("import os, time\nos.mkdir('d', 0o300)\nfor i in range(4):\n"
                             "    open(f'd/f{i}', 'wb').write(b'x' * (15 << 20))\ntime.sleep(1)\nprint('wrote 60 MB')"),
    "unlinked files": ("import os, time\nheld = []\nfor i in range(4):\n    f = open(f'f{i}', 'wb')\n"
                       "    os.unlink(f'f{i}')\n    f.write(b'x' * (15 << 20))\n    f.flush()\n    held.append(f)\n"
                       "time.sleep(1)\nprint('wrote 60 MB')"),
    # Mapped through libc (Python's mmap keeps a descriptor of its own), 4 MB at a time: never more than
    # that in sight of the directory walk or of the descriptor tables.
    "mapped unlinked files": ("import ctypes, os, time\nlibc = ctypes.CDLL(None)\nlibc.mmap.restype = ctypes.c_void_p\n"
                              "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, "
                              "ctypes.c_int, ctypes.c_long]\nfor i in range(15):\n"
                              "    fd = os.open(f'f{i}', os.O_RDWR | os.O_CREAT)\n    os.write(fd, b'x' * (4 << 20))\n"
                              "    libc.mmap(None, 4 << 20, 1, 1, fd, 0)\n    os.close(fd)\n    os.unlink(f'f{i}')\n"
                              "time.sleep(1)\nprint('wrote 60 MB')"),
}

# Disk space in no time (a gigabyte between two measurements of the quota), and a pair of unix sockets
# to park descriptors of unlinked files in flight, where no process's descriptor table shows them.
PREALLOCATE_AND_PARK = (
    "import os\nfd = os.open('big', os.O_WRONLY | os.O_CREAT)\n"
    "try:\n    os.posix_fallocate(fd, 0, 1 << 30)\n    print('allocated', os.fstat(fd).st_blocks * 512)\n"
    "except (OSError, AttributeError) as exc:\n    print('fallocate', type(exc).__name__, getattr(exc, 'errno', None))\n"
    "try:\n    import socket\n    socket.socketpair()\n    print('pair made')\n"
    "except (OSError, ImportError) as exc:\n    print('socketpair', type(exc).__name__)\n")

DAEMON = (f"import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
          f"        os.execv('/bin/sleep', ['sleep', '{MARKER}'])\n    os._exit(0)\nprint('daemonized')")

# Catch a refusal, walk its traceback to the audit hook's frame and neuter whatever is there: the
# hook's helper functions (their code replaced by a no-op), its lists and dicts (emptied). Then try
# again: prints what the second attempt raised, if anything.
TAMPER_WITH_THE_HOOK = """\
def attempt():
    open('/etc/passwd').read()
try:
    attempt()
except PermissionError as refusal:
    tb = refusal.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        for value in list(frame.f_locals.values()) if frame.f_code.co_filename != '<program>' else []:
            if hasattr(value, '__code__') and not (value.__closure__ or ()):
                value.__code__ = (lambda *args, **kwargs: None).__code__
            elif isinstance(value, (list, dict, set)):
                value.clear()
        tb = tb.tb_next
try:
    attempt()
    print('second attempt: read')
except Exception as exc:
    print('second attempt:', type(exc).__name__, exc)
"""

# Changes to a file outside the run that the program may be able to reach (TARGET: a file of the
# interpreter's standard library, which a caller with pyenv, conda or uv owns, or a directory of the
# caller's): its mode, times, group and extended attributes, by path and through a descriptor opened
# for reading; and writes to the program's own stdin, which used to be the trainer's file, opened for
# writing, outside the disk quota. Prints each attempt and "changed" or the errno (None: refused by
# the audit hook); "open ERRNO" when the target cannot be opened for the attempts through a descriptor.
METADATA = """\
import os
target = TARGET
def attempt(name, change):
    try:
        change()
        print(name, 'changed')
    except OSError as exc:
        print(name, exc.errno)
attempt('chmod', lambda: os.chmod(target, 0o777))
attempt('utime', lambda: os.utime(target, (0, 0)))
attempt('stdin', lambda: os.write(0, b'x' * 4096))
try:
    fd = os.open(target, os.O_RDONLY)
except OSError as exc:
    print('open', exc.errno)
else:
    attempt('fchmod', lambda: os.chmod(fd, 0o777))
    attempt('fchown', lambda: os.chown(fd, -1, os.getgid()))
    attempt('futimens', lambda: os.utime(fd, (0, 0)))
    attempt('fsetxattr', lambda: os.setxattr(fd, 'user.reasonrl', b'x'))
"""
METADATA_BY_PATH = ("chmod", "utime", "stdin")
METADATA_BY_DESCRIPTOR = ("fchmod", "fchown", "futimens", "fsetxattr")


def metadata_attack(target: str) -> str:
    return METADATA.replace("TARGET", repr(target))


# A directory tree deeper than any recursion limit (the trainer used to walk it recursively to
# measure and remove it), built at the top so that no path grows long: mkdir, then rename.
DEEP_TREE = """\
import os
os.mkdir('d')
for _ in range(3000):
    os.mkdir('up')
    os.rename('d', 'up/d')
    os.rename('up', 'd')
print('built')
"""


# Each place bound from the machine into a "namespaces" root, and whether its mount takes writes.
MOUNT_FLAGS = """\
import os, sys
for path in ('/etc/ld.so.cache', '/etc/localtime', '/usr', '/lib', sys.prefix, '/dev/null'):
    if os.path.exists(path):
        print(path, 'read-only' if os.statvfs(path).f_flag & os.ST_RDONLY else 'writable')
"""


def mounts_as_bound(stdout: str) -> bool:
    """MOUNT_FLAGS saw every bind read-only but the devices (the system files where the machine has them)."""
    seen = dict(line.rsplit(" ", 1) for line in stdout.splitlines())
    return ({"/usr", "/dev/null"} <= set(seen) and seen.pop("/dev/null") == "writable"
            and set(seen.values()) == {"read-only"})
