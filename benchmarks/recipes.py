"""Every recipe on the built-in task, with the same model, budget and seed.

Each recipe trains SmolLM2-135M-Instruct on the arithmetic task in its own process (same seed,
same steps, same problems) and is evaluated on the same held-out problems before and after.
Writes benchmarks/results/recipes.json (per recipe: held-out accuracy after training, greedy and
sampled; the reward, entropy and completion-length curves; seconds per step) and
benchmarks/results/recipes.png (the curves side by side; needs matplotlib, from the `bench`
extra). The evaluation before training is the same for every recipe and runs once.

    python -m benchmarks.recipes [--steps 20] [--only grpo,dapo] [section.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, write_report

RESULTS = Path(__file__).parent / "results"
CURVES = {"reward/mean": "reward", "entropy/mean": "entropy", "rollout/len_mean": "completion tokens"}


def run_recipe(name: str, steps: int, overrides: list[str], eval_before: bool) -> dict:
    """Train one recipe in a fresh process; its metrics."""
    with tempfile.TemporaryDirectory(prefix=f"recipe_{name}_") as run_dir:
        args = [name, f"run.dir={run_dir}/run", f"train.steps={steps}", "run.progress=false", "run.save_every=0",
                "run.tensorboard=false", f"eval.before={str(eval_before).lower()}", *overrides]
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", *args], check=True)
        wall_s = time.perf_counter() - started
        metrics = [json.loads(line) for line in (Path(run_dir) / "run" / "metrics.jsonl").read_text().splitlines()]
    steps_metrics = [m for m in metrics if "perf/step_s" in m]
    evals = [m for m in metrics if "eval/greedy_accuracy" in m or "eval/sampled_accuracy" in m]
    result = {
        "wall_s": wall_s,
        "step_s_median": statistics.median(m["perf/step_s"] for m in steps_metrics),
        "greedy_accuracy_after": evals[-1].get("eval/greedy_accuracy"),
        "sampled_accuracy_after": evals[-1].get("eval/sampled_accuracy"),
        "reward_last_5_steps": statistics.fmean(m["reward/mean"] for m in steps_metrics[-5:]),
        "curves": {key: [m.get(key) for m in steps_metrics] for key in CURVES},
    }
    if eval_before:
        result["eval_before"] = {k: v for k, v in evals[0].items() if k.startswith("eval/")}
    return result


def plot(results: dict[str, dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot", file=sys.stderr)
        return False
    figure, axes = plt.subplots(1, len(CURVES) + 1, figsize=(6 * (len(CURVES) + 1), 5))
    for name, result in results.items():
        for axis, (key, label) in zip(axes, CURVES.items()):
            values = result["curves"][key]
            smoothed = [statistics.fmean(v for v in values[max(0, i - 2): i + 1] if v is not None)
                        for i in range(len(values))]
            axis.plot(range(1, len(values) + 1), smoothed, label=name)
            axis.set(title=f"{label} (3-step moving mean)", xlabel="step")
    names = list(results)
    axes[-1].barh(names, [results[n]["sampled_accuracy_after"] or 0 for n in names])
    axes[-1].set(title="held-out sampled accuracy after training", xlim=(0, 1))
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    return True


def main(argv: list[str]) -> dict:
    from reasonrl.recipes import recipes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps per recipe (default 20)")
    parser.add_argument("--only", default="", help="comma-separated recipe names (default: all)")
    parser.add_argument("overrides", nargs="*", help="config overrides applied to every recipe")
    args = parser.parse_args(argv)
    names = [r.name for r in recipes()]
    if args.only:
        unknown = set(args.only.split(",")) - set(names)
        if unknown:
            parser.error(f"unknown recipes {sorted(unknown)}; known: {', '.join(names)}")
        names = [n for n in names if n in args.only.split(",")]
    overrides = ["eval.problems=100", "eval.samples=2", *args.overrides]
    results, eval_before = {}, None
    for index, name in enumerate(names):
        print(f"[recipes] {index + 1}/{len(names)}: {name}", file=sys.stderr, flush=True)
        result = run_recipe(name, args.steps, overrides, eval_before=eval_before is None)
        eval_before = result.pop("eval_before", eval_before)
        results[name] = result
    report = {
        "what": "every recipe on the arithmetic task, SmolLM2-135M-Instruct, same seed, steps and held-out problems",
        "steps": args.steps, "overrides": overrides, "eval_before": eval_before, "machine": machine(),
        "table": {name: {k: v for k, v in r.items() if k != "curves"} for name, r in results.items()},
        "recipes": results,
    }
    write_report("recipes", report)
    plot(results, RESULTS / "recipes.png")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
