"""Pulling the answer out of a completion: the extractors of the "math" reward (`EXTRACTORS`, chosen
by name; `extract_answer`). `auto` takes the most explicit form the text has: the last
`\\boxed{...}`, an `<answer>` block, GSM8K's "#### X", "the answer is X", the last number.
A completion with no extractable answer gets None, which scores 0.

Every pattern here runs on model text of any length, so each is linear in it
(tests/unit/test_reward_time_bounds.py feeds them 100,000-character adversarial texts): no two
unbounded quantifiers that can take the same characters are adjacent, and the searches whose regex
form backtracks (the answer phrase, the <answer> tags, brace matching) are written as forward scans.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from reasonrl.rewards.equivalence import strip_thousands_commas

_BOXED_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
# "\boxed 5": TeX takes the next token as the argument; here, the run up to white space or "$".
_BOXED_UNBRACED = re.compile(r"\\boxed(?![A-Za-z])[ \t]*(?![{\s])([^\s{}$]+)")
_BRACE = re.compile(r"(?<!\\)[{}]")  # escaped braces (\{ \}) are content, not grouping
_NON_SPACE = re.compile(r"\S")
_TAG_OPEN, _TAG_CLOSE = "<answer>", "</answer>"
# "the answer is X", "Final answer: X", "**Answer:** X"; what follows the marker is read by `answer_phrases`.
_ANSWER_MARKER = re.compile(r"answer\s+is|final\s+answer\s*(?:is\s*)?(?:\*+\s*)?:|answer\s*(?:\*+\s*)?:", re.IGNORECASE)
_STARS = re.compile(r"\**")
_COLONS_AND_SPACE = re.compile(r"[:\s]*")
_SENTENCE_END = re.compile(r"\.\s")
# A minus sign right after a word or a closing bracket is subtraction ("3-4"), not a sign.
_NUMBER = re.compile(
    r"(?:(?<![\w)\]])-)?(?:\d+/\d+|\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
)


def _closing_braces(text: str) -> dict[int, int]:
    """The position of the brace that closes each balanced "{" of `text`, by the position of the "{"."""
    closing, open_at = {}, []
    for brace in _BRACE.finditer(text):
        if brace.group() == "{":
            open_at.append(brace.start())
        elif open_at:
            closing[open_at.pop()] = brace.start()
    return closing


def boxed_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) in `text` of the contents of every complete `\\boxed{...}` / `\\fbox{...}` (braces
    balanced) and unbraced `\\boxed 5`, in order of appearance."""
    closing = _closing_braces(text)
    found = [(start.start(), start.end(), closing[start.end() - 1]) for start in _BOXED_START.finditer(text)
             if start.end() - 1 in closing]
    found += [(match.start(), match.start(1), match.end(1)) for match in _BOXED_UNBRACED.finditer(text)]
    return [(begin, end) for _, begin, end in sorted(found)]


def boxed_contents(text: str) -> list[str]:
    """The contents of every complete `\\boxed{...}` / `\\fbox{...}` (braces balanced) and unbraced
    `\\boxed 5`, in order of appearance."""
    return [text[begin:end] for begin, end in boxed_spans(text)]


def is_blank(text: str, start: int, end: int) -> bool:
    """Whether text[start:end] is empty or white space only, without copying it."""
    return _NON_SPACE.search(text, start, end) is None


def answer_tags(text: str) -> list[str]:
    """The contents of the complete <answer>...</answer> blocks of `text`, each closed by the first closing tag
    after it opens (as a lazy regex would find them, but in one forward pass)."""
    found, position = [], 0
    while (start := text.find(_TAG_OPEN, position)) >= 0:
        end = text.find(_TAG_CLOSE, start + len(_TAG_OPEN))
        if end < 0:
            break
        found.append(text[start + len(_TAG_OPEN) : end])
        position = end + len(_TAG_CLOSE)
    return found


def answer_phrases(text: str) -> list[str]:
    """What follows each "the answer is" / "Final answer:" (markdown bold allowed), up to the sentence's end: the
    first ". ", else where only ".", stars and white space are left on the line. The answer may start on a line
    after its marker's.

    These are the matches of the regex `(?:answer\\s+is|final\\s+answer\\s*(?:is)?\\s*\\**\\s*:|answer\\s*\\**\\s*:)
    \\**[:\\s]*(.+?)(?=\\.\\s|\\.?\\**\\s*$)` (ignoring case; "$" at each line end), which took cubic time on a run
    of white space, found in one forward pass (tests/unit/test_reward_time_bounds.py checks they agree)."""
    found, position, line_end, may_end_at = [], 0, -1, 0
    while (marker := _ANSWER_MARKER.search(text, position)) is not None:
        start = _answer_start(text, marker.end())
        if start is None:  # only line breaks follow: no answer here, nor at a marker inside this one
            position = marker.start() + 1
            continue
        if start > line_end:  # answers come in order: a line's end is found once
            line_end, may_end_at = _line_end(text, start)
        last = max(may_end_at, start + 1)  # an answer holds at least one character
        sentence_end = _SENTENCE_END.search(text, start + 1, last + 1)
        end = sentence_end.start() if sentence_end is not None else last
        found.append(text[start:end])
        position = end
    return found


def _answer_start(text: str, after_marker: int) -> int | None:
    """Where the answer after a marker ending at `after_marker` starts: past its stars, colons and white space; when
    that run reaches the end of the text, at the run's last character that is not a line break (else its last
    star); None when there is none."""
    stars_end = _STARS.match(text, after_marker).end()
    start = _COLONS_AND_SPACE.match(text, stars_end).end()
    if start < len(text):
        return start
    if rest := text[stars_end:].rstrip("\n"):
        return stars_end + len(rest) - 1
    return stars_end - 1 if stars_end > after_marker else None


def _line_end(text: str, position: int) -> tuple[int, int]:
    """The end of the line holding `position`, and the earliest point at which an answer on that line may end
    short of a ". ": where only a ".", stars and white space are left on the line."""
    line_start = text.rfind("\n", 0, position) + 1
    line_end = text.find("\n", position)
    line_end = len(text) if line_end < 0 else line_end
    body = text[line_start:line_end].rstrip()
    may_end_at = line_start + len(body.rstrip("*"))
    if may_end_at > line_start and text[may_end_at - 1] == ".":
        may_end_at -= 1
    return line_end, may_end_at



def _nonempty(text: str | None) -> str | None:
    text = text.strip() if text is not None else None
    return text or None


def extract_boxed(text: str) -> str | None:
    spans = boxed_spans(text)
    return _nonempty(text[slice(*spans[-1])]) if spans else None


def extract_answer_tag(text: str) -> str | None:
    contents = answer_tags(text)
    return _nonempty(contents[-1]) if contents else None


def extract_gsm8k(text: str) -> str | None:
    if "####" not in text:
        return None
    return _nonempty(strip_thousands_commas(text.rsplit("####", 1)[1].split("\n", 1)[0]))


def extract_answer_phrase(text: str) -> str | None:
    """The last "the answer is X" / "Final answer: X" (markdown bold allowed), up to the sentence's end."""
    matches = answer_phrases(text)
    return _nonempty(matches[-1].strip().strip("*").strip().strip("$")) if matches else None


def extract_last_number(text: str) -> str | None:
    matches = _NUMBER.findall(text)
    return strip_thousands_commas(matches[-1]) if matches else None


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
