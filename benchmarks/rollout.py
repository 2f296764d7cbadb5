"""Rollout throughput: reasonrl's hf engine (fused decoder, and the transformers forward) against
`model.generate`, same prompts, same run.

All sample 8 completions for each of 4 arithmetic prompts (batch 32) at temperature 0.7 with
at most 128 new tokens, from SmolLM2-135M-Instruct in bfloat16. Generated tokens count up to and
including each sequence's end-of-sequence token (what a trainer can use); `generate` keeps
decoding padding for finished rows until the longest ends, which is part of its cost. The two
alternate over several repetitions; the JSON has medians, spreads and the ratio.

    python -m benchmarks.rollout [--quick] [--repeats 3] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from benchmarks.common import machine, matmul_peak_gflops, peak_rss_mb, write_report
from reasonrl.config import TaskConfig
from reasonrl.models import SMOLLM2_ID, load_model, load_tokenizer
from reasonrl.rollout import HFEngine
from reasonrl.tasks import arithmetic_task
from reasonrl.training.runtime import keep_freed_memory
from reasonrl.types import SamplingParams


def generated_tokens(rows: list[list[int]], eos_ids: frozenset[int]) -> int:
    total = 0
    for row in rows:
        ends = [i for i, token in enumerate(row) if token in eos_ids]
        total += ends[0] + 1 if ends else len(row)
    return total


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, 32 new tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.max_new_tokens = 1, 32

    keep_freed_memory()  # process-wide: both engines below run with the same allocator
    device = torch.device("cpu")
    tokenizer = load_tokenizer(SMOLLM2_ID)
    model = load_model(SMOLLM2_ID, dtype=torch.bfloat16, device=device).eval()
    engine = HFEngine(model, tokenizer)
    problems = arithmetic_task(train_size=args.prompts * args.repeats, test_size=0,
                               prompt_template=TaskConfig().prompt_template).train
    sampling = SamplingParams(n=args.group_size, temperature=0.7, max_new_tokens=args.max_new_tokens)
    unfused = HFEngine(model, tokenizer, fused=False)
    runs: dict[str, list[float]] = {"reasonrl": [], "reasonrl_unfused": [], "hf_generate": []}
    engine.generate(problems[:1], SamplingParams(n=2, max_new_tokens=4))  # warm-up
    for repeat in range(args.repeats):
        batch = problems[repeat * args.prompts : (repeat + 1) * args.prompts]
        for name, ours in (("reasonrl", engine), ("reasonrl_unfused", unfused)):
            start = time.perf_counter()
            groups = ours.generate(batch, replace(sampling, seed=repeat))
            seconds = time.perf_counter() - start
            runs[name].append(sum(len(c.token_ids) for g in groups for c in g.completions) / seconds)

        prompts = [engine.prompt_ids(p) for p in batch]
        width = max(map(len, prompts))
        input_ids = torch.tensor([[engine.pad_id] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        torch.manual_seed(repeat)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=0.7,
                                 top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens,
                                 num_return_sequences=args.group_size, pad_token_id=engine.pad_id)
        seconds = time.perf_counter() - start
        runs["hf_generate"].append(generated_tokens(out[:, width:].tolist(), engine.eos_ids) / seconds)
        print(f"repeat {repeat}: " + ", ".join(f"{name} {v[-1]:.0f} tok/s" for name, v in runs.items()), flush=True)

    params = sum(p.numel() for p in model.parameters())
    peak = matmul_peak_gflops(torch.bfloat16)
    summary = {name: {"tokens_per_s_median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
               for name, v in runs.items()}
    ours = summary["reasonrl"]["tokens_per_s_median"]
    report = {
        "settings": {**vars(args), "temperature": 0.7, "dtype": "bfloat16", "batch": args.prompts * args.group_size},
        **summary,
        "ratio_reasonrl_over_generate": ours / summary["hf_generate"]["tokens_per_s_median"],
        "ratio_fused_over_unfused": ours / summary["reasonrl_unfused"]["tokens_per_s_median"],
        "target_ratio": 4.0,
        # Roofline: each generated token costs ~2 * params FLOPs; at the measured matmul peak the
        # engine could reach peak / (2 * params) tokens/s if decoding were compute-bound.
        "matmul_peak_gflops_bf16": peak,
        "compute_bound_tokens_per_s": peak * 1e9 / (2 * params),
        "fraction_of_compute_roofline": ours / (peak * 1e9 / (2 * params)),
        "peak_rss_mb": peak_rss_mb(),
        "machine": machine(),
    }
    write_report("rollout", report)
    return report


if __name__ == "__main__":
    main()
