"""Runs on the same cores share them: each takes an equal share of the threads, re-divided as runs
come and go; fixed thread counts are kept, and a sum above the cores is warned about once, with
the fix. Dead or reused pids do not count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from reasonrl.training.cpu_share import CpuShare, _start_time, usable_cores


@pytest.fixture(autouse=True)
def keep_torch_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def sleeper():
    """A live process standing for another run."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process.pid
    process.kill()
    process.wait()


def register(directory, pid, threads, auto=True, started="own"):
    directory.mkdir(parents=True, exist_ok=True)
    started = _start_time(pid) if started == "own" else started
    (directory / str(pid)).write_text(json.dumps({"threads": threads, "auto": auto, "started": started}))


def test_a_lone_run_takes_every_core_and_leaves_no_entry(tmp_path):
    said = []
    share = CpuShare(0, directory=tmp_path, cores=4, say=said.append).join()
    assert share.threads == torch.get_num_threads() == 4
    assert json.loads((tmp_path / str(os.getpid())).read_text())["threads"] == 4
    share.leave()
    assert list(tmp_path.iterdir()) == [] and said == []


def test_runs_divide_the_cores_and_take_them_back(tmp_path, sleeper):
    said = []
    share = CpuShare(0, directory=tmp_path, cores=4, say=said.append).join()
    register(tmp_path, sleeper, threads=4)
    assert share.rebalance() == torch.get_num_threads() == 2
    assert said == ["reasonrl: 2 runs share 4 cores: this one now uses 2 thread(s)"]
    (tmp_path / str(sleeper)).unlink()  # the other run finished
    assert share.rebalance() == 4


def test_dead_and_reused_pids_do_not_count(tmp_path, sleeper):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          check=True, capture_output=True, text=True)
    register(tmp_path, int(dead.stdout), threads=2, started=None)
    if _start_time(sleeper) is not None:  # Linux: a pid now held by another process than the run that wrote it
        register(tmp_path, sleeper, threads=2, started="1")
    share = CpuShare(0, directory=tmp_path, cores=4).join()
    assert share.threads == 4
    assert [entry.name for entry in tmp_path.iterdir()] == [str(os.getpid())]  # the stale ones removed


def test_fixed_threads_are_kept_and_oversubscription_is_warned_once(tmp_path, sleeper):
    register(tmp_path, sleeper, threads=4, auto=False)  # another run given run.threads=4
    said = []
    share = CpuShare(0, directory=tmp_path, cores=4, say=said.append).join()
    assert share.threads == 2  # its share; the fixed run keeps 4: 6 threads on 4 cores
    share.rebalance()
    assert len(said) == 1 and said[0].startswith("reasonrl: warning: 2 reasonrl runs take 6 threads on 4 cores")
    assert "run.threads=0" in said[0] and "at most 4" in said[0]
    assert CpuShare(3, directory=tmp_path, cores=4, say=said.append).join().threads == 3  # run.threads=3: kept


def test_sharing_runs_are_not_warned_about(tmp_path, sleeper):
    register(tmp_path, sleeper, threads=4, auto=True)  # takes its share at its next step
    said = []
    assert CpuShare(0, directory=tmp_path, cores=4, say=said.append).join().threads == 2
    assert said == []


def test_omp_num_threads_is_the_users_fixed_count(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert CpuShare(0, directory=tmp_path, cores=4).join().threads == 1


def test_two_processes_starting_together_take_half_each(tmp_path):
    program = textwrap.dedent(f"""
        import pathlib, sys, time
        from reasonrl.training.cpu_share import CpuShare
        share = CpuShare(0, directory=pathlib.Path({str(tmp_path / 'cpu')!r}), cores=2, say=lambda line: None).join()
        def meet(name):  # wait until both processes got here
            pathlib.Path({str(tmp_path)!r}, name + sys.argv[1]).touch()
            while len(list(pathlib.Path({str(tmp_path)!r}).glob(name + '*'))) < 2:
                time.sleep(0.05)
        meet('joined')
        print(share.rebalance())
        meet('rebalanced')  # neither leaves before the other has looked
    """)
    runs = [subprocess.Popen([sys.executable, "-c", program, str(i)], stdout=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}) for i in range(2)]
    assert [run.communicate(timeout=120)[0].strip() for run in runs] == ["1", "1"]
    assert list((tmp_path / "cpu").iterdir()) == []  # both left on exit


def test_usable_cores_is_the_affinity():
    assert usable_cores() == (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
