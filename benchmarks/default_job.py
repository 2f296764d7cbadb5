"""The main job (`reasonrl train` with no arguments) over seeds: the distribution the README's headline
is, and the check that a newcomer's run lands inside it.

    python -m benchmarks.default_job run [--seeds 0,...,9] [--jobs 1] [--name default_job]
    python -m benchmarks.default_job summarize --records default/confirmation --candidate NAME [--name default_job]
    python -m benchmarks.default_job check RUN_DIR [--summary default_job]
    python -m benchmarks.default_job plot default_job,default_job_intel [--out default_job_cpus]

`run` trains the default job once per seed (records in benchmarks/results/default_job/, resumed
across invocations: benchmarks/runs.py) and writes the summary. `summarize --records` summarizes
runs made elsewhere instead, e.g. the default study's confirmation of the candidate that became the
default, after checking that each record's settings resolve to today's default config (seed aside):
runs of other settings are refused, so the summary is the default job's. The summary
(benchmarks/results/default_job.json): per seed the held-out sampled and greedy accuracy before and
after, the alarms and the training wall time; over seeds the median, the mean's 95% Student-t
interval, and the 95% prediction interval of one more run (mean +- t * sd * sqrt(1 + 1/n)), which is
where a newcomer's single run should land: the interval of the mean narrows with more seeds, a
single run's spread does not. `--name` gives another study its own records folder and summary (e.g.
the same seeds on another CPU), so that it does not overwrite the README's (default_job.json).

`check RUN_DIR` reads a finished run's config.toml and metrics.jsonl: the run must be the default
job (any seed) and its last held-out sampled accuracy inside the summary's prediction interval
(exit status 0), else the status is 1 with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import machine, t_interval, t_quantile, write_report
from benchmarks.runs import RESULTS, RunSpec, plain_name, run_all
from reasonrl.config import load_config
from reasonrl.config.loading import read_toml
from reasonrl.training.logging import read_metrics

STUDY = "default_job"
SUMMARY = RESULTS / f"{STUDY}.json"
SAMPLED, GREEDY = "eval/sampled_accuracy", "eval/greedy_accuracy"
# Settings that say where and how a run is written or shared, not what it learns.
NOT_THE_JOB = frozenset({"run.seed", "run.dir", "run.progress", "run.tensorboard", "run.log_every", "run.save_every",
                         "run.threads", "run.keep_checkpoints", "run.resume", "run.resume_override", "run.wandb"})


def prediction_interval(values: list[float]) -> tuple[float, float]:
    """The 95% interval where one more run of the same distribution lands (normal approximation)."""
    if len(values) < 2:
        return math.nan, math.nan
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile(len(values) - 1) * spread * math.sqrt(1 + 1 / len(values))
    return mean - half, mean + half


def flat_settings(config: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`section.key: value` as TOML would give it back (lists, not tuples), without what is not the job."""
    flat = {f"{section}.{key}": value for section, values in config.items() for key, value in values.items()}
    return {key: json.loads(json.dumps(value)) for key, value in flat.items() if key not in NOT_THE_JOB}


def job_settings(overrides: list[str]) -> dict[str, Any]:
    """The resolved config of `reasonrl train OVERRIDES`, flattened, without what is not the job."""
    return flat_settings(load_config(None, overrides).to_dict())


def departures_from_default(overrides: list[str]) -> dict[str, tuple[Any, Any]]:
    """{key: (default, value)} where `reasonrl train OVERRIDES` is not the default job."""
    default, given = job_settings([]), job_settings(overrides)
    return {key: (default.get(key), given.get(key)) for key in default.keys() | given.keys()
            if default.get(key) != given.get(key)}


def summarize(records: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    def before(record: dict[str, Any]) -> float | None:
        return next((100 * e[SAMPLED] for e in record["evals"] if e["step"] == 0), None)

    def accuracy(record: dict[str, Any], key: str) -> float:
        return 100 * record["eval_last"][key]

    after = [accuracy(r, SAMPLED) for r in records]
    mean, low, high = t_interval(after)
    predicted_low, predicted_high = prediction_interval(after)
    per_seed = [{"seed": seed, "sampled_before": before(r), "sampled_after": accuracy(r, SAMPLED),
                 "greedy_after": accuracy(r, GREEDY),
                 "alarms": r.get("alarms", []), "train_wall_s": sum(r["curves"]["perf/step_s"]),
                 "commit": r["commit"], "device": r["device"]} for seed, r in zip(seeds, records, strict=True)]
    return {"seeds": seeds, "sampled_accuracy_median": statistics.median(after), "sampled_accuracy_mean": mean,
            "ci95_mean": [low, high], "prediction95_one_run": [predicted_low, predicted_high],
            "lowest": min(after), "highest": max(after),
            "greedy_median": statistics.median(s["greedy_after"] for s in per_seed),
            "alarms": sorted({a for s in per_seed for a in s["alarms"]}),
            "train_wall_s_median": statistics.median(s["train_wall_s"] for s in per_seed),
            "commits": sorted({s["commit"] for s in per_seed}), "per_seed": per_seed}


def seed_of(record: dict[str, Any]) -> int:
    return next(int(arg.split("=", 1)[1]) for arg in record["args"] if arg.startswith("run.seed="))


def job_overrides(record: dict[str, Any]) -> list[str]:
    return [arg for arg in record["args"] if not arg.startswith("run.seed=")]


def records_of_study(study: str, candidate: str) -> list[dict[str, Any]]:
    """The records `<study>/<candidate>_seed<N>.json`, refused unless each is the default job."""
    paths = sorted((RESULTS / study).glob(f"{candidate}_seed*.json"),
                   key=lambda p: int(p.stem.rsplit("_seed", 1)[1]))
    if not paths:
        raise SystemExit(f"no records {RESULTS / study}/{candidate}_seed*.json")
    records = [json.loads(path.read_text()) for path in paths]
    for path, record in zip(paths, records, strict=True):
        if record.get("config") is not None or (departures := departures_from_default(job_overrides(record))):
            raise SystemExit(f"{path.name} is not today's default job: {departures or record['config']}")
    return records


def check_run(run_dir: Path, summary_path: Path | None = None) -> int:
    summary_path = summary_path or SUMMARY
    if not summary_path.exists():
        print(f"no summary {summary_path}: run `python -m benchmarks.default_job run` first", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    ran, default = flat_settings(read_toml(run_dir / "config.toml")), job_settings([])
    departures = {key: value for key, value in ran.items() if default.get(key) != value}
    if departures:
        print(f"{run_dir} is not the default job: it sets {departures}", file=sys.stderr)
        return 1
    evals = [m for m in read_metrics(run_dir) if SAMPLED in m]
    if not evals:
        print(f"{run_dir} has no held-out evaluation in metrics.jsonl (a finished run has one)", file=sys.stderr)
        return 1
    value, (low, high) = 100 * evals[-1][SAMPLED], summary["prediction95_one_run"]
    inside = low <= value <= high
    print(f"held-out sampled accuracy {value:.1f}% at step {evals[-1]['step']}: "
          f"{'inside' if inside else 'OUTSIDE'} the 95% prediction interval [{low:.1f}, {high:.1f}] of "
          f"{len(summary['seeds'])} seeds (median {summary['sampled_accuracy_median']:.1f}%)")
    return 0 if inside else 1


def plot(names: list[str], out: Path) -> Path | None:
    """Each summary's held-out sampled accuracy per seed, before (hollow) and after training, with its
    95% prediction interval of one run as a band: several studies of the same seeds side by side
    (e.g. the same job on two CPUs)."""
    from benchmarks.common import pyplot

    if (plt := pyplot()) is None:
        return None
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for offset, (name, color) in enumerate(zip(names, ("tab:blue", "tab:orange", "tab:green", "tab:red"))):
        summary = json.loads((RESULTS / f"{name}.json").read_text())
        seeds = [s["seed"] + 0.15 * offset for s in summary["per_seed"]]
        device = summary["per_seed"][0]["device"].removeprefix("cpu: ")
        axes.plot(seeds, [s["sampled_after"] for s in summary["per_seed"]], "o", color=color,
                  label=f"{name}: after ({device})")
        axes.plot(seeds, [s["sampled_before"] for s in summary["per_seed"]], "o", mfc="none", color=color,
                  label=f"{name}: before")
        low, high = summary["prediction95_one_run"]
        axes.axhspan(low, high, color=color, alpha=0.12, label=f"{name}: 95% interval of one run [{low:.1f}, {high:.1f}]")
    axes.set(xlabel="seed", ylabel="held-out sampled accuracy (%)", ylim=(0, 100),
             title="the default job (`reasonrl train`), seed by seed")
    axes.legend(fontsize=7, loc="center left", bbox_to_anchor=(0.01, 0.33))  # the empty band between before and after
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="train the default job on each seed, then summarize")
    run.add_argument("--seeds", default=",".join(map(str, range(10))))
    run.add_argument("--jobs", type=int, default=1)
    run.add_argument("--name", default=STUDY, help="the records' folder and the summary's name (default "
                     f"{STUDY}: the README's)")
    summary = commands.add_parser("summarize", help="summarize records made elsewhere (checked to be the default job)")
    summary.add_argument("--records", required=True, help="a study under benchmarks/results, e.g. default/confirmation")
    summary.add_argument("--candidate", required=True, help="the records' name before _seedN")
    summary.add_argument("--name", default=STUDY, help=f"the summary's name (default {STUDY}: the README's)")
    check = commands.add_parser("check", help="is a finished run inside the default job's prediction interval?")
    check.add_argument("run_dir", type=Path)
    check.add_argument("--summary", default=STUDY, help=f"the summary to check against (default {STUDY})")
    drawing = commands.add_parser("plot", help="draw summaries' seeds side by side")
    drawing.add_argument("summaries", help="comma-separated summary names, e.g. default_job,default_job_intel")
    drawing.add_argument("--out", default="default_job_cpus", help="the plot's name under benchmarks/results")
    args = parser.parse_args(argv)
    if args.command == "plot":
        names = args.summaries.split(",")
        if not all(map(plain_name, [*names, args.out])):
            parser.error("a summary's and a plot's name are letters, digits and _")
        print(plot(names, RESULTS / f"{args.out}.png"))
        return 0
    name = args.summary if args.command == "check" else args.name
    if not plain_name(name):
        parser.error(f"a study's name is letters, digits and _, not {name!r}")
    if args.command == "check":
        return check_run(args.run_dir, RESULTS / f"{name}.json")
    if args.command == "run":
        seeds = [int(s) for s in args.seeds.split(",")]
        specs = [RunSpec(name, f"seed{seed}", None, (f"run.seed={seed}",)) for seed in seeds]
        run_all(specs, jobs=args.jobs)
        records, source = [spec.run() for spec in specs], f"benchmarks/results/{name}/"
    else:
        records = records_of_study(args.records, args.candidate)
        seeds, source = [seed_of(r) for r in records], f"benchmarks/results/{args.records}/{args.candidate}_seed*.json"
    write_report(name, {"records": source, "machine": machine(), **summarize(records, seeds)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
