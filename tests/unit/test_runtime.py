"""keep_freed_memory: a freed large block is reused without page-faulting it back in.

Measured in a fresh interpreter that has imported the training loop, as a training process has
when it applies the settings: how the heap has grown so far decides when glibc reaches its steady
state (in an interpreter that has imported torch alone, the block faults again in about half of
the runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import glibc_only

FAULTS_OF_A_REALLOCATED_BLOCK = """
import resource, sys, torch
import reasonrl.trainer  # what a training process has imported when it applies the settings
from reasonrl.training.runtime import keep_freed_memory
tuned = sys.argv[1] == "tuned"
assert not tuned or (keep_freed_memory() and keep_freed_memory())  # applied, and idempotent
size = 64 * 1024 * 1024 // 4  # 64 MB: above glibc's largest mmap threshold
for _ in range(3):  # allocated, touched, freed: the heap grows to hold the block
    torch.ones(size)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.ones(size)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, size * 4 // resource.getpagesize())
"""


def faults_and_pages(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", FAULTS_OF_A_REALLOCATED_BLOCK, mode], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


@glibc_only
def test_a_freed_block_is_reused_without_page_faults():
    faults, pages = faults_and_pages("default")
    assert faults >= pages // 2  # glibc's default unmaps the block: every page faults again
    faults, pages = faults_and_pages("tuned")
    assert faults < pages // 10, (faults, pages)


RSS_AFTER_RELEASE = """
import sys, torch
import reasonrl.trainer
from reasonrl.training.runtime import keep_freed_memory, keeps_freed_memory, release_freed_memory

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

assert keep_freed_memory() and keeps_freed_memory()
blocks = [torch.ones(16 * 2**20 // 4) for _ in range(8)]  # 128 MB in blocks of 16 MB, on the heap
del blocks
kept = rss_mb()
assert release_freed_memory()
print(kept, rss_mb())
"""


@glibc_only
def test_released_memory_leaves_the_process():
    kept, released = map(float, subprocess.run([sys.executable, "-c", RSS_AFTER_RELEASE], check=True,
                                               capture_output=True, text=True).stdout.split())
    assert kept - released > 100, (kept, released)  # most of the 128 MB the heap kept is handed back


MEMORY_AFTER_FREEING = """
import json, torch
from reasonrl.training.runtime import keep_freed_memory, memory_metrics
keep_freed_memory()
start = memory_metrics()
block = torch.ones(64 * 1024 * 1024)  # 256 MiB, touched
held = memory_metrics()
del block
freed = memory_metrics()
print(json.dumps([start, held, freed]))
"""


@glibc_only
def test_memory_metrics_tell_memory_kept_for_reuse_from_memory_in_use():
    """A 256 MiB tensor raises both the RSS and the heap in use by 0.25 GiB; once freed, the heap in use
    falls back while the RSS (freed memory kept, as a training process keeps it) does not: the two
    curves that tell a leak (both rising) from the allocator's reserve (RSS alone)."""
    import json

    start, held, freed = json.loads(subprocess.run([sys.executable, "-c", MEMORY_AFTER_FREEING], check=True,
                                                   capture_output=True, text=True).stdout)
    assert held["perf/heap_in_use_gb"] - start["perf/heap_in_use_gb"] == pytest.approx(0.25, abs=0.02)
    assert held["perf/rss_gb"] - start["perf/rss_gb"] == pytest.approx(0.25, abs=0.05)
    assert freed["perf/heap_in_use_gb"] - start["perf/heap_in_use_gb"] == pytest.approx(0.0, abs=0.02)
    assert freed["perf/rss_gb"] - start["perf/rss_gb"] == pytest.approx(0.25, abs=0.05)  # kept for reuse


KEPT_PAST_THE_BOUND = """
import json, resource, torch
import reasonrl.trainer
from reasonrl.training import runtime

def rss_gb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30

def made_and_freed(mib):  # touched blocks of 32 MiB, freed: the heap keeps them
    blocks = [torch.ones(32 * 2**20 // 4) for _ in range(mib // 32)]
    del blocks

runtime.KEPT_MEMORY_GROWTH = 512 * 2**20
bound = runtime.KeptMemoryBound()
seen = {"not_kept": bound.after_step()}  # freed memory not kept yet: nothing to bound
runtime.keep_freed_memory()
seen["reference"] = bound.after_step()  # the first step: the reference is taken
made_and_freed(256)
seen["under"] = bound.after_step()  # grown 256 MiB: under the bound
made_and_freed(1024)
seen["kept"] = rss_gb()
seen["released"] = bound.after_step()  # grown 1 GiB: past it
seen["after"] = rss_gb()
seen["new_reference"] = bound.after_step()  # the step after a release is the new reference
made_and_freed(256)
seen["under_again"] = bound.after_step()
print(json.dumps(seen))
"""


@glibc_only
def test_memory_kept_past_the_bound_is_given_back_and_not_before():
    import json

    seen = json.loads(subprocess.run([sys.executable, "-c", KEPT_PAST_THE_BOUND], check=True, capture_output=True,
                                     text=True).stdout)
    for under in ("not_kept", "reference", "under", "new_reference", "under_again"):
        assert seen[under] is None, (under, seen)
    assert seen["released"] > 0.8, seen  # most of the 1 GiB kept goes back to the system
    assert seen["kept"] - seen["after"] == pytest.approx(seen["released"], abs=0.05), seen
