"""Shaping rewards against values worked out by hand from the papers' equations."""

from __future__ import annotations

import math

import pytest

from reasonrl.rewards import FormatReward, MathReward, WeightedReward
from reasonrl.rewards.shaping import (
    ClippedReward,
    CosineLengthReward,
    RepetitionPenalty,
    SoftOverlongPunishment,
    cosine_schedule,
    repeated_fraction,
)
from reasonrl.types import Completion, Problem

PROBLEM = Problem(id="half", prompt="What is 1/2?", answer="\\frac{1}{2}")


def completion(length: int = 0, text: str = "", finish: str = "stop", token_ids: tuple[int, ...] | None = None):
    ids = tuple(range(length)) if token_ids is None else token_ids
    return Completion(token_ids=ids, text=text, logprobs=(0.0,) * len(ids), finish_reason=finish)


# --- DAPO soft overlong punishment (eq. 13) --------------------------------------------------------

@pytest.mark.parametrize(
    ("length", "expected"),
    [
        # L_max = 10, L_cache = 4, so L_max - L_cache = 6.
        (0, 0.0),
        (6, 0.0),        # |y| <= 6: no penalty (boundary included)
        (7, -0.25),      # (6 - 7) / 4
        (9, -0.75),      # (6 - 9) / 4
        (10, -1.0),      # (6 - 10) / 4 = -1 at |y| = L_max: continuous with the last case
        (11, -1.0),      # |y| > L_max
        (500, -1.0),
    ],
)
def test_soft_overlong_punishment_matches_dapo_eq_13(length, expected):
    reward = SoftOverlongPunishment(max_length=10, cache_length=4)
    assert reward.score_group(PROBLEM, [completion(length, "x" * length)]) == [pytest.approx(expected)]


def test_soft_overlong_punishment_scores_each_completion_of_a_group():
    reward = SoftOverlongPunishment(max_length=20, cache_length=10)
    # threshold 10: lengths 5, 15, 20, 21 -> 0, (10 - 15) / 10, (10 - 20) / 10, -1
    group = [completion(n, "x") for n in (5, 15, 20, 21)]
    assert reward.score_group(PROBLEM, group) == pytest.approx([0.0, -0.5, -1.0, -1.0])


@pytest.mark.parametrize(("max_length", "cache_length"), [(10, 0), (10, 11), (10, -1)])
def test_soft_overlong_punishment_rejects_bad_lengths(max_length, cache_length):
    with pytest.raises(ValueError, match="cache_length"):
        SoftOverlongPunishment(max_length=max_length, cache_length=cache_length)


def test_length_rewards_refuse_text_only_completions():
    text_only = Completion(token_ids=(), text="a long answer", logprobs=(), finish_reason="stop")
    with pytest.raises(ValueError, match="no token ids"):
        SoftOverlongPunishment(max_length=10, cache_length=4).score_group(PROBLEM, [text_only])
    with pytest.raises(ValueError, match="no token ids"):
        CosineLengthReward(max_length=10).score_group(PROBLEM, [text_only])
    with pytest.raises(ValueError, match="no token ids"):
        RepetitionPenalty(ngram_size=2).score_group(PROBLEM, [text_only])


# --- Cosine length reward (Yeo et al. 2025) -------------------------------------------------------

def test_cosine_schedule_end_points_and_middle():
    # at_max + 1/2 (at_zero - at_max)(1 + cos(pi t / T))
    assert cosine_schedule(0, 100, 2.0, 1.0) == pytest.approx(2.0)     # cos 0 = 1 -> at_zero
    assert cosine_schedule(100, 100, 2.0, 1.0) == pytest.approx(1.0)   # cos pi = -1 -> at_max
    assert cosine_schedule(50, 100, 2.0, 1.0) == pytest.approx(1.5)    # cos pi/2 = 0 -> midpoint


@pytest.mark.parametrize(
    ("length", "text", "expected"),
    [
        # L_max = 100, paper defaults r0c = 2, rLc = 1, r0w = -10, rLw = 0, re = -10.
        # correct, L = 25: 1 + 0.5 * (2 - 1) * (1 + cos(pi / 4)) = 1 + 0.5 * 1.70710678 = 1.85355339
        (25, "so \\boxed{0.5}", 1.85355339),
        # correct, L = 50: 1 + 0.5 * 1 * (1 + 0) = 1.5
        (50, "so \\boxed{1/2}", 1.5),
        # correct, L = 99: 1 + 0.5 * (1 + cos(0.99 pi)) = 1 + 0.5 * (1 - 0.99950656) = 1.00024672
        (99, "so \\boxed{0.5}", 1.00024672),
        # wrong, L = 25: 0 + 0.5 * (-10 - 0) * (1 + cos(pi / 4)) = -5 * 1.70710678 = -8.53553391
        (25, "so \\boxed{3}", -8.53553391),
        # wrong, L = 50: -5 * (1 + 0) = -5
        (50, "so \\boxed{3}", -5.0),
        # wrong, L = 75: -5 * (1 + cos(3 pi / 4)) = -5 * 0.29289322 = -1.46446609
        (75, "no answer at all", -1.46446609),
        # L = L_max: cut off at the limit -> r_e, whatever the answer
        (100, "so \\boxed{0.5}", -10.0),
    ],
)
def test_cosine_length_reward_matches_hand_values(length, text, expected):
    reward = CosineLengthReward(max_length=100)
    assert reward.score_group(PROBLEM, [completion(length, text)]) == [pytest.approx(expected, abs=1e-7)]


def test_cosine_length_reward_penalises_truncation_without_checking_correctness():
    calls = []

    def correct(text: str, problem: Problem) -> float:
        calls.append(text)
        return 1.0

    reward = CosineLengthReward(max_length=100, correct=correct, exceed_penalty=-3.0)
    group = [completion(10, "cut", finish="length"), completion(10, "done")]
    # truncated -> r_e = -3; finished, correct, L = 10: 1 + 0.5 * (1 + cos(pi / 10)) = 1 + 0.5 * 1.95105652
    assert reward.score_group(PROBLEM, group) == pytest.approx([-3.0, 1.97552826])
    assert calls == ["done"]


def test_cosine_length_reward_orders_lengths_as_the_paper_intends():
    reward = CosineLengthReward(max_length=1000)
    short_right, long_right = (reward.score(completion(n, "\\boxed{0.5}"), PROBLEM) for n in (100, 900))
    short_wrong, long_wrong = (reward.score(completion(n, "\\boxed{7}"), PROBLEM) for n in (100, 900))
    assert short_right > long_right > 0 > long_wrong > short_wrong


def test_cosine_length_reward_custom_constants_and_validation():
    reward = CosineLengthReward(max_length=4, correct=MathReward(extract="boxed"), r0_correct=1.0, rL_correct=0.5,
                                r0_wrong=-1.0, rL_wrong=-0.5)
    # correct, L = 2 of 4: 0.5 + 0.5 * 0.5 * (1 + 0) = 0.75; wrong (the answer tag is not read): -0.5 - 0.25 = -0.75
    assert reward.score_group(PROBLEM, [completion(2, "\\boxed{0.5}"), completion(2, "<answer>0.5</answer>")]) == [
        pytest.approx(0.75), pytest.approx(-0.75)]
    with pytest.raises(ValueError, match="max_length"):
        CosineLengthReward(max_length=0)
    with pytest.raises(ValueError, match="finite"):
        CosineLengthReward(max_length=4, r0_wrong=-math.inf)


# --- Repetition penalty (Yeo et al. 2025) --------------------------------------------------------

def test_repeated_fraction_counts_repeat_occurrences():
    # trigrams of 1 2 3 1 2 3: (1,2,3) (2,3,1) (3,1,2) (1,2,3): 4 in all, 3 distinct -> 1 - 3/4
    assert repeated_fraction([1, 2, 3, 1, 2, 3], 3) == pytest.approx(0.25)
    # all bigrams of 5 5 5 5 are (5,5): 3 in all, 1 distinct -> 1 - 1/3
    assert repeated_fraction([5, 5, 5, 5], 2) == pytest.approx(2 / 3)
    assert repeated_fraction([1, 2, 3, 4], 2) == 0.0   # no repeats
    assert repeated_fraction([1, 2], 3) == 0.0         # fewer units than n: no n-grams, no penalty
    assert repeated_fraction([], 1) == 0.0


def test_repetition_penalty_over_tokens():
    reward = RepetitionPenalty(ngram_size=3, max_penalty=-0.5)
    group = [completion(token_ids=(1, 2, 3, 1, 2, 3), text="x"), completion(token_ids=(1, 2, 3, 4), text="y"),
             completion(token_ids=(7, 7), text="z")]
    # -0.5 * 0.25 = -0.125; no repeated trigram -> 0; two tokens have no trigram -> 0
    assert reward.score_group(PROBLEM, group) == pytest.approx([-0.125, 0.0, 0.0])


def test_repetition_penalty_over_words_ignores_tokens_and_case():
    reward = RepetitionPenalty(ngram_size=2, max_penalty=-0.3, unit="words")
    # words: the cat the cat -> bigrams (the,cat) (cat,the) (the,cat): 3 in all, 2 distinct -> 1/3 * -0.3 = -0.1
    text_only = Completion(token_ids=(), text="The cat  the\ncat", logprobs=(), finish_reason="stop")
    assert reward.score_group(PROBLEM, [text_only]) == [pytest.approx(-0.1)]


@pytest.mark.parametrize(
    ("options", "message"),
    [({"max_penalty": 0.5}, "max_penalty"), ({"max_penalty": math.nan}, "max_penalty"),
     ({"ngram_size": 0}, "ngram_size"), ({"unit": "chars"}, "unit")],
)
def test_repetition_penalty_rejects_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        RepetitionPenalty(**options)


def test_repetition_penalty_defaults_follow_the_paper():
    reward = RepetitionPenalty()
    assert (reward.ngram_size, reward.max_penalty, reward.unit) == (40, -1.0, "tokens")
    # 41 identical tokens: two 40-grams, both (0,)*40 -> 1 - 1/2 = 0.5 -> -0.5
    assert reward.score_group(PROBLEM, [completion(token_ids=(0,) * 41, text="x")]) == [pytest.approx(-0.5)]


# --- Clipping guard ------------------------------------------------------------------------------

class FixedScores:
    def __init__(self, scores):
        self.scores = scores

    def score_group(self, problem, completions):
        return self.scores


def test_clipped_reward_bounds_group_and_plain_rewards():
    group = [completion(1, "a"), completion(1, "b"), completion(1, "c")]
    assert ClippedReward(FixedScores([5.0, -3.0, 0.5]), low=-1.0, high=1.0).score_group(PROBLEM, group) == [
        1.0, -1.0, 0.5]
    lengths = ClippedReward(lambda text, problem: 10.0 * len(text), low=0.0, high=15.0)
    assert lengths.score_group(PROBLEM, [completion(1, "a"), completion(1, "ab")]) == [10.0, 15.0]


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, "1.0", None])
def test_clipped_reward_raises_on_non_finite_instead_of_clipping(bad):
    reward = ClippedReward(FixedScores([0.0, bad]), low=-1.0, high=1.0)
    with pytest.raises(ValueError, match="finite number"):
        reward.score_group(PROBLEM, [completion(1, "a"), completion(1, "b")])


def test_clipped_reward_validates_bounds_and_composes():
    with pytest.raises(ValueError, match="low <= high"):
        ClippedReward(MathReward(), low=1.0, high=0.0)
    with pytest.raises(ValueError, match="low <= high"):
        ClippedReward(MathReward(), low=-math.inf, high=0.0)
    total = WeightedReward({"correct": (MathReward(), 1.0),
                            "length": (ClippedReward(SoftOverlongPunishment(10, 4), low=-0.5, high=0.0), 1.0)})
    # correct (1) + overlong at |y| = 9: (6 - 9) / 4 = -0.75, clipped to -0.5 -> 0.5
    scores = total.score_group(PROBLEM, [completion(9, "\\boxed{0.5}")])
    assert scores.totals == (pytest.approx(0.5),)
    assert scores.components["length"] == (-0.5,)


# --- think/answer format: cases test_rewards.py does not cover ------------------------------------

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\nstep 1\n\nstep 2\n</think>\n\n<answer>\n4\n</answer>", 1.0),   # multi-line content
        ("<think></think><answer>4</answer>", 1.0),                                 # empty reasoning is allowed
        ("so <think>a</think><answer>4</answer>", 0.0),                             # text before the tags
        ("<answer>4</answer><think>a</think>", 0.0),                                # tags in the wrong order
        ("<think>a<think>b</think></think><answer>4</answer>", 0.0),                # nested think
        ("<think>a</think><think>b</think><answer>4</answer>", 0.0),                # two think blocks
        ("<think>a</think>between<answer>4</answer>", 0.0),                         # text between the blocks
        ("<think>a</think><answer>4", 0.0),                                         # unclosed answer
        ("<think>a<answer>4</answer>", 0.0),                                        # unclosed think
        ("<THINK>a</THINK><ANSWER>4</ANSWER>", 0.0),                                # tags are case-sensitive
        ("<think>a</think><answer> \n </answer>", 0.0),                             # an empty answer earns nothing
    ],
)
def test_think_answer_format_edge_cases(text, expected):
    assert FormatReward(style="think_answer")(text, PROBLEM) == expected
