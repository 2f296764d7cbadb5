"""benchmarks/claims_power.py: the seeds a claim's verdict (a one-sided t-test at 0.025, 80% power)
needs, against values derivable by hand or read from tables: the SD's chi-square bound, the test's
size when there is no effect, the sample sizes of the standard power tables for a paired
t-test, the normal approximation the t-based count approaches from above, the side a claim predicts,
and the translations of a paper's effect that read the records."""

from __future__ import annotations

import math

import pytest
from benchmarks import claims_power as cp


@pytest.mark.parametrize(("n", "chi2_20", "bound"), [(3, 0.4463, 2.1169), (5, 1.6488, 1.5577)])
def test_the_sd_s_upper_bound_uses_the_chi_square_table(n, chi2_20, bound):
    # sd * sqrt((n - 1) / chi2(0.2, n - 1)), chi-square 20% quantiles 0.4463 (2 df) and 1.6488 (4 df)
    assert math.sqrt((n - 1) / chi2_20) == pytest.approx(bound, abs=1e-3)
    assert cp.sd_upper_bound(1.0, n) == pytest.approx(bound, abs=1e-3)


@pytest.mark.parametrize("n", [2, 3, 5, 20])
def test_with_no_effect_the_verdict_lands_on_the_predicted_side_2_5_percent_of_the_time(n):
    assert cp.power(0.0, 1.0, n) == pytest.approx(0.025, abs=1e-6)


def test_power_rises_with_the_effect_and_falls_on_the_other_side():
    assert cp.power(-0.5, 1.0, 10) < 0.025 < cp.power(0.5, 1.0, 10) < cp.power(1.0, 1.0, 10)


@pytest.mark.parametrize(("d", "table_n"), [(0.2, 199), (0.5, 34), (0.8, 15)])
def test_seeds_match_the_power_tables_for_a_paired_t_test(d, table_n):
    """Paired t-test, two-sided 0.05 (one-sided 0.025), 80% power: 199, 34 and 15 pairs for d = 0.2,
    0.5 and 0.8 (Cohen's tables; G*Power gives the same)."""
    assert cp.seeds_needed(d, 1.0) == table_n
    assert cp.seeds_needed(10 * d, 10.0) == table_n  # only distance / sd matters


def test_the_t_based_count_approaches_the_normal_approximation_from_above():
    # ((1.95996 + 0.84162) / 0.05)^2 = 3139.6 -> 3140
    assert cp.seeds_needed_normal(0.05, 1.0) == 3140
    assert 0 <= cp.seeds_needed(0.05, 1.0) - 3140 <= 3
    for d in (0.3, 1.0, 2.0):  # with few seeds the t quantile costs more seeds than the normal one
        assert cp.seeds_needed(d, 1.0) > cp.seeds_needed_normal(d, 1.0)


def test_the_fewest_seeds_reach_the_target_and_one_fewer_does_not():
    n = cp.seeds_needed(0.7, 1.0)
    assert cp.power(0.7, 1.0, n) >= 0.8 > cp.power(0.7, 1.0, n - 1)


@pytest.mark.parametrize(("mean", "side", "distance"), [(-0.1, "<0", 0.1), (0.1, "<0", -0.1), (0.1, ">0", 0.1),
                                                         (0.03, ">-0.05", 0.08), (-0.065, ">-0.05", -0.015)])
def test_distance_is_measured_on_the_predicted_side(mean, side, distance):
    assert cp.distance_from_threshold(mean, side) == pytest.approx(distance)


def test_an_effect_on_the_other_side_has_no_seed_count_that_reproduces_it():
    assert cp.seeds_needed(cp.distance_from_threshold(0.1, "<0"), 0.09) is None
    assert cp.seeds_needed(cp.distance_from_threshold(-0.1, "<0"), 0.09) == cp.seeds_needed(0.1, 0.09)


def test_sd_upper_bound_is_the_chi_square_bound():
    assert cp.sd_upper_bound(1.0, 3) == pytest.approx(math.sqrt(2 / 0.44629), rel=1e-4)
    assert cp.sd_upper_bound(2.0, 5) == pytest.approx(2 * math.sqrt(4 / 1.64878), rel=1e-4)


def test_pooled_sd_weights_each_group_by_its_degrees_of_freedom():
    # variances 2 (1 df) and 4 (2 df): (2 + 8) / 3
    assert cp.pooled_sd([[1.0, 3.0], [2.0, 4.0, 6.0]]) == pytest.approx(math.sqrt(10 / 3))


def test_joint_seeds_cover_every_test_at_once():
    single = cp.seeds_needed(0.8, 1.0)
    assert cp.joint_seeds_needed([(0.8, 1.0)]) == single
    both = cp.joint_seeds_needed([(0.8, 1.0), (0.8, 1.0)])
    assert both > single and cp.power(0.8, 1.0, both) ** 2 >= 0.8
    assert cp.joint_seeds_needed([(0.8, 1.0), (-0.1, 1.0)]) is None


def study(claims: dict) -> cp.Study:
    return cp.Study("claims/test", {"claims": claims, "summarised_on": "cpu"})


def test_an_entropy_claim_is_held_to_half_its_baselines_decline():
    curve = [0.8, 0.7, 0.6] + [0.5] * 7 + [0.2] * 10  # first step 0.8, last 10 steps 0.2
    effect = cp.clip_higher_effect(study({"dapo_clip_higher": {"curves": {"symmetric": {"entropy/mean": curve}}}}),
                                   "entropy")
    assert effect.mean == pytest.approx(0.3)


def test_ttrl_carries_the_papers_smallest_relative_gain_onto_the_base_models_accuracy():
    # after 0.10 and 0.20, minus the base model's accuracy: the base model had 0.05
    ttrl = {"accuracy_after": {"majority_vote": [0.10, 0.20]}, "tests": {"t": {"values": [0.05, 0.15]}}}
    assert cp.ttrl_effect(study({"ttrl": ttrl}), "t").mean == pytest.approx(0.05 * (15.8 / 7.7 - 1))
