"""Handing freed memory back to the system (glibc's malloc_trim; nothing elsewhere).

Loading builds the reference table from thousands of small per-piece arrays and then joins them
into a few big ones. glibc keeps freed memory in its heaps, where the small pieces cannot be
reused for the big arrays, so without a trim the peak would hold both.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def give_back_freed_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
