"""Shared by the benchmarks: what this machine can do (measured in the same run as the benchmark
that divides by it), and where results go."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch


def matmul_peak_gflops(dtype: torch.dtype = torch.bfloat16, sizes: tuple[int, ...] = (2048, 3072, 4096),
                       repeats: int = 5) -> float:
    """The roofline's compute ceiling: the best GFLOP/s of large square matmuls over several sizes.

    The best over sizes and repeats, not one size's median: a single 2048 x 2048 product varied by
    25% between runs on a 2-core machine, and a ceiling that is too low flatters every utilisation.
    """
    best = 0.0
    for size in sizes:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        a @ b  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
    return best


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), or what platform reports elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, object]:
    """What a record ran on. The CPU is named with its vector units because machines of one name
    differ: on a CPU without AVX512-BF16 or AMX, bfloat16 matmuls are emulated and a benchmark that
    asks for them runs several times slower, and `dtype=auto` trains in float32 instead."""
    import transformers

    from reasonrl.models import has_fast_bf16

    return {"threads": torch.get_num_threads(), "machine": platform.machine(), "cpu": cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "fast_bf16": has_fast_bf16(torch.device("cpu")), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def write_report(name: str, report: dict) -> Path:
    """Write `report` to benchmarks/results/<name>.json and print its scalar entries."""
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, (dict, list))}, indent=2))
    return path


def pyplot():
    """matplotlib's pyplot drawing to files (the Agg backend), or None with a note when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot", file=sys.stderr)
        return None
    return plt


def code_version() -> str:
    """The commit the benchmark runs (git describe; '-dirty' when the tree has uncommitted changes);
    where the tree has no git history (a copy on another machine), $BENCHMARK_COMMIT, or 'unknown'."""
    git = subprocess.run(["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, check=False)
    if git.returncode == 0:
        return git.stdout.strip()
    return os.environ.get("BENCHMARK_COMMIT", "unknown")


def source_digest(root: Path = Path(__file__).parent.parent / "src" / "reasonrl") -> str:
    """The first 12 hex digits of a SHA-256 over the library's files (relative path and bytes, in
    path order; compiled caches left out): what a run trained with, whatever `code_version` says. A
    copy of the tree whose git history is stale (as a device's copy can be) names an older commit
    but not an older digest, so two records with the same digest ran the same library code."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


# Two-sided 95% quantiles of Student's t for 1..10 degrees of freedom (from the t table).
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t_quantile(df: int) -> float:
    """Student's t 0.975 quantile for `df` degrees of freedom (two-sided 95%)."""
    return _T_975[df - 1] if df <= len(_T_975) else 1.96 + 2.4 / df  # within 0.03 of the table beyond 10


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student-t interval of the mean of independent runs (seeds).

    With few runs the t quantile is large (4.3 for 3 runs): the interval says honestly how little
    three seeds pin down. One run has no interval: low and high are NaN, so that no comparison
    with them holds (a target or a claim is then undecided, never met by one seed)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def tiny_smollm2(directory: Path) -> Path:
    """For a benchmark's --smoke: a random 2-layer Llama with SmolLM2-135M-Instruct's tokenizer (and
    chat template), saved to `directory`: the study's code paths at a fraction of the cost."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from reasonrl.config import DEFAULT_MODEL
    from reasonrl.models import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def interval_verdict(low: float, high: float, threshold: float = 0.0) -> str:
    """A stated claim "the quantity exceeds `threshold`" against its interval: reproduced when the
    whole interval lies above it, contradicted when it lies below, else (NaN bounds included)
    inconclusive."""
    return "reproduced" if low > threshold else "contradicted" if high < threshold else "inconclusive"


def random_model(config, dtype: torch.dtype, device: torch.device):
    """A causal LM of `config`'s shape with random weights (seed 0), made where it runs: a 7B
    model never passes through host memory."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with device:
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def seconds_of(step, device: torch.device) -> float:
    """Wall seconds of `step()`, the device's queued work included (synchronised before and after)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start
