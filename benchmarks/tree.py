"""Tree rollouts against flat sampling at equal generated tokens: held-out accuracy.

The claim tested (TreeRL, TreePO): sampling each group as a tree, its segments credited by the
completions below them, learns more per generated token than independent samples. Stated before the
runs: at the same budget of generated tokens (`--tokens`, train.max_generated_tokens), the paired
difference of held-out accuracy tree - flat over the seeds has a 95% Student-t interval; the claim
is reproduced when its lower end is above 0, contradicted when its upper end is below 0, else
inconclusive.

Two arms from the untrained SmolLM2-135M-Instruct on the built-in arithmetic task, each seed of
`--seeds`, the same settings but the rollouts and their credit:
- tree: the treerl recipe (2x2x2 trees of `--segment` tokens, TreeRL's segment advantages, PPO-clip,
  token-mean loss);
- flat: the same recipe with 8 independent samples per problem and GRPO's advantages.
A run stops after the step during which its generated tokens reach the budget (a tree's shared
segments count once), so the tree arm takes more steps. Evaluation: the task's first 200 held-out
problems, one sample each at the training temperature (sampled accuracy), at the end.

Writes benchmarks/results/tree.json (commit, settings, per arm: accuracy mean and interval, the
seeds' values, steps and tokens; the paired difference and the verdict) and
benchmarks/results/tree.png. Runs already recorded with the same arguments are reused (records in
benchmarks/results/tree/): stop it any time, run it again to go on.

    python -m benchmarks.tree [--tokens 8000] [--segment 4] [--seeds 0,1,2] [--rerun]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import runs
from benchmarks.common import code_version, interval_verdict, machine, pyplot, t_interval, write_report

ACCURACY = "eval/sampled_accuracy"
EVAL = ["eval.problems=200", "eval.samples=1", "eval.greedy=false", "eval.before=false"]


def arm_settings(arm: str, args: argparse.Namespace) -> list[str]:
    tree = [f"rollout.tree_segment_tokens={args.segment}"] if arm == "tree" else ["rollout.tree=", "algo.advantage=grpo"]
    return [*tree, *EVAL, f"train.max_generated_tokens={args.tokens}", f"train.steps={args.max_steps}", *args.extra]


def arm_runs(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every arm's records, seed-major (each arm has its first seed before any has its second)."""
    recorded: dict[str, list[dict[str, Any]]] = {"tree": [], "flat": []}
    for seed in args.seeds:
        for arm, records in recorded.items():
            records.append(runs.train_run("tree", f"{arm}_seed{seed}", "treerl",
                                          [*arm_settings(arm, args), f"run.seed={seed}"], rerun=args.rerun,
                                          extra={"seed": seed}))
    return recorded


def summarize(recorded: list[dict[str, Any]]) -> dict[str, Any]:
    accuracies = [run["eval_last"][ACCURACY] for run in recorded]
    mean, low, high = t_interval(accuracies)
    return {"accuracy_mean": mean, "accuracy_ci_low": low, "accuracy_ci_high": high,
            "seeds": [{"seed": run["seed"], "accuracy": value, "steps": run["steps"],
                       "generated_tokens": sum(run["curves"]["rollout/generated_tokens"]), "wall_s": run["wall_s"],
                       "commit": run["commit"]} for run, value in zip(recorded, accuracies)],
            "reward_curves": [run["curves"]["reward/mean"] for run in recorded],
            "tokens_per_step": [run["curves"]["rollout/generated_tokens"] for run in recorded]}


def plot(report: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for arm, result in report["arms"].items():
        for curve, per_step in zip(result["reward_curves"], result["tokens_per_step"]):
            spent = [sum(per_step[: i + 1]) for i in range(len(per_step))]
            right.plot(spent, curve, color="tab:green" if arm == "tree" else "tab:blue", linewidth=1, alpha=0.7,
                       label=arm if curve is result["reward_curves"][0] else None)
    names = list(report["arms"])
    means = [report["arms"][a]["accuracy_mean"] for a in names]
    errors = [[m - report["arms"][a]["accuracy_ci_low"] for a, m in zip(names, means)],
              [report["arms"][a]["accuracy_ci_high"] - m for a, m in zip(names, means)]]
    left.bar(names, means, yerr=errors, capsize=4, color=["tab:green", "tab:blue"])
    left.set(title=f"held-out accuracy at {report['tokens']} generated tokens (95% CI)", ylim=(0, 1))
    right.set(title="training reward against generated tokens", xlabel="generated tokens", ylabel="reward/mean")
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    return True


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8000, help="generated tokens per run (default 8000: about 20 "
                        "flat steps of 4 problems x 8 samples on the arithmetic task)")
    parser.add_argument("--segment", type=int, default=4, help="tokens per tree segment (default 4: the task's "
                        "answers take ~12 tokens)")
    parser.add_argument("--max-steps", type=int, default=200, help="a cap on steps, should the budget not be reached")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (default 0,1,2)")
    parser.add_argument("--rerun", action="store_true", help="run again even when a record exists")
    parser.add_argument("extra", nargs="*", metavar="section.key=value", help="overrides for every run")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    recorded = arm_runs(args)
    differences = [tree["eval_last"][ACCURACY] - flat["eval_last"][ACCURACY]
                   for tree, flat in zip(recorded["tree"], recorded["flat"])]
    mean, low, high = t_interval(differences)
    report = {"what": "held-out sampled accuracy of SmolLM2-135M-Instruct on arithmetic after the same number of "
                      "generated tokens: 2x2x2 tree rollouts with TreeRL advantages vs flat GRPO; paired by seed, 95% "
                      "t-interval", "commit": code_version(), "tokens": args.tokens, "segment": args.segment,
              "seeds": args.seeds, "settings": {arm: arm_settings(arm, args) for arm in recorded}, "machine": machine(),
              "arms": {arm: summarize(records) for arm, records in recorded.items()},
              "difference": {"tree_minus_flat_mean": mean, "ci_low": low, "ci_high": high, "values": differences,
                             "verdict": interval_verdict(low, high)},
              "steps_median": {arm: statistics.median(r["steps"] for r in records) for arm, records in recorded.items()}}
    write_report("tree", report)
    plot(report, runs.RESULTS / "tree.png")
    print(f"tree - flat: {mean:+.3f} [{low:+.3f}, {high:+.3f}] -> {interval_verdict(low, high)}")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
