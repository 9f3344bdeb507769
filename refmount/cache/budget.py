"""The block cache's memory budget (cached blocks, bytes being fetched, and read-ahead), and the
decoders' scratch space: the parts of the daemon's memory target (cache/target.py) that are counted
byte by byte.

Many open files must never multiply memory, so every byte the block cache keeps, and every byte a
fetch in flight is about to bring, is counted against one number (`--cache-size`). The block cache
evicts to keep cached + in flight within it, before a fetch starts; read-ahead of all streams
together may claim only a share of it (`prefetch_limit`), so that prefetched blocks do not evict
each other (or the blocks readers are using) before they are read. That share shrinks as the whole
process nears its memory target (`pressure`, set by cache/governor.py).

Everything here runs on the trio thread.
"""

from __future__ import annotations

import trio

from refmount.cache.reservations import AheadBudget


class MemoryBudget:
    def __init__(self, total: int, prefetch_share: float = 0.5) -> None:
        if total < 0:
            raise ValueError("the memory budget must be non-negative")
        self.total = total
        self.prefetch_share = prefetch_share
        self.pressure = 0.0  # 0: memory to spare; 1: the process is at its target, read no more ahead
        self.cached = 0  # bytes of blocks the cache holds
        self.inflight = 0  # bytes that fetches under way may still bring
        # bytes read-ahead has claimed (fetched or in flight, not yet read), held as reservations
        self.reservations = AheadBudget(lambda: self.prefetch_limit)
        self.prefetch_wasted = 0  # prefetched blocks evicted before anyone read them
        self.peak = 0
        self._freed: trio.Event | None = None  # set when in-flight bytes are given back

    @property
    def prefetch_limit(self) -> int:
        return int(self.total * self.prefetch_share * (1.0 - self.pressure))

    @property
    def ahead(self) -> int:
        """Bytes read-ahead holds (read only: reservations change it, refmount/cache/reservations.py)."""
        return self.reservations.held

    @property
    def used(self) -> int:
        return self.cached + self.inflight

    async def start_fetch(self, nbytes: int) -> None:
        """Claim `nbytes` for a fetch, first waiting while other fetches hold what it needs (a
        fetch bigger than the whole budget goes alone)."""
        while self.inflight and self.inflight + nbytes > self.total:
            if self._freed is None:
                self._freed = trio.Event()
            await self._freed.wait()
        self.inflight += nbytes

    def end_fetch(self, nbytes: int) -> None:
        if nbytes:
            self.inflight -= nbytes
            if self._freed is not None:
                self._freed.set()
                self._freed = None

    def note_cached(self) -> None:
        self.peak = max(self.peak, self.inflight + self.cached)

    def prefetch_room(self) -> int:
        """Bytes read-ahead may still claim."""
        return self.reservations.room()

    def statistics(self) -> dict:
        return {"budget": self.total, "used": self.used, "cached": self.cached, "inflight": self.inflight,
                "prefetch_ahead": self.ahead, "prefetch_limit": self.prefetch_limit,
                "prefetch_wasted": self.prefetch_wasted, "peak": self.peak}


class ScratchLimiter:
    """Working memory of CPU work in worker threads (decoding chunks): at most `tasks` at once, and
    at most `limit` bytes of their estimated scratch space together; one bigger than the whole
    limit goes alone. More decodes at once than cores only add their buffers to the peak."""

    def __init__(self, limit: int, tasks: int) -> None:
        self.limit = limit
        self.tasks = max(1, tasks)
        self.in_use = 0
        self.running = 0
        self.peak = 0
        self._freed: trio.Event | None = None

    async def __call__(self, nbytes: int, work, *args):
        """`work(*args)` in a worker thread, once `nbytes` of scratch and a task slot are free."""
        while self.running >= self.tasks or (self.running and self.in_use + nbytes > self.limit):
            if self._freed is None:
                self._freed = trio.Event()
            await self._freed.wait()
        self.in_use += nbytes
        self.running += 1
        self.peak = max(self.peak, self.in_use)
        try:
            return await trio.to_thread.run_sync(work, *args)
        finally:
            self.in_use -= nbytes
            self.running -= 1
            if self._freed is not None:
                self._freed.set()
                self._freed = None

    def statistics(self) -> dict:
        return {"scratch_limit": self.limit, "scratch_in_use": self.in_use, "scratch_peak": self.peak,
                "decoding": self.running}


def _register_metrics() -> None:
    """The memory budget of fetched and read-ahead bytes (fetch/registry.py)."""
    from refmount.fetch.registry import at, register

    for key, kind, what in (("budget", "gauge", "The memory budget of blocks held and in flight."),
                            ("used", "gauge", "Bytes of the budget in use now."),
                            ("cached", "gauge", "Bytes of cached blocks."),
                            ("inflight", "gauge", "Bytes being fetched now."),
                            ("prefetch_ahead", "gauge", "Bytes read ahead of readers."),
                            ("peak", "gauge", "The most bytes of the budget ever in use.")):
        register(f"refmount_memory_{key}_bytes", kind, what, collect=at("memory", key), component="cache.budget")
    register("refmount_memory_prefetch_wasted_total", "counter", "Blocks read ahead and dropped unread.",
             collect=at("memory", "prefetch_wasted"), component="cache.budget")


_register_metrics()
