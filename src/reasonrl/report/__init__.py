"""`reasonrl report RUN_DIR`: one self-contained HTML page about a training run, for a browser.

The page (RUN_DIR/report.html, `report.page`) holds a summary (config highlights, steps, evaluation before and
after), a plot for every metric family in metrics.jsonl (inline SVG, drawn with matplotlib), the
evaluation metrics at each evaluation step, the reward failures, and a rollout viewer (vanilla
JavaScript over the rollouts embedded as JSON): step selector, completions grouped by problem,
filters for correct / incorrect / truncated completions. Nothing is fetched from the network.
The same plots are also written as PNG files to RUN_DIR/plots/ for reading without a browser.

A completion counts as correct when its "correct" reward component is at full credit (1; partial
credit is not correct, as in `Group.solved`); when the run has no
"correct" component (e.g. a custom reward alone), when its reward is > 0. It is truncated when
generation hit the token limit (finish_reason "length").

Split by concern: `report.data` reads the run directory, `report.plots` draws, `report.page` writes
the HTML; this module ties them together (the command is reasonrl.commands.report).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reasonrl.report.data import (
    RunDirError,
    Series,
    alarm_steps,
    is_correct,
    load_eval_results,
    load_run,
    metric_series,
    step_ranges,
)
from reasonrl.report.page import embed_json, render_page
from reasonrl.report.plots import plot_compute_curves, plot_families, trailing_mean


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


__all__ = ["RunDirError", "Series", "alarm_steps", "embed_json", "is_correct", "load_run", "metric_series",
           "render_page", "step_ranges", "trailing_mean", "write_report"]
