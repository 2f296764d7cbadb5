"""benchmarks/default_job.py: the default job's distribution over seeds and the check of one run
against it (the prediction interval derived by hand below)."""

from __future__ import annotations

import json
import math

import pytest
from benchmarks import default_job


def test_the_prediction_interval_is_wider_than_the_mean_s_by_the_square_root_of_n_plus_one():
    values = [50.0, 60.0, 70.0]  # mean 60, sd 10, t(2) = 4.303
    low, high = default_job.prediction_interval(values)
    half = 4.303 * 10 * math.sqrt(1 + 1 / 3)
    assert (low, high) == pytest.approx((60 - half, 60 + half), abs=0.01)
    assert all(math.isnan(bound) for bound in default_job.prediction_interval([55.0]))  # one run: no interval


def test_the_default_job_has_no_departures_and_a_changed_knob_is_named():
    assert default_job.departures_from_default(["run.dir=/elsewhere", "run.seed=7"]) == {}
    default_steps = default_job.job_settings([])["train.steps"]
    assert default_job.departures_from_default(["train.steps=3"]) == {"train.steps": (default_steps, 3)}


def record(seed: int, before: float, after: float, args: list[str] | None = None) -> dict:
    evals = [{"step": 0, "eval/sampled_accuracy": before, "eval/greedy_accuracy": before},
             {"step": 40, "eval/sampled_accuracy": after, "eval/greedy_accuracy": after + 0.05}]
    return {"config": None, "args": [*(args or []), f"run.seed={seed}"], "commit": "abc", "device": "cpu",
            "evals": evals, "eval_last": evals[-1], "curves": {"perf/step_s": [2.0, 3.0]}, "alarms": []}


def test_records_of_another_job_are_refused_and_the_default_job_s_summarized(tmp_path, monkeypatch):
    monkeypatch.setattr(default_job, "RESULTS", tmp_path)
    study = tmp_path / "study"
    study.mkdir()
    for seed, after in [(0, 0.5), (1, 0.6), (2, 0.7)]:
        (study / f"x_seed{seed}.json").write_text(json.dumps(record(seed, 0.1, after)))
    (study / "y_seed0.json").write_text(json.dumps(record(0, 0.1, 0.5, ["train.lr=1e-3"])))
    with pytest.raises(SystemExit, match="y_seed0.json is not today's default job"):
        default_job.records_of_study("study", "y")
    records = default_job.records_of_study("study", "x")
    summary = default_job.summarize(records, [default_job.seed_of(r) for r in records])
    assert summary["seeds"] == [0, 1, 2] and summary["sampled_accuracy_median"] == pytest.approx(60.0)
    assert summary["ci95_mean"] == pytest.approx([60 - 4.303 * 10 / math.sqrt(3), 60 + 4.303 * 10 / math.sqrt(3)],
                                                  abs=0.01)
    assert summary["per_seed"][0]["sampled_before"] == pytest.approx(10.0)
    assert summary["greedy_median"] == pytest.approx(65.0) and summary["train_wall_s_median"] == 5.0


def test_a_run_is_checked_against_the_prediction_interval(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "default_job.json"
    summary.write_text(json.dumps({"seeds": [0, 1, 2], "sampled_accuracy_median": 60.0,
                                   "prediction95_one_run": [50.0, 70.0]}))
    monkeypatch.setattr(default_job, "SUMMARY", summary)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[run]\nseed = 11\ndir = 'run'\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 40, "eval/sampled_accuracy": 0.64}) + "\n")
    assert default_job.check_run(run) == 0
    assert "64.0% at step 40: inside" in capsys.readouterr().out
    (run / "metrics.jsonl").write_text(json.dumps({"step": 40, "eval/sampled_accuracy": 0.45}) + "\n")
    assert default_job.check_run(run) == 1
    (run / "config.toml").write_text("[train]\nsteps = 3\n")
    assert default_job.check_run(run) == 1
    assert "not the default job" in capsys.readouterr().err


def test_a_study_of_another_name_writes_its_own_summary_and_a_run_is_checked_against_it(tmp_path, monkeypatch,
                                                                                         capsys):
    monkeypatch.setattr(default_job, "RESULTS", tmp_path)
    written = {}
    monkeypatch.setattr(default_job, "write_report", lambda name, report: written.setdefault(name, report))
    study = tmp_path / "elsewhere"
    study.mkdir()
    for seed, after in ((0, 0.5), (1, 0.7)):
        (study / f"x_seed{seed}.json").write_text(json.dumps(record(seed, 0.1, after)))
    assert default_job.main(["summarize", "--records", "elsewhere", "--candidate", "x", "--name", "on_intel"]) == 0
    assert list(written) == ["on_intel"] and written["on_intel"]["seeds"] == [0, 1]  # not default_job.json
    (tmp_path / "on_intel.json").write_text(json.dumps({"seeds": [0, 1], "sampled_accuracy_median": 60.0,
                                                         "prediction95_one_run": [40.0, 80.0]}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("[run]\nseed = 11\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 40, "eval/sampled_accuracy": 0.45}) + "\n")
    assert default_job.main(["check", str(run), "--summary", "on_intel"]) == 0
    assert "inside the 95% prediction interval [40.0, 80.0] of 2 seeds" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        default_job.main(["check", str(run), "--summary", "../default_job"])


def test_summaries_are_drawn_side_by_side_and_a_bad_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(default_job, "RESULTS", tmp_path)
    for name, device in (("on_one_cpu", "cpu: A"), ("on_another", "cpu: B")):
        per_seed = [{"seed": seed, "sampled_before": 8.0, "sampled_after": 60.0 + seed, "device": device}
                    for seed in (30, 31)]
        (tmp_path / f"{name}.json").write_text(json.dumps({"per_seed": per_seed,
                                                           "prediction95_one_run": [50.0, 70.0]}))
    assert default_job.main(["plot", "on_one_cpu,on_another", "--out", "both"]) == 0
    assert (tmp_path / "both.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        default_job.main(["plot", "on_one_cpu,../elsewhere"])
