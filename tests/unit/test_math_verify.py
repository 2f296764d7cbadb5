"""The math verifier: answer extraction, an equivalence table run through math_equal, thread safety, and the
process pool's per-check timeout (reasonrl.rewards.math)."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from reasonrl.rewards import bounded, equivalence, symbolic
from reasonrl.rewards import math as verifier
from reasonrl.rewards.math import (
    EXTRACTORS,
    PooledMathReward,
    boxed_contents,
    check_many,
    extract_answer,
    extract_answer_phrase,
    extract_answer_tag,
    extract_boxed,
    extract_gsm8k,
    extract_last_number,
    math_equal,
)
from reasonrl.types import Completion, Problem

# --- extraction ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{\\frac{1}{2}}{3}} done", ["\\frac{\\frac{1}{2}}{3}"]),
        ("\\boxed{\\{1, \\{2\\}\\}}", ["\\{1, \\{2\\}\\}"]),
        ("first \\boxed 5 then \\boxed{6}", ["5", "6"]),
        ("$\\boxed -3$", ["-3"]),
        ("\\boxed{7} and \\boxed \\frac12.", ["7", "\\frac12."]),
        ("\\boxed {x+1}", ["x+1"]),  # a space before the brace is still the braced form
        ("\\boxed{unclosed", []),
        ("\\boxedx 5", []),  # another macro, not \boxed
    ],
)
def test_boxed_contents_nested_and_unbraced(text, expected):
    assert boxed_contents(text) == expected


@pytest.mark.parametrize(
    ("extractor", "text", "expected"),
    [
        (extract_boxed, "a \\boxed{1} b \\boxed{\\dfrac{2}{3}}", "\\dfrac{2}{3}"),
        (extract_boxed, "thus \\boxed 42", "42"),
        (extract_answer_tag, "<think>1</think><answer> (0,1] </answer>", "(0,1]"),
        (extract_gsm8k, "3 + 4 = 7\n#### 7", "7"),
        (extract_gsm8k, "#### 12,500 apples", "12500 apples"),
        (extract_answer_phrase, "So the answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
        (extract_answer_phrase, "Final answer: 12", "12"),
        (extract_answer_phrase, "**Final Answer:** 2\\sqrt{3}", "2\\sqrt{3}"),
        (extract_answer_phrase, "The final answer is 3.5. Thanks.", "3.5"),
        (extract_answer_phrase, "Answer: x = 5", "x = 5"),
        (extract_answer_phrase, "no phrase here 5", None),
        (extract_last_number, "speed of light 3e8 m/s", "3e8"),
        (extract_last_number, "it costs 1,500 dollars", "1500"),
        (extract_last_number, "-7 degrees", "-7"),
    ],
)
def test_each_extractor(extractor, text, expected):
    assert extractor(text) == expected


def test_auto_extraction_prefers_explicit_answers():
    assert extract_answer("Final answer: 4. \\boxed 9") == "9"
    assert extract_answer("<answer>2</answer> Final answer: 3") == "2"
    assert extract_answer("Final answer: 3, not 8") == "3, not 8"
    assert extract_answer("maybe 3, maybe 8") == "8"
    assert set(EXTRACTORS) == {"auto", "boxed", "answer_tag", "gsm8k", "answer_phrase", "last_number"}


# --- the equivalence table -------------------------------------------------------------------------------------------

EQUIVALENCE_TABLE = [
    # plain numbers (the fast path)
    ("3", "3.0", True),
    ("-2", "-2.000", True),
    ("1,234", "1234", True),
    ("1{,}234", "1234", True),
    ("10\\!000", "10000", True),
    ("10\\,000", "10000", True),
    ("1.5e3", "1500", True),
    ("2E-2", "0.02", True),
    ("1.5\\times 10^{3}", "1500", True),
    ("6.02 \\cdot 10^{23}", "6.02e23", True),
    ("3", "4", False),
    ("1,2", "12", False),
    ("1e999", "1e998", False),  # both overflow a float; must not compare inf == inf
    # fractions and decimals
    ("0.5", "\\frac{1}{2}", True),
    ("\\dfrac{1}{2}", "\\frac12", True),
    ("\\tfrac{3}{4}", "0.75", True),
    ("\\frac{\\frac{1}{2}}{3}", "\\frac{1}{6}", True),
    ("\\frac{1}{\\frac{2}{3}}", "1.5", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{1}{3}", "0.333333", True),  # math-verify rounds floats to 6 places
    ("\\frac{1}{3}", "0.333", False),
    ("\\frac{2}{3}", "\\frac{3}{2}", False),
    ("\\frac{1}{3}", "0.5", False),
    ("\\tfrac{1}{2}", "\\dfrac{1}{3}", False),
    ("\\frac{\\frac{1}{2}}{3}", "\\frac{1}{\\frac{2}{3}}", False),
    # roots, pi, powers
    ("\\sqrt{8}", "2\\sqrt{2}", True),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),
    ("2^{10}", "1024", True),
    ("2\\pi", "\\pi \\cdot 2", True),
    ("\\pi", "3.14", False),
    ("\\sqrt{2}", "1.414", False),
    ("2^{2023}", "2^{2023}", True),
    ("2^{2023}", "2^{2024}", False),
    # LaTeX noise
    ("\\left(\\frac{1}{2}\\right)", "0.5", True),
    ("\\left( 1, 2 \\right)", "(1,2)", True),
    ("\\displaystyle \\frac{1}{2}", "0.5", True),
    ("$\\frac{1}{2}$", "\\frac{1}{2}", True),
    ("  \\frac { 1 } { 2 } ", "0.5", True),
    ("90^\\circ", "90", True),
    ("90^{\\circ}", "90", True),
    ("90°", "90", True),
    ("45^\\circ", "90", False),
    # percent: the value, or an integer percentage with the sign dropped; never 0.5 vs 50
    ("50\\%", "0.5", True),
    ("0.5", "50\\%", True),
    ("50\\%", "50", True),
    ("50", "0.5", False),
    ("0.5\\%", "0.5", False),
    # units dropped where they cannot change the number
    ("5 cm", "5", True),
    ("5\\text{ cm}", "5", True),
    ("5\\text{ cm}^2", "5", True),
    ("\\$5", "5", True),
    ("$5", "5", True),
    ("\\$1,000.50", "1000.5", True),
    ("5 dollars", "5", True),
    ("3 apples", "3", True),
    ("5 dollars", "6", False),
    ("5 pi", "5", False),  # "pi" is mathematics, not a unit
    ("2x", "2", False),  # a variable is not a unit
    # sets, intervals, tuples
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("\\{1,2\\}", "{2,1}", True),
    ("1, 2", "\\{2,1\\}", True),
    ("\\{1,2\\}", "\\{1,3\\}", False),
    ("\\{1,2\\}", "(1,2)", False),  # a set is not a tuple (math-verify alone would say yes)
    ("(0,1]", "(0,1]", True),
    ("(0,1)", "(0,1]", False),
    ("[0,1)", "x \\in [0,1)", True),
    ("x \\in [0,1)", "[0,1)", True),
    ("(1,2)", "(1,2)", True),
    ("(2,1)", "(1,2)", False),
    ("(1, 2, 3)", "(1,2,3)", True),
    ("(1, 2, 3)", "(1,2)", False),
    ("\\emptyset", "\\{\\}", True),
    # equations and expressions
    ("x=5", "5", True),
    ("5", "x=5", True),
    ("x = 5", "x=5", True),
    ("y=5", "x=5", False),
    ("x=5", "x=6", False),
    ("x+1", "1+x", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2", "x \\cdot x", True),
    ("2", "2x", False),
    ("-\\infty", "\\infty", False),
    # matrices
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", True),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", True),
    ("\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", False),
    # no answer, or one too costly to check (size limits; see the module docstring)
    (None, "3", False),
    ("", "3", False),
    ("10^{10^{10}}", "5", False),  # a power tower: sympy would never finish parsing it
    ("(10^{6})!", "1", False),
    ("1" * 500, "1", False),
    # prose against a number: not equal, and sympy is not asked (see the tests below)
    ("correct! I will be happy to help you with more questions", "205", False),
    ("205", "she sold two hundred and five", False),
    ("5 apples", "5", True),  # one unit word: the number, as above
]


def test_the_table_is_big_and_balanced():
    assert len(EQUIVALENCE_TABLE) >= 60
    assert sum(expected for *_, expected in EQUIVALENCE_TABLE) >= 30
    assert sum(not expected for *_, expected in EQUIVALENCE_TABLE) >= 30


@pytest.mark.parametrize(("prediction", "gold", "expected"), EQUIVALENCE_TABLE)
def test_math_equal_table(prediction, gold, expected):
    assert math_equal(prediction, gold) is expected


def test_cost_refusals_name_the_limit():
    assert equivalence._cost_refusal("9^{9^{9^{9}}}") == "nested exponent"
    assert equivalence._cost_refusal("2^2^2") == "nested exponent"
    assert equivalence._cost_refusal("2^{100000}") == f"exponent above {equivalence.MAX_EXPONENT}"
    assert "factorial" in equivalence._cost_refusal("1000001!")
    assert equivalence._cost_refusal("(x^2)^3 + (n+1)! + 100000! + 2^{2023} + e^{i\\pi}") is None


@pytest.mark.parametrize("text", ["correct! I will be happy to help you with more questions", "twelve apples",
                                  "The answer is unknown.", "she said 'no', then left"])
def test_prose_against_a_number_is_decided_without_sympy(text, monkeypatch):
    monkeypatch.setattr(equivalence, "call_bounded", lambda *args: pytest.fail("sympy was asked"))
    assert math_equal(text, "205") is False
    assert math_equal("205", text) is False
    assert equivalence._quick_verdict(text, "205")[0] is False


@pytest.mark.parametrize("text", [
    "x", "ab",  # one word: a product of symbols sympy reads at once
    "pi e", "sin cos", "x times y",  # mathematics' own words
    "ii ii", "Ie ei",  # only e and i, which a parser may read as constants (E, I)
    "yes: yes", "Listen: silent",  # ":" is division to a LaTeX parser: 1
    "big - big", "a+b", "two 2", "\\text{five apples}", "(ab cd)",  # an operator, a digit, LaTeX, brackets
])
def test_what_is_not_prose_is_left_to_sympy(text):
    assert not equivalence._is_prose(text)


def test_prose_against_prose_or_an_expression_is_left_to_sympy(monkeypatch):
    asked = []
    monkeypatch.setattr(equivalence, "call_bounded", lambda handler, pair, *rest: asked.append(pair) or False)
    math_equal("no answer here", "still no answer")
    math_equal("no answer here", "x+1")
    assert len(asked) == 2


def test_identical_answers_match_even_beyond_the_limits():
    # The string comparison comes before the limits: a gold answer is always equal to itself.
    assert math_equal("10^{10^{10}}", "10^{10^{10}}")


# --- threads ---------------------------------------------------------------------------------------------------------


def test_math_equal_from_threads_matches_the_main_thread():
    pairs = [(prediction, gold) for prediction, gold, _ in EQUIVALENCE_TABLE]
    on_main = [math_equal(prediction, gold) for prediction, gold in pairs]
    symbolic.parse_latex.cache_clear()  # the threads must parse afresh, not read the main thread's cache
    seen_threads = set()

    def check(pair):
        seen_threads.add(threading.current_thread().name)
        assert threading.current_thread() is not threading.main_thread()
        return math_equal(*pair)

    with ThreadPoolExecutor(max_workers=4) as pool:
        on_threads = list(pool.map(check, pairs * 2))
    assert on_threads == on_main * 2
    assert on_main == [expected for *_, expected in EQUIVALENCE_TABLE]
    assert len(seen_threads) > 1


# --- the process pool ------------------------------------------------------------------------------------------------

# Passes the size limits, yet sympy spends far more than a second on it (over 15 s on a 2-core machine).
SLOW = ("\\sin(x)^{1000}+\\cos(x)^{1000}", "1")


@pytest.fixture(scope="module")
def pool_of_two():
    yield 2
    verifier.shutdown_pool()


def test_check_many_agrees_with_math_equal(pool_of_two):
    pairs = [(prediction, gold) for prediction, gold, _ in EQUIVALENCE_TABLE]
    assert check_many(pairs, workers=pool_of_two) == [expected for *_, expected in EQUIVALENCE_TABLE]
    assert check_many([], workers=pool_of_two) == []


def test_check_many_times_out_a_stuck_check_and_replaces_its_worker(pool_of_two):
    check_many([("x", "x+0")], workers=pool_of_two)  # the pool is up before the deadline starts counting
    pool = bounded.shared_pool(equivalence.SYMBOLIC)
    pids_before = [worker.process.pid for worker in pool.workers]
    replaced_before = pool.replaced
    pairs = [("\\frac{1}{2}", "0.5"), SLOW, ("x^2", "x \\cdot x"), ("\\{1,2\\}", "\\{2,3\\}"), ("y", "y")]
    assert check_many(pairs, workers=pool_of_two, timeout_s=1.0) == [True, False, True, False, True]
    assert pool.replaced == replaced_before + 1
    pids_after = [worker.process.pid for worker in pool.workers]
    assert len(pids_after) == 2 and len(set(pids_before) - set(pids_after)) == 1
    # The replacement works, and the pool is the same one: reused across calls.
    assert check_many([("\\dfrac{3}{4}", "0.75"), ("(1,2)", "(2,1)")], workers=pool_of_two) == [True, False]
    assert bounded.shared_pool(equivalence.SYMBOLIC) is pool


def test_check_many_from_threads(pool_of_two):
    pairs = [(f"\\frac{{{n}}}{{7}}", str(n / 7)) for n in range(1, 13)] + [("\\frac{1}{7}", "0.15")]
    with ThreadPoolExecutor(max_workers=3) as threads:
        results = list(threads.map(lambda chunk: check_many(chunk, workers=pool_of_two), [pairs, pairs, pairs]))
    assert results == [[True] * 12 + [False]] * 3


def test_check_many_rejects_bad_arguments():
    with pytest.raises(ValueError, match="timeout_s > 0"):
        check_many([("1", "1")], timeout_s=0)
    with pytest.raises(ValueError, match="workers >= 0"):
        check_many([("1", "1")], workers=-1)


def test_check_many_scores_a_worker_killed_mid_check_as_false(pool_of_two):
    check_many([("x", "x+0")], workers=pool_of_two)
    pool = bounded.shared_pool(equivalence.SYMBOLIC)
    replaced_before = pool.replaced
    with ThreadPoolExecutor(max_workers=1) as thread:
        future = thread.submit(check_many, [SLOW, ("\\frac{1}{2}", "0.5")], workers=pool_of_two, timeout_s=60.0)
        deadline = time.monotonic() + 30
        while not any(w.task == 0 for w in pool.workers):  # task 0 is the slow pair
            assert time.monotonic() < deadline, "the slow check never reached a worker"
            time.sleep(0.01)
        busy = next(w for w in pool.workers if w.task == 0)
        os.kill(busy.process.pid, signal.SIGKILL)  # as the kernel's out-of-memory killer would
        assert future.result(timeout=30) == [False, True]
    assert pool.replaced == replaced_before + 1


def test_pooled_math_reward_scores_a_group(pool_of_two):
    problem = Problem(id="p", prompt="What is 1/2?", answer="\\frac{1}{2}")
    numeric = Problem(id="n", prompt="What is 74 + 20?", answer="94", metadata={"answer_type": "number"})
    texts = ["so \\boxed{0.5}", "\\boxed 1/2", "Final answer: 0.4", "no idea"]
    completions = [Completion(token_ids=(1,), text=text, logprobs=(0.0,), finish_reason="stop") for text in texts]
    reward = PooledMathReward(workers=pool_of_two, timeout_s=30.0)
    assert reward.score_group(problem, completions) == [1.0, 1.0, 0.0, 0.0]
    restated = [Completion(token_ids=(1,), text=t, logprobs=(0.0,), finish_reason="stop")
                for t in ("\\boxed{74 + 20}", "\\boxed{94}")]
    assert reward.score_group(numeric, restated) == [0.0, 1.0]
    with pytest.raises(ValueError, match="allowed"):
        PooledMathReward(extract="first_number")
    with pytest.raises(ValueError, match="timeout_s > 0"):
        PooledMathReward(timeout_s=0.0)


def test_the_last_answer_phrase_is_the_answer():
    from reasonrl.rewards.answers import extract_answer

    assert extract_answer("The answer is 3. Wait, no: the answer is 4.", "answer_phrase") == "4"
    assert extract_answer("The answer is 3. Wait, no: the answer is 4.") == "4"


def test_plain_numbers_are_equal_to_a_relative_1e_9_and_a_tuple_is_no_set_either_way():
    assert equivalence.math_equal("1000", "1000") and not equivalence.math_equal("1000.01", "1000")
    assert not equivalence.math_equal("(1,2)", "\\{1,2\\}") and not equivalence.math_equal("\\{1,2\\}", "(1,2)")


def test_math_verify_keeps_its_time_limit_off_the_main_thread_by_waiting(monkeypatch):
    """Its SIGALRM timer raises off the main thread, and code that takes any exception for a wrong
    answer (verifiers' verify_boxed_math_answer) would score every answer 0 there."""
    from math_verify import grader, metric, parse, parser, verify
    from math_verify.errors import TimeoutException

    from reasonrl.rewards.math_verify_threads import bound_off_the_main_thread

    bound_off_the_main_thread()

    def slow():
        time.sleep(3)
        return "late"

    seen = {}

    def off_the_main_thread() -> None:
        seen["verdict"] = verify(parse("$\\frac{1}{2}$"), parse("$0.5$"))
        seen["metric"] = metric.timeout(5)(lambda: "in time")()
        before = bounded.timeouts_on_this_thread()
        started = time.monotonic()
        try:
            grader.timeout(1)(slow)()
        except TimeoutException:
            seen["stopped"] = (round(time.monotonic() - started), bounded.timeouts_on_this_thread() - before)

    worker = threading.Thread(target=off_the_main_thread)
    worker.start()
    worker.join()
    assert seen == {"verdict": True, "metric": "in time", "stopped": (1, 1)}
    with pytest.raises(TimeoutException):  # on the main thread: the timer, as math-verify has it
        parser.timeout(1)(slow)()
