"""A bounded in-memory cache of fixed-size blocks of remote objects, with single-flight fetching.

The cache never knows about HTTP: it is built from a fetch function
``fetch(source, start, end) -> [bytes, ...]`` returning the range as pieces split at multiples of
the block size (shorter only at the end of the object), and a block size. Blocks are addressed by
(source, index), exact ranges (`read_exact`) by (source, start, end). A read of [start, end)
gathers its blocks, fetching the missing ones with one request per run of neighbouring blocks
(coalescing), each block fetched by exactly one task while others wait on it (single-flight). A
cache hit never waits behind an unrelated fetch.

Everything here runs on the trio thread, so plain dicts need no locks.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager

import trio


class _Flight:
    """One in-progress fetch of a run of blocks; waiters sleep on `done`."""

    __slots__ = ("done", "blocks", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.blocks: dict[int, bytes] = {}
        self.error: BaseException | None = None


class BlockCache:
    def __init__(self, fetch, *, block_size: int = 1 << 20, capacity: int = 512 << 20,
                 max_request: int = 16 << 20) -> None:
        if block_size <= 0 or capacity < 0:
            raise ValueError("block_size must be positive and capacity non-negative")
        self._fetch = fetch
        self.block_size = block_size
        self.capacity = capacity
        self.max_request_blocks = max(1, max_request // block_size)
        self._blocks: OrderedDict[tuple, bytes] = OrderedDict()
        self._bytes = 0
        self._inflight: dict[tuple, _Flight] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __repr__(self) -> str:
        return (f"<BlockCache block_size={self.block_size} {self._bytes}/{self.capacity} bytes, "
                f"{len(self._blocks)} blocks, hits={self.hits} misses={self.misses}>")

    def statistics(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "blocks": len(self._blocks), "bytes": self._bytes, "capacity": self.capacity,
                "inflight": len(self._inflight)}

    async def read(self, source, start: int, end: int) -> bytes:
        """Bytes [start, end) of `source`; shorter only if the object ends first."""
        if end <= start:
            return b""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        blocks = await self._gather(source, first, last)
        parts = []
        for index in range(first, last + 1):
            block = blocks.get(index, b"")
            lo = max(start - index * bs, 0)
            hi = min(end - index * bs, bs)
            parts.append(block[lo:hi])
            if len(block) < bs:  # the object ends in this block
                break
        return b"".join(parts) if len(parts) != 1 else parts[0]

    async def read_exact(self, source, start: int, end: int) -> bytes:
        """Bytes [start, end) as one request of their own rather than whole blocks (unless the blocks
        holding them are cached already): a random read of a small chunk must not pull in, and keep,
        a whole block around it. Cached and single-flight like blocks."""
        bs = self.block_size
        if all(self.cached(source, index) is not None for index in range(start // bs, (end - 1) // bs + 1)):
            return await self.read(source, start, end)
        key = (source, start, end)
        while True:
            data = self._blocks.get(key)
            if data is not None:
                self._blocks.move_to_end(key)
                self.hits += 1
                return data
            flight = self._inflight.get(key)
            if flight is None:
                break
            await flight.done.wait()
            if flight.error is not None and not isinstance(flight.error, trio.Cancelled):
                raise flight.error
            if key in flight.blocks:
                return flight.blocks[key]
        self.misses += 1
        with self._flight([key]) as flight:
            pieces = await self._fetch(source, start, end)
            data = flight.blocks[key] = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self._store(key, data)
        return data

    def cached(self, source, index: int) -> bytes | None:
        block = self._blocks.get((source, index))
        if block is not None:
            self._blocks.move_to_end((source, index))
        return block

    async def prefetch(self, source, first: int, last: int) -> None:
        """Fetch blocks [first, last] unless cached or in flight. Runs as a background task, so it
        must never raise: a failure here is retried (and reported) by the reader that needs it."""
        try:
            await self._gather(source, first, last, count=False)
        except Exception:  # noqa: BLE001
            pass

    async def _gather(self, source, first: int, last: int, count: bool = True) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        waits: list[tuple[int, _Flight]] = []
        missing: list[int] = []
        for index in range(first, last + 1):
            block = self.cached(source, index)
            if block is not None:
                found[index] = block
                if count:
                    self.hits += 1
                if len(block) < self.block_size:
                    break  # end of object: nothing exists beyond
                continue
            if count:
                self.misses += 1
            flight = self._inflight.get((source, index))
            if flight is not None:
                waits.append((index, flight))
            else:
                missing.append(index)
        if missing:
            runs = _runs(missing, self.max_request_blocks)
            if len(runs) == 1:
                found.update(await self._fetch_run(source, *runs[0]))
            else:
                async with trio.open_nursery() as nursery:
                    for run in runs:
                        nursery.start_soon(self._fetch_into, found, source, *run)
        for index, flight in waits:
            await flight.done.wait()
            if flight.error is not None:
                if isinstance(flight.error, trio.Cancelled):
                    # The fetching reader was interrupted; fetch it ourselves.
                    found.update(await self._gather(source, index, index, count=False))
                    continue
                raise flight.error
            if index in flight.blocks:
                found[index] = flight.blocks[index]
            else:  # the flight ended at the end of the object before this block
                found[index] = b""
        return found

    async def _fetch_into(self, found: dict, source, first: int, last: int) -> None:
        found.update(await self._fetch_run(source, first, last))

    async def _fetch_run(self, source, first: int, last: int) -> dict[int, bytes]:
        bs = self.block_size
        with self._flight([(source, i) for i in range(first, last + 1)]) as flight:
            for index, block in enumerate(await self._fetch(source, first * bs, (last + 1) * bs), first):
                flight.blocks[index] = block
                self._store((source, index), block)
                if len(block) < bs:
                    break
        return flight.blocks

    @contextmanager
    def _flight(self, keys: list):
        """One fetch for `keys`: waiters find it in `_inflight` until it ends, then see its blocks
        or its error."""
        flight = _Flight()
        for key in keys:
            self._inflight[key] = flight
        try:
            yield flight
        except BaseException as e:
            flight.error = e
            raise
        finally:
            for key in keys:
                self._inflight.pop(key, None)
            flight.done.set()

    def _store(self, key, block: bytes) -> None:
        if self.capacity == 0 or len(block) > self.capacity:
            return
        old = self._blocks.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._blocks[key] = block
        self._bytes += len(block)
        while self._bytes > self.capacity:
            _, evicted = self._blocks.popitem(last=False)
            self._bytes -= len(evicted)
            self.evictions += 1


def _runs(indexes: list[int], max_len: int) -> list[tuple[int, int]]:
    """Group sorted block indexes into (first, last) runs of neighbours, at most max_len long."""
    runs = []
    start = prev = indexes[0]
    for i in indexes[1:]:
        if i == prev + 1 and i - start < max_len:
            prev = i
            continue
        runs.append((start, prev))
        start = prev = i
    runs.append((start, prev))
    return runs
