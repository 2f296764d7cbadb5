"""`reasonrl report RUN_A RUN_B ...`: one self-contained HTML page comparing runs: what each was set
to (its recipe and overrides) and the settings that differ between them, every metric's curves
overlaid (a line per run), the evaluations side by side, and the alarms each run raised. The
plots are also written as PNG files beside the page."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from reasonrl.report.data import Run, Series, alarm_steps, load_run, step_ranges
from reasonrl.report.page import STYLE
from reasonrl.report.plots import file_name, panels, plot_panels
from reasonrl.report.settings import differing, format_value, settings_of

HEADLINE_EVAL = ("eval/greedy_accuracy", "eval/sampled_accuracy")


def write_comparison(run_dirs: Sequence[str | Path], out: str | Path = "comparison.html") -> Path:
    """Write the comparison page of `run_dirs` to `out` and its plots to `<out stem>_plots/`; the page's path."""
    if len(run_dirs) < 2:
        raise ValueError("a comparison needs two runs or more; `reasonrl report RUN_DIR` reports one")
    runs = [load_run(directory, with_rollouts=False) for directory in run_dirs]
    labels = run_labels([run.directory for run in runs])
    out_path = Path(out)
    colors = {label: f"C{index % 10}" for index, label in enumerate(labels)}  # a run's color in every panel
    svgs = plot_panels(overlaid(dict(zip(labels, (run.series for run in runs)))),
                       png_dir=out_path.with_name(f"{out_path.stem}_plots"), colors=colors)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(render_comparison(runs, labels, svgs), encoding="utf-8")
    return out_path


def run_labels(directories: Sequence[Path]) -> list[str]:
    """A short unique name per run: its directory's name, with parent folders only where names clash."""
    parts = [directory.resolve().parts for directory in directories]
    depths = [1] * len(parts)
    while True:
        labels = ["/".join(p[-depth:]) for p, depth in zip(parts, depths)]
        clashing = [i for i, label in enumerate(labels) if labels.count(label) > 1 and depths[i] < len(parts[i])]
        if not clashing:
            break
        for i in clashing:
            depths[i] += 1
    if len(set(labels)) < len(labels):  # the same directory given twice
        labels = [f"{index}: {label}" for index, label in enumerate(labels)]
    return labels


def overlaid(series_by_run: Mapping[str, Mapping[str, Series]]) -> dict[str, dict[str, dict[str, Series]]]:
    """family -> panel -> run label -> series, for each metric's own line (not its per-source lines)."""
    families: dict[str, dict[str, dict[str, Series]]] = {}
    for label, series in series_by_run.items():
        for family, family_panels in panels(series).items():
            for panel, lines in family_panels.items():
                if "all" in lines:
                    families.setdefault(family, {}).setdefault(panel, {})[label] = lines["all"]
    ordered = panels({panel: Series((), ()) for family in families.values() for panel in family})
    return {family: {panel: families[family][panel] for panel in ordered_panels}
            for family, ordered_panels in ordered.items()}


def render_comparison(runs: Sequence[Run], labels: Sequence[str], svgs: Mapping[str, str]) -> str:
    title = "reasonrl comparison: " + ", ".join(labels)
    notes = [f"{label}: {note}" for label, run in zip(labels, runs) for note in run.notes]
    body = [
        '<div class="notes">' + "".join(f"<p>{html.escape(note)}</p>" for note in notes) + "</div>" if notes else "",
        _runs_table(runs, labels), _differences(runs, labels),
        '<section id="curves"><h2>Training curves</h2>' + "".join(
            f'<figure class="plot" id="plot-{file_name(family)}">{svg}</figure>' for family, svg in svgs.items())
        + "</section>",
        _evaluations(runs, labels)]
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>\n{STYLE}</style></head>\n<body>\n"
            '<nav><a href="#runs">Runs</a><a href="#differences">Settings that differ</a><a href="#curves">Curves</a>'
            f'<a href="#eval">Evaluation</a></nav>\n<h1>{html.escape(title)}</h1>\n' + "\n".join(body)
            + "\n</body></html>\n")


def _runs_table(runs: Sequence[Run], labels: Sequence[str]) -> str:
    rows = []
    for label, run in zip(labels, runs):
        steps = max((s for key, line in run.series.items() if not key.startswith("eval/") for s in line.steps),
                    default=0)
        planned = run.config.get("train", {}).get("steps")
        evals = [_change(run.series[key]) if key in run.series else "" for key in HEADLINE_EVAL]
        fired = {name: steps_ for name, steps_ in alarm_steps(run.series).items() if steps_}
        alarms = "; ".join(f"{name} at {step_ranges(at)}" for name, at in fired.items()) or "none"
        cells = [label, settings_of(run.config).describe(), f"{steps}" + (f" of {planned}" if planned else ""),
                 *evals, alarms, str(run.directory.resolve())]
        rows.append("<tr>" + "".join(f'<td class="text">{html.escape(cell)}</td>' for cell in cells) + "</tr>")
    head = "".join(f"<th>{html.escape(name)}</th>" for name in
                   ("run", "settings", "steps", *HEADLINE_EVAL, "alarms", "directory"))
    return (f'<section id="runs"><h2>Runs</h2><table class="grid" id="runs-table"><tr>{head}</tr>{"".join(rows)}'
            "</table></section>")


def _change(line: Series) -> str:
    first, last = line.values[0], line.values[-1]
    if len(line.values) == 1:
        return f"{last:.4g} (step {line.steps[-1]})"
    return f"{first:.4g} → {last:.4g} ({last - first:+.4g}; steps {line.steps[0]}–{line.steps[-1]})"


def _differences(runs: Sequence[Run], labels: Sequence[str]) -> str:
    rows = differing([run.config for run in runs])
    if not rows:
        return '<section id="differences"><h2>Settings that differ</h2><p>None: the runs share every setting.</p></section>'
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    body = "".join(f"<tr><th>{html.escape(key)}</th>" + "".join(
        f"<td>{html.escape(format_value(value))}</td>" for value in values) + "</tr>" for key, values in rows.items())
    return (f'<section id="differences"><h2>Settings that differ</h2><table class="grid" id="differences-table">'
            f"<tr><th>setting</th>{head}</tr>{body}</table></section>")


def _evaluations(runs: Sequence[Run], labels: Sequence[str]) -> str:
    keys = sorted({key for run in runs for key in run.series if key.startswith("eval/")})
    if not keys:
        return '<section id="eval"><h2>Evaluation</h2><p>No run has eval/* metrics.</p></section>'
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    body = []
    for key in keys:
        lines = [run.series.get(key) for run in runs]
        cells = [f"{line.values[-1]:.4g} (step {line.steps[-1]})" if line else "" for line in lines]
        body.append(f"<tr><th>{html.escape(key)}</th>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return (f'<section id="eval"><h2>Evaluation (the last of each run)</h2><table class="grid" id="eval-table">'
            f"<tr><th>metric</th>{head}</tr>{''.join(body)}</table></section>")
