"""benchmarks/readme_numbers.py: the median over seeds, the 95% t-interval of their mean, the
order-statistic interval of the median and the seeds as the README names them, against values
computed by hand."""

from __future__ import annotations

import pytest
from benchmarks.readme_numbers import median_interval, seed_ranges, summarise


def test_the_median_is_not_the_mean_and_the_interval_is_the_mean_s():
    # mean 0.4; deviations -0.3, -0.2, +0.5: sd = sqrt(0.38 / 2) = 0.43589; t(2) = 4.303
    # half width 4.303 * 0.43589 / sqrt(3) = 1.08290
    summary = summarise([0.9, 0.1, 0.2])
    assert summary["median"] == pytest.approx(0.2)
    assert summary["mean"] == pytest.approx(0.4)
    assert summary["ci95_mean"] == pytest.approx([0.4 - 1.08290, 0.4 + 1.08290], abs=1e-4)
    assert summary["median_inside_ci95_mean"] is True
    assert summary["n"] == 3 and summary["one_seed"] is False


def test_an_even_count_s_median_is_the_middle_pair_s_mean():
    assert summarise([4.0, 1.0, 3.0, 2.0])["median"] == pytest.approx(2.5)


def test_one_seed_has_no_interval_and_says_so():
    summary = summarise([0.983])
    assert summary["median"] == pytest.approx(0.983)
    assert summary["ci95_mean"] is None and summary["one_seed"] is True


def test_no_runs_is_an_error_naming_the_records():
    with pytest.raises(ValueError, match="records"):
        summarise([])


def test_five_seeds_cannot_give_a_95_percent_interval_of_the_median():
    # [min, max] of 5 holds the median with probability 1 - 2 / 2^5 = 0.9375 < 0.95
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None


def test_six_seeds_give_min_to_max():
    interval = median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0])
    assert (interval["low"], interval["high"]) == (1.0, 6.0)
    assert interval["coverage"] == pytest.approx(1 - 2 / 64)


def test_ten_seeds_give_the_second_to_the_ninth():
    # k = 2: 1 - 2 (1 + 10) / 1024 = 0.9785; k = 3: 1 - 2 (1 + 10 + 45) / 1024 = 0.8906 < 0.95
    interval = median_interval([float(v) for v in range(10, 0, -1)])
    assert (interval["low"], interval["high"]) == (2.0, 9.0)
    assert interval["coverage"] == pytest.approx(1 - 22 / 1024)


def test_seventeen_seeds_give_the_textbook_fifth_to_thirteenth():
    # P(Binomial(17, 1/2) <= 4) = (1 + 17 + 136 + 680 + 2380) / 2^17 = 0.02452
    interval = median_interval([float(v) for v in range(1, 18)])
    assert (interval["low"], interval["high"]) == (5.0, 13.0)
    assert interval["coverage"] == pytest.approx(1 - 2 * 3214 / 2**17)


def test_seeds_are_named_as_runs_of_consecutive_seeds():
    assert seed_ranges([7, 0, 2, 1, 4, 8, 2]) == "0-2, 4, 7-8"
    assert seed_ranges([0]) == "0"


def gsm8k_record(seed: int | None, before: float, after: float) -> dict:
    record = {"before": {"pass@1": before, "ci95": [before - 0.01, before + 0.01]},
              "after": {"pass@1": after, "ci95": [after - 0.01, after + 0.01]},
              "change": {"mean": after - before, "ci95": [after - before - 0.01, after - before + 0.01]},
              "commit": f"c{seed}"}
    return record if seed is None else record | {"seed": seed}


def test_a_gsm8k_arm_s_seeds_are_read_together(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import json

    from benchmarks import readme_numbers

    monkeypatch.setattr(readme_numbers, "RESULTS", tmp_path)
    arms = ("dapo", "grpo", "grpo_cold_start", "grpo_long_cold_start", "grpo_band_cold_start")
    for arm in arms:  # seed 0's record predates the seed field
        (tmp_path / f"gsm8k_{arm}.json").write_text(json.dumps(gsm8k_record(None, 0.02, 0.03)))
    for seed, after in ((1, 0.05), (2, 0.04)):
        (tmp_path / f"gsm8k_grpo_seed{seed}.json").write_text(json.dumps(gsm8k_record(seed, 0.02, after)))
    (tmp_path / "gsm8k_grpo_cold_start_seed1.json").write_text(json.dumps(gsm8k_record(1, 0.02, 0.9)))  # another arm
    # A report written after its runs names the commit they trained at apart from its own.
    (tmp_path / "gsm8k_grpo_band_cold_start_seed1.json").write_text(
        json.dumps(gsm8k_record(1, 0.02, 0.03) | {"commit": "written", "trained_at": "trained"}))
    numbers = {entry["what"]: entry for entry in readme_numbers.gsm8k()}
    grpo = numbers["grpo: greedy pass@1 change"]
    # changes 0.01, 0.03, 0.02 over seeds 0-2: median 0.02, mean 0.02, sd 0.01, t(2) 4.303 -> +-0.02484
    assert grpo["median"] == pytest.approx(0.02) and grpo["seeds"] == "0-2"
    assert grpo["ci95_mean"] == pytest.approx([0.02 - 0.02484, 0.02 + 0.02484], abs=1e-4)
    assert "ci95_over_problems" not in grpo  # several seeds: the interval is over seeds
    assert numbers["grpo_band_cold_start: greedy pass@1 change"]["commits"] == ["cNone", "trained"]
    dapo = numbers["dapo: greedy pass@1 change"]
    assert dapo["seeds"] == "0" and dapo["ci95_mean"] is None and dapo["ci95_over_problems"] == pytest.approx([0.0, 0.02])


def test_ten_degrees_of_freedom_use_the_table_s_value():
    from benchmarks.common import t_interval, t_quantile

    # 0..10: mean 5, sd sqrt(11): half width t(0.975, 10) x sqrt(11) / sqrt(11) = 2.228
    assert t_quantile(10) == 2.228
    assert t_interval([float(v) for v in range(11)]) == pytest.approx((5.0, 2.772, 7.228), abs=1e-9)
