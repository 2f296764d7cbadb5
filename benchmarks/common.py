"""Shared by the benchmarks: what this machine can do (measured in the same run as the benchmark
that divides by it), and where results go."""

from __future__ import annotations

import json
import platform
import resource
import time
from pathlib import Path

import torch


def matmul_peak_gflops(dtype: torch.dtype = torch.bfloat16, size: int = 2048, repeats: int = 10) -> float:
    """Best-of-`repeats` GFLOP/s of a large square matmul: the roofline's compute ceiling."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


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
