"""The learning numbers of README.md's results table, recomputed from the records they cite.

Each learning number there is the median over the seeds it names, with the 95% Student-t interval
of the mean over the same seeds (`benchmarks.common.t_interval`: the interval every verdict of
these benchmarks is read from). A distribution-free 95% interval of a median needs at least 6 seeds
(n seeds put the median between their minimum and maximum with probability 1 - 2^(1-n), 94% for
5), and most rows have 3 or 5; where there are 6 or more, this file also gives that order-statistic
interval with its exact coverage. A number from one seed is marked `one_seed`: an anecdote, with no
interval over seeds (GSM8K's records carry intervals over test problems, kept as such).

Every number lists its runs: seed, value, the commit its record names ("-dirty": with uncommitted
changes on top of it; null: the record names none) and the record, under benchmarks/results/.
Reads records only, runs nothing; writes benchmarks/results/readme_numbers.json.

    python -m benchmarks.readme_numbers
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.common import code_version, t_interval, write_report
from benchmarks.curve_summary import verdict as curve_verdict
from benchmarks.runs import RESULTS

ACCURACY = "eval/sampled_accuracy"  # benchmarks/recipes.py's held-out metric
MEDIAN_COVERAGE = 0.95
TRL_MARGIN = 0.05  # the non-inferiority margin benchmarks/curve_summary.py stated before its runs


@dataclass(frozen=True)
class Run:
    seed: int
    value: float
    commit: str | None  # as the record names it; None when it names none
    record: str  # path under benchmarks/results/
    setting: str = ""  # what tells apart two runs of one seed in the same number


def load(record: str) -> dict[str, Any]:
    return json.loads((RESULTS / record).read_text())


def median_interval(values: Sequence[float], coverage: float = MEDIAN_COVERAGE) -> dict[str, float] | None:
    """The narrowest [x_(k), x_(n+1-k)] of the sorted values that holds the median of any continuous
    distribution with probability >= `coverage` (1 - 2 P(Binomial(n, 1/2) < k)), or None when even
    [min, max] falls short (fewer than 6 values at 95%)."""
    ordered, n = sorted(values), len(values)
    found = None
    for k in range(1, n // 2 + 1):
        held = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n
        if held < coverage:
            break
        found = {"low": ordered[k - 1], "high": ordered[n - k], "coverage": held}
    return found


def seed_ranges(seeds: Sequence[int]) -> str:
    """Seeds as the README names them: runs of consecutive seeds joined, e.g. "0-4, 7"."""
    parts: list[str] = []
    for seed in sorted(set(seeds)):
        if parts and parts[-1][1] == seed - 1:
            parts[-1] = (parts[-1][0], seed)
        else:
            parts.append((seed, seed))
    return ", ".join(f"{low}" if low == high else f"{low}-{high}" for low, high in parts)


def summarise(values: Sequence[float]) -> dict[str, Any]:
    """Median over seeds, the 95% t-interval of their mean ([low, high]; None for one seed), the mean,
    and the order-statistic interval of the median where the seeds suffice."""
    if not values:
        raise ValueError("a number needs at least one run: check that its records exist")
    mean, low, high = t_interval(values)
    median = statistics.median(values)
    one_seed = len(values) == 1
    return {"n": len(values), "median": median, "ci95_mean": None if one_seed else [low, high], "mean": mean,
            "median_inside_ci95_mean": None if one_seed else low <= median <= high,
            "median_ci": median_interval(values), "one_seed": one_seed}


def seeds_text(runs: Sequence[Run]) -> str:
    settings = list(dict.fromkeys(run.setting for run in runs))
    if settings == [""]:
        return seed_ranges([run.seed for run in runs])
    return "; ".join(f"{seed_ranges([run.seed for run in runs if run.setting == setting])} ({setting})"
                     for setting in settings)


def number(what: str, runs: Sequence[Run], **extra: Any) -> dict[str, Any]:
    commits = sorted({run.commit for run in runs if run.commit}) or ["not recorded"]
    return {"what": what, **summarise([run.value for run in runs]), "seeds": seeds_text(runs),
            "commits": commits, **extra, "runs": [asdict(run) for run in runs]}


def trl_curves() -> list[dict[str, Any]]:
    summary_file = "vs_trl_v2_curve_summary.json"
    runs = [Run(r["seed"], r["reasonrl"]["reward_mean"] - r["trl"]["reward_mean"],
                load(r["file"])["versions"]["reasonrl_git"], r["file"], f"rollout.prompts_per_step={r['prompts']}")
            for r in load(summary_file)["runs"]]
    entry = number("mean reward over 20 steps, reasonrl minus TRL, paired by seed and setting", runs,
                   margin=TRL_MARGIN, record=summary_file)
    entry["verdict"] = curve_verdict(*entry["ci95_mean"], TRL_MARGIN)
    return [entry]


def recipe_numbers(summary_file: str, task: str) -> list[dict[str, Any]]:
    """Each recipe's held-out accuracy after the summary's steps, and whether its interval clears the start."""
    summary = load(summary_file)
    before = summary["before"][task]
    numbers = []
    for recipe, result in summary["tasks"][task].items():
        runs = [Run(s["seed"], s["after"], s["commit"], summary_file) for s in result["seeds"]]
        entry = number(f"{task}: {recipe}, held-out sampled accuracy after {summary['steps']} steps", runs,
                       recipe=recipe, start=before)
        entry["clears_start"] = entry["ci95_mean"] is not None and entry["ci95_mean"][0] > before
        numbers.append(entry)
    medians = [entry["median"] for entry in numbers]
    overview = {"what": f"{task}: the recipes' medians, lowest and highest", "start": before,
                "lowest": min(medians), "highest": max(medians),
                "recipes": len(numbers), "intervals_clearing_start": sum(e["clears_start"] for e in numbers),
                "median_intervals_clearing_start": sum(e["median_ci"] is not None and e["median_ci"]["low"] > before
                                                       for e in numbers)}
    return [overview, *numbers]


def record_runs(pattern: str, seeds: Sequence[int], metric: Callable[[dict], float]) -> list[Run]:
    """One run per seed from records named by `pattern` (with {seed}), each naming its commit."""
    runs = []
    for seed in seeds:
        record = pattern.format(seed=seed)
        data = load(record)
        runs.append(Run(seed, metric(data), data.get("commit"), record))
    return runs


def gym_history() -> list[dict[str, Any]]:
    """The gym numbers that are not the recipes as shipped: the ten-seed study's clip_cov, and prime
    with the paper's Eq. 5 (records kept apart)."""
    study = "recipes_gym_10seeds.json"
    clip_cov = load(study)["tasks"]["gym"]["clip_cov"]
    return [number("gym: clip_cov in the ten-seed study, before it took dynamic sampling",
                   [Run(s["seed"], s["after"], s["commit"], study) for s in clip_cov["seeds"]]),
            number("gym: prime with the paper's Eq. 5 baseline",
                   record_runs("recipes/gym_prime_eq5/prime_seed{seed}.json", range(3),
                               lambda data: data["eval_last"][ACCURACY]))]


def distill() -> list[dict[str, Any]]:
    summary = load("distill.json")
    numbers = []
    for step in (5, 20):
        arms = {}
        for arm, result in summary["arms"].items():
            accuracies = next(p for p in result["points"] if p["step"] == step)["accuracies"]
            arms[arm] = [Run(seed, value, load(f"distill/{arm}_seed{seed}.json")["commit"], f"distill/{arm}_seed{seed}.json")
                         for seed, value in zip(result["seeds"], accuracies)]
            numbers.append(number(f"{arm}: held-out sampled accuracy after {step} steps", arms[arm]))
        differences = [Run(d.seed, d.value - g.value, "+".join(sorted({d.commit, g.commit})), "distill.json")
                       for d, g in zip(arms["distill"], arms["grpo"], strict=True)]
        numbers.append(number(f"distill minus grpo after {step} steps, paired by seed", differences))
    teacher = load("distill/teacher.json")
    numbers.append(number("teacher (grpo, 20 steps at temperature 1): held-out sampled accuracy",
                          [Run(0, summary["teacher"]["accuracy"], teacher["commit"], "distill/teacher.json")]))
    return numbers


# The per-run records each claim's arms were read from, as benchmarks/claims.py named them then.
H200_ARMS = {"dr_grpo": ("dr_grpo", "dr_grpo_grpo_normaliser"),
             "dapo_clip_higher": ("ppo_clip_mini4", "ppo_clip_mini4_clip_higher"),
             "dapo_dynamic_sampling": ("dapo_eval_every_5", "dapo_no_dynamic_eval_every_5"),
             "cov": ("clip_cov", "kl_cov", "ppo_clip_mini4"), "ttrl": ("grpo_majority_vote",),
             "gspo": ("gspo_mini8_lr1e-5", "ppo_clip_mini8_lr1e-5")}
CPU_ARMS = {"opo": (), "prime": ("recipes/arithmetic/prime", "claims/prime_outcome_only"),
            "cov": ("recipes/arithmetic/clip_cov", "recipes/arithmetic/kl_cov", "claims/clip_cov_as_ppo_clip")}


PAPER_SIZE_ARMS = {"dapo_clip_higher": H200_ARMS["dapo_clip_higher"], "ttrl": H200_ARMS["ttrl"],
                   "cov": ("clip_cov", "kl_cov", "clip_cov_as_ppo_clip")}


def claim_commit(arm_records: Sequence[str], seed: int, fallback: str | None) -> str | None:
    commits = sorted({load(f"{stem}_seed{seed}.json").get("commit") or "" for stem in arm_records} - {""})
    return "+".join(commits) if commits else fallback


def claims() -> list[dict[str, Any]]:
    numbers = []
    studies = (("claims_h200.json", H200_ARMS, "claims/h200/", ""), ("claims.json", CPU_ARMS, "", ""),
               ("claims_opo8.json", {"opo": ()}, "claims/opo8/", " (8 seeds)"),
               ("claims_ttrl24.json", {"ttrl": ("grpo_majority_vote",)}, "claims/ttrl24/", " (24 seeds, CPU)"),
               ("claims_dr_grpo22.json", {"dr_grpo": ("dr_grpo", "dr_grpo_grpo_normaliser")}, "claims/dr_grpo22/",
                " (22 seeds, CPU)"),
               ("claims_prime8.json", {"prime": ("prime", "prime_outcome_only")}, "claims/prime8/", " (8 seeds, CPU)"),
               ("claims_paper_size.json", PAPER_SIZE_ARMS, "claims/paper_size/", " (at the paper's size, CPU)"))
    for summary_file, arms, prefix, label in studies:
        summary = load(summary_file)
        for name, claim in summary["claims"].items():
            stems = [prefix + arm for arm in arms[name]]
            for test, result in claim["tests"].items():
                runs = [Run(seed, value, claim_commit(stems, seed, claim.get("commit")), summary_file)
                        for seed, value in zip(claim["seeds"], result["values"])]
                numbers.append(number(f"{name}{label}: {test}", runs, predicted=result["predicted"],
                                      verdict=result["verdict"], device=", ".join(claim.get("devices") or ["cpu"])))
    return numbers


def prm() -> list[dict[str, Any]]:
    summary = load("prm_arithmetic.json")
    commits = {s["seed"]: s["commit"] for s in summary["seeds"]}
    return [number(what, [Run(seed, value, commits[seed], "prm_arithmetic.json")
                          for seed, value in zip(commits, summary[key]["values"])])
            for key, what in (("auc_after", "held-out step AUC of the trained PRM"),
                              ("best_of_n_minus_majority", "best-of-8 by the PRM minus majority vote, accuracy"))]


def gsm8k_seeds(arm: str) -> list[str]:
    """An arm's records, one per training seed: gsm8k_ARM.json (seed 0) and gsm8k_ARM_seedN.json
    (`benchmarks/gsm8k.py --seed N`)."""
    return [f"gsm8k_{arm}.json", *sorted(path.name for path in RESULTS.glob(f"gsm8k_{arm}_seed*.json"))]


def gsm8k() -> list[dict[str, Any]]:
    """Each arm's greedy pass@1 and changes over its training seeds. With one seed the record's interval
    is over the 1319 test problems (bootstrap), not over seeds, and is given as such."""
    numbers = []
    for arm in ("dapo", "grpo", "grpo_cold_start", "grpo_long_cold_start", "grpo_band_cold_start"):
        stages: dict[str, list[tuple[Run, list[float]]]] = {}
        for record in gsm8k_seeds(arm):
            data = load(record)
            values = {"before": data["before"], "after": data["after"], "change": data["change"]}
            if "cold_start" in data:
                values |= {"after the SFT": data["cold_start"]["after"],
                           "change by the SFT": data["cold_start"]["change"], "change by the RL": data["rl_change"]}
            for stage, value in values.items():
                if value is None:  # the base model not evaluated again (--skip-base)
                    continue
                point = value["pass@1"] if "pass@1" in value else value["mean"]
                # The commit its runs trained at: a report written later names its own commit too.
                commit = data.get("trained_at") or data["commit"]
                stages.setdefault(stage, []).append((Run(data.get("seed", 0), point, commit, record),
                                                     value["ci95"]))
        for stage, seeds in stages.items():
            over_problems = {"ci95_over_problems": seeds[0][1]} if len(seeds) == 1 else {}
            numbers.append(number(f"{arm}: greedy pass@1 {stage}", [run for run, _ in seeds], **over_problems))
    return numbers


def agents() -> list[dict[str, Any]]:
    names = sorted(path.name for path in (RESULTS / "agents").glob("tool_math_seed*.json"))
    records = {name: load(f"agents/{name}") for name in names}

    def runs(value: Callable[[dict[str, Any]], float]) -> list[Run]:
        return [Run(r["seed"], value(r), r["commit"], f"agents/{name}") for name, r in records.items()]

    return [*(number(f"tool_math: held-out sampled accuracy {when}",
                     runs(lambda r, when=when: r["eval"][when]["sampled_accuracy"])) for when in ("before", "after")),
            number("tool_math: held-out sampled accuracy, after minus before",
                   runs(lambda r: r["eval"]["after"]["sampled_accuracy"] - r["eval"]["before"]["sampled_accuracy"]))]


ROWS: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "reward curves against TRL": trl_curves,
    "23 recipes, arithmetic": lambda: recipe_numbers("recipes_arithmetic_all_seeds.json", "arithmetic"),
    "23 recipes at the default job's rate, arithmetic": lambda: recipe_numbers("recipes_default_rate.json", "arithmetic"),
    "23 recipes at their own rates, spelling": lambda: recipe_numbers("recipes_own_rate_spelling.json", "spelling"),
    "4 recipes with groups kept by reward, spelling": lambda: recipe_numbers("recipes_own_rate_keep_reward_spelling.json",
                                                                               "spelling"),
    "23 recipes, reasoning-gym chain_sum": lambda: [*recipe_numbers("recipes_gym_10seeds_shipped.json", "gym"),
                                                    *gym_history()],
    "GSM8K, 60 min of training": gsm8k,
    "on-policy distillation against GRPO": distill,
    "papers' claims in miniature": claims,
    "PRM on Monte Carlo step labels": prm,
    "multi-turn tool use": agents,
}


def line(entry: dict[str, Any]) -> str:
    if "median" not in entry:
        return f"  {entry['what']}: " + ", ".join(f"{k} {v}" for k, v in entry.items() if k != "what")
    interval = entry["ci95_mean"]
    bracket = f"[{interval[0]:.4g}, {interval[1]:.4g}]" if interval else "(one seed)"
    return (f"  {entry['what']}: median {entry['median']:.4g} {bracket}, seeds {entry['seeds']}, "
            f"at {', '.join(entry['commits'])}")


def main(argv: list[str]) -> dict[str, Any]:
    if argv:
        sys.exit("python -m benchmarks.readme_numbers takes no arguments")
    rows = {row: compute() for row, compute in ROWS.items()}
    for row, entries in rows.items():
        print(row)
        print("\n".join(line(entry) for entry in entries))
    report = {"what": __doc__.split("\n\n")[0], "computed_at": code_version(),
              "interval": "ci95_mean: 95% Student-t interval of the mean over seeds (benchmarks.common.t_interval)",
              "rows": rows}
    write_report("readme_numbers", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
