"""Long chains and the async tail: synchronous rollouts, one-step-off asynchronous ones, and asynchronous
ones with partial rollouts in a continuous batch, trained on GSM8K with a long completion budget
(docs/benchmarks.md, "Long chains"). SmolLM2-135M-Instruct, the default job's settings otherwise.

Arms (each a `reasonrl train` in a fresh process, one at a time):
- sync: rollout.max_staleness=0, every row of a step decoded at once, the step waiting for its longest;
- async: rollout.max_staleness=1 (step t+1 generated while step t trains);
- partial: rollout.max_staleness=1 rollout.partial=true (twice the step's groups in flight, a step taking
  the first to finish, the rest paused and continued under the next version; reasonrl.rollout.partial);
- partial_rows32 (exploratory, added after the first three had run): partial with rollout.max_batch_rows=32,
  so that the decode batch is sync's size and finished rows' slots are refilled from the groups in flight.

Two measurements, each resumable from its records (benchmarks/results/long_chains/ARM_MODE_seedN.json):
- throughput (`--steps S`, seed 0 unless `--seeds`): generated tokens per second of training (the sum of
  the steps' generated tokens over the sum of their seconds), the median step time, and the share of
  decoded slot-steps that held no live row (`rollout/idle_slot_frac`);
- accuracy (`--minutes M`): each arm for M minutes of training (train.max_minutes) on each seed, greedy
  accuracy on the first `--eval-problems` GSM8K test problems before and after; the paired difference
  partial - sync with its 95% interval over the seeds.

Predictions, stated before the runs: partial generates >= 1.5x the tokens per second of sync (the goal),
async about what sync does on two cores (its producer shares them with the learner); at equal wall time
the accuracy difference partial - sync lies within +-`MARGIN` points.

    python -m benchmarks.long_chains --steps 6               # throughput
    python -m benchmarks.long_chains --minutes 30 --seeds 0,1,2   # accuracy at equal wall time
    python -m benchmarks.long_chains --smoke                 # a tiny random model, 2 steps, records in a temp dir
    python -m benchmarks.long_chains --steps 6 --arms sync,partial --study long_chains_NAME   # measured again
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import runs
from benchmarks.common import code_version, machine, pyplot, t_interval, tiny_smollm2, write_report
from reasonrl.config import DEFAULT_MODEL

ARMS = {"sync": [], "async": ["rollout.max_staleness=1"],
        "partial": ["rollout.max_staleness=1", "rollout.partial=true"],
        # Exploratory, added after the first three had run: the same decode batch as sync's (32 rows), its
        # finished rows' slots refilled from the groups in flight.
        "partial_rows32": ["rollout.max_staleness=1", "rollout.partial=true", "rollout.max_batch_rows=32"]}
MARGIN = 5.0  # points of greedy accuracy
GOAL = 1.5  # partial's generated tokens per second over sync's
STUDY = "long_chains"


def settings(model: str, max_new_tokens: int) -> list[str]:
    return [*runs.AS_MEASURED, f"model.name={model}", "task.name=gsm8k", "task.prompt_template={prompt}",
            f"rollout.max_new_tokens={max_new_tokens}", "rollout.prompts_per_step=4", "rollout.group_size=8"]


def throughput(record: dict[str, Any]) -> dict[str, float]:
    curves = record["curves"]
    tokens, seconds = curves["rollout/generated_tokens"], curves["perf/step_s"]
    idle = [value for value in curves.get("rollout/idle_slot_frac", []) if value is not None]
    return {"tokens_per_s": sum(tokens) / sum(seconds), "step_s_median": statistics.median(seconds),
            "generate_s_median": statistics.median(curves["perf/generate_s"]),
            "idle_slot_frac_median": statistics.median(idle) if idle else float("nan"),
            "tokens_per_step_median": statistics.median(tokens), "steps": len(seconds)}


def run_throughput(args: argparse.Namespace, study: str, model: str) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for seed in args.seeds:
        for arm, overrides in args.arms.items():
            record = runs.train_run(study, f"{arm}_steps{args.steps}_seed{seed}", None,
                                    [*settings(model, args.max_new_tokens), f"train.steps={args.steps}",
                                     "eval.problems=0", f"run.seed={seed}", *overrides])
            results.setdefault(arm, []).append({"seed": seed, "commit": record["commit"], **throughput(record)})
    summary = {arm: {"tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rows), "runs": rows}
               for arm, rows in results.items()}
    ratio = summary["partial"]["tokens_per_s_median"] / summary["sync"]["tokens_per_s_median"]
    summary["partial_over_sync"] = {"tokens_per_s": ratio, "goal": GOAL, "met": ratio >= GOAL}
    for arm in set(args.arms) - {"sync", "partial"}:
        summary[f"{arm}_over_sync"] = {"tokens_per_s": summary[arm]["tokens_per_s_median"]
                                       / summary["sync"]["tokens_per_s_median"]}
    return summary


def run_accuracy(args: argparse.Namespace, study: str, model: str) -> dict[str, Any]:
    per_arm: dict[str, list[dict[str, Any]]] = {}
    for seed in args.seeds:
        for arm, overrides in args.arms.items():
            record = runs.train_run(study, f"{arm}_minutes{args.minutes:g}_seed{seed}", None,
                                    [*settings(model, args.max_new_tokens), "train.steps=100000",
                                     f"train.max_minutes={args.minutes}", f"eval.problems={args.eval_problems}",
                                     "eval.before=true", "eval.greedy=true", "eval.samples=0", f"run.seed={seed}",
                                     *overrides])
            last, first = record["eval_last"], record["evals"][0]
            per_arm.setdefault(arm, []).append({
                "seed": seed, "before": 100 * first["eval/greedy_accuracy"], "after": 100 * last["eval/greedy_accuracy"],
                "steps": record["steps"], **throughput(record)})
    differences = [p["after"] - s["after"] for p, s in zip(per_arm["partial"], per_arm["sync"])]
    mean, low, high = t_interval(differences) if len(differences) > 1 else (differences[0], float("nan"),
                                                                              float("nan"))
    return {"arms": per_arm, "partial_minus_sync": {
        "mean": mean, "ci95": [low, high], "margin": MARGIN, "per_seed": differences,
        "held": None if len(differences) < 2 else bool(-MARGIN <= low and high <= MARGIN),
        "rule": "the 95% interval of partial - sync (greedy accuracy points, same seed) lies within +-MARGIN"}}


def plot_accuracy(accuracy: dict[str, Any], path: Path) -> bool:
    """Per seed and arm: greedy accuracy before and after, and generated tokens per second."""
    plt = pyplot()
    if plt is None:
        return False
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for offset, (arm, rows) in enumerate(accuracy["arms"].items()):
        color = f"C{offset}"
        for row in rows:
            left.plot([0, 1], [row["before"], row["after"]], color=color, marker="o",
                      label=arm if row is rows[0] else None)
            left.annotate(f"s{row['seed']}", (1, row["after"]), textcoords="offset points", xytext=(4, 2 * offset),
                          fontsize=7, color=color)
        seeds = [row["seed"] for row in rows]
        right.bar([seed + 0.4 * offset - 0.2 for seed in seeds], [row["tokens_per_s"] for row in rows], width=0.4,
                  color=color, label=arm)
    difference = accuracy["partial_minus_sync"]
    left.set(xticks=[0, 1], xticklabels=["before", "after"], xlim=(-0.2, 1.3), ylabel="greedy accuracy (%)",
             title=f"partial - sync: {difference['mean']:+.1f} [{difference['ci95'][0]:+.1f}, "
                   f"{difference['ci95'][1]:+.1f}] points")
    right.set(xlabel="seed", ylabel="generated tokens / s of training", title="throughput at equal wall time")
    right.set_xticks(sorted({row["seed"] for rows in accuracy["arms"].values() for row in rows}))
    left.legend()
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return True


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=0, help="throughput: steps per run")
    parser.add_argument("--minutes", type=float, default=0.0, help="accuracy: minutes of training per run")
    parser.add_argument("--seeds", default="0", help="comma-separated run seeds")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--eval-problems", type=int, default=100)
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated, sync and partial among them")
    parser.add_argument("--study", default=STUDY, help="the records' folder and the summary's name under "
                        "benchmarks/results (another one measures again, e.g. at a later commit)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 2 steps, records in a temp dir")
    args = parser.parse_args(argv)
    args.seeds = [int(seed) for seed in args.seeds.split(",")]
    if not (args.steps or args.minutes or args.smoke):
        parser.error("give --steps (throughput) or --minutes (accuracy)")
    if unknown := set(args.arms.split(",")) - set(ARMS):
        parser.error(f"--arms: unknown {', '.join(sorted(unknown))}; arms: {', '.join(ARMS)}")
    if not {"sync", "partial"} <= set(args.arms.split(",")):
        parser.error("--arms needs sync and partial, which the measurements compare")
    args.arms = {arm: ARMS[arm] for arm in args.arms.split(",")}
    model, study = DEFAULT_MODEL, args.study
    scratch = None
    if args.smoke:
        scratch = tempfile.TemporaryDirectory(prefix="long_chains_smoke_")
        model = str(tiny_smollm2(Path(scratch.name) / "model"))
        runs.RESULTS = Path(scratch.name) / "results"
        args.steps, args.max_new_tokens, args.eval_problems = 2, 16, 2
    report: dict[str, Any] = {"what": __doc__.split("\n\n")[0], "commit": code_version(), "machine": machine(),
                              "device": runs.run_device(),
                              "settings": {"model": model, "max_new_tokens": args.max_new_tokens, "arms": args.arms,
                                           "seeds": args.seeds}}
    if args.steps:
        report["throughput"] = run_throughput(args, study, model)
        ratios = {key.removesuffix("_over_sync"): value["tokens_per_s"] for key, value in report["throughput"].items()
                  if key.endswith("_over_sync")}
        print(f"generated tokens per second over sync's (the goal for partial: {GOAL}): "
              + ", ".join(f"{arm} {ratio:.2f}" for arm, ratio in sorted(ratios.items())))
    if args.minutes:
        report["accuracy"] = run_accuracy(args, study, model)
        if scratch is None:
            plot_accuracy(report["accuracy"], runs.RESULTS / f"{study}_accuracy.png")
    if scratch is None:  # the other measurement's summary, if any, is kept
        previous = runs.RESULTS / f"{study}.json"
        kept = json.loads(previous.read_text()) if previous.exists() else {}
        write_report(study, {**{k: kept[k] for k in ("throughput", "accuracy") if k in kept}, **report})
    else:
        scratch.cleanup()
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
