"""benchmarks/agents.py over seeds: the change after minus before with its interval (derived by hand
below), and a recorded seed read back instead of trained again."""

from __future__ import annotations

import json

import pytest
from benchmarks import agents


def record(seed: int, before: float, after: float, steps: int = 30) -> dict:
    return {"example": "tool_math", "seed": seed, "steps": steps, "commit": "abc",
            "eval": {"before": {"sampled_accuracy": before, "greedy_accuracy": before},
                     "after": {"sampled_accuracy": after, "greedy_accuracy": after}}}


def test_the_change_is_after_minus_before_in_points_with_a_student_t_interval():
    summary = agents.over_seeds([record(0, 0.05, 0.95), record(1, 0.05, 0.85), record(2, 0.05, 0.75)])
    # changes 90, 80, 70 points: mean 80, sd 10, t(2) = 4.303, half-width 4.303 * 10 / sqrt(3) = 24.84
    assert summary["change"]["per_seed"] == pytest.approx([90, 80, 70])
    assert summary["change"]["mean"] == pytest.approx(80)
    assert summary["change"]["ci95"] == pytest.approx([80 - 24.84, 80 + 24.84], abs=0.01)
    assert summary["change"]["verdict_above_0"] == "reproduced"
    assert summary["median_after"] == pytest.approx(85)
    worse = agents.over_seeds([record(0, 0.5, 0.1), record(1, 0.5, 0.2), record(2, 0.5, 0.15)])
    assert worse["change"]["verdict_above_0"] == "contradicted"  # a sign error would read this as learning


def test_a_recorded_seed_is_read_back_and_one_of_another_length_is_trained_again(tmp_path, monkeypatch):
    monkeypatch.setattr(agents, "SEED_RECORDS", tmp_path)
    (tmp_path / "tool_math_seed4.json").write_text(json.dumps(record(4, 0.1, 0.9)))
    trained: list[tuple] = []
    monkeypatch.setattr(agents, "train_example", lambda *args: trained.append(args))
    monkeypatch.setattr(agents, "summarise", lambda run_dir: {"steps": 10, "eval": {}, "curve": []})
    assert agents.seed_record("tool_math", 4, 30, tmp_path / "runs")["eval"]["after"]["sampled_accuracy"] == 0.9
    assert trained == []
    fresh = agents.seed_record("tool_math", 4, 10, tmp_path / "runs")
    assert trained == [("tool_math", 10, tmp_path / "runs" / "tool_math" / "seed4", 4, 0)]
    assert fresh["seed"] == 4 and "commit" in fresh
    assert json.loads((tmp_path / "tool_math_seed4.json").read_text())["steps"] == 10
