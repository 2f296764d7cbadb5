"""math-verify's verdict on two normalised answers (Kydlíček 2025, github.com/huggingface/Math-Verify), with
its own timeouts off: the caller bounds the time (`rewards.bounded`), here or in a worker process.

This module imports no reasonrl module: the workers of `rewards.bounded` load it alone.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from math_verify import parse, verify


class _OwnTimeouts(logging.Filter):
    """Drops math-verify's one-time warning that, its timeouts being off, the caller must bound the time: we do."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _module in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_module).addFilter(_OwnTimeouts())


# Cached because every completion in a group is checked against the same gold answer.
@lru_cache(maxsize=65536)
def parse_latex(text: str) -> tuple:
    # Unwrapped LaTeX such as "x+1" is not recognised by math_verify's parser, so wrap it.
    wrapped = text if text.startswith("$") and text.endswith("$") else f"${text}$"
    return tuple(parse(wrapped, parsing_timeout=None))


def symbolic_equal(prediction: str, gold: str) -> bool:
    """math-verify's verdict, without its own timeouts: the caller bounds the time."""
    gold_parsed, prediction_parsed = parse_latex(gold), parse_latex(prediction)
    if not gold_parsed or not prediction_parsed:
        return False
    return verify(list(gold_parsed), list(prediction_parsed), timeout_seconds=None)
