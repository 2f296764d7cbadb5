"""A reasoning-gym dataset's score of one answer, the work `ReasoningGymEnvironment` bounds in time
(`rewards.bounded`): here under a timer on the main thread, in a worker process on any other (an
asynchronous run's producer). Some scorers evaluate the answer (countdown with sympy: `9**9**8`
ran past 20 s), so the answer is model text run in bounded time like the math checks. Making the
dataset that scores (`prepare`) is not the answer's doing, and some datasets take seconds to make
(arc_agi loads the ARC set): `score_answer` never makes it, but says when this process (a fresh
worker) has not, and the caller prepares it under a bound of its own.

This module imports no reasonrl module: the workers of `rewards.bounded` load it alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import reasoning_gym  # here, not at the first task: a worker's start has its own, longer, bound

_scorers: dict[tuple[str, str], Any] = {}


def _key(dataset_name: str, config: Mapping[str, Any]) -> tuple[str, str]:
    return dataset_name, json.dumps(config, sort_keys=True, default=repr)


def prepare(dataset_name: str, config: Mapping[str, Any]) -> None:
    """Make (once per process) the dataset whose `score_answer` scores `dataset_name`'s answers."""
    key = _key(dataset_name, config)
    if key not in _scorers:
        # Scoring reads the entry, not the dataset's items: one item is enough to hold the dataset's settings.
        _scorers[key] = reasoning_gym.create_dataset(dataset_name, seed=0, size=1, **config)


def score_answer(dataset_name: str, config: Mapping[str, Any], answer: str | None,
                 entry: Mapping[str, Any]) -> tuple[str, Any]:
    """("score", the dataset's score of `answer` for `entry`), ("raised", what its scorer raised): scorers that
    parse the answer themselves raise on text they cannot parse, which the caller tells from a broken scorer; or
    ("unprepared", None) when this process has not made the dataset yet (`prepare`)."""
    scorer = _scorers.get(_key(dataset_name, config))
    if scorer is None:
        return "unprepared", None
    try:
        return "score", float(scorer.score_answer(answer, entry))
    except Exception as exc:  # noqa: BLE001 (handed to the caller, which decides whether it stops the run)
        return "raised", f"{type(exc).__name__}: {exc}"
