"""Reward curves of reasonrl and TRL over several seeds, from the vs_trl runs already written.

Reads benchmarks/results/vs_trl_curve*.json (each one seed of `python -m benchmarks.vs_trl
--steps 20 --repeats 1 --seed S --results vs_trl_curve_...`), pairs the two trainers seed by seed
and writes benchmarks/results/vs_trl_curve_summary.json: per run the mean reward over all steps
and over the second half, the completion length at the end, the paired differences, their mean
with its standard error, and how many seeds each trainer won. A single 20-step curve with 8-32
samples per step is too noisy to rank two trainers; the paired differences across seeds are what
can say whether one learns faster.

"Equal or better" is read as a non-inferiority test: reasonrl's curve is not worse than TRL's
when the lower end of the 95% bootstrap interval of the mean paired difference lies above
-MARGIN (0.05 reward by default, stated before the runs it judges); equivalent when the whole
interval lies within +-MARGIN; better when it lies above 0. RESULTS.png shows both trainers' mean
reward per step over the runs, and each run's difference with the interval and the margin.

    python -m benchmarks.curve_summary [--pattern 'vs_trl_curve_p4*'] [--results NAME] [--margin 0.05]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmarks.common import pyplot, write_report
from benchmarks.vs_trl import RESULTS_DIR, TRAINERS
from reasonrl.eval import bootstrap_ci


def standard_error(values: list[float]) -> float | None:
    return statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None


def plot(results: list[dict], report: dict, out: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    curves = [{trainer: result["summary"][trainer]["reward_mean_by_step"] for trainer in TRAINERS}
              for result in results]
    steps = min(len(curve["reasonrl"]) for curve in curves)
    figure, (by_step, by_run) = plt.subplots(1, 2, figsize=(12, 4.5))
    for trainer in TRAINERS:
        per_step = [[curve[trainer][t] for curve in curves] for t in range(steps)]
        mean = [statistics.fmean(values) for values in per_step]
        stderr = [standard_error(values) or 0.0 for values in per_step]
        by_step.plot(range(1, steps + 1), mean, label=trainer)
        by_step.fill_between(range(1, steps + 1), [m - s for m, s in zip(mean, stderr)],
                             [m + s for m, s in zip(mean, stderr)], alpha=0.25)
    by_step.set(title=f"mean reward per step over {len(curves)} runs (band: +-1 standard error)", xlabel="step")
    by_step.legend()
    paired_runs = report["reward_mean"]
    differences = sorted(paired_runs["reasonrl_minus_trl"])
    by_run.plot(differences, range(len(differences)), "o", markersize=4)
    low, high = paired_runs["ci95_bootstrap"]
    by_run.axvspan(low, high, alpha=0.25, label=f"95% interval of the mean ({low:+.3f}, {high:+.3f})")
    by_run.axvline(paired_runs["mean"], label=f"mean {paired_runs['mean']:+.3f}")
    by_run.axvline(-paired_runs["margin"], color="red", linestyle="--", label=f"margin -{paired_runs['margin']}")
    by_run.set(title=f"reasonrl minus TRL, mean reward of each run: {paired_runs['verdict']}", xlabel="reward",
               yticks=[])
    by_run.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=90)
    return True


def run_summary(file: str, report: dict) -> dict:
    out = {"file": file, "seed": report["settings"]["seed"], "prompts": report["settings"]["prompts"],
           "steps": report["settings"]["steps"]}
    for trainer in TRAINERS:
        rewards = report["summary"][trainer]["reward_mean_by_step"]
        lengths = report["summary"][trainer]["completion_tokens_mean_by_step"]
        half = len(rewards) // 2
        out[trainer] = {"reward_mean": statistics.fmean(rewards),
                        "reward_mean_second_half": statistics.fmean(rewards[half:]),
                        "completion_tokens_last_5": statistics.fmean(lengths[-5:]),
                        "step_s_median": report["summary"][trainer]["step_s"]["median"]}
    return out


def paired(runs: list[dict], key: str, margin: float) -> dict:
    differences = [run["reasonrl"][key] - run["trl"][key] for run in runs]
    stderr = standard_error(differences)
    low, high = bootstrap_ci(differences, confidence=0.95, resamples=20_000)
    return {"reasonrl_minus_trl": differences, "mean": statistics.fmean(differences), "stderr": stderr,
            "ci95_bootstrap": [low, high], "margin": margin, "verdict": verdict(low, high, margin),
            "reasonrl_ahead_in": sum(d > 0 for d in differences), "trl_ahead_in": sum(d < 0 for d in differences)}


def verdict(low: float, high: float, margin: float) -> str:
    """What the 95% interval [low, high] of reasonrl minus TRL shows, at a non-inferiority margin."""
    if low > 0:
        return "reasonrl better"
    if low > -margin:
        return "equivalent" if high < margin else "reasonrl not worse"
    if high < 0:
        return "TRL better"
    return "not shown"


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="vs_trl_curve*.json", help="result files to pair (glob in results/)")
    parser.add_argument("--results", default="vs_trl_curve_summary", help="write benchmarks/results/RESULTS.json")
    parser.add_argument("--margin", type=float, default=0.05,
                        help="non-inferiority margin on the mean reward (reward units)")
    args = parser.parse_args(argv)
    paths = [path for path in sorted(RESULTS_DIR.glob(args.pattern)) if "summary" not in path.name]
    results = [json.loads(path.read_text()) for path in paths]
    runs = [run_summary(path.name, result) for path, result in zip(paths, results)]
    if not runs:
        sys.exit(f"no results match {args.pattern!r} in {RESULTS_DIR}")
    report = {"what": __doc__.split("\n\n")[0], "runs": runs,
              "reward_mean": paired(runs, "reward_mean", args.margin),
              "reward_mean_second_half": paired(runs, "reward_mean_second_half", args.margin)}
    write_report(args.results, report)
    plot(results, report, RESULTS_DIR / f"{args.results}.png")
    print(json.dumps({key: {k: v for k, v in report[key].items() if k != "reasonrl_minus_trl"}
                      for key in ("reward_mean", "reward_mean_second_half")}, indent=2))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
