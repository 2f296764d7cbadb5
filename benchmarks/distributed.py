"""Training throughput of one `reasonrl train` loop with its rollouts generated locally, by Ray
workers, and asynchronously, same model, prompts and settings, in one run.

Modes (SmolLM2-135M-Instruct, arithmetic, `--prompts` x `--group-size` samples per step):
- local: the synchronous loop, engine and learner in this process;
- local_async: one-step-off (rollout.max_staleness=1), generation in a thread beside the learner;
- ray_1 / ray_2: run.backend=ray with one / two rollout workers, synchronous;
- ray_2_async: two workers, one-step-off;
- ray_learners_2 / ray_learners_2_fsdp: one rollout worker and the update in two data-parallel
  learner ranks (Ray actors, gloo), replicated / sharded with FSDP2; their peak RSS per rank
  shows what sharding saves.

Each mode trains `--steps` steps; the first is left out of the medians (warm-up). Reported per
mode: median seconds per step, generated tokens per second of wall time, the learner's median
wait for rollouts (async), the staleness seen, and the start-up time (Ray and its workers).

What the 2-core limit hides: every mode shares the same two cores, so Ray workers take them
from the learner, and asynchronous generation competes with the update instead of running on
its own device. The ratios here are overheads (process start-up, weight broadcast, thread
contention), not the gains scale-out gives when workers and learner have devices of their own:
then a step costs max(generate, update) instead of their sum with one-step-off, and
generation time divides by the workers until the learner or the weight sync bounds it.

    python -m benchmarks.distributed [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine, write_report
from reasonrl import load_config, train
from reasonrl.models import SMOLLM2_ID

# One rollout worker and two learner ranks: 2 CPUs reserved in all, as the machine has.
LEARNER_RANKS = ("run.backend=ray", "run.ray_workers=1", "run.ray_cpus_per_worker=1", "run.ray_threads_per_worker=2",
                 "run.learner_workers=2", "run.ray_cpus_per_learner=0.5")
MODES = {
    "local": (),
    "local_async": ("rollout.max_staleness=1",),
    "ray_1": ("run.backend=ray", "run.ray_workers=1", "run.ray_cpus_per_worker=1", "run.ray_threads_per_worker=2"),
    "ray_2": ("run.backend=ray", "run.ray_workers=2", "run.ray_cpus_per_worker=1"),
    "ray_2_async": ("run.backend=ray", "run.ray_workers=2", "run.ray_cpus_per_worker=1", "rollout.max_staleness=1"),
    "ray_learners_2": LEARNER_RANKS,
    "ray_learners_2_fsdp": (*LEARNER_RANKS, "run.learner_shard=true"),
}


def run_mode(name: str, extra: tuple[str, ...], args: argparse.Namespace, root: Path) -> dict:
    cfg = load_config(overrides=[
        f"run.dir={root / name}", "run.progress=false", "run.tensorboard=false", "run.log_every=0",
        "run.save_every=0", "eval.problems=0", f"train.steps={args.steps}",
        f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}", *extra])
    started = time.perf_counter()
    train(cfg)
    total = time.perf_counter() - started
    steps = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "perf/step_s" in m]
    timed = steps[1:]  # the first step warms up kernels, the allocator and the workers
    step_s = statistics.median(m["perf/step_s"] for m in timed)
    tokens = statistics.median(m["rollout/len_mean"] for m in timed) * args.prompts * args.group_size
    result = {"step_s": round(step_s, 3), "tokens_per_s": round(tokens / step_s, 1),
              "update_s": round(statistics.median(m["perf/update_s"] for m in timed), 3),
              "startup_s": round(total - sum(m["perf/step_s"] for m in steps), 1),
              "reward_mean": round(statistics.fmean(m["reward/mean"] for m in steps), 3)}
    if any("async/wait_s" in m for m in timed):
        result |= {"wait_s": round(statistics.median(m["async/wait_s"] for m in timed), 3),
                   "staleness_max": max(m["async/staleness_max"] for m in timed)}
    if any("perf/learner_rank_peak_rss_mb" in m for m in steps):
        result["learner_rank_peak_rss_mb"] = round(max(m.get("perf/learner_rank_peak_rss_mb", 0) for m in steps))
    print(name, result, flush=True)
    return result


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 steps per mode, 24 new tokens")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    args = parser.parse_args()
    if args.quick:
        args.steps, args.max_new_tokens = 3, 24
    with tempfile.TemporaryDirectory() as root:
        results = {name: run_mode(name, MODES[name], args, Path(root)) for name in args.modes.split(",")}
    base = results.get("local", {}).get("step_s")
    report = {
        "model": SMOLLM2_ID, "steps": args.steps, "prompts": args.prompts, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "modes": results,
        **({f"{name}_speed_vs_local": round(base / r["step_s"], 3) for name, r in results.items()} if base else {}),
        "note": ("2 cores shared by every mode: Ray workers and the async producer take cores from the learner, so "
                 "the ratios are overheads (start-up, weight broadcast, contention), not scale-out gains; with a "
                 "device per worker and for the learner, one-step-off costs max(generate, update) per step instead "
                 "of their sum and generation divides across workers."),
        "machine": machine() | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
    }
    write_report("distributed", report)
    return report


if __name__ == "__main__":
    main()
