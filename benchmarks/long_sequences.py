"""Long completions in the update: seconds and peak memory of one GRPO update of SmolLM2-135M-Instruct
on a group of long completions, with the defaults (the LM head fused with its softmax above 256 MiB
of logits; `train.gradient_checkpointing=auto`: selective recompute for micro-batches past 2048
positions) against what each of those saves and costs.

Variants, each in a fresh process so its peak RSS is its own (a warm-up update, then `--repeats`
timed ones; the peak covers them all):
- before: no checkpointing, the head's whole logits kept for backward (how updates ran before);
- fused_head: the fused head alone;
- default: the defaults (fused head, selective recompute past 2048 positions);
- full: the fused head and full checkpointing (each layer's input kept, the layer recomputed);
- padded: the defaults without packing (transformers' sdpa attention);
- jemalloc: the defaults with jemalloc (LD_PRELOAD, when the library is installed) returning freed
  memory to the system after 5 s (JEMALLOC_CONF): glibc, as reasonrl sets it up
  (`run.keep_freed_memory`), keeps freed blocks for reuse and its heap grows from one micro-batch
  to the next; this shows what returning them saves and costs;
- keep: the defaults but a long micro-batch's freed memory kept by the allocator after its
  backward (how updates ran before `Learner.releases_memory_after`);
- mmap_4mb: the defaults with glibc mapping every block of 4 MiB or more on its own (M_MMAP_THRESHOLD),
  so that freed activations go back to the system at once instead of leaving holes in the heap, at the
  price of a page fault per fresh page;
- mmap_4mb_thp: mmap_4mb with glibc asking for transparent huge pages on what it maps
  (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, glibc >= 2.35, the kernel's THP in "madvise" or "always"):
  a fault per 2 MiB instead of per 4 KiB page, which is mmap_4mb's price;
- mmap_2mb_thp, mmap_1mb_thp: the same with blocks of 2 MiB or 1 MiB and more mapped on their own
  (smaller blocks also go back to the system at once, so the heap keeps fewer holes);
- adamw_8bit: the defaults with AdamW's moments in 8 bits (`train.optimizer_state=8bit`, bitsandbytes):
  0.75 GiB less state for this model, at the price of bitsandbytes' CPU step;
- head16m: the defaults with the fused head's blocks of logits a quarter of their size (16M
  elements: 341 rows of the 49k vocabulary instead of 1365), the largest temporaries at the peak;
- head4m: the same with blocks a sixteenth of their size (4M elements: 85 rows);
- adamw_8bit_head16m, adamw_8bit_head4m: adamw_8bit with head16m or head4m;
- mmap_32mb, adamw_8bit_mmap_32mb: the defaults (or adamw_8bit) with only blocks of 32 MiB or more,
  glibc's largest threshold, mapped on their own: few and large (the fused head's blocks of logits
  and their gradients, whole-vocabulary gradients), so their faults should cost little of what
  mmap_4mb's many did;
- tcmalloc, adamw_8bit_tcmalloc: the defaults (or adamw_8bit) with gperftools' tcmalloc (LD_PRELOAD,
  Debian's libtcmalloc-minimal4), which returns freed spans to the system a little at a time
  (TCMALLOC_RELEASE_RATE, its default) and keeps small objects in per-size free lists, so freed
  activations need not leave holes in one heap: whether another allocator holds the peak down at
  glibc's speed, where jemalloc returning memory cost 18%;
- adamw_8bit_jemalloc: adamw_8bit with jemalloc as the `jemalloc` variant sets it;
- adamw_8bit_head4m_tcmalloc: adamw_8bit_head4m (the lowest peak with glibc) with tcmalloc;
- mimalloc, adamw_8bit_mimalloc: the defaults (or adamw_8bit) with Microsoft's mimalloc as the PyPI wheel
  cmeel-mimalloc ships it (its default settings), an allocator pip can install where apt cannot;
- persistent: the defaults with the gradients and AdamW's moments made before the first update and
  the gradients zeroed, not freed, between optimizer steps (whether long-lived tensors placed in the
  holes activations leave are what raises the peak).

`--profile` instead records one update (after a warm-up) of the defaults with torch's profiler and
writes the live tensor memory by category (parameters, optimizer state, gradients, activations,
temporaries) at its peak, beside the process's peak RSS: what the allocator adds is the difference.

The batch is one prompt of 55 tokens and `--group-size` completions of the given length; each
micro-batch holds one sequence. The update's autocast is what `reasonrl train` picks on this CPU:
bfloat16 with AVX512-BF16 or AMX, else float32 (the record's `settings.dtype` and `machine` say
which). The targets, at the longest length: the default's peak RSS at
most `--target-gb` and its median time per update at most the `before` variant's; for each other
variant, its peak at most `--target-gb` at no loss of speed (its median time at most 1.05x the
defaults').

    python -m benchmarks.long_sequences [--quick] [--lengths 1024,2048,4096] [--group-size 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch

from benchmarks.common import code_version, machine, peak_rss_mb, write_report
from benchmarks.train_step import PROMPT_TOKENS, synthetic_batch
from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.allocator import c_library, find_library
from reasonrl.config import TrainConfig
from reasonrl.models import SMOLLM2_ID, load_model, resolve_dtype
from reasonrl.training import learner as learner_module
from reasonrl.training import recompute, token_stats
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss
from reasonrl.training.runtime import keep_freed_memory

VARIANTS = {  # name: (train.gradient_checkpointing, fused head, packed)
    "before": ("off", False, True),
    "fused_head": ("off", True, True),
    "default": ("auto", True, True),
    "full": ("full", True, True),
    "padded": ("auto", True, False),
    "jemalloc": ("auto", True, True),
    "mmap_4mb": ("auto", True, True),
    "mmap_4mb_thp": ("auto", True, True),
    "mmap_2mb_thp": ("auto", True, True),
    "mmap_1mb_thp": ("auto", True, True),
    "keep": ("auto", True, True),
    "persistent": ("auto", True, True),
    "adamw_8bit": ("auto", True, True),
    "head16m": ("auto", True, True),
    "adamw_8bit_head16m": ("auto", True, True),
    "head4m": ("auto", True, True),
    "adamw_8bit_head4m": ("auto", True, True),
    "tcmalloc": ("auto", True, True),
    "adamw_8bit_tcmalloc": ("auto", True, True),
    "adamw_8bit_jemalloc": ("auto", True, True),
    "adamw_8bit_head4m_tcmalloc": ("auto", True, True),
    "mimalloc": ("auto", True, True),
    "adamw_8bit_mimalloc": ("auto", True, True),
    "mmap_32mb": ("auto", True, True),
    "adamw_8bit_mmap_32mb": ("auto", True, True),
}
_M_MMAP_THRESHOLD, _M_MMAP_MAX = -3, -4
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0"


ALLOCATORS = {"jemalloc": ("jemalloc", {"MALLOC_CONF": JEMALLOC_CONF}), "tcmalloc": ("tcmalloc_minimal", {}),
              "mimalloc": ("mimalloc", {})}
"""A variant named with one of these keys runs with that allocator: (library name, its environment)."""


def variant_env(variant: str) -> dict[str, str] | None:
    """The worker's environment: the variant's allocator preloaded (None: the library is missing)."""
    if variant.startswith("mmap_") and variant.endswith("_thp"):
        return {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    allocator = next((key for key in ALLOCATORS if variant.endswith(key)), None)
    if allocator is None:
        return dict(os.environ)
    library_name, settings = ALLOCATORS[allocator]
    library = find_library(library_name)
    return None if library is None else {**os.environ, "LD_PRELOAD": library, **settings}


def train_autocast() -> torch.dtype | None:
    """The update's autocast as `reasonrl train` picks it on this CPU (train.dtype=auto): bfloat16 where
    the CPU has AVX512-BF16 or AMX, else none (float32; bfloat16 matmuls are emulated there)."""
    dtype = resolve_dtype("auto", torch.device("cpu"))
    return None if dtype == torch.float32 else dtype


def keep_gradients_and_optimizer_state(learner: Learner) -> None:
    """The `persistent` variant: gradients and AdamW's moments made before the first update, in the
    heap's first blocks, and the gradients zeroed rather than freed between optimizer steps, so that
    no long-lived tensor is placed in a hole that activations left."""
    for group in learner.optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
            learner.optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                          "exp_avg_sq": torch.zeros_like(p)}
    zero_grad = learner.optimizer.zero_grad
    learner.optimizer.zero_grad = lambda set_to_none=True: zero_grad(set_to_none=False)


def worker(variant: str, length: int, group_size: int, repeats: int, profile: bool = False) -> dict:
    keep_freed_memory()  # as reasonrl's train() does
    if threshold := re.search(r"(?:^|_)mmap_(\d+)mb", variant):
        libc = c_library()
        libc.mallopt(_M_MMAP_MAX, 1 << 16)
        libc.mallopt(_M_MMAP_THRESHOLD, int(threshold.group(1)) << 20)
    if variant == "keep":
        learner_module.RELEASE_AFTER_LONG_MICRO_BATCHES = False
    mode, fused, packed = VARIANTS[variant]
    if not fused:
        token_stats.FUSED_HEAD_MIN_ELEMENTS = float("inf")
    if head_block := re.search(r"head(\d+)m(?:_|$)", variant):  # the fused head's block, in Mi elements
        token_stats.HEAD_BLOCK_ELEMENTS = int(head_block.group(1)) << 20
    model = load_model(SMOLLM2_ID, dtype=torch.float32, device=torch.device("cpu"))
    recompute.enable(model, mode, TrainConfig().micro_batch_positions)
    batch = synthetic_batch(1, group_size, completion_tokens=length)
    optim = OptimConfig(lr=1e-7, state="8bit" if variant.startswith("adamw_8bit") else "float32")
    learner = Learner(model, optim, temperature=0.7, autocast_dtype=train_autocast(), pack=packed,
                      micro_batch_positions=TrainConfig().micro_batch_positions)  # as reasonrl train sets it
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
    if variant == "persistent":
        keep_gradients_and_optimizer_state(learner)
    rss_loaded = peak_rss_mb()
    learner.update(batch, loss, micro_batch_size=1)  # warm-up
    if profile:
        # The process's RSS is not reported: the profiler's own records take several GB.
        return {"live_tensors_at_peak_gib": live_tensor_peak(lambda: learner.update(batch, loss, micro_batch_size=1))}
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        learner.update(batch, loss, micro_batch_size=1)
        seconds.append(time.perf_counter() - start)
    return {"seconds": statistics.median(seconds), "seconds_each": seconds, "peak_rss_mb": peak_rss_mb(),
            "peak_rss_over_loaded_model_mb": peak_rss_mb() - rss_loaded}


def live_tensor_peak(update) -> dict[str, float]:
    """GiB of live tensors by category at the peak of `update()`, from torch's memory profiler."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import _CATEGORY_TO_COLORS, MemoryProfileTimeline

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        update()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(torch.device("cpu"))
    peak = max(sizes, key=sum)
    # Column 0 is unused; then the profiler's own category order, a tensor of no known category last.
    names = ["", *(category.name.lower() if category is not None else "unknown" for category in _CATEGORY_TO_COLORS)]
    return {"total": sum(peak) / 2**30, **{name: size / 2**30 for name, size in zip(names, peak) if size}}


def targets(results: dict, length: int, target_gb: float) -> dict:
    """The targets at `length`: the defaults' peak RSS at most `target_gb` and their time at most the `before`
    variant's; for every other variant, its peak at most `target_gb` at no loss of speed (at most 1.05x the
    defaults' median seconds: within 5%, or faster)."""
    default, before = results.get(f"default_{length}"), results.get(f"before_{length}")
    if not default:
        return {}
    peak_gb = default["peak_rss_mb"] / 1024
    met: dict = {"length": length,
                 "peak_rss_gb": {"target": f"<= {target_gb}", "measured": round(peak_gb, 2), "met": peak_gb <= target_gb}}
    if before:
        speed_ratio = before["seconds"] / default["seconds"]
        met["speed_vs_before"] = {"target": ">= 1.0 (before's median seconds / default's)",
                                  "measured": round(speed_ratio, 3), "met": speed_ratio >= 1.0}
    for name, result in results.items():
        variant, _, at = name.rpartition("_")
        if at != str(length) or variant in ("default", "before"):
            continue
        gb, time_ratio = result["peak_rss_mb"] / 1024, result["seconds"] / default["seconds"]
        met[variant] = {"peak_rss_gb": round(gb, 2), "time_vs_default": round(time_ratio, 3),
                        "met": gb <= target_gb and time_ratio <= 1.05}
    return met


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="lengths 512 and 1024 only, one timed update")
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="timed updates after the warm-up")
    parser.add_argument("--target-gb", type=float, default=5.0,
                        help="the peak RSS target in GiB (the record's *_gb figures are MiB / 1024)")
    parser.add_argument("--name", default="long_sequences", help="the report's file name under benchmarks/results")
    parser.add_argument("--profile", action="store_true", help="the live tensors at the defaults' peak, by category")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.length, args.group_size, args.repeats, args.profile)))
        return {}
    if args.profile:
        return profile_report(args)
    lengths = [512, 1024] if args.quick else [int(x) for x in args.lengths.split(",")]
    repeats = 1 if args.quick else args.repeats
    results: dict[str, dict] = {}
    for length in lengths:
        for variant in args.variants.split(","):
            name = f"{variant}_{length}"
            if (env := variant_env(variant)) is None:
                print(f"{name}: skipped, its allocator's library is not installed (Debian's libjemalloc2, "
                      "libtcmalloc-minimal4)", flush=True)
                continue
            completed = subprocess.run(
                [sys.executable, "-m", "benchmarks.long_sequences", "--worker", variant, "--length", str(length),
                 "--group-size", str(args.group_size), "--repeats", str(repeats)],
                capture_output=True, text=True, check=True, env=env)
            results[name] = json.loads(completed.stdout.strip().splitlines()[-1])
            print(f"{name}: {results[name]['seconds']:.1f} s per update (median of {repeats}), peak RSS "
                  f"{results[name]['peak_rss_mb'] / 1024:.2f} GiB", flush=True)
    autocast = train_autocast()
    update_dtype = f"{autocast} autocast" if autocast else "float32, no autocast"
    report = {"what": __doc__.split("\n\n")[0],
              "settings": {"lengths": lengths, "group_size": args.group_size, "prompt_tokens": PROMPT_TOKENS,
                           "dtype": f"{update_dtype}, float32 weights",
                           "micro_batch_sequences": 1,
                           "timed_updates": repeats, "variants": {v: VARIANTS[v] for v in args.variants.split(",")},
                           "jemalloc_conf": JEMALLOC_CONF},
              "targets": targets(results, max(lengths), args.target_gb),
              **results, "commit": code_version(), "machine": machine()}
    write_report(f"{args.name}_quick" if args.quick else args.name, report)
    return report


def profile_report(args: argparse.Namespace) -> dict:
    report: dict = {"what": "live tensor memory (GiB) by category at the peak of one update of the defaults (torch's "
                            "profiler); the process's peak RSS without the profiler is the `default` variant's",
                    "group_size": args.group_size}
    for length in [int(x) for x in args.lengths.split(",")]:
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.long_sequences", "--worker", "default", "--length", str(length),
             "--group-size", str(args.group_size), "--profile"], capture_output=True, text=True, check=True)
        report[f"default_{length}"] = json.loads(completed.stdout.strip().splitlines()[-1])
    write_report("long_sequences_profile", {**report, "commit": code_version(), "machine": machine()})
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
