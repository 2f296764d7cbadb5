"""Rewards: answer extraction, math equivalence, format checks, composition, registry."""

from __future__ import annotations

import math
import sys
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

from reasonrl.rewards import (
    EXTRACTORS,
    REWARDS,
    FormatReward,
    MathReward,
    RewardError,
    WeightedReward,
    build_reward,
    extract_answer,
    math_equal,
)
from reasonrl.types import Problem

PROBLEM = Problem(id="p7", prompt="What is 1/2?", answer="\\frac{1}{2}")


@pytest.mark.parametrize(
    ("text", "mode", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "boxed", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{ {2}+\\sqrt{3} }", "boxed", "{2}+\\sqrt{3}"),
        ("\\fbox{42}", "boxed", "42"),
        ("\\boxed{\\{1, 2\\}}", "boxed", "\\{1, 2\\}"),
        ("\\boxed{3} and a truncated \\boxed{\\frac{1}{", "boxed", "3"),
        ("no box here", "boxed", None),
        ("\\boxed{ }", "boxed", None),
        ("<answer>1</answer> <answer>\n 7/8 \n</answer>", "answer_tag", "7/8"),
        ("<answer>unclosed", "answer_tag", None),
        ("work\n#### 1,234\nextra", "gsm8k", "1234"),
        ("#### -5", "gsm8k", "-5"),
        ("a 1 b -12 c", "last_number", "-12"),
        ("pay 1,234 dollars", "last_number", "1234"),
        ("ratio 3/4 then 3.5", "last_number", "3.5"),
        ("ratio is 3/4", "last_number", "3/4"),
        ("from 3-4", "last_number", "4"),
        ("the set 1,2,3", "last_number", "3"),
        ("nothing numeric", "last_number", None),
        ("The answer is $\\frac{1}{2}$. Done.", "answer_phrase", "\\frac{1}{2}"),
        ("So the final answer is 3.5.", "answer_phrase", "3.5"),
        # auto: boxed beats answer tag beats gsm8k beats phrase beats last number
        ("<answer>1</answer> \\boxed{2}", "auto", "2"),
        ("#### 5 <answer>4</answer>", "auto", "4"),
        ("The answer is 9\n#### 8", "auto", "8"),
        ("2 + 2: the answer is x+1. Then 4", "auto", "x+1"),
        ("it is 17 or 18", "auto", "18"),
        ("", "auto", None),
    ],
)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_extract_answer_rejects_unknown_mode():
    with pytest.raises(ValueError, match="last_number"):
        extract_answer("1", "bogus")


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("1/2", "0.5"),
        ("3", "3.0"),
        ("1,234", "1234"),
        ("-2", "-2.000"),
        ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
        ("x+1", "1+x"),
    ],
)
def test_math_equal_true(prediction, gold):
    assert math_equal(prediction, gold)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [("3", "4"), (None, "3"), ("", "3"), ("  ", "3"), ("1,2", "12"), ("\\frac{1}{3}", "0.5")],
)
def test_math_equal_false(prediction, gold):
    assert not math_equal(prediction, gold)


def test_math_equal_from_threads():
    cases = [("\\frac{3}{4}", "0.75", True), ("x^2", "x \\cdot x", True), ("2/3", "0.6", False)]
    cases += [("7", "7.0", True)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: math_equal(c[0], c[1]), cases * 3))
    assert results == [expected for _, _, expected in cases] * 3


def test_math_reward():
    assert MathReward()("thus \\boxed{0.5}", PROBLEM) == 1.0
    assert MathReward()("thus \\boxed{0.4}", PROBLEM) == 0.0
    assert MathReward()("I do not know", PROBLEM) == 0.0
    assert MathReward(extract="answer_tag")("\\boxed{0.5}", PROBLEM) == 0.0
    assert MathReward(extract="answer_tag")("<answer>1/2</answer>", PROBLEM) == 1.0


def test_numeric_answers_refuse_a_restated_question():
    # math-verify evaluates "74 + 20" to 94; a problem that wants a number must not accept it.
    numeric = Problem(id="s", prompt="What is 74 + 20?", answer="94", metadata={"answer_type": "number"})
    free = Problem(id="s", prompt="What is 74 + 20?", answer="94")
    assert MathReward()("74 + 20 = \\boxed{74 + 20}", numeric) == 0.0
    assert MathReward()("74 + 20 = \\boxed{74 + 20}", free) == 1.0
    assert MathReward()("74 + 20 = \\boxed{94}", numeric) == 1.0
    assert MathReward()("so it is 94.0", numeric) == 1.0
    assert MathReward()("no idea", numeric) == 0.0


def test_math_reward_rejects_unknown_extractor():
    with pytest.raises(ValueError, match="allowed.*boxed"):
        MathReward(extract="first_number")
    assert "auto" in EXTRACTORS


@pytest.mark.parametrize(
    ("style", "completion", "expected"),
    [
        ("boxed", "so \\boxed{4}", 1.0),
        ("boxed", "so \\boxed{}", 0.0),
        ("boxed", "so 4", 0.0),
        ("answer_tag", "x <answer>4</answer> y", 1.0),
        ("answer_tag", "<answer></answer>", 0.0),
        ("think_answer", " <think>a\nb</think>\n<answer>4</answer>\n", 1.0),
        ("think_answer", "<think>a</think><answer>4</answer> trailing", 0.0),
        ("think_answer", "<answer>4</answer>", 0.0),
        ("think_answer", "<think>a</think><answer>4</answer><answer>5</answer>", 0.0),
    ],
)
def test_format_reward(style, completion, expected):
    assert FormatReward(style=style)(completion, PROBLEM) == expected


def test_format_reward_rejects_unknown_style():
    with pytest.raises(ValueError, match="think_answer"):
        FormatReward(style="xml")


def test_weighted_reward_totals():
    reward = WeightedReward(
        {"correct": (MathReward(), 1.0), "format": (FormatReward("think_answer"), 0.1)}
    )
    assert reward.names == ("correct", "format")
    assert reward.score("<think>hm</think><answer>1/2</answer>", PROBLEM) == (
        pytest.approx(1.1),
        {"correct": 1.0, "format": 1.0},
    )
    assert reward.score("<think>hm</think><answer>2</answer>", PROBLEM) == (
        pytest.approx(0.1),
        {"correct": 0.0, "format": 1.0},
    )
    assert reward.score("the answer is 0.5", PROBLEM) == (1.0, {"correct": 1.0, "format": 0.0})
    assert reward("nothing", PROBLEM) == 0.0


def test_weighted_reward_raising_component_is_an_error():
    def broken(completion: str, problem: Problem) -> float:
        raise KeyError("missing")

    reward = WeightedReward({"correct": (MathReward(), 1.0), "judge": (broken, 0.5)})
    completion = "my answer " + "x" * 2000
    with pytest.raises(RewardError) as info:
        reward.score(completion, PROBLEM)
    message = str(info.value)
    assert "'judge'" in message and "'p7'" in message and "\\\\frac{1}{2}" in message
    assert "my answer xxx" in message and "1510 more chars" in message
    assert len(message) < 1000
    assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("bad_value", [math.nan, math.inf, "1.0", None])
def test_weighted_reward_rejects_non_finite_or_non_numbers(bad_value):
    reward = WeightedReward({"odd": (lambda completion, problem: bad_value, 1.0)})
    with pytest.raises(RewardError, match="'odd'.*finite number"):
        reward.score("done", PROBLEM)


def test_weighted_reward_rejects_bad_weights():
    with pytest.raises(ValueError, match="'format'"):
        WeightedReward({"format": (FormatReward(), math.nan)})
    with pytest.raises(ValueError, match="not finite"):
        WeightedReward({"format": (FormatReward(), 10**400)})  # past float's range: no OverflowError
    with pytest.raises(ValueError):
        WeightedReward({})


def test_build_reward_from_registry():
    assert {"math", "format", "majority_vote", "overlong", "cosine_length", "repetition"} <= set(REWARDS)
    assert build_reward("math", extract="boxed") == MathReward(extract="boxed")
    assert build_reward("format") == FormatReward()


def test_build_reward_from_dotted_path(monkeypatch):
    def length_reward(completion: str, problem: Problem) -> float:
        return float(len(completion))

    def make_prefix_reward(prefix: str):
        return lambda completion, problem: float(completion.startswith(prefix))

    module = types.ModuleType("user_rewards")
    module.length_reward = length_reward
    module.make_prefix_reward = make_prefix_reward
    monkeypatch.setitem(sys.modules, "user_rewards", module)

    assert build_reward("user_rewards:length_reward") is length_reward
    assert build_reward("user_rewards:make_prefix_reward", prefix="ok")("ok!", PROBLEM) == 1.0
    assert build_reward("reasonrl.rewards.math:MathReward", extract="gsm8k").extract == "gsm8k"


def test_build_reward_unknown_names_fail_loudly():
    with pytest.raises(ValueError, match=r"unknown reward 'maths'; allowed: .*format, .*math, .*'package\.module:function' or 'path/to/file\.py:function'"):
        build_reward("maths")
    with pytest.raises(ValueError, match="has no attribute 'no_such_reward'"):
        build_reward("reasonrl.rewards.math:no_such_reward")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        build_reward("no_such_module_xyz:fn")


def test_gated_component_counts_only_when_its_gate_scores_and_reuses_the_gate_value():
    calls = {"correct": 0, "format": 0}

    def correct(completion, problem):
        calls["correct"] += 1
        return 1.0 if "42" in completion else 0.0

    def formatted(completion, problem):
        calls["format"] += 1
        return 1.0 if "\\boxed" in completion else 0.0

    # format listed first: the gate must still be scored before it.
    reward = WeightedReward({"format": (formatted, 0.1), "correct": (correct, 1.0)}, gates={"format": "correct"})
    assert reward.score("\\boxed{42}", PROBLEM) == (1.1, {"correct": 1.0, "format": 1.0})
    assert reward.score("\\boxed{41}", PROBLEM) == (0.0, {"correct": 0.0, "format": 0.0})
    assert reward.score("42", PROBLEM) == (1.0, {"correct": 1.0, "format": 0.0})
    # correctness computed once per completion; format only where the answer was correct.
    assert calls == {"correct": 3, "format": 2}
    with pytest.raises(ValueError, match="both must be components"):
        WeightedReward({"format": (formatted, 0.1)}, gates={"format": "correct"})
