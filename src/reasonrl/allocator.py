"""Which malloc a process runs on, and where a better one for training on a CPU is installed.

Training on a CPU allocates and frees tensors of many sizes every step (activations of uneven
lengths, blocks of logits, gradients). glibc's malloc keeps them in one heap whose holes later tensors
do not fit, so its high-water mark rises above what is live; gperftools' tcmalloc keeps freed memory
in size classes and page-level spans instead, and Microsoft's mimalloc in pages of one size each.
Measured on one update of 2 x 4096 tokens (docs/benchmarks.md, "Another allocator: tcmalloc"): glibc
6.04 GiB peak RSS at 67.7 s per update, tcmalloc 4.95 GiB at 60.5 s; in another run glibc 5.88 GiB at
69.6 s, mimalloc 5.04 GiB at 62.9 s. tcmalloc comes first where the system has it (Debian's
libtcmalloc-minimal4); mimalloc, which pip installs (the `memory` extra's cmeel-mimalloc wheel), next.

A process cannot change its malloc once running: the allocator is loaded ahead of the C library
with LD_PRELOAD. `python -m reasonrl.allocator` prints the library to preload (the Makefile's `make
train` uses it); `preloaded_allocator()` tells a running process whether one is in force, so that
glibc-only tuning (`reasonrl.training.runtime`) stays out of its way, and `heap_in_use_bytes()` reads what
live allocations hold from glibc's or tcmalloc's own count. They are written here because no
library of the field does them: PyTorch's guides name the allocators but leave finding, detecting and
reading them to the user's shell.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import platform
import sys
import sysconfig
from pathlib import Path
from typing import Any

ALLOCATORS = {"tcmalloc": "tcmalloc_minimal", "mimalloc": "mimalloc"}
"""Allocators to preload, best first: name -> the library's name without lib- and .so (tcmalloc's minimal
build, Debian's libtcmalloc-minimal4; mimalloc, the system's or the cmeel-mimalloc wheel's)."""


class _DlInfo(ctypes.Structure):
    """dladdr's `Dl_info`: the object file that holds an address."""

    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _address(library: ctypes.CDLL, symbol: str) -> int | None:
    function = getattr(library, symbol, None)
    return None if function is None else ctypes.cast(function, ctypes.c_void_p).value


@functools.cache
def c_library() -> ctypes.CDLL | None:
    """The C library itself (not the process's global namespace, where a preloaded allocator's symbols come
    first), loaded once: find_library runs ldconfig, too slow to repeat. None where it cannot be found."""
    name = ctypes.util.find_library("c") or ("libc.so.6" if platform.libc_ver()[0] == "glibc" else None)
    if name is None:  # ctypes.CDLL(None) would be the global namespace: no way to tell the two apart
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


@functools.cache
def preloaded_allocator() -> str | None:
    """The file name of the library this process's malloc comes from when it is not the C library's own
    (an allocator loaded ahead of it, e.g. through LD_PRELOAD; also a wrapper that interposes malloc, such
    as a memory profiler's), else None; "unknown" where the C library cannot be found to compare with."""
    libc = c_library()
    if libc is None:
        return "unknown"
    used, own = _address(ctypes.CDLL(None), "malloc"), _address(libc, "malloc")
    if used is None or own is None or used == own:
        return None
    dladdr = getattr(libc, "dladdr", None)  # in glibc's libc since 2.34; in libdl before
    if dladdr is None and (libdl := ctypes.util.find_library("dl")):
        dladdr = getattr(ctypes.CDLL(libdl), "dladdr", None)
    info = _DlInfo()
    if dladdr is None or not dladdr(ctypes.c_void_p(used), ctypes.byref(info)) or not info.dli_fname:
        return "unknown"
    return Path(info.dli_fname.decode(errors="replace")).name


def wheel_library(name: str) -> str | None:
    """A shared library a wheel installed under this environment's cmeel.prefix/lib (cmeel-mimalloc; the
    wheel is not pure, so it lands in platlib, which some systems keep apart from purelib)."""
    paths = sysconfig.get_paths()
    for root in dict.fromkeys((paths["platlib"], paths["purelib"])):
        if found := sorted(Path(root, "cmeel.prefix", "lib").glob(f"lib{name}.so*")):
            return str(found[0])
    return None


def find_library(library: str) -> str | None:
    """The loader name of the system's `library` (its name without lib- and .so), else the path of a
    wheel's copy of it (`wheel_library`), None if neither is installed."""
    return ctypes.util.find_library(library) or wheel_library(library)


def find_allocator(name: str) -> str | None:
    """The path (or loader name) of allocator `name` (a key of ALLOCATORS) on this machine, None if absent."""
    return find_library(ALLOCATORS[name])


def _preloadable(path: str) -> bool:
    """ld.so splits LD_PRELOAD at spaces and colons: a path holding either cannot be preloaded."""
    return not any(separator in path for separator in " \t:")


def library_to_preload(choice: str = "auto") -> str | None:
    """What to put in LD_PRELOAD for `choice`: "auto", the first of ALLOCATORS found, or None where none is,
    off Linux, or where malloc is already another library's (what the caller preloaded stands); "glibc",
    None; an ALLOCATORS name, that one (ValueError if it is not installed or its path cannot be preloaded)."""
    if choice not in ("auto", "glibc", *ALLOCATORS):
        raise ValueError(f"unknown allocator {choice!r}: one of auto, glibc, {', '.join(ALLOCATORS)}")
    if choice == "glibc" or not sys.platform.startswith("linux"):
        return None
    if choice == "auto":
        if preloaded_allocator() is not None:
            return None
        return next((path for name in ALLOCATORS if (path := find_allocator(name)) and _preloadable(path)), None)
    if (path := find_allocator(choice)) is None:
        raise ValueError(f"{choice} is not installed: for tcmalloc, Debian's libtcmalloc-minimal4 "
                         "(apt install libtcmalloc-minimal4); for mimalloc, pip install cmeel-mimalloc")
    if not _preloadable(path):
        raise ValueError(f"{choice} is at {path!r}, which LD_PRELOAD cannot hold (it splits at spaces and "
                         "colons): install it where the path has neither")
    return path


class _MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (glibc >= 2.33): the C heap's totals, in bytes."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _mallinfo2() -> Any:
    """glibc's mallinfo2, set up once to return its struct; None where the C library is not glibc >= 2.33."""
    mallinfo2 = getattr(c_library(), "mallinfo2", None)
    if mallinfo2 is not None:
        mallinfo2.restype = _MallInfo2
    return mallinfo2


@functools.cache
def _tcmalloc_property() -> Any:
    """gperftools' MallocExtension_GetNumericProperty, from the preloaded tcmalloc; None where malloc is not its."""
    if not (preloaded_allocator() or "").startswith("libtcmalloc"):
        return None
    getter = getattr(ctypes.CDLL(None), "MallocExtension_GetNumericProperty", None)
    if getter is not None:
        getter.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
        getter.restype = ctypes.c_int
    return getter


def heap_in_use_bytes() -> int | None:
    """What live allocations hold of the C heap, as the allocator serving malloc counts it: glibc's blocks in
    its arenas plus those mapped on their own (mallinfo2, glibc >= 2.33), or tcmalloc's
    `generic.current_allocated_bytes`. None under any other allocator (mimalloc's process info gives the
    memory it has committed, not what live allocations hold) or C library."""
    if preloaded_allocator() is None:
        if (mallinfo2 := _mallinfo2()) is None:
            return None
        info = mallinfo2()
        return info.uordblks + info.hblkhd
    if (getter := _tcmalloc_property()) is None:
        return None
    value = ctypes.c_size_t()
    return value.value if getter(b"generic.current_allocated_bytes", ctypes.byref(value)) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.allocator",
        description="Print the allocator library to preload for training on a CPU (empty: glibc's malloc), "
                    "e.g. LD_PRELOAD=\"$(python -m reasonrl.allocator)\" reasonrl train")
    parser.add_argument("choice", nargs="?", default="auto", help="auto (default), glibc, " + ", ".join(ALLOCATORS))
    args = parser.parse_args(argv)
    try:
        print(library_to_preload(args.choice) or "")
    except ValueError as error:
        print(f"reasonrl.allocator: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
