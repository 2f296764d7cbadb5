"""Every recipe, several seeds, three tasks: does each one learn, and by how much?

Each (task, recipe, seed) trains SmolLM2-135M-Instruct from the same start for the same number of
steps (`--steps`, 20 by default) in its own process (benchmarks/runs.py) and is evaluated at the
end on the task's first 200 held-out problems, one sample each at the training temperature
(sampled accuracy: the share of correct samples). The base model is evaluated once per task the
same way ("before"). The interval of a recipe's accuracy after training is the 95% Student-t
interval over its seeds; the target is that its lower end lies above "before" on each task
(`--max-width POINTS`: also that the interval is at most that wide).

Tasks: the built-in arithmetic task (sums of two 2-digit numbers), a harder reasoning-gym task
(GYM_TASK below: chains of 2-3 additions and subtractions), chosen because the base model starts
between 2% and 20% on it, and a task of another kind (SPELLING_TASK: a word of 3-4 letters spelt
backwards, which a model reading tokens, not letters, finds hard; the base model starts at about 5%).
The first two run by default; `--tasks spelling` (or a list) names others. COUNTING_TASK (how many
times a letter occurs in a word) stays for reference, set aside as the third task: see its comment.

Writes benchmarks/results/recipes.json (per task and recipe: before, after_mean, after_ci_low,
after_ci_high, the seeds' values, whether the target holds, and the mean curves of reward,
entropy, completion length, clip fraction and ratio) and benchmarks/results/recipes.png
(`--report NAME`: NAME.json and NAME.png, e.g. for a reading over more seeds beside the main
one). Runs already recorded with the same arguments are reused: stop it any time, run it again to go on.
Runs at another step budget are recorded in results/recipes/TASK_Nsteps, so they never overwrite
the default's; "before" is the same for every budget (results/recipes/TASK). A variant
(`--variant NAME KEY=VALUE...`: config overrides on top of every recipe run, e.g. to test what a
setting does) is recorded in results/recipes/TASK_NAME, apart from the recipes as shipped.

    python -m benchmarks.recipes [--steps 20] [--seeds 0,1,2] [--tasks arithmetic,gym] [--only grpo,dapo]
                                 [--summary-only] [--rerun] [--jobs N] [--start-within MINUTES]
                                 [--report recipes] [--variant NAME KEY=VALUE ...] [--max-width POINTS]

`--jobs N` runs N at a time, for a machine that one small run leaves mostly idle (a GPU; on two
CPU cores two runs side by side were no faster than one after the other). On a GPU each run holds
4-6.5 GB: on an 80 GB H100 12 at a time fit, 16 ran out of memory (a failed run leaves no record and
is run again by the next invocation; the failures are listed at the end, each with the last lines
of its stderr). `--start-within MINUTES` starts no run after that time, so a
machine lent for a fixed time ends with whole runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import machine, pyplot, t_interval, write_report
from benchmarks.runs import RESULTS, RunSpec, plain_name, read_record, record_path, run_all

# reasoning-gym's `chain_sum` with 2-3 terms of 1-2 digits, + and - (negative results included), where
# SmolLM2-135M-Instruct starts at about 4% (a probe of 60 problems x 2 samples; this script's
# "before" measures it on 200 x 2). Its score is the dataset's own `score_answer`, which gives
# partial credit to some near-misses, so "accuracy" there is the mean score.
GYM_TASK = ["task.name=environment", "task.environment=chain_sum",
            'task.environment_config={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}',
            "task.train_size=2000", "task.test_size=200"]
# reasoning-gym's `letter_counting` on one word ("How many times does the letter "r" appear in the
# text: "trademark"?"). Set aside: its "before" on the 200 held-out problems is 4.5% (4.8% at 8
# samples each, below the 5-20% asked for), and 89% of its answers are "1" (the letter is picked
# among the word's own), so a policy that always answers 1 would score about 89% without counting.
COUNTING_TASK = ["task.name=environment", "task.environment=letter_counting",
                 'task.environment_config={"min_words": 1, "max_words": 1}',
                 "task.train_size=2000", "task.test_size=200"]
# reasoning-gym's `spell_backward` on words of 3-4 letters ("Spell this word backward (example: sun ->
# nus): lamp"): every answer its own, and a skill of letters a tokenizer hides. SmolLM2-135M-Instruct
# starts at 5.0% sampled (9.5% greedy; a probe of 100 problems x 4 samples); at 3-5 letters 4.5%, at 3
# letters 7.3%, but 1,370 words of 3 letters would put three quarters of the test's words in training
# (a quarter at 3-4). Its score gives each letter in place 1/length (an exact answer 1): a copy of a
# 3-letter word scores 1/3, so "accuracy" there is the mean score, as on chain_sum.
SPELLING_TASK = ["task.name=environment", "task.environment=spell_backward",
                 'task.environment_config={"min_word_len": 3, "max_word_len": 4}',
                 "task.train_size=2000", "task.test_size=200"]
TASKS = {"arithmetic": [], "gym": GYM_TASK, "spelling": SPELLING_TASK, "counting": COUNTING_TASK}
DEFAULT_TASKS = "arithmetic,gym"  # the readings so far; the third: --tasks spelling
EVAL = ["eval.problems=200", "eval.samples=1", "eval.greedy=false", "eval.before=false"]
ACCURACY = "eval/sampled_accuracy"
DEFAULT_STEPS = 20
# Recipes that need more than a task to run, compared in their own study.
STUDIED_ELSEWHERE = {"distill": "needs a teacher: benchmarks/distill.py",
                     "lora": "the default job through LoRA adapters, not a method: benchmarks/lora_lr.py"}
CURVES = {"reward/mean": "reward", "entropy/mean": "entropy", "rollout/len_mean": "completion tokens",
          "loss/clip_frac": "clip fraction", "loss/ratio_mean": "ratio mean"}


def before_spec(task: str) -> RunSpec:
    """The base model's evaluation on `task`."""
    return RunSpec(f"recipes/{task}", "before", None, (*TASKS[task], *EVAL, "train.steps=0"))


def recipe_study(task: str, steps: int, variant: str = "") -> str:
    """Where the runs of `task` at `steps` are recorded: another budget or a variant (config overrides
    on top of every recipe, named) never overwrites the default's."""
    study = f"recipes/{task}" if steps == DEFAULT_STEPS else f"recipes/{task}_{steps}steps"
    return f"{study}_{variant}" if variant else study


def recipe_spec(task: str, recipe: str, seed: int, steps: int, variant: str = "",
                overrides: tuple[str, ...] = ()) -> RunSpec:
    return RunSpec(recipe_study(task, steps, variant), f"{recipe}_seed{seed}", recipe,
                   (*TASKS[task], *EVAL, f"run.seed={seed}", f"train.steps={steps}", *overrides), {"seed": seed})


def summarize(base: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One recipe on one task: accuracy before, after (mean and t-interval over seeds), mean curves."""
    after = [run["eval_last"][ACCURACY] for run in runs]
    mean, low, high = t_interval(after)
    before_accuracy = base["eval_last"][ACCURACY]
    curves = {}
    for key in CURVES:
        per_run = [run["curves"].get(key) for run in runs if run["curves"].get(key)]
        if per_run:
            length = min(len(curve) for curve in per_run)
            curves[key] = [statistics.fmean(c[t] for c in per_run if c[t] is not None) for t in range(length)
                           if any(c[t] is not None for c in per_run)]
    return {"before": before_accuracy, "after_mean": mean, "after_ci_low": low, "after_ci_high": high,
            "seeds": [{"seed": run["seed"], "after": value, "commit": run["commit"], "wall_s": run["wall_s"],
                       "device": run.get("device")} for run, value in zip(runs, after)],
            "target_met": low > before_accuracy, "ci_width": high - low, "curves": curves,
            "step_s_median": statistics.median(s for run in runs for s in run["curves"]["perf/step_s"])}


def seed_effect(results: dict[str, dict[str, Any]], seeds: list[int], resamples: int = 20_000) -> dict[str, Any] | None:
    """Is a seed good or bad for every recipe at once? Each run seed fixes the problem order and the
    first rollouts, which all recipes share, so seeds are not independent draws across recipes.

    Over the recipes run with every seed: the seeds' mean accuracies, the share of the spread within
    recipes (sum of squares about each recipe's mean) that the seeds' means explain (recipe effects
    drop out), and a permutation p-value: the chance that shuffling each recipe's seed labels
    independently explains as much. None with fewer than 2 recipes or seeds."""
    complete = {name: {run["seed"]: run["after"] for run in result["seeds"]} for name, result in results.items()}
    rows = [[row[s] for s in seeds] for row in complete.values() if all(s in row for s in seeds)]
    if len(rows) < 2 or len(seeds) < 2:
        return None

    def explained(table: list[list[float]]) -> float:
        grand = statistics.fmean(x for row in table for x in row)
        return len(table) * sum((statistics.fmean(column) - grand) ** 2 for column in zip(*table))

    within = sum((x - statistics.fmean(row)) ** 2 for row in rows for x in row)
    observed = explained(rows)
    rng = random.Random(0)
    as_large = sum(explained([rng.sample(row, len(row)) for row in rows]) >= observed - 1e-12
                   for _ in range(resamples))
    return {"recipes": len(rows), "seed_means": {str(s): statistics.fmean(c) for s, c in zip(seeds, zip(*rows))},
            "within_recipe_share": observed / within if within else 0.0,
            "permutation_p": (as_large + 1) / (resamples + 1)}


def plot(report: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    tasks = [task for task, results in report["tasks"].items() if results]  # a task with no recipe run yet: no row
    if not tasks:
        return False
    figure, axes = plt.subplots(len(tasks), len(CURVES) + 1, figsize=(4.2 * (len(CURVES) + 1), 4.2 * len(tasks)),
                                squeeze=False)
    for row, task in zip(axes, tasks):
        results = report["tasks"][task]
        names = sorted(results)
        means = [results[n]["after_mean"] for n in names]
        errors = [[m - results[n]["after_ci_low"] for n, m in zip(names, means)],
                  [results[n]["after_ci_high"] - m for n, m in zip(names, means)]]
        colours = ["tab:green" if results[n]["target_met"] else "tab:red" for n in names]
        row[0].barh(names, means, xerr=errors, color=colours, capsize=3)
        row[0].axvline(results[names[0]]["before"], color="black", linestyle="--", label="before")
        row[0].set(title=f"{task}: held-out accuracy after (95% CI)", xlim=(0, 1))
        row[0].legend(fontsize=7)
        for axis, (key, label) in zip(row[1:], CURVES.items()):
            for name in names:
                values = results[name]["curves"].get(key)
                if values:
                    axis.plot(range(1, len(values) + 1), values, label=name, linewidth=1)
            axis.set(title=f"{task}: {label} (mean over seeds)", xlabel="step")
        row[1].legend(fontsize=6, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    return True


def main(argv: list[str]) -> dict[str, Any]:
    from reasonrl.recipes import recipes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"training steps per run (default {DEFAULT_STEPS}; another budget is recorded apart)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (default 0,1,2)")
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--only", default="", help="comma-separated recipe names (default: all)")
    parser.add_argument("--summary-only", action="store_true", help="summarise the recorded runs, run nothing")
    parser.add_argument("--rerun", action="store_true", help="run the recipes again even when a record exists (not the shared start, \"before\")")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--start-within", type=float, default=None, metavar="MINUTES",
                        help="start no run after MINUTES (those going finish): whole runs on a machine lent "
                        "for a fixed time; the rest wait for the next invocation")
    parser.add_argument("--variant", default="", help="a name for OVERRIDES: their runs are recorded in "
                        "results/recipes/TASK_NAME, apart from the recipes as shipped")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="config overrides on top of every recipe run (needs --variant)")
    parser.add_argument("--max-width", type=float, default=None, metavar="POINTS",
                        help="a second target: each recipe's interval at most POINTS percentage points wide")
    parser.add_argument("--report", default="recipes", help="name of the summary in benchmarks/results "
                        "(NAME.json, NAME.png; default recipes)")
    args = parser.parse_args(argv)
    if not plain_name(args.report):
        parser.error(f"--report is a file name of letters, digits and _, not {args.report!r}")
    if bool(args.overrides) != bool(args.variant):
        parser.error("config overrides and --variant NAME go together (a variant's runs are recorded apart)")
    if args.variant and not plain_name(args.variant):
        parser.error(f"--variant is a name of letters, digits and _, not {args.variant!r}")
    names = [r.name for r in recipes() if r.name not in STUDIED_ELSEWHERE]
    wanted = args.only.split(",") if args.only else names
    if unknown := set(wanted) - set(names):
        parser.error(f"unknown recipes {sorted(unknown)}; known: {', '.join(names)}")
    tasks = args.tasks.split(",")
    if unknown := set(tasks) - set(TASKS):
        parser.error(f"unknown tasks {sorted(unknown)}; known: {', '.join(TASKS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    report: dict[str, Any] = {
        "what": "held-out sampled accuracy of SmolLM2-135M-Instruct before and after each recipe, "
                "95% t-interval over seeds; target: after_ci_low > before",
        "steps": args.steps, "variant": {"name": args.variant, "overrides": args.overrides}, "seeds": seeds,
        "eval": EVAL, "task_overrides": {t: TASKS[t] for t in tasks},
        "machine": machine(), "before": {}, "tasks": {}}
    if not args.summary_only:
        # The start each task's recipes are read against is shared by every study of the task: --rerun
        # leaves it as recorded.
        run_all([before_spec(task) for task in tasks], jobs=args.jobs)
        # Seed-major order: every recipe has its first seed before any has its third.
        run_all([recipe_spec(task, name, seed, args.steps, args.variant, tuple(args.overrides))
                 for task in tasks for seed in seeds for name in wanted],
                jobs=args.jobs, rerun=args.rerun,
                start_within_s=None if args.start_within is None else 60 * args.start_within)
    for task in tasks:
        if not record_path(f"recipes/{task}", "before").exists():
            continue
        base = read_record(f"recipes/{task}", "before")
        report["before"][task] = base["eval_last"][ACCURACY]
        report["tasks"][task] = {}
        study = recipe_study(task, args.steps, args.variant)
        for name in wanted:
            recorded = [read_record(study, f"{name}_seed{seed}") for seed in seeds
                        if record_path(study, f"{name}_seed{seed}").exists()]
            if recorded:
                report["tasks"][task][name] = summarize(base, recorded)
        report.setdefault("seed_effect", {})[task] = seed_effect(report["tasks"][task], seeds)
    report["complete"] = all(len(report["tasks"].get(task, {}).get(name, {}).get("seeds", [])) == len(seeds)
                             for task in tasks for name in wanted)
    if args.max_width is not None:
        report["max_width_points"] = args.max_width
        for results in report["tasks"].values():
            for result in results.values():
                result["width_met"] = 100 * result["ci_width"] <= args.max_width
    report["all_targets_met"] = report["complete"] and all(
        r["target_met"] and r.get("width_met", True) for t in report["tasks"].values() for r in t.values())
    write_report(args.report, report)
    plot(report, RESULTS / f"{args.report}.png")
    print(markdown_table(report))
    return report


def markdown_table(report: dict[str, Any]) -> str:
    """Held-out accuracy before and after per recipe and task, as a Markdown table (for the docs)."""
    tasks = list(report["tasks"])
    names = sorted({name for task in tasks for name in report["tasks"][task]})
    lines = ["| recipe | " + " | ".join(f"{task}: after (95% CI), {len(report['seeds'])} seeds" for task in tasks) + " |",
             "|---|" + "---|" * len(tasks),
             "| (before) | " + " | ".join(f"{report['before'][t]:.1%}" for t in tasks) + " |"]
    for name in names:
        cells = []
        for task in tasks:
            result = report["tasks"][task].get(name)
            if result is None:
                cells.append("not run")
                continue
            done = len(result["seeds"])
            interval = (f" [{result['after_ci_low']:.1%}, {result['after_ci_high']:.1%}]" if done > 1 else "")
            cells.append(f"{result['after_mean']:.1%}{interval}" + (f" ({done} seed{'s' * (done > 1)} so far)"
                                                                     if done < len(report["seeds"]) else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
