"""Rollout throughput, local against Ray rollout workers, same prompts, same run.

Four ways to sample `--group-size` completions for each of `--prompts` arithmetic prompts from
SmolLM2-135M-Instruct (bfloat16 where the hardware has it):
- local_batched: one hf engine, all prompts in one call (what the local loop does);
- local_seeded: the same engine, one call per prompt with per-prompt seeds (what each Ray worker
  does, so that samples do not depend on the sharding);
- ray_1 / ray_2: one / two Ray workers (distributed/ray.py), with the threads split between them.
Also the time to sync the weights: local copy against ray.put + every worker loading.

On this 2-core machine the workers share the cores a local engine would use, so the ratios
measure what Ray and per-prompt calls cost, not what scale-out gains: with a GPU (or a machine)
per worker, generation scales with the workers until the learner or the weight broadcast is the
bottleneck. The machine is shared and noisy: compare ratios within one run. Two-thread runs
(local_*, ray_1) suffer most when other processes take a core (a thread that is descheduled stalls
its partner at every kernel's barrier); one-thread workers (ray_2) do not, which can make ray_2
look faster than local_batched here, a property of the shared machine rather than of Ray.

    python -m benchmarks.distributed [--quick] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.common import machine, write_report
from reasonrl.models import SMOLLM2_ID, resolve_model_path
from reasonrl.tasks import arithmetic_task
from reasonrl.types import SamplingParams


def tokens_per_second(engine, problems, sampling, repeats: int) -> dict[str, float]:
    engine.generate(problems[:1], sampling)  # warm-up (kernels, allocator, a worker's first call)
    rates = []
    for repeat in range(repeats):
        seeded = SamplingParams(**{**sampling.__dict__, "seed": repeat})
        start = time.perf_counter()
        groups = engine.generate(problems, seeded)
        elapsed = time.perf_counter() - start
        rates.append(sum(len(c.token_ids) for g in groups for c in g.completions) / elapsed)
    return {"tokens_per_s": statistics.median(rates), "spread": (max(rates) - min(rates)) / statistics.median(rates)}


def sync_seconds(engine, named: dict[str, torch.Tensor], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.load_weights(named.items())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, 16 new tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2, help="cores the benchmark may use in all")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.max_new_tokens = 1, 16

    import ray

    from reasonrl.distributed.ray import HFEngineFactory, RayRolloutEngine, SeededEngine

    dtype = "bfloat16" if torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX") else "float32"
    factory = HFEngineFactory(str(resolve_model_path(SMOLLM2_ID)), dtype=dtype)
    problems = list(arithmetic_task(train_size=args.prompts, test_size=0).train)
    sampling = SamplingParams(n=args.group_size, temperature=0.7, max_new_tokens=args.max_new_tokens)

    torch.set_num_threads(args.threads)
    local = factory()
    named = {name: p.detach().clone() for name, p in local.model.named_parameters()}
    results = {"local_batched": tokens_per_second(local, problems, sampling, args.repeats),
               "local_seeded": tokens_per_second(SeededEngine(local), problems, sampling, args.repeats)}
    sync = {"local": sync_seconds(local, named)}
    del local

    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    try:
        for workers in (1, 2):
            engine = RayRolloutEngine(factory, workers=workers, cpus_per_worker=args.threads / workers,
                                      threads_per_worker=max(1, args.threads // workers))
            results[f"ray_{workers}"] = tokens_per_second(engine, problems, sampling, args.repeats)
            sync[f"ray_{workers}"] = sync_seconds(engine, named)
            engine.shutdown()
    finally:
        ray.shutdown()

    base = results["local_batched"]["tokens_per_s"]
    report = {
        "model": SMOLLM2_ID, "dtype": dtype, "prompts": args.prompts, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "cores": args.threads,
        **{f"{name}_tokens_per_s": round(r["tokens_per_s"], 1) for name, r in results.items()},
        **{f"{name}_vs_local_batched": round(r["tokens_per_s"] / base, 3) for name, r in results.items()},
        **{f"weight_sync_s_{name}": round(s, 3) for name, s in sync.items()},
        "spreads": {name: round(r["spread"], 3) for name, r in results.items()},
        "note": ("2 cores shared by all modes: ray_2 runs two 1-thread workers on the cores one 2-thread local "
                 "engine uses, so its ratio is Ray's and per-prompt calls' overhead, not a scale-out gain; with a "
                 "device per worker generation scales with workers until the learner or the weight sync bounds it. "
                 "2-thread modes (local_*, ray_1) stall when other processes share the cores; 1-thread workers "
                 "(ray_2) do not: on this shared machine that, not Ray, can put ray_2 ahead."),
        "machine": machine() | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
    }
    write_report("distributed", report)
    return report


if __name__ == "__main__":
    main()
