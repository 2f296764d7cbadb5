"""The program's private directory, on the trainer's side: made for one run, measured while it
runs, removed after it.

A fresh parent directory of the trainer's (mode 0711: others may pass through, not list or
write) holds the program's directory `work` (0700, owned by the sandbox uid). The program can
therefore neither rename its directory nor plant anything beside it, and no other run can list
or open it. With namespaces the program never sees this directory (a tmpfs is mounted over it in
its own mount namespace), and one directory serves as both (each removal costs ~4 ms on a disk).
Removal works on descriptors, never follows a symbolic link the program planted, and changes the
mode of nothing but directories inside the tree (the program may have taken its own permissions
away).
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass

_OPEN_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class RunDirectory:
    parent: str  # the trainer's, removed last
    work: str  # the program's working directory


def create(owner: tuple[int, int] | None = None, nested: bool = True) -> RunDirectory:
    """A new private directory pair (see the module docstring), or one directory if not `nested`;
    `work` is chowned to `owner` (uid, gid)."""
    parent = tempfile.mkdtemp(prefix="reasonrl-sandbox-")
    if not nested:
        return RunDirectory(parent=os.path.realpath(parent), work=os.path.realpath(parent))
    try:
        os.chmod(parent, 0o711)
        work = os.path.join(parent, "work")
        os.mkdir(work, 0o700)
        if owner is not None:
            os.chown(work, *owner)
    except BaseException:
        remove(parent)
        raise
    return RunDirectory(parent=os.path.realpath(parent), work=os.path.realpath(work))


def remove(parent: str) -> None:
    """Delete `parent` and everything below it (see the module docstring); OSError if something stays."""
    fd = os.open(parent, _OPEN_DIRECTORY)
    try:
        _empty(fd)
    finally:
        os.close(fd)
    os.rmdir(parent)


def usage(work: str) -> tuple[int, int]:
    """Bytes allocated on disk and entries below `work`, without following links."""
    try:
        fd = os.open(work, _OPEN_DIRECTORY)
    except OSError:  # taken away by the program (non-root caller): counted as nothing, removal copes
        return 0, 0
    try:
        return _usage(fd)
    finally:
        os.close(fd)


def _usage(dir_fd: int) -> tuple[int, int]:
    allocated = entries = 0
    with os.scandir(dir_fd) as listing:
        for entry in listing:
            info = entry.stat(follow_symlinks=False)
            allocated += info.st_blocks * 512
            entries += 1
            if stat.S_ISDIR(info.st_mode):
                try:
                    child = os.open(entry.name, _OPEN_DIRECTORY, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    more_bytes, more_entries = _usage(child)
                finally:
                    os.close(child)
                allocated, entries = allocated + more_bytes, entries + more_entries
    return allocated, entries


def _empty(dir_fd: int) -> None:
    with os.scandir(dir_fd) as listing:
        names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
    for name, is_dir in names:
        if not is_dir:  # files, and symbolic links themselves (never what they point to)
            os.unlink(name, dir_fd=dir_fd)
            continue
        child = _open_taking_back(name, dir_fd)
        try:
            _empty(child)
        finally:
            os.close(child)
        os.rmdir(name, dir_fd=dir_fd)


def _open_taking_back(name: str, dir_fd: int) -> int:
    """Open the directory `name`, first restoring its owner's permissions if the program removed them."""
    try:
        fd = os.open(name, _OPEN_DIRECTORY, dir_fd=dir_fd)
    except PermissionError:
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            # Through the descriptor: the very directory just opened, whatever its name points to now.
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
            return os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        finally:
            os.close(handle)
    os.fchmod(fd, 0o700)  # so that its entries can be removed
    return fd
