"""benchmarks/recipes.py's summary: a recipe's interval and target from its seeds' records (and the
device each seed ran on), and a report in which a task has its base model's record but no recipe run
yet (the table says "not run", the figure leaves the task out)."""

from __future__ import annotations

import pytest
from benchmarks.recipes import before_spec, markdown_table, plot, recipe_spec, seed_effect, summarize


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
    assert result["ci_width"] == pytest.approx(2 * 4.303 * 0.1 / 3**0.5, abs=1e-4)  # 0.4968


def test_the_width_target(tmp_path, monkeypatch):
    # Seeds 0.60, 0.62, 0.64: sd 0.02, width 2 * 4.303 * 0.02 / sqrt(3) = 9.94 points (<= 15);
    # 0.40, 0.55, 0.70: sd 0.15, width 74.5 points.
    import benchmarks.recipes as recipes_module

    records = {"before": record(0.1), **{f"narrow_seed{s}": record(0.60 + 0.02 * s, s) for s in range(3)},
               **{f"wide_seed{s}": record(0.40 + 0.15 * s, s) for s in range(3)}}
    monkeypatch.setattr(recipes_module, "record_path", lambda study, name: tmp_path / "exists")
    (tmp_path / "exists").touch()
    monkeypatch.setattr(recipes_module, "read_record", lambda study, name: records[name])
    monkeypatch.setattr(recipes_module, "write_report", lambda name, report: None)
    monkeypatch.setattr(recipes_module, "plot", lambda report, path: False)
    monkeypatch.setattr("reasonrl.recipes.recipes", lambda: [type("R", (), {"name": n}) for n in ("narrow", "wide")])
    report = recipes_module.main(["--summary-only", "--tasks", "arithmetic", "--max-width", "15"])
    narrow, wide = report["tasks"]["arithmetic"]["narrow"], report["tasks"]["arithmetic"]["wide"]
    assert narrow["ci_width"] == pytest.approx(0.0994, abs=1e-4) and narrow["width_met"]
    assert not wide["width_met"] and wide["target_met"]  # above the start, too wide
    assert not report["all_targets_met"]


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


def test_a_variant_is_recorded_apart_with_its_overrides():
    plain = recipe_spec("gym", "clip_cov", 3, 20)
    variant = recipe_spec("gym", "clip_cov", 3, 20, "ppo_clip", ("algo.clip_low=0.2", "algo.clip_high=0.2"))
    assert (variant.study, variant.name) == ("recipes/gym_ppo_clip", "clip_cov_seed3")
    assert variant.args[-2:] == ("algo.clip_low=0.2", "algo.clip_high=0.2")  # last: they win over the task's
    assert variant.args[:-2] == plain.args
    assert recipe_spec("gym", "grpo", 3, 40, "x", ("a=1",)).study == "recipes/gym_40steps_x"


@pytest.mark.parametrize("argv", [["algo.clip_low=0.2"], ["--variant", "v"], ["--variant", "../v", "a=1"]])
def test_overrides_need_a_plain_variant_name(argv: list[str]) -> None:
    from benchmarks.recipes import main

    with pytest.raises(SystemExit):
        main(["--summary-only", *argv])


def seeded(rows: dict[str, list[float]]) -> dict:
    return {name: {"seeds": [{"seed": s, "after": a} for s, a in enumerate(row)]} for name, row in rows.items()}


def test_the_seed_effect_by_hand():
    # recipe means 0.2, 0.2; spread within recipes (0.04 + 0.04) + 0 = 0.08; seed means 0.1, 0.3 about 0.2:
    # 2 recipes x (0.01 + 0.01) = 0.04 -> half the spread. Swapping a's seeds gives the same seed means
    # reversed, so every shuffle explains as much: p = 1.
    effect = seed_effect(seeded({"a": [0.0, 0.4], "b": [0.2, 0.2]}), [0, 1], resamples=500)
    assert effect["within_recipe_share"] == pytest.approx(0.5) and effect["recipes"] == 2
    assert effect["seed_means"] == pytest.approx({"0": 0.1, "1": 0.3}) and effect["permutation_p"] == 1.0
    # a seed good for both recipes explains all of the spread; shuffled, one row swapped (half the
    # shuffles) levels the seed means to 0.25, 0.25 and explains nothing -> p = 1/2
    effect = seed_effect(seeded({"a": [0.1, 0.3], "b": [0.2, 0.4]}), [0, 1], resamples=4000)
    assert effect["within_recipe_share"] == pytest.approx(1.0)
    assert effect["permutation_p"] == pytest.approx(0.5, abs=0.03)
    # opposite seeds explain nothing
    assert seed_effect(seeded({"a": [0.1, 0.3], "b": [0.4, 0.2]}), [0, 1])["within_recipe_share"] == pytest.approx(0.0)


def test_the_seed_effect_ignores_how_good_each_recipe_is_and_incomplete_recipes():
    rows = {"a": [0.05, 0.2, 0.02, 0.3], "b": [0.1, 0.25, 0.03, 0.2], "c": [0.02, 0.1, 0.04, 0.15]}
    shifted = {name: [x + 0.1 * i for x in row] for i, (name, row) in enumerate(rows.items())}
    seeds = [0, 1, 2, 3]
    base, moved = seed_effect(seeded(rows), seeds, 2000), seed_effect(seeded(shifted), seeds, 2000)
    assert base["within_recipe_share"] == pytest.approx(moved["within_recipe_share"])
    assert base["permutation_p"] == moved["permutation_p"] and 0 < base["permutation_p"] < 0.2
    assert seed_effect(seeded({**rows, "d": [0.9]}), seeds, 2000) == base  # d lacks seeds 1-3
    assert seed_effect(seeded({"a": rows["a"]}), seeds) is None


def test_rerun_runs_the_recipes_again_but_not_the_shared_start(tmp_path, monkeypatch):
    import benchmarks.recipes as recipes_module

    calls = []
    monkeypatch.setattr(recipes_module, "run_all", lambda specs, jobs=1, rerun=False, start_within_s=None:
                        calls.append(([spec.name for spec in specs], rerun)))
    monkeypatch.setattr(recipes_module, "record_path", lambda study, name: tmp_path / "absent")
    monkeypatch.setattr(recipes_module, "write_report", lambda name, report: None)
    monkeypatch.setattr(recipes_module, "plot", lambda report, path: False)
    monkeypatch.setattr("reasonrl.recipes.recipes", lambda: [type("R", (), {"name": "grpo"})])
    recipes_module.main(["--tasks", "arithmetic", "--only", "grpo", "--seeds", "2", "--rerun"])
    assert calls == [(["before"], False), (["grpo_seed2"], True)]
