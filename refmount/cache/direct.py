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


def _cachestat(fd: int, length: int) -> _Stat | None:
    """The page cache's count of the file's first `length` bytes, or None where the kernel cannot tell."""
    if _syscall is None:
        return None
    span, stat = _Range(0, length), _Stat()
    if _syscall(ctypes.c_long(_CACHESTAT), ctypes.c_long(fd), ctypes.byref(span), ctypes.byref(stat),
                ctypes.c_long(0)) != 0:
        return None  # (ENOSYS before 6.5)
    return stat


def cached(fd: int, length: int) -> bool:
    """Whether the page cache holds all `length` bytes of the file (from offset 0)."""
    stat = _cachestat(fd, length)
    return stat is not None and stat.nr_cache * mmap.PAGESIZE >= length


# Filesystems on a local block device: on a network or cluster filesystem (nfs, lustre, gpfs, cifs, fuse)
# O_DIRECT skips the client's cache and sends every re-read to the server, which is what a cache is for.
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "bcachefs", "jfs", "reiserfs"})


def filesystem_type(path: str) -> str | None:
    """The type of the filesystem `path` is on (/proc/self/mountinfo: the deepest mount point above it)."""
    path = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                within = path == point or path.startswith(point.rstrip("/") + "/")
                if within and len(point) >= len(best) and " - " in line:
                    best, kind = point, line.split(" - ", 1)[1].split()[0]
    except OSError:
        return None
    return kind


def suits(root: str) -> bool:
    """Whether block files under `root` are best read with O_DIRECT: the platform has it, the kernel can
    say what the page cache holds (cachestat: else a block written moments ago would be read from the
    disk), and the filesystem is on a local disk."""
    if not O_DIRECT or filesystem_type(root) not in LOCAL_FILESYSTEMS:
        return False
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _cachestat(fd, 1) is not None
    finally:
        os.close(fd)


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
