"""Reading a supervised process's stdout and stderr under caps, a deadline and a quota (runner.py's
I/O loop): the process is asked to stop (SIGTERM) when the wall clock ends, when it writes far past
the output cap, or when a quota check fails; it is killed if it has not exited a grace period
later."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable

KILL_OUTPUT_FACTOR = 16  # a program writing this many times the cap is stopped rather than read to the end
GRACE_S = 2.0  # after asking the supervisor to stop the program, before killing the supervisor
QUOTA_POLL_S = 0.05


def collect(process: subprocess.Popen, deadline: float, cap: int,
            over_quota: Callable[[], str | None] | None) -> tuple[str | None, bytes, bytes, bool]:
    """Read stdout and stderr until the supervisor has exited and the pipes are closed.

    The verdict is "timeout", or a sentence (output cap, disk quota), when the program had to be
    stopped for it; else None. Stopping asks the supervisor (SIGTERM), which kills the program and
    reports; the supervisor is killed too if it has not exited `GRACE_S` later.
    """
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    written, verdict, exited, flooded = 0, None, False, False
    stop_by = None  # set once the supervisor was asked to stop, or has exited
    next_quota_check = time.monotonic() + QUOTA_POLL_S
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        pidfd = _pidfd(process.pid)
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ)
        try:
            while not exited or any(fd in selector.get_map() for fd in buffers):
                now = time.monotonic()
                if stop_by is None and (now >= deadline or (over_quota and now >= next_quota_check)):
                    reason = "timeout" if now >= deadline else over_quota()
                    next_quota_check = now + QUOTA_POLL_S
                    if reason is not None:
                        verdict, stop_by = reason, now + GRACE_S
                        _ask_to_stop(process)
                if stop_by is not None and now >= stop_by:
                    break
                wait = min(stop_by or deadline, next_quota_check if over_quota else deadline) - now
                if pidfd is None:
                    wait = min(wait, 0.05)
                for key, _ in selector.select(max(0.0, wait)):
                    if key.fd == pidfd:
                        selector.unregister(pidfd)
                        exited = True
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    buffers[key.fd] += chunk[: max(0, cap + 1 - len(buffers[key.fd]))]
                    written += len(chunk)
                if written > KILL_OUTPUT_FACTOR * cap and verdict is None:
                    verdict, flooded = f"wrote more than {KILL_OUTPUT_FACTOR * cap} bytes", True
                    stop_by = time.monotonic() + GRACE_S
                    _ask_to_stop(process)
                if pidfd is None and not exited:
                    exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
                if exited and stop_by is None:
                    # The supervisor exits once the program's processes are gone; what still holds
                    # the pipes is a leftover: kill the group, keep what is buffered.
                    kill_group(process)
                    stop_by = time.monotonic() + 0.5
        finally:
            if pidfd is not None:
                os.close(pidfd)
    truncated = flooded or any(len(buffer) > cap for buffer in buffers.values())
    return verdict, bytes(buffers[out_fd][:cap]), bytes(buffers[err_fd][:cap]), truncated


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:  # kernels before 5.3: the supervisor is polled instead
        return None


def _ask_to_stop(process: subprocess.Popen) -> None:
    try:
        process.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass


def kill_group(process: subprocess.Popen) -> None:
    # Before the supervisor is reaped its pid (the group id) cannot be reused, so this never hits a stranger.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:  # a writer that has not closed: the supervisor was killed mid-way
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)
