"""Unit-test reward for code: the fraction of a problem's tests that the completion's program passes.

Functional correctness judged by running tests, as in HumanEval (Chen et al. 2021, "Evaluating
Large Language Models Trained on Code"); unit-test outcomes as the RL reward as in CodeRL (Le et
al. 2022) and DeepSeek-R1 (2025, rule-based rewards from test cases); the pass fraction gives
partial credit, like RLTF's adaptive feedback (Liu et al. 2023), and is 1.0 exactly when every
test passes (pass@k counts those).

The program is the last fenced ```python (or ```py, or bare ```) block of the completion, else
the completion's raw text. It runs in `reasonrl.sandbox`, never in this process. What it is
tested against comes from `problem.metadata`:

- "tests": a list of assert statements (MBPP's `test_list`), each one test.
- "test_code": a test program run after the solution (HumanEval's `check` function), one test that
  passes if it runs to the end; with "entry_point", `check(<entry_point>)` is called after it.
- "io_tests": a list of {"input": str, "output": str}: the program reads `input` on stdin and must
  print `output`, compared line by line on whitespace-separated tokens (trailing blank lines and
  spacing do not matter). One run per test.
- "code_prefix": code placed before the program (HumanEval: the prompt, i.e. the imports, helper
  functions and the signature and docstring the completion continues). When the program itself
  defines `entry_point` at top level (the model rewrote the whole function), it follows the prefix
  and replaces the prompt's stub; otherwise it is appended to the prefix as a continuation.
- "entry_point": the name of the function under test.

Assert tests and test code run in one sandboxed process: the solution is executed first, in its
own namespace (named "solution", so `if __name__ == "__main__":` blocks do not run), with its
stdout sent to /dev/null; each test then runs in that namespace and reports a pass on a copy of the
original stdout, tagged with a random nonce. What the harness calls after the solution is bound
before the solution runs, and the solution has its own copy of the builtins. A program that exits
early (`sys.exit(0)`), prints fake results, or replaces `compile`, `exec` or `os.write` therefore
passes nothing, and a test that hangs keeps the passes reported before it. Not defended: a program
that searches its own process for the nonce (its frames: `sys._getframe`, which the standard
library itself needs, is allowed), or returns objects whose `__eq__` is always true; the sandbox
keeps programs from doing harm, not from cheating the tests.

A program that fails to run (syntax error, exception, timeout, memory) is a legitimate 0 for the
tests it fails. A completion with a run stopped at its time limit (wall clock or CPU) is also counted, once, in
`timeouts_on_this_thread` (logged as reward/timeouts): a program that loops forever and a correct one
too slow for `timeout_s` on a loaded machine both score 0 there, and only the count tells a user which
limit to raise. A problem without tests or with tests that do not compile is a dataset error, and a
sandbox that cannot run raises `SandboxError`.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reasonrl.rewards.bounded import count_stopped_elsewhere
from reasonrl.sandbox import ExecResult, log_layers, run_many
from reasonrl.types import Completion, Problem

logger = logging.getLogger(__name__)

# The spaces after the language go with it, so that two "[ \t]*" never meet (quadratic on "```" and a run of spaces).
_FENCE = re.compile(r"```[ \t]*(?:(?:python3?|py)[ \t]*)?\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)

# The solution and the tests are string literals in the harness, so the solution's line numbers
# are its own ("<solution>", line N) and a `from __future__` import in it stays legal. Everything the
# harness calls after the solution ran is bound before it runs, as a local of `_main` (default
# arguments), and the solution gets a copy of the builtins: a solution that replaces
# `builtins.compile` or `os.write`, or reassigns the module's globals, cannot turn the tests into
# no-ops or report for them.
_HARNESS = """\
def _main(compile=compile, exec=exec, enumerate=enumerate, BaseException=BaseException):
    import builtins, os, traceback
    write, print_exc = os.write, traceback.print_exc
    report = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    namespace = {{"__name__": "solution", "__builtins__": dict(vars(builtins))}}
    exec(compile({solution!r}, "<solution>", "exec"), namespace)
    for index, test in enumerate({tests!r}):
        try:
            exec(compile(test, "<test %d>" % index, "exec"), namespace)
        except BaseException:
            print_exc()
            continue
        write(report, ("{nonce} %d\\n" % index).encode())
_main()
"""


class CodeTestError(ValueError):
    """A problem whose tests are missing or malformed (a dataset error, not a score)."""


TEST_KEYS = ("tests", "test_code", "io_tests")
"""The metadata that holds a problem's unit tests (module docstring)."""


def default_verifier(problem: Problem) -> str:
    """The verifier of a problem whose metadata names none: "code" when it carries unit tests, else "math"
    (a code problem checked as math would score 0 every time, without a word). An empty or null test field
    (a math row of a mixed export, `"test_code": null`) carries none."""
    return "code" if any(problem.metadata.get(key) not in (None, "", [], {}) for key in TEST_KEYS) else "math"


def extract_program(completion: str) -> str:
    """The last fenced python code block of `completion` (an unclosed last fence runs to the end), else the text."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def assemble_program(program: str, metadata: Mapping[str, object]) -> str:
    """The program to run: `code_prefix` and the extracted program, joined as the module docstring says."""
    prefix = str(metadata.get("code_prefix", ""))
    if not prefix:
        return program
    entry_point = metadata.get("entry_point")
    rewrites_function = bool(entry_point) and re.search(rf"^def\s+{re.escape(str(entry_point))}\s*\(", program,
                                                        re.MULTILINE) is not None
    return prefix.rstrip("\n") + "\n\n" + program if rewrites_function else prefix + program


def normalize_output(text: str) -> list[list[str]]:
    """Whitespace-insensitive form of a program's output: lines of tokens, without trailing blank lines."""
    lines = [line.split() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


@dataclass(frozen=True)
class _Tests:
    snippets: tuple[str, ...]  # assert statements and test programs, run after the solution
    io_tests: tuple[tuple[str, str], ...]

    @property
    def count(self) -> int:
        return len(self.snippets) + len(self.io_tests)


def problem_tests(problem: Problem) -> _Tests:
    """The tests in `problem.metadata`, checked to compile (without running anything)."""
    metadata = problem.metadata
    where = f"problem {problem.id!r}"
    snippets = []
    asserts = metadata.get("tests")
    asserts = [] if asserts is None else asserts  # null: no asserts (a row of a mixed export)
    if isinstance(asserts, str) or not isinstance(asserts, Sequence):
        raise CodeTestError(f"{where}: metadata['tests'] must be a list of assert statements, got {asserts!r:.200}")
    snippets.extend(str(test) for test in asserts)
    if metadata.get("test_code") is not None:
        test_code = str(metadata["test_code"])
        if not test_code.strip():
            raise CodeTestError(f"{where}: metadata['test_code'] is empty")
        entry_point = metadata.get("entry_point")
        snippets.append(test_code + (f"\n\ncheck({entry_point})\n" if entry_point else ""))
    for index, snippet in enumerate(snippets):
        try:
            compile(snippet, f"<test {index}>", "exec")
        except SyntaxError as exc:
            raise CodeTestError(f"{where}: test {index} is not valid Python ({exc}): {snippet!r:.300}") from exc
    io_tests = []
    for index, case in enumerate(metadata.get("io_tests") or []):
        if not isinstance(case, Mapping) or not {"input", "output"} <= set(case):
            raise CodeTestError(f"{where}: metadata['io_tests'][{index}] must be {{'input': ..., 'output': ...}}, "
                                f"got {case!r:.200}")
        io_tests.append((str(case["input"]), str(case["output"])))
    tests = _Tests(tuple(snippets), tuple(io_tests))
    if tests.count == 0:
        raise CodeTestError(f"{where} has no tests: give metadata 'tests' (asserts), 'test_code' or 'io_tests' "
                            f"(metadata keys: {', '.join(map(str, metadata)) or 'none'})")
    return tests


@dataclass(frozen=True)
class CodeReward:
    """Pass rate of the problem's unit tests (see the module docstring for the metadata keys).

    Each sandbox run gets `timeout_s` of wall clock and `memory_mb` of address space; a group's
    runs go `max_parallel` at a time (default: one per CPU core).
    """

    timeout_s: float = 3.0
    memory_mb: int = 512
    max_parallel: int | None = None

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb <= 0:
            raise ValueError(f"CodeReward: timeout_s={self.timeout_s} and memory_mb={self.memory_mb} must be positive")

    def __call__(self, completion: str, problem: Problem) -> float:
        return self.score_texts(problem, [completion])[0]

    def score_group(self, problem: Problem, completions: Sequence[Completion]) -> list[float]:
        return self.score_texts(problem, [c.text for c in completions])

    def score_texts(self, problem: Problem, texts: Sequence[str]) -> list[float]:
        """The pass rate of each text, all of their sandbox runs in parallel."""
        log_layers()
        tests = problem_tests(problem)
        programs = [assemble_program(extract_program(text), problem.metadata) for text in texts]
        nonce = secrets.token_hex(16)
        jobs: list[tuple[str, str]] = []
        for program in programs:
            if tests.snippets:
                jobs.append((_HARNESS.format(solution=program, tests=list(tests.snippets), nonce=nonce), ""))
            jobs.extend((program, stdin) for stdin, _ in tests.io_tests)
        ran = run_many([code for code, _ in jobs], stdins=[stdin for _, stdin in jobs],
                       max_workers=self.max_parallel, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        harness = 1 if tests.snippets else 0
        per_program = harness + len(tests.io_tests)  # the harness run, then one per io test
        runs = [ran[i * per_program:(i + 1) * per_program] for i in range(len(programs))]
        self._count_timeouts(problem, runs)
        scores = []
        for results in runs:
            passed = _snippets_passed(results[0], nonce, len(tests.snippets)) if harness else 0
            passed += sum(_io_passed(result, expected)
                          for result, (_, expected) in zip(results[harness:], tests.io_tests, strict=True))
            scores.append(passed / tests.count)
        return scores

    def _count_timeouts(self, problem: Problem, runs: Sequence[Sequence[ExecResult]]) -> None:
        """One count per completion with a run stopped at its time limit (as a math check counts once)."""
        first_stopped = (next((r for r in results if r.status == "timeout"), None) for results in runs)
        stopped = [result for result in first_stopped if result is not None]
        if stopped:
            count_stopped_elsewhere(len(stopped))
            logger.info("CodeReward: %d of %d completions for problem %r had a sandbox run stopped at the time limit "
                        "(timeout_s=%g; %s)", len(stopped), len(runs), problem.id, self.timeout_s, stopped[0].detail)


def _snippets_passed(result: ExecResult, nonce: str, count: int) -> int:
    passed = set()
    for line in result.stdout.splitlines():
        tag, _, index = line.partition(" ")
        if tag == nonce and index.isdigit() and int(index) < count:
            passed.add(int(index))
    return len(passed)


def _io_passed(result: ExecResult, expected: str) -> bool:
    if result.status != "ok" or result.truncated:
        return False
    return normalize_output(result.stdout) == normalize_output(expected)
