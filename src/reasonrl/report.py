"""`reasonrl report RUN_DIR`: one self-contained HTML page about a training run, for a browser.

The page (RUN_DIR/report.html) holds a summary (config highlights, steps, evaluation before and
after), a plot for every metric family in metrics.jsonl (inline SVG, drawn with matplotlib), the
evaluation metrics at each evaluation step, the reward failures, and a rollout viewer (vanilla
JavaScript over the rollouts embedded as JSON): step selector, completions grouped by problem,
filters for correct / incorrect / truncated completions. Nothing is fetched from the network.
The same plots are also written as PNG files to RUN_DIR/plots/ for reading without a browser.

A completion counts as correct when its "correct" reward component is > 0; when the run has no
"correct" component (e.g. a custom reward alone), when its reward is > 0. It is truncated when
generation hit the token limit (finish_reason "length").
"""

from __future__ import annotations

import argparse
import html
import io
import json
import math
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.eval import CORRECT

REQUIRED_FILES = ("config.toml", "metrics.jsonl")
# Families in the order a reader asks about them; any other family follows, alphabetically.
FAMILY_ORDER = ("alarm", "reward", "eval", "loss", "kl", "entropy", "rollout", "perf", "train", "sampling", "source")
FAMILY_TITLES = {"reward": "Reward and its components", "eval": "Evaluation", "loss": "Loss and clipping",
                 "kl": "KL divergence", "entropy": "Entropy", "rollout": "Rollouts: length and truncation",
                 "perf": "Speed", "train": "Optimizer", "sampling": "Sampling", "source": "Per data source",
                 "alarm": "Alarms (1: the alarm held at that step)", "sync": "Weight sync check"}
# (label, dotted config key) shown in the summary when present.
CONFIG_HIGHLIGHTS = (
    ("model", "model.name"), ("task", "task.name"), ("verifier", "reward.verifier"),
    ("advantage", "algo.advantage"), ("objective", "algo.objective"), ("aggregation", "algo.aggregation"),
    ("KL coefficient", "algo.kl_coef"), ("prompts per step", "rollout.prompts_per_step"),
    ("group size", "rollout.group_size"), ("max new tokens", "rollout.max_new_tokens"),
    ("temperature", "rollout.temperature"), ("learning rate", "train.lr"), ("steps", "train.steps"),
    ("LoRA rank", "train.lora_rank"), ("seed", "run.seed"))
# Panels shown first in their family; the rest follow alphabetically.
LEADING_PANELS = ("reward/mean", "reward/std", "eval/greedy_accuracy", "eval/sampled_accuracy", "loss/clip_frac",
                  "kl/mean", "entropy/mean", "rollout/len_mean", "rollout/truncated_frac", "perf/tokens_per_s",
                  "perf/step_s")
# Curves with at least 2x this many points also get a trailing mean over len // SMOOTHING_POINTS steps.
SMOOTHING_POINTS = 50
HEADLINE_EVAL = ("eval/greedy_accuracy", "eval/sampled_accuracy")


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


def write_report(run_dir: str | Path, out: str | Path | None = None, *, rollout_steps: int = 20,
                 rollout_megabytes: float = 30.0, eval_dirs: Sequence[str | Path] = ()) -> Path:
    """Write the HTML report of `run_dir` (default `run_dir/report.html`) and `run_dir/plots/*.png`; return
    the HTML path. The viewer embeds the rollouts of the last `rollout_steps` steps (0: all), fewer when their
    text exceeds `rollout_megabytes`. `eval_dirs` are `reasonrl eval` output directories: their test-time
    scaling curves are plotted as accuracy against generated tokens."""
    run = load_run(run_dir, rollout_steps=rollout_steps, rollout_chars=int(rollout_megabytes * 1e6))
    out_path = Path(out) if out is not None else run.directory / "report.html"
    svgs = plot_families(run.series, png_dir=run.directory / "plots")
    compute_svgs = plot_compute_curves(load_eval_results(eval_dirs), png_dir=run.directory / "plots")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render_page(run, svgs, compute_svgs), encoding="utf-8")
    return out_path


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


def plot_compute_curves(curves: Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]], *,
                        png_dir: Path) -> dict[str, str]:
    """One figure per evaluated task: accuracy against generated tokens per problem, a line per
    test-time scaling method; inline SVG by name, and png_dir/compute_<name>.png."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    png_dir.mkdir(parents=True, exist_ok=True)
    svgs = {}
    for name, methods in curves.items():
        with rc_context({"svg.hashsalt": f"reasonrl-compute-{name}", "svg.fonttype": "none"}):
            figure = Figure(figsize=(6, 4), layout="constrained")
            axes = figure.subplots()
            for method, rows in methods.items():
                axes.plot([row["tokens"] for row in rows], [row["accuracy"] for row in rows], marker="o", label=method)
            axes.set(xscale="log", xlabel="generated tokens per problem", ylabel="accuracy", title=name)
            axes.grid(alpha=0.3)
            axes.legend()
            buffer = io.StringIO()
            figure.savefig(buffer, format="svg")
            figure.savefig(png_dir / f"compute_{_file_name(name)}.png", format="png", dpi=100)
        svg = buffer.getvalue()
        svgs[name] = svg[svg.index("<svg"):]
    return svgs


def load_run(run_dir: str | Path, *, rollout_steps: int = 20, rollout_chars: int = 30_000_000) -> Run:
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
    config_text = (directory / "config.toml").read_text()
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as exc:
        raise RunDirError(f"{directory / 'config.toml'} is not valid TOML ({exc})") from exc
    lines = list(_read_jsonl(directory / "metrics.jsonl", notes))
    if not lines:
        raise RunDirError(f"{directory / 'metrics.jsonl'} is empty: the run has not logged its first step or "
                          "evaluation yet; make the report once it has")
    rollouts_path = directory / "rollouts.jsonl"
    if rollouts_path.is_file():
        rollouts = read_rollouts(_read_jsonl(rollouts_path, notes), keep_steps=rollout_steps, max_chars=rollout_chars)
    else:
        notes.append(f"no rollouts.jsonl in {directory}: the rollout viewer is empty")
        rollouts = RolloutSample({}, (), ())
    errors_path = directory / "reward_errors.jsonl"
    reward_errors = tuple(_read_jsonl(errors_path, notes)) if errors_path.is_file() else ()
    checkpoint_dir = directory / "checkpoints"
    checkpoints = (tuple(sorted(p.name for p in checkpoint_dir.iterdir() if p.is_dir()))
                   if checkpoint_dir.is_dir() else ())
    return Run(directory, config, config_text, metric_series(lines), rollouts, reward_errors, checkpoints, tuple(notes))


def _read_jsonl(path: Path, notes: list[str]) -> Iterator[dict[str, Any]]:
    """The JSON lines of `path`. A cut-off last line (a run still writing, or killed mid-write) is skipped
    with a note; a malformed line elsewhere is an error naming the file and line."""
    with path.open(encoding="utf-8") as f:
        pending: tuple[int, str] | None = None
        for number, line in enumerate(f, start=1):
            if pending is not None:
                raise RunDirError(f"{path}:{pending[0]} is not valid JSON ({pending[1]}); the file is corrupt")
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                if line.endswith("\n"):
                    raise RunDirError(f"{path}:{number} is not valid JSON ({exc}); the file is corrupt") from exc
                pending = (number, str(exc))
        if pending is not None:
            notes.append(f"{path.name}: skipped the cut-off last line {pending[0]} (run still writing?)")


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
    """The components' "correct" > 0; without that component, reward > 0 (see the module docstring)."""
    components = record.get("components") or {}
    if CORRECT in components:
        return components[CORRECT] is not None and components[CORRECT] > 0
    return record.get("reward") is not None and record["reward"] > 0


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
    sizes = {step: sum(len(r.get("completion") or "") + len(r.get("prompt") or "") for r in rs)
             for step, rs in kept.items()}
    while len(kept) > 1 and sum(sizes.values()) > max_chars:
        oldest = min(kept)
        del kept[oldest], sizes[oldest]
    groups_by_step = {step: _groups(records_) for step, records_ in sorted(kept.items())}
    return RolloutSample(groups_by_step, tuple(dict.fromkeys(all_steps)), tuple(components))


def _groups(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for record in records:
        if not groups or groups[-1]["problem_id"] != record.get("problem_id"):
            groups.append({"problem_id": record.get("problem_id"), "prompt": record.get("prompt"),
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


# ---------------------------------------------------------------------------------------------- plots

def panels(series: Mapping[str, Series]) -> dict[str, dict[str, dict[str, Series]]]:
    """family -> panel -> line label -> series. A key "fam/metric/sub" (e.g. per data source) becomes the
    line "sub" of the panel "fam/metric", next to "fam/metric" itself (the line "all")."""
    families: dict[str, dict[str, dict[str, Series]]] = {}
    leading = {name: index for index, name in enumerate(LEADING_PANELS)}
    for key in sorted(series, key=lambda k: (leading.get("/".join(k.split("/")[:2]), len(leading)), k)):
        parts = key.split("/")
        family = parts[0] if len(parts) > 1 else "other"
        panel = "/".join(parts[:2])
        label = "/".join(parts[2:]) or "all"
        families.setdefault(family, {}).setdefault(panel, {})[label] = series[key]
    order = {name: index for index, name in enumerate(FAMILY_ORDER)}
    return dict(sorted(families.items(), key=lambda item: (order.get(item[0], len(order)), item[0])))


def plot_families(series: Mapping[str, Series], *, png_dir: Path) -> dict[str, str]:
    """One figure per metric family: inline SVG markup by family, and png_dir/<family>.png."""
    # Figure objects rather than pyplot: no global backend or figure registry is touched, so this also
    # works inside a notebook or a process with a display.
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    png_dir.mkdir(parents=True, exist_ok=True)
    svgs = {}
    for family, family_panels in panels(series).items():
        # A per-figure salt keeps the SVG ids (clip paths) unique across the figures of one page,
        # and the same from one report to the next; fonttype none keeps text as text (smaller).
        with rc_context({"svg.hashsalt": f"reasonrl-{family}", "svg.fonttype": "none"}):
            figure = _family_figure(Figure, family, family_panels)
            for axis in figure.axes:
                axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            buffer = io.StringIO()
            figure.savefig(buffer, format="svg")
            figure.savefig(png_dir / f"{_file_name(family)}.png", format="png", dpi=100)
        svg = buffer.getvalue()
        svgs[family] = svg[svg.index("<svg"):]
    return svgs


def _family_figure(figure_type: Any, family: str, family_panels: Mapping[str, Mapping[str, Series]]) -> Any:
    columns = min(3, len(family_panels))
    rows = math.ceil(len(family_panels) / columns)
    figure = figure_type(figsize=(4.4 * columns, 2.9 * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for axis, (panel, lines) in zip(axes.flat, family_panels.items()):
        for label, line in lines.items():
            # Evaluations are a few points: markers make each one visible.
            style = {"marker": "o", "markersize": 3} if family == "eval" or len(line.steps) < 20 else {}
            window = len(line.steps) // SMOOTHING_POINTS
            if window < 2:
                axis.plot(line.steps, line.values, label=label, linewidth=1.2, **style)
                continue
            # Long runs are noisy step to step: the raw curve faint, its trailing mean on top.
            raw = axis.plot(line.steps, line.values, linewidth=0.6, alpha=0.3)[0]
            axis.plot(line.steps, trailing_mean(line.values, window), color=raw.get_color(), linewidth=1.3,
                      label=f"mean of {window} steps" if label == "all" else f"{label}, mean of {window} steps")
        spread = family_panels.get("reward/std", {}).get("all") if panel == "reward/mean" else None
        # The band only on short runs: on long ones the per-step spread drowns the trend.
        if (spread is not None and "all" in lines and spread.steps == lines["all"].steps
                and len(spread.steps) < 2 * SMOOTHING_POINTS):
            mean = lines["all"].values
            axis.fill_between(spread.steps, [m - s for m, s in zip(mean, spread.values)],
                              [m + s for m, s in zip(mean, spread.values)], alpha=0.2, label="± std")
        axis.set_title(panel, fontsize=9)
        axis.tick_params(labelsize=7)
        axis.grid(alpha=0.3)
        if len(axis.get_legend_handles_labels()[0]) > 1 or any(len(line.steps) // SMOOTHING_POINTS >= 2
                                                               for line in lines.values()):
            axis.legend(fontsize=6)
    for axis in axes.flat[len(family_panels):]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("step", fontsize=8)
    # Fixed margins in inches rather than tight_layout: the same look, at a fraction of the time.
    width, height = figure.get_size_inches()
    figure.suptitle(FAMILY_TITLES.get(family, family), fontsize=11, y=1 - 0.12 / height, va="top")
    figure.subplots_adjust(left=0.6 / width, right=1 - 0.15 / width, bottom=0.5 / height, top=1 - 0.55 / height,
                           wspace=0.25, hspace=0.45)
    return figure


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the window - 1 before it (fewer at the start); NaN values are left out."""
    import numpy as np

    values_S = np.asarray(values, dtype=float)
    finite_S = np.isfinite(values_S)
    # Prefix sums make every window O(1): a long run has ~1e5 steps and windows of ~2e3.
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite_S, values_S, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite_S)])
    end = np.arange(1, len(values_S) + 1)
    start = np.maximum(end - window, 0)
    with np.errstate(invalid="ignore"):  # a window of NaN only: 0 / 0 = NaN, a gap in the curve
        return ((sums[end] - sums[start]) / (counts[end] - counts[start])).tolist()


def _file_name(family: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", family)


# ----------------------------------------------------------------------------------------------- page

def render_page(run: Run, svgs: Mapping[str, str], compute_svgs: Mapping[str, str] | None = None) -> str:
    name = html.escape(run.directory.resolve().name)
    sections = [_notes(run), _alarms(run.series), _summary(run), _curves(svgs), _eval_table(run.series), _compute(compute_svgs or {}),
                _viewer(run.rollouts),
                _reward_errors(run.reward_errors), _config(run.config_text)]
    parts = {"TITLE": f"reasonrl report: {name}", "BODY": "\n".join(sections), "SCRIPT": _SCRIPT}
    # One pass: run text inside the body that happens to read "@SCRIPT@" stays as it is.
    return re.sub(r"@(TITLE|BODY|SCRIPT)@", lambda match: parts[match.group(1)], _PAGE)


def embed_json(value: Any) -> str:
    """JSON safe inside a <script> element: <, > and & as \\u escapes, so no "</script>" (or "<!--") in
    the data can end the element early; JSON.parse reads them back as the same characters."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


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


def _alarms(series: Mapping[str, Series]) -> str:
    fired = {name: steps for name, steps in alarm_steps(series).items() if steps}
    if not fired:
        return ""
    rows = "".join(f"<li><b>{html.escape(name)}</b> at steps {step_ranges(steps)}</li>" for name, steps in fired.items())
    return ('<section id="alarms" class="alarms"><h2>&#9888; Alarms</h2><ul>' + rows + "</ul>"
            "<p>What each means and what to do: docs/troubleshooting.md. The console showed the numbers.</p></section>")


def _notes(run: Run) -> str:
    if not run.notes:
        return ""
    return '<div class="notes">' + "".join(f"<p>{html.escape(note)}</p>" for note in run.notes) + "</div>"


def _lookup(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _summary(run: Run) -> str:
    rows = [(label, _lookup(run.config, key)) for label, key in CONFIG_HIGHLIGHTS]
    config_rows = "".join(f"<tr><th>{html.escape(label)}</th><td>{html.escape(_fmt(value))}</td></tr>"
                          for label, value in rows if value is not None)
    train_steps = [s for key, line in run.series.items() if not key.startswith("eval/") for s in line.steps]
    last_step = max(train_steps, default=0)
    planned = _lookup(run.config, "train.steps")
    facts = [("steps logged", f"{last_step}" + (f" of {planned}" if planned else ""))]
    if planned and last_step < planned:
        facts.append(("status", "stopped early or still running"))
    if "perf/step_s" in run.series:
        facts.append(("training time", f"{sum(v for v in run.series['perf/step_s'].values if math.isfinite(v)):.1f} s"))
    if "reward/mean" in run.series:
        rewards = run.series["reward/mean"].values
        tail = rewards[-5:]
        facts.append(("reward/mean", (f"first step {rewards[0]:.4g}, last {rewards[-1]:.4g}, "
                                      f"mean of the last {len(tail)} steps {sum(tail) / len(tail):.4g}")))
    for key in HEADLINE_EVAL:
        if key in run.series:
            line = run.series[key]
            change = f"{line.values[-1] - line.values[0]:+.4g}"
            before = f"{line.values[0]:.4g} at step {line.steps[0]}"
            after = f"{line.values[-1]:.4g} at step {line.steps[-1]}"
            facts.append((key, f"{before} → {after} ({change})"))
    facts.append(("checkpoints", ", ".join(run.checkpoints) or "none"))
    if run.reward_errors:
        facts.append(("groups with a failed reward", str(len(run.reward_errors))))
    fact_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return (f'<section id="summary"><h2>Summary</h2><p class="dir">{html.escape(str(run.directory.resolve()))}</p>'
            f'<div class="cols"><table class="kv">{fact_rows}</table><table class="kv">{config_rows}</table></div>'
            "</section>")


def _curves(svgs: Mapping[str, str]) -> str:
    figures = "".join(f'<figure class="plot" id="plot-{_file_name(family)}" data-family="{html.escape(family)}">'
                      f"{svg}</figure>" for family, svg in svgs.items())
    return f'<section id="curves"><h2>Training curves</h2>{figures}</section>'


def _compute(svgs: Mapping[str, str]) -> str:
    if not svgs:
        return ""
    figures = "".join(f'<figure class="plot" id="compute-{_file_name(name)}">{svg}</figure>'
                      for name, svg in svgs.items())
    return f'<section id="compute"><h2>Accuracy against compute</h2>{figures}</section>'


def _eval_table(series: Mapping[str, Series]) -> str:
    keys = sorted(key for key in series if key.startswith("eval/"))
    if not keys:
        return '<section id="eval"><h2>Evaluation</h2><p>No eval/* metrics in this run.</p></section>'
    steps = sorted({s for key in keys for s in series[key].steps})
    head = "".join(f"<th>step {s}</th>" for s in steps)
    body = []
    for key in keys:
        by_step = dict(zip(series[key].steps, series[key].values))
        cells = "".join(f"<td>{_fmt(by_step[s]) if s in by_step else ''}</td>" for s in steps)
        values = series[key].values
        change = f"{values[-1] - values[0]:+.4g}" if len(values) > 1 else ""
        body.append(f"<tr><th>{html.escape(key)}</th>{cells}<td>{change}</td></tr>")
    return (f'<section id="eval"><h2>Evaluation</h2><table class="grid" id="eval-table"><tr><th>metric</th>{head}'
            f"<th>change</th></tr>{''.join(body)}</table></section>")


def _viewer(rollouts: RolloutSample) -> str:
    shown = list(rollouts.groups_by_step)
    if not shown:
        return '<section id="rollouts"><h2>Rollouts</h2><p>No rollouts logged.</p></section>'
    cap = ("" if len(shown) == len(rollouts.all_steps) else
           f'<p class="cap">Showing the rollouts of the last {len(shown)} of {len(rollouts.all_steps)} logged steps '
           f"(steps {shown[0]}–{shown[-1]}), to keep the page small: <code>reasonrl report RUN_DIR "
           "--rollout-steps N</code> embeds more (0: all).</p>")
    data = {"steps": shown, "groups": {str(step): groups for step, groups in rollouts.groups_by_step.items()},
            "components": list(rollouts.components)}
    return f"""<section id="rollouts"><h2>Rollouts</h2>{cap}
<p class="rule">Correct: the "correct" reward component is &gt; 0 (without that component: reward &gt; 0).
Truncated: generation hit the token limit (finish reason "length").</p>
<div class="controls">
 <button id="prev" type="button">&larr;</button>
 <label>step <select id="step"></select></label>
 <button id="next" type="button">&rarr;</button>
 <label>show <select id="filter"><option value="all">all</option><option value="correct">correct</option>
 <option value="incorrect">incorrect</option><option value="truncated">truncated</option></select></label>
 <label>problem <input id="search" type="search" placeholder="id or prompt text"></label>
 <span id="count"></span>
</div>
<div id="groups"></div>
<script type="application/json" id="rollout-data">{embed_json(data)}</script>
</section>"""


def _reward_errors(errors: Sequence[Mapping[str, Any]], shown: int = 50) -> str:
    if not errors:
        return ""
    rows = "".join(f"<tr><td>{html.escape(str(e.get('step')))}</td><td>{html.escape(str(e.get('problem_id')))}</td>"
                   f"<td><pre>{html.escape(str(e.get('error')))}</pre></td></tr>" for e in errors[-shown:])
    more = f" (the last {shown})" if len(errors) > shown else ""
    return (f'<section id="reward-errors"><h2>Failed rewards: {len(errors)} groups{more}</h2>'
            f'<table class="grid"><tr><th>step</th><th>problem</th><th>error</th></tr>{rows}</table></section>')


def _config(config_text: str) -> str:
    return (f'<section id="config"><h2>Config</h2><details><summary>config.toml</summary>'
            f"<pre>{html.escape(config_text)}</pre></details></section>")


# ------------------------------------------------------------------------------------------------ CLI

def add_report_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "report", help="write an HTML report of a run: curves, evaluations, a rollout viewer",
        description="Write RUN_DIR/report.html (self-contained: open it in a browser) and the plots as "
                    "RUN_DIR/plots/*.png.")
    parser.add_argument("run_dir", help="the directory a training run wrote (its run.dir)")
    parser.add_argument("--out", default=None, help="the HTML file to write (default RUN_DIR/report.html)")
    parser.add_argument("--rollout-steps", type=int, default=20,
                        help="embed the rollouts of the last N steps (default 20; 0: all)")
    parser.add_argument("--eval", action="append", default=[], metavar="EVAL_OUT",
                        help="a `reasonrl eval --out` directory whose test-time scaling curves to plot (repeatable)")
    parser.add_argument("--rollout-mb", type=float, default=30.0,
                        help="at most this many MB of rollout text; older steps are left out first (default 30)")


def run_report_command(args: argparse.Namespace) -> int:
    try:
        path = write_report(args.run_dir, args.out, rollout_steps=args.rollout_steps,
                            rollout_megabytes=args.rollout_mb, eval_dirs=args.eval)
    except RunDirError as exc:
        print(f"reasonrl report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    print(f"plots: {Path(args.run_dir) / 'plots'}")
    return 0


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@</title>
<style>
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1400px; padding: 0 1.5em 3em; color: #222; }
nav { position: sticky; top: 0; background: #fff; padding: .5em 0; border-bottom: 1px solid #ddd; z-index: 1; }
nav a { margin-right: 1.2em; }
h2 { margin-top: 1.6em; border-bottom: 1px solid #eee; }
.dir { color: #666; font-family: monospace; }
.cols { display: flex; gap: 3em; flex-wrap: wrap; align-items: flex-start; }
table.kv th { text-align: left; padding-right: 1.5em; font-weight: 600; }
table.grid { border-collapse: collapse; font-size: 90%; }
table.grid th, table.grid td { border: 1px solid #ddd; padding: .2em .6em; text-align: right; vertical-align: top; }
table.grid th:first-child { text-align: left; }
figure.plot { margin: 1em 0; }
#eval { overflow-x: auto; }
figure.plot svg { max-width: 100%; height: auto; }
.alarms { background: #fde2e1; border: 2px solid #d9534f; padding: .3em 1em; margin-top: 1em; }
.notes { background: #fff6d6; border: 1px solid #e8d48a; padding: .3em 1em; margin-top: 1em; }
.cap, .rule { color: #555; font-size: 90%; }
.controls { display: flex; gap: 1em; align-items: center; flex-wrap: wrap; margin: .8em 0; }
.group { border: 1px solid #ddd; border-radius: 6px; margin: .8em 0; padding: .4em .8em; }
.group h3 { font-size: 100%; margin: .3em 0; }
.group .stats { color: #555; font-weight: normal; margin-left: 1em; }
.completion { border-left: 4px solid #bbb; margin: .5em 0; padding: .1em .6em; background: #fafafa; }
.completion.correct { border-left-color: #2a9d4b; }
.completion.incorrect { border-left-color: #d04a3a; }
.meta { font-size: 85%; color: #444; }
.badge { display: inline-block; padding: 0 .4em; border-radius: 3px; background: #eee; margin-right: .4em; }
pre { white-space: pre-wrap; word-break: break-word; margin: .3em 0; }
</style></head>
<body>
<nav><a href="#summary">Summary</a><a href="#curves">Curves</a><a href="#eval">Evaluation</a>
<a href="#rollouts">Rollouts</a><a href="#config">Config</a></nav>
<h1>@TITLE@</h1>
@BODY@
<script>@SCRIPT@</script>
</body></html>
"""

# The viewer writes run text with textContent only, never innerHTML: completions are untrusted text.
_SCRIPT = r"""
(function () {
  const source = document.getElementById("rollout-data");
  if (!source) return;
  const data = JSON.parse(source.textContent);
  const stepSelect = document.getElementById("step");
  const filterSelect = document.getElementById("filter");
  const search = document.getElementById("search");
  const groupsDiv = document.getElementById("groups");
  const count = document.getElementById("count");

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function num(value) {
    return typeof value === "number" ? (Number.isInteger(value) ? String(value) : value.toFixed(3)) : String(value);
  }
  const keep = {
    all: () => true,
    correct: (c) => c.correct,
    incorrect: (c) => !c.correct,
    truncated: (c) => c.truncated,
  };

  function render() {
    const groups = data.groups[stepSelect.value] || [];
    const wanted = keep[filterSelect.value];
    const query = search.value.trim().toLowerCase();
    groupsDiv.replaceChildren();
    let shown = 0, total = 0;
    for (const group of groups) {
      total += group.completions.length;
      const text = (String(group.problem_id) + " " + String(group.prompt)).toLowerCase();
      if (query && !text.includes(query)) continue;
      const matching = group.completions.filter(wanted);
      if (!matching.length) continue;
      shown += matching.length;
      const correct = group.completions.filter((c) => c.correct).length;
      const rewards = group.completions.map((c) => c.reward).filter((r) => typeof r === "number");
      const mean = rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : NaN;
      const box = el("div", "group");
      const title = el("h3", null, "problem " + group.problem_id);
      title.appendChild(el("span", "stats", correct + "/" + group.completions.length + " correct, mean reward "
        + num(mean) + ", answer: " + group.answer));
      box.appendChild(title);
      const prompt = el("details");
      prompt.appendChild(el("summary", null, "prompt"));
      prompt.appendChild(el("pre", null, group.prompt));
      box.appendChild(prompt);
      for (const c of matching) {
        const card = el("div", "completion " + (c.correct ? "correct" : "incorrect"));
        card.dataset.correct = c.correct;
        card.dataset.truncated = c.truncated;
        const meta = el("div", "meta");
        meta.appendChild(el("span", "badge", c.correct ? "correct" : "incorrect"));
        meta.appendChild(el("span", "badge", "reward " + num(c.reward)));
        for (const [name, value] of Object.entries(c.components)) {
          meta.appendChild(el("span", "badge", name + " " + num(value)));
        }
        meta.appendChild(el("span", "badge", "advantage " + num(c.advantage)));
        meta.appendChild(el("span", "badge", "finish " + c.finish_reason + (c.truncated ? " (truncated)" : "")));
        meta.appendChild(el("span", "badge", c.num_tokens + " tokens"));
        card.appendChild(meta);
        card.appendChild(el("pre", "text", c.text));
        box.appendChild(card);
      }
      groupsDiv.appendChild(box);
    }
    count.textContent = shown + " of " + total + " completions at step " + stepSelect.value;
  }

  for (const step of data.steps) stepSelect.appendChild(el("option", null, String(step)));
  stepSelect.value = String(data.steps[data.steps.length - 1]);
  function move(by) {
    const index = Math.min(Math.max(stepSelect.selectedIndex + by, 0), data.steps.length - 1);
    stepSelect.selectedIndex = index;
    render();
  }
  document.getElementById("prev").addEventListener("click", () => move(-1));
  document.getElementById("next").addEventListener("click", () => move(1));
  stepSelect.addEventListener("change", render);
  filterSelect.addEventListener("change", render);
  search.addEventListener("input", render);
  render();
})();
"""
