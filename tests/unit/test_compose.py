"""Reward composition: group and token-level components, gates, routing, failing verifiers."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.rewards import RewardError, WeightedReward, score_groups
from reasonrl.rewards.compose import RoutedReward
from reasonrl.training.estimation import _dense_token_rewards
from reasonrl.types import Completion, Group, Problem

PROBLEM = Problem(id="p1", prompt="2+2?", answer="4")


def completion(text: str, tokens: int | None = None) -> Completion:
    count = len(text) if tokens is None else tokens
    return Completion(token_ids=tuple(range(count)), text=text, logprobs=(0.0,) * count, finish_reason="stop")


class LengthPenalty:
    """-0.1 per token: a group reward that needs the completion's tokens."""

    def score_group(self, problem, completions):
        return [-0.1 * len(c.token_ids) for c in completions]


class StepScores:
    """A token-level reward: 0.5 on every token that is a newline, its count as the score."""

    def score_group(self, problem, completions):
        return [float(c.text.count("\n")) for c in completions]

    def score_tokens(self, problem, completions):
        return [[0.5 if ch == "\n" else 0.0 for ch in c.text] for c in completions]


def correct(text: str, problem: Problem) -> float:
    return float(text.strip().endswith(problem.answer))


def test_group_component_sums_with_plain_ones():
    reward = WeightedReward({"correct": (correct, 1.0), "length": (LengthPenalty(), 2.0)})
    scores = reward.score_group(PROBLEM, [completion("4"), completion("so 4"), completion("5")])
    # totals: 1 - 2*0.1*1 = 0.8; 1 - 2*0.1*4 = 0.2; 0 - 2*0.1*1 = -0.2
    assert scores.totals == pytest.approx((0.8, 0.2, -0.2))
    assert scores.components["length"] == pytest.approx((-0.1, -0.4, -0.1))
    assert scores.token_rewards is None


def test_gated_group_component_is_zero_where_the_gate_fails():
    reward = WeightedReward({"correct": (correct, 1.0), "length": (LengthPenalty(), 1.0)}, gates={"length": "correct"})
    scores = reward.score_group(PROBLEM, [completion("4"), completion("5")])
    assert scores.components["length"] == pytest.approx((-0.1, 0.0))
    assert scores.totals == pytest.approx((0.9, 0.0))


def test_token_rewards_put_scalar_components_on_the_last_token():
    reward = WeightedReward({"correct": (correct, 1.0), "steps": (StepScores(), 2.0)})
    scores = reward.score_group(PROBLEM, [completion("a\nb\n4"), completion("5")])
    # completion 0: newlines at 1 and 3 carry 2 * 0.5 = 1.0; the correctness 1.0 sits on token 4.
    assert scores.token_rewards[0] == pytest.approx((0.0, 1.0, 0.0, 1.0, 1.0))
    assert scores.token_rewards[1] == pytest.approx((0.0,))
    # per-completion totals use the token reward's own score: 1 + 2 * 2 newlines = 5
    assert scores.totals == pytest.approx((5.0, 0.0))


def test_dense_token_rewards_land_on_completion_positions():
    groups = score_groups([Group(problem=PROBLEM, prompt_ids=(9, 9), completions=(completion("a\n4"), completion("\n")))],
                          WeightedReward({"correct": (correct, 1.0), "steps": (StepScores(), 1.0)}))
    mask_NT = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0]], dtype=torch.float32)  # prompt of 2: loss from position 1
    assert _dense_token_rewards(groups, mask_NT).tolist() == [[0.0, 0.0, 0.5, 1.0], [0.0, 0.5, 0.0, 0.0]]


@pytest.mark.parametrize("bad", [[1.0], [1.0, math.inf], "12", None])
def test_group_reward_with_wrong_output_is_an_error(bad):
    class Bad:
        def score_group(self, problem, completions):
            return bad

    with pytest.raises(RewardError, match="'bad' on problem 'p1'"):
        WeightedReward({"bad": (Bad(), 1.0)}).score_group(PROBLEM, [completion("4"), completion("5")])


def test_token_reward_with_wrong_length_is_an_error():
    class Short(StepScores):
        def score_tokens(self, problem, completions):
            return [[0.0] for _ in completions]

    with pytest.raises(RewardError, match="expected 3 numbers"):
        WeightedReward({"steps": (Short(), 1.0)}).score_group(PROBLEM, [completion("abc")])


def test_routed_reward_sends_each_problem_to_its_verifier():
    routed = RoutedReward({"exact": correct, "length": LengthPenalty()}, default="exact")
    tagged = Problem(id="p2", prompt="x", answer="4", metadata={"verifier": "length"})
    assert routed.score_group(PROBLEM, [completion("4"), completion("5")]) == [1.0, 0.0]
    assert routed.score_group(tagged, [completion("44")]) == pytest.approx([-0.2])
    unknown = Problem(id="p3", prompt="x", answer="4", metadata={"verifier": "judge"})
    with pytest.raises(RewardError, match="names verifier 'judge'.*known: exact, length"):
        WeightedReward({"correct": (routed, 1.0)}).score_group(unknown, [completion("4")])
    with pytest.raises(ValueError, match="default 'nope'"):
        RoutedReward({"exact": correct}, default="nope")
    null = Problem(id="p4", prompt="x", answer="4", metadata={"verifier": None})  # a mixed export's empty cell
    assert routed.score_group(null, [completion("4")]) == [1.0]
    by_problem = RoutedReward({"exact": correct, "length": LengthPenalty()}, default=lambda p: "length")
    assert by_problem.score_group(PROBLEM, [completion("44")]) == pytest.approx([-0.2])


def test_failing_group_is_skipped_or_stops():
    def fragile(text: str, problem: Problem) -> float:
        if problem.id == "bad":
            raise ZeroDivisionError("verifier bug")
        return 1.0

    groups = [Group(problem=Problem(id=pid, prompt="q", answer="1"), prompt_ids=(1,), completions=(completion("1"),))
              for pid in ("ok", "bad")]
    reward = WeightedReward({"correct": (fragile, 1.0)})
    with pytest.raises(RewardError, match="'correct' on problem 'bad'.*ZeroDivisionError: verifier bug"):
        score_groups(groups, reward)
    scored = score_groups(groups, reward, on_error="skip_group")
    assert scored[0].rewards == (1.0,) and scored[0].reward_error is None
    assert scored[1].rewards is None and "ZeroDivisionError: verifier bug" in scored[1].reward_error
    with pytest.raises(ValueError, match="on_error"):
        score_groups(groups, reward, on_error="zero")


@pytest.mark.parametrize("value", [1e308, -1e308, 3e38, 1e16])
def test_a_reward_whose_statistics_would_overflow_is_an_error_naming_the_sample(value):
    """Finite, but the group's mean and std (float32, as the advantages use) would be inf and NaN."""
    def huge_for_b(text, problem):
        return value if text == "b" else 0.0

    reward = WeightedReward({"huge": (huge_for_b, 1.0)})
    with pytest.raises(RewardError, match=r"reward component 'huge' .*completion 'b'.* would overflow.*scale it down"):
        reward.score_group(PROBLEM, [completion("a"), completion("b")])

    class HugeGroup:
        def score_group(self, problem, completions):
            return [0.0, value, 0.0]

    with pytest.raises(RewardError, match=r"'group' .*completion 'y'.* would overflow"):
        WeightedReward({"group": (HugeGroup(), 1.0)}).score_group(PROBLEM, [completion(t) for t in "xyz"])


def test_weights_that_make_the_total_overflow_are_an_error():
    reward = WeightedReward({"a": (lambda text, problem: 1e14, 20.0), "b": (correct, 1.0)})
    with pytest.raises(RewardError, match=r"weighted total.* would overflow"):
        reward.score_group(PROBLEM, [completion("4")])
    fine = WeightedReward({"a": (lambda text, problem: 1e14, 2.0)}).score_group(PROBLEM, [completion("4")])
    assert fine.totals == (2e14,)
    assert torch.tensor([2e14, -2e14]).std().isfinite()
