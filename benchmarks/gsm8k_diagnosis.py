"""Why RL has not moved GSM8K: what the GSM8K benchmark's records say about each RL stage.

Reads every report of `python -m benchmarks.gsm8k` (benchmarks/results/gsm8k_ARM.json) and, where it
still exists, the arm's run directory (results/gsm8k/ARM/run/metrics.jsonl, whose per-step curves
the reports do not keep). For each arm's RL stage it computes:

- the settings that bear on the diagnosis, read back through the config loader from the arm's
  training arguments (group size G, problems per step P, learning rate, KL coefficient,
  temperature, PPO epochs and mini-batches: with one of each the importance ratio is exactly 1 and
  the clip never acts, whatever its range) and whether the training prompt is the one evaluated;
- the correct completions of each step, where the reward curve says it exactly: with the math
  verifier's 0/1 and a format bonus paid to correct answers only (`reward.format_gated`), a step's
  `reward/mean` times its G x P completions is the number of correct ones, an integer unless a
  correct answer earned the bonus (then `format_bonus_steps` counts it). From those counts: the
  steps with no correct completion (every group without reward spread: no gradient but the KL
  term's), bounds on the groups with spread (at least one in a step with 0 < k < G correct, at
  most min(k, P)), hence on `rollout/zero_std_frac` and on the samples that carry an advantage, and
  the per-group chance q of spread that the share of steps with any spread implies
  (1 - (1 - q)^P, groups taken as independent);
- sampled training accuracy (temperature as trained) in the first and second half of the stage,
  with a 95% bootstrap interval of the difference (steps resampled within each half), beside the
  greedy pass@1 of the policy the stage started from;
- completion length at the start and the end of the stage, and the stage's generated tokens per
  second, all in (generation, reward, update), from its minutes and its length curve;
- while they are on disk, the run's per-step curves (RUN_KEYS) and, per evaluation, the shares of
  greedy answers correct, cut at the limit, with a `#### N` line, with a `\\boxed{}` and readable
  at all, and the problems the RL stage gained and lost.
  Run directories are not kept between sittings of a machine (git ignores them): what an earlier
  diagnosis read from them is carried over from its own report when they are gone, if that diagnosis
  read the same run (the same reward and length curves).

`next_run_estimate` prices the run docs/benchmarks.md proposes (NEXT_RUN) with these records.

The dapo arm's reward is neither 0/1 (overlong punishment) nor over all its groups (dynamic
sampling keeps some), so its correct counts are not decoded; its length curve and skipped updates
are. Writes benchmarks/results/gsm8k_diagnosis.json and .png (curves of sampled accuracy, length,
the correct completions a stage saw in all, and each stage's paired change of greedy pass@1).

    python -m benchmarks.gsm8k_diagnosis
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from benchmarks.common import code_version, pyplot, write_report
from benchmarks.runs import CURVE_KEYS, RESULTS
from reasonrl.config import DEFAULT_MODEL, RewardConfig, SFTConfig, load_config
from reasonrl.recipes import config_path

NAME = "gsm8k_diagnosis"
EVAL_TEMPLATE = "{prompt}"  # benchmarks/gsm8k.py evaluates the bare question
WINDOW = 10  # steps averaged at the start and the end of a stage
# The run docs/benchmarks.md proposes from this diagnosis ("What the records say, and the next run"):
# RL after the 45-minute cold start, 16 samples x 4 problems a step, on the first 128 training problems.
NEXT_RUN = {"minutes": 120.0, "cold_start_minutes": 45.0, "group_size": 16, "prompts_per_step": 4,
            "training_problems": 128}
RESAMPLES = 20_000
# Reward knobs that leave a reward of 0/1 correctness (plus a gated format bonus): how the answer is
# found and checked, and the format bonus itself.
FORMAT_AND_CHECKING = {"format_style", "format_weight", "format_gated", "extract", "math_workers", "math_timeout_s",
                       "on_error"}


def reports() -> dict[str, dict[str, Any]]:
    """Each GSM8K report by arm name (gsm8k_ARM.json), this script's own excluded."""
    found = {path.stem.removeprefix("gsm8k_"): json.loads(path.read_text())
             for path in sorted(RESULTS.glob("gsm8k_*.json")) if path.stem != NAME}
    if not found:
        raise FileNotFoundError(f"no GSM8K report in {RESULTS}: run `python -m benchmarks.gsm8k` first")
    return found


def settings(report: dict[str, Any]) -> dict[str, Any]:
    """The RL stage's settings that the diagnosis reads, from its training arguments (the model
    path, gone with its run directory, replaced: the loader does not read the model)."""
    recipe, *overrides = report["train_args"]
    overrides = [f"model.name={DEFAULT_MODEL}" if o.startswith("model.name=") else o for o in overrides]
    cfg = load_config(config_path(recipe), overrides)
    return {"recipe": recipe, "group_size": cfg.rollout.group_size, "prompts_per_step": cfg.rollout.prompts_per_step,
            "lr": cfg.train.lr, "kl_coef": cfg.algo.kl_coef, "temperature": cfg.rollout.temperature,
            "ppo_epochs": cfg.train.ppo_epochs, "mini_batches": cfg.train.mini_batches,
            "clip_never_acts": cfg.train.ppo_epochs == 1 and cfg.train.mini_batches == 1,
            "max_new_tokens": cfg.rollout.max_new_tokens, "training_prompt": cfg.task.prompt_template,
            "prompt_as_evaluated": cfg.task.prompt_template == EVAL_TEMPLATE,
            "format_reward": f"{cfg.reward.format_style} x {cfg.reward.format_weight}"
                             + (" (correct answers only)" if cfg.reward.format_gated else ""),
            "correct_counts_decodable": (correctness_and_gated_format(cfg.reward) and not cfg.sampling.dynamic
                                         and (cfg.algo.kl_in == "loss" or not cfg.algo.kl_coef)),
            "training_problems": cfg.task.train_size, "problems": cfg.sampling.problems}


def correctness_and_gated_format(reward: RewardConfig) -> bool:
    """Whether every reward is the math verifier's 0/1 plus at most a format bonus of correct answers."""
    default = RewardConfig()
    others = [f.name for f in fields(RewardConfig) if f.name not in FORMAT_AND_CHECKING]
    return (all(getattr(reward, name) == getattr(default, name) for name in others)
            and (reward.format_gated or not reward.format_weight))


def correct_counts(rewards: list[float], completions: int) -> tuple[list[int], int]:
    """Correct completions per step from the mean reward (see the module docstring; exact while
    fewer than 10 answers of a step earn the 0.1 bonus), and the steps whose count is not an
    integer (a correct answer that earned the format bonus)."""
    scaled = [r * completions for r in rewards]
    return [int(s + 1e-9) for s in scaled], sum(abs(s - round(s)) > 1e-6 for s in scaled)


def difference_ci(first: list[float], second: list[float], seed: int = 0) -> list[float]:
    """95% bootstrap interval of mean(second) - mean(first), each half resampled on its own."""
    rng = random.Random(seed)
    diffs = sorted(statistics.fmean(rng.choices(second, k=len(second))) - statistics.fmean(rng.choices(first, k=len(first)))
                   for _ in range(RESAMPLES))
    return [diffs[int(0.025 * RESAMPLES)], diffs[int(0.975 * RESAMPLES) - 1]]


def sparsity(counts: list[int], group_size: int, prompts: int) -> dict[str, Any]:
    """What the correct counts say about reward spread (bounds: the counts do not say how the
    correct answers fall into the step's groups)."""
    steps = len(counts)
    with_spread = [c for c in counts if 0 < c]
    low = len(with_spread) if all(c < group_size for c in counts) else None
    high = sum(min(c, prompts) for c in counts)
    share = len(with_spread) / steps
    return {"correct_total": sum(counts), "steps_without_a_correct_completion": steps - len(with_spread),
            "groups": steps * prompts, "groups_with_spread_bounds": [low, high],
            "zero_std_frac_bounds": [1 - high / (steps * prompts), None if low is None else 1 - low / (steps * prompts)],
            "samples_with_advantage_per_step_bounds": [None if low is None else low * group_size / steps,
                                                       high * group_size / steps],
            "spread_chance_per_group": 1 - (1 - share) ** (1 / prompts)}


def accuracy_halves(counts: list[int], completions: int) -> dict[str, Any]:
    accuracy = [c / completions for c in counts]
    half = len(accuracy) // 2
    first, second = accuracy[:half], accuracy[half:]
    return {"first_window": statistics.fmean(accuracy[:WINDOW]), "first_half": statistics.fmean(first),
            "second_half": statistics.fmean(second), "change": statistics.fmean(second) - statistics.fmean(first),
            "change_ci95": difference_ci(first, second)}


def cold_start_examples(cold: dict[str, Any]) -> int:
    """Worked solutions the cold start trained on: its steps times its batch (sft.batch_size)."""
    sizes = [int(a.split("=", 1)[1]) for a in cold["args"] if a.startswith("sft.batch_size=")]
    return cold["steps_trained"] * (sizes[-1] if sizes else SFTConfig().batch_size)


RUN_KEYS = (*CURVE_KEYS, "reward/format", "sampling/skipped_problems", "sampling/outside_band",
            "sampling/band_exhausted")  # the shared curves, and the format reward and the band sampler's


def run_curves(arm: str) -> dict[str, list[float]]:
    """The per-step curves of RUN_KEYS in the arm's run directory, when it still exists."""
    path = RESULTS / "gsm8k" / arm / "run" / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {key: [row[key] for row in rows if key in row] for key in RUN_KEYS if any(key in row for row in rows)}


def read_evaluation(out: Path) -> dict[str, dict[str, Any]] | None:
    """Each problem's greedy answer in an evaluation directory of benchmarks/gsm8k.py, when it still
    exists: correct (math-verify, as the benchmark scores it), cut at the length limit, its length,
    whether it has a `#### N` line or a `\\boxed{}`, and whether any extractor finds an answer."""
    from reasonrl.commands.eval import eval_problems
    from reasonrl.rewards import MathReward, extract_answer

    path = out / "completions.jsonl"
    if not path.exists():
        return None
    problems = {problem.id: problem for problem in eval_problems("gsm8k", 0)}
    verify, found = MathReward(), {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        completion = record["completions"][0]
        text = completion["text"]
        found[record["problem_id"]] = {
            "correct": verify(text, problems[record["problem_id"]]) > 0,
            "cut": completion["finish_reason"] == "length", "tokens": len(completion["token_ids"]),
            "gsm8k_line": "####" in text, "boxed": "\\boxed" in text, "extractable": extract_answer(text) is not None}
    return found


def evaluation_summary(found: dict[str, dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.fmean(float(answer[key]) for answer in found.values())
            for key in ("correct", "cut", "tokens", "gsm8k_line", "boxed", "extractable")} | {"problems": len(found)}


def evaluations(arm: str, cold_start: bool) -> dict[str, Any]:
    """What the arm's evaluations still on disk say per answer (results/gsm8k/before, ARM/after_cold_start,
    ARM/after), and the problems the RL stage gained and lost."""
    where = {"before": RESULTS / "gsm8k" / "before", "rl_start": RESULTS / "gsm8k" / arm / "after_cold_start",
             "after": RESULTS / "gsm8k" / arm / "after"}
    found = {name: answers for name, out in where.items() if (answers := read_evaluation(out)) is not None}
    summary: dict[str, Any] = {name: evaluation_summary(answers) for name, answers in found.items()}
    start = found.get("rl_start" if cold_start else "before")
    if start is not None and "after" in found:
        pairs = [(start[i]["correct"], found["after"][i]["correct"]) for i in start]
        summary["rl_gained"] = sum(not b and a for b, a in pairs)
        summary["rl_lost"] = sum(b and not a for b, a in pairs)
    return summary


def stage(arm: str, report: dict[str, Any], earlier: dict[str, Any] | None = None) -> dict[str, Any]:
    """One arm's RL stage: settings, evaluations, sparsity, sampled accuracy, length, throughput;
    the curves and evaluations read from disk by an `earlier` diagnosis of the same run where they are
    gone."""
    s = settings(report)
    completions = s["group_size"] * s["prompts_per_step"]
    lengths = report["length_curve"]
    cold = report.get("cold_start")
    minutes = report["minutes_trained"] - (cold["minutes_trained"] if cold else 0.0)
    start = cold["after"] if cold else report["before"]
    out: dict[str, Any] = {
        "settings": s, "steps": report["steps_trained"], "minutes": minutes, "minutes_total": report["minutes_trained"],
        "cold_start_minutes_budget": cold["minutes_budget"] if cold else None,
        "cold_start_steps_budget": cold.get("steps_budget") if cold else None,
        "seconds_per_step": 60 * minutes / report["steps_trained"],
        "greedy_pass1": {"before": report["before"] and report["before"]["pass@1"], "rl_start": start["pass@1"],
                         "after": report["after"]["pass@1"]},
        "cold_start_change": cold["change"] if cold else None,
        "cold_start_examples": cold_start_examples(cold) if cold else None,
        "rl_change": report.get("rl_change", report["change"]),
        "length": {"first_window": statistics.fmean(lengths[:WINDOW]), "last_window": statistics.fmean(lengths[-WINDOW:]),
                   "min": min(lengths), "max": max(lengths), "limit": s["max_new_tokens"]},
        "skipped_updates": report.get("skipped_updates", 0),
        "tokens_per_second_all_in": None, "reward_curve": report["reward_curve"], "length_curve": lengths}
    if s["correct_counts_decodable"]:
        counts, bonus_steps = correct_counts(report["reward_curve"], completions)
        out |= {"correct_per_step": counts, "format_bonus_steps": bonus_steps,
                "sparsity": sparsity(counts, s["group_size"], s["prompts_per_step"]),
                "sampled_accuracy": accuracy_halves(counts, completions),
                "tokens_per_second_all_in": sum(lengths) * completions / (60 * minutes)}
    same_run = earlier is not None and (earlier.get("reward_curve"), earlier.get("length_curve")) == (
        report["reward_curve"], lengths)
    earlier = earlier if same_run else {}
    if curves := run_curves(arm) or earlier.get("run_curves"):
        out["run_curves"] = curves
    if answers := evaluations(arm, cold is not None) or earlier.get("evaluations"):
        out["evaluations"] = answers
    return out


def next_run_estimate(stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """NEXT_RUN's RL stage priced with the records: the all-in token rate of the decoded stages,
    the completion length of the stages that started from a cold start, the cold start's minutes
    as the 45-minute one took, and the chance of spread per group of the stages with its G."""
    decoded = [st for st in stages.values() if "sparsity" in st]
    rates = [st["tokens_per_second_all_in"] for st in decoded]
    after_sft = [st for st in decoded if st["cold_start_examples"]]
    length = statistics.fmean(statistics.fmean(st["length_curve"]) for st in after_sft)
    cold = [st["minutes_total"] - st["minutes"] for st in after_sft
            if st["cold_start_minutes_budget"] == NEXT_RUN["cold_start_minutes"]]
    rl_minutes = NEXT_RUN["minutes"] - (cold[0] if cold else NEXT_RUN["cold_start_minutes"])
    completions = NEXT_RUN["group_size"] * NEXT_RUN["prompts_per_step"]
    seconds = [completions * length / rate for rate in (max(rates), min(rates))]
    spread = [st["sparsity"]["spread_chance_per_group"] for st in decoded
              if st["settings"]["group_size"] == NEXT_RUN["group_size"]]
    return {"settings": NEXT_RUN, "rl_minutes": rl_minutes, "completion_length": length,
            "tokens_per_second_all_in": [min(rates), max(rates)], "seconds_per_step": seconds,
            "steps": [int(60 * rl_minutes / s) for s in reversed(seconds)],
            "first_pass_steps": NEXT_RUN["training_problems"] // NEXT_RUN["prompts_per_step"],
            "spread_chance_per_group": spread[0] if spread else None,
            "problems_in_band_after_first_pass": spread[0] * NEXT_RUN["training_problems"] if spread else None}


def plot(stages: dict[str, dict[str, Any]], out: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    figure, ((acc, length), (seen, changes)) = plt.subplots(2, 2, figsize=(13, 9))
    for index, (arm, st) in enumerate(stages.items()):
        (line,) = length.plot(range(1, st["steps"] + 1), st["length_curve"], label=arm, linewidth=1, color=f"C{index}")
        if "correct_per_step" not in st:
            continue
        completions = st["settings"]["group_size"] * st["settings"]["prompts_per_step"]
        accuracy = [c / completions for c in st["correct_per_step"]]
        rolling = [statistics.fmean(accuracy[max(0, t - WINDOW + 1): t + 1]) for t in range(len(accuracy))]
        acc.plot(range(1, len(rolling) + 1), [100 * a for a in rolling], color=line.get_color(), label=arm)
        acc.axhline(100 * st["greedy_pass1"]["rl_start"], color=line.get_color(), linestyle=":", linewidth=1)
        total = 0
        cumulative = [total := total + c for c in st["correct_per_step"]]
        seen.step(range(1, len(cumulative) + 1), cumulative, where="post", color=line.get_color(), label=arm)
    acc.set(title=f"sampled training accuracy, mean of the last {WINDOW} steps\n(dotted: greedy test pass@1 of the "
                  "policy the stage started from)", xlabel="RL step", ylabel="%")
    length.axhline(256, color="grey", linestyle="--", linewidth=1, label="limit (256)")
    length.set(title="mean completion length per step\n(training samples)", xlabel="RL step", ylabel="tokens")
    examples = " and ".join(str(st["cold_start_examples"]) for st in stages.values() if st["cold_start_examples"])
    seen.set(title=f"correct completions the RL stage sampled, cumulative\n(the SFT cold starts trained on {examples} "
                   "worked solutions)", xlabel="RL step", ylabel="completions")
    for axes in (acc, length, seen):
        axes.legend(fontsize=8)
    labels, means, errors, colours = [], [], [], []
    for arm, st in stages.items():
        for what, change, colour in (("SFT", st["cold_start_change"], "tab:green"), ("RL", st["rl_change"], "tab:red")):
            if change is not None:
                low, high = change["ci95"]
                labels.append(f"{arm.replace('_', ' ')}: {what}")
                means.append(100 * change["mean"])
                errors.append([100 * (change["mean"] - low), 100 * (high - change["mean"])])
                colours.append(colour)
    for i, (mean, error, colour) in enumerate(zip(means, errors, colours)):
        changes.errorbar(i, mean, yerr=[[error[0]], [error[1]]], fmt="o", color=colour, capsize=4)
    changes.axhline(0, color="black", linewidth=0.8)
    changes.set_xticks(range(len(labels)), labels, fontsize=8, rotation=25, ha="right")
    changes.set(title="each stage's change of greedy pass@1 on the 1319 test problems\n(paired 95% interval; green: "
                      "SFT cold start, red: RL)", ylabel="points")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return True


def main(argv: list[str]) -> dict[str, Any]:
    if argv:
        raise SystemExit(f"usage: python -m benchmarks.gsm8k_diagnosis (no arguments), got {argv}")
    previous = RESULTS / f"{NAME}.json"
    earlier = json.loads(previous.read_text())["stages"] if previous.exists() else {}
    stages = {arm: stage(arm, report, earlier.get(arm)) for arm, report in reports().items()}
    report = {
        "what": "the RL stages of the GSM8K benchmark's arms, read back from their reports: settings, reward "
                "sparsity from the exact correct counts, sampled accuracy against greedy pass@1, completion length, "
                "throughput, and each stage's paired change of greedy pass@1",
        "not_in_the_reports": ["rollout/zero_std_frac (bounded here from the correct counts)",
                               "rollout/truncated_frac", "kl/mean", "entropy/mean", "loss/clip_frac",
                               "train/grad_norm", "reward/format", "perf/step_s per step",
                               "per-problem correctness of each evaluation (the gained and lost problems)",
                               "the evaluations' truncated and extractable shares"],
        "stages": stages, "next_run_estimate": next_run_estimate(stages), "commit": code_version()}
    plotted = plot(stages, RESULTS / f"{NAME}.png")
    report["plot"] = f"{NAME}.png" if plotted else None
    write_report(NAME, report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
