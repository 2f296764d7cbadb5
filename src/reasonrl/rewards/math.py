"""Math answer extraction and equivalence: the verifier behind the "math" reward.

An answer is first pulled out of the completion by an extractor (`EXTRACTORS`, chosen by name),
then compared with the gold answer by `math_equal`: plain numbers are compared directly (this
runs thousands of times per training step), anything else symbolically with math_verify.
A completion with no extractable or unparseable answer scores 0; that is a legitimate reward,
not an error.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from math_verify import parse, verify

from reasonrl.types import Problem

_BOXED_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"(?<!\\)[{}]")  # escaped braces (\{ \}) are content, not grouping
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_PHRASE = re.compile(r"answer is[:\s]*(.+?)(?=\.\s|\.?$)", re.IGNORECASE | re.MULTILINE)
# A minus sign right after a word or a closing bracket is subtraction ("3-4"), not a sign.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]])-)?(?:\d+/\d+|\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?)"
)
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def boxed_contents(text: str) -> list[str]:
    """The contents of every complete `\\boxed{...}` / `\\fbox{...}`, in order, braces balanced."""
    contents = []
    for start in _BOXED_START.finditer(text):
        depth = 1
        for brace in _BRACE.finditer(text, start.end()):
            depth += 1 if brace.group() == "{" else -1
            if depth == 0:
                contents.append(text[start.end() : brace.start()])
                break
    return contents


def _strip_thousands_commas(text: str) -> str:
    return _THOUSANDS_COMMA.sub("", text)


def _nonempty(text: str | None) -> str | None:
    text = text.strip() if text is not None else None
    return text or None


def extract_boxed(text: str) -> str | None:
    contents = boxed_contents(text)
    return _nonempty(contents[-1]) if contents else None


def extract_answer_tag(text: str) -> str | None:
    matches = _ANSWER_TAG.findall(text)
    return _nonempty(matches[-1]) if matches else None


def extract_gsm8k(text: str) -> str | None:
    if "####" not in text:
        return None
    return _nonempty(_strip_thousands_commas(text.rsplit("####", 1)[1].split("\n", 1)[0]))


def extract_answer_phrase(text: str) -> str | None:
    matches = _ANSWER_PHRASE.findall(text)
    return _nonempty(matches[-1].strip().strip("$")) if matches else None


def extract_last_number(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    return _strip_thousands_commas(matches[-1]) if matches else None


def extract_auto(text: str) -> str | None:
    """The answer found by the most explicit extractor that finds one."""
    for extractor in _AUTO_ORDER:
        if (answer := extractor(text)) is not None:
            return answer
    return None


def extract_answer(text: str, mode: str = "auto") -> str | None:
    """The answer in `text` according to extractor `mode` (a key of `EXTRACTORS`), or None."""
    if mode not in EXTRACTORS:
        raise ValueError(f"unknown extract mode {mode!r}; allowed: {sorted(EXTRACTORS)}")
    return EXTRACTORS[mode](text)


def _as_plain_number(text: str) -> float | None:
    text = _strip_thousands_commas(text.strip())
    return float(text) if _PLAIN_NUMBER.fullmatch(text) else None


# Cached because every completion in a group is checked against the same gold answer.
@lru_cache(maxsize=65536)
def _parse_latex(text: str, timeout: int | None) -> tuple:
    # Unwrapped LaTeX such as "x+1" is not recognised by math_verify's parser, so wrap it.
    wrapped = text if text.startswith("$") and text.endswith("$") else f"${text}$"
    return tuple(parse(wrapped, parsing_timeout=timeout))


def math_equal(prediction: str | None, gold: str) -> bool:
    """Whether `prediction` is mathematically equal to `gold` (e.g. "0.5" and "\\frac{1}{2}")."""
    if not prediction or not prediction.strip():
        return False
    prediction_number, gold_number = _as_plain_number(prediction), _as_plain_number(gold)
    if prediction_number is not None and gold_number is not None:
        return math.isclose(prediction_number, gold_number, rel_tol=1e-9, abs_tol=1e-12)
    # math_verify's timeouts use signal.alarm, which only works on the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold_parsed, prediction_parsed = _parse_latex(gold, timeout), _parse_latex(prediction, timeout)
    if not gold_parsed or not prediction_parsed:
        return False
    return verify(list(gold_parsed), list(prediction_parsed), timeout_seconds=timeout)


@dataclass(frozen=True)
class MathReward:
    """1.0 if the answer extracted from the completion equals `problem.answer`, else 0.0.

    A problem whose metadata says `answer_type="number"` only accepts a plain number: math-verify
    evaluates expressions, so restating the question ("\\boxed{74 + 20}") would otherwise count as
    the answer to "What is 74 + 20?", and a policy learns that within a few steps.
    """

    extract: str = "auto"

    def __post_init__(self) -> None:
        if self.extract not in EXTRACTORS:
            raise ValueError(
                f"MathReward: unknown extract {self.extract!r}; allowed: {sorted(EXTRACTORS)}"
            )

    def __call__(self, completion: str, problem: Problem) -> float:
        prediction = EXTRACTORS[self.extract](completion)
        if problem.metadata.get("answer_type") == "number" and (prediction is None or _as_plain_number(prediction) is None):
            return 0.0
        return 1.0 if math_equal(prediction, problem.answer) else 0.0


_AUTO_ORDER = (
    extract_boxed,
    extract_answer_tag,
    extract_gsm8k,
    extract_answer_phrase,
    extract_last_number,
)

EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "auto": extract_auto,
    "boxed": extract_boxed,
    "answer_tag": extract_answer_tag,
    "gsm8k": extract_gsm8k,
    "answer_phrase": extract_answer_phrase,
    "last_number": extract_last_number,
}
