"""A public benchmark: SmolLM2-135M-Instruct trained on GSM8K's training split for at most an hour
on this machine, pass@1 on the whole GSM8K test set (1319 problems) before and after.

1. `reasonrl eval` of the base model: greedy, one completion per problem (cached in
   results/gsm8k/before; an interrupted evaluation resumes).
2. `reasonrl train RECIPE task.name=gsm8k train.max_minutes=MINUTES` on the prompts the evaluation
   uses, the bare question (`task.prompt_template={prompt}`) (run directory
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
and reported (`commit`) at. `--seed N` trains with run.seed=N (cold start included) as the arm
RECIPE_seedN (seed 0 keeps the plain name); benchmarks/readme_numbers.py reads an arm's seeds together.

    python -m benchmarks.gsm8k [--recipe grpo] [--minutes 60 | --steps N] [--cold-start-minutes M | --cold-start-steps N]
        [--skip-base] [--max-new-tokens 256] [--limit 0] [--seed 0] [--arm NAME]
    python -m benchmarks.gsm8k --smoke   # a tiny random model, 4 problems, 2 steps, in a temp dir: that it runs
"""

from __future__ import annotations

import argparse
import json
import re
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

EVAL_KEYS = ("eval/greedy_accuracy", "eval/sampled_accuracy")
PROMPT = "{prompt}"  # the problem's question as the user message, in training as in the evaluation
CALCULATOR = re.compile(r"<<[^>]*>>")


def reasonrl(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "reasonrl.commands.cli", *args], check=True)


def evaluate(model: str, out: Path, max_new_tokens: int, limit: int) -> list[bool]:
    """Greedy pass@1 of `model` on GSM8K's test set: each problem's correctness, in problem order."""
    from reasonrl.commands.eval import eval_problems
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


def run_within(command: str, command_args: list[str], run_dir: Path, minutes: float | None) -> tuple[Path, float]:
    """`reasonrl COMMAND` until `minutes` of its step times are spent (None: until its train.steps are
    done), resuming from its last checkpoint; its final checkpoint and the minutes trained."""
    done = run_dir / "trained.json"  # written once training has ended (by its budget)
    saved = checkpoints(run_dir) if run_dir.exists() else []
    if not done.exists():
        spent = minutes_trained(run_dir / "metrics.jsonl", checkpoint_step(saved[-1])) if saved else 0.0
        if minutes is None or spent < minutes:
            reasonrl(command, *command_args, *([] if minutes is None else [f"train.max_minutes={minutes - spent}"]),
                     *(["run.resume=true"] if saved else []))
        saved = checkpoints(run_dir)
        done.write_text(json.dumps({"steps": checkpoint_step(saved[-1]), "commit": code_version()}) + "\n")
    final = saved[-1]
    return final, minutes_trained(run_dir / "metrics.jsonl", checkpoint_step(final))


def common_args(run_dir: Path, steps: int = 0) -> list[str]:
    """Checkpoints every 10 steps, quiet; `steps` optimizer steps when given (a budget that does not
    depend on the machine's load), else as many as the minutes allow."""
    return [f"train.steps={steps or 100000}", f"run.dir={run_dir}", "run.save_every=10", "run.progress=false",
            "run.tensorboard=false"]


def train(args: argparse.Namespace, out: Path, model: str, minutes: float) -> tuple[Path, list[str], float]:
    """RL from `model` for args.steps steps, or else until `minutes` are spent; the final checkpoint, the
    training arguments and the minutes trained."""
    run_dir = out / "run"
    # Trained on the prompts it is evaluated on: the bare question (`reasonrl eval --task gsm8k`), not
    # the training default's "Put the final answer in \\boxed{}." line, which the evaluation lacks.
    train_args = [args.recipe, f"model.name={model}", "task.name=gsm8k", f"task.prompt_template={PROMPT}",
                  f"rollout.max_new_tokens={args.max_new_tokens}", "eval.problems=0", f"run.seed={args.seed}",
                  *common_args(run_dir, args.steps), *args.overrides]
    final, trained = run_within("train", train_args, run_dir, None if args.steps else minutes)
    return final, train_args, trained


def cold_start_data(path: Path) -> Path:
    """GSM8K's training problems with their worked solutions as SFT pairs (JSONL: question,
    solution), written once. The solutions' calculator annotations (`<<48/2=24>>`) are removed: the
    model has no calculator, and the evaluation's answers carry none."""
    from reasonrl.tasks import benchmark_task

    if not path.exists():
        rows = [{"question": p.prompt, "solution": CALCULATOR.sub("", p.metadata["solution"])}
                for p in benchmark_task("gsm8k", prompt_template=PROMPT).train]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def cold_start(args: argparse.Namespace, out: Path) -> tuple[Path, list[str], float]:
    """SFT of the base model on the training split's worked solutions for args.cold_start_steps steps or
    else args.cold_start_minutes (DeepSeek-R1's cold start); the final checkpoint, the arguments and the
    minutes trained."""
    run_dir = out / "sft"
    sft_args = [f"model.name={args.model}", "task.name=jsonl", f"task.train_path={cold_start_data(out / 'sft.jsonl')}",
                "task.prompt_field=question", "task.answer_field=solution", f"task.prompt_template={PROMPT}",
                "task.test_size=0", f"train.lr={args.cold_start_lr}", f"run.seed={args.seed}",
                *common_args(run_dir, args.cold_start_steps),
                *(["train.steps=2", "sft.batch_size=2"] if args.smoke else [])]
    final, trained = run_within("sft", sft_args, run_dir, None if args.cold_start_steps else args.cold_start_minutes)
    return final, sft_args, trained


def accuracy(correct: list[bool]) -> dict[str, Any]:
    from reasonrl.eval import bootstrap_ci

    low, high = bootstrap_ci([float(c) for c in correct])
    return {"pass@1": sum(correct) / len(correct), "ci95": [low, high], "problems": len(correct)}


def change(before: list[bool], after: list[bool]) -> dict[str, Any]:
    """after - before in pass@1, with its paired 95% interval."""
    low, high = paired_bootstrap(before, after)
    return {"mean": sum(after) / len(after) - sum(before) / len(before), "ci95": [low, high],
            "interval_excludes_0": low > 0 or high < 0}


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="grpo", help="the recipe to train with (default grpo)")
    parser.add_argument("--minutes", type=float, default=60.0, help="training time budget, cold start included "
                        "(default 60)")
    parser.add_argument("--cold-start-minutes", type=float, default=0.0, help="first fine-tune on the training "
                        "split's worked solutions for this many of the minutes, then RL for the rest (default 0: RL "
                        "only)")
    parser.add_argument("--steps", type=int, default=0, help="RL steps instead of a time budget (0: as many as "
                        "--minutes allow)")
    parser.add_argument("--cold-start-steps", type=int, default=0, help="cold-start steps instead of "
                        "--cold-start-minutes (0: by minutes)")
    parser.add_argument("--skip-base", action="store_true", help="do not evaluate the base model (its pass@1 at "
                        "these settings is in the earlier reports); the report then has no change from it")
    parser.add_argument("--cold-start-lr", type=float, default=2e-5, help="the cold start's learning rate")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="completion limit, training and evaluation")
    parser.add_argument("--arm", help="the arm's name: its folder in results/gsm8k and its report gsm8k_ARM.json "
                        "(default RECIPE, or RECIPE_cold_start with a cold start)")
    parser.add_argument("--seed", type=int, default=0, help="run.seed of the training and cold start; the arm is "
                        "named RECIPE_seedN unless N is 0 or --arm names it (default 0)")
    parser.add_argument("--limit", type=int, default=0, help="first N test problems only (0: all 1319)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 4 problems and 2 training steps in "
                        "a temporary directory: that the benchmark runs, not what it measures")
    parser.add_argument("overrides", nargs="*", help="more config overrides for training")
    args = parser.parse_args(argv)
    if args.steps < 0 or args.cold_start_steps < 0:
        parser.error("--steps and --cold-start-steps must be >= 0")
    if not args.steps and not 0 <= args.cold_start_minutes < args.minutes:
        parser.error(f"--cold-start-minutes must be in [0, --minutes={args.minutes:g}), got {args.cold_start_minutes:g}")
    if args.arm is not None and not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", args.arm):  # not '.' nor '..'
        parser.error(f"--arm must be a plain file name (letters, digits, '_', '.', '-'; not starting with '.'), "
                     f"got {args.arm!r}")
    if any(override.startswith("run.seed=") for override in args.overrides):
        parser.error("give the seed as --seed N, so that the arm's name and report carry it")
    args.model = DEFAULT_MODEL
    cold = args.cold_start_minutes or args.cold_start_steps
    name = args.arm or args.recipe + ("_cold_start" if cold else "") + (f"_seed{args.seed}" if args.seed else "")
    with tempfile.TemporaryDirectory(prefix="gsm8k_smoke_") as scratch:
        out = runs.RESULTS / "gsm8k"
        if args.smoke:
            out, args.model = Path(scratch) / "gsm8k", str(tiny_smollm2(Path(scratch) / "model"))
            args.limit, args.max_new_tokens, args.minutes = 4, 16, 60.0
            args.overrides += ["train.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2"]
        arm = out / name  # the arm's runs and evaluations after; the base model's is shared
        arm.mkdir(parents=True, exist_ok=True)
        before = None if args.skip_base else evaluate(args.model, out / "before", args.max_new_tokens, args.limit)
        start, cold_minutes = args.model, 0.0
        if cold:
            sft_final, sft_args, cold_minutes = cold_start(args, arm)
            start = str(sft_final / "policy")
            cold = {"minutes_budget": None if args.cold_start_steps else args.cold_start_minutes,
                    "steps_budget": args.cold_start_steps or None, "minutes_trained": cold_minutes,
                    "steps_trained": checkpoint_step(sft_final), "args": sft_args}
        final, train_args, minutes = train(args, arm, start, args.minutes - cold_minutes)
        after = evaluate(str(final / "policy"), arm / "after", args.max_new_tokens, args.limit)
        steps = [json.loads(line) for line in (arm / "run" / "metrics.jsonl").read_text().splitlines()]
        report = {
            "what": "GSM8K test pass@1 (greedy, math-verify) of SmolLM2-135M-Instruct before and after training on "
                    "GSM8K's training split (RL, after a cold start when one is given), 95% bootstrap intervals over "
                    "problems (changes: paired)",
            "recipe": args.recipe, "seed": args.seed, "prompt_template": PROMPT, "train_args": train_args,
            "minutes_budget": None if args.steps else args.minutes, "steps_budget": args.steps or None,
            "max_new_tokens": args.max_new_tokens, "steps_trained": checkpoint_step(final),
            "minutes_trained": minutes + cold_minutes,
            "checkpoint": str(final.relative_to(out.parent)),
            "before": before and accuracy(before), "after": accuracy(after),
            "change": before and change(before, after),
            "reward_curve": [m["reward/mean"] for m in steps if "reward/mean" in m],
            "length_curve": [m["rollout/len_mean"] for m in steps if "rollout/len_mean" in m],
            "skipped_updates": sum(1 for m in steps if m.get("sampling/skipped_update")),
            # The run's own evaluations (eval.every=K eval.problems=N among the overrides), by step.
            "eval_curve": [{"step": m["step"], **{k.split("/")[1]: m[k] for k in EVAL_KEYS if k in m}}
                           for m in steps if any(k in m for k in EVAL_KEYS)],
            "commit": code_version(), "trained_at": json.loads((arm / "run" / "trained.json").read_text()).get("commit"),
            "machine": machine(), "device": runs.run_device()}
        if cold:
            # What each stage did: the cold start alone, and the RL after it.
            after_cold = evaluate(start, arm / "after_cold_start", args.max_new_tokens, args.limit)
            report["cold_start"] = cold | {"after": accuracy(after_cold), "change": before and change(before, after_cold)}
            report["rl_change"] = change(after_cold, after)
        if args.smoke:
            print(json.dumps({k: report[k] for k in ("steps_trained", "minutes_trained", "before", "after",
                                                     *(["cold_start"] if cold else []))}, indent=1))
            return report
    path = write_report(f"gsm8k_{name}", report)
    plot(report, path.with_suffix(".png"))
    return report


def plot(report: dict[str, Any], path: Path) -> Path | None:
    """The RL stage's mean training reward by step, its own evaluations' accuracy by step (when it
    ran any) and greedy pass@1 at its start and end on the whole test set."""
    from benchmarks.common import pyplot

    if (plt := pyplot()) is None:
        return None
    figure, axes = plt.subplots(figsize=(7, 4))
    rewards = report["reward_curve"]
    axes.plot(range(1, len(rewards) + 1), rewards, color="lightgray", label="training reward (mean)")
    for key, style in (("greedy_accuracy", "o-"), ("sampled_accuracy", "s--")):
        points = [(row["step"], row[key]) for row in report.get("eval_curve", []) if key in row]
        if points:
            axes.plot(*zip(*points), style, label=f"run's evaluation, {key.replace('_', ' ')}")
    start = report["cold_start"]["after"] if report.get("cold_start") else report["before"]
    if start:
        axes.plot([0, report["steps_trained"]], [start["pass@1"], report["after"]["pass@1"]], "D", color="black",
                  label=f"test pass@1 (greedy, {report['after']['problems']} problems)")
    axes.set(xlabel="RL step", ylabel="accuracy / reward", title=f"GSM8K, {report['recipe']}")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
