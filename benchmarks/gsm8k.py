"""A public benchmark: SmolLM2-135M-Instruct trained on GSM8K's training split for at most an hour
on this machine, pass@1 on the whole GSM8K test set (1319 problems) before and after.

1. `reasonrl eval` of the base model: greedy, one completion per problem (cached in
   results/gsm8k/before; an interrupted evaluation resumes).
2. `reasonrl train RECIPE task.name=gsm8k train.max_minutes=MINUTES` (run directory
   results/gsm8k/run, checkpointed every 10 steps; an interrupted run resumes, with the time
   budget counted again from the resumed step).
3. `reasonrl eval` of the trained policy, the same way (results/gsm8k/after).

Each problem's completion is checked with math-verify against the gold answer; pass@1 has a 95%
bootstrap interval over problems, and the change has a paired one (the same problems before and
after, resampled together). Writes benchmarks/results/gsm8k.json with the recipe, the settings,
the steps trained and the commit.

    python -m benchmarks.gsm8k [--recipe grpo] [--minutes 60] [--max-new-tokens 256] [--limit 0]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import code_version, machine, write_report
from benchmarks.runs import RESULTS

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
OUT = RESULTS / "gsm8k"


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
    parser.add_argument("overrides", nargs="*", help="more config overrides for training")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    before = evaluate(BASE_MODEL, OUT / "before", args.max_new_tokens, args.limit)
    run_dir = OUT / "run"
    train_args = [args.recipe, "task.name=gsm8k", f"rollout.max_new_tokens={args.max_new_tokens}",
                  "train.steps=100000", f"train.max_minutes={args.minutes}", "eval.problems=0", f"run.dir={run_dir}",
                  "run.save_every=10", "run.progress=false", "run.tensorboard=false", *args.overrides]
    from reasonrl.training.checkpoint import checkpoints

    trained = run_dir / "trained.json"  # written once training has ended (by its budget or its steps)
    if not trained.exists():
        resume = ["run.resume=true"] if any(run_dir.glob("checkpoints/step_*")) else []
        started = time.perf_counter()
        reasonrl("train", *train_args, *resume)
        trained.write_text(json.dumps({"wall_s": time.perf_counter() - started, "resumed": bool(resume)}))
    train_wall_s = json.loads(trained.read_text())["wall_s"]
    final = checkpoints(run_dir)[-1]
    after = evaluate(str(final / "policy"), OUT / "after", args.max_new_tokens, args.limit)
    low, high = paired_bootstrap(before, after)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    report = {
        "what": "GSM8K test pass@1 (greedy, math-verify) of SmolLM2-135M-Instruct before and after RL on GSM8K's "
                "training split, 95% bootstrap intervals over problems (the change: paired)",
        "recipe": args.recipe, "train_args": train_args, "minutes_budget": args.minutes,
        "max_new_tokens": args.max_new_tokens, "steps_trained": int(final.name.split("_")[1]),
        "train_wall_s": train_wall_s, "checkpoint": str(final.relative_to(RESULTS)),
        "before": accuracy(before), "after": accuracy(after),
        "change": {"mean": sum(after) / len(after) - sum(before) / len(before), "ci95": [low, high],
                   "interval_excludes_0": low > 0 or high < 0},
        "reward_curve": [m["reward/mean"] for m in steps if "reward/mean" in m],
        "commit": code_version(), "machine": machine()}
    write_report("gsm8k", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
