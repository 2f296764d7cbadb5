"""Built-in math benchmarks read from a local data directory: GSM8K, MATH-500, AIME 2024, AMC 2023
and Minerva's OCW-Courses set.

- gsm8k: Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems" (train 7473, test 1319);
  the gold answer is the text after "####", thousands commas removed.
- math500: the 500-problem MATH subset of Lightman et al. 2023, "Let's Verify Step by Step", drawn
  from MATH (Hendrycks et al. 2021); the gold answer is the solution's last \\boxed{}, else the text
  after "The answer is:".
- aime24: AIME 2024 I and II (30 problems); integer answers, leading zeros dropped ("025" -> "25").
- amc23: AMC 2023 (40 problems); numeric answers, integral floats as integers (27.0 -> "27").
- minerva_math: the OCW-Courses set of Lewkowycz et al. 2022, "Solving Quantitative Reasoning
  Problems with Language Models" (272 problems); the gold answer is the solution's last \\boxed{}.

Only gsm8k has a training split; the others are evaluation sets (`train` is empty). A benchmark
lives in `DATA_DIR/<name>/<split>.<jsonl|jsonl.gz|json|csv|parquet>`. `DATA_DIR` is the `data_dir`
argument, else the `REASONRL_DATA` environment variable, else the copies shipped in the package
(`reasonrl/data/`, gzip-compressed JSONL; their sources, licences and row counts are in its
README.md), so the benchmarks work offline wherever reasonrl is installed. Each problem
keeps its row's other fields in its metadata (the full worked solution under "solution"), with
metadata["source"] = the benchmark name; a training problem whose normalised prompt equals a test
problem's is dropped, so the splits never share a question. With `hub=True`, gsm8k, math500 and
aime24 are read from their Hugging Face hub copies (openai/gsm8k, HuggingFaceH4/MATH-500,
HuggingFaceH4/aime_2024) instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.rewards.answers import boxed_contents, extract_gsm8k
from reasonrl.tasks.base import (
    DatasetError,
    Task,
    load_hf,
    parse_hf_spec,
    problems_from_records,
    prompt_text,
    read_records,
)
from reasonrl.tasks.decontamination import normalized_text
from reasonrl.types import Problem

DATA_ENV = "REASONRL_DATA"
_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".csv", ".parquet")
PACKAGED_DATA = Path(__file__).resolve().parents[1] / "data"
"""The benchmark copies shipped in the package (reasonrl/data/<name>/<split>.jsonl.gz)."""
_ANSWER_TAIL = "The answer is:"
_INTEGER = re.compile(r"[-+]?\d+")


@dataclass(frozen=True)
class Benchmark:
    """How the rows of one benchmark become problems: the prompt is the first of `prompt_fields`
    the rows have, the gold answer is `gold(row)`; `splits` are the files it ships."""

    name: str
    splits: tuple[str, ...]
    prompt_fields: tuple[str, ...]
    gold: Callable[[Mapping[str, Any]], str]
    hub: Mapping[str, str] = field(default_factory=dict)
    """split -> "hf:NAME[:CONFIG]@SPLIT" of a hub copy with the same fields, read with hub=True."""

    @property
    def has_train(self) -> bool:
        return "train" in self.splits


def _gsm8k_gold(row: Mapping[str, Any]) -> str:
    answer = extract_gsm8k(str(_field(row, "answer")))
    if answer is None:
        raise ValueError("field 'answer' has no '#### N' final line")
    return answer


def _final_answer(solution: str) -> str:
    boxed = boxed_contents(solution)
    if boxed and boxed[-1].strip():
        return boxed[-1].strip()
    if _ANSWER_TAIL in solution:
        return solution.rsplit(_ANSWER_TAIL, 1)[1].strip()
    raise ValueError(f"the solution has no \\boxed{{}} and no {_ANSWER_TAIL!r} tail")


def _math500_gold(row: Mapping[str, Any]) -> str:
    # The hub copy (HuggingFaceH4/MATH-500) has the solution under "solution" and the final answer under "answer";
    # the packaged copy has only "answer", holding the whole solution.
    if "solution" in row and "answer" in row:
        return str(row["answer"]).strip()
    return _final_answer(str(_field(row, "answer")))


def _minerva_gold(row: Mapping[str, Any]) -> str:
    return _final_answer(str(_field(row, "solution")))


def _number_gold(row: Mapping[str, Any]) -> str:
    answer = _field(row, "answer")
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    text = str(answer).strip()
    return str(int(text)) if _INTEGER.fullmatch(text) else text


def _field(row: Mapping[str, Any], name: str) -> Any:
    if name not in row:
        raise ValueError(f"missing field {name!r} (fields: {', '.join(map(str, row))})")
    return row[name]


BENCHMARKS: dict[str, Benchmark] = {
    "gsm8k": Benchmark("gsm8k", ("train", "test"), ("question",), _gsm8k_gold,
                       hub={"train": "hf:openai/gsm8k:main@train", "test": "hf:openai/gsm8k:main@test"}),
    "math500": Benchmark("math500", ("test",), ("problem", "question"), _math500_gold,
                         hub={"test": "hf:HuggingFaceH4/MATH-500@test"}),
    "aime24": Benchmark("aime24", ("test",), ("problem", "question"), _number_gold,
                        hub={"test": "hf:HuggingFaceH4/aime_2024@train"}),  # its only split
    "amc23": Benchmark("amc23", ("test",), ("problem", "question"), _number_gold),
    "minerva_math": Benchmark("minerva_math", ("test",), ("problem", "question"), _minerva_gold),
}


def benchmark_task(name: str, *, data_dir: str | Path | None = None, train_size: int | None = None,
                   test_size: int | None = None, prompt_template: str = "{prompt}", hub: bool = False) -> Task:
    """Benchmark `name` (a key of BENCHMARKS) as a Task; `train_size` / `test_size` keep the first
    problems of each split (None: all of them). The data directory is `data_dir`, else
    $REASONRL_DATA, else the copies shipped in the package; `hub=True` reads the benchmark's Hugging
    Face hub copy (needs the `datasets` package and internet) instead."""
    if name not in BENCHMARKS:
        raise DatasetError(f"unknown benchmark {name!r}; built-in: {', '.join(sorted(BENCHMARKS))}")
    benchmark = BENCHMARKS[name]
    if hub and not benchmark.hub:
        raise DatasetError(f"{name} has no known hub copy; read it from a data directory (data_dir or ${DATA_ENV})")
    root = None if hub else find_data_dir(data_dir)
    test = _first(load_split(benchmark, "test", root, prompt_template), test_size, name, "test")
    if not benchmark.has_train and train_size:
        raise DatasetError(f"{name} is an evaluation set without a training split; set train_size to 0 "
                           "or train on another task")
    if not benchmark.has_train or train_size == 0:  # e.g. reasonrl eval: the training split is not read
        return Task(name=name, train=[], test=test)
    train = _first(load_split(benchmark, "train", root, prompt_template), train_size, name, "train")
    test_prompts = {normalized_text(prompt_text(problem)) for problem in test}
    train = [problem for problem in train if normalized_text(prompt_text(problem)) not in test_prompts]
    return Task(name=name, train=train, test=test)


def load_split(benchmark: Benchmark, split: str, data_dir: Path | None,
               prompt_template: str = "{prompt}") -> list[Problem]:
    """The problems of one split of `benchmark` under `data_dir` (None: its hub copy), with ids
    "<name>-<split>-<row id or index>"."""
    if data_dir is None:
        where = benchmark.hub[split]
        hub_name, config, hub_split = parse_hf_spec(where)
        rows = load_hf(hub_name, config, split=hub_split or split)
    else:
        path = _split_file(data_dir / benchmark.name, split)
        where, rows = str(path), read_records(path)
    if not rows:
        raise DatasetError(f"{where}: no problems")
    prompt_field = next((f for f in benchmark.prompt_fields if f in rows[0]), None)
    if prompt_field is None:
        raise DatasetError(f"{where} row 0: none of the prompt fields {list(benchmark.prompt_fields)} "
                           f"(fields: {', '.join(map(str, rows[0]))})")
    difficulty_field = "level" if "level" in rows[0] else None  # MATH's "Level 1".."Level 5" when present
    prepared = []
    for index, row in enumerate(rows):
        try:
            gold = benchmark.gold(row)
        except ValueError as exc:
            raise DatasetError(f"{where} row {index}: {exc}") from exc
        # aime24 and amc23 repeat the problem under "question"; one copy is enough.
        duplicates = {f for f in benchmark.prompt_fields if f != prompt_field and row.get(f) == row[prompt_field]}
        fields = {k: v for k, v in row.items() if k not in ("answer", "solution", "id", *duplicates)}
        solution = row.get("solution", row.get("answer"))
        prepared.append({**fields, "id": f"{benchmark.name}-{split}-{row.get('id', index)}", "answer": gold,
                         **({"solution": solution} if isinstance(solution, str) and solution != gold else {})})
    return problems_from_records(prepared, prompt_field=prompt_field, answer_field="answer",
                                 prompt_template=prompt_template, source=where,
                                 difficulty_field=difficulty_field, task_name=benchmark.name)


def find_data_dir(data_dir: str | Path | None = None) -> Path:
    """The benchmark data directory: `data_dir`, else $REASONRL_DATA, else the package's own copies."""
    if data_dir is None and os.environ.get(DATA_ENV):
        data_dir = os.environ[DATA_ENV]
        origin = f"${DATA_ENV}"
    else:
        origin = "data_dir"
    if data_dir is None:
        return PACKAGED_DATA
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise DatasetError(f"{origin}={str(path)!r} is not a directory; point it at the directory holding "
                           "gsm8k/, math500/, ... (or leave it unset for the copies shipped with reasonrl)")
    return path


def _split_file(directory: Path, split: str) -> Path:
    for suffix in _SUFFIXES:
        if (path := directory / f"{split}{suffix}").is_file():
            return path
    raise DatasetError(f"benchmark file {directory / split!s}.jsonl does not exist (nor .jsonl.gz, .json, .csv, "
                       f".parquet); check the data directory (${DATA_ENV} or data_dir)")


def _first(problems: list[Problem], size: int | None, name: str, split: str) -> list[Problem]:
    if size is None:
        return problems
    if not 0 <= size <= len(problems):
        raise DatasetError(f"{name}: {split}_size={size} but the {split} split has {len(problems)} problems")
    return problems[:size]
