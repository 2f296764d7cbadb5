"""The headline claim of eight papers, reproduced in miniature with several seeds.

Every claim is a prediction about a paired difference between two arms run with the same seeds
(SmolLM2-135M-Instruct, the arithmetic task, 20 steps, the held-out evaluation of
benchmarks/recipes.py), stated here before the runs: the claim is **reproduced** when the 95%
Student-t interval of the mean difference over seeds lies entirely on the predicted side,
**contradicted** when it lies entirely on the other side, and **inconclusive** otherwise. Runs that
benchmarks/recipes.py already recorded with the same arguments are reused, not rerun.

1. Dr. GRPO (Liu et al. 2025): with GRPO's per-sequence length normaliser the length of incorrect
   responses grows more over training than with Dr. GRPO's constant normaliser. Arms: the dr_grpo
   recipe, and the same with aggregation = seq_mean_token_mean. Metric: mean length of wrong
   completions over the last 5 steps minus the first 5. Predicted: GRPO normaliser > constant.
2. DAPO clip-higher (Yu et al. 2025): a higher upper clip keeps the policy's entropy higher than
   symmetric clipping. Arms: PPO-clip with 4 optimizer steps per batch (lr 1e-5, as the clip_cov and
   kl_cov recipes), clip 0.2 / 0.2 and 0.2 / 0.28. Metric: mean token entropy over the last 10 steps.
   Predicted: clip-higher > symmetric.
3. DAPO dynamic sampling: reaches a given accuracy with fewer generated tokens. Arms: the dapo
   recipe with and without dynamic sampling, evaluated every 5 steps on 100 problems x 2. Metric: mean
   held-out accuracy over the generated-token budget both arms reach (area under accuracy against
   tokens, linear between evaluations, divided by the budget; both curves start at 0 tokens at the
   base model's accuracy). Predicted: dynamic > plain.
4. Clip-Cov / KL-Cov (Cui et al. 2025): entropy stays higher than GRPO's at equal steps, at equal
   or better accuracy. Arms: the clip_cov and kl_cov recipes against PPO-clip (0.2 / 0.2) at the
   same schedule and sampling (the clip_cov recipe with PPO-clip's objective: 4 optimizer steps per
   batch, lr 1e-5, dynamic sampling; the symmetric arm of claim 2 until the recipes took the
   authors' dynamic sampling). Metrics: entropy over the last 10 steps (predicted higher) and
   accuracy after training (predicted not worse by more than 0.05: the lower end of the interval
   of the difference above -0.05). Reproduced only when both hold.
5. TTRL (Zuo et al. 2025): a majority-vote reward without labels raises held-out accuracy. Arm: the
   grpo recipe with reward.verifier = majority_vote and no format reward; its accuracy after
   training against the base model's (the evaluation of benchmarks/recipes.py's "before").
   Predicted: after > before.
6. GSPO (Zheng et al. 2025): sequence-level ratios stay stable where token-level ratios are noisy.
   Arms: 8 optimizer steps per batch at lr 1e-5 (four times the one-step recipes' movement per
   batch, a setting that stresses the ratios), token-level PPO-clip against GSPO. Metric: accuracy
   after training. Predicted: GSPO > token-level.
7. OPO (Hao et al. 2025): the length-weighted baseline b = sum |y| r / sum |y| gives a policy
   gradient of lower variance than the group mean. No training: for each of 8 problems, 16 groups
   of 8 samples of the base model; each group's sequence-level REINFORCE gradient (of the last
   decoder layer's weights) with either baseline, on the same samples; variance = trace of the
   covariance over the groups. Metric: log of the variance ratio (OPO / mean), averaged over the
   problems, per seed (seeds draw other problems and samples). Predicted: below 0.

8. PRIME (Cui et al. 2025): dense rewards from an implicit PRM trained online on the outcome labels
   improve on the outcome reward alone. Arms: the prime recipe (the run benchmarks/recipes.py
   records), and the same recipe with prime.enabled = false (RLOO on the outcome, the same PPO
   objective, entropy bonus and accuracy filter). Metric: accuracy after training. Predicted:
   PRIME > outcome only. Stated after the prime arm's seeds 0 and 1 were seen (63.5% and 46.5%),
   before any run of the outcome-only arm.

Writes benchmarks/results/claims.json (per claim: the arms' runs, per-seed metrics, differences,
interval, verdict, the devices the runs used) and benchmarks/results/claims.png.

`--against paper` tests the same differences against the paper's effect carried into the miniature
(PAPER_EFFECTS, fixed from the earlier studies before the runs that test them) instead of zero: the
claim at the paper's size is **reproduced** when the interval lies wholly above that effect (the
miniature shows an effect at least that large) and **contradicted** when it lies wholly below (the
effect, if any, is smaller than the paper's). Only the tests with a paper effect are tested; a claim
contradicted there is not thereby contradicted against zero.

`--study claims/NAME` runs every arm in a study of its own, the recipe arms and the base model's
evaluation included (reusing nothing of benchmarks/recipes.py), and writes claims_NAME.json/png:
the whole set of claims on another machine, e.g. a GPU, where `--jobs` runs several at a time.

    python -m benchmarks.claims [--seeds 0,1,2] [--only dr_grpo,ttrl] [--summary-only]
                                [--study claims/NAME] [--jobs N] [--steps 20] [--against paper]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import code_version, machine, pyplot, source_digest, t_interval, write_report
from benchmarks.recipes import ACCURACY, EVAL
from benchmarks.runs import AS_MEASURED, RESULTS, RunSpec, read_record, record_path, run_all, run_device

STEPS = 20
STUDY = "claims"  # the default study: recipe arms reuse benchmarks/recipes.py's records
MULTI_STEP = ["train.mini_batches=4", "train.lr=1e-5"]  # the clip_cov and kl_cov recipes' schedule
EVERY_5 = ("eval.every=5", "eval.problems=100", "eval.samples=2")  # 200 samples per evaluation, 4 evaluations
NONINFERIORITY_MARGIN = 0.05


@dataclass(frozen=True)
class Arm:
    key: str  # names its records: an arm shared by two claims runs once
    config: str | None  # a recipe name, or None for the defaults
    overrides: tuple[str, ...] = ()
    recipe_run: bool = False  # the very run benchmarks/recipes.py records for this recipe (key = recipe)

    def args(self, seed: int, steps: int) -> list[str]:
        return [*EVAL, *self.overrides, f"run.seed={seed}", f"train.steps={steps}"]

    def study(self, study: str) -> str:
        return shared_with_recipes(study) if self.recipe_run else study

    def spec(self, study: str, seed: int, steps: int) -> RunSpec:
        return RunSpec(self.study(study), f"{self.key}_seed{seed}", self.config, tuple(self.args(seed, steps)),
                       {"seed": seed})


def recipe_arm(name: str) -> Arm:
    """A recipe as benchmarks/recipes.py runs it on the arithmetic task: its records are reused."""
    return Arm(name, name, recipe_run=True)


def shared_with_recipes(study: str) -> str:
    """Where a run that benchmarks/recipes.py also makes is recorded: its study in the default study
    (reused), else the claims' own study."""
    return "recipes/arithmetic" if study == STUDY else study


def base_model_spec(study: str) -> RunSpec:
    """The base model's evaluation (benchmarks/recipes.py's "before" in the default study)."""
    return RunSpec(shared_with_recipes(study), "before", None, (*EVAL, "train.steps=0"))


@dataclass(frozen=True)
class Claim:
    paper: str
    statement: str
    arms: dict[str, Arm]
    # (metric name, function of (arm name -> run record) -> paired value, predicted side, margin)
    tests: tuple[tuple[str, Callable[[dict[str, dict]], float], str], ...]
    curves: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


def tail_mean(run: dict, key: str, count: int) -> float:
    values = [v for v in run["curves"][key] if v is not None]
    return statistics.fmean(values[-count:])


def growth(run: dict, key: str, count: int = 5) -> float:
    values = [v for v in run["curves"][key] if v is not None]
    return statistics.fmean(values[-count:]) - statistics.fmean(values[:count])


def accuracy(run: dict) -> float:
    return run["eval_last"][ACCURACY]


def accuracy_per_token(runs: dict[str, dict], start_accuracy: float) -> dict[str, float]:
    """Each run's mean accuracy over the generated-token budget every run reaches (area under
    accuracy against cumulative tokens, linear between evaluations, over that budget). Every curve
    starts at (0 tokens, the base model's accuracy): without that point the stretch before a run's
    first evaluation would count as zero, against the arm that spends more tokens early."""
    curves = {}
    for arm, run in runs.items():
        tokens = [0.0]
        for value in run["curves"]["rollout/generated_tokens"]:
            tokens.append(tokens[-1] + value)
        evaluated = [(tokens[e["step"]], e[ACCURACY]) for e in run["evals"] if ACCURACY in e and e["step"] > 0]
        curves[arm] = [(0.0, start_accuracy), *evaluated]
    budget = min(points[-1][0] for points in curves.values())
    areas = {}
    for arm, points in curves.items():
        area = 0.0
        for (t0, a0), (t1, a1) in itertools.pairwise(points):
            if t0 >= budget:
                break
            end = min(t1, budget)
            a_end = a0 + (a1 - a0) * (end - t0) / (t1 - t0)
            area += (a0 + a_end) / 2 * (end - t0)
        areas[arm] = area / budget
    return areas


def dynamic_minus_plain(runs: dict[str, dict]) -> float:
    areas = accuracy_per_token({arm: runs[arm] for arm in ("dynamic", "plain")}, runs["before"]["eval_last"][ACCURACY])
    return areas["dynamic"] - areas["plain"]


def cov_tests(name: str) -> tuple[tuple[str, Callable[[dict[str, dict]], float], str], ...]:
    """Claim 4's two tests for one of the covariance methods against PPO-clip."""
    return ((f"{name}: entropy over the last 10 steps minus PPO-clip's",
             lambda r: tail_mean(r[name], "entropy/mean", 10) - tail_mean(r["ppo_clip"], "entropy/mean", 10), ">0"),
            (f"{name}: accuracy after minus PPO-clip's", lambda r: accuracy(r[name]) - accuracy(r["ppo_clip"]),
             f">-{NONINFERIORITY_MARGIN}"))


SYMMETRIC = Arm("ppo_clip_mini4", None, (*AS_MEASURED, *MULTI_STEP, "algo.clip_high=0.2"))
# The covariance recipes' schedule and sampling with PPO-clip's objective: only the objective differs.
COV_BASELINE = Arm("clip_cov_as_ppo_clip", "clip_cov", ("algo.objective=ppo_clip", "algo.clip_low=0.2",
                                                        "algo.clip_high=0.2"))
CLAIMS: dict[str, Claim] = {
    "dr_grpo": Claim(
        "Liu et al. 2025, Dr. GRPO", "GRPO's length normaliser makes incorrect responses grow longer than Dr. GRPO's "
        "constant normaliser",
        {"grpo_normaliser": Arm("dr_grpo_grpo_normaliser", "dr_grpo", ("algo.aggregation=seq_mean_token_mean",)),
         "constant_normaliser": recipe_arm("dr_grpo")},
        (("growth of wrong-answer length, GRPO normaliser minus constant (tokens)",
          lambda r: growth(r["grpo_normaliser"], "rollout/len_wrong_mean")
          - growth(r["constant_normaliser"], "rollout/len_wrong_mean"), ">0"),),
        curves=("rollout/len_wrong_mean", "rollout/len_correct_mean")),
    "dapo_clip_higher": Claim(
        "Yu et al. 2025, DAPO (clip-higher)", "a higher upper clip keeps entropy higher than symmetric clipping",
        {"symmetric": SYMMETRIC,
         "clip_higher": Arm("ppo_clip_mini4_clip_higher", None, (*AS_MEASURED, *MULTI_STEP, "algo.clip_high=0.28"))},
        (("entropy over the last 10 steps, clip-higher minus symmetric",
          lambda r: tail_mean(r["clip_higher"], "entropy/mean", 10) - tail_mean(r["symmetric"], "entropy/mean", 10),
          ">0"),),
        curves=("entropy/mean", "loss/clip_frac")),
    "dapo_dynamic_sampling": Claim(
        "Yu et al. 2025, DAPO (dynamic sampling)", "dynamic sampling reaches a given accuracy with fewer generated "
        "tokens",
        {"dynamic": Arm("dapo_eval_every_5", "dapo", EVERY_5),
         "plain": Arm("dapo_no_dynamic_eval_every_5", "dapo", (*EVERY_5, "sampling.dynamic=false"))},
        (("accuracy averaged over the common token budget, dynamic minus plain",
          dynamic_minus_plain, ">0"),),
        curves=("rollout/generated_tokens", "reward/correct")),
    "cov": Claim(
        "Cui et al. 2025, Clip-Cov / KL-Cov", "entropy stays higher than GRPO's at equal steps, at equal or better "
        "accuracy",
        {"ppo_clip": COV_BASELINE, "clip_cov": recipe_arm("clip_cov"), "kl_cov": recipe_arm("kl_cov")},
        tuple(test for name in ("clip_cov", "kl_cov") for test in cov_tests(name)),
        curves=("entropy/mean", "reward/correct")),
    "ttrl": Claim(
        "Zuo et al. 2025, TTRL", "a majority-vote reward without labels raises held-out accuracy",
        {"majority_vote": Arm("grpo_majority_vote", "grpo", ("reward.verifier=majority_vote",
                                                             "reward.format_weight=0"))},
        (("accuracy after minus the base model's",
          lambda r: accuracy(r["majority_vote"]) - r["before"]["eval_last"][ACCURACY], ">0"),),
        curves=("reward/mean", "reward/correct")),
    "gspo": Claim(
        "Zheng et al. 2025, GSPO", "sequence-level ratios stay stable where token-level ratios are noisy (8 optimizer "
        "steps per batch)",
        {"token_ratio": Arm("ppo_clip_mini8_lr1e-5", None, (*AS_MEASURED, "train.mini_batches=8", "train.lr=1e-5")),
         "gspo": Arm("gspo_mini8_lr1e-5", "gspo", ("train.mini_batches=8", "train.lr=1e-5"))},
        (("accuracy after, GSPO minus token-level", lambda r: accuracy(r["gspo"]) - accuracy(r["token_ratio"]), ">0"),),
        curves=("reward/correct", "loss/clip_frac", "loss/ratio_max")),
    "prime": Claim(
        "Cui et al. 2025, PRIME", "dense rewards from an implicit PRM trained online on the outcome labels improve "
        "on the outcome reward alone (same RLOO, objective and accuracy filter)",
        # The implicit PRM off, its lr back at the default: a knob that no longer acts is refused.
        {"prime": recipe_arm("prime"),
         "outcome_only": Arm("prime_outcome_only", "prime", ("prime.enabled=false", "prime.lr=1e-6"))},
        (("accuracy after, PRIME minus outcome only", lambda r: accuracy(r["prime"]) - accuracy(r["outcome_only"]),
          ">0"),),
        curves=("reward/correct", "rollout/generated_tokens")),
}


# The paper's effect in each test's units, as benchmarks/claims_power.py carried it over (docs/claims.md,
# "Seeds needed"), fixed here before the paper-size study's runs. Entropy: half the symmetric PPO-clip
# arm's decline over 20 steps (H200 study for clip-higher, this CPU's for the covariance methods); TTRL:
# the paper's smallest relative gain (+105%, Table 1) on the base model's 10.0% on this CPU.
PAPER_EFFECTS: dict[str, dict[str, float]] = {
    "dapo_clip_higher": {"entropy over the last 10 steps, clip-higher minus symmetric": 0.297},
    "cov": {"clip_cov: entropy over the last 10 steps minus PPO-clip's": 0.329,
            "kl_cov: entropy over the last 10 steps minus PPO-clip's": 0.329},
    "ttrl": {"accuracy after minus the base model's": 0.105},
}


def tests_against(name: str, against: str) -> tuple[tuple[str, Callable[[dict[str, dict]], float], str], ...]:
    """A claim's tests as stated (`zero`: each against its own threshold) or against the paper's
    effect (`paper`: only the tests that have one, each predicted above that effect)."""
    if against == "zero":
        return CLAIMS[name].tests
    effects = PAPER_EFFECTS[name]
    return tuple((f"{label} (against the paper's {effects[label]:+.3f})", fn, f">{effects[label]}")
                 for label, fn, _ in CLAIMS[name].tests if label in effects)


def verdict(values: list[float], side: str) -> dict[str, Any]:
    """Mean, 95% t-interval and verdict of per-seed values predicted to lie on `side` of a threshold
    (">0", "<0", ">-0.05")."""
    mean, low, high = t_interval(values)
    threshold = float(side[1:])
    above, below = low > threshold, high < threshold
    predicted, opposite = (above, below) if side[0] == ">" else (below, above)
    outcome = "reproduced" if predicted else "contradicted" if opposite else "inconclusive"
    return {"values": values, "mean": mean, "ci_low": low, "ci_high": high, "predicted": side, "verdict": outcome}


def run_claim(name: str, seeds: list[int], study: str, steps: int, against: str = "zero") -> dict[str, Any]:
    """A claim's verdict from the recorded runs of the seeds whose arms all ran (`against`: see
    tests_against)."""
    claim = CLAIMS[name]
    base = base_model_spec(study)
    before = read_record(base.study, base.name) if record_path(base.study, base.name).exists() else None
    runs_by_seed, seeds_run = [], []
    for seed in seeds:
        specs = {arm_name: arm.spec(study, seed, steps) for arm_name, arm in claim.arms.items()}
        if before is not None and all(record_path(spec.study, spec.name).exists() for spec in specs.values()):
            runs = {arm_name: read_record(spec.study, spec.name) for arm_name, spec in specs.items()}
            runs_by_seed.append(runs | {"before": before})
            seeds_run.append(seed)
    tests = {}
    for label, fn, side in tests_against(name, against):
        tests[label] = verdict([fn(runs) for runs in runs_by_seed], side) if runs_by_seed else None
    verdicts = [t["verdict"] for t in tests.values() if t]
    overall = ("reproduced" if verdicts and all(v == "reproduced" for v in verdicts)
               else "contradicted" if "contradicted" in verdicts else "inconclusive")
    if len(seeds_run) < len(seeds):  # a plan's verdict is read from all its seeds, never from those in so far
        for test in filter(None, tests.values()):
            test["interim_verdict"], test["verdict"] = test["verdict"], "incomplete"
        overall = f"incomplete: {len(seeds_run)} of {len(seeds)} seeds"
    curves = {arm: {key: mean_curve([runs[arm]["curves"].get(key) for runs in runs_by_seed]) for key in claim.curves}
              for arm in claim.arms}
    devices = sorted({runs[arm].get("device", "cpu") for runs in runs_by_seed for arm in claim.arms})
    return {"paper": claim.paper, "claim": claim.statement, "against": against, "seeds": seeds_run, "devices": devices,
            "arms": {arm: {"config": a.config, "overrides": list(a.overrides)} for arm, a in claim.arms.items()},
            "accuracy_after": {arm: [accuracy(runs[arm]) for runs in runs_by_seed] for arm in claim.arms},
            "tests": tests, "verdict": overall, "curves": curves}


def planned_runs(names: list[str], seeds: list[int], study: str, steps: int) -> list[RunSpec]:
    """Every run the claims need, each once (arms shared between claims, and the base model's
    evaluation, are run once), seed by seed: a study cut short has whole seeds of every claim."""
    specs = [base_model_spec(study)]
    specs += [arm.spec(study, seed, steps) for seed in seeds for name in names for arm in CLAIMS[name].arms.values()]
    return list({(spec.study, spec.name): spec for spec in specs}.values())


def mean_curve(curves: list[list[float | None] | None]) -> list[float]:
    present = [c for c in curves if c]
    if not present:
        return []
    length = min(len(c) for c in present)
    return [statistics.fmean(values) if (values := [c[t] for c in present if c[t] is not None]) else math.nan
            for t in range(length)]


def opo_variance(seeds: list[int], summary_only: bool, study: str, problems: int = 8,
                 groups: int = 16) -> dict[str, Any]:
    """Claim 7, measured without training (see the module docstring). Each seed's measurement is a
    record of its own (`opo_variance/seedN.json` in the study), so that an interrupted study resumes
    and several processes can share the seeds; the verdict is written once every seed has one."""
    from benchmarks.opo_variance import measure

    summary = RESULTS / study / "opo_variance.json"
    if summary.exists():
        stored = json.loads(summary.read_text())
        if (stored.get("seeds"), stored.get("problems"), stored.get("groups")) == (seeds, problems, groups):
            return stored
    folder = RESULTS / study / "opo_variance"
    per_seed = []
    for seed in seeds:
        path = folder / f"seed{seed}.json"
        stored = json.loads(path.read_text()) if path.exists() else None
        if stored and (stored["problems"], stored["groups"]) == (problems, groups):
            per_seed.append(stored["measurement"])
        elif not summary_only:
            # Taken as the measurement starts: an edit to the tree meanwhile must not be credited to it.
            identity = {"commit": code_version(), "source": source_digest()}
            per_seed.append(measure(seed, problems=problems, groups=groups))
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**identity, "seed": seed, "problems": problems, "groups": groups,
                                        "measurement": per_seed[-1]}, indent=1) + "\n")
    if len(per_seed) < len(seeds):
        return {"verdict": "not run", "seeds_recorded": len(per_seed)}
    result = {"commit": code_version(), "paper": "Hao et al. 2025, OPO", "claim": "the length-weighted baseline lowers the policy gradient's "
              "variance", "seeds": seeds, "problems": problems, "groups": groups, "per_seed": per_seed,
              "tests": {"log variance ratio, OPO over group mean": verdict(
                  [s["log_variance_ratio_mean"] for s in per_seed], "<0")}}
    result["verdict"] = result["tests"]["log variance ratio, OPO over group mean"]["verdict"]
    summary.write_text(json.dumps(result, indent=1) + "\n")
    return result


def plot(report: dict[str, Any], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    claims = {name: c for name, c in report["claims"].items() if c.get("curves")}
    if not claims:  # e.g. --only opo, which trains nothing
        return False
    figure, axes = plt.subplots(len(claims), 3, figsize=(15, 3.6 * len(claims)), squeeze=False)
    for row, (name, claim) in zip(axes, claims.items()):
        keys = list(next(iter(claim["curves"].values())))
        for axis, key in zip(row[:2], keys[:2]):
            for arm, curves in claim["curves"].items():
                if curves.get(key):
                    axis.plot(range(1, len(curves[key]) + 1), curves[key], label=arm)
            axis.set(title=f"{name}: {key} (mean over seeds)", xlabel="step")
            axis.legend(fontsize=7)
        tests = [(label, t) for label, t in claim["tests"].items() if t]
        for y, (label, test) in enumerate(tests):
            row[2].plot(test["values"], [y] * len(test["values"]), "o", alpha=0.5)
            row[2].plot([test["ci_low"], test["ci_high"]], [y, y], "-", linewidth=3)
            row[2].axvline(float(test["predicted"][1:]), color="grey", linestyle="--", linewidth=0.8)
        row[2].set_yticks(range(len(tests)), [f"{label[:40]}\n{t['verdict']}" for label, t in tests], fontsize=7)
        row[2].set(title=f"{name}: per-seed differences, 95% interval")
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    return True


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated run seeds (default 0,1,2)")
    parser.add_argument("--only", default="", help=f"comma-separated claims of {', '.join([*CLAIMS, 'opo'])}")
    parser.add_argument("--summary-only", action="store_true", help="summarise the recorded runs, run nothing")
    parser.add_argument("--study", default=STUDY, help="claims/NAME: run every arm in a study of its own "
                        "(default: claims, reusing benchmarks/recipes.py's runs)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--against", choices=("zero", "paper"), default="zero",
                        help="test each difference against its stated threshold (zero) or against the paper's "
                        "effect carried over (paper; only the claims of PAPER_EFFECTS)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"training steps per run (default {STEPS})")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    every = [*PAPER_EFFECTS] if args.against == "paper" else [*CLAIMS, "opo"]
    wanted = args.only.split(",") if args.only else every
    if unknown := set(wanted) - {*CLAIMS, "opo"}:
        parser.error(f"unknown claims {sorted(unknown)}")
    if untestable := set(wanted) - set(every):
        parser.error(f"--against paper: no paper effect is stated for {sorted(untestable)} (PAPER_EFFECTS)")
    if args.study != STUDY and not args.study.startswith(f"{STUDY}/"):
        parser.error(f"--study must be {STUDY} or {STUDY}/NAME, not {args.study!r}")
    if args.study == STUDY and args.steps != STEPS:
        parser.error(f"--steps other than {STEPS} needs --study {STUDY}/NAME (the default study reuses, and would "
                     "overwrite, benchmarks/recipes.py's runs)")
    trained = [name for name in wanted if name != "opo"]
    if not args.summary_only:
        run_all(planned_runs(trained, seeds, args.study, args.steps), jobs=args.jobs)
    report: dict[str, Any] = {"what": "paper claims reproduced in miniature: paired differences over seeds, 95% "
                              "t-interval, verdict reproduced / contradicted / inconclusive",
                              "study": args.study, "against": args.against, "commit": code_version(), "steps": args.steps, "eval": EVAL, "machine": machine(),
                              "summarised_on": run_device(), "claims": {}}  # each claim names the devices its runs trained on
    report_path = RESULTS / f"{args.study.replace('/', '_')}.json"
    if args.only and report_path.exists():  # the claims --only leaves out keep their last reading
        previous = json.loads(report_path.read_text())
        report["claims"] = {claim: value for claim, value in previous.get("claims", {}).items() if claim not in wanted}
    for name in wanted:
        if name == "opo":
            report["claims"]["opo"] = opo_variance(seeds, args.summary_only, args.study)
        else:
            report["claims"][name] = run_claim(name, seeds, args.study, args.steps, args.against)
    report["verdicts"] = {claim: value.get("verdict") for claim, value in report["claims"].items()}
    write_report(report_path.stem, report)
    plot(report, report_path.with_suffix(".png"))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
