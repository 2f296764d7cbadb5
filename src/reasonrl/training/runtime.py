"""Process-wide settings that make PyTorch fast on CPUs.

glibc's malloc hands large blocks (logits over a 49k vocabulary, the 113 MB embedding gradient,
activations, the KV cache) back to the kernel when they are freed, so the next step page-faults
the same memory in again: one update of 8 sequences of SmolLM2-135M took ~300k minor faults and
2.5-2.7 s, against no faults and 1.9-2.0 s with freed memory kept. PyTorch's CPU performance
guides recommend jemalloc or tcmalloc through LD_PRELOAD for this; glibc itself does the same
when told not to use mmap and not to trim its heap, which needs no extra library and no wrapper
script. The cost is a higher peak RSS, as freed blocks stay with the process.

Kept without a bound, though, the heap grows step after step where tensors of uneven sizes (rollouts of
varying lengths) leave holes no later tensor fits: 40 steps of GRPO on arithmetic took the RSS from 4.1 to
9.4 GiB while live allocations went from 2.2 to 2.8 GiB. So `KeptMemoryBound` hands the free pages back after a
step once the memory kept (RSS beyond the heap in use) has grown 1 GiB past its level after the first step
(or the first step after the last release), at the price of one step's page faults.

All of this is glibc's: under another allocator loaded ahead of it (`reasonrl.allocator`, e.g. tcmalloc
through LD_PRELOAD, which keeps freed memory in size classes and needs neither), it does nothing.

`memory_metrics` reports, after each step, the RSS beside what live allocations hold of the heap
(`reasonrl.allocator.heap_in_use_bytes`), so that memory kept for reuse is told apart from a leak.
"""

from __future__ import annotations

import logging
import os

import torch

from reasonrl.allocator import c_library, heap_in_use_bytes, preloaded_allocator

logger = logging.getLogger(__name__)
GIB = 1024**3

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_NEVER = -1  # for M_TRIM_THRESHOLD: never give the heap top back
_TOP_PAD = 256 * 1024 * 1024
_tuned = False


def keep_freed_memory() -> bool:
    """Let glibc keep freed blocks for reuse instead of unmapping them. True if applied (glibc's malloc
    only; elsewhere, another allocator preloaded included, a no-op). Idempotent; it cannot be undone
    within the process."""
    global _tuned
    if _tuned:
        return True
    mallopt = getattr(c_library(), "mallopt", None)
    if mallopt is None or preloaded_allocator():
        return False
    applied = all(mallopt(option, value) == 1 for option, value in (
        (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER), (_M_TOP_PAD, _TOP_PAD)))
    if not applied:
        logger.debug("mallopt refused the allocator settings; keeping the defaults")
    _tuned = applied
    return applied


def keeps_freed_memory() -> bool:
    """Whether keep_freed_memory() is in force in this process."""
    return _tuned


def release_freed_memory() -> bool:
    """Hand the free pages of glibc's heap back to the system (malloc_trim), which keep_freed_memory
    otherwise holds on to. True if done (glibc only). Reusing them later costs a page fault each, so
    this is for points after which much memory was freed at once, such as a long micro-batch's
    backward."""
    trim = getattr(c_library(), "malloc_trim", None)
    if trim is None or preloaded_allocator():
        return False
    trim(0)
    return True


KEPT_MEMORY_GROWTH = GIB
"""How far (bytes) `KeptMemoryBound` lets the RSS grow past its reference before the free pages go back."""


class KeptMemoryBound:
    """With keep_freed_memory in force, gives the heap's free pages back (`release_freed_memory`) once the memory
    kept after a step (the RSS beyond what live allocations hold of the heap; the RSS alone where glibc cannot
    say what they hold) has grown more than `KEPT_MEMORY_GROWTH` past its reference: its level after the first
    step, and again after the first step that follows each release. A step's own tensors come back in the step
    after a release (each page at the cost of a fault), so the reference holds them, and what the bound catches
    is the growth beyond: holes no later tensor fits. Live memory that grows (longer completions, a generating
    thread's KV cache) does not count. Not glibc, or freed memory not kept: it does nothing."""

    def __init__(self) -> None:
        self.reference: int | None = None

    def after_step(self) -> float | None:
        """Call when a step's tensors are gone. Returns the GiB the RSS fell by if memory was given back, else None."""
        if not _tuned or (resident := _resident_bytes()) is None:
            return None
        kept = resident - (heap_in_use_bytes() or 0)
        if self.reference is None:
            self.reference = kept
            return None
        if kept <= self.reference + KEPT_MEMORY_GROWTH:
            return None
        release_freed_memory()
        self.reference = None
        return max(0.0, (resident - (_resident_bytes() or resident)) / GIB)


def _resident_bytes() -> int | None:
    """The process's resident memory now (Linux's /proc), None elsewhere."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def memory_metrics() -> dict[str, float]:
    """The trainer process's memory after a step, in GiB: `perf/rss_gb`, resident now; `perf/heap_in_use_gb`,
    what live allocations hold of the C heap, where tensors on a CPU live (under glibc's malloc or tcmalloc,
    which count it). With keep_freed_memory (glibc) or another allocator's free lists the RSS
    keeps what the heap has freed, so RSS rising while the heap in use stays flat is memory kept for
    reuse, and both rising step after step is a leak. Where this process uses a CUDA device,
    `perf/cuda_allocated_gb` and `perf/cuda_peak_gb` (PyTorch's allocator on the current device: held by
    tensors now, and the most since the start)."""
    metrics = {}
    for key, value in (("perf/rss_gb", _resident_bytes()), ("perf/heap_in_use_gb", heap_in_use_bytes())):
        if value is not None:
            metrics[key] = value / GIB
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["perf/cuda_allocated_gb"] = torch.cuda.memory_allocated() / GIB
        metrics["perf/cuda_peak_gb"] = torch.cuda.max_memory_allocated() / GIB
    return metrics
