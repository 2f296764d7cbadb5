"""`reasonrl inspect RUN_DIR [--step N] [--filter wrong|truncated|alarm]`: a step's rollouts as a
table in the terminal, for a run on a remote machine without a browser (`reasonrl report` is the
HTML view).

One step is shown: `--step N`, else the newest step in rollouts.jsonl (with `--filter alarm`,
the newest step at which an alarm held). Its header gives the step's reward, accuracy and the
alarms that held then; each row is a completion: its problem (the question), reward and components, advantage,
length, how it ended, and its text (cut to `--chars`). `--filter wrong` keeps the completions that
are not correct (reasonrl.report.is_correct), `--filter truncated` those cut at the token limit;
`--filter alarm` picks a step at which an alarm held and shows all its completions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reasonrl.report import RunDirError, alarm_steps, is_correct, metric_series, step_ranges
from reasonrl.report.data import read_jsonl

FILTERS = ("wrong", "truncated", "alarm")


def step_records(run_dir: Path, step: int | None) -> tuple[int, list[dict[str, Any]], list[int]]:
    """The rollout records of `step` (None: the newest step), that step, and every step logged."""
    path = run_dir / "rollouts.jsonl"
    if not path.is_file():
        raise RunDirError(f"{path} does not exist: pass the run.dir of a training run that has logged a step")
    steps: list[int] = []
    by_step: list[dict[str, Any]] = []
    for record in read_jsonl(path):
        current = int(record["step"])
        if not steps or steps[-1] != current:
            steps.append(current)
            if step is None:
                by_step = []
        if step is None or current == step:
            by_step.append(record)
    if not steps:
        raise RunDirError(f"{path} is empty: the run has not logged its first step yet")
    chosen = steps[-1] if step is None else step
    if chosen not in steps:
        raise RunDirError(f"step {step} is not in {path}; logged steps: {step_ranges(sorted(set(steps)))}")
    return chosen, by_step, steps


def alarms_by_step(run_dir: Path) -> dict[int, list[str]]:
    """The alarms that held at each step (from metrics.jsonl)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return {}
    held: dict[int, list[str]] = {}
    for name, steps in alarm_steps(metric_series(list(read_jsonl(path)))).items():
        for step in steps:
            held.setdefault(step, []).append(name)
    return held


def keep(record: Mapping[str, Any], kind: str | None) -> bool:
    if kind == "wrong":
        return not is_correct(record)
    if kind == "truncated":
        return record.get("finish_reason") == "length"
    return True


PIPED_WIDTH = 160  # columns of the table when stdout is not a terminal (rich would take 80)
QUESTION_CHARS = 120  # of a problem's question shown in its column


def question(record: Mapping[str, Any]) -> str:
    """The problem's question as the model saw it (the last user message of a chat), cut short."""
    prompt = record.get("prompt")
    if isinstance(prompt, list):
        prompt = next((m.get("content", "") for m in reversed(prompt) if m.get("role") == "user"), "")
    text = " ".join(str(prompt if prompt is not None else record.get("problem_id")).split())
    return text if len(text) <= QUESTION_CHARS else text[:QUESTION_CHARS] + " ..."


def inspect_run(run_dir: str | Path, *, step: int | None = None, kind: str | None = None, chars: int = 400,
                limit: int = 64, width: int | None = None, console: Any = None) -> int:
    """Print the table (see the module docstring) to `console` (a rich Console; default: stdout, as
    wide as the terminal, or `width` columns, or PIPED_WIDTH when piped)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console(width=width or (None if sys.stdout.isatty() else PIPED_WIDTH))
    directory = Path(run_dir)
    if not directory.is_dir():
        raise RunDirError(f"run directory {directory} does not exist; pass the run.dir a training run wrote to")
    alarms = alarms_by_step(directory)
    if kind == "alarm" and step is None:
        if not alarms:
            console.print(f"no alarm held in {directory / 'metrics.jsonl'}")
            return 0
        step = max(alarms)
    shown, records, steps = step_records(directory, step)
    kept = [r for r in records if keep(r, kind)]
    rewards = [r["reward"] for r in records if isinstance(r.get("reward"), (int, float))]
    correct = sum(is_correct(r) for r in records)
    header = Text(f"step {shown} of {steps[-1]}: {len(records)} completions, reward mean "
                  f"{sum(rewards) / max(len(rewards), 1):.3f}, correct {correct}/{len(records)}, truncated "
                  f"{sum(r.get('finish_reason') == 'length' for r in records)}")
    if alarms.get(shown):
        header.append(f"  ALARM: {', '.join(alarms[shown])}", style="bold white on red")
    if alarms and kind == "alarm":
        header.append("\nalarm steps: " + "; ".join(f"{s}: {', '.join(n)}" for s, n in sorted(alarms.items())))
    console.print(header)
    if not kept:
        console.print(f"no {kind} completions at step {shown}")
        return 0
    components = list(dict.fromkeys(name for r in kept for name in r.get("components") or {}))
    table = Table(show_lines=True, expand=False)
    for column, justify in (("problem", "left"), ("answer", "left"), ("reward", "right"),
                            *((name, "right") for name in components), ("adv", "right"), ("tokens", "right"),
                            ("end", "left"), ("completion", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for record in kept[:limit]:
        style = "green" if is_correct(record) else "red"
        text = record.get("completion") or (f"[episode failed] {record['error']}" if record.get("error") else "")
        cut = text if len(text) <= chars else text[:chars] + f" [... {len(text) - chars} more characters]"
        finish = record.get("finish_reason") or ""
        table.add_row(question(record), str(record.get("answer")), Text(_number(record.get("reward")),
                      style=style), *(_number((record.get("components") or {}).get(name)) for name in components),
                      _number(record.get("advantage")), str(record.get("num_tokens")),
                      Text(finish, style="yellow" if finish == "length" else ""), Text(cut))
    console.print(table)
    if len(kept) > limit:
        console.print(f"{len(kept) - limit} more completions not shown (--limit)")
    return 0


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def add_inspect_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "inspect", help="a step's rollouts as a table in the terminal (no browser needed)",
        description="Show one step's completions from RUN_DIR/rollouts.jsonl as a table: problem, answer, reward "
                    "and its components, advantage, tokens, how it ended, and the text.")
    parser.add_argument("run_dir", help="the directory a training run wrote (its run.dir)")
    parser.add_argument("--step", type=int, default=None, help="the step to show (default: the newest)")
    parser.add_argument("--filter", choices=FILTERS, default=None, dest="kind",
                        help="wrong: completions not correct; truncated: cut at the token limit; alarm: a step at "
                             "which an alarm held (the newest unless --step)")
    parser.add_argument("--chars", type=int, default=400, help="cut each completion to this many characters")
    parser.add_argument("--limit", type=int, default=64, help="show at most this many completions")
    parser.add_argument("--width", type=int, default=None,
                        help=f"columns of the table (default: the terminal's; {PIPED_WIDTH} when piped)")


def run_inspect_command(args: argparse.Namespace, console: Any = None) -> int:
    try:
        return inspect_run(args.run_dir, step=args.step, kind=args.kind, chars=args.chars, limit=args.limit,
                           width=args.width, console=console)
    except RunDirError as exc:
        print(f"reasonrl inspect: {exc}", file=sys.stderr)
        return 2

