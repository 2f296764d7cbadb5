"""benchmarks/kept_memory.py: each arm's child run gets the environment its arm names (tcmalloc
preloaded for the tcmalloc arm; glibc's bounded and unbounded arms inherit the caller's), and the per-step
measures are read from its metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import kept_memory, runs


@pytest.mark.parametrize(("arm", "preload"), [("tcmalloc", "/lib/libtcmalloc_minimal.so.4"), ("bounded", None),
                                              ("unbounded", None)])
def test_each_arm_runs_on_its_allocator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, arm: str,
                                        preload: str | None) -> None:
    monkeypatch.setattr(runs, "preloaded_allocator", lambda: None)
    monkeypatch.setattr(runs, "library_to_preload", lambda choice: {"tcmalloc": "/lib/libtcmalloc_minimal.so.4"}[choice])
    seen: list[tuple[list[str], dict[str, str] | None]] = []

    def fake_train(command: list[str], env: dict[str, str] | None = None) -> None:
        seen.append((command, env))
        run_dir = Path(next(arg for arg in command if arg.startswith("run.dir=")).removeprefix("run.dir="))
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "perf/step_s": 2.5, "perf/rss_gb": 1.5}\n'
                                               '{"step": 2, "perf/step_s": 2.0, "perf/rss_gb": 1.75}\n'
                                               '{"step": 2, "eval/accuracy": 0.5}\n')

    monkeypatch.setattr(kept_memory, "run_command", fake_train)
    result = kept_memory.arm_run(arm, steps=2, seed=7, scratch=tmp_path)
    (command, env), = seen
    if preload is None:
        assert env is None
    else:
        assert env is not None and env["LD_PRELOAD"] == preload
    assert "train.steps=2" in command and "run.seed=7" in command and "run.threads=1" in command
    assert ("-c" in command) == (arm == "unbounded")  # only the unbounded arm lifts the bound
    assert result["perf/step_s"] == [2.5, 2.0] and result["perf/rss_gb"] == [1.5, 1.75]  # steps only, in order
