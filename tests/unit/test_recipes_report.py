"""benchmarks/recipes.py's summary: a recipe's interval and target from its seeds' records (and the
device each seed ran on), and a report in which a task has its base model's record but no recipe run
yet (the table says "not run", the figure leaves the task out)."""

from __future__ import annotations

import pytest
from benchmarks.recipes import before_spec, markdown_table, plot, recipe_spec, summarize


def record(accuracy: float, seed: int = 0, device: str = "cpu") -> dict:
    return {"eval_last": {"eval/sampled_accuracy": accuracy}, "seed": seed, "commit": "abc", "wall_s": 1.0,
            "device": device, "curves": {"reward/mean": [0.1, 0.3], "perf/step_s": [2.0, 4.0]}}


def test_a_recipe_summary_by_hand():
    # seeds 0.4, 0.5, 0.6: mean 0.5, sd 0.1, t(2) = 4.303 -> 0.5 +- 4.303 * 0.1 / sqrt(3) = +-0.2484
    result = summarize(record(0.1), [record(0.4, 0), record(0.5, 1), record(0.6, 2)])
    assert result["after_mean"] == pytest.approx(0.5)
    assert (result["after_ci_low"], result["after_ci_high"]) == pytest.approx((0.2516, 0.7484), abs=1e-4)
    assert result["target_met"] and result["before"] == 0.1
    assert result["curves"]["reward/mean"] == pytest.approx([0.1, 0.3]) and result["step_s_median"] == 3.0
    assert not summarize(record(0.3), [record(0.4, 0), record(0.5, 1), record(0.6, 2)])["target_met"]


def test_each_seed_names_the_device_it_ran_on():
    # A task's seeds may come from different machines (a GPU for some, the CPU for the rest).
    gpu, old = record(0.4, 0, "cuda: NVIDIA H100 80GB HBM3"), record(0.5, 1)
    del old["device"]  # records written before runs named their device
    seeds = summarize(record(0.1), [gpu, old, record(0.6, 2)])["seeds"]
    assert [s["device"] for s in seeds] == ["cuda: NVIDIA H100 80GB HBM3", None, "cpu"]


def test_a_task_with_no_recipe_run_yet(tmp_path):
    report = {"seeds": [0, 1, 2], "before": {"arithmetic": 0.1, "gym": 0.026}, "tasks": {
        "arithmetic": {"grpo": summarize(record(0.1), [record(0.4, 0), record(0.5, 1)])}, "gym": {}}}
    table = markdown_table(report)
    assert "| (before) | 10.0% | 2.6% |" in table and "| grpo | 45.0% [" in table and "(2 seeds so far)" in table and table.endswith("| not run |")
    if plot(report, tmp_path / "recipes.png"):
        assert (tmp_path / "recipes.png").stat().st_size > 0
    assert not plot({"seeds": [0], "tasks": {"gym": {}}}, tmp_path / "none.png")


def test_a_report_name_is_a_plain_file_name():
    from benchmarks.recipes import main

    for bad in ("../recipes", "a b", "gym/5"):
        with pytest.raises(SystemExit):
            main(["--summary-only", "--report", bad])


def test_another_step_budget_is_recorded_apart_from_the_default():
    default, longer = recipe_spec("gym", "grpo", 3, 20), recipe_spec("gym", "grpo", 3, 40)
    assert (default.study, default.name) == ("recipes/gym", "grpo_seed3")
    assert (longer.study, longer.name) == ("recipes/gym_40steps", "grpo_seed3")
    assert "train.steps=40" in longer.args and "run.seed=3" in longer.args
    assert before_spec("gym").study == "recipes/gym"
