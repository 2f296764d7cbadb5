"""The run directory's measurement and removal on trees a program makes: deeper than any recursion
limit and than the open-files limit, without permissions, moved while they are walked."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest
from sandbox_support import chain

from reasonrl.sandbox import workdir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")


def test_a_tree_deeper_than_recursion_and_open_files_is_measured_and_removed(tmp_path):
    """3000 levels, with 300 open files allowed, a file at the bottom and a directory without any
    permission on the way: measured exactly, then removed whole (both used to be recursive)."""
    script = textwrap.dedent(f"""
        import os, resource, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from sandbox_support import chain
        from reasonrl.sandbox import workdir
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        run = workdir.create()
        chain(run.work, 3000)
        os.chmod(os.path.join(run.work, 'd', 'd'), 0)
        print(workdir.usage(run.work)[1], workdir.usage(run.work, max_entries=100)[1])
        workdir.remove(run.parent)
        print(os.path.exists(run.parent))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3000", "101", "False"]  # the second walk stopped past its limit


def test_a_directory_moved_during_a_deep_walk_is_an_error_not_a_wrong_measure(tmp_path):
    """Below the directories a walk holds open it climbs back through "..": when the program moved a
    directory there meanwhile, ".." is another directory, and the walk says so."""
    chain(str(tmp_path), 100, name="a")
    depth_80 = os.path.join(str(tmp_path), *["a"] * 80)
    visited = 0

    def visit(fd: int) -> list[str]:
        nonlocal visited
        visited += 1
        if visited == 101:  # at the bottom (the top is the first): move the directory 80 levels down to the top
            os.rename(depth_80, os.path.join(str(tmp_path), "moved"))
        return [entry.name for entry in os.scandir(fd) if entry.is_dir(follow_symlinks=False)]

    top = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as raised:
            workdir._walk(top, enter=lambda name, parent: os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent),
                          visit=visit)
    finally:
        os.close(top)
    assert raised.value.errno == errno.ESTALE
    assert visited == 101


def test_a_directory_moved_while_measured_is_counted_once(tmp_path):
    """A directory measured under its first name, then moved under one listed but not yet entered,
    is reached twice: its tree counts once."""
    run = workdir.create()
    try:
        chain(run.work, 10, name="a")
        chain(run.work, 10, name="b")
        unmoved = workdir.usage(run.work)
        tops = {os.stat(os.path.join(run.work, name)).st_ino: name for name in ("a", "b")}
        real_scandir, entered = os.scandir, []

        def scandir_seeing_a_move(fd):
            """On entering the second of a and b, move the first (measured already) into it."""
            entered.append(os.fstat(fd).st_ino)
            name = tops.get(entered[-1])
            if name is not None and sum(ino in tops for ino in entered) == 2:
                other = "b" if name == "a" else "a"
                os.rename(os.path.join(run.work, other), os.path.join(run.work, name, other))
            return real_scandir(fd)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(workdir.os, "scandir", scandir_seeing_a_move)
            moved = workdir.usage(run.work)
    finally:
        workdir.remove(run.parent)
    assert unmoved[1] == 20
    assert len(entered) == 21  # the top and every directory once: the moved one is not listed again
    assert moved[1] == 21  # its own entry seen twice (in its old and new place), its tree once
