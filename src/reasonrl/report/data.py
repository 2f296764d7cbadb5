"""What a run directory holds, read for the report and `reasonrl inspect`: the config, every metric
as a series over steps, the newest rollouts grouped by problem, the reward failures, the
checkpoints, and the test-time scaling curves of `reasonrl eval` outputs."""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.training.jsonl import RunFileError, records, warn
from reasonrl.types import CORRECT, is_solution

REQUIRED_FILES = ("config.toml", "metrics.jsonl")


class RunDirError(ValueError):
    """The directory is not a run directory (or holds no metrics yet)."""


@dataclass(frozen=True)
class Series:
    """One metric over steps (steps ascending; values may be NaN)."""

    steps: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class RolloutSample:
    """The rollouts embedded in the page: the newest steps, grouped as they were generated."""

    groups_by_step: Mapping[int, Sequence[Mapping[str, Any]]]
    all_steps: tuple[int, ...]  # every step rollouts.jsonl holds, embedded or not
    components: tuple[str, ...]


@dataclass(frozen=True)
class Run:
    directory: Path
    config: Mapping[str, Any]
    config_text: str  # config.toml as written
    series: Mapping[str, Series]  # every metric key of metrics.jsonl
    rollouts: RolloutSample
    reward_errors: tuple[Mapping[str, Any], ...]
    checkpoints: tuple[str, ...]
    notes: tuple[str, ...]  # what is missing or was skipped, shown at the top of the page


def load_run(run_dir: str | Path, *, rollout_steps: int = 20, rollout_chars: int = 30_000_000,
             with_rollouts: bool = True) -> Run:
    """The run in `run_dir`: the rollouts of its newest `rollout_steps` steps (0: all) up to
    `rollout_chars` of text, none without `with_rollouts`; a RunDirError when it is not a run."""
    directory = Path(run_dir)
    if directory.exists() and not directory.is_dir():
        inside = (f"; it lies in the run directory {directory.parent}, pass that"
                  if all((directory.parent / name).is_file() for name in REQUIRED_FILES) else "")
        raise RunDirError(f"{directory} is a file, not a run directory: pass the directory a training run wrote "
                          f"to (its run.dir){inside}")
    if not directory.is_dir():
        raise RunDirError(f"run directory {directory} does not exist; pass the run.dir a training run wrote to")
    missing = [name for name in REQUIRED_FILES if not (directory / name).is_file()]
    if missing:
        runs_inside = sorted(str(p.parent) for p in directory.glob("*/metrics.jsonl"))[:5]
        hint = (f"; run directories inside it: {', '.join(runs_inside)}" if runs_inside else
                f"; it holds {sorted(p.name for p in directory.iterdir())[:10] or 'nothing'}")
        raise RunDirError(f"{directory} is not a run directory: {', '.join(missing)} missing{hint}")
    notes: list[str] = []
    try:
        config_text = (directory / "config.toml").read_text(encoding="utf-8")
        config = tomllib.loads(config_text)
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RunDirError(f"{directory / 'config.toml'} is not valid TOML ({exc})") from exc
    lines = list(read_jsonl(directory / "metrics.jsonl", notes))
    if not lines:
        raise RunDirError(f"{directory / 'metrics.jsonl'} is empty: the run has not logged its first step or "
                          "evaluation yet; make the report once it has")
    rollouts_path = directory / "rollouts.jsonl"
    if not with_rollouts:
        rollouts = RolloutSample({}, (), ())
    elif rollouts_path.is_file():
        rollouts = read_rollouts(read_jsonl(rollouts_path, notes), keep_steps=rollout_steps, max_chars=rollout_chars)
    else:
        notes.append(f"no rollouts.jsonl in {directory}: the rollout viewer is empty")
        rollouts = RolloutSample({}, (), ())
    errors_path = directory / "reward_errors.jsonl"
    reward_errors = tuple(read_jsonl(errors_path, notes)) if errors_path.is_file() else ()
    checkpoint_dir = directory / "checkpoints"
    checkpoints = (tuple(sorted(p.name for p in checkpoint_dir.iterdir() if p.is_dir()))
                   if checkpoint_dir.is_dir() else ())
    return Run(directory, config, config_text, metric_series(lines), rollouts, reward_errors, checkpoints, tuple(notes))


def read_jsonl(path: Path, notes: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """The records of the log at `path`, streamed (reasonrl.training.jsonl): a cut-off last line (a
    run still writing, or killed mid-write) is skipped with a note in `notes` (None: a warning); a
    bad line elsewhere is a RunDirError naming the file and the line."""
    cut_off = warn if notes is None else (lambda message: notes.append(message.removeprefix(f"{path.parent}/")))
    try:
        yield from records(path, cut_off=cut_off)
    except RunFileError as exc:
        raise RunDirError(str(exc)) from None


def metric_series(lines: Sequence[Mapping[str, Any]]) -> dict[str, Series]:
    """Every metric as a series over steps; a metric logged twice at a step keeps the later value."""
    points: dict[str, dict[int, float]] = {}
    for line in lines:
        step = int(line["step"])
        for key, value in line.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                points.setdefault(key, {})[step] = float(value)
    return {key: Series(tuple(sorted(by_step)), tuple(by_step[s] for s in sorted(by_step)))
            for key, by_step in points.items()}


def is_correct(record: Mapping[str, Any]) -> bool:
    """The components' "correct" at full credit (`Group.solved`); without that component, reward > 0
    (see the module docstring)."""
    components = record.get("components") or {}
    if CORRECT in components:
        return components[CORRECT] is not None and is_solution(components[CORRECT], None)
    return is_solution(None, record.get("reward"))


def read_rollouts(records: Iterator[Mapping[str, Any]], *, keep_steps: int, max_chars: int) -> RolloutSample:
    """Keep the rollout records of the newest `keep_steps` steps (0: all) while streaming, then drop the oldest
    kept steps until their text fits `max_chars` (the newest step always stays). Consecutive records of one
    problem form a group, as the trainer writes each group's completions together."""
    kept: dict[int, list[Mapping[str, Any]]] = {}
    all_steps: list[int] = []
    components: dict[str, None] = {}
    for record in records:
        step = int(record["step"])
        if not all_steps or all_steps[-1] != step:
            all_steps.append(step)
        kept.setdefault(step, []).append(record)
        components.update(dict.fromkeys(record.get("components") or {}))
        while keep_steps and len(kept) > keep_steps:
            del kept[min(kept)]
    sizes = {step: sum(len(r.get("completion") or "") + len(prompt_text(r.get("prompt"))) for r in rs)
             for step, rs in kept.items()}
    while len(kept) > 1 and sum(sizes.values()) > max_chars:
        oldest = min(kept)
        del kept[oldest], sizes[oldest]
    groups_by_step = {step: _groups(records_) for step, records_ in sorted(kept.items())}
    return RolloutSample(groups_by_step, tuple(dict.fromkeys(all_steps)), tuple(components))


def prompt_text(prompt: Any) -> str:
    """A logged prompt as the page shows it: a text as it is; a conversation (a system prompt, a chat
    task) one message after another, each under its role."""
    if isinstance(prompt, list):
        return "\n\n".join(f"[{m.get('role', '?')}]\n{m.get('content', '')}" if isinstance(m, Mapping) else str(m)
                             for m in prompt)
    return "" if prompt is None else str(prompt)


def _groups(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for record in records:
        if not groups or groups[-1]["problem_id"] != record.get("problem_id"):
            groups.append({"problem_id": record.get("problem_id"), "prompt": prompt_text(record.get("prompt")),
                           "answer": record.get("answer"), "completions": []})
        groups[-1]["completions"].append({
            "text": record.get("completion"), "finish_reason": record.get("finish_reason"),
            "num_tokens": record.get("num_tokens"), "reward": _finite(record.get("reward")),
            "components": {k: _finite(v) for k, v in (record.get("components") or {}).items()},
            "advantage": _finite(record.get("advantage")), "correct": is_correct(record),
            "truncated": record.get("finish_reason") == "length"})
    return groups


def _finite(value: Any) -> Any:
    """NaN and infinities as strings: JSON (and so the embedded data) has no literal for them."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def load_eval_results(eval_dirs: Sequence[str | Path]) -> dict[str, dict[str, list[dict[str, float]]]]:
    """The test-time scaling curves of `reasonrl eval` outputs, by "<dir name>/<task>" then method."""
    curves = {}
    for directory in map(Path, eval_dirs):
        path = directory / "results.json"
        if directory.is_file():
            here = f" ({directory.parent}, here)" if directory.name == "results.json" else ""
            raise RunDirError(f"{directory} is a file, not a directory: pass the --out directory of a "
                              f"`reasonrl eval` run{here}")
        if not path.is_file():
            raise RunDirError(f"{path} does not exist: pass the --out directory of a `reasonrl eval` run")
        try:
            results = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{path} is not valid JSON ({exc})") from exc
        for task, metrics in results.get("tasks", {}).items():
            if metrics.get("tts"):
                curves[f"{directory.name}/{task}"] = metrics["tts"]
    return curves


def alarm_steps(series: Mapping[str, Series]) -> dict[str, list[int]]:
    """The steps at which each alarm (reasonrl.guards.alarms) held, by name."""
    return {key.removeprefix("alarm/"): [s for s, v in zip(line.steps, line.values) if v]
            for key, line in sorted(series.items()) if key.startswith("alarm/")}


def step_ranges(steps: Sequence[int]) -> str:
    """Steps as ranges: [3, 4, 5, 9] -> '3-5, 9'."""
    ranges: list[list[int]] = []
    for step in steps:
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)

