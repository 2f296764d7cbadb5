"""Two training runs on the same cores: today's default (each process takes every core, as torch
does by itself) against run.threads=0 (an equal share each), in total generated tokens per second.

Arms, each the default job for `--steps` steps without evaluation, from the same seed:
- `alone`: one run, every core: what the machine gives one run (the ceiling of the pair's total);
- `pair_every_core`: two runs at once, each run.threads=<cores> (torch's own default);
- `pair_shared`: two runs at once, each run.threads=0 (the default).

Throughput is the generated tokens of the arm's runs over the arm's wall time (from the first start
to the last end, model loading included in every arm alike); the step time is each run's median
perf/step_s. Each arm's record (`benchmarks/results/cpu_sharing/<arm>.json`) names the commit, the
device, the machine's 1-minute load before it started (another process on the cores invalidates
the comparison: the script refuses to start above `--max-load`), and is reused when it exists with
the same settings (`--rerun` to run again).

    python -m benchmarks.cpu_sharing [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import code_version, source_digest
from benchmarks.runs import QUIET, RESULTS, run_command, run_device, summarize_metrics
from reasonrl.training.cpu_share import usable_cores

STUDY = RESULTS / "cpu_sharing"


def arms(cores: int) -> dict[str, list[list[str]]]:
    """Each arm's runs, as their extra overrides."""
    return {"alone": [[]], "pair_every_core": [[f"run.threads={cores}"]] * 2, "pair_shared": [["run.threads=0"]] * 2}


def timed_run(args: list[str], scratch: Path, index: int) -> dict[str, Any]:
    """One `reasonrl train` in a fresh process: its start and end (monotonic) and its metrics."""
    run_dir = scratch / f"run{index}"
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the arm sets the threads
    command = [sys.executable, "-m", "reasonrl.commands.cli", "train", f"run.dir={run_dir}", *QUIET, *args]
    started = time.monotonic()
    run_command(command, env=env)
    ended = time.monotonic()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"started": started, "ended": ended, **summarize_metrics(metrics)}


def wait_for_idle(max_load: float, patience_s: float = 300.0) -> float:
    """The 1-minute load once it is at most `max_load`: it decays for a minute or two after the previous
    arm's own runs; still above after `patience_s`, something else uses the cores and the script stops."""
    deadline = time.monotonic() + patience_s
    while (load := os.getloadavg()[0]) > max_load:
        if time.monotonic() > deadline:
            raise SystemExit(f"the 1-minute load is {load:.2f} (> --max-load {max_load}) after {patience_s:.0f} s: "
                             "something else uses the cores; measure on an idle machine")
        time.sleep(5)
    return load


def run_arm(name: str, runs: list[list[str]], steps: int, max_load: float) -> dict[str, Any]:
    settings = [["eval.problems=0", "eval.before=false", f"train.steps={steps}", *extra] for extra in runs]
    path = STUDY / f"{name}.json"
    if path.exists() and json.loads(path.read_text()).get("settings") == settings:
        return json.loads(path.read_text())
    load = wait_for_idle(max_load)
    print(f"[cpu_sharing] {name}: {len(runs)} run(s) at once: {settings}", file=sys.stderr, flush=True)
    identity = {"commit": code_version(), "source": source_digest()}
    with tempfile.TemporaryDirectory(prefix="cpu_sharing_") as scratch, ThreadPoolExecutor(len(runs)) as pool:
        results = list(pool.map(timed_run, settings, [Path(scratch)] * len(runs), range(len(runs))))
    wall_s = max(r["ended"] for r in results) - min(r["started"] for r in results)
    tokens = sum(sum(r["curves"]["rollout/generated_tokens"]) for r in results)
    record = {"arm": name, "settings": settings, **identity, "device": run_device(), "cores": usable_cores(),
              "load_before": load, "wall_s": wall_s, "generated_tokens": tokens, "tokens_per_s": tokens / wall_s,
              "step_s_median": [statistics.median(r["curves"]["perf/step_s"]) for r in results],
              "run_wall_s": [r["ended"] - r["started"] for r in results]}
    STUDY.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-load", type=float, default=0.5, help="refuse to start an arm above this 1-minute load")
    parser.add_argument("--rerun", action="store_true")
    options = parser.parse_args()
    cores = usable_cores()
    if options.rerun:
        for old in STUDY.glob("*.json"):
            old.unlink()
    records = {name: run_arm(name, runs, options.steps, options.max_load) for name, runs in arms(cores).items()}
    alone, every, shared = (records[name]["tokens_per_s"] for name in ("alone", "pair_every_core", "pair_shared"))
    summary = {"cores": cores, "steps": options.steps, "tokens_per_s": {k: r["tokens_per_s"] for k, r in records.items()},
               "shared_over_every_core": shared / every, "shared_over_alone": shared / alone,
               "step_s_median": {k: r["step_s_median"] for k, r in records.items()},
               "commits": sorted({r["commit"] for r in records.values()})}
    (STUDY / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
