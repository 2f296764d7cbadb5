"""What this machine can do, measured in the same run as the benchmark that divides by it."""

from __future__ import annotations

import platform
import resource
import time

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
