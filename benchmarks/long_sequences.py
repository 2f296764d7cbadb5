"""Long completions in the update: seconds and peak memory of one GRPO update of SmolLM2-135M-Instruct
on a group of long completions, packed (the default), packed with every segment in the padded
buckets (how long segments ran before they went through scaled_dot_product_attention), and padded
(transformers' sdpa attention).

Each (length, variant) runs in a fresh process, so its peak RSS is its own: a warm-up update, then
a timed one. The batch is one prompt of 55 tokens and `--group-size` completions of the given
length; each micro-batch holds one sequence in every variant (a packed micro-batch takes a sequence
longer than `train.micro_batch_positions` alone, and the padded one is given micro-batches of 1),
so the variants differ only in how attention is computed. The bucketed variant is skipped where its
saved softmax alone would need more than `--bucketed-limit-gb`.

    python -m benchmarks.long_sequences [--quick] [--lengths 1024,2048,4096] [--group-size 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from transformers import AutoConfig

from benchmarks.common import machine, peak_rss_mb, write_report
from benchmarks.train_step import PROMPT_TOKENS, synthetic_batch
from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.models import SMOLLM2_ID, load_model, resolve_model_path
from reasonrl.training import packing
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss
from reasonrl.training.runtime import keep_freed_memory

VARIANTS = ("packed", "packed_bucketed", "padded")


def worker(variant: str, length: int, group_size: int) -> dict:
    keep_freed_memory()  # as reasonrl's train() does
    if variant == "packed_bucketed":
        packing.LONG_SEGMENT_SCORES = float("inf")
    model = load_model(SMOLLM2_ID, dtype=torch.float32, device=torch.device("cpu"))
    batch = synthetic_batch(1, group_size, completion_tokens=length)
    learner = Learner(model, OptimConfig(lr=1e-7), temperature=0.7, autocast_dtype=torch.bfloat16,
                      pack=variant != "padded")
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
    rss_loaded = peak_rss_mb()
    learner.update(batch, loss, micro_batch_size=1)  # warm-up
    start = time.perf_counter()
    learner.update(batch, loss, micro_batch_size=1)
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": peak_rss_mb(),
            "peak_rss_over_loaded_model_mb": peak_rss_mb() - rss_loaded}


def bucketed_softmax_gb(length: int, group_size: int) -> float:
    """What the bucketed attention keeps for the backward pass: each layer's bfloat16 softmax."""
    config = AutoConfig.from_pretrained(resolve_model_path(SMOLLM2_ID))
    scores = config.num_attention_heads * length * (PROMPT_TOKENS + length)
    return config.num_hidden_layers * scores * 2 * group_size / 1e9


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="lengths 512 and 1024 only")
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--bucketed-limit-gb", type=float, default=6.0)
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.length, args.group_size)))
        return {}
    lengths = [512, 1024] if args.quick else [int(x) for x in args.lengths.split(",")]
    results: dict[str, dict] = {}
    for length in lengths:
        gb = bucketed_softmax_gb(length, args.group_size)
        for variant in VARIANTS:
            name = f"{variant}_{length}"
            if variant == "packed_bucketed" and gb > args.bucketed_limit_gb:
                results[name] = {"skipped": f"its saved softmax alone would take {gb:.1f} GB"}
                print(f"{name}: {results[name]['skipped']}", flush=True)
                continue
            completed = subprocess.run(
                [sys.executable, "-m", "benchmarks.long_sequences", "--worker", variant, "--length", str(length),
                 "--group-size", str(args.group_size)], capture_output=True, text=True, check=True)
            results[name] = json.loads(completed.stdout.strip().splitlines()[-1])
            print(f"{name}: {results[name]['seconds']:.1f} s per update, peak RSS "
                  f"{results[name]['peak_rss_mb'] / 1024:.2f} GB", flush=True)
    report = {"what": __doc__.split("\n\n")[0],
              "settings": {"lengths": lengths, "group_size": args.group_size, "prompt_tokens": PROMPT_TOKENS,
                           "dtype": "bfloat16 autocast, float32 weights", "micro_batch_sequences": 1},
              **results, "machine": machine()}
    write_report("long_sequences_quick" if args.quick else "long_sequences", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
