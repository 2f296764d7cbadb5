"""pass@k, maj@k, mean@k against hand-computed values; the bootstrap interval on a known distribution."""

from __future__ import annotations

import math
import random

import pytest

from reasonrl.eval.metrics import bootstrap_ci, maj_at_k, mean_at_k, pass_at_k


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (10, 0, 1, 0.0),  # c = 0
    (10, 10, 4, 1.0),  # c = n
    (10, 3, 1, 0.3),  # pass@1 = c / n
    (5, 2, 5, 1.0),  # n = k with a correct sample
    (5, 0, 5, 0.0),  # n = k without one
    (4, 1, 2, 1 - math.comb(3, 2) / math.comb(4, 2)),  # 1 - 3/6 = 0.5
    (10, 2, 3, 1 - math.comb(8, 3) / math.comb(10, 3)),  # 1 - 56/120 = 0.5333
    (16, 5, 4, 1 - math.comb(11, 4) / math.comb(16, 4)),  # 1 - 330/1820
    (6, 4, 3, 1.0),  # n - c = 2 < k: every 3-subset holds a correct one
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_equals_the_subset_average():
    # The estimator is the fraction of k-subsets that contain a correct sample: count them.
    import itertools

    flags = [True, False, False, True, False, False, False]
    for k in range(1, 8):
        subsets = list(itertools.combinations(flags, k))
        assert pass_at_k(7, 2, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_rejects_bad_input():
    for n, c, k in ((4, 1, 5), (4, 5, 1), (0, 0, 1), (4, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_at_k():
    assert mean_at_k(8, 2, 4) == 0.25


def test_maj_at_k_hand_values():
    answers = ["5", "5", "7", None]
    correct = [True, True, False, False]
    # k = 4 (one subset): "5" x2 beats "7": 1.0
    assert maj_at_k(answers, correct, 4) == 1.0
    # k = 1: four subsets, correct only for the two "5"s: 2/4
    assert maj_at_k(answers, correct, 1) == 0.5
    # k = 2: six pairs: {5,5} -> 1; {5,7} x2 -> tie -> 1/2 each; {5,None} x2 -> 1; {7,None} -> 0
    assert maj_at_k(answers, correct, 2) == pytest.approx((1 + 0.5 + 0.5 + 1 + 1 + 0) / 6)
    assert maj_at_k([None, None], [False, False], 2) == 0.0


def test_maj_at_k_wrong_majority_and_sampled_subsets():
    answers = ["1"] * 3 + ["2"] * 5
    correct = [True] * 3 + [False] * 5
    assert maj_at_k(answers, correct, 8) == 0.0  # the majority is wrong
    # k = 3: correct iff at least 2 of the 3 are "1": (C(3,2) C(5,1) + C(3,3)) / C(8,3) = 16/56
    assert maj_at_k(answers, correct, 3) == pytest.approx(16 / 56)
    # 20 random subsets (seeded) instead of all 56: each scores 0 or 1, so the mean is a multiple of
    # 1/20, which 16/56 is not; counted by hand over the same draws
    sampled = maj_at_k(answers, correct, 3, max_subsets=20, seed=0)
    draws = random.Random(0)
    subsets = [draws.sample(range(8), 3) for _ in range(20)]
    assert sampled == sum(sum(i < 3 for i in subset) >= 2 for subset in subsets) / 20
    assert sampled * 20 == pytest.approx(round(sampled * 20)) and sampled != pytest.approx(16 / 56)
    assert sampled == pytest.approx(16 / 56, abs=0.25)


def test_bootstrap_interval_covers_the_mean_at_the_stated_rate():
    # Bernoulli(0.3) samples of 100 problems: the 95% interval should contain 0.3 in ~95% of trials.
    rng = random.Random(1)
    covered = 0
    trials = 100
    for trial in range(trials):
        values = [float(rng.random() < 0.3) for _ in range(100)]
        low, high = bootstrap_ci(values, resamples=300, seed=trial)
        covered += low <= 0.3 <= high
    # Coverage over 100 trials has sd 2.2 points: 88% .. 100% is 3 sd below and everything above.
    assert 0.88 <= covered / trials <= 1.0
    # Its width is about 2 * 1.96 * sqrt(0.3 * 0.7 / 200) = 0.127
    low, high = bootstrap_ci([float(rng.random() < 0.3) for _ in range(200)])
    assert high - low == pytest.approx(0.127, abs=0.03)


def test_bootstrap_of_a_constant_is_that_constant():
    assert bootstrap_ci([0.5] * 10) == (0.5, 0.5)


def test_the_bootstrap_interval_is_the_2_5_and_97_5_percent_order_statistics():
    values = [float(2 ** i) for i in range(10)]  # every resample's mean is distinct
    draws = random.Random(0)
    means = sorted(sum(values[draws.randrange(10)] for _ in range(10)) / 10 for _ in range(200))
    # floor(0.025 x 200) = 5 and ceil(0.975 x 200) - 1 = 194, not their neighbours
    assert means[5] != means[10] and means[194] not in (means[195], means[189])
    assert bootstrap_ci(values, resamples=200, seed=0) == (means[5], means[194])
