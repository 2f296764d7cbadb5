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
