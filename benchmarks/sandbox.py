"""Sandbox throughput: runs per second of a trivial program (`print(1)`) in each isolation
("namespaces", "process"), one at a time and two in parallel, against the same program started as a
bare interpreter (`python -I -S -c`, no isolation) in the same run: the ratio is what the isolation
costs. Also records the layers in force (`reasonrl.sandbox.describe()`), which the numbers depend on.

Each setting alternates over several repetitions of `--runs` runs; the JSON (benchmarks/results/
sandbox.json) has medians and spreads.

    python -m benchmarks.sandbox [--quick] [--runs 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time

from benchmarks.common import code_version, machine, write_report
from reasonrl.sandbox import describe, run_many, run_python

PROGRAM = "print(1)"
ISOLATIONS = ("namespaces", "process")


def sandbox_sequential(runs: int, isolation: str) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        result = run_python(PROGRAM, isolation=isolation)
        assert result.status == "ok" and result.stdout == "1\n", result
    return runs / (time.perf_counter() - start)


def sandbox_parallel(runs: int, isolation: str, workers: int = 2) -> float:
    start = time.perf_counter()
    results = run_many([PROGRAM] * runs, max_workers=workers, isolation=isolation)
    seconds = time.perf_counter() - start
    assert all(r.status == "ok" and r.stdout == "1\n" for r in results), results
    return runs / seconds


def bare_sequential(runs: int) -> float:
    python = os.path.realpath(sys.executable)
    start = time.perf_counter()
    for _ in range(runs):
        out = subprocess.run([python, "-I", "-S", "-c", PROGRAM], capture_output=True, env={}, check=True).stdout
        assert out == b"1\n"
    return runs / (time.perf_counter() - start)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition of 10 runs")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeats = 10, 1

    layers = describe()  # probes the isolations once, outside the timings
    settings = {"bare_interpreter_sequential": bare_sequential}
    for isolation in ISOLATIONS:
        run_python(PROGRAM, isolation=isolation)  # each isolation's one-time probe and compilation
        settings[f"{isolation}_sequential"] = functools.partial(sandbox_sequential, isolation=isolation)
        settings[f"{isolation}_parallel_2"] = functools.partial(sandbox_parallel, isolation=isolation)
    runs: dict[str, list[float]] = {name: [] for name in settings}
    for repeat in range(args.repeats):
        for name, measure in settings.items():
            runs[name].append(measure(args.runs))
        print(f"repeat {repeat}: " + ", ".join(f"{name} {v[-1]:.1f} runs/s" for name, v in runs.items()), flush=True)

    summary = {name: {"runs_per_s_median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
               for name, v in runs.items()}
    median = {name: s["runs_per_s_median"] for name, s in summary.items()}
    report = {
        "settings": {**vars(args), "program": PROGRAM, "cpus": os.cpu_count(), "as_root": os.geteuid() == 0},
        "layers": layers,
        **summary,
        **{f"ratio_{isolation}_over_bare_interpreter": median[f"{isolation}_sequential"]
           / median["bare_interpreter_sequential"] for isolation in ISOLATIONS},
        **{f"ratio_{isolation}_parallel_2_over_sequential": median[f"{isolation}_parallel_2"]
           / median[f"{isolation}_sequential"] for isolation in ISOLATIONS},
        "code_version": code_version(),
        "machine": machine(),
    }
    write_report("sandbox", report)
    return report


if __name__ == "__main__":
    main()
