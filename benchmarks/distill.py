"""On-policy distillation against GRPO from the same start: held-out accuracy against training time.

The teacher is SmolLM2-135M-Instruct trained by reasonrl with the grpo recipe on the arithmetic task
(`--teacher-steps`, 20 by default; its run is kept under $REASONRL_CACHE/benchmarks/distill-teacher
and its record reused). The student is the untrained SmolLM2-135M-Instruct. Two arms, each
`--steps` steps from that start, for every seed of `--seeds`:
- distill: the distill recipe (the teacher's per-token reverse KL on the student's samples, the
  reward unused);
- grpo: the grpo recipe on the verifiable reward.
The claim tested (Agarwal et al. 2024; the Qwen3 and Thinking Machines write-ups): distillation
reaches the teacher's accuracy in far fewer steps than RL. Its verdict here: at the first
evaluation after training starts (step `--eval-every`), the paired difference of accuracy
distill - grpo over the seeds has a 95% Student-t interval; reproduced when its lower end is
above 0, contradicted when its upper end is below 0, else inconclusive. Reported beside it: the
first evaluation at which distillation's mean accuracy reaches 90% of the teacher's, and the
training time of each arm to there.

Every run samples (and is evaluated) at `--temperature` (1.0 by default: the teacher's log-probs are
at temperature 1), and evaluates the task's first 200 held-out problems, one sample each (sampled
accuracy), before training and every `--eval-every` steps. Time is the run's training time up to an
evaluation (the sum of its steps' perf/step_s: generation, scoring, the teacher's forward pass, the
update; evaluations excluded). Intervals are 95% Student-t over the seeds.

Writes benchmarks/results/distill.json (commit, settings, the teacher's accuracy, per arm and
evaluation: step, mean time, accuracy mean and interval, the seeds' values; the reverse KL curve)
and benchmarks/results/distill.png. Runs already recorded with the same arguments are reused (the
records are in benchmarks/results/distill/): stop it any time, run it again to go on.

    python -m benchmarks.distill [--steps 20] [--teacher-steps 20] [--seeds 0,1,2] [--rerun]
    python -m benchmarks.distill --smoke     # a tiny random model, 1 step, 1 seed: that it runs (records in a temp dir)
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
from reasonrl.models import cache_dir
from reasonrl.training.checkpoint import latest_checkpoint

ACCURACY = "eval/sampled_accuracy"
ARMS = {"distill": "distill", "grpo": "grpo"}  # arm -> recipe


def settings(args: argparse.Namespace) -> list[str]:
    """The overrides every run shares: model, sampling temperature, evaluation."""
    return [f"model.name={args.model}", f"rollout.temperature={args.temperature}", f"eval.problems={args.eval_problems}",
            "eval.samples=1", "eval.greedy=false", "eval.before=true", f"eval.every={args.eval_every}",
            *args.extra]


def teacher(args: argparse.Namespace, teacher_dir: Path) -> tuple[dict[str, Any], Path]:
    """The teacher's record and its final checkpoint (trained now unless kept from before)."""
    record = runs.train_run(args.study, "teacher", "grpo", [*settings(args), f"train.steps={args.teacher_steps}",
                                                            "run.seed=0"], rerun=args.rerun, keep_in=teacher_dir)
    checkpoint = latest_checkpoint(teacher_dir)
    if checkpoint is None:
        raise RuntimeError(f"the teacher's run in {teacher_dir} left no checkpoint")
    return record, checkpoint


def arm_runs(args: argparse.Namespace, checkpoint: Path) -> dict[str, list[dict[str, Any]]]:
    """Every arm's records, seed-major (each arm has its first seed before any has its second)."""
    recorded: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for seed in args.seeds:
        for arm, recipe in ARMS.items():
            extra = [f"distill.teacher={checkpoint}"] if arm == "distill" else []
            recorded[arm].append(runs.train_run(args.study, f"{arm}_seed{seed}", recipe,
                                                [*settings(args), *extra, f"run.seed={seed}", f"train.steps={args.steps}"],
                                                rerun=args.rerun, extra={"seed": seed}))
    return recorded


def summarize(recorded: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm: at each evaluation, the mean training time and the accuracy over seeds."""
    points = []
    for index, evaluation in enumerate(recorded[0]["evals"]):
        step = evaluation["step"]
        accuracies = [run["evals"][index][ACCURACY] for run in recorded]
        times = [sum(run["curves"]["perf/step_s"][:step]) for run in recorded]
        mean, low, high = t_interval(accuracies)
        points.append({"step": step, "train_s": statistics.fmean(times), "accuracy_mean": mean, "accuracy_ci_low": low,
                       "accuracy_ci_high": high, "accuracies": accuracies})
    curve = [run["curves"].get("distill/reverse_kl") for run in recorded]
    return {"points": points, "after": points[-1], "seeds": [run["seed"] for run in recorded],
            "commits": sorted({run["commit"] for run in recorded}),
            "step_s_median": statistics.median(s for run in recorded for s in run["curves"]["perf/step_s"]),
            "reverse_kl_mean": [statistics.fmean(values) for values in zip(*curve)] if all(curve) else None}


def verdict(arms: dict[str, dict[str, Any]], teacher_accuracy: float) -> dict[str, Any]:
    """The claim's verdict at the first evaluation after the start (see the module docstring)."""
    first = {arm: result["points"][1] for arm, result in arms.items()}
    differences = [d - g for d, g in zip(first["distill"]["accuracies"], first["grpo"]["accuracies"])]
    mean, low, high = t_interval(differences)
    outcome = "reproduced" if low > 0 else "contradicted" if high < 0 else "inconclusive"
    reached = {arm: next(({"step": p["step"], "train_s": p["train_s"]} for p in result["points"]
                          if p["accuracy_mean"] >= 0.9 * teacher_accuracy), None) for arm, result in arms.items()}
    return {"claim": "distillation learns faster than GRPO: accuracy distill - grpo at the first evaluation > 0",
            "step": first["distill"]["step"], "difference_mean": mean, "difference_ci_low": low,
            "difference_ci_high": high, "differences": differences, "verdict": outcome,
            "first_reaching_90pct_of_teacher": reached}


def plot(report: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    figure, axis = plt.subplots(figsize=(6, 4))
    for arm, result in report["arms"].items():
        times = [p["train_s"] for p in result["points"]]
        means = [p["accuracy_mean"] for p in result["points"]]
        errors = [[m - p["accuracy_ci_low"] for m, p in zip(means, result["points"])],
                  [p["accuracy_ci_high"] - m for m, p in zip(means, result["points"])]]
        axis.errorbar(times, means, yerr=errors, label=arm, capsize=3, marker="o")
    axis.axhline(report["teacher"]["accuracy"], color="black", linestyle="--", label="teacher")
    axis.set(xlabel="training time (s)", ylabel="held-out sampled accuracy", title="distillation vs GRPO (95% CI)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    return True


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps of each student run (default 20)")
    parser.add_argument("--teacher-steps", type=int, default=20, help="GRPO steps that train the teacher (default 20)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (default 0,1,2)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling and evaluation temperature")
    parser.add_argument("--eval-every", type=int, default=5, help="evaluate every this many steps (default 5)")
    parser.add_argument("--eval-problems", type=int, default=200, help="held-out problems per evaluation")
    parser.add_argument("--rerun", action="store_true", help="run again even when a record exists")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 1 step, 1 seed, records in a "
                        "temporary directory: that the study runs, not what it measures")
    parser.add_argument("extra", nargs="*", metavar="section.key=value", help="overrides for every run")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.model, args.study = DEFAULT_MODEL, "distill"
    return args


def main(argv: list[str]) -> dict[str, Any]:
    args = parse(argv)
    with tempfile.TemporaryDirectory(prefix="distill_smoke_") as scratch:
        teacher_dir = cache_dir() / "benchmarks" / "distill-teacher"
        if args.smoke:  # everything in the scratch directory: nothing recorded under benchmarks/results
            runs.RESULTS, teacher_dir = Path(scratch) / "results", Path(scratch) / "teacher"
            args.model = str(tiny_smollm2(Path(scratch) / "student"))
            args.steps, args.teacher_steps, args.seeds, args.eval_every, args.eval_problems = 1, 1, [0], 1, 4
            args.extra = ["rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
                          *args.extra]
        teacher_record, checkpoint = teacher(args, teacher_dir)
        report: dict[str, Any] = {
            "what": "held-out sampled accuracy of SmolLM2-135M-Instruct against training time: on-policy distillation "
                    "from a GRPO-trained SmolLM2 teacher vs GRPO, from the same start; 95% t-interval over seeds",
            "commit": code_version(), "smoke": args.smoke, "steps": args.steps, "teacher_steps": args.teacher_steps,
            "seeds": args.seeds, "settings": settings(args), "machine": machine(),
            "teacher": {"accuracy": teacher_record["eval_last"][ACCURACY], "commit": teacher_record["commit"],
                        "wall_s": teacher_record["wall_s"], "checkpoint": str(checkpoint)},
            "arms": {arm: summarize(recorded) for arm, recorded in arm_runs(args, checkpoint).items()}}
        report["claim"] = verdict(report["arms"], report["teacher"]["accuracy"])
        if args.smoke:
            print(json.dumps(report["arms"], indent=1))
            return report
    write_report("distill", report)
    plot(report, runs.RESULTS / "distill.png")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
