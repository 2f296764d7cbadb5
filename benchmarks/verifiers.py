"""Math verifier throughput: checks per second of `math_equal` over a fixed mix of (prediction, gold) pairs, in
one process (a plain loop, as a reward function runs) and through `check_many`'s worker pool (1 and 2 workers,
started before the clock, so the numbers are steady-state throughput; the start-up is reported apart).

The mix imitates a group of completions per problem: each gold answer is checked against 4 predictions, some
equal in another form, some wrong. A quarter of the problems each have plain-number, LaTeX-fraction, set and
expression answers. Each measurement uses fresh numbers, so no parse cache (the workers keep theirs) carries over.

    python -m benchmarks.verifiers [--quick] [--problems 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.common import machine, write_report
from reasonrl.rewards import equivalence as verifier
from reasonrl.rewards.math import check_many, math_equal
from reasonrl.rewards.symbolic import parse_latex

SAMPLES_PER_PROBLEM = 4


def problem_pairs(k: int) -> tuple[str, list[tuple[str, str, bool]]]:
    """Problem `k`'s kind and its (prediction, gold, expected) pairs; the kind cycles through the four."""
    a, b = 3 + k % 97, 2 ** (1 + k % 3)  # b in {2, 4, 8}: a/b has a short exact decimal
    kind = ("number", "fraction", "set", "expression")[k % 4]
    if kind == "number":
        gold = str(1000 + k)
        return kind, [(gold, gold, True), (f"{1000 + k}.0", gold, True), (f"{1000 + k:,}", gold, True),
                      (str(1001 + k), gold, False)]
    if kind == "fraction":
        gold = f"\\frac{{{a}}}{{{b}}}"
        return kind, [(str(a / b), gold, True), (f"\\dfrac{{{a}}}{{{b}}}", gold, True), (f"{a}/{b}", gold, True),
                      (f"\\frac{{{a + 1}}}{{{b}}}", gold, False)]
    if kind == "set":
        gold = f"\\{{{a}, {a + b}\\}}"
        return kind, [(f"\\{{{a + b}, {a}\\}}", gold, True), (f"{a}, {a + b}", gold, True),
                      (f"\\{{{a}, {a + b + 1}\\}}", gold, False), (f"({a}, {a + b})", gold, False)]
    gold = f"{a}\\sqrt{{2}} + {b}"
    return kind, [(f"{b} + \\sqrt{{{2 * a * a}}}", gold, True), (f"\\sqrt{{2}} \\cdot {a} + {b}", gold, True),
                  (f"{a}\\sqrt{{3}} + {b}", gold, False), (str(a + b), gold, False)]


def workload(problems: int, draw: int) -> list[tuple[str, str, bool]]:
    offset = draw * problems  # fresh numbers per draw
    return [pair for k in range(offset, offset + problems) for pair in problem_pairs(k)[1]]


def loop_checks_per_s(pairs: list[tuple[str, str, bool]]) -> float:
    start = time.perf_counter()
    results = [math_equal(prediction, gold) for prediction, gold, _ in pairs]
    seconds = time.perf_counter() - start
    assert results == [expected for *_, expected in pairs], "math_equal disagrees with the benchmark's answers"
    return len(pairs) / seconds


def pool_checks_per_s(pairs: list[tuple[str, str, bool]], workers: int) -> float:
    start = time.perf_counter()
    results = check_many([(prediction, gold) for prediction, gold, _ in pairs], workers=workers)
    seconds = time.perf_counter() - start
    assert results == [expected for *_, expected in pairs], "check_many disagrees with the benchmark's answers"
    return len(pairs) / seconds


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition of 20 problems")
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.quick:
        args.problems, args.repeats = 20, 1

    load_at_start = os.getloadavg()[0]  # other processes on the machine: 2 workers cannot scale past free cores
    start = time.perf_counter()
    check_many([("x", "x+0")], workers=2)  # start the pool outside the timings
    pool_start_s = time.perf_counter() - start
    settings = {"math_equal_loop": loop_checks_per_s,
                "check_many_1_worker": lambda pairs: pool_checks_per_s(pairs, workers=1),
                "check_many_2_workers": lambda pairs: pool_checks_per_s(pairs, workers=2)}
    runs: dict[str, list[float]] = {name: [] for name in settings}
    # Each measurement gets pairs of the same shapes with numbers no earlier measurement saw: the workers keep
    # their parse caches, so reusing pairs would time cache hits.
    for repeat in range(args.repeats):
        for index, (name, measure) in enumerate(settings.items()):
            parse_latex.cache_clear()
            runs[name].append(measure(workload(args.problems, repeat * len(settings) + index)))
        print(f"repeat {repeat}: " + ", ".join(f"{name} {v[-1]:.0f} checks/s" for name, v in runs.items()), flush=True)
    verifier.shutdown_pool()

    by_kind = {}  # in-process rate per answer kind, one pass: which kinds the fast path covers
    for kind in ("number", "fraction", "set", "expression"):
        problems = [problem_pairs(k) for k in range(100_000, 100_000 + 4 * args.problems)]
        kind_pairs = [pair for problem_kind, pairs in problems if problem_kind == kind for pair in pairs]
        parse_latex.cache_clear()
        by_kind[kind] = loop_checks_per_s(kind_pairs)

    summary = {name: {"checks_per_s_median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
               for name, v in runs.items()}
    median = {name: s["checks_per_s_median"] for name, s in summary.items()}
    report = {
        "settings": {**vars(args), "pairs_per_repeat": args.problems * SAMPLES_PER_PROBLEM, "cpus": os.cpu_count(),
                     "timeout_s": 5.0, "load_average_1min_at_start": load_at_start},
        **summary,
        "ratio_2_workers_over_loop": median["check_many_2_workers"] / median["math_equal_loop"],
        "pool_start_s_2_workers": pool_start_s,
        "math_equal_checks_per_s_by_kind": by_kind,
        "machine": machine(),
    }
    write_report("verifiers", report)
    return report


if __name__ == "__main__":
    main()
