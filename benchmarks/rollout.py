"""Rollout throughput: reasonrl's hf engine (fused decoder, and the transformers forward) against
`model.generate`, same prompts, same run, with the machine's roofline.

Cases (`--cases`, batch x new tokens): 8 x 128 (one group of 8 samples of one arithmetic prompt),
32 x 128 (4 groups) and 8 x 1024 (one group decoded to 1024 tokens past its end-of-sequence
tokens: `SamplingParams.ignore_eos`, and `min_new_tokens` for `generate`), at temperature 0.7
from SmolLM2-135M-Instruct in bfloat16. Generated tokens count up to and including each
sequence's end-of-sequence token (what a trainer can use); `generate` keeps decoding padding for
finished rows until the longest ends, which is part of its cost. The engines alternate over
`--repeats` repetitions (`generate` runs once per case past 128 tokens: it is the slowest); the
JSON has medians, spreads, ratios and each target: batch 8 at least 250 tokens/s, batch 32 at
least 40% of the compute roofline (the measured bf16 matmul peak over 2 x parameters FLOPs per
token).

    python -m benchmarks.rollout [--quick] [--repeats 3] [--cases 8x128,32x128,8x1024]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from benchmarks.common import code_version, machine, matmul_peak_gflops, peak_rss_mb, write_report
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


def measure_case(model, tokenizer, batch: int, new_tokens: int, repeats: int, group_size: int = 8) -> dict:
    """Tokens/s of each engine on `batch` rows (groups of `group_size`) of `new_tokens` at most."""
    engine, unfused = HFEngine(model, tokenizer), HFEngine(model, tokenizer, fused=False)
    prompts_per_repeat = batch // group_size
    problems = arithmetic_task(train_size=prompts_per_repeat * repeats, test_size=0,
                               prompt_template=TaskConfig().prompt_template).train
    long = new_tokens > 128
    sampling = SamplingParams(n=group_size, temperature=0.7, max_new_tokens=new_tokens, ignore_eos=long)
    runs: dict[str, list[float]] = {"reasonrl": [], "reasonrl_unfused": [], "hf_generate": []}
    engine.generate(problems[:1], SamplingParams(n=2, max_new_tokens=4))  # warm-up
    for repeat in range(repeats):
        problem_batch = problems[repeat * prompts_per_repeat : (repeat + 1) * prompts_per_repeat]
        for name, ours in (("reasonrl", engine), ("reasonrl_unfused", unfused)):
            start = time.perf_counter()
            groups = ours.generate(problem_batch, replace(sampling, seed=repeat))
            seconds = time.perf_counter() - start
            runs[name].append(sum(len(c.token_ids) for g in groups for c in g.completions) / seconds)
        if long and repeat > 0:
            continue
        prompts = [engine.prompt_ids(p) for p in problem_batch]
        width = max(map(len, prompts))
        input_ids = torch.tensor([[engine.pad_id] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        torch.manual_seed(repeat)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=0.7,
                                 top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens if long else 0, num_return_sequences=group_size,
                                 pad_token_id=engine.pad_id)
        seconds = time.perf_counter() - start
        eos = frozenset() if long else engine.eos_ids
        runs["hf_generate"].append(generated_tokens(out[:, width:].tolist(), eos) / seconds)
        print(f"{batch}x{new_tokens} repeat {repeat}: " + ", ".join(f"{name} {v[-1]:.0f} tok/s"
                                                                 for name, v in runs.items() if v), flush=True)
    summary = {name: {"tokens_per_s_median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
               for name, v in runs.items()}
    ours = summary["reasonrl"]["tokens_per_s_median"]
    return {**summary, "ratio_reasonrl_over_generate": ours / summary["hf_generate"]["tokens_per_s_median"],
            "ratio_fused_over_unfused": ours / summary["reasonrl_unfused"]["tokens_per_s_median"]}


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, cases 8x32 and 32x32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="8x128,32x128,8x1024", help="batch x new tokens, comma-separated")
    args = parser.parse_args()
    cases = [tuple(map(int, case.split("x"))) for case in ("8x32,32x32" if args.quick else args.cases).split(",")]
    repeats = 1 if args.quick else args.repeats

    keep_freed_memory()  # process-wide: every engine below runs with the same allocator
    tokenizer = load_tokenizer(SMOLLM2_ID)
    model = load_model(SMOLLM2_ID, dtype=torch.bfloat16, device=torch.device("cpu")).eval()
    params = sum(p.numel() for p in model.parameters())
    peak = matmul_peak_gflops(torch.bfloat16)
    # Roofline: each generated token costs ~2 * params FLOPs; at the measured matmul peak the
    # engine could reach peak / (2 * params) tokens/s if decoding were compute-bound.
    compute_bound = peak * 1e9 / (2 * params)
    results, targets = {}, {}
    for batch, new_tokens in cases:
        name = f"batch{batch}_tokens{new_tokens}"
        results[name] = measure_case(model, tokenizer, batch, new_tokens, repeats)
        ours = results[name]["reasonrl"]["tokens_per_s_median"]
        results[name]["fraction_of_compute_roofline"] = ours / compute_bound
        if batch == 8:
            targets[name] = {"target": ">= 250 tokens/s", "measured": round(ours, 1), "met": ours >= 250}
        elif batch == 32:
            targets[name] = {"target": ">= 0.40 of the compute roofline", "measured": round(ours / compute_bound, 3),
                             "met": ours / compute_bound >= 0.40}
    report = {"settings": {"cases": [f"{b}x{t}" for b, t in cases], "repeats": repeats, "temperature": 0.7,
                           "dtype": "bfloat16", "group_size": 8},
              "targets": targets, **results,
              "matmul_peak_gflops_bf16": peak, "compute_bound_tokens_per_s": compute_bound,
              "peak_rss_mb": peak_rss_mb(), "commit": code_version(), "machine": machine()}
    write_report("rollout_quick" if args.quick else "rollout", report)
    return report


if __name__ == "__main__":
    main()
