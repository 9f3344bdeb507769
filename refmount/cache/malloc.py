"""glibc's malloc, set up for a long-lived daemon of many threads (nothing elsewhere).

Measured under 32 random readers of the decoded view (bench/bench_memory.py, issue 25): with 96 MiB
of caches the daemon peaked at 349 MiB, of which 115-150 MiB were free memory glibc kept, in one
heap (arena) per thread that ever allocated, up to 8 per core: 16 heaps here, each keeping its own
free memory. `configure_malloc` caps them at two (349 -> 249 MiB); the rest of that free memory
came from cached buffers pinning the heaps around short-lived ones, which cache/buffers.py keeps
out of the heaps altogether. (A fixed mmap threshold, every buffer of 128 KiB or more a mapping of
its own, also brought the peak to 171 MiB, but cost 60% more CPU in page faults: not used.)

`give_back_freed_memory` (malloc_trim) returns what free memory the heaps still hold: after a load
builds the reference table from thousands of small arrays and joins them into a few big ones, and
when the memory governor (cache/governor.py) finds the process near its target.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache

_M_ARENA_MAX = -8  # a mallopt parameter (malloc.h)
ARENAS = 2  # one for the daemon's own thread, one shared by every worker thread


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                       "fsmblks", "uordblks", "fordblks", "keepcost")]


@cache
def _libc():
    try:
        try:  # (glibc's name first: find_library runs `ldconfig -p` in a subprocess, 10-30 ms of a mount)
            libc = ctypes.CDLL("libc.so.6")
        except OSError:
            libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc_trim, libc.mallopt  # noqa: B018 - glibc only
    except (OSError, AttributeError):  # not glibc
        return None
    if hasattr(libc, "mallinfo2"):  # glibc >= 2.33
        libc.mallinfo2.restype = _MallInfo2
    return libc


def configure_malloc() -> bool:
    """Cap the heaps (see above). Call before threads start: a heap made already stays. False where
    this is not glibc, or REFMOUNT_MALLOC=glibc (benchmarks compare with glibc's own settings)."""
    libc = _libc()
    if libc is None or os.environ.get("REFMOUNT_MALLOC") == "glibc":
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, ARENAS))


def give_back_freed_memory() -> None:
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def malloc_statistics() -> dict:
    """What glibc holds: bytes in the heaps (in use and free) and in mappings of their own."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return {}
    info = libc.mallinfo2()
    return {"heap_bytes": info.arena, "heap_in_use": info.uordblks, "heap_free": info.fordblks,
            "mapped_bytes": info.hblkhd, "mapped_buffers": info.hblks}
