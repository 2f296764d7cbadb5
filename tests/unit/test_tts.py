"""Test-time scaling selectors on scripted samples whose answers are known, against hand-computed values."""

from __future__ import annotations

import pytest

from reasonrl.eval.metrics import maj_at_k, pass_at_k
from reasonrl.eval.tts import Sample, best_of_n, expected_credit, majority, scaling_curve, weighted_majority

# The gold answer is "5". Two right, three wrong ("7" x2, "9"); the reward model likes the "9" best.
POOL = [
    Sample("5", True, score=0.6, weight=0.9, tokens=10),
    Sample("7", False, score=0.2, weight=0.2, tokens=20),
    Sample("5", True, score=0.7, weight=0.8, tokens=10),
    Sample("7", False, score=0.1, weight=0.3, tokens=30),
    Sample("9", False, score=0.9, weight=0.1, tokens=30),
]


def test_selectors_on_the_whole_pool():
    everyone = range(5)
    assert majority(POOL, everyone) == 0.5  # "5" and "7" tie at 2 votes: half credit
    assert weighted_majority(POOL, everyone) == 1.0  # "5": 1.7, "7": 0.5, "9": 0.1
    assert best_of_n(POOL, everyone) == 0.0  # the reward model picks the wrong "9"
    assert best_of_n(POOL, [0, 1, 2, 3]) == 1.0  # without it: score 0.7, a "5"


def test_majority_matches_maj_at_k():
    answers, correct = [s.answer for s in POOL], [s.correct for s in POOL]
    for k in range(1, 6):
        assert expected_credit(POOL, k, majority) == pytest.approx(maj_at_k(answers, correct, k))


def test_best_of_n_by_hand_at_budget_2():
    # 10 pairs. Best-of-2 picks the higher score: correct when that sample is a "5".
    # Pairs with the "9" (score 0.9): 4, all wrong. Pair of the two "5"s: right. A "5" with a "7": the
    # "5" has the higher score (0.6/0.7 > 0.2/0.1): 4 pairs right. The "7" pair: wrong. 5/10.
    assert expected_credit(POOL, 2, best_of_n) == pytest.approx(0.5)


def test_scaling_curve_rows_and_pass_at_k():
    rows = scaling_curve([POOL, POOL], "pass", [1, 2, 5])
    assert [row["budget"] for row in rows] == [1.0, 2.0, 5.0]
    for row in rows:
        assert row["accuracy"] == pytest.approx(pass_at_k(5, 2, int(row["budget"])))
        assert row["tokens"] == pytest.approx(row["budget"] * 20.0)  # mean length (10+20+10+30+30)/5


def test_curve_errors():
    with pytest.raises(ValueError, match="unknown test-time scaling method"):
        scaling_curve([POOL], "beam", [1])
    with pytest.raises(ValueError, match="budget 6"):
        scaling_curve([POOL], "majority", [6])


def test_best_of_n_gives_a_score_tie_the_share_of_its_correct_samples():
    pool = [Sample("3", False, score=0.9), Sample("5", True, score=0.9), Sample("7", False, score=0.1)]
    assert best_of_n(pool, [0, 1, 2]) == 0.5
    assert best_of_n(pool, [1, 0]) == 0.5
