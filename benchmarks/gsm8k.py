"""A public benchmark: SmolLM2-135M-Instruct trained on GSM8K's training split for at most an hour
on this machine, pass@1 on the whole GSM8K test set (1319 problems) before and after.

1. `reasonrl eval` of the base model: greedy, one completion per problem (cached in
   results/gsm8k/before; an interrupted evaluation resumes).
2. `reasonrl train RECIPE task.name=gsm8k train.max_minutes=MINUTES` (run directory
   results/gsm8k/RECIPE/run, checkpointed every 10 steps). An interrupted run resumes from its last
   checkpoint with what is left of the budget: the minutes already trained are the step times
   (`perf/step_s`) of the checkpoint's steps, so the policy is trained for at most MINUTES (plus the
   step during which they run out) however often it was stopped; steps lost after a checkpoint do
   not count, as the policy does not have them.
3. `reasonrl eval` of the trained policy, the same way (results/gsm8k/RECIPE/after).

Each problem's completion is checked with math-verify against the gold answer; pass@1 has a 95%
bootstrap interval over problems, and the change has a paired one (the same problems before and
after, resampled together). Writes benchmarks/results/gsm8k_RECIPE.json with the settings, the
steps trained, the reward and completion-length curves, and the commits it trained (`trained_at`)
and reported (`commit`) at.

    python -m benchmarks.gsm8k [--recipe grpo] [--minutes 60] [--max-new-tokens 256] [--limit 0]
    python -m benchmarks.gsm8k --smoke   # a tiny random model, 4 problems, 2 steps, in a temp dir: that it runs
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
from benchmarks.common import code_version, machine, tiny_smollm2, write_report
from reasonrl.config import DEFAULT_MODEL
from reasonrl.training.checkpoint import checkpoints
from reasonrl.training.runs import checkpoint_step


def reasonrl(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "reasonrl.cli", *args], check=True)


def evaluate(model: str, out: Path, max_new_tokens: int, limit: int) -> list[bool]:
    """Greedy pass@1 of `model` on GSM8K's test set: each problem's correctness, in problem order."""
    from reasonrl.eval.command import eval_problems
    from reasonrl.rewards import MathReward

    reasonrl("eval", model, "--task", "gsm8k", "--n", "1", "--temperature", "0", "--max-new-tokens",
             str(max_new_tokens), "--limit", str(limit), "--out", str(out), "--no-progress")
    problems = eval_problems("gsm8k", limit)
    texts = {}
    for line in (out / "completions.jsonl").read_text().splitlines():
        record = json.loads(line)
        texts[record["problem_id"]] = record["completions"][0]["text"]
    verify = MathReward()
    return [verify(texts[problem.id], problem) > 0 for problem in problems]


def paired_bootstrap(before: list[bool], after: list[bool], resamples: int = 20_000) -> tuple[float, float]:
    """95% percentile interval of mean(after) - mean(before), problems resampled together."""
    from reasonrl.eval import bootstrap_ci

    return bootstrap_ci([float(a) - float(b) for a, b in zip(after, before, strict=True)], resamples=resamples)


def minutes_trained(metrics_path: Path, last_step: int) -> float:
    """The training minutes behind the checkpoint of step `last_step`: the summed step times of steps
    1..last_step in the run's metrics (a step run again after a resume counts once, as its last run)."""
    if not metrics_path.exists():
        return 0.0
    step_s: dict[int, float] = {}
    for line in metrics_path.read_text().splitlines():
        row = json.loads(line)
        if "perf/step_s" in row and row["step"] <= last_step:
            step_s[row["step"]] = row["perf/step_s"]
    if missing := set(range(1, last_step + 1)) - set(step_s):
        raise ValueError(f"{metrics_path}: no step time for steps {sorted(missing)[:5]}...: cannot count the budget")
    return sum(step_s.values()) / 60


def train(args: argparse.Namespace, out: Path) -> tuple[Path, list[str], float]:
    """Train until the budget is spent (resuming from the last checkpoint); the final checkpoint, the
    training arguments and the minutes trained."""
    run_dir = out / "run"
    train_args = [args.recipe, f"model.name={args.model}", "task.name=gsm8k",
                  f"rollout.max_new_tokens={args.max_new_tokens}", "train.steps=100000", "eval.problems=0",
                  f"run.dir={run_dir}", "run.save_every=10", "run.progress=false", "run.tensorboard=false",
                  *args.overrides]
    done = run_dir / "trained.json"  # written once training has ended (by its budget)
    saved = checkpoints(run_dir) if run_dir.exists() else []
    if not done.exists():
        spent = minutes_trained(run_dir / "metrics.jsonl", checkpoint_step(saved[-1])) if saved else 0.0
        if spent < args.minutes:
            reasonrl("train", *train_args, f"train.max_minutes={args.minutes - spent}",
                     *(["run.resume=true"] if saved else []))
        saved = checkpoints(run_dir)
        done.write_text(json.dumps({"steps": checkpoint_step(saved[-1]), "commit": code_version()}) + "\n")
    final = saved[-1]
    return final, train_args, minutes_trained(run_dir / "metrics.jsonl", checkpoint_step(final))


def accuracy(correct: list[bool]) -> dict[str, Any]:
    from reasonrl.eval import bootstrap_ci

    low, high = bootstrap_ci([float(c) for c in correct])
    return {"pass@1": sum(correct) / len(correct), "ci95": [low, high], "problems": len(correct)}


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="grpo", help="the recipe to train with (default grpo)")
    parser.add_argument("--minutes", type=float, default=60.0, help="training time budget (default 60)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="completion limit, training and evaluation")
    parser.add_argument("--limit", type=int, default=0, help="first N test problems only (0: all 1319)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 4 problems and 2 training steps in "
                        "a temporary directory: that the benchmark runs, not what it measures")
    parser.add_argument("overrides", nargs="*", help="more config overrides for training")
    args = parser.parse_args(argv)
    args.model = DEFAULT_MODEL
    with tempfile.TemporaryDirectory(prefix="gsm8k_smoke_") as scratch:
        out = runs.RESULTS / "gsm8k"
        if args.smoke:
            out, args.model = Path(scratch) / "gsm8k", str(tiny_smollm2(Path(scratch) / "model"))
            args.limit, args.max_new_tokens, args.minutes = 4, 16, 60.0
            args.overrides += ["train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2"]
        arm = out / args.recipe  # the recipe's run and evaluation after; the base model's is shared
        arm.mkdir(parents=True, exist_ok=True)
        before = evaluate(args.model, out / "before", args.max_new_tokens, args.limit)
        final, train_args, minutes = train(args, arm)
        after = evaluate(str(final / "policy"), arm / "after", args.max_new_tokens, args.limit)
        low, high = paired_bootstrap(before, after)
        steps = [json.loads(line) for line in (arm / "run" / "metrics.jsonl").read_text().splitlines()]
        report = {
            "what": "GSM8K test pass@1 (greedy, math-verify) of SmolLM2-135M-Instruct before and after RL on GSM8K's "
                    "training split, 95% bootstrap intervals over problems (the change: paired)",
            "recipe": args.recipe, "train_args": train_args, "minutes_budget": args.minutes,
            "max_new_tokens": args.max_new_tokens, "steps_trained": checkpoint_step(final),
            "minutes_trained": minutes, "checkpoint": str(final.relative_to(out.parent)),
            "before": accuracy(before), "after": accuracy(after),
            "change": {"mean": sum(after) / len(after) - sum(before) / len(before), "ci95": [low, high],
                       "interval_excludes_0": low > 0 or high < 0},
            "reward_curve": [m["reward/mean"] for m in steps if "reward/mean" in m],
            "length_curve": [m["rollout/len_mean"] for m in steps if "rollout/len_mean" in m],
            "skipped_updates": sum(1 for m in steps if m.get("sampling/skipped_update")),
            "commit": code_version(), "trained_at": json.loads((arm / "run" / "trained.json").read_text()).get("commit"),
            "machine": machine()}
        if args.smoke:
            print(json.dumps({k: report[k] for k in ("steps_trained", "minutes_trained", "before", "after")}, indent=1))
            return report
    write_report(f"gsm8k_{args.recipe}", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
