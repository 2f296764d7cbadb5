"""The default job's wall time against the jobs it replaced, each run as `make train` ran it then: the
job when the default was last questioned (`filed`: train.lr 2e-5, no overlong filtering, glibc's
malloc), the default before the overlong filtering (`previous`: lr 5e-6, no filtering, glibc), and
today's (`make_train`: the defaults on the allocator `make train` preloads, `reasonrl.allocator`).

One run at a time on the idle machine with all its cores (as `make train`), seed-major so a partial
study compares the arms on the same seeds. The measure is the seconds of the 40 steps (the sum of
`perf/step_s`; the evaluations before and after are the same work in every arm) and, beside it, the
process's wall time. Per pair of arms: the ratio per seed and the geometric mean with its 95%
Student-t interval over seeds (on the logs). The held-out accuracy and completion length are given
too, since a job can be quick by collapsing. Records resume (`benchmarks/results/default/wall_time/`);
summary `default_wall_time.json`, plot beside it.

    python -m benchmarks.default_wall_time [--seeds 100,101,102] [--start-within MINUTES]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from typing import Any

from benchmarks.common import machine, pyplot, t_interval, write_report
from benchmarks.runs import RESULTS, RunSpec, read_record, record_path, run_all

STUDY = "default/wall_time"
# arm: (overrides of today's defaults, the allocator make train preloaded)
ARMS: dict[str, tuple[tuple[str, ...], str]] = {
    "filed": (("train.lr=2e-5", "sampling.mask_truncated=false"), "glibc"),
    "previous": (("sampling.mask_truncated=false",), "glibc"),
    "make_train": ((), "auto"),
}
COMPARED = (("make_train", "previous"), ("make_train", "filed"), ("previous", "filed"))
SEEDS = (100, 101, 102)  # the default study's tuning seeds


def specs(seeds: tuple[int, ...]) -> list[RunSpec]:
    return [RunSpec(STUDY, f"{arm}_seed{seed}", None, (*overrides, f"run.seed={seed}"), allocator=allocator)
            for seed in seeds for arm, (overrides, allocator) in ARMS.items()]


def step_seconds(record: dict[str, Any]) -> float:
    return sum(record["curves"]["perf/step_s"])


def ratio_row(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> dict[str, Any]:
    """first's step seconds over second's, per seed and as a geometric mean with its interval."""
    ratios = [step_seconds(a) / step_seconds(b) for a, b in zip(first, second, strict=True)]
    mean, low, high = t_interval([math.log(r) for r in ratios])
    return {"per_seed": ratios, "geometric_mean": math.exp(mean), "ci95": [math.exp(low), math.exp(high)]}


def arm_row(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"step_s": [step_seconds(r) for r in records], "wall_s": [r["wall_s"] for r in records],
            "step_s_median": statistics.median(step_seconds(r) for r in records),
            "sampled_accuracy": [100 * r["eval_last"]["eval/sampled_accuracy"] for r in records],
            "len_last5": [statistics.fmean(r["curves"]["rollout/len_mean"][-5:]) for r in records],
            "generated_tokens": [sum(r["curves"]["rollout/generated_tokens"]) for r in records],
            "alarms": sorted({a for r in records for a in r.get("alarms", [])}),
            "preloaded": sorted({str(r["allocator"]["preloaded"]) for r in records}),
            "commits": sorted({r["commit"] for r in records}), "sources": sorted({r["source"] for r in records}),
            "devices": sorted({r["device"] for r in records})}


def summarize(seeds: tuple[int, ...]) -> dict[str, Any]:
    """The arms on the seeds every arm has a record of."""
    complete = [s for s in seeds if all(record_path(STUDY, f"{arm}_seed{s}").exists() for arm in ARMS)]
    records = {arm: [read_record(STUDY, f"{arm}_seed{s}") for s in complete] for arm in ARMS}
    report = {"what": __doc__.split("\n\n")[0], "seeds": complete, "machine": machine(),
              "arms": {arm: {"overrides": list(o), "allocator": a} for arm, (o, a) in ARMS.items()}}
    if complete:
        report["table"] = {arm: arm_row(rs) for arm, rs in records.items()}
        report["ratios"] = {f"{a}/{b}": ratio_row(records[a], records[b]) for a, b in COMPARED}
    return report


def plot(report: dict[str, Any]) -> None:
    """default_wall_time.png: each arm's seconds of steps and held-out accuracy, a line per seed (black: the median)."""
    plt = pyplot()
    if plt is None or "table" not in report:
        return
    figure, (time_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(10, 4))
    table = report["table"]
    for axes, key in ((time_axes, "step_s"), (accuracy_axes, "sampled_accuracy")):
        for number, seed in enumerate(report["seeds"]):  # a seed's arms joined: the comparison is paired
            axes.plot(range(len(table)), [row[key][number] for row in table.values()], marker="o", alpha=0.7,
                      label=f"seed {seed}")
        for index, row in enumerate(table.values()):
            axes.hlines(statistics.median(row[key]), index - 0.3, index + 0.3, color="black")
    time_axes.legend(fontsize=8)
    for axes, label in ((time_axes, "seconds of the 40 steps"), (accuracy_axes, "held-out sampled accuracy (%)")):
        axes.set_xticks(range(len(report["table"])), list(report["table"]))
        axes.set_ylabel(label)
    figure.suptitle(f"default job's wall time, seeds {report['seeds']}: one line per seed, black the median")
    figure.tight_layout()
    figure.savefig(RESULTS / "default_wall_time.png", dpi=110)
    plt.close(figure)


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--start-within", type=float, default=None, metavar="MINUTES",
                        help="start no run after MINUTES (those going finish); the rest wait for the next invocation")
    parser.add_argument("--summary-only", action="store_true", help="summarize the records there are")
    args = parser.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    if not args.summary_only:
        run_all(specs(seeds), start_within_s=None if args.start_within is None else 60 * args.start_within)
    report = summarize(seeds)
    write_report("default_wall_time", report)
    plot(report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
