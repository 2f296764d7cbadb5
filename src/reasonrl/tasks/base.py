"""A Task is a training split and a held-out split of Problems; loaders build them from records.

Records are plain dicts, from a Python list, a local file (JSONL, JSON list, CSV or Parquet, chosen
by suffix), a Hugging Face `datasets.Dataset`, or a hub id written `hf:NAME[:CONFIG][@SPLIT]`
(e.g. "hf:openai/gsm8k:main@test"). A bad row is an error naming the row and the field, never a
silently skipped problem.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.types import Problem

HF_PREFIX = "hf:"
_HF_SPEC = re.compile(r"hf:(?P<path>[^:@]+)(?::(?P<config>[^:@]+))?(?:@(?P<split>[^:@]+))?")
_FIRST_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")

Records = Iterable[Mapping[str, Any]] | str | Path
"""Rows as dicts: a list (or `datasets.Dataset`), a file path, or an "hf:NAME[:CONFIG][@SPLIT]" hub id."""


class DatasetError(ValueError):
    """A dataset row or file that cannot be turned into problems."""


# What the CLI (task.prompt_template) and Task.from_records both put around a problem's text, so that
# the same records give the same prompts either way.
DEFAULT_PROMPT_TEMPLATE = "{prompt}\nPut the final answer in \\boxed{{}}."


@dataclass(frozen=True)
class Task:
    """Problems to train on and held-out problems to evaluate on (disjoint)."""

    name: str
    train: Sequence[Problem]
    test: Sequence[Problem]

    @classmethod
    def from_records(cls, train: Records, test: Records | None = None, *,
                     prompt_field: str = "question", answer_field: str = "answer",
                     prompt_template: str = DEFAULT_PROMPT_TEMPLATE, test_size: int = 0, name: str = "custom",
                     difficulty_field: str | None = None, tag_source: bool = False) -> Task:
        """A task from lists of dicts, files or hub ids, text prompts put through `prompt_template`
        (by default the CLI's task.prompt_template); without `test`, the last `test_size`
        training records are held out. An "hf:" id without "@SPLIT" reads split "train" for
        `train` and "test" for `test`. `tag_source` sets every problem's metadata["source"]
        to `name` (what per-source metrics and mixtures group by)."""
        fields = {"prompt_field": prompt_field, "answer_field": answer_field, "prompt_template": prompt_template,
                  "difficulty_field": difficulty_field, "task_name": name if tag_source else None}
        train_problems = problems_from_records(_records(train, "train"), source=_where(train), **fields)
        if test is not None:
            test_problems = problems_from_records(_records(test, "test"), source=_where(test), **fields)
        else:
            if test_size >= len(train_problems):
                raise DatasetError(f"test_size={test_size} leaves no training problems out of {len(train_problems)}")
            cut = len(train_problems) - test_size
            train_problems, test_problems = train_problems[:cut], train_problems[cut:]
        return cls(name=name, train=train_problems, test=test_problems)


def _records(data: Records, default_split: str) -> Iterable[Mapping[str, Any]]:
    if isinstance(data, str) and data.startswith(HF_PREFIX):
        path, config, split = parse_hf_spec(data)
        return load_hf(path, config, split=split or default_split)
    if isinstance(data, (str, Path)):
        return read_records(data)
    if isinstance(data, Mapping):  # e.g. a datasets.DatasetDict, whose iteration yields split names
        raise DatasetError(f"got a mapping of splits ({', '.join(map(str, data))}), not rows; "
                           "pass one split, e.g. dataset['train']")
    return data


def _where(data: object) -> str:
    return str(data) if isinstance(data, (str, Path)) else "records"


def parse_hf_spec(spec: str) -> tuple[str, str | None, str | None]:
    """("openai/gsm8k", "main", "test") from "hf:openai/gsm8k:main@test"; config and split are optional."""
    match = _HF_SPEC.fullmatch(spec.strip())
    if not match:
        raise DatasetError(f"{spec!r} is not a hub dataset id; write hf:NAME[:CONFIG][@SPLIT], "
                           "e.g. hf:openai/gsm8k:main@test")
    return match["path"], match["config"], match["split"]


def load_hf(path: str, config: str | None = None, *, split: str = "train", **kwargs: Any) -> list[dict[str, Any]]:
    """The rows of one split of a Hugging Face dataset (`datasets.load_dataset(path, config,
    split=split, **kwargs)`): a hub id, or a local directory or data files the library can read."""
    try:
        import datasets
    except ImportError as exc:
        raise DatasetError(f"loading {path!r} from the Hugging Face hub needs the 'datasets' package "
                           "(pip install datasets), or download it to a JSONL/CSV/Parquet file") from exc
    rows = datasets.load_dataset(path, config, split=split, **kwargs)
    return [dict(row) for row in rows]


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a .jsonl, .json (a list of objects), .csv or .parquet file; a text format may be
    gzip-compressed (.jsonl.gz, .json.gz, .csv.gz)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".gz" and Path(path.stem).suffix.lower() in (".jsonl", ".json", ".csv"):
        suffix = Path(path.stem).suffix.lower()
    if suffix not in _READERS:
        raise DatasetError(f"{path}: unknown file type {suffix!r}; use one of {', '.join(sorted(_READERS))} "
                           "(the text ones also gzip-compressed, e.g. .jsonl.gz)")
    return _READERS[suffix](path)


def read_text(path: str | Path, data: bytes | None = None) -> str:
    """The UTF-8 text of `path` (or of its bytes `data`, e.g. decompressed); a DatasetError naming the
    file and line when it is not UTF-8. A .gz file is decompressed."""
    path = Path(path)
    if data is None:
        data = path.read_bytes()
        if path.suffix.lower() == ".gz":
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError) as exc:
                raise DatasetError(f"{path}: not a readable gzip file ({exc})") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        before = data[max(line_start, exc.start - 30):exc.start]
        raise DatasetError(f"{path}:{line}: not UTF-8 text ({exc.reason}: byte {data[exc.start:exc.end]!r} at "
                           f"column {exc.start - line_start + 1}, after {before!r}); re-encode the file as UTF-8, "
                           "e.g. iconv -f latin1 -t utf-8") from None


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {str(path)!r} does not exist")
    rows = []
    # Split on newlines only: JSON strings may hold U+2028 and other characters str.splitlines splits on.
    for line_number, line in enumerate(read_text(path).split("\n"), start=1):
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


def _read_json(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(rows, list):
        raise DatasetError(f"{path}: expected a JSON list of objects, got {type(rows).__name__} "
                           "(for one object per line, name the file .jsonl)")
    return rows


def _read_csv(path: Path) -> list[dict[str, Any]]:
    # Every cell is text: numeric answers stay as written ("0.50" is not turned into "0.5").
    return [dict(row) for row in csv.DictReader(io.StringIO(read_text(path), newline=""))]


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet
    except ImportError as exc:
        raise DatasetError(f"reading {path} needs the 'pyarrow' package (pip install pyarrow), "
                           "or convert the file to JSONL or CSV") from exc
    return pyarrow.parquet.read_table(path).to_pylist()


_READERS = {".jsonl": read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


def problems_from_records(records: Iterable[Mapping[str, Any]], *, prompt_field: str, answer_field: str,
                          prompt_template: str = "{prompt}", source: str = "records",
                          difficulty_field: str | None = None, task_name: str | None = None) -> list[Problem]:
    """Problems from dicts: `prompt_field` (text, or a list of chat messages) through
    `prompt_template`, and `answer_field` as the gold answer (numbers are turned into text).

    The other fields are kept in the metadata; `difficulty_field` (a number, or text holding one
    such as "Level 3") is also stored as a float under "difficulty", and `task_name` under
    "source". `source` names where the records come from in error messages."""
    problems = []
    for index, row in enumerate(records):
        here = f"{source} row {index}"
        if not isinstance(row, Mapping):
            raise DatasetError(f"{here}: expected a dict, got {type(row).__name__}")
        for field_name in (prompt_field, answer_field, *([difficulty_field] if difficulty_field else [])):
            if field_name not in row:
                raise DatasetError(f"{here}: missing field {field_name!r} (fields: {', '.join(map(str, row))})")
        prompt, answer = row[prompt_field], row[answer_field]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise DatasetError(f"{here}: field {answer_field!r} must be a string or number, got {answer!r}")
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DatasetError(f"{here}: field {prompt_field!r} is empty")
            prompt = prompt_template.format(prompt=prompt)
        elif not _is_chat(prompt):
            raise DatasetError(f"{here}: field {prompt_field!r} must be text or a list of "
                               "{'role': ..., 'content': ...} messages")
        metadata = {k: v for k, v in row.items() if k not in (prompt_field, answer_field)}
        if difficulty_field:
            metadata["difficulty"] = _difficulty(row[difficulty_field], f"{here}: field {difficulty_field!r}")
        if task_name is not None:
            metadata["source"] = task_name
        problems.append(Problem(id=str(row.get("id", index)), prompt=prompt, answer=str(answer), metadata=metadata))
    if not problems:
        raise DatasetError(f"{source}: no problems")
    if blank := sum(not problem.answer.strip() for problem in problems):
        warnings.warn(f"{source}: {blank} of {len(problems)} rows have an empty {answer_field!r}: a reward that "
                      "checks answers scores every reply to them 0 (a label-free one, e.g. ttrl, reads none)",
                      stacklevel=2)
    return problems


def _difficulty(value: object, here: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    match = _FIRST_NUMBER.search(value) if isinstance(value, str) else None
    if not match:
        raise DatasetError(f"{here} must be a number or text holding one (e.g. 'Level 3'), got {value!r}")
    return float(match.group())


def prompt_text(problem: Problem) -> str:
    """The prompt as one text: itself, or its chat messages' contents joined by newlines."""
    if isinstance(problem.prompt, str):
        return problem.prompt
    return "\n".join(message["content"] for message in problem.prompt)


def _is_chat(value: object) -> bool:
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in value))
