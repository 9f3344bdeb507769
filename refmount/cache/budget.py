"""One memory budget for the data path: cached blocks, bytes being fetched, and read-ahead.

Many open files must never multiply memory, so every byte the block cache keeps, and every byte a
fetch in flight is about to bring, is counted against one number (`--cache-size`). The block cache
evicts to keep cached + in flight within it, before a fetch starts; read-ahead of all streams
together may claim only a share of it (`prefetch_limit`), so that prefetched blocks do not evict
each other (or the blocks readers are using) before they are read.

Everything here runs on the trio thread.
"""

from __future__ import annotations

import trio


class MemoryBudget:
    def __init__(self, total: int, prefetch_share: float = 0.5) -> None:
        if total < 0:
            raise ValueError("the memory budget must be non-negative")
        self.total = total
        self.prefetch_limit = int(total * prefetch_share)
        self.cached = 0  # bytes of blocks the cache holds
        self.inflight = 0  # bytes that fetches under way may still bring
        self.ahead = 0  # bytes read-ahead has claimed (fetched or in flight, not yet read)
        self.prefetch_wasted = 0  # prefetched blocks evicted before anyone read them
        self.peak = 0
        self._freed: trio.Event | None = None  # set when in-flight bytes are given back

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
        return max(self.prefetch_limit - self.ahead, 0)

    def statistics(self) -> dict:
        return {"budget": self.total, "used": self.used, "cached": self.cached, "inflight": self.inflight,
                "prefetch_ahead": self.ahead, "prefetch_limit": self.prefetch_limit,
                "prefetch_wasted": self.prefetch_wasted, "peak": self.peak}
