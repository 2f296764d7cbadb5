"""Decode steps of a batch whose rows start at very different cache columns (a continuous batch
holding resumed partial rollouts beside fresh prompts): attention by runs of rows, each from its
own first column (`reasonrl.rollout.fused.row_chunks`), against one product over every row from
the earliest column.

SmolLM2-135M-Instruct in bfloat16 with the rollout's float32 cache; `--long` rows with a
`--long-context`-token prefix and `--short` rows with a `--short-context`-token one (random token
ids: the time does not depend on them), laid out longest first as the continuous batch lays them;
then `--steps` decode steps, timed. The two ways alternate over `--repeats` repetitions, each from a
fresh prefill. Writes benchmarks/results/decode_chunks.json: the median milliseconds per decode step
of each (after an untimed warm-up), their ratio, and the share of cache columns the runs read.

    python -m benchmarks.decode_chunks [--long 16 --long-context 450 --short 48 --short-context 150]
                                       [--steps 24] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from benchmarks.common import code_version, machine, write_report
from reasonrl.models import SMOLLM2_ID, load_model
from reasonrl.rollout.continuous import left_padded
from reasonrl.rollout.fused import FusedDecoder, row_chunks


def decode_ms(decoder: FusedDecoder, prompts: list[list[int]], steps: int, by_runs: bool, seed: int) -> float:
    """Milliseconds per decode step after a prefill of `prompts`."""
    generator = torch.Generator().manual_seed(seed)
    ids_NP, valid_NP, positions_NP = left_padded(prompts, 0, decoder.device)
    width = ids_NP.shape[1]
    cache = decoder.new_cache(rows=len(prompts), capacity=width + steps)
    decoder.forward(ids_NP, positions_NP, valid_NP, cache)
    starts = [width - len(prompt) for prompt in prompts] if by_runs else None
    position_N = positions_NP[:, -1] + 1
    begin = time.perf_counter()
    for _ in range(steps):
        next_N1 = torch.randint(100, 10_000, (len(prompts), 1), generator=generator)
        decoder.forward(next_N1, position_N[:, None], torch.ones_like(next_N1, dtype=torch.bool), cache,
                        row_starts=starts)
        position_N = position_N + 1
    return 1000 * (time.perf_counter() - begin) / steps


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", type=int, default=16)
    parser.add_argument("--long-context", type=int, default=450)
    parser.add_argument("--short", type=int, default=48)
    parser.add_argument("--short-context", type=int, default=150)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    decoder = FusedDecoder(load_model(SMOLLM2_ID, dtype=torch.bfloat16, device=torch.device("cpu")))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 10_000, (length,), generator=generator).tolist()
               for length in [args.long_context] * args.long + [args.short_context] * args.short]
    width = max(map(len, prompts))
    runs = row_chunks([width - len(p) for p in prompts], width, width + 1)
    read = sum((high - low) * (width + 1 - first) for low, high, first in runs) / (len(prompts) * (width + 1))
    decode_ms(decoder, prompts, 2, by_runs=True, seed=0)  # warm-up: oneDNN's first calls are slow
    times: dict[str, list[float]] = {"one_product": [], "by_runs": []}
    for repeat in range(args.repeats):
        for name, values in times.items():
            values.append(decode_ms(decoder, prompts, args.steps, by_runs=name == "by_runs", seed=repeat))
            print(f"repeat {repeat} {name}: {values[-1]:.1f} ms per decode step", file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in times.items()}
    report = {"commit": code_version(), "machine": machine(), "threads": torch.get_num_threads(),
              "settings": vars(args), "runs": len(runs), "columns_read_share": read,
              "ms_per_decode_step": times, "median_ms": medians,
              "speedup": medians["one_product"] / medians["by_runs"]}
    write_report("decode_chunks", report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
