"""The report's plots: one figure per metric family (inline SVG and PNG), drawn with matplotlib's
Figure objects, and accuracy against generated tokens for `reasonrl eval` outputs."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reasonrl.report.data import Series

# Families in the order a reader asks about them; any other family follows, alphabetically.
FAMILY_ORDER = ("alarm", "reward", "eval", "loss", "kl", "entropy", "rollout", "perf", "train", "sampling", "source")
FAMILY_TITLES = {"reward": "Reward and its components", "eval": "Evaluation", "loss": "Loss and clipping",
                 "kl": "KL divergence", "entropy": "Entropy", "rollout": "Rollouts: length and truncation",
                 "perf": "Speed", "train": "Optimizer", "sampling": "Sampling", "source": "Per data source",
                 "alarm": "Alarms (1: the alarm held at that step)", "sync": "Weight sync check"}
# Panels shown first in their family; the rest follow alphabetically.
LEADING_PANELS = ("reward/mean", "reward/std", "eval/greedy_accuracy", "eval/sampled_accuracy", "loss/clip_frac",
                  "kl/mean", "entropy/mean", "rollout/len_mean", "rollout/truncated_frac", "perf/tokens_per_s",
                  "perf/step_s", "sampling/accuracy_all", "sampling/dropped_frac")
# Curves with at least 2x this many points also get a trailing mean over len // SMOOTHING_POINTS steps.
SMOOTHING_POINTS = 50


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
    return plot_panels(panels(series), png_dir=png_dir)


def plot_panels(families: Mapping[str, Mapping[str, Mapping[str, Series]]], *, png_dir: Path,
                colors: Mapping[str, str] | None = None) -> dict[str, str]:
    """One figure per family of `families` (family -> panel -> line label -> series): inline SVG
    markup by family, and png_dir/<family>.png. With `colors` (label -> color), each label keeps
    its color in every panel, which always has a legend."""
    # Figure objects rather than pyplot: no global backend or figure registry is touched, so this also
    # works inside a notebook or a process with a display.
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    png_dir.mkdir(parents=True, exist_ok=True)
    svgs = {}
    for family, family_panels in families.items():
        # A per-figure salt keeps the SVG ids (clip paths) unique across the figures of one page,
        # and the same from one report to the next; fonttype none keeps text as text (smaller).
        with rc_context({"svg.hashsalt": f"reasonrl-{family}", "svg.fonttype": "none"}):
            figure = _family_figure(Figure, family, family_panels, colors=colors)
            for axis in figure.axes:
                axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
            svgs[family] = _svg_and_png(figure, png_dir / f"{file_name(family)}.png")
    return svgs


def _family_figure(figure_type: Any, family: str, family_panels: Mapping[str, Mapping[str, Series]], *,
                   colors: Mapping[str, str] | None = None) -> Any:
    columns = min(3, len(family_panels))
    rows = math.ceil(len(family_panels) / columns)
    figure = figure_type(figsize=(4.4 * columns, 2.9 * rows))
    axes = figure.subplots(rows, columns, squeeze=False)
    for axis, (panel, lines) in zip(axes.flat, family_panels.items()):
        for label, line in lines.items():
            # Evaluations are a few points: markers make each one visible.
            style = {"marker": "o", "markersize": 3} if family == "eval" or len(line.steps) < 20 else {}
            if colors:
                style["color"] = colors[label]
            window = len(line.steps) // SMOOTHING_POINTS
            if window < 2:
                axis.plot(line.steps, line.values, label=label, linewidth=1.2, **style)
                continue
            # Long runs are noisy step to step: the raw curve faint, its trailing mean on top.
            raw = axis.plot(line.steps, line.values, linewidth=0.6, alpha=0.3, color=style.get("color"))[0]
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
        if colors or len(axis.get_legend_handles_labels()[0]) > 1 or any(len(line.steps) // SMOOTHING_POINTS >= 2
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


def file_name(family: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", family)


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
            svgs[name] = _svg_and_png(figure, png_dir / f"compute_{file_name(name)}.png")
    return svgs


def _svg_and_png(figure: Any, png_path: Path) -> str:
    """Save `figure` as a PNG file and return it as inline SVG markup (from the <svg> element on)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    figure.savefig(png_path, format="png", dpi=100)
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


