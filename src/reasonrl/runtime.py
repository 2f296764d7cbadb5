"""Process-wide settings that make PyTorch fast on CPUs.

glibc's malloc returns every large block (logits over a 49k vocabulary, activations, the KV
cache) to the kernel when it is freed, so the next step page-faults the same memory back in:
profiled on the default job, a third of some elementwise passes over the logits was page-fault
time. PyTorch's CPU guides recommend jemalloc or tcmalloc through LD_PRELOAD; the same effect is
available in-process from glibc itself by raising its mmap and trim thresholds, which needs no
extra library and no wrapper script.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_NEVER = -1  # for M_TRIM_THRESHOLD: never give the heap top back
_TOP_PAD = 256 * 1024 * 1024
_tuned = False


def keep_freed_memory() -> bool:
    """Let glibc keep freed blocks for reuse instead of unmapping them. True if applied (glibc
    only; elsewhere a no-op). Idempotent."""
    global _tuned
    if _tuned:
        return True
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    applied = all(mallopt(option, value) == 1 for option, value in (
        (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER), (_M_TOP_PAD, _TOP_PAD)))
    if not applied:
        logger.debug("mallopt refused the allocator settings; keeping the defaults")
    _tuned = applied
    return applied
