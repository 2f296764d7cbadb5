"""Run directories and checkpoints under concurrency and crashes: one run per directory (a second
fails naming the holder, from this process or another), a new directory per run for time-named
run.dirs, and checkpoints that stay complete when the process is killed while pruning."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from reasonrl.config import load_config
from reasonrl.training.checkpoint import checkpoints, latest_checkpoint
from reasonrl.training.runs import RunDirInUseError, restore_state, start_run

SRC = str(Path(__file__).resolve().parents[2] / "src")


def config(run_dir: str, *overrides: str):
    return load_config(overrides=[f"run.dir={run_dir}", *overrides])


def test_a_second_run_on_the_same_directory_fails_naming_the_holder(tmp_path):
    first = start_run(config(str(tmp_path / "run")))
    with pytest.raises(RunDirInUseError, match=rf"in use by another run, pid {os.getpid()} .*this process"):
        start_run(config(str(tmp_path / "run")))
    first.lock.release()
    assert start_run(config(str(tmp_path / "run"))).run_dir == tmp_path / "run"  # free again


def test_a_run_in_another_process_holds_its_directory_until_it_ends(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""\
        import sys, time
        sys.path.insert(0, {SRC!r})
        from pathlib import Path
        from reasonrl.training.runs import lock_run_dir
        lock = lock_run_dir(Path({str(tmp_path / "run")!r}))
        print("locked", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunDirInUseError, match=rf"pid {holder.pid} on "):
            start_run(config(str(tmp_path / "run")))
    finally:
        holder.send_signal(signal.SIGKILL)  # killed, not closed cleanly: the kernel releases the lock
        holder.wait()
    assert start_run(config(str(tmp_path / "run"))).lock is not None


def test_runs_named_by_the_time_get_a_directory_each(tmp_path):
    template = str(tmp_path / "runs" / "%Y%m%d-%H%M%S")
    started = [start_run(config(template)) for _ in range(3)]  # within a second, or nearly
    names = [start.run_dir for start in started]
    assert len(set(names)) == 3 and all(path.is_dir() for path in names)
    assert all(start.cfg.run.dir == str(start.run_dir) for start in started)


def _fake_checkpoint(root: Path, step: int) -> None:
    directory = root / "checkpoints" / f"step_{step:06d}"
    (directory / "policy").mkdir(parents=True)
    (directory / "policy" / "model.safetensors").write_bytes(b"weights")
    torch.save({"step": step}, directory / "trainer_state.pt")


KILLED_WHILE_PRUNING = """\
import os, shutil, signal, sys
sys.path.insert(0, {src!r})
from pathlib import Path
from reasonrl.training.checkpoint import save_checkpoint

class Saves:
    def save_pretrained(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "model.safetensors").write_bytes(b"weights")

def rmtree_then_die(path, *args, **kwargs):
    os.remove(os.path.join(path, "trainer_state.pt"))  # part of the way through deleting it...
    os.kill(os.getpid(), signal.SIGKILL)  # ...and kill -9

shutil.rmtree = rmtree_then_die
save_checkpoint({run!r}, 3, model=Saves(), tokenizer=Saves(), state={{}}, keep=2)
"""


def test_a_kill_while_pruning_leaves_only_complete_checkpoints(tmp_path, capsys):
    for step in (1, 2):
        _fake_checkpoint(tmp_path, step)
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_PRUNING.format(src=SRC, run=str(tmp_path))],
                            check=False)
    assert killed.returncode == -signal.SIGKILL
    found = checkpoints(tmp_path)
    assert [p.name for p in found] == ["step_000002", "step_000003"]
    assert all((p / "trainer_state.pt").is_file() and (p / "policy").is_dir() for p in found)

    # Resuming says which checkpoint it continues from.
    assert restore_state(latest_checkpoint(tmp_path), {}) == 3
    assert f"resuming from checkpoint {tmp_path / 'checkpoints' / 'step_000003'} (step 3)" in capsys.readouterr().out


class _SavesWeights:
    def save_pretrained(self, directory):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "model.safetensors").write_bytes(b"weights")


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's file through /proc")
def test_a_checkpoint_is_on_disk_before_its_name_appears(tmp_path, monkeypatch):
    """Every file and directory of the staging directory is flushed before the rename, and the
    checkpoints directory (which then holds the new name) after it: a power loss cannot leave a
    found checkpoint with files cut to zero bytes."""
    from reasonrl.training import checkpoint as module

    target = tmp_path / "checkpoints" / "step_000004"
    flushed: list[tuple[str, bool]] = []  # (what was flushed, whether the checkpoint's name existed yet)
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        flushed.append((os.readlink(f"/proc/self/fd/{fd}"), target.exists()))
        real_fsync(fd)

    monkeypatch.setattr(module.os, "fsync", recording_fsync)
    assert module.save_checkpoint(tmp_path, 4, model=_SavesWeights(), tokenizer=_SavesWeights(), state={}) == target

    staging = next(Path(path) for path, _ in flushed if Path(path).name.startswith(".step_000004-"))
    assert staging.parent == tmp_path / "checkpoints"
    *before, last = flushed
    assert not any(named for _, named in before) and last == (str(tmp_path / "checkpoints"), True)
    flushed_in_staging = {Path(path).relative_to(staging).as_posix() for path, _ in before
                          if Path(path).is_relative_to(staging) and Path(path) != staging}
    assert flushed_in_staging == {p.relative_to(target).as_posix() for p in target.rglob("*")}
    assert (str(staging), False) in before and (str(tmp_path), False) in before  # the new checkpoints/ too


def test_a_filesystem_that_cannot_flush_directories_still_saves(tmp_path, monkeypatch):
    """Some FUSE and network mounts answer a directory's fsync with EINVAL: the save goes on. A file
    that cannot be flushed still fails the save."""
    import errno

    from reasonrl.training import checkpoint as module

    real_fsync = os.fsync

    def directories_refused(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(module.os, "fsync", directories_refused)
    saved = module.save_checkpoint(tmp_path, 1, model=_SavesWeights(), tokenizer=_SavesWeights(), state={})
    assert checkpoints(tmp_path) == [saved]

    def files_fail(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(module.os, "fsync", files_fail)
    with pytest.raises(OSError, match="Input/output error"):
        module.save_checkpoint(tmp_path, 2, model=_SavesWeights(), tokenizer=_SavesWeights(), state={})
    assert checkpoints(tmp_path) == [saved]  # nothing half-written is found
