"""Memory kept for reuse over a run: the default job with the kept memory bounded (the default:
`runtime.KeptMemoryBound` gives the heap's free pages back once the memory kept, the RSS beyond the
heap in use, has grown 1 GiB past its level after the first step, or the first step after the last
release) against unbounded (how runs went before: glibc keeps every freed page,
`run.keep_freed_memory`).

Both arms run at once, one thread each (`run.threads=1`), from the same seed and without evaluation,
so they sample the same completions and each step is compared with the same step of the other arm.
`--arms tcmalloc,bounded` compares instead the default job with tcmalloc preloaded (`reasonrl.allocator`;
glibc's tuning and bound then stand aside) against glibc's bounded default.
Per arm: the RSS and the heap in use after every step (their largest is the measure of memory;
within a step the RSS goes higher), the steps at which memory was given back, and the step times.
The speed measure is the ratio of the two arms' total seconds over the steps (the first arm's / the second's),
with a 95% interval from resampling the steps, each step's pair of times kept together (bootstrap).
The record (`benchmarks/results/kept_memory.json`, a plot beside it) names the commit, the library's
source digest and the device.

    python -m benchmarks.kept_memory [--steps 40] [--seed 0] [--arms bounded,unbounded] [--name kept_memory]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import code_version, machine, pyplot, source_digest, write_report
from benchmarks.runs import QUIET, RESULTS, run_command, run_device, run_environment

# The unbounded arm: the bound set out of reach before the trainer starts.
UNBOUNDED = ("import math, sys; from reasonrl.training import runtime; runtime.KEPT_MEMORY_GROWTH = math.inf; "
             "from reasonrl.commands.cli import main; sys.exit(main(sys.argv[1:]))")
ARMS = {"bounded": ["-m", "reasonrl.commands.cli"], "unbounded": ["-c", UNBOUNDED],
        "tcmalloc": ["-m", "reasonrl.commands.cli"]}
PRELOADED = {"tcmalloc": "tcmalloc"}
"""Arms run with an allocator preloaded: arm -> its name in reasonrl.allocator."""
PER_STEP = ("perf/step_s", "perf/generate_s", "perf/update_s", "perf/rss_gb", "perf/heap_in_use_gb",
            "perf/released_gb", "reward/mean")


def arm_run(arm: str, steps: int, seed: int, scratch: Path) -> dict[str, Any]:
    run_dir = scratch / arm
    command = [sys.executable, *ARMS[arm], "train", f"run.dir={run_dir}", *QUIET, f"train.steps={steps}",
               f"run.seed={seed}", "eval.problems=0", "run.threads=1", "run.device=cpu"]
    env, _ = run_environment(allocator=PRELOADED.get(arm))
    started = time.monotonic()
    run_command(command, env=env)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_seen = [m for m in metrics if "perf/step_s" in m]
    return {"wall_s": time.monotonic() - started,
            **{key: [m.get(key) for m in steps_seen] for key in PER_STEP}}


def ratio_interval(first: list[float], second: list[float], resamples: int = 10_000) -> dict[str, float]:
    """Total seconds first / second, with a 95% bootstrap interval over steps (pairs kept together)."""
    rng = random.Random(0)
    pairs = list(zip(first, second, strict=True))
    ratios = sorted(sum(b for b, _ in sample) / sum(u for _, u in sample)
                    for sample in ([rng.choice(pairs) for _ in pairs] for _ in range(resamples)))
    return {"ratio": sum(first) / sum(second), "low": ratios[int(0.025 * resamples)],
            "high": ratios[int(0.975 * resamples) - 1]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="kept_memory", help="the record's name under benchmarks/results")
    parser.add_argument("--arms", default="bounded,unbounded", help=f"two of {', '.join(ARMS)}; ratios are the "
                        "first's over the second's")
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    if len(arms) != 2 or len(set(arms)) != 2 or not set(arms) <= set(ARMS):
        parser.error(f"--arms takes two different arms of {', '.join(ARMS)}")
    with tempfile.TemporaryDirectory(prefix="kept_memory_") as scratch, ThreadPoolExecutor(len(arms)) as pool:
        futures = {arm: pool.submit(arm_run, arm, args.steps, args.seed, Path(scratch)) for arm in arms}
        runs = {arm: future.result() for arm, future in futures.items()}
    first, second = (runs[arm] for arm in arms)
    report = {
        "what": __doc__.split("\n\n")[0], "steps": args.steps, "seed": args.seed, "arms": arms,
        "same_rewards": first["reward/mean"] == second["reward/mean"],
        "step_time": ratio_interval(first["perf/step_s"], second["perf/step_s"]),
        "update_time": ratio_interval(first["perf/update_s"], second["perf/update_s"]),
        "summary": {arm: {"rss_last_gb": run["perf/rss_gb"][-1], "rss_max_gb": max(run["perf/rss_gb"]),
                          "heap_in_use_last_gb": run["perf/heap_in_use_gb"][-1],
                          "releases": sum(1 for r in run["perf/released_gb"] if r is not None),
                          "median_step_s": statistics.median(run["perf/step_s"]), "wall_s": run["wall_s"]}
                    for arm, run in runs.items()},
        "runs": runs, "commit": code_version(), "source": source_digest(), "device": run_device(),
        "machine": machine()}
    write_report(args.name, report)
    plot(runs, RESULTS / f"{args.name}.png")
    print(json.dumps({k: report[k] for k in ("same_rewards", "step_time", "update_time", "summary")}, indent=1))
    return report


def plot(runs: dict[str, dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    figure, axis = plt.subplots(figsize=(7, 4))
    for (arm, run), color in zip(runs.items(), ("tab:blue", "tab:orange"), strict=False):
        steps = range(1, len(run["perf/rss_gb"]) + 1)
        axis.plot(steps, run["perf/rss_gb"], color=color, label=f"{arm}: RSS")
        if None not in run["perf/heap_in_use_gb"]:  # glibc's malloc only
            axis.plot(steps, run["perf/heap_in_use_gb"], color=color, linestyle=":", label=f"{arm}: heap in use")
    axis.set_xlabel("step")
    axis.set_ylabel("GiB")
    axis.set_title(f"The default job's memory, {' against '.join(runs)}")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    main()
