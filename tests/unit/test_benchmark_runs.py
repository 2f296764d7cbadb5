"""benchmarks/runs.py `run_all`: with a start deadline, runs whose turn comes after it are not
started (those going finish) and are handed back in order; without one, every run starts. The
clock is a fake that each run advances, so the outcome does not depend on this machine's load.
And benchmarks/common.py `source_digest`, the library-code identity each record carries; and a
failed run's error, which ends with the last lines of its stderr."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from benchmarks import runs
from benchmarks.common import source_digest


@dataclass(frozen=True)
class TimedSpec:
    """A stand-in for a `RunSpec` whose run takes `seconds` on the fake clock."""

    study: str
    name: str
    clock: list[float]
    started: list[str]
    seconds: float = 10.0

    def run(self, *, rerun: bool = False, threads: int | None = None) -> dict:
        self.started.append(self.name)
        self.clock[0] += self.seconds
        return {}


def specs(clock: list[float], started: list[str], count: int) -> list[TimedSpec]:
    return [TimedSpec("study", f"run{i}", clock, started) for i in range(count)]


def test_no_run_starts_after_the_deadline(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clock, started = [100.0], []
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    planned = specs(clock, started, 5)
    # One at a time, 10 s each: runs start at +0, +10, +20 (< 25) and the fourth's turn comes at +30.
    unstarted = runs.run_all(planned, jobs=1, start_within_s=25)
    assert started == ["run0", "run1", "run2"]
    assert unstarted == planned[3:]
    assert "2 of 5 runs not started (past 25 s): study/run3, study/run4" in capsys.readouterr().err


def test_without_a_deadline_every_run_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, started = [0.0], []
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    assert runs.run_all(specs(clock, started, 4), jobs=1) == []
    assert started == ["run0", "run1", "run2", "run3"]


def test_a_deadline_already_past_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    clock, started = [0.0], []
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    planned = specs(clock, started, 3)
    assert runs.run_all(planned, jobs=2, start_within_s=0) == planned
    assert started == []


def library(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_source_digest_follows_the_files_and_nothing_else(tmp_path: Path) -> None:
    files = {"a.py": "x = 1\n", "algo/b.py": "y = 2\n", "recipes/grpo.toml": "lr = 1e-6\n"}
    reference = source_digest(library(tmp_path / "ref", files))
    assert len(reference) == 12 and int(reference, 16) >= 0
    # The same files written in another order, plus compiled caches: the same digest.
    copy = library(tmp_path / "copy", dict(reversed(files.items())))
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\x00\x01")
    assert source_digest(copy) == reference
    # A changed byte, a renamed file, a file added: each changes it.
    assert source_digest(library(tmp_path / "edit", {**files, "a.py": "x = 2\n"})) != reference
    moved = {"a2.py" if k == "a.py" else k: v for k, v in files.items()}
    assert source_digest(library(tmp_path / "moved", moved)) != reference
    assert source_digest(library(tmp_path / "added", {**files, "c.py": ""})) != reference
    # Contents cannot shift across a file boundary unnoticed.
    assert (source_digest(library(tmp_path / "s1", {"a.py": "ab", "b.py": "c"}))
            != source_digest(library(tmp_path / "s2", {"a.py": "a", "b.py": "bc"})))


def test_a_record_names_the_code_as_its_run_started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    versions = iter(["abc1234", "abc1234-dirty"])  # the tree is edited while the run trains
    monkeypatch.setattr(runs, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(runs, "code_version", lambda: next(versions))
    monkeypatch.setattr(runs, "source_digest", lambda: "0123456789ab")

    def fake_train(command: list[str], **_: object) -> None:
        run_dir = Path(next(arg for arg in command if arg.startswith("run.dir=")).removeprefix("run.dir="))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "perf/step_s": 1.0}\n')
        monkeypatch.setattr(runs, "source_digest", lambda: "edited000000")

    monkeypatch.setattr(runs, "run_command", fake_train)
    record = runs.train_run("study", "run0", "grpo", ["train.steps=1"])
    assert (record["commit"], record["source"]) == ("abc1234", "0123456789ab")
    assert runs.read_record("study", "run0")["source"] == "0123456789ab" and record["steps"] == 1


def test_a_failed_run_names_its_cause_from_the_end_of_its_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    lines = "; ".join(f"print('line {i}', file=sys.stderr)" for i in range(30))
    failing = [sys.executable, "-c", f"import sys; {lines}; print('CUDA out of memory', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(runs.RunFailed) as failure:
        runs.run_command(failing)
    message = str(failure.value)
    assert message.startswith("exit status 3;") and message.endswith("CUDA out of memory")
    assert "line 29" in message and "line 10\n" not in message  # the last 20 lines, not all 31
    assert "line 0" in capfd.readouterr().err  # passed through as it came


def test_a_run_that_succeeds_raises_nothing_and_passes_its_stderr_through(capfd: pytest.CaptureFixture[str]) -> None:
    runs.run_command([sys.executable, "-c", "import sys; print('a warning', file=sys.stderr)"])
    assert capfd.readouterr().err == "a warning\n"


def test_a_run_on_a_chosen_allocator_is_preloaded_with_it_and_kept_apart(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    monkeypatch.setattr(runs, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(runs, "preloaded_allocator", lambda: None)
    monkeypatch.setattr(runs, "library_to_preload", lambda choice: {"glibc": None, "auto": "/lib/libtc.so"}[choice])
    monkeypatch.setenv("LD_PRELOAD", "/lib/inherited.so")
    environments: list[dict[str, str] | None] = []

    def fake_train(command: list[str], env: dict[str, str] | None = None) -> None:
        environments.append(env)
        run_dir = Path(next(arg for arg in command if arg.startswith("run.dir=")).removeprefix("run.dir="))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "perf/step_s": 1.0}\n')

    monkeypatch.setattr(runs, "run_command", fake_train)
    glibc = runs.train_run("study", "run0", None, ["train.steps=1"], allocator="glibc", threads=1)
    assert environments[-1]["LD_PRELOAD"] == "" and environments[-1]["OMP_NUM_THREADS"] == "1"
    assert glibc["allocator"] == {"choice": "glibc", "preloaded": None}
    # The same arguments on another allocator are another run, not the record on disk.
    auto = runs.train_run("study", "run0", None, ["train.steps=1"], allocator="auto")
    assert len(environments) == 2 and environments[-1]["LD_PRELOAD"] == "/lib/libtc.so"
    assert auto["allocator"] == {"choice": "auto", "preloaded": "/lib/libtc.so"}
    assert runs.train_run("study", "run0", None, ["train.steps=1"], allocator="auto") == auto
    assert len(environments) == 2  # the same allocator again: read from disk
    # Without a choice, the environment is the caller's as it is.
    runs.train_run("study", "run1", None, ["train.steps=1"])
    assert environments[-1] is None
    # auto under a caller's own preload would name none (it leaves the caller's standing): refused.
    monkeypatch.setattr(runs, "preloaded_allocator", lambda: "libjemalloc.so.2")
    with pytest.raises(ValueError, match="without LD_PRELOAD"):
        runs.train_run("study", "run2", None, ["train.steps=1"], allocator="auto")
