"""Training throughput: one GRPO update of SmolLM2-135M-Instruct, against the machine's
measured bfloat16 matmul peak (model FLOPs utilisation, MFU).

The batch has the shape of the default job's: 4 prompts x 8 completions, prompts of ~55 tokens,
completions of 8-64 tokens. Useful FLOPs count the positions the update needs: each token prefix
that sequences share once (the learner shares a group's prompt among its samples), each other
completion token once, no padding: 6 x (non-embedding parameters) per position for the decoder's forward and backward,
6 x hidden x vocab per *loss* token for the LM head (only those need logits), plus causal
attention's 12 x layers x hidden per scored query-key pair. MFU = useful FLOPs / seconds / peak,
the peak being a 2048^3 bfloat16 matmul measured in the same run. Each micro-batch size runs
packed (`train.pack_sequences`, the default: no padding, shared prompts) and padded, with their
time ratio; the padded update computes every prompt once per sample and its padding, which the
useful FLOPs do not count. Then packed micro-batches filled up to `--micro-batch-positions` row
positions (`train.micro_batch_positions`, by default the config's default), as `reasonrl train`
cuts them.

    python -m benchmarks.train_step [--quick] [--repeats 3] [--micro-batch-sizes 8,32] [--micro-batch-positions 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import machine, matmul_peak_gflops, peak_rss_mb, write_report
from reasonrl.algo.aggregation import token_mean
from reasonrl.algo.objectives import ppo_clip
from reasonrl.config import TrainConfig
from reasonrl.models import SMOLLM2_ID, load_model
from reasonrl.training import recompute
from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss, make_train_batch
from reasonrl.training.packing import PackedRow
from reasonrl.training.runtime import keep_freed_memory
from reasonrl.types import Completion, Group, Problem, TrainBatch

PROMPT_TOKENS = 55


def synthetic_batch(prompts: int, group_size: int, seed: int = 0, completion_tokens: int | None = None) -> TrainBatch:
    """Random tokens: prompts of PROMPT_TOKENS, completions of `completion_tokens` each, or of 8-64."""
    generator = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(prompts):
        prompt = torch.randint(100, 40000, (PROMPT_TOKENS,), generator=generator).tolist()
        lengths = ([completion_tokens] * group_size if completion_tokens is not None
                   else torch.randint(8, 65, (group_size,), generator=generator).tolist())
        completions = tuple(Completion(token_ids=tuple(torch.randint(100, 40000, (n,), generator=generator).tolist()),
                                       text="", logprobs=(-1.0,) * n, finish_reason="stop") for n in lengths)
        groups.append(Group(problem=Problem(id="p", prompt="", answer=""), prompt_ids=tuple(prompt),
                            completions=completions))
    advantages = torch.randn(prompts * group_size, generator=generator).tolist()
    return make_train_batch(groups, advantages, pad_id=0)


def useful_flops(model, batch: TrainBatch) -> float:
    """The forward and backward FLOPs the update needs: every position of the packed row (each
    shared prefix once, each other token once, no padding), the LM head on loss
    tokens only, and causal attention (a segment attends to its ancestors and to itself)."""
    embedding = model.get_input_embeddings().weight.numel()
    decoder_params = sum(p.numel() for p in model.get_decoder().parameters()) - embedding
    return (6 * decoder_params * packed_positions(batch) + 6 * embedding * float(batch.loss_mask_NT.sum())
            + attention_flops(model, batch))


def attention_flops(model, batch: TrainBatch) -> float:
    """The causal attention's part of `useful_flops`: each segment of the packed row attends to its
    ancestors and to itself."""
    row = PackedRow.of(batch.attention_mask_NT, batch.input_ids_NT)
    sizes = row.bounds.diff().tolist()
    scored_keys = sum(n * (sum(sizes[a] for a in ancestors) + n / 2) for n, ancestors in zip(sizes, row.ancestors_of))
    return 12 * model.config.num_hidden_layers * model.config.hidden_size * scored_keys


def packed_positions(batch: TrainBatch) -> int:
    return PackedRow.of(batch.attention_mask_NT, batch.input_ids_NT).source_L.numel()


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, one micro-batch size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch-sizes", default="8,32")
    parser.add_argument("--micro-batch-positions", type=int, default=TrainConfig().micro_batch_positions)
    parser.add_argument("--gradient-checkpointing", default="auto", choices=recompute.MODES,
                        help="train.gradient_checkpointing; auto, the default, recomputes selectively in micro-batches "
                        "over --micro-batch-positions positions (here the padded ones of 32 sequences)")
    args = parser.parse_args()
    micro_batch_sizes = [int(x) for x in args.micro_batch_sizes.split(",")]
    if args.quick:
        args.repeats, micro_batch_sizes = 1, micro_batch_sizes[-1:]

    keep_freed_memory()  # as reasonrl's train() does
    model = load_model(SMOLLM2_ID, dtype=torch.float32, device=torch.device("cpu"))
    recompute.enable(model, args.gradient_checkpointing, args.micro_batch_positions)
    loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
    batch = synthetic_batch(args.prompts, args.group_size)
    flops = useful_flops(model, batch)
    peak_before = matmul_peak_gflops(torch.bfloat16)
    results = {}
    def learner(pack: bool, positions: int = 0) -> Learner:
        return Learner(model, OptimConfig(lr=1e-7), temperature=0.7, autocast_dtype=torch.bfloat16, pack=pack,
                       micro_batch_positions=positions)

    # Packed micro-batches (train.pack_sequences, the default) and padded ones of each size,
    # alternating per repetition so that drift of a shared machine and the allocator's state hit
    # both alike; then packed ones filled up to a number of positions, as `reasonrl train` cuts them.
    packed, padded = learner(True), learner(False)
    comparisons = [{f"packed_micro_batch_{micro}": (packed, micro), f"padded_micro_batch_{micro}": (padded, micro)}
                   for micro in micro_batch_sizes]
    if args.micro_batch_positions:
        comparisons.append({f"packed_micro_batch_positions_{args.micro_batch_positions}":
                            (learner(True, args.micro_batch_positions), TrainConfig().micro_batch_size)})
    for runs in comparisons:
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(2):  # warm-up: the allocator's heap grows to its working size, kernel caches fill
            for run_learner, micro in runs.values():
                run_learner.update(batch, loss, micro_batch_size=micro)
        for _ in range(args.repeats):
            for name, (run_learner, micro) in runs.items():
                start = time.perf_counter()
                run_learner.update(batch, loss, micro_batch_size=micro)
                seconds[name].append(time.perf_counter() - start)
        for name, (run_learner, micro) in runs.items():
            median = statistics.median(seconds[name])
            pack = run_learner.packs(model)
            chunks = run_learner.micro_batches(batch, torch.arange(batch.num_sequences), micro, pack)
            computed = sum(packed_positions(batch.select(c)) if pack else len(c) * int(batch.attention_mask_NT[c].sum(1).max())
                           for c in chunks)
            results[name] = {"seconds_median": median, "seconds": seconds[name], "micro_batches": len(chunks),
                             "token_positions_computed": computed, "achieved_gflops": flops / median / 1e9}
            print(f"{name}: {median:.2f} s per update, {flops / median / 1e9:.0f} GFLOP/s", flush=True)
    # Measured on both sides of the updates, the higher taken: the ceiling must not sag with the machine's load.
    peak = max(peak_before, matmul_peak_gflops(torch.bfloat16))
    for name, result in results.items():
        result["mfu"] = result["achieved_gflops"] / peak
        print(f"{name}: MFU {result['mfu']:.1%} of {peak:.0f} GFLOP/s", flush=True)
    report = {
        "settings": {**vars(args), "dtype": "bfloat16 autocast, float32 weights"},
        "sequences": batch.num_sequences,
        "real_tokens": int(batch.attention_mask_NT.sum()),
        "packed_positions": packed_positions(batch),
        "token_positions_as_one_rectangle": batch.attention_mask_NT.numel(),
        "loss_tokens": int(batch.loss_mask_NT.sum()),
        "useful_tflops_per_update": flops / 1e12,
        "matmul_peak_gflops_bf16": peak,
        **results,
        "best_mfu": max(r["mfu"] for r in results.values()),
        "padded_over_packed_seconds": {micro: results[f"padded_micro_batch_{micro}"]["seconds_median"]
                                       / results[f"packed_micro_batch_{micro}"]["seconds_median"]
                                       for micro in micro_batch_sizes},
        "target_mfu": 0.5,
        "peak_rss_mb": peak_rss_mb(),
        "machine": machine(),
    }
    write_report("train_step", report)
    return report


if __name__ == "__main__":
    main()
