"""Determinism on CPU: two runs with the same seed and config on the same machine log the same
metrics (all but the timings) and end at bit-identical parameters; a different seed does not
(so the comparison can fail). docs/troubleshooting.md lists what breaks it."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from helpers import TASK, parameters, share_of_a, tiny_config

from reasonrl import train

STEPS = 2


def logged(run_dir: Path) -> list[dict]:
    """Every metrics line without the wall-clock ones (perf/*: seconds, tokens per second, memory)."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if not k.startswith("perf/")} for line in lines]


def final(run_dir: Path) -> dict[str, torch.Tensor]:
    return parameters(run_dir / "checkpoints" / f"step_{STEPS:06d}" / "policy")


# The defaults' dtypes (bfloat16 engine and update where the CPU has it), rather than the test config's float32.
DTYPES = ("rollout.dtype=auto", "train.dtype=auto")


def test_two_runs_with_one_seed_are_identical_and_another_seed_differs(tiny_model_dir, tmp_path):
    runs = {}
    for name, seed in (("a", 0), ("b", 0), ("other", 1)):
        train(tiny_config(tiny_model_dir, tmp_path / name, f"train.steps={STEPS}", f"run.seed={seed}", *DTYPES),
              task=TASK, reward=share_of_a)
        runs[name] = (logged(tmp_path / name), final(tmp_path / name))
    (metrics_a, params_a), (metrics_b, params_b), (metrics_other, params_other) = runs["a"], runs["b"], runs["other"]
    assert len(metrics_a) == STEPS and "sync/logp_gap" in metrics_a[0] and "loss/policy" in metrics_a[0]
    assert metrics_a == metrics_b
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        assert torch.equal(params_a[name], params_b[name]), name
    assert metrics_other != metrics_a
    assert any(not torch.equal(params_a[name], params_other[name]) for name in params_a)
    rollouts = [(tmp_path / name / "rollouts.jsonl").read_text() for name in ("a", "b")]
    assert rollouts[0] == rollouts[1]
