"""A Task is a training split and a held-out split of Problems; loaders build them from records.

Records are plain dicts (from a Python list or a JSONL file); a bad row is an error naming the
row and the field, never a silently skipped problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.types import Problem


class DatasetError(ValueError):
    """A dataset row or file that cannot be turned into problems."""


@dataclass(frozen=True)
class Task:
    """Problems to train on and held-out problems to evaluate on (disjoint)."""

    name: str
    train: Sequence[Problem]
    test: Sequence[Problem]

    @classmethod
    def from_records(cls, train: Iterable[Mapping[str, Any]] | str | Path,
                     test: Iterable[Mapping[str, Any]] | str | Path | None = None, *,
                     prompt_field: str = "question", answer_field: str = "answer",
                     prompt_template: str = "{prompt}", test_size: int = 0, name: str = "custom") -> Task:
        """A task from lists of dicts or JSONL paths; without `test`, the last `test_size`
        training records are held out."""
        fields = dict(prompt_field=prompt_field, answer_field=answer_field, prompt_template=prompt_template)
        train_problems = problems_from_records(_records(train), source=_source(train), **fields)
        if test is not None:
            test_problems = problems_from_records(_records(test), source=_source(test), **fields)
        else:
            if test_size >= len(train_problems):
                raise DatasetError(f"test_size={test_size} leaves no training problems out of {len(train_problems)}")
            cut = len(train_problems) - test_size
            train_problems, test_problems = train_problems[:cut], train_problems[cut:]
        return cls(name=name, train=train_problems, test=test_problems)


def _records(data: Iterable[Mapping[str, Any]] | str | Path) -> Iterable[Mapping[str, Any]]:
    return read_jsonl(data) if isinstance(data, (str, Path)) else data


def _source(data: object) -> str:
    return str(data) if isinstance(data, (str, Path)) else "records"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {str(path)!r} does not exist")
    rows = []
    with path.open() as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{line_number}: not valid JSON: {exc}") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def problems_from_records(records: Iterable[Mapping[str, Any]], *, prompt_field: str, answer_field: str,
                          prompt_template: str = "{prompt}", source: str = "records") -> list[Problem]:
    """Problems from dicts: `prompt_field` (text, or a list of chat messages) through
    `prompt_template`, and `answer_field` as the gold answer (numbers are turned into text)."""
    problems = []
    for index, row in enumerate(records):
        where = f"{source} row {index}"
        if not isinstance(row, Mapping):
            raise DatasetError(f"{where}: expected a dict, got {type(row).__name__}")
        for field_name in (prompt_field, answer_field):
            if field_name not in row:
                raise DatasetError(f"{where}: missing field {field_name!r} (fields: {', '.join(map(str, row))})")
        prompt, answer = row[prompt_field], row[answer_field]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise DatasetError(f"{where}: field {answer_field!r} must be a string or number, got {answer!r}")
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DatasetError(f"{where}: field {prompt_field!r} is empty")
            prompt = prompt_template.format(prompt=prompt)
        elif not _is_chat(prompt):
            raise DatasetError(f"{where}: field {prompt_field!r} must be text or a list of "
                               "{'role': ..., 'content': ...} messages")
        metadata = {k: v for k, v in row.items() if k not in (prompt_field, answer_field)}
        problems.append(Problem(id=str(row.get("id", index)), prompt=prompt, answer=str(answer), metadata=metadata))
    if not problems:
        raise DatasetError(f"{source}: no problems")
    return problems


def _is_chat(value: object) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in value))
