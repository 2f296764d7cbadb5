"""How many seeds each claim of benchmarks/claims.py needs to be decided, from the runs already made.

A claim is reproduced when the 95% Student-t interval of its paired differences over n seeds lies
wholly on the predicted side of its threshold: a one-sided t-test at level 0.025. With a true mean
difference at distance d from the threshold (on the predicted side) and a standard deviation sd of
the paired difference, the chance of that verdict is the noncentral t tail

    P(T'(n - 1, d * sqrt(n) / sd) > t(0.975, n - 1))

and the seeds needed are the smallest n for which it reaches 80%. That n is given for two effects:
the paper's, translated into the miniature's units (each translation stated with its source), and
the one the miniature observed (when that lies on the other side, n is the seeds that would
contradict the claim at that size). The sd is the sample SD of the recorded paired differences, so
it is itself uncertain with 3 to 5 seeds: n is also given at the SD's upper 80% confidence bound.

The CPU and H200 studies are pooled only where the test is the same (the same arms); `cov` ran one
test on the H200 (the recipes before they took dynamic sampling, against PPO-clip without it) and
another on the CPU (against the recipe with PPO-clip's objective), so each keeps its own SD.

The cost of n seeds comes from the records' wall times: a CPU run as recorded on this machine (an
arm never run here: its H200 time times the ratio of the two machines on the arm run alike on both),
a GPU run as the H200 study ran them (14 at a time: 56 runs in 513 s).

The t, noncentral t and chi-square distributions are scipy's (scipy.stats).

Reads benchmarks/results/claims.json, claims_h200.json and the run records; writes
benchmarks/results/claims_power.json. Runs nothing.

    python -m benchmarks.claims_power
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scipy import stats

RESULTS = Path(__file__).parent / "results"
ALPHA = 0.025  # one-sided: the verdict's two-sided 95% interval lying wholly on one side
POWER = 0.8
SD_CONFIDENCE = 0.8  # the upper confidence bound of the SD a plan can rely on
NEGLIGIBLE_ACCURACY = 0.05  # benchmarks/claims.py NONINFERIORITY_MARGIN: an accuracy gap the claims call negligible
H200_STUDY = ("claims/h200", 56, 513.0)  # docs/claims.md: 56 runs in 513 s, 14 at a time
OPO_CPU_S_PER_SEED = 23 * 60 / 3  # docs/claims.md: claim 7's three seeds took 23 minutes on this CPU
SAME_WORKLOAD_TOKENS = 0.2  # an arm's two machines ran the same workload if their token counts agree this well

def power(distance: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """The chance that n seeds' one-sided t-test (the claims' verdict) lands on the predicted side when
    the true mean lies `distance` beyond the threshold on that side (negative: on the other side)."""
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, n - 1), n - 1, distance / sd * math.sqrt(n)))


def seeds_needed(distance: float, sd: float, target: float = POWER, alpha: float = ALPHA,
                 n_max: int = 1_000_000) -> int | None:
    """The fewest seeds (at least 2) whose test reaches `target` power; None when the true mean is not
    beyond the threshold on the tested side (no number of seeds then has that power)."""
    if distance <= 0:
        return None
    if sd == 0:
        return 2
    if power(distance, sd, 2, alpha) >= target:
        return 2
    low, high = 2, max(3, seeds_needed_normal(distance, sd, target, alpha))
    while power(distance, sd, high, alpha) < target:
        low, high = high, min(2 * high, n_max)
        if low == n_max:
            raise ValueError(f"more than {n_max} seeds for distance {distance} and sd {sd}: pass a larger n_max")
    while high - low > 1:  # power rises with n: the smallest n reaching the target lies in (low, high]
        middle = (low + high) // 2
        low, high = (middle, high) if power(distance, sd, middle, alpha) < target else (low, middle)
    return high


def seeds_needed_normal(distance: float, sd: float, target: float = POWER, alpha: float = ALPHA) -> int:
    """The large-n approximation ((z(1 - alpha) + z(power)) * sd / distance)^2, rounded up: the t-based
    count approaches it from above as n grows."""
    normal = statistics.NormalDist()
    return math.ceil(((normal.inv_cdf(1 - alpha) + normal.inv_cdf(target)) * sd / distance) ** 2)


def sd_upper_bound(sd: float, n: int, confidence: float = SD_CONFIDENCE) -> float:
    """The one-sided upper confidence bound of a normal SD estimated from n values."""
    return sd * math.sqrt((n - 1) / float(stats.chi2.ppf(1 - confidence, n - 1)))


def pooled_sd(groups: list[list[float]]) -> float:
    """The SD of one test's values in several groups (studies), each about its own mean (variances
    weighted by their degrees of freedom); of one group, its sample SD."""
    return math.sqrt(sum((len(g) - 1) * statistics.variance(g) for g in groups) / sum(len(g) - 1 for g in groups))


def distance_from_threshold(mean: float, side: str) -> float:
    """How far `mean` lies beyond a claim's threshold on its predicted side (">0", "<0", ">-0.05")."""
    threshold = float(side[1:])
    return mean - threshold if side[0] == ">" else threshold - mean


# --- The paper's effect, in the miniature's units ---------------------------------------------------------

@dataclass(frozen=True)
class Effect:
    """A true mean difference (signed, in the test's units) a claim's seeds should be able to find."""

    source: str  # where in the paper, and what it reports
    translation: str  # how that becomes a difference in this test's units
    mean: float


@dataclass(frozen=True)
class Study:
    """One self-contained run of the claims (a report of benchmarks/claims.py)."""

    name: str  # the report's study: "claims" (this CPU) or "claims/h200"
    report: dict[str, Any]

    def claim(self, name: str) -> dict[str, Any]:
        return self.report["claims"][name]

    def curve(self, claim: str, arm: str, key: str) -> list[float]:
        return [v for v in self.claim(claim)["curves"][arm][key] if v is not None]

    def accuracy(self, claim: str, arm: str) -> float:
        return statistics.fmean(self.claim(claim)["accuracy_after"][arm])


def half_the_entropy_decline(study: Study, claim: str, baseline: str, source: str) -> Effect:
    curve = study.curve(claim, baseline, "entropy/mean")
    start, end = curve[0], statistics.fmean(curve[-10:])
    return Effect(source, f"no entropy number to carry over: the baseline arm here falls from {start:.3f} nats (first "
                  f"step) to {end:.3f} (last 10 steps, {end / start:.0%} of its start; means over seeds), where a "
                  "10x ratio would mean no decline at all; the effect used is half that decline, the conservative "
                  "reading", (start - end) / 2)


CLIP_HIGHER_SOURCE = ("Yu et al. 2025 (DAPO) §3.1, Fig. 2: without clip-higher the entropy collapses, with it it does "
                      "not (a figure, no number); Cui et al. 2025 §4.3 puts a like fix (KL-Cov) at 'more than 10x' the "
                      "baseline's plateau entropy")
COV_ENTROPY_SOURCE = ("Cui et al. 2025 (Clip-Cov / KL-Cov) §4.3, Fig. 11: at the baseline's entropy plateau KL-Cov "
                      "keeps entropy more than 10x higher (Clip-Cov also higher; figures)")
COV_ACCURACY = {"clip_cov": 40.4, "kl_cov": 40.6}  # Cui et al. 2025 Table 2, Qwen2.5-7B, mean of 7 benchmarks
COV_GRPO_ACCURACY = 38.6


def cov_effect(study: Study, label: str) -> Effect:
    method = label.split(":")[0]
    if "entropy" in label:
        return half_the_entropy_decline(study, "cov", "ppo_clip", COV_ENTROPY_SOURCE)
    gain = COV_ACCURACY[method] / COV_GRPO_ACCURACY - 1
    baseline = study.accuracy("cov", "ppo_clip")
    return Effect(f"Cui et al. 2025 Table 2 (mean of 7 benchmarks): Qwen2.5-7B GRPO {COV_GRPO_ACCURACY}, {method} "
                  f"{COV_ACCURACY[method]} ({gain:+.1%}); Qwen2.5-32B 45.8 against 50.3 / 52.2",
                  f"the 7B relative gain (the smaller model's, and the smaller gain) on PPO-clip's accuracy here "
                  f"({baseline:.1%}): {gain * baseline * 100:+.1f} points, {gain * baseline * 100 + 5:.1f} above the "
                  "-5-point margin", gain * baseline)


def dr_grpo_effect(study: Study, label: str) -> Effect:
    start = statistics.fmean(study.curve("dr_grpo", "constant_normaliser", "rollout/len_wrong_mean")[:5])
    return Effect("Liu et al. 2025 §3.2, Fig. 5 (plots 2 and 4): with GRPO's normaliser responses 'continually' grow "
                  "and incorrect ones end longer; Dr. GRPO 'prevents the response length from growing wildly' "
                  "(figures, no number in the text)",
                  f"no number to carry over: the smallest effect that would matter here, a growth difference of a "
                  f"quarter of the constant arm's starting wrong-answer length ({start:.1f} tokens, first 5 steps)",
                  start / 4)


def clip_higher_effect(study: Study, label: str) -> Effect:
    return half_the_entropy_decline(study, "dapo_clip_higher", "symmetric", CLIP_HIGHER_SOURCE)


def negligible_accuracy(source: str) -> Callable[[Study, str], Effect]:
    def effect(study: Study, label: str) -> Effect:
        return Effect(source, "no per-unit number to carry over: the smallest effect that would matter here, the "
                      f"{NEGLIGIBLE_ACCURACY * 100:.0f}-point accuracy gap the claims' non-inferiority margin calls "
                      "negligible", NEGLIGIBLE_ACCURACY)
    return effect


TTRL_GAIN = 15.8 / 7.7 - 1  # Zuo et al. 2025 Table 1: the smallest AIME 2024 gain of the models starting near 10%


def ttrl_effect(study: Study, label: str) -> Effect:
    before = study.accuracy("ttrl", "majority_vote") - statistics.fmean(study.claim("ttrl")["tests"][label]["values"])
    return Effect("Zuo et al. 2025 Table 1: on AIME 2024 the five models starting at 4.6-12.9% gain +105% "
                  "(Qwen2.5-Math-1.5B 7.7 -> 15.8) to +212% (Qwen2.5-Math-7B 12.9 -> 40.2); Qwen3-8B, from 26.9%, +74%",
                  f"the smallest of those relative gains ({TTRL_GAIN:+.0%}) on the base model's accuracy here "
                  f"({before:.1%}, within that range of starts): {TTRL_GAIN * before * 100:+.1f} points",
                  TTRL_GAIN * before)


PRIME_GAIN = 41.0 / 36.9 - 1  # Cui et al. 2025 (PRIME) Table 1, 240 steps, mean of 7 benchmarks


def prime_effect(study: Study, label: str) -> Effect:
    baseline = study.accuracy("prime", "outcome_only")
    return Effect("Cui et al. 2025 (PRIME) Table 1: at 240 steps PRIME 41.0 against RLOO with the outcome verifier "
                  "36.9 (mean of 7 benchmarks); §4.3: 6.9% higher final training reward, 2.5x sample efficiency",
                  f"the relative gain ({PRIME_GAIN:+.1%}) on the outcome-only arm's accuracy here ({baseline:.1%}): "
                  f"{PRIME_GAIN * baseline * 100:+.1f} points", PRIME_GAIN * baseline)


def opo_effect(study: Study, label: str) -> Effect:
    return Effect("Hao et al. 2025: the length-weighted baseline is derived as the variance-minimising one; the "
                  "results reported are accuracy, entropy and policy shift, no gradient-variance number to carry over",
                  "the smallest effect that would matter here: 10% lower variance (log ratio ln 0.9), what 11% more "
                  "samples per group would buy", math.log(0.9))


EFFECTS: dict[str, Callable[[Study, str], Effect]] = {
    "dr_grpo": dr_grpo_effect,
    "dapo_clip_higher": clip_higher_effect,
    "dapo_dynamic_sampling": negligible_accuracy(
        "Yu et al. 2025 (DAPO) Table 1: +8 points on AIME 2024 at equal steps (42 -> 50); per generated token only "
        "'the overall training time is not significantly affected' (§4.2, Fig. 6)"),
    "cov": cov_effect,
    "ttrl": ttrl_effect,
    "gspo": negligible_accuracy(
        "Zheng et al. 2025 (GSPO) §5.1, Fig. 1: 'better training accuracy and benchmark performance under the same "
        "training compute' than GRPO (figures, no number)"),
    "prime": prime_effect,
    "opo": opo_effect,
}


# --- Per test: SD, the effects and the seeds they need -----------------------------------------------------

def joint_seeds_needed(distances_sds: list[tuple[float, float]], target: float = POWER) -> int | None:
    """The fewest seeds for which every test lands on its predicted side with chance `target`, the tests
    taken as independent (a claim reproduced only when all its tests are)."""
    if any(distance <= 0 for distance, _ in distances_sds):
        return None
    n = max(seeds_needed(distance, sd, target) for distance, sd in distances_sds)
    while math.prod(power(distance, sd, n) for distance, sd in distances_sds) < target:
        n += 1
    return n


def seeds_for_test(claim: str, label: str, test: dict[str, Any], study: Study, groups: list[list[float]],
               pooled_from: list[str]) -> dict[str, Any]:
    """One test's SD (pooled when the test ran alike in several studies, `groups` holding each one's
    per-seed values) and the seeds its verdict needs for the paper's effect and for the one observed."""
    values = [v for group in groups for v in group]
    side, mean, sd = test["predicted"], statistics.fmean(values), pooled_sd(groups)
    upper = sd_upper_bound(sd, len(values) - len(groups) + 1)  # the pooled SD's degrees of freedom, plus one
    effect = EFFECTS[claim](study, label)
    paper_distance = distance_from_threshold(effect.mean, side)
    observed_distance = distance_from_threshold(mean, side)
    return {"claim": claim, "test": label, "study": study.name, "studies_pooled": pooled_from,
            # A claim without its runs' devices (opo's, read from its own records) falls back to where its study was summarised.
            "devices": study.claim(claim).get("devices") or [study.report["summarised_on"]],
            "seeds": study.claim(claim)["seeds"], "values": values,
            "predicted": side, "mean": mean, "sd": sd, f"sd_upper_{SD_CONFIDENCE:.0%}": upper,
            "paper_effect": {**asdict(effect), "distance_from_threshold": paper_distance,
                             "inside_the_interval": test["ci_low"] <= effect.mean <= test["ci_high"]},
            "observed_effect": {"mean": mean, "distance_from_threshold": observed_distance,
                                "seeds_would": "reproduce" if observed_distance > 0 else "contradict"},
            "seeds_needed": {"paper_effect": seeds_needed(paper_distance, sd),
                             f"paper_effect_sd_upper_{SD_CONFIDENCE:.0%}": seeds_needed(paper_distance, upper),
                             "observed_effect": seeds_needed(abs(observed_distance), sd),
                             "paper_effect_normal_approximation": seeds_needed_normal(paper_distance, sd)
                             if paper_distance > 0 else None}}


def all_tests(studies: list[Study]) -> list[dict[str, Any]]:
    """Every test of every study; a test run alike in several studies (same label, same arms) pooled."""
    same: dict[tuple[str, str, str], list[tuple[Study, list[float]]]] = {}
    for study in studies:
        for claim, record in study.report["claims"].items():
            for label, test in record["tests"].items():
                key = (claim, label, json.dumps(record.get("arms"), sort_keys=True))
                same.setdefault(key, []).append((study, test["values"]))
    results = []
    for (claim, label, _), runs in same.items():
        study = runs[-1][0]
        results.append(seeds_for_test(claim, label, study.claim(claim)["tests"][label], study,
                                      [values for _, values in runs], [s.name for s, _ in runs]))
    return results


# --- What n seeds cost ------------------------------------------------------------------------------------

def median_record(paths: list[Path]) -> tuple[float, float] | None:
    """The median wall time and generated tokens of the records that exist among `paths`."""
    records = [json.loads(p.read_text()) for p in paths if p.exists()]
    if not records:
        return None
    tokens = [sum(v or 0 for v in r["curves"].get("rollout/generated_tokens", [])) for r in records]
    return statistics.median(r["wall_s"] for r in records), statistics.median(tokens)


def run_costs(seeds: range = range(10)) -> dict[str, Any]:
    """Seconds per seed of each claim: on this CPU (one run at a time, as recorded) and on the H200 as its
    study ran (the study's elapsed time shared among its runs in proportion to their wall times)."""
    from benchmarks.claims import CLAIMS, NONINFERIORITY_MARGIN, STEPS, STUDY
    from benchmarks.runs import record_path

    assert NONINFERIORITY_MARGIN == NEGLIGIBLE_ACCURACY, "keep NEGLIGIBLE_ACCURACY at the claims' margin"
    h200_name, h200_runs, h200_elapsed = H200_STUDY
    arms = {arm.key: arm for claim in CLAIMS.values() for arm in claim.arms.values()}
    measured = {}
    for key, arm in arms.items():
        measured[key] = {study: median_record([record_path(spec.study, spec.name) for spec in
                                               (arm.spec(study, seed, STEPS) for seed in seeds)])
                         for study in (STUDY, h200_name)}
    alike = [cpu[0] / gpu[0] for cpu, gpu in ((m[STUDY], m[h200_name]) for m in measured.values())
             if cpu and gpu and abs(cpu[1] / gpu[1] - 1) <= SAME_WORKLOAD_TOKENS]
    cpu_per_h200 = statistics.median(alike)
    h200_walls = [json.loads(p.read_text())["wall_s"] for p in sorted((RESULTS / h200_name).glob("*.json"))]
    assert len(h200_walls) == h200_runs, f"{h200_name} holds {len(h200_walls)} records, the study ran {h200_runs}"
    share = h200_elapsed / sum(h200_walls)

    def arm_seconds(key: str) -> tuple[float, float]:
        cpu, gpu = measured[key][STUDY], measured[key][h200_name]
        cpu_s = cpu[0] if cpu else gpu[0] * cpu_per_h200
        gpu_s = gpu[0] if gpu else cpu[0] / cpu_per_h200
        return cpu_s, gpu_s * share

    claims = {}
    for name, claim in CLAIMS.items():
        seconds = [arm_seconds(arm.key) for arm in claim.arms.values()]
        claims[name] = {"runs_per_seed": len(seconds), "cpu_s_per_seed": sum(s[0] for s in seconds),
                        "gpu_s_per_seed": sum(s[1] for s in seconds),
                        "arms": {arm.key: {"cpu_s": s[0], "gpu_s": s[1],
                                           "cpu_measured": measured[arm.key][STUDY] is not None,
                                           "gpu_measured": measured[arm.key][h200_name] is not None}
                                 for arm, s in zip(claim.arms.values(), seconds)}}
    claims["opo"] = {"runs_per_seed": 0, "cpu_s_per_seed": OPO_CPU_S_PER_SEED, "gpu_s_per_seed": None, "arms": {}}
    return {"cpu_s_per_h200_s": cpu_per_h200, "h200_share_of_wall": share, "claims": claims}


# --- Per claim: the seeds and time a verdict takes ---------------------------------------------------------

def claim_plan(tests: list[dict[str, Any]], cost: dict[str, Any]) -> dict[str, Any]:
    """A claim's seeds for the paper's effect (every test at once) and what they cost, from its tests in
    their current form."""
    upper_key = f"sd_upper_{SD_CONFIDENCE:.0%}"
    paper = joint_seeds_needed([(t["paper_effect"]["distance_from_threshold"], t["sd"]) for t in tests])
    paper_upper = joint_seeds_needed([(t["paper_effect"]["distance_from_threshold"], t[upper_key]) for t in tests])
    observed = [t["seeds_needed"]["observed_effect"] for t in tests]

    def minutes(n: int | None, per_seed: float | None) -> float | None:
        return None if n is None or per_seed is None else n * per_seed / 60

    return {"study": tests[0]["study"], "tests": [t["test"] for t in tests],
            "seeds_paper_effect": paper, f"seeds_paper_effect_sd_upper_{SD_CONFIDENCE:.0%}": paper_upper,
            "seeds_observed_effect_largest": max(observed) if None not in observed else None,
            "runs_per_seed": cost["runs_per_seed"],
            "cpu_minutes_per_seed": cost["cpu_s_per_seed"] / 60,
            "gpu_minutes_per_seed": minutes(1, cost["gpu_s_per_seed"]),
            "cpu_minutes_paper_effect": minutes(paper, cost["cpu_s_per_seed"]),
            "gpu_minutes_paper_effect": minutes(paper, cost["gpu_s_per_seed"])}


def main() -> dict[str, Any]:
    from benchmarks.common import code_version, write_report

    # The H200 study first: a claim the default study ran again (cov, with matched sampling) is planned
    # from its current form, the last study that holds it.
    studies = [Study(name, json.loads((RESULTS / f"{file}.json").read_text()))
               for name, file in (("claims/h200", "claims_h200"), ("claims", "claims"))]
    tests = all_tests(studies)
    costs = run_costs()
    current = {t["claim"]: t["study"] for t in tests}
    claims = {claim: claim_plan([t for t in tests if t["claim"] == claim and t["study"] == study],
                                costs["claims"][claim]) for claim, study in current.items()}
    report = {"what": "seeds each claim of benchmarks/claims.py needs: a one-sided t-test at level "
              f"{ALPHA} (the 95% interval wholly on the predicted side) with {POWER:.0%} power, for the paper's "
              "effect in the miniature's units and for the effect observed; what those seeds cost on this CPU "
              "and on the H200", "commit": code_version(), "alpha": ALPHA, "power": POWER,
              "sd_confidence": SD_CONFIDENCE, "inputs": ["claims_h200.json", "claims.json", "run records"],
              "costs": costs, "claims": claims, "tests": tests}
    write_report("claims_power", report)
    return report


if __name__ == "__main__":
    main()
