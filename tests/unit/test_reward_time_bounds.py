"""Reward parsing in bounded time: every pattern and extractor that reads model text finishes 100,000-character
adversarial texts in well under a second, the scans that replace backtracking regexes agree with those regexes,
every math check is stopped at its time bound on any thread (scored 0 and counted in reward/timeouts), and a
reward too large for a float is a RewardError."""

from __future__ import annotations

import ast
import importlib
import random
import re
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

import reasonrl
from reasonrl.agents import parsing
from reasonrl.agents.builtin import exact_match, normalize_answer
from reasonrl.agents.tools import _words
from reasonrl.rewards import RewardError, WeightedReward, answers, code, equivalence, judge, score_groups
from reasonrl.rewards import format as formats
from reasonrl.rewards import math as verifier
from reasonrl.rewards.process import split_steps
from reasonrl.rollout.producer import rollout_metrics
from reasonrl.tasks.environments import extract_final_answer
from reasonrl.types import Completion, Group, Problem

PROBLEM = Problem(id="p", prompt="What is 1?", answer="1")
SIZE = 100_000
BOUND_S = 1.0

def _repeated(unit: str, head: str = "", tail: str = "") -> str:
    return head + unit * ((SIZE - len(head) - len(tail)) // len(unit)) + tail

def _mixed(seed: int) -> str:
    """Markers of every format, spaces and brackets in a random order."""
    pieces = ["answer", "Final answer", " is", ":", "**", ".", " ", "   ", "\n", "\\boxed{", "\\boxed ", "{", "}",
              "<answer>", "</answer>", "<think>", "</think>", "score", "Rating:", "[[", "]]", "/", "out of", "7", "1,000",
              "-", "```", "```python\n", '{"name":', "Step 1:", "\\text{", "$", "x"]
    rng = random.Random(seed)
    text = []
    while sum(map(len, text)) < SIZE:
        text.append(rng.choice(pieces))
    return "".join(text)

ADVERSARIAL = {
    "spaces after 'the final answer'": "the final answer" + " " * SIZE + "x",
    "spaces after 'answer'": "answer" + " " * SIZE + "x",
    "spaces after 'answer is'": "answer is" + " " * SIZE + "x",
    "spaces inside an answer": "the answer is x" + " " * SIZE + "y",
    "line breaks after 'answer is'": "answer is" + "\n" * SIZE,
    "stars after 'answer:'": "answer:" + "*" * SIZE + "x",
    "'answer is' repeated": _repeated("answer is "),
    "'final answer' repeated": _repeated("final answer "),
    "short answers then spaces": _repeated("Answer: x. ", tail=" " * (SIZE // 2) + "y"),
    "'\\boxed{' repeated": _repeated("\\boxed{"),
    "nested \\boxed": "\\boxed{" * (SIZE // 8) + "}" * (SIZE // 8),
    "spaces after \\boxed": "\\boxed" + " " * SIZE + "x",
    "open braces": "{" * SIZE,
    "closing braces": "}" * SIZE,
    "'score' then spaces": "score" + " " * SIZE + "x",
    "'score' and separators": "score" + " ** " * (SIZE // 4) + "x",
    "'[[' then spaces": "[[" + " " * SIZE + "x",
    "'[[' repeated": _repeated("[["),
    "'[[7' repeated": _repeated("[[7 "),
    "<answer> repeated": _repeated("<answer>"),
    "<answer> then spaces": "<answer>" + " " * SIZE,
    "<think> repeated": _repeated("<think>"),
    "a long think, no answer": "<think>" + "x" * SIZE + "</think>" + " " * 10 + "<answer> x",
    "``` then spaces": "```" + " " * SIZE + "x",
    "```python repeated": _repeated("```python\n"),
    "backticks": "`" * SIZE,
    "digits": "1" * SIZE,
    "thousands groups": _repeated("1,"),
    "fractions": _repeated("1/"),
    "minus signs": _repeated("-1"),
    "decimal points": _repeated("1."),
    "exponents": _repeated("1e"),
    "line breaks": "\n" * SIZE,
    "blank lines with spaces": _repeated(" \n"),
    "'Step 1' repeated": _repeated("Step 1"),
    "'step' then spaces": "step" + " " * SIZE + "1",
    "'{\"name\":' repeated": _repeated('{"name":'),
    "deeply nested tool call": '{"name": "f", "arguments": ' + "[" * SIZE,
    "a unit then \\text": "\\boxed{1" + " " * SIZE + "\\text{cm}}",
    "many unit words": "\\boxed{1 " + "ab " * (SIZE // 3) + "!}",
    "tuple commas": "\\boxed{\\left(" + "," * SIZE + "y}",
    "an open tuple of commas": "(" + "," * SIZE + "y",
    "dollars": "$" * SIZE,
    "mixed markers": _mixed(0),
    "mixed markers (2)": _mixed(1),
}

def _finishes_in_time(run: Callable[[str], object], name: str) -> None:
    for case, text in ADVERSARIAL.items():
        started = time.perf_counter()
        run(text)
        elapsed = time.perf_counter() - started
        assert elapsed < BOUND_S, f"{name} took {elapsed:.2f} s on {case}"

# --- every module-level pattern of the modules that read model text ---------------------------------------------------

PACKAGES = ("rewards", "agents", "tasks", "eval")
SOURCE = Path(reasonrl.__file__).parent

def _modules() -> dict[str, ast.Module]:
    return {".".join(("reasonrl", *path.relative_to(SOURCE).with_suffix("").parts)): ast.parse(path.read_text())
            for package in PACKAGES for path in sorted((SOURCE / package).rglob("*.py"))}

def _is_re_call(node: ast.AST, names: tuple[str, ...]) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "re")

def module_patterns() -> list[tuple[str, str]]:
    """(module, name) of every `NAME = re.compile(...)` at the top level of a module of PACKAGES."""
    return [(module, target.id) for module, tree in _modules().items() for statement in tree.body
            if isinstance(statement, ast.Assign) and _is_re_call(statement.value, ("compile",))
            for target in statement.targets if isinstance(target, ast.Name)]

@pytest.mark.timeout(120)
@pytest.mark.parametrize(("module", "name"), module_patterns(), ids=lambda value: value)
def test_module_pattern_is_linear(module, name):
    pattern = getattr(importlib.import_module(module), name)

    def every_match(text: str) -> None:
        for _ in pattern.finditer(text):
            pass
        pattern.fullmatch(text)

    _finishes_in_time(every_match, f"{module}.{name}")

def test_the_pattern_sweep_sees_the_extraction_patterns():
    found = set(module_patterns())
    assert {("reasonrl.rewards.answers", "_ANSWER_MARKER"), ("reasonrl.rewards.judge", "_SCORE"),
            ("reasonrl.rewards.code", "_FENCE"), ("reasonrl.agents.parsing", "_JSON_START")} <= found

# Regexes built inside functions cannot be swept above: each is timed through its function below, or reads text
# that is bounded before it gets there.
INLINE_PATTERNS = {
    ("reasonrl.rewards.equivalence", "_scientific_as_latex"): "reads a plain number (fullmatched before)",
    ("reasonrl.rewards.equivalence", "_cost_refusal"): f"reads answers of at most {verifier.MAX_ANSWER_CHARS} characters",
    ("reasonrl.rewards.judge", "parse_verdict"): "timed below",
    ("reasonrl.rewards.process", "split_steps"): "timed below",
    ("reasonrl.rewards.code", "assemble_program"): "timed below",
    ("reasonrl.agents.builtin", "normalize_answer"): "timed below",
    ("reasonrl.agents.tools", "_words"): "timed below",
}

def test_inline_patterns_are_all_accounted_for():
    calls = ("compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "subn", "split")
    found = {(module, function.name) for module, tree in _modules().items() for function in ast.walk(tree)
             if isinstance(function, ast.FunctionDef) and any(_is_re_call(node, calls) for node in ast.walk(function))}
    assert found == set(INLINE_PATTERNS)

# --- every function that reads model text -----------------------------------------------------------------------------

TEXT_READERS: dict[str, Callable[[str], object]] = {
    **{f"extract {name}": extractor for name, extractor in verifier.EXTRACTORS.items()},
    "math checks before sympy": lambda text: equivalence._quick_verdict(verifier.extract_boxed(text) or text[:1000], "1"),
    **{f"format {style}": check for style, check in formats.FORMAT_CHECKS.items()},
    "judge score": judge.parse_score,
    "judge verdict": judge.parse_verdict,
    "judge letter verdict": lambda text: judge.parse_verdict(text, {"A": 1.0, "B": 0.0}),
    "code block": code.extract_program,
    "code with a prefix": lambda text: code.assemble_program(text, {"code_prefix": "x = 1\n", "entry_point": "f"}),
    **{f"tool call {name}": parser for name, parser in parsing.PARSERS.items()},
    "exact match": lambda text: exact_match(text, PROBLEM),
    "SQuAD normalisation": normalize_answer,
    "retrieval query words": _words,
    "environment answer": extract_final_answer,
    **{f"steps {mode}": partial(split_steps, mode=mode, delimiter="ки")
       for mode in ("lines", "double_newline", "step_markers", "delimiter")},
}

@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(TEXT_READERS))
def test_text_reader_is_linear(name):
    _finishes_in_time(TEXT_READERS[name], name)

def test_a_tool_call_nested_too_deeply_is_malformed():
    text = '{"name": "f", "arguments": ' + "[" * SIZE
    assert isinstance(parsing.parse_json(text), parsing.Malformed)
    assert isinstance(parsing.parse_tags(f"<tool_call>{text}</tool_call>"), parsing.Malformed)


@pytest.mark.parametrize("arguments", ['"' + "[" * 5000 + '"', "{\"x\": " + "1" * 5000 + "}",
                                       '"{\\"x\\": ' + "1" * 5000 + '}"'],
                         ids=["nested-in-a-string", "5000-digit-integer", "5000-digit-integer-in-a-string"])
def test_a_tool_call_python_cannot_read_is_malformed_not_an_exception(arguments):
    # A RecursionError and the ValueError of an integer past 4300 digits once escaped the parsers
    # and stopped the run (agents stop on an environment's error).
    text = '{"name": "f", "arguments": ' + arguments + "}"
    assert isinstance(parsing.parse_json(text), parsing.Malformed)
    assert isinstance(parsing.parse_tags(f"<tool_call>{text}</tool_call>"), parsing.Malformed)


def test_long_answers_cluster_in_bounded_time():
    # 64 distinct 8 KB answers took 3.7 s: each of the G^2 pairs normalised both (regexes over 8 KB)
    # before the length limit applied. Past MAX_NORMALIZED_CHARS an answer equals only its own text.
    from reasonrl.rewards.unsupervised import answer_clusters

    answers = ["1 ab " * 1600 + str(i) for i in range(64)] + ["1 ab " * 1600 + "0"]
    started = time.perf_counter()
    clusters = answer_clusters(answers)
    assert time.perf_counter() - started < 0.5
    assert len(clusters) == 64 and clusters[0] == [0, 64]
    assert not equivalence.math_equal("1 ab " * 1600, "1 ab " * 1600 + "c")
    assert equivalence.math_equal(" " + "1 ab " * 1600, "1 ab " * 1600)


@pytest.mark.parametrize("expression", ["round(1, -10**7)", "((10**999)*(10**999)*(10**999)*(10**999))**1000",
                                        "-" * 1999 + "1", "-" * 8000 + "1", "1+" * 5000 + "1", "9" * 5000])
def test_the_calculator_refuses_in_bounded_time(expression):
    # round(1, -10**7) took 6.1 s (it computes 10 ** 10**7), the power 1.5 s before its size was
    # checked; the nested ones raised RecursionError or MemoryError, which escaped the tool.
    from reasonrl.agents.tools import ToolError, evaluate_expression

    started = time.perf_counter()
    with pytest.raises(ToolError):
        evaluate_expression(expression)
    assert time.perf_counter() - started < 0.5

# --- the scans agree with the regexes they replace, on short texts where those are fast -------------------------------

ANSWER_PHRASE = re.compile(
    r"(?:answer\s+is|final\s+answer\s*(?:is)?\s*\**\s*:|answer\s*\**\s*:)\**[:\s]*(.+?)(?=\.\s|\.?\**\s*$)",
    re.IGNORECASE | re.MULTILINE)
_NUMBER = r"(-?\d+(?:\.\d+)?)"
SCORE = re.compile(rf"\b(?:score|rating|grade)\s*(?:\*\*)?\s*[:=]?\s*(?:\*\*)?\s*(?:\[\[)?\s*{_NUMBER}\s*(?:\]\])?"
                   rf"(?:\s*(?:/|out\s+of)\s*{_NUMBER})?|\[\[\s*{_NUMBER}\s*(?:/\s*{_NUMBER}\s*)?\]\]", re.IGNORECASE)
BRACKETED = re.compile(r"\[\[\s*([^\[\]]+?)\s*\]\]")
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NONEMPTY_ANSWER_TAG = re.compile(r"<answer>\s*\S.*?</answer>", re.DOTALL)
THINK_ANSWER = re.compile(
    r"\s*<think>(?:(?!</?think>).)*</think>\s*<answer>\s*(?:(?!</?answer>)\S)(?:(?!</?answer>).)*</answer>\s*",
    re.DOTALL)
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
ORDERED_LITERAL = re.compile(r"^(?:\\left)?[(\[].*,.*(?:\\right)?[)\]]$", re.DOTALL)
BRACE = re.compile(r"(?<!\\)[{}]")

def boxed_by_rescanning(text: str) -> list[str]:
    """Each \\boxed{ scanned to its closing brace on its own (quadratic in repeated \\boxed{)."""
    found = []
    for start in answers._BOXED_START.finditer(text):
        depth = 1
        for brace in BRACE.finditer(text, start.end()):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                found.append((start.start(), text[start.end() : brace.start()]))
                break
    found += [(match.start(), match.group(1)) for match in answers._BOXED_UNBRACED.finditer(text)]
    return [content for _, content in sorted(found)]

def random_texts(pieces: list[str], count: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 16))) for _ in range(count)]

def test_answer_phrases_agree_with_the_regex():
    pieces = ["answer", "ANSWER", "Final", "final", "is", "Is", " ", "  ", "\n", "\n", ":", "*", "**", ".", ". ", "x",
              "5", "\t", "\r", "\xa0", "s", "$"]
    for text in random_texts(pieces):
        assert verifier.answer_phrases(text) == ANSWER_PHRASE.findall(text), text

def test_judge_parsing_agrees_with_the_regexes():
    pieces = ["score", "Score", "rating", "grade", " ", "  ", "\n", "**", "*", ":", "=", "[[", "]]", "[", "]", "7",
              "10", "-", ".", "/", "out", "of", "out of", "x", "CORRECT", "\t"]
    for text in random_texts(pieces):
        assert [m.groups() for m in judge._SCORE.finditer(text)] == [m.groups() for m in SCORE.finditer(text)], text
        assert ([judge._bracketed(m.group(1)) for m in judge._BRACKETED.finditer(text)]
                == BRACKETED.findall(text)), text

def test_tag_and_boxed_scans_agree_with_the_regexes():
    pieces = ["<answer>", "</answer>", " ", "\n", "x", "<", "answer>", "\\boxed", "\\fbox", "{", "}", "\\{", "\\}",
              "5", "$", "\\boxed{", "\t"]
    for text in random_texts(pieces):
        assert verifier.answer_tags(text) == ANSWER_TAG.findall(text), text
        assert formats.has_answer_tag(text) == (NONEMPTY_ANSWER_TAG.search(text) is not None), text
        assert verifier.boxed_contents(text) == boxed_by_rescanning(text), text
        assert formats.has_boxed(text) == any(content.strip() for content in boxed_by_rescanning(text)), text

def test_think_answer_agrees_with_the_regex():
    rng = random.Random(0)
    pieces = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "\t", "<", *["x"] * 6]

    def filler() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 2)))

    def edge() -> str:
        return rng.choice(["", " ", "\n\t", "x"])

    texts = [f"{edge()}<think>{filler()}</think>{edge()}<answer>{filler()}</answer>{edge()}" for _ in range(4000)]
    verdicts = [formats.is_think_answer(text) for text in texts]
    assert verdicts == [THINK_ANSWER.fullmatch(text) is not None for text in texts]
    assert 0.1 < sum(verdicts) / len(verdicts) < 0.9  # both answers are well represented

def test_code_and_tuple_patterns_agree_with_the_regexes():
    for text in random_texts(["```", "python", "Python3", "py", " ", "\t", "\n", "x", "`", "3"]):
        assert code._FENCE.findall(text) == FENCE.findall(text), text
    for text in random_texts(["\\left", "\\right", "(", ")", "[", "]", ",", "x", "\n", " "]):
        assert bool(equivalence._ORDERED_LITERAL.match(text)) == bool(ORDERED_LITERAL.match(text)), text

def test_the_trailing_digits_scan_agrees_with_the_regex():
    for text in random_texts(["1", "23", "\u0661", "x", "!", " ", "^", "("]):
        assert text[equivalence._trailing_digits_start(text):] == re.search(r"\d*$", text).group(), text

# --- every math check is stopped at its bound, on any thread ----------------------------------------------------------

# Passes the size limits, yet sympy spends far more than a second on it. Each test checks a pair of its own
# (another exponent), so that nothing sympy cached for one test's check can shorten another's.
_exponents = iter(range(1000, 1100))

def slow_pair() -> tuple[str, str]:
    exponent = next(_exponents)
    return f"\\sin(x)^{{{exponent}}}+\\cos(x)^{{{exponent}}}", "1"

def test_a_slow_check_on_the_main_thread_scores_0_and_is_counted():
    outer_delay = signal.getitimer(signal.ITIMER_REAL)[0]  # pytest-timeout's timer, if it runs one
    outer_handler = signal.getsignal(signal.SIGALRM)
    before = verifier.timeouts_on_this_thread()
    started = time.monotonic()
    assert verifier.math_equal(*slow_pair(), timeout_s=0.3) is False
    elapsed = time.monotonic() - started
    assert elapsed < 3.0
    assert verifier.timeouts_on_this_thread() == before + 1
    assert verifier.math_equal("\\frac{1}{2}", "0.5", timeout_s=0.3) is True  # no alarm left behind
    assert signal.getsignal(signal.SIGALRM) is outer_handler
    if outer_delay:  # set again, less the time the checks took
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= outer_delay

def test_work_that_catches_its_expiry_and_returns_is_counted_as_stopped():
    """reasoning-gym's scorers wrap their work in a bare `except:` that returns a low score: the expiry
    is caught there and the call returns as if scored. Past its deadline the result is dropped."""
    from reasonrl.rewards.bounded import call_within, count_stopped, timeouts_on_this_thread

    def scorer_catching_everything() -> float:
        try:
            while True:
                pass
        except:  # noqa: E722 (as the scorers do)
            return 0.01

    def expired() -> float:
        count_stopped("stopped")
        return -1.0

    before = timeouts_on_this_thread()
    assert call_within(scorer_catching_everything, 0.2, expired) == -1.0
    assert timeouts_on_this_thread() == before + 1
    assert call_within(lambda: 0.5, 0.2, expired) == 0.5  # work done in time keeps its result
    assert timeouts_on_this_thread() == before + 1


def test_an_expiry_dropped_by_the_interpreter_does_not_unbound_the_check(monkeypatch):
    """The interpreter prints and drops an exception raised in a weakref callback or a finaliser: the
    timer's first expiry, landing in a garbage collection inside sympy, was lost, and the check ran on
    for as long as sympy took. The timer fires again until the check stops."""
    from reasonrl.rewards import bounded, symbolic

    dropped = []

    def drops_the_first_expiry_then_spins(prediction: str, gold: str) -> bool:
        give_up = time.monotonic() + 5.0  # (a check left unbounded answers True after 5 s: the test fails, not hangs)
        try:
            while time.monotonic() < give_up:
                pass
        except BaseException as expiry:  # noqa: BLE001 (what a weakref callback does with it)
            dropped.append(type(expiry).__name__)
        while time.monotonic() < give_up:  # sympy goes on
            pass
        return True

    monkeypatch.setattr(symbolic, "symbolic_equal", drops_the_first_expiry_then_spins)
    before = verifier.timeouts_on_this_thread()
    started = time.monotonic()
    assert verifier.math_equal("x^2", "x \\cdot y", timeout_s=0.2) is False
    assert time.monotonic() - started < 0.2 + 10 * bounded.EXPIRY_REPEAT_S
    assert dropped == ["_Expired"] and verifier.timeouts_on_this_thread() == before + 1


@pytest.mark.timeout(120)
def test_a_slow_check_on_another_thread_is_stopped_too():
    result = {}

    def score() -> None:
        before = verifier.timeouts_on_this_thread()
        prediction, gold = slow_pair()
        result["score"] = verifier.MathReward(timeout_s=1.0)(f"\\boxed{{{prediction}}}", Problem("p", "q", gold))
        result["timeouts"] = verifier.timeouts_on_this_thread() - before

    try:
        thread = threading.Thread(target=score, daemon=True)
        thread.start()
        thread.join(timeout=40)  # a worker's start and the 1 s bound; unbounded, sympy runs for minutes
        assert not thread.is_alive(), "the check on a thread other than the main one was not stopped"
        assert result == {"score": 0.0, "timeouts": 1}
    finally:
        verifier.shutdown_pool()

class SlowCheck:
    """A reward that checks its answer under a small time bound: each completion's check is stopped."""

    def __call__(self, completion: str, problem: Problem) -> float:
        return 1.0 if verifier.math_equal(completion, problem.answer, timeout_s=0.2) else 0.0

def completion(text: str) -> Completion:
    return Completion(token_ids=(1,), text=text, logprobs=(0.0,), finish_reason="stop")

def test_timeouts_reach_the_scored_group_and_the_step_metrics():
    reward = WeightedReward({"correct": (SlowCheck(), 1.0)})
    prediction, gold = slow_pair()
    group = Group(problem=Problem("p", "q", gold), prompt_ids=(1,),
                  completions=(completion(prediction), completion("1"), completion("2")))
    [scored] = score_groups([group], reward)
    assert scored.rewards == (0.0, 1.0, 0.0)
    assert scored.reward_timeouts == 1
    assert rollout_metrics([scored, scored])["reward/timeouts"] == 2

# --- a reward too large for a float ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "shown"), [(10**400, r"1000000000.*\(401 characters\)"),
                                              (10**5000, "an integer of 16610 bits")], ids=["1e400", "1e5000"])
def test_a_reward_too_large_for_a_float_is_a_reward_error(value, shown):
    reward = WeightedReward({"huge": (lambda completion, problem: value, 1.0)})
    group = Group(problem=PROBLEM, prompt_ids=(1,), completions=(completion("a"),))
    with pytest.raises(RewardError, match=rf"'huge' on problem 'p'.* returned {shown}, too large for a float"):
        score_groups([group], reward)
    [skipped] = score_groups([group], reward, on_error="skip_group")
    assert skipped.rewards is None and "too large for a float" in skipped.reward_error
