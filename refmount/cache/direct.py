"""Reading a disk-cache block file around the page cache (O_DIRECT), and asking whether it is there.

A block file read from the disk through the page cache costs the page cache's pages (allocated,
charged, later reclaimed) and a copy out of them, and keeps a second copy of bytes that the FUSE
file's own page cache holds: about 0.4 CPU-s per GB on this VM, against 0.1 with O_DIRECT, which
lands the disk's DMA in the caller's buffer (bench/NOTES.md). A file the page cache holds whole
already (written moments ago) is better copied from there: `cached` asks the kernel (cachestat(2),
Linux >= 6.5, which starts no I/O; preadv2's RWF_NOWAIT would start the read-ahead it declines to
wait for) and answers False where it cannot tell.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading

# O_DIRECT wants file offsets, lengths and buffers aligned to the device's logical block (512 or 4096)
ALIGN = 4096
O_DIRECT = getattr(os, "O_DIRECT", 0)
_CACHESTAT = 451  # the syscall's number (one for every architecture since 5.1's unified table)
_tails = threading.local()  # each worker thread's aligned buffer for the end of a file


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted",
                                                       "nr_recently_evicted")]


try:
    _syscall = ctypes.CDLL(None, use_errno=True).syscall
except (OSError, AttributeError):
    _syscall = None


def cached(fd: int, length: int) -> bool:
    """Whether the page cache holds all `length` bytes of the file (from offset 0)."""
    if _syscall is None:
        return False
    span, stat = _Range(0, length), _Stat()
    if _syscall(ctypes.c_long(_CACHESTAT), ctypes.c_long(fd), ctypes.byref(span), ctypes.byref(stat),
                ctypes.c_long(0)) != 0:
        return False  # (ENOSYS before 6.5)
    return stat.nr_cache * mmap.PAGESIZE >= length


def read_direct(fd: int, skip: int, data: memoryview, size: int) -> tuple[bytes, int]:
    """Read a file of `skip` header bytes then `size` data bytes (`fd` opened with O_DIRECT) into the
    page-aligned `data`: (the header, the data bytes read). The file's first `whole` bytes (a multiple
    of ALIGN: the header and most of the data) land in `data` itself, the rest in this thread's
    aligned tail buffer; the data then moves to the start of `data` (a memmove, cheaper than the page
    cache's copy) and the rest follows it."""
    whole = size - size % ALIGN
    rest = skip + size - whole  # (< ALIGN + skip)
    span = -(-rest // ALIGN) * ALIGN
    tail = getattr(_tails, "buffer", None)
    if tail is None or len(tail) < span:
        tail = _tails.buffer = mmap.mmap(-1, span)
    got = os.preadv(fd, [data[:whole], memoryview(tail)[:span]], 0) - skip
    if got != size:
        return bytes(skip), got  # (short: a header of zeros, which the caller's check fails)
    header = bytes(data[:skip])
    data[: whole - skip] = data[skip:whole]
    data[whole - skip :] = tail[:rest]
    return header, size
