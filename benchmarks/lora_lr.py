"""The learning rate of the `lora` recipe, chosen by a small study (docs/benchmarks.md, "LoRA's
learning rate"): LoRA adapters of rank 16 on the default job's settings, a few learning rates from
the full fine-tuning default up, 3 seeds each, the same short budget for all.

Each run is the default job with `train.lora_rank=16`, the candidate's `train.lr` and `STEPS`
steps, evaluated after training on `EVAL_PROBLEMS` held-out problems, `EVAL_SAMPLES` samples each
at the training temperature (no greedy evaluation); one thread, one run at a time. The evaluation
before training is the same for every learning rate of a seed (the adapters start at zero, so the
policy is the base model, and the evaluation's seed derives from run.seed alone): the run of the
first learning rate makes it, for all. Records resume across invocations (benchmarks/runs.py). The
summary per learning rate: the median, mean and 95% interval over seeds of the held-out sampled
accuracy's change (points, after minus before), each seed's, the alarms any seed fired, and the
median training wall time; then the rule's choice.

    OMP_NUM_THREADS=1 python -m benchmarks.lora_lr [--seeds 0,1,2] [--only 2e-5,3e-4] [--within-s 2100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from benchmarks.common import machine, t_interval, write_report
from benchmarks.runs import AS_MEASURED, RunSpec, run_all

STUDY = "lora_lr"
ACCURACY = "eval/sampled_accuracy"
RANK = 16
# 2e-5 is full fine-tuning's default; LoRA usually wants about ten times the full fine-tuning rate.
LEARNING_RATES = ("2e-5", "1e-4", "3e-4", "1e-3")
SEEDS = (0, 1, 2)
STEPS = 6
EVAL_PROBLEMS = 100
EVAL_SAMPLES = 2
SETTINGS = (*AS_MEASURED, f"train.lora_rank={RANK}", f"train.steps={STEPS}", f"eval.problems={EVAL_PROBLEMS}",
            f"eval.samples={EVAL_SAMPLES}", "eval.greedy=false", "run.threads=1")


def specs(rates: tuple[str, ...], seeds: tuple[int, ...]) -> list[RunSpec]:
    """Seed-major: every learning rate on the first seed, then on the next, so a partial study compares
    them; the first learning rate of a seed runs first and evaluates before training for the others."""
    return [RunSpec(STUDY, f"lr{rate}_seed{seed}", None,
                    (*SETTINGS, f"train.lr={rate}", f"run.seed={seed}", f"eval.before={str(rate == rates[0]).lower()}"))
            for seed in seeds for rate in rates]


def accuracy_before(record: dict[str, Any]) -> float:
    """The held-out sampled accuracy before training, in points, from a run that evaluated it."""
    first = record["evals"][0]
    if first["step"] != 0:
        raise ValueError(f"{record['args']}: the run made no evaluation before training")
    return round(100 * first[ACCURACY], 6)  # points, without the float noise of the product


def summarize(records: list[dict[str, Any]], before: dict[int, float]) -> dict[str, Any]:
    """A learning rate's runs as one row (module docstring); `before`: each seed's accuracy before training."""
    seeds = [seed_of(r) for r in records]
    gains = [round(100 * r["eval_last"][ACCURACY] - before[seed], 6) for seed, r in zip(seeds, records)]
    mean, low, high = t_interval(gains)
    return {"seeds": len(records), "gain_median": statistics.median(gains), "gain_mean": mean, "ci95": [low, high],
            "per_seed": dict(zip(seeds, gains)), "after": [100 * r["eval_last"][ACCURACY] for r in records],
            "alarms": sorted({a for r in records for a in r.get("alarms", [])}),
            "train_wall_s_median": statistics.median(sum(r["curves"]["perf/step_s"]) for r in records),
            "commits": sorted({r["commit"] for r in records}), "devices": sorted({r["device"] for r in records})}


def seed_of(record: dict[str, Any]) -> int:
    return int(next(arg for arg in record["args"] if arg.startswith("run.seed=")).removeprefix("run.seed="))


def choose(table: dict[str, dict[str, Any]], seeds: int) -> dict[str, Any]:
    """The rule stated before the runs: among the learning rates with all `seeds` run, no alarm and a
    95% interval of the gain above 0, the highest median gain (a tie: the lower rate); none such: no
    clear winner, and the highest median gain among those without an alarm is named instead."""
    complete = {rate: row for rate, row in table.items() if row["seeds"] == seeds}
    quiet = {rate: row for rate, row in complete.items() if not row["alarms"]}
    clear = {rate: row for rate, row in quiet.items() if row["ci95"][0] > 0}
    pool = clear or quiet
    if not pool:
        return {"chosen": None, "clear": False, "why": "every complete learning rate fired an alarm"}
    chosen = max(pool, key=lambda rate: (pool[rate]["gain_median"], -float(rate)))
    return {"chosen": chosen, "clear": bool(clear),
            "why": "highest median gain whose interval is above 0, without alarms" if clear else
                   "no learning rate's interval is above 0: highest median gain without alarms"}


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="", help="comma-separated (default: 0,1,2)")
    parser.add_argument("--only", default="", help="comma-separated learning rates (default: all)")
    parser.add_argument("--within-s", type=float, default=None,
                        help="start no run after this many seconds (the records kept resume the study)")
    args = parser.parse_args(argv)
    rates = tuple(args.only.split(",")) if args.only else LEARNING_RATES
    if unknown := set(rates) - set(LEARNING_RATES):
        parser.error(f"unknown learning rates {sorted(unknown)}; the study's: {', '.join(LEARNING_RATES)}")
    if rates[0] != LEARNING_RATES[0]:
        parser.error(f"--only must start with {LEARNING_RATES[0]}, whose runs evaluate before training for the others")
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    runs = specs(rates, seeds)
    unstarted = run_all(runs, jobs=1, start_within_s=args.within_s)
    done = [spec.run() for spec in runs if spec not in unstarted]
    before = {seed_of(r): accuracy_before(r) for r in done if "eval.before=true" in r["args"]}
    records = {rate: [r for r in done if f"train.lr={rate}" in r["args"] and seed_of(r) in before] for rate in rates}
    table = {rate: summarize(rs, before) for rate, rs in records.items() if rs}
    report = {"study": STUDY, "rank": RANK, "steps": STEPS, "seeds": list(seeds), "settings": list(SETTINGS),
              "machine": machine(), "before": before, "table": table, "choice": choose(table, len(seeds)),
              "unstarted": [spec.name for spec in unstarted]}
    write_report(f"{STUDY}/summary", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
