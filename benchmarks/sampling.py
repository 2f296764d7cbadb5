"""Sampling strategies at the same token budget: plain GRPO, GRPO with DAPO's dynamic sampling,
GRPO with the pass-rate curriculum over difficulty levels.

All three train SmolLM2-135M-Instruct on reasoning-gym's `basic_arithmetic` at three difficulty
levels (the same train and held-out problems, the same seed), each in its own process, until it
has generated `--tokens` completion tokens. Training runs in chunks of `--chunk` steps, resumed
from the last checkpoint, with a greedy held-out evaluation after each chunk, so accuracy is
known as a function of tokens spent. Dynamic sampling spends more tokens per step (it generates
again for groups whose rewards are all equal), so it takes fewer steps for the same budget.

Writes benchmarks/results/sampling.json (per arm: held-out accuracy against generated tokens,
the share of generated groups that carry no gradient (all rewards equal) per step, steps taken)
and benchmarks/results/sampling.png.

    python -m benchmarks.sampling [--tokens 18000] [--chunk 6] [--only grpo,dynamic] [section.key=value ...]
    python -m benchmarks.sampling --quick      # a few minutes: small budget, few eval problems
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, pyplot, write_report

RESULTS = Path(__file__).parent / "results"
LEVELS = [{"min_digits": 1, "max_digits": 1, "min_terms": 2, "max_terms": 2},
          {"min_digits": 2, "max_digits": 2, "min_terms": 2, "max_terms": 2},
          {"min_digits": 2, "max_digits": 2, "min_terms": 3, "max_terms": 3}]
TASK = ["task.name=environment", "task.environment=basic_arithmetic", f"task.environment_levels={json.dumps(LEVELS)}",
        "task.train_size=600", "task.test_size=120", "reward.format_weight=0"]
ARMS = {
    "grpo": ["sampling.problems=shuffle"],
    "dynamic": ["sampling.problems=shuffle", "sampling.dynamic=true", "sampling.max_rounds=3"],
    "curriculum": ["sampling.problems=pass_rate", "sampling.advance_at=0.5"],
}


def generated_tokens(step_metrics: dict) -> float:
    return step_metrics["perf/tokens_per_s"] * step_metrics["perf/generate_s"]


def zero_gradient_share(step_metrics: dict, prompts_per_step: int) -> float:
    """The share of the step's generated groups whose rewards were all equal: those dynamic
    sampling dropped plus those left in the batch."""
    dropped = step_metrics.get("sampling/dropped_groups", 0.0)
    kept = prompts_per_step - step_metrics.get("sampling/short_groups", 0.0)
    if kept == 0:  # nothing had a spread: the step trained on the last round, all of it dropped groups
        return 1.0
    flat_in_batch = step_metrics["rollout/zero_std_frac"] * kept
    return (dropped + flat_in_batch) / (dropped + kept)


def run_arm(name: str, token_budget: int, chunk: int, overrides: list[str], prompts_per_step: int) -> dict:
    """Train one arm in chunks until its token budget is spent; its curves."""
    with tempfile.TemporaryDirectory(prefix=f"sampling_{name}_") as tmp:
        run_dir = Path(tmp) / "run"
        base = [*TASK, *ARMS[name], f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
                f"run.save_every={chunk}", "eval.before=true", "eval.samples=0", *overrides]
        steps, tokens, started = 0, 0.0, time.perf_counter()
        while tokens < token_budget:
            steps += chunk
            resume = ["run.resume=true"] if steps > chunk else []
            subprocess.run([sys.executable, "-m", "reasonrl.commands.cli", "train", *base, f"train.steps={steps}", *resume],
                           check=True)
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            tokens = sum(generated_tokens(m) for m in metrics if "perf/step_s" in m)
        wall_s = time.perf_counter() - started
    per_step = [m for m in metrics if "perf/step_s" in m]
    spent, curve = 0.0, []
    evals = iter(m for m in metrics if "eval/greedy_accuracy" in m)
    first = next(evals)
    curve.append({"step": first["step"], "tokens": 0, "accuracy": first["eval/greedy_accuracy"]})
    by_step = {m["step"]: m for m in per_step}
    for evaluation in evals:
        spent = sum(generated_tokens(by_step[s]) for s in by_step if s <= evaluation["step"])
        curve.append({"step": evaluation["step"], "tokens": spent, "accuracy": evaluation["eval/greedy_accuracy"]})
    zero = [zero_gradient_share(m, prompts_per_step) for m in per_step]
    return {
        "steps": len(per_step),
        "tokens": tokens,
        "wall_s": wall_s,
        "accuracy_before": curve[0]["accuracy"],
        "accuracy_after": curve[-1]["accuracy"],
        "accuracy_vs_tokens": curve,
        "zero_gradient_share_per_step": zero,
        "zero_gradient_share_mean": sum(zero) / len(zero),
        "reward_per_step": [m["reward/mean"] for m in per_step],
        "level_per_step": [m.get("sampling/level") for m in per_step],
    }


def plot(results: dict[str, dict], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    figure, (accuracy_axes, zero_axes) = plt.subplots(1, 2, figsize=(11, 4))
    for name, result in results.items():
        curve = result["accuracy_vs_tokens"]
        accuracy_axes.plot([p["tokens"] / 1000 for p in curve], [p["accuracy"] for p in curve], marker="o", label=name)
        zero_axes.plot(range(1, result["steps"] + 1), result["zero_gradient_share_per_step"], label=name)
    accuracy_axes.set(xlabel="generated tokens (thousands)", ylabel="held-out greedy accuracy",
                      title="accuracy at the same token budget")
    zero_axes.set(xlabel="step", ylabel="share of groups", title="groups with no gradient (all rewards equal)")
    for axes in (accuracy_axes, zero_axes):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=18_000, help="generated-token budget per arm")
    parser.add_argument("--chunk", type=int, default=6, help="steps between held-out evaluations")
    parser.add_argument("--only", default=",".join(ARMS), help="comma-separated arms")
    parser.add_argument("--quick", action="store_true", help="a small budget and few eval problems")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_args()
    overrides = ["eval.problems=120", *args.overrides]  # the whole held-out set, every level
    token_budget, chunk = args.tokens, args.chunk
    if args.quick:
        overrides = ["task.test_size=30", "eval.problems=30", "rollout.max_new_tokens=32", *args.overrides]
        token_budget, chunk = 6_000, 2
    prompts_per_step = next((int(o.split("=")[1]) for o in overrides if o.startswith("rollout.prompts_per_step=")), 4)
    results = {name: run_arm(name, token_budget, chunk, overrides, prompts_per_step) for name in args.only.split(",")}
    report = {"machine": machine(), "token_budget": token_budget, "chunk_steps": chunk, "task": TASK,
              "arms": ARMS, "overrides": overrides, "results": results}
    name = "sampling_quick" if args.quick else "sampling"
    print(f"wrote {write_report(name, report)}")
    if plot(results, RESULTS / f"{name}.png"):
        print(f"wrote {RESULTS / f'{name}.png'}")
    for arm, result in results.items():
        print(f"{arm:>10}: accuracy {result['accuracy_before']:.3f} -> {result['accuracy_after']:.3f} in "
              f"{result['steps']} steps ({result['tokens']:.0f} tokens); no-gradient groups "
              f"{result['zero_gradient_share_mean']:.2f} per step")


if __name__ == "__main__":
    main()
