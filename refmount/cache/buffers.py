"""Buffers for what the caches keep: mappings of their own, outside glibc's heaps, reused.

Cached blocks and decoded chunks live for seconds to hours among buffers that live for a moment
(a decoder's output before its filter runs, a body being received). In glibc's heaps the long-lived
ones pin the heap around the holes the short-lived ones leave: under 32 random readers of the
decoded view 20-30 MiB of free heap memory could not be given back (bench/bench_memory.py). Given a
mapping each (glibc's mmap threshold), nothing is pinned, but every new buffer costs its page
faults: 6.5 million per GB read, 60% more CPU. So what the caches keep goes into slots taken from
this pool: mappings in size classes (at most 1/8 larger than asked), each reused by the next entry of
its class once the cache lets go of it, its pages already in memory. Short-lived buffers stay in the
heaps, which then hold only what is in use now.

- `keep(data)` -> a read-only view of a slot holding a copy of `data` (small data is returned as
  it is: a slot is at least a page and a mapping);
- `take(nbytes)` -> a writable view of a slot, for a fetch path to receive straight into (then
  `keep` of that view costs no copy; small ones on the heap, as `keep` leaves them);
- `release(view)` when a cache evicts the entry: its slot is reused once nobody holds a view of it
  any more (a reader's reply, a decoder's input), which the pool checks itself before reusing it,
  so a released slot never changes under a reader. A slot still in use when the pool looks is
  simply dropped, and unmapped by Python when its last view goes.

`footprint(view)` is the memory an entry holds (its slot's size): what the caches count.
Thread-safe (a fetch path may take slots in worker threads).

This is also what lets refmount's pyfuse3 build (.ci/pyfuse3/nogil.patch) hand a reply to the kernel
without the GIL, while fetch threads run Python and write into slots: the reply is `bytes` or a
read-only view of a slot that was whole when its entry was cached, and pyfuse3 holds a Py_buffer of
it for the whole writev, which is an export of the slot's mmap. A slot is written only by whoever
`take`s it, and `take` hands out only a fresh mapping or a free slot; a slot becomes free only in
`_sort_released`, only if `_exported` finds no view of it (resize() fails while one exists), and that
check runs under the lock that `take` holds too. `trim` closes free slots only. So no slot a reply
is being copied from is reused, written or unmapped until pyfuse3 releases its buffer.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
from collections import defaultdict
from functools import cache

MIN_POOLED = 16 << 10  # smaller data stays as it is (heap or pymalloc)
PAGE = mmap.PAGESIZE
# A fresh slot is about to be written whole (a body received into it, a chunk decoded into it): its
# pages are made at once (MADV_POPULATE_WRITE, Linux >= 5.14, in the calling thread with the GIL
# released: see _populate) rather than by one fault each during the write: about a third less CPU for
# them (0.5 -> 0.32 CPU-s per GB on this VM). Unlike MAP_POPULATE it holds the process's mmap lock
# only for reading, so the FUSE thread's replies (which pin pages of other slots) do not wait for it.
_POPULATE_WRITE = 23


def slot_size(nbytes: int) -> int:
    """The size class of `nbytes`: rounded up to an eighth of the power of two at or below it (and
    to whole pages), so a slot is at most 1/8 larger than asked."""
    step = _step(nbytes)
    return -(-nbytes // step) * step


def _step(nbytes: int) -> int:
    return max((1 << (max(nbytes, 1).bit_length() - 1)) // 8, PAGE)


@cache
def _madvise():
    """libc's madvise through ctypes, which calls it without the GIL (None where there is none)."""
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


def _populate(slot: mmap.mmap) -> bool:
    """Make a fresh slot's pages now (see _POPULATE_WRITE), without the GIL: `mmap.madvise` holds it
    for the whole call, about 0.3 ms per MiB here, so a fetch thread populating the slot it receives
    into stopped the FUSE thread's Python for as long (0.1 s of a 500-file scan's 0.5). False if the
    kernel would not (older than 5.14): the write faults the pages in instead."""
    madvise = _madvise()
    if madvise is None:
        try:
            slot.madvise(_POPULATE_WRITE)
        except (OSError, ValueError):
            return False
        return True
    export = ctypes.c_char.from_buffer(slot)
    address = ctypes.addressof(export)
    del export  # (a view of the slot while it lives: the export ends here)
    return madvise(address, len(slot), _POPULATE_WRITE) == 0


def _exported(slot: mmap.mmap) -> bool:
    """Whether some view of `slot` still exists (a mapping with views cannot be resized)."""
    try:
        slot.resize(len(slot))
    except BufferError:
        return True
    return False


class BufferPool:
    def __init__(self, keep_free: int = 16 << 20, min_pooled: int = MIN_POOLED) -> None:
        self.keep_free = keep_free  # free slots kept for reuse, bytes (more are unmapped)
        self.min_pooled = min_pooled
        self._free: dict[int, list[mmap.mmap]] = defaultdict(list)  # size -> slots ready for reuse
        self._released: dict[int, mmap.mmap] = {}  # id -> slot the caches let go of, maybe still viewed
        self._lock = threading.Lock()
        self.free_bytes = 0
        self.mapped = 0  # slots made
        self.reused = 0
        self.dropped_viewed = 0  # released slots still viewed when the pool looked (not reused)
        self.unmapped = 0  # released slots unmapped for want of room in the free list (keep_free)

    def take(self, nbytes: int) -> memoryview:
        """A writable buffer of exactly `nbytes` in a slot of this pool (a reused one if any), or on
        the heap if it is small, as `keep` leaves small data (a 5 KB chunk's body would cost a mapping,
        a populate call and 1.5x its size in pages, and count against vm.max_map_count)."""
        if nbytes < self.min_pooled:
            return memoryview(bytearray(nbytes))
        size = slot_size(nbytes)
        with self._lock:
            self._sort_released()
            slot = self._reusable(size)
        if slot is None:
            try:
                slot = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)  # (anonymous: Python adds MAP_ANONYMOUS)
            except OSError:  # out of mappings (vm.max_map_count) or memory: the heap it is
                return memoryview(bytearray(nbytes))
            self.mapped += 1
            _populate(slot)
        else:
            self.reused += 1
        return memoryview(slot)[:nbytes]

    def keep(self, data):
        """`data` as the caches should keep it: a read-only view of a slot holding it (a copy unless
        it is in one already), or `data` itself if it is small (or no mapping can be made)."""
        if isinstance(data, memoryview) and isinstance(data.obj, mmap.mmap):
            return data.toreadonly() if not data.readonly else data
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        if n < self.min_pooled:
            return data
        view = self.take(n)
        if not isinstance(view.obj, mmap.mmap):
            return data
        view[:] = data if not isinstance(data, memoryview) else data.cast("B")
        return view.toreadonly()

    def release(self, view) -> None:
        """The cache no longer holds this entry: its slot may be reused once unviewed."""
        slot = view.obj if isinstance(view, memoryview) else None
        if isinstance(slot, mmap.mmap):
            with self._lock:
                self._released[id(slot)] = slot  # (once, however many entries shared it)

    @staticmethod
    def footprint(data) -> int:
        """The memory an entry holds: its slot's size, or its own length."""
        if isinstance(data, memoryview):
            return len(data.obj) if isinstance(data.obj, mmap.mmap) else data.nbytes
        return len(data)

    def _sort_released(self) -> None:
        """Released slots nobody views any more become free ones (under the lock)."""
        if self._released:
            released, self._released = self._released, {}
            for slot in released.values():
                if _exported(slot):
                    self.dropped_viewed += 1
                    continue  # a reader still has it: dropped here, unmapped when the reader lets go
                if self.free_bytes + len(slot) <= self.keep_free:
                    self._free[len(slot)].append(slot)
                    self.free_bytes += len(slot)
                else:
                    slot.close()
                    self.unmapped += 1

    def _reusable(self, size: int) -> mmap.mmap | None:
        """A free slot of `size` (under the lock)."""
        # this size, or a little bigger (up to 3 classes up: at most 1.4x) rather than fresh pages
        for bigger in range(size, size + 4 * _step(size), _step(size)):
            free = self._free.get(bigger)
            if free:
                slot = free.pop()
                self.free_bytes -= bigger
                return slot
        return None

    def trim(self) -> None:
        """Unmap every free slot (the memory governor, when the process nears its target)."""
        with self._lock:
            self._sort_released()
            for slots in self._free.values():
                for slot in slots:
                    slot.close()
            self._free.clear()
            self.free_bytes = 0

    def statistics(self) -> dict:
        return {"pool_free_bytes": self.free_bytes, "pool_slots_made": self.mapped, "pool_reused": self.reused,
                "pool_dropped_viewed": self.dropped_viewed, "pool_unmapped": self.unmapped}
