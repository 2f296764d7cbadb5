"""Whether two math answers are equal: `math_equal` for one pair, `check_many` for many, each check
within a time bound. Plain numbers are compared directly (this runs thousands of times per training
step), anything else symbolically with math-verify (Kydlíček 2025, github.com/huggingface/Math-Verify),
the checker Open-R1 uses. An unparseable answer is not equal to anything; that is a legitimate verdict,
not an error.

What counts as equal (beyond math-verify's own rules):
- Thousands separators ("1,234", "1{,}234", "10\\!000") and scientific notation ("1.5e3") are numbers.
- Units are dropped where that cannot change the number: "\\text{...}" suffixes, a leading "$"
  or "\\$", and trailing words after a plain number ("5 dollars", "3 apples"), except words that
  are mathematics ("5 pi" stays 5*pi).
- Percent follows math-verify: "50\\%" equals 0.5 (its value) and, for an integer percentage, 50 (the
  same number with the sign dropped or added); "0.5\\%" equals 0.005 only. 0.5 never equals 50.
- A set written with braces never equals a bracketed tuple or interval ("\\{1,2\\}" vs "(1,2)"),
  which math-verify would otherwise accept; sets compare without order, tuples with it.

Bounded time. Every symbolic check has a time bound, `timeout_s` seconds (default `CHECK_TIMEOUT_S`), on any thread
(`rewards.bounded`):
- On the main thread `math_equal` runs sympy here under a SIGALRM timer. (math-verify's own timeouts are
  alarms too, but they swallow their expiry, so a stopped check could not be told from a wrong answer;
  they stay off.)
- On any other thread no signal can stop it, and a thread cannot be killed, so the check goes to a
  worker process, killed at the deadline. That costs a round trip to the worker per symbolic check
  (plain numbers and the other cheap verdicts never leave the thread) and, once per process, the
  worker's start (about a second). Without it, a check such as (x+1)^{10000} against (x+2)^{10000} on
  a rollout thread ran for over a minute.
- `check_many` checks many pairs in a pool of worker processes: a check past `timeout_s` is killed with
  its worker, which is replaced. `PooledMathReward` (reasonrl.rewards.math) scores a whole group through it.
A check stopped at its bound, or whose worker died (out of memory), scores 0 and is counted in
`timeouts_on_this_thread()`. Before any of this, size limits keep sympy from known blow-ups (`_cost_refusal`):
at most `MAX_ANSWER_CHARS` characters a side, no nested exponents (power towers like 10^{10^{10}}),
integer exponents up to 10^4, factorials of at most 10^5. An answer beyond them scores 0 at once.
Prose against a plain number ("I will be happy to help!" against 205) is not equal without asking sympy
(`_is_prose` says why that is sound).
Answers past `MAX_NORMALIZED_CHARS` are not even normalised: they equal only the same text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from reasonrl.rewards.bounded import (
    Handler,
    call_bounded,
    count_stopped,
    run_in_workers,
    shutdown_pools,
)

_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def strip_thousands_commas(text: str) -> str:
    return _THOUSANDS_COMMA.sub("", text)


# --- normalisation and the cheap verdicts ----------------------------------------------------------------------------

MAX_ANSWER_CHARS = 400
MAX_NORMALIZED_CHARS = 10 * MAX_ANSWER_CHARS  # longer: compared as text only (see `_quick_verdict`)
"""Longer answers (after normalisation) score 0 without reaching sympy; boxed answers are far shorter."""
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 100_000
CHECK_TIMEOUT_S = 5.0
"""The default time bound of one symbolic check, in seconds (the module docstring says how it is kept)."""

_LATEX_SPACING = re.compile(r"(?<!\\)\\[!,;: ]|~")  # not the "\\ " of a matrix row break
_DIGIT_GROUPING = re.compile(r"(?<=\d)(?:\{,\}|\\,|\\!|\\ )(?=\d{3})")
_CURRENCY = re.compile(r"^(?:\\\$|\$)\s*(?=[-+]?\.?\d)")
_TEXT_SUFFIX = re.compile(r"^(.*?[\d}])\s*\\(?:text|textbf|mbox|mathrm)\{\s*[A-Za-z][A-Za-z .]*\}\s*$")
# Words after a plain number that are mathematics, not a unit: "5 pi" is 5*pi.
_MATH_WORDS = frozenset({"pi", "e", "i", "sqrt", "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "and",
                         "or", "percent", "percentage", "degree", "degrees", "times", "over", "plus", "minus"})
_UNIT_WORDS = re.compile(r"^(.*?\d)\s+([A-Za-z]{2,}(?:\s+[A-Za-z]{2,})*)\.?$")
_SET_LITERAL = re.compile(r"^(?:\\left)?\\\{.*(?:\\right)?\\\}$", re.DOTALL)
# The "\right" of "\left( ... \right)" is part of what ".*" takes; "[^,]*," (not ".*,") keeps the match linear.
_ORDERED_LITERAL = re.compile(r"^(?:\\left)?[(\[][^,]*,.*[)\]]$", re.DOTALL)
_INTEGER = re.compile(r"\d+")
# Words and sentence punctuation, nothing else: no digit, operator, bracket or LaTeX command. Not ":",
# which LaTeX parsers read as division ("yes: yes" is 1).
_PROSE = re.compile(r"[A-Za-z\s.,!?;'\"]+")
_WORD = re.compile(r"[A-Za-z]{2,}")


def _normalize(text: str) -> str:
    """The answer with math-mode dollars, LaTeX spacing, digit grouping and safe-to-drop units removed."""
    text = text.strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    text = _DIGIT_GROUPING.sub("", text)
    text = _LATEX_SPACING.sub(" ", text).strip()
    text = _CURRENCY.sub("", text)
    if match := _TEXT_SUFFIX.match(text):
        text = match.group(1).strip()
    if ((match := _UNIT_WORDS.match(text)) and as_plain_number(match.group(1)) is not None
            and not set(match.group(2).lower().split()) & _MATH_WORDS):
        text = match.group(1).strip()
    return text


def as_plain_number(text: str) -> float | None:
    text = strip_thousands_commas(text.strip())
    return float(text) if _PLAIN_NUMBER.fullmatch(text) else None


def _scientific_as_latex(text: str) -> str:
    """"6.02e23" as "6.02 \\times 10^{23}": math-verify would read the former as 6.02 * e * 23."""
    if not _PLAIN_NUMBER.fullmatch(text) or not re.search(r"[eE]", text):
        return text
    mantissa, exponent = re.split(r"[eE]", text)
    return f"{mantissa} \\times 10^{{{exponent}}}"


def _braced_group(text: str, open_at: int) -> str:
    """The text inside the bracket that opens at `open_at`, up to its matching close (or the end)."""
    closer = {"{": "}", "(": ")", "[": "]"}[text[open_at]]
    depth = 0
    for index in range(open_at, len(text)):
        depth += text[index] == text[open_at]
        depth -= text[index] == closer
        if depth == 0:
            return text[open_at + 1 : index]
    return text[open_at + 1 :]


def _matching_open(text: str, close_at: int) -> int:
    opener = {"}": "{", ")": "(", "]": "["}[text[close_at]]
    depth = 0
    for index in range(close_at, -1, -1):
        depth += text[index] == text[close_at]
        depth -= text[index] == opener
        if depth == 0:
            return index
    return 0


def _is_prose(text: str) -> bool:
    """Whether `text` is sentences, not mathematics: only words and sentence punctuation, with at least two
    words that are not `_MATH_WORDS` and hold a letter other than e and i (which may read as constants). sympy
    reads it as a product of free symbols (a list, with commas; a factorial, with "!"), which equals no number
    (and math-verify compares text it cannot parse as text); reading it can take seconds (a "word!" is a
    factorial of symbols: "correct! I will be happy to help" against 205 ran past the 5 s bound)."""
    if not _PROSE.fullmatch(text):
        return False
    words = (word.lower() for word in _WORD.findall(text))
    return sum(word not in _MATH_WORDS and bool(set(word) - {"e", "i"}) for word in words) >= 2


def _cost_refusal(text: str) -> str | None:
    """Why sympy might not finish on `text` in reasonable time, or None: the limits of the module docstring."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    for caret in (index for index, char in enumerate(text) if char == "^"):
        rest = text[caret + 1 :].lstrip()
        if not rest:
            continue
        if rest[0] in "{([":
            exponent = _braced_group(rest, 0)
            after = rest[len(exponent) + 2 :]
        else:
            exponent = re.match(r"\\?[^\s\\]?\w*", rest).group()
            after = rest[len(exponent) :]
        if "^" in exponent or "!" in exponent or after.lstrip().startswith("^"):  # 10^{10^{10}} or 2^2^2
            return "nested exponent"
        if any(int(digits) > MAX_EXPONENT for digits in _INTEGER.findall(exponent)):
            return f"exponent above {MAX_EXPONENT}"
    for bang in (index for index, char in enumerate(text) if char == "!" and index > 0):
        before = text[:bang].rstrip()
        if before and before[-1] in "})]":
            argument = before[_matching_open(before, len(before) - 1) :]
        else:
            argument = before[_trailing_digits_start(before):]
        if "^" in argument or any(int(digits) > MAX_FACTORIAL for digits in _INTEGER.findall(argument)):
            return f"factorial of a power or of more than {MAX_FACTORIAL}"
    return None


def _trailing_digits_start(text: str) -> int:
    """Where the digits ending `text` start, as `\\d*$` finds them, in one backward scan (the regex
    tries every start and backtracks: quadratic in a run of digits)."""
    start = len(text)
    while start and text[start - 1].isdecimal():
        start -= 1
    return start


def _quick_verdict(prediction: str | None, gold: str) -> tuple[bool | None, str, str]:
    """(verdict, normalised prediction, normalised gold); verdict None means "ask sympy"."""
    if prediction is None or not prediction.strip():
        return False, "", gold
    if max(len(prediction), len(gold)) > MAX_NORMALIZED_CHARS:  # no number or formula; G^2 pairs of them add up
        return prediction.strip() == gold.strip(), prediction, gold
    prediction, gold = _normalize(prediction), _normalize(gold)
    prediction_number, gold_number = as_plain_number(prediction), as_plain_number(gold)
    if prediction_number is not None and gold_number is not None and math.isfinite(prediction_number + gold_number):
        return math.isclose(prediction_number, gold_number, rel_tol=1e-9, abs_tol=1e-12), prediction, gold
    if prediction == gold:
        return True, prediction, gold
    if (prediction_number is None) != (gold_number is None) and _is_prose(gold if prediction_number is not None
                                                                          else prediction):
        return False, prediction, gold
    prediction, gold = _scientific_as_latex(prediction), _scientific_as_latex(gold)
    if _cost_refusal(prediction) or _cost_refusal(gold):
        return False, prediction, gold
    # math-verify reads "(1,2)" as an interval and lets it equal the set {1,2}; a written set is not a tuple.
    if (_SET_LITERAL.match(prediction) and _ORDERED_LITERAL.match(gold)) or (
        _ORDERED_LITERAL.match(prediction) and _SET_LITERAL.match(gold)
    ):
        return False, prediction, gold
    return None, prediction, gold


def _stopped(prediction: str, gold: str, why: str) -> bool:
    count_stopped(f"math check {why} and scores 0: prediction {prediction[:200]!r}, gold {gold[:200]!r}")
    return False


SYMBOLIC = Handler("reasonrl.rewards.symbolic", "symbolic_equal")
"""math-verify's verdict on normalised answers, as `bounded.call_bounded` and the workers of `check_many` run it."""


def math_equal(prediction: str | None, gold: str, *, timeout_s: float = CHECK_TIMEOUT_S) -> bool:
    """Whether `prediction` is mathematically equal to `gold` (e.g. "0.5" and "\\frac{1}{2}").

    Safe on any thread. A symbolic check runs for at most `timeout_s` seconds (then it is False and counted in
    `timeouts_on_this_thread`): under a timer on the main thread, in a worker process on any other (the module
    docstring says why). For many pairs at once use `check_many`.
    """
    if not timeout_s > 0:
        raise ValueError(f"math_equal: timeout_s must be > 0, got {timeout_s}")
    verdict, prediction, gold = _quick_verdict(prediction, gold)
    if verdict is not None:
        return verdict
    return call_bounded(SYMBOLIC, (prediction, gold), timeout_s, lambda why: _stopped(prediction, gold, why))


def check_many(pairs: Sequence[tuple[str | None, str]], *, workers: int = 0, timeout_s: float = 5.0) -> list[bool]:
    """`math_equal(prediction, gold)` for every (prediction, gold) pair, each within `timeout_s` seconds.

    Plain numbers and the other cheap verdicts are decided here; the rest go to a pool of `workers` worker
    processes (0: one per CPU core), started on first use and kept for later calls (a call asking for fewer
    workers than the pool holds uses some of them). A check that exceeds `timeout_s` is False and its worker is
    killed and replaced (counted in `timeouts_on_this_thread`, as is a worker that dies). Safe to call from any thread;
    concurrent calls take turns on the pool. POSIX only (the workers inherit a socket).
    """
    if workers < 0 or not timeout_s > 0:
        raise ValueError(f"check_many: need workers >= 0 and timeout_s > 0, got workers={workers}, "
                         f"timeout_s={timeout_s}")
    results: list[bool | None] = []
    tasks: dict[int, tuple[str, str]] = {}
    for index, (prediction, gold) in enumerate(pairs):
        verdict, prediction, gold = _quick_verdict(prediction, gold)
        results.append(verdict)
        if verdict is None:
            tasks[index] = (prediction, gold)
    if tasks:
        # Pairs sharing a gold answer go to one worker, which then parses that gold once.
        verdicts = run_in_workers(SYMBOLIC, tasks, timeout_s, workers=workers, affinity=lambda pair: pair[1],
                                  on_stopped=lambda index, why: _stopped(*tasks[index], why))
        for index, verdict in verdicts.items():
            results[index] = verdict
    return [bool(verdict) for verdict in results]


def shutdown_pool() -> None:
    """Stop `check_many`'s worker processes (also done at interpreter exit); the next call starts new ones."""
    shutdown_pools(SYMBOLIC)
