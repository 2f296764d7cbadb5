"""A run's JSON-lines logs (metrics.jsonl, rollouts.jsonl, updates.jsonl, reward_errors.jsonl),
read one line at a time: the reader that resume, `reasonrl report` and `reasonrl inspect` share,
and the cut a resumed run makes in them.

Every line is a JSON object with an integer "step", written whole with its newline. A last line
without its newline is a write cut off (a run killed mid-write, or still writing): it is dropped
with a warning. Any other line that is not UTF-8, not JSON, not an object, or without an integer
"step" is an error naming the file and the line: no write of a run leaves one.

A resume drops the lines past its checkpoint's step with one truncate of the file at the byte
offset of the first of them, found while streaming: a process killed at any point (even kill -9)
leaves each file whole or cut there, never with a line before it lost.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


class RunFileError(ValueError):
    """A line of a run's log that no run writes; the message names the file, the line and the fix."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Line:
    """A record of a log, with where it lies in the file."""

    number: int  # 1 for the first line
    offset: int  # the byte offset of the line's start
    record: dict[str, Any]


def lines(path: Path, *, cut_off: Callable[[str], None] = warn) -> Iterator[Line]:
    """The records of the log at `path`, streamed; a cut-off last line is dropped, said to `cut_off`."""
    with path.open("rb") as f:
        for number, offset, raw in _raw_lines(f):
            if not raw.endswith(b"\n"):
                if raw.strip():
                    cut_off(f"{path}: skipped the cut-off last line {number} (a write cut short: the run was "
                            "killed while writing it, or is still writing)")
                return
            if raw.strip():
                yield Line(number, offset, parse_line(path, number, raw))


def records(path: Path, *, cut_off: Callable[[str], None] = warn) -> Iterator[dict[str, Any]]:
    """The records of the log at `path` (see `lines`)."""
    return (line.record for line in lines(path, cut_off=cut_off))


def parse_line(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    """Line `number` of `path` as a record, or a RunFileError saying what it is instead."""
    where = f"{path}:{number}"
    fix = f"the file is damaged; delete or repair line {number} (e.g. sed -i '{number}d' {path}) to read the rest"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunFileError(f"{where} is not UTF-8 text (byte {exc.start + 1} of the line); {fix}") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunFileError(f"{where} is not valid JSON ({exc}); {fix}") from None
    if not isinstance(record, dict):
        raise RunFileError(f"{where} is not a JSON object (it is a {type(record).__name__}); {fix}")
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        what = "has no \"step\"" if "step" not in record else f"has a \"step\" that is not an integer ({step!r})"
        raise RunFileError(f"{where} {what}; every line a run writes carries its step: {fix}")
    return record


def truncate_after(path: Path, step: int, *, cut_off: Callable[[str], None] = warn) -> int | None:
    """Drop the lines of the log at `path` from the first one past `step` on (and a cut-off last
    line), in place, with one truncate; the step of the last line kept (None: none kept). The
    lines are in step order, as a run writes them, so nothing after that first line is read."""
    if not path.is_file():
        return None
    end, last = None, None
    with path.open("rb") as f:
        for number, offset, raw in _raw_lines(f):
            if not raw.endswith(b"\n"):
                if raw.strip():
                    cut_off(f"{path}: dropped the cut-off last line {number} (a write cut short when the run "
                            "was killed)")
                end = offset
                break
            if not raw.strip():
                continue
            record = parse_line(path, number, raw)
            if record["step"] > step:
                end = offset
                break
            last = record["step"]
    if end is not None:
        os.truncate(path, end)
    return last


def _raw_lines(f: IO[bytes]) -> Iterator[tuple[int, int, bytes]]:
    """(number, byte offset, bytes) of each line of `f`, its newline included (the last may lack one)."""
    offset = 0
    for number, raw in enumerate(f, start=1):
        yield number, offset, raw
        offset += len(raw)
