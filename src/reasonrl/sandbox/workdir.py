"""The program's private directory, on the trainer's side: made for one run, measured while it
runs, removed after it.

A fresh parent directory of the trainer's (mode 0711: others may pass through, not list or
write) holds the program's directory `work` (0700, owned by the sandbox uid). The program can
therefore neither rename its directory nor plant anything beside it, and no other run can list
or open it. With namespaces the program never sees this directory (a tmpfs is mounted over it in
its own mount namespace), and one directory serves as both (each removal costs ~4 ms on a disk).
Removal works on descriptors, never follows a symbolic link the program planted, and changes the
mode of nothing but directories inside the tree (the program may have taken its own permissions
away). Measuring and removing walk the tree in a loop, never by recursion, holding a bounded number
of descriptors: the program decides how deep the tree is.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

_UNMEASURED_LIMIT = 4  # measurements in a row that may fail before a run is over its quota
_HELD_DEPTH = 64  # directories a walk keeps open above the one it is in
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


def usage(work: str, max_entries: int | None = None) -> tuple[int, int]:
    """Bytes allocated on disk and entries below `work`, without following links; the walk stops once
    it has counted more than `max_entries`. A directory the program made unreadable is opened after
    taking its owner's permissions back; OSError if it still cannot be measured (the caller counts
    that as over the quota, never as empty)."""
    fd = _open_measuring(os.path.basename(work), os.path.dirname(work))
    try:
        return _usage(fd, max_entries)
    finally:
        os.close(fd)


class _Enough(Exception):
    """Raised inside a measuring walk that has counted past its limit."""


def _usage(top_fd: int, max_entries: int | None) -> tuple[int, int]:
    allocated = entries = 0
    measured: set[tuple[int, int]] = set()

    def measure(dir_fd: int) -> list[str]:
        nonlocal allocated, entries
        identity = _identity(dir_fd)
        if identity in measured:  # reached twice: the program moved it while it was measured
            return []
        measured.add(identity)
        subdirectories = []
        with os.scandir(dir_fd) as listing:
            for entry in listing:
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # removed by the program since the listing
                    continue
                allocated += info.st_blocks * 512
                entries += 1
                if max_entries is not None and entries > max_entries:
                    raise _Enough
                if stat.S_ISDIR(info.st_mode):
                    subdirectories.append(entry.name)
        return subdirectories

    try:
        _walk(top_fd, enter=_open_measuring, visit=measure)
    except _Enough:
        pass
    return allocated, entries


def _open_measuring(name: str, parent: int | str) -> int:
    if isinstance(parent, str):
        parent_fd = os.open(parent, _OPEN_DIRECTORY)
        try:
            return _open_measuring(name, parent_fd)
        finally:
            os.close(parent_fd)
    try:
        return os.open(name, _OPEN_DIRECTORY, dir_fd=parent)
    except PermissionError:
        return _open_taking_back(name, parent)


def quota_watch(work: str, disk_mb: int, max_entries: int) -> Callable[[int, set], str | None]:
    """A check of the directory against its quota, for "process" isolation (without namespaces nothing
    caps its size), called every QUOTA_POLL_S while the program runs and once when it has ended (a run
    over the quota is "killed", as if stopped). Files the program's processes (below the supervisor)
    hold open after unlinking them count too; what cannot be measured counts as over the quota."""
    unmeasured = 0
    device = os.stat(work).st_dev

    def over(supervisor: int, ignore: set[tuple[int, int]]) -> str | None:
        nonlocal unmeasured
        try:
            allocated, entries = usage(work, max_entries)
            allocated += unlinked_open_bytes(supervisor, ignore, device)
            unmeasured = 0
        except OSError as exc:
            # The program's process is not dumpable (its descriptors hidden) for a moment before it
            # starts; a program that stays so is hiding them.
            unmeasured += 1
            if unmeasured < _UNMEASURED_LIMIT:
                return None
            return f"made its files impossible to measure against disk_mb ({exc.strerror}: {exc.filename})"
        if allocated > disk_mb << 20:
            return f"wrote more than disk_mb={disk_mb} MB to its directory or to files it unlinked"
        if entries > max_entries:
            return f"created more than {max_entries} files and directories"
        return None

    return over


def unlinked_open_bytes(root_pid: int, ignore: set[tuple[int, int]], device: int | None = None) -> int:
    """Bytes allocated to regular files that the processes below `root_pid` hold open, or mapped, but
    that have no name left (opened, then unlinked: no directory walk sees them), except the files
    `ignore` names (st_dev, st_ino). A mapping holds no descriptor to stat: a deleted file mapped from
    `device` (the run directory's file system) counts at its mapped size, an upper bound. OSError if
    a process's descriptors or mappings cannot be read (counted as over)."""
    seen, allocated = set(ignore), 0
    for pid in descendants(root_pid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, ProcessLookupError):  # exited since
            continue
        for fd in fds:
            try:
                info = os.stat(f"/proc/{pid}/fd/{fd}")
            except (FileNotFoundError, ProcessLookupError):
                continue
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                allocated += info.st_blocks * 512
        if device is not None:
            allocated += _mapped_deleted_bytes(pid, device, seen)
    return allocated


def _mapped_deleted_bytes(pid: int, device: int, seen: set[tuple[int, int]]) -> int:
    """The mapped size of the deleted files of `device` that process `pid` maps and `seen` does not
    hold yet (each file once, at its largest mapping's end; added to `seen`)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            lines = maps.read().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    extent: dict[tuple[int, int], int] = {}
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].endswith(" (deleted)") or fields[4] == "0":
            continue
        major, _, minor = fields[3].partition(":")
        if os.makedev(int(major, 16), int(minor, 16)) != device:
            continue
        start, _, end = fields[0].partition("-")
        key = (device, int(fields[4]))
        extent[key] = max(extent.get(key, 0), int(fields[2], 16) + int(end, 16) - int(start, 16))
    fresh = {key: size for key, size in extent.items() if key not in seen}
    seen.update(fresh)
    return sum(fresh.values())


def descendants(root_pid: int) -> list[int]:
    """Every process below `root_pid` (a child subreaper: orphans stay below it)."""
    found, queue = [], [root_pid]
    while queue:
        pid = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    children = [int(child) for child in f.read().split()]
            except FileNotFoundError:
                continue
            found += children
            queue += children
    return found


def _empty(top_fd: int) -> None:
    def unlink_files(dir_fd: int) -> list[str]:
        with os.scandir(dir_fd) as listing:
            names = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
        for name, is_dir in names:
            if not is_dir:  # files, and symbolic links themselves (never what they point to)
                os.unlink(name, dir_fd=dir_fd)
        return [name for name, is_dir in names if is_dir]

    _walk(top_fd, enter=_open_taking_back, visit=unlink_files,
          leave=lambda parent_fd, name: os.rmdir(name, dir_fd=parent_fd))


def _walk(top_fd: int, *, enter: Callable[[str, int], int], visit: Callable[[int], list[str]],
          leave: Callable[[int, str], None] | None = None) -> None:
    """Depth first below the directory `top_fd`, in a loop: a program can nest directories deeper than
    any recursion limit, and than the open-files limit. `visit(fd)` handles a directory's entries and
    returns the subdirectories to enter, `enter(name, parent_fd)` opens one, `leave(parent_fd, name)`
    runs when one is done. The `_HELD_DEPTH` nearest the top stay open; deeper, a directory is left
    through "..", which must be the very directory it was entered from (st_dev, st_ino): OSError if
    the program moved it meanwhile."""
    fd = os.dup(top_fd)
    # For each directory above `fd`: its descriptor (None: closed, deeper than _HELD_DEPTH), its
    # identity, the subdirectories left to enter, and the name of the one being walked.
    ancestors: list[tuple[int | None, tuple[int, int], list[str], str]] = []
    try:
        pending = visit(fd)
        while True:
            if pending:
                name = pending.pop()
                try:
                    child = enter(name, fd)
                except FileNotFoundError:  # removed by the program since the listing
                    continue
                held = fd if len(ancestors) < _HELD_DEPTH else None
                ancestors.append((held, _identity(fd), pending, name))
                if held is None:
                    os.close(fd)
                fd = child
                pending = visit(fd)
                continue
            if not ancestors:
                return
            held, identity, pending, name = ancestors.pop()
            parent = held if held is not None else os.open("..", _OPEN_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            if held is None and _identity(fd) != identity:
                raise OSError(errno.ESTALE, "a directory moved while the run's directory was walked", name)
            if leave is not None:
                leave(fd, name)
    finally:
        os.close(fd)
        for held, *_ in ancestors:
            if held is not None:
                os.close(held)


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


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
