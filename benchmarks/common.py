"""Shared by the benchmarks: what this machine can do (measured in the same run as the benchmark
that divides by it), and where results go."""

from __future__ import annotations

import json
import platform
import resource
import time
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


def machine() -> dict[str, object]:
    import transformers

    return {"threads": torch.get_num_threads(), "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__}


def write_report(name: str, report: dict) -> Path:
    """Write `report` to benchmarks/results/<name>.json and print its scalar entries."""
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if not isinstance(v, (dict, list))}, indent=2))
    return path
