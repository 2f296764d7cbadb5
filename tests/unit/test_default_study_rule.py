"""benchmarks/default_study.py: a round's candidate against another round's records of the default,
by the rounds' rule (no alarm on any seed, and a lowest seed strictly above the default's)."""

from __future__ import annotations

import pytest
from benchmarks import default_study


def record(accuracy: float, alarms: tuple[str, ...] = ()) -> dict:
    return {"eval_last": {default_study.ACCURACY: accuracy, default_study.GREEDY: accuracy},
            "curves": {"entropy/mean": [0.5] * 5, "perf/step_s": [4.0] * 40}, "alarms": list(alarms), "commit": "c"}


def row(accuracies: list[float], alarms: tuple[str, ...] = ()) -> dict:
    return default_study.summarize([record(a, alarms) for a in accuracies])


def test_the_rule_takes_a_higher_lowest_seed_without_alarms_and_leaves_ties_to_the_default(monkeypatch):
    seeds = (100, 101, 102)
    default = [record(0.632), record(0.65), record(0.70)]
    monkeypatch.setattr(default_study, "recorded", lambda stage, candidates, seeds: {"lr5e-6": default})
    report = {"table": {"higher": row([0.64, 0.66, 0.67]), "tie": row([0.632, 0.80, 0.80]),
                        "alarm": row([0.70, 0.71, 0.72], ("entropy_collapse",)), "short": row([0.70, 0.71])}}
    plotted = default_study.with_reference("tuning3", seeds, report)
    assert report["chosen_by_rule"] == ["higher"]
    assert report["reference"]["stage"] == "tuning2" and report["reference"]["lowest"] == pytest.approx(63.2)
    assert report["reference"]["sampled_accuracy_median"] == pytest.approx(65.0)
    assert list(plotted) == ["lr5e-6 (tuning2)"] and plotted["lr5e-6 (tuning2)"] is default


def test_a_round_that_runs_the_default_beside_its_candidates_reads_it_from_its_own_records(monkeypatch):
    seeds = (101, 100)
    default = [record(0.55), record(0.63)]
    monkeypatch.setattr(default_study, "recorded", lambda stage, candidates, seeds: {"default": default})
    report = {"table": {"default": row([0.55, 0.63]), "overlong16": row([0.60, 0.64]),
                        "mask_truncated": row([0.55, 0.70])}}
    plotted = default_study.with_reference("tuning4", seeds, report)
    assert report["reference"]["stage"] == "tuning4" and report["reference"]["lowest"] == pytest.approx(55.0)
    assert report["chosen_by_rule"] == ["overlong16"]  # the default never beats itself; a tie is the default's
    assert plotted == {}  # already among the stage's own records
    assert default_study.ROUND4_CANDIDATES["default"] == ()
