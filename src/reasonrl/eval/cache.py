"""The caches of `reasonrl eval` in its output directory: generated groups (OUT/completions.jsonl,
one line per task, problem, sampling settings and model) and beam search results (OUT/beams.jsonl,
per task, problem, search settings, N and models). Both are append-only JSON lines: a line cut
short by a crash is cut from the file and its problem runs again; any other unreadable line is an
`EvalOutputError` that names it. A cached record is reused only for the same problem text and
answer, never for another problem under the same id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from reasonrl.eval.search import Beam, BeamResult
from reasonrl.types import Completion, Group, Problem


class EvalOutputError(ValueError):
    """The output directory cannot be used as it is: a file, another model's evaluation, or an unreadable cache."""


def _cache_records(path: Path, fields: tuple[str, ...]) -> list[dict]:
    """The records of a cache file, each a JSON object with `fields`. A last line cut short by a
    crash (no newline, not a record) is cut from the file: its problem runs again, and the next
    record starts a line of its own. Any other unreadable line is an EvalOutputError naming it."""
    if not path.exists():
        return []
    data = path.read_bytes()
    *lines, tail = data.split(b"\n")  # tail: b"" when the file ends with a newline
    records = [_cache_record(path, number, line, fields) for number, line in enumerate(lines, 1) if line.strip()]
    if tail.strip():
        try:
            records.append(_cache_record(path, len(lines) + 1, tail, fields))
        except EvalOutputError:  # cut short by a crash
            with path.open("r+b") as f:
                f.truncate(len(data) - len(tail))
        else:  # a whole record without its newline
            with path.open("ab") as f:
                f.write(b"\n")
    return records


def _cache_record(path: Path, number: int, line: bytes, fields: tuple[str, ...]) -> dict:
    fix = "delete that line (its problem is generated again) or the file"
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise EvalOutputError(f"{path}, line {number}: not UTF-8 text; {fix}") from None
    except json.JSONDecodeError as exc:
        raise EvalOutputError(f"{path}, line {number}: not a JSON record ({exc.msg}); {fix}") from None
    if not isinstance(record, dict) or (missing := [f for f in fields if f not in record]):
        raise EvalOutputError(f"{path}, line {number}: not a cache record (it lacks "
                              f"{', '.join(missing) if isinstance(record, dict) else 'every field'}); {fix}")
    return record


def _malformed(path: Path, task: str, problem: Problem, exc: Exception) -> EvalOutputError:
    return EvalOutputError(f"{path}: the record of task {task!r}, problem {problem.id!r} is malformed "
                           f"({type(exc).__name__}: {exc}); delete its line or the file")


def _problem_key(problem: Problem) -> str:
    """A problem's text and answer: a cached group is reused for the same problem only, not for
    another one under the same id (another task configuration, a changed dataset)."""
    return hashlib.sha256(json.dumps([problem.prompt, problem.answer]).encode()).hexdigest()[:16]


class CompletionCache:
    """Generated groups on disk, one JSON line per (task, problem, sampling settings and model)."""

    FIELDS = ("task", "problem_id", "sampling", "prompt_ids", "completions")

    def __init__(self, path: Path, sampling_key: str):
        self.path, self.sampling_key = path, sampling_key
        self.stored: dict[tuple[str, str, str], dict] = {
            (record["task"], record["problem_id"], record.get("problem", "")): record
            for record in _cache_records(path, self.FIELDS) if record["sampling"] == sampling_key}

    def get(self, task: str, problem: Problem) -> Group | None:
        record = self.stored.get((task, problem.id, _problem_key(problem)))
        if record is None:
            return None
        try:
            completions = tuple(_completion(c) for c in record["completions"])
            return Group(problem=problem, prompt_ids=tuple(record["prompt_ids"]), completions=completions)
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(self.path, task, problem, exc) from exc

    def put(self, task: str, group: Group) -> None:
        record = {"task": task, "problem_id": group.problem.id, "problem": _problem_key(group.problem),
                  "sampling": self.sampling_key, "prompt_ids": list(group.prompt_ids),
                  "completions": [asdict(c) for c in group.completions]}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def _completion(record: dict) -> Completion:
    """A cached completion; an episode with its record, which its reward reads."""
    fields = {"token_ids": tuple(record["token_ids"]), "text": record["text"], "logprobs": tuple(record["logprobs"]),
              "finish_reason": record["finish_reason"]}
    if record.get("episode") is None:
        return Completion(**fields)
    from reasonrl.agents.engine import Episode, EpisodeCompletion, Turn

    episode = record["episode"]
    return EpisodeCompletion(**fields, loss_mask=tuple(record["loss_mask"]),
                             episode=Episode(turns=tuple(Turn(**turn) for turn in episode["turns"]),
                                             correct=episode["correct"], done=episode["done"],
                                             timeouts=episode.get("timeouts", 0)))


class BeamCache:
    """Beam search results on disk, one JSON line per (task, problem, search settings, N and models)."""

    FIELDS = ("task", "search", "problem_id", "tokens", "samples", "rounds", "solutions")

    def __init__(self, path: Path, model_key: str):
        self.path, self.model_key = path, model_key
        self.stored: dict[tuple[str, str, str, str], dict] = {
            (record["task"], record["search"], record["problem_id"], record.get("problem", "")): record
            for record in _cache_records(path, self.FIELDS)}

    def get(self, task: str, key: str, problem: Problem) -> BeamResult | None:
        record = self.stored.get((task, key, problem.id, _problem_key(problem)))
        if record is None:
            return None
        try:
            solutions = tuple(Beam(**{**b, "token_ids": tuple(b["token_ids"]), "logprobs": tuple(b["logprobs"]),
                                      "steps": tuple(b["steps"]), "step_scores": tuple(b["step_scores"])})
                              for b in record["solutions"])
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(self.path, task, problem, exc) from exc
        return BeamResult(problem=problem, solutions=solutions, tokens=record["tokens"], samples=record["samples"],
                          rounds=record["rounds"])

    def put(self, task: str, key: str, result: BeamResult) -> None:
        problem = _problem_key(result.problem)
        record = {"task": task, "problem_id": result.problem.id, "problem": problem, "search": key,
                  "tokens": result.tokens, "samples": result.samples, "rounds": result.rounds,
                  "solutions": [asdict(beam) for beam in result.solutions]}
        self.stored[task, key, result.problem.id, problem] = record
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
