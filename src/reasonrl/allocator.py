"""Which malloc a process runs on, and where a better one for training on a CPU is installed.

Training on a CPU allocates and frees tensors of many sizes every step (activations of uneven
lengths, blocks of logits, gradients). glibc's malloc keeps them in one heap whose holes later tensors
do not fit, so its high-water mark rises above what is live; gperftools' tcmalloc keeps freed memory
in size classes and page-level spans instead, and Microsoft's mimalloc in pages of one size each.
Measured on one update of 2 x 4096 tokens (docs/benchmarks.md, "Another allocator: tcmalloc"): glibc
6.04 GB peak RSS at 67.7 s per update, tcmalloc 4.95 GB at 60.5 s; in another run glibc 5.88 GB at
69.6 s, mimalloc 5.04 GB at 62.9 s. tcmalloc comes first where the system has it (Debian's
libtcmalloc-minimal4); mimalloc, which pip installs (the `memory` extra's cmeel-mimalloc wheel), next.

A process cannot change its malloc once running: the allocator is loaded ahead of the C library
with LD_PRELOAD. `python -m reasonrl.allocator` prints the library to preload (the Makefile's `make
train` uses it); `preloaded_allocator()` tells a running process whether one is in force, so that
glibc-only tuning (`reasonrl.training.runtime`) stays out of its way. Both are written here because
no library of the field does either: PyTorch's guides name the allocators but leave finding and
detecting them to the user's shell.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import sys
import sysconfig
from pathlib import Path

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
def preloaded_allocator() -> str | None:
    """The file name of the library this process's malloc comes from when it is not the C library's own
    (an allocator loaded ahead of it, e.g. through LD_PRELOAD), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        process = ctypes.CDLL(None)
    except (OSError, TypeError):
        return None
    used, own = _address(process, "malloc"), _address(libc, "malloc")
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
    """A shared library a wheel installed under this environment's cmeel.prefix/lib (cmeel-mimalloc)."""
    found = sorted(Path(sysconfig.get_paths()["purelib"], "cmeel.prefix", "lib").glob(f"lib{name}.so*"))
    return str(found[0]) if found else None


def find_allocator(name: str) -> str | None:
    """The path (or loader name) of allocator `name` (a key of ALLOCATORS) on this machine, None if absent."""
    library = ALLOCATORS[name]
    return ctypes.util.find_library(library) or wheel_library(library)


def library_to_preload(choice: str = "auto") -> str | None:
    """What to put in LD_PRELOAD for `choice`: "auto", the first of ALLOCATORS found (None: none is, so
    glibc's); "glibc", None; an ALLOCATORS name, that one (ValueError if it is not installed)."""
    if choice == "glibc" or not sys.platform.startswith("linux"):
        return None
    if choice == "auto":
        return next((path for name in ALLOCATORS if (path := find_allocator(name))), None)
    if choice not in ALLOCATORS:
        raise ValueError(f"unknown allocator {choice!r}: one of auto, glibc, {', '.join(ALLOCATORS)}")
    if (path := find_allocator(choice)) is None:
        raise ValueError(f"{choice} is not installed: for tcmalloc, Debian's libtcmalloc-minimal4 "
                         "(apt install libtcmalloc-minimal4); for mimalloc, pip install cmeel-mimalloc")
    return path


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
