"""A process reward model made from Monte Carlo step labels: does it tell good steps from bad, and
does it pick better answers than a majority vote over the same samples?

Stated before the runs, for each seed of `--seeds` (the PRM's training order and held-out split,
and the evaluation's samples):
1. step-label AUC: the trained PRM's AUC on the held-out problems' step labels has a 95%
   Student-t interval over the seeds whose lower end is above 0.5 (it ranks steps better than
   chance), and above the untrained model's AUC ("before": the paired difference after - before
   has its interval above 0; computed in the summary since the runs, the prediction unchanged);
2. best-of-N: on `--eval-problems` held-out problems of the task, N = `--n` samples each, the PRM's
   best-of-N accuracy minus majority-vote accuracy over the same samples (equal generated tokens:
   the PRM costs a forward pass, no generation), paired by seed: reproduced when the interval's
   lower end is above 0, contradicted when its upper end is below 0, else inconclusive.

The pipeline, each stage reused when its output exists (stop it any time, run it again to go on):
`reasonrl label-steps` with SmolLM2-135M-Instruct on the task's first `--label-problems` training
problems (`--samples` solutions each, `--continuations` completions per step, steps = lines), once;
`reasonrl prm` (generative form, soft labels) per seed; `reasonrl eval --tts majority,best_of_n
--scorer prm` per seed on the task's test problems. Labels and PRMs are kept under
$REASONRL_CACHE/benchmarks/prm/TASK; the per-seed records in benchmarks/results/prm/TASK/.

Writes benchmarks/results/prm_TASK.json (commit, settings, the label statistics, per seed the PRM's
held-out accuracy and AUC before and after and the two methods' accuracy at each budget; the
intervals and verdicts) and benchmarks/results/prm_TASK.png.

    python -m benchmarks.prm [--task gsm8k] [--seeds 0,1,2] [--label-problems 60] [--n 8]
    python -m benchmarks.prm --smoke     # a tiny random model, tiny sizes, in a temp dir: that it runs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import runs
from benchmarks.common import code_version, interval_verdict, machine, pyplot, t_interval, tiny_smollm2, write_report
from reasonrl.config import DEFAULT_MODEL
from reasonrl.models import cache_dir


def cli(*arguments: str) -> None:
    command = [sys.executable, "-m", "reasonrl.commands.cli", *arguments]
    print("$", " ".join(command[2:]), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def labels(args: argparse.Namespace, work: Path) -> tuple[Path, dict[str, Any]]:
    """The step labels (written unless complete: label-steps skips problems already labeled) and their statistics."""
    path = work / "labels.jsonl"
    cli("label-steps", "--model", args.model, "--task", args.task, "--out", str(path), "--samples", str(args.samples),
        "--continuations", str(args.continuations), "--limit", str(args.label_problems), "--max-new-tokens",
        str(args.max_new_tokens), "--temperature", str(args.temperature), "--seed", "0", "--no-progress")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [label for row in rows for label in row["hard"]]
    return path, {"solutions": len(rows), "problems": len({row["problem_id"] for row in rows}),
                  "steps": len(steps), "good_step_share": sum(steps) / max(len(steps), 1),
                  "correct_solution_share": sum(row["correct"] for row in rows) / max(len(rows), 1)}


def seed_record(args: argparse.Namespace, work: Path, label_path: Path, seed: int) -> dict[str, Any]:
    """One seed: its PRM trained and evaluated (reused when recorded with the same settings)."""
    settings = {k: getattr(args, k) for k in ("task", "model", "prm_steps", "n", "eval_problems", "max_new_tokens",
                                              "temperature", "label_problems", "samples", "continuations")}
    path = runs.record_path(f"prm/{args.task}", f"seed{seed}")
    if path.exists() and not args.rerun:
        record = json.loads(path.read_text())
        if record["settings"] == settings:
            return record
    prm_dir, eval_dir = work / f"prm_seed{seed}", work / f"eval_seed{seed}"
    cli("prm", "--model", args.model, "--labels", str(label_path), "--out", str(prm_dir), "--label", "soft",
        "--steps", str(args.prm_steps), "--held-out", "0.25", "--seed", str(seed), "--no-progress")
    budgets = ",".join(str(b) for b in (1, 2, 4, 8, 16) if b <= args.n)
    cli("eval", args.model, "--task", args.task, "--limit", str(args.eval_problems), "--n", str(args.n), "--k",
        str(args.n), "--tts", "majority,best_of_n", "--budget", budgets, "--scorer", "prm", "--prm", str(prm_dir),
        "--prm-aggregate", "min", "--step-delimiter", "\\n", "--temperature", str(args.temperature),
        "--max-new-tokens", str(args.max_new_tokens), "--seed", str(seed), "--out", str(eval_dir), "--no-progress")
    prm_metrics = json.loads((prm_dir / "prm_metrics.json").read_text())
    results = json.loads((eval_dir / "results.json").read_text())
    tts = next(iter(results["tasks"].values()))["tts"]
    record = {"settings": settings, "seed": seed, "commit": code_version(), "device": runs.run_device(),
              "prm_before": prm_metrics["before"],
              "prm_after": prm_metrics["after"], "final_loss": prm_metrics["final_loss"],
              "tts": {method: rows for method, rows in tts.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def summarize(records: list[dict[str, Any]], n: int) -> dict[str, Any]:
    aucs = [r["prm_after"]["auc"] for r in records]
    before = [r["prm_before"]["auc"] for r in records]
    at_n = {method: [next(row["accuracy"] for row in r["tts"][method] if row["budget"] == n) for r in records]
            for method in ("majority", "best_of_n")}
    gains = [b - m for b, m in zip(at_n["best_of_n"], at_n["majority"])]
    nan = (None, float("nan"), float("nan"))
    auc_mean, auc_low, auc_high = t_interval(aucs) if None not in aucs else nan
    trained = [a - b for a, b in zip(aucs, before)] if None not in aucs + before else None
    trained_mean, trained_low, trained_high = t_interval(trained) if trained else nan
    gain_mean, gain_low, gain_high = t_interval(gains)
    return {"auc_after": {"mean": auc_mean, "ci_low": auc_low, "ci_high": auc_high, "values": aucs,
                          "before": before, "verdict": interval_verdict(auc_low, auc_high, 0.5)},
            "auc_after_minus_before": {"mean": trained_mean, "ci_low": trained_low, "ci_high": trained_high,
                                       "values": trained, "verdict": interval_verdict(trained_low, trained_high)},
            "best_of_n_minus_majority": {"n": n, "mean": gain_mean, "ci_low": gain_low, "ci_high": gain_high,
                                         "values": gains, "majority": at_n["majority"],
                                         "best_of_n": at_n["best_of_n"], "verdict": interval_verdict(gain_low, gain_high)}}


def plot(report: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    figure, axis = plt.subplots(figsize=(6, 4))
    for method, colour in (("majority", "tab:blue"), ("best_of_n", "tab:green")):
        for index, record in enumerate(report["seeds"]):
            rows = record["tts"][method]
            axis.plot([row["tokens"] for row in rows], [row["accuracy"] for row in rows], color=colour, marker="o",
                      alpha=0.7, label=f"{method} (PRM)" if method == "best_of_n" and not index else
                      method if not index else None)
    axis.set(xlabel="generated tokens per problem", ylabel="accuracy", title=f"{report['task']}: PRM best-of-N vs "
             "majority vote (one line per seed)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    return True


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="gsm8k", help="a built-in task with multi-step solutions (default gsm8k)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--label-problems", type=int, default=60, help="training problems labeled (default 60)")
    parser.add_argument("--samples", type=int, default=4, help="solutions per labeled problem (default 4)")
    parser.add_argument("--continuations", type=int, default=4, help="Monte Carlo completions per step (default 4)")
    parser.add_argument("--prm-steps", type=int, default=200, help="PRM optimizer steps (default 200)")
    parser.add_argument("--n", type=int, default=8, help="samples per evaluation problem, N (default 8)")
    parser.add_argument("--eval-problems", type=int, default=100, help="test problems evaluated (default 100)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--rerun", action="store_true", help="train and evaluate again even when a record exists")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model and tiny sizes in a temporary "
                        "directory: that the study runs, not what it measures")
    args = parser.parse_args(argv)
    args.seeds, args.model = [int(s) for s in args.seeds.split(",")], DEFAULT_MODEL
    with tempfile.TemporaryDirectory(prefix="prm_smoke_") as scratch:
        work = cache_dir() / "benchmarks" / "prm" / args.task
        if args.smoke:
            runs.RESULTS, work = Path(scratch) / "results", Path(scratch) / "work"
            args.model, args.task = str(tiny_smollm2(Path(scratch) / "model")), "arithmetic"
            args.seeds, args.label_problems, args.samples, args.continuations = [0], 3, 2, 2
            args.prm_steps, args.n, args.eval_problems, args.max_new_tokens = 2, 2, 2, 8
        work.mkdir(parents=True, exist_ok=True)
        label_path, label_stats = labels(args, work)
        records = [seed_record(args, work, label_path, seed) for seed in args.seeds]
        report = {"what": "a PRM trained on Monte Carlo step labels of SmolLM2-135M-Instruct's solutions: held-out "
                          "step-label AUC, and its best-of-N against majority vote over the same samples; 95% "
                          "t-intervals over seeds", "commit": code_version(), "task": args.task, "smoke": args.smoke,
                  "machine": machine(), "labels": label_stats, "seeds": records, **summarize(records, args.n)}
        if args.smoke:
            print(json.dumps({k: report[k] for k in ("labels", "auc_after", "best_of_n_minus_majority")}, indent=1))
            return report
    write_report(f"prm_{args.task}", report)
    plot(report, runs.RESULTS / f"prm_{args.task}.png")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
