"""A bounded in-memory cache of fixed-size blocks of remote objects, with single-flight fetching.

The cache never knows about HTTP: it is built from a fetch function
``fetch(source, start, end) -> [bytes, ...]`` returning the range as pieces split at multiples of
the block size (shorter only at the end of the object), and a block size. Blocks are addressed by
(source, index), exact ranges (`read_exact`) by (source, start, end). A read of [start, end)
gathers its blocks, fetching the missing ones with one request per run of neighbouring blocks
(coalescing), each block fetched by exactly one task while others wait on it (single-flight): a
reader whose blocks lie inside a bigger request under way (a read-ahead part) waits for that
request instead of issuing its own. A cache hit never waits behind an unrelated fetch.

The block size is the unit of caching only; how much one request asks for is up to the caller
(read-ahead asks for parts of many blocks, and may ask for a part as several ranges at once).
Memory is counted in a `MemoryBudget` shared with the read-ahead: room for a fetch is made (by
eviction) before it starts, so cached plus in-flight bytes stay within the budget. Prefetched
blocks evicted before anyone read them are counted as wasted and reported to
`on_wasted(source, index)` (the read-ahead stops the stream that asked for them).

Everything here runs on the trio thread, so plain dicts need no locks.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from contextlib import asynccontextmanager

import trio

from refmount.cache.budget import MemoryBudget
from refmount.cache.buffers import BufferPool
from refmount.errors import FetchError


class _Flight:
    """One in-progress fetch of a run of blocks; waiters sleep on `done`."""

    __slots__ = ("done", "blocks", "error", "reserved")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.blocks: dict = {}
        self.error: BaseException | None = None
        self.reserved = 0  # budget bytes held for what it may still bring


class BlockCache:
    def __init__(self, fetch, *, block_size: int = 1 << 20, capacity: int = 512 << 20,
                 max_request: int = 16 << 20, budget: MemoryBudget | None = None, pacer=None,
                 pool: BufferPool | None = None) -> None:
        if block_size <= 0 or capacity < 0:
            raise ValueError("block_size must be positive and capacity non-negative")
        self._fetch = fetch
        self.block_size = block_size
        self.budget = budget or MemoryBudget(capacity)
        self.pacer = pacer  # paces read-ahead requests per host (refmount.cache.pacer), or None
        self.pool = pool  # where kept blocks live (refmount.cache.buffers), or None: as fetched
        self.max_request_blocks = max(1, max_request // block_size)
        self._blocks: OrderedDict[tuple, bytes] = OrderedDict()
        self._inflight: dict[tuple, _Flight] = {}
        self._unread: set[tuple] = set()  # prefetched blocks nobody has read yet
        # blocks of read-ahead parts not yet started -> (the part's last block, the ranges it is asked in)
        self._queued: dict[tuple, tuple] = {}
        self._pending: dict = {}  # source -> heap of its read-ahead parts waiting for a pacer slot
        self.on_wasted = None  # called with (source, index) when an unread prefetched block is evicted
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.dropped_read = 0  # blocks let go of once a sequential reader had read past them (drop_read)
        # read-ahead blocks stored, and those read before eviction (the wasted ones: budget.prefetch_wasted)
        self.prefetched = self.prefetched_bytes = 0
        self.prefetch_used = self.prefetch_used_bytes = 0
        self.prefetch_wasted_bytes = 0

    @property
    def capacity(self) -> int:
        return self.budget.total

    def __repr__(self) -> str:
        return (f"<BlockCache block_size={self.block_size} {self.budget.cached}/{self.capacity} bytes, "
                f"{len(self._blocks)} blocks, hits={self.hits} misses={self.misses}>")

    def resize(self, capacity: int) -> None:
        """A new budget (the memory governor shrinks it under pressure); evicts down to it now."""
        self.budget.total = max(capacity, 0)
        self._evict()

    def statistics(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "dropped_read": self.dropped_read,
                "blocks": len(self._blocks), "bytes": self.budget.cached, "capacity": self.capacity,
                "inflight": len(set(map(id, self._inflight.values())))}

    async def read(self, source, start: int, end: int):
        """Bytes [start, end) of `source`; shorter only if the object ends first. A slice of one
        block comes back as a memoryview of it (no copy); a read across blocks is joined."""
        if end <= start:
            return b""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        if first == last:
            block = self.cached(source, first)
            if block is not None:  # the common case: no task, no dict
                self.hits += 1
            else:
                block = (await self._gather(source, first, first)).get(first, b"")
            lo = start - first * bs
            if lo == 0 and end - start >= len(block):
                return block
            return memoryview(block)[lo : end - first * bs]
        blocks = await self._gather(source, first, last)
        parts = []
        for index in range(first, last + 1):
            block = blocks.get(index, b"")
            lo = max(start - index * bs, 0)
            hi = min(end - index * bs, bs)
            parts.append(memoryview(block)[lo:hi])
            if len(block) < bs:  # the object ends in this block
                break
        return b"".join(parts)

    async def read_exact(self, source, start: int, end: int):
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
        async with self._flight([key], end - start) as flight:
            began = trio.current_time()
            pieces = await self._fetch(source, start, end)
            self._landed(flight)
            if self.pacer is not None:
                self.pacer.observe(source, began, sum(map(len, pieces)))
            data = self._keep(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            flight.blocks[key] = data
            self._store(key, data)
        return data

    def fetch_exact_ahead(self, source, groups: list[list[tuple[int, int]]]) -> None:
        """Fetch exact ranges ahead of their readers (the chunk-grid read-ahead, view/gridahead.py)
        in the background: each group [(start, end), ...] of `source` as one request spanning it,
        paced as read-ahead parts are. Each range is kept as `read_exact` keeps it, so its reader
        finds it, or waits for it, under the same key. Ranges cached or in flight are left out."""
        for group in groups:
            keys = [(source, start, end) for start, end in group
                    if (source, start, end) not in self._blocks and (source, start, end) not in self._inflight]
            if not keys:
                continue
            flight = _Flight()
            for key in keys:
                self._inflight[key] = flight
            trio.lowlevel.spawn_system_task(self._fetch_exact_group, source, keys, flight)

    async def _fetch_exact_group(self, source, keys: list[tuple], flight: _Flight) -> None:
        # A failure leaves the flight without the ranges: its waiters then fetch them themselves
        # (and report what goes wrong), as a failed read-ahead part leaves its blocks to readers.
        start, end = keys[0][1], keys[-1][2]
        ticket = None
        try:
            if self.pacer is not None:
                ticket = await self.pacer.acquire(source, exact=True)
            await self.budget.start_fetch(end - start)
            flight.reserved = end - start
            self._evict()
            self.budget.note_cached()
            pieces = await self._fetch(source, start, end)
            data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self._landed(flight)
            if ticket is not None:
                ticket.nbytes = len(data)
            view = memoryview(data)
            for key in keys:
                lo, hi = key[1] - start, key[2] - start
                if hi > len(data):
                    break  # the object ends first: its reader finds out (PastEnd)
                kept = self._keep(bytes(view[lo:hi]))  # (own copies: each range is evicted on its own)
                flight.blocks[key] = kept
                self._store(key, kept)
            view.release()
            if self.pool is not None:
                self.pool.release(data)  # (the request's own buffer: its slot may be reused)
        except Exception:  # noqa: BLE001 - the readers of these ranges retry and report
            pass
        finally:
            self._landed(flight)
            if ticket is not None:
                self.pacer.release(ticket)
            for key in keys:
                if self._inflight.get(key) is flight:
                    del self._inflight[key]
            flight.done.set()

    def put(self, source, index: int, block) -> bool:
        """Keep block `index` of `source` that came by some other way (a whole-object pass over an
        object whose server ignores Range: cache/passing.py), unless it is cached or being fetched."""
        key = (source, index)
        if key in self._blocks or key in self._inflight:
            return False
        return self._store(key, self._keep(block))

    def has_exact(self, source, start: int, end: int) -> bool:
        """Whether the exact range [start, end) is cached or being fetched (no I/O)."""
        key = (source, start, end)
        return key in self._blocks or key in self._inflight

    def cached(self, source, index: int) -> bytes | None:
        key = (source, index)
        block = self._blocks.get(key)
        if block is not None:
            self._blocks.move_to_end(key)
            if key in self._unread:
                self._unread.discard(key)
                self._prefetch_read(block)
        return block

    def drop_read(self, source, first: int, last: int) -> None:
        """Blocks [first, last] of `source` were read by a sequential reader that has gone past them,
        and the kernel's page cache holds them (readahead/streams.py decides): they leave the cache
        now, and their slots go back to the pool for the next fetch (pages already in memory, no
        fresh ones to fault in). Blocks read ahead but not read yet stay."""
        blocks, budget = self._blocks, self.budget
        for index in range(first, last + 1):
            key = (source, index)
            if key in self._unread:
                continue
            block = blocks.pop(key, None)
            if block is not None:
                budget.cached -= self._weigh(block)
                self._let_go(block)
                self.dropped_read += 1

    def read_ahead(self, source, parts: list[tuple[int, int]], reader: int = 0, ranges: int = 1) -> None:
        """Start `prefetch_parts` in the background. Parts asked for in several ranges count as queued
        from now on: a read of their blocks right after this (before that task has run) fetches them
        in as many ranges."""
        if ranges > 1:
            self._queue(source, parts, ranges)
        trio.lowlevel.spawn_system_task(self.prefetch_parts, source, parts, reader, ranges)

    def _queue(self, source, parts: list[tuple[int, int]], ranges: int) -> None:
        queued = self._queued
        for first, last in parts:
            for index in range(first, last + 1):
                queued[(source, index)] = (last, ranges)

    async def prefetch_parts(self, source, parts: list[tuple[int, int]], reader: int = 0, ranges: int = 1) -> None:
        """Fetch those blocks of the read-ahead parts [(first, last), ...] that are neither cached nor
        in flight, each part as one request (the caller sizes them), or as `ranges` requests at once
        (see _fetch_spread). One task per source starts them nearest first, by their distance from
        `reader` (the block where the stream that asks for them began), as the host's pacer grants
        slots (parts asked for while it waits join its queue): a part that a reader is about to
        need never waits behind parts further ahead, its own or another reader's of the same
        object. Runs as a background task, so it must never raise: a failure here is retried (and
        reported) by the reader that needs the blocks."""
        self._queue(source, parts, ranges)
        ranked = [(first - reader, first, last, ranges) for first, last in parts]
        pending = self._pending.get(source)
        if pending is not None:  # this source's starter is waiting for a slot: it takes these too
            for part in ranked:
                heapq.heappush(pending, part)
            return
        pending = self._pending[source] = ranked
        heapq.heapify(pending)
        try:
            while pending:
                ticket = None if self.pacer is None else await self.pacer.acquire(source)
                _, first, last, ranges = heapq.heappop(pending)  # the nearest now, after the wait
                trio.lowlevel.spawn_system_task(self._prefetch_part, source, first, last, ticket, ranges)
        except BaseException:  # noqa: BLE001 - cancelled with the run: forget the parts not started
            for _, first, last, _ in pending:
                self._unqueue(source, first, last)
        finally:
            del self._pending[source]

    async def _prefetch_part(self, source, first: int, last: int, ticket, ranges: int = 1) -> None:
        try:
            fetched = await self._fetch_missing(source, first, last, ranges)
            if ticket is not None:
                ticket.nbytes = fetched
        except Exception:  # noqa: BLE001 - the reader that needs these blocks retries and reports
            pass
        finally:
            if ticket is not None:
                self.pacer.release(ticket)
            self._unqueue(source, first, last)

    def _unqueue(self, source, first: int, last: int) -> None:
        queued = self._queued
        for index in range(first, last + 1):
            if queued.get((source, index), (None,))[0] == last:
                del queued[(source, index)]

    async def _fetch_missing(self, source, first: int, last: int, ranges: int = 1) -> int:
        """Fetch those of blocks [first, last] that are neither cached nor in flight; the bytes fetched."""
        missing = [i for i in range(first, last + 1)
                   if (source, i) not in self._blocks and (source, i) not in self._inflight]
        fetched = 0
        if missing:
            for run in _runs(missing, self.max_request_blocks):
                blocks = await self._fetch_run(source, *run, prefetched=True, ranges=ranges)
                fetched += sum(map(len, blocks.values()))
        return fetched

    async def _gather(self, source, first: int, last: int) -> dict[int, bytes]:
        found: dict[int, bytes] = {}
        waits: list[tuple[int, _Flight]] = []
        missing: list[int] = []
        for index in range(first, last + 1):
            block = self.cached(source, index)
            if block is not None:
                found[index] = block
                self.hits += 1
                if len(block) < self.block_size:
                    break  # end of object: nothing exists beyond
                continue
            self.misses += 1
            flight = self._inflight.get((source, index))
            if flight is not None:
                waits.append((index, flight))
            else:
                missing.append(index)
        if missing:
            # A reader that caught up with read-ahead still waiting for its turn (see pacer) takes
            # the rest of that part along in its own request, rather than a block at a time, and
            # fetches it as the part would have been (in several ranges at once, if so asked).
            part_last, ranges = self._queued.get((source, missing[-1]), (None, 1))
            if part_last is not None:
                for index in range(missing[-1] + 1, part_last + 1):
                    if (source, index) in self._blocks or (source, index) in self._inflight:
                        break
                    missing.append(index)
            runs = _runs(missing, self.max_request_blocks)
            if len(runs) == 1:
                found.update(await self._fetch_run(source, *runs[0], ranges=ranges))
            else:
                async with trio.open_nursery() as nursery:
                    for run in runs:
                        nursery.start_soon(self._fetch_into, found, source, *run)
        for index, flight in waits:
            await flight.done.wait()
            if flight.error is not None:
                if isinstance(flight.error, trio.Cancelled):
                    # The fetching reader was interrupted; fetch it ourselves.
                    found.update(await self._gather(source, index, index))
                    continue
                raise flight.error
            block = flight.blocks.get(index)
            if block is None:  # the flight ended at the end of the object before this block
                found[index] = b""
                continue
            found[index] = block
            if (source, index) in self._unread:
                self._unread.discard((source, index))
                self._prefetch_read(block)
        return found

    async def _fetch_spread(self, source, start: int, end: int, ranges: int) -> list[bytes]:
        """Bytes [start, end) (shorter only at the end of the object) as `ranges` requests of about
        equal size at once, split into blocks as `fetch` would. On a long link new connections are in
        TCP slow start: a run's first blocks come sooner over several connections, each of which is
        then ready to carry more, than over one."""
        bs = self.block_size
        step = -(-(end - start) // ranges)
        bounds = [(lo, min(lo + step, end)) for lo in range(start, end, step)]
        got: list = [None] * len(bounds)
        failed: list[Exception] = []

        async def one(k: int, lo: int, hi: int) -> None:
            try:
                got[k] = b"".join(await self._fetch(source, lo, hi))
            except Exception as e:  # noqa: BLE001 - raised below as it is (not in an exception group)
                failed.append(e)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for k, (lo, hi) in enumerate(bounds):
                nursery.start_soon(one, k, lo, hi)
        if failed:
            raise failed[0]
        # A range may be short only where the object ends: every range after it must then be empty.
        for k, (lo, hi) in enumerate(bounds):
            if len(got[k]) < hi - lo:
                if any(got[k + 1 :]):
                    raise FetchError(f"a range ended early at byte {lo + len(got[k])} but a later one had bytes")
                got = got[: k + 1]
                break
        data = b"".join(got)
        return [data[i : i + bs] for i in range(0, len(data), bs)]

    async def _fetch_into(self, found: dict, source, first: int, last: int) -> None:
        found.update(await self._fetch_run(source, first, last))

    async def _fetch_run(self, source, first: int, last: int, prefetched: bool = False,
                         ranges: int = 1) -> dict[int, bytes]:
        bs = self.block_size
        keys = [(source, i) for i in range(first, last + 1)]
        async with self._flight(keys, len(keys) * bs) as flight:
            blocks = flight.blocks
            began = trio.current_time()
            if ranges > 1:
                pieces = await self._fetch_spread(source, first * bs, (last + 1) * bs, ranges)
            else:
                pieces = await self._fetch(source, first * bs, (last + 1) * bs)
            self._landed(flight)
            if self.pacer is not None and not prefetched:
                self.pacer.observe(source, began, sum(map(len, pieces)))
            for index, block in enumerate(pieces, first):
                blocks[index] = block = self._keep(block)
                if self._store((source, index), block) and prefetched and (source, index) not in self._unread:
                    self._unread.add((source, index))
                    self.prefetched += 1
                    self.prefetched_bytes += len(block)
                if len(block) < bs:
                    break
        return blocks

    @asynccontextmanager
    async def _flight(self, keys: list, nbytes: int):
        """One fetch for `keys` of at most `nbytes`: waiters find it in `_inflight` until it ends,
        then see its blocks or its error. Its bytes are claimed from the budget (waiting while other
        fetches hold it) and room is made for them before the fetch starts."""
        flight = _Flight()
        for key in keys:
            self._inflight[key] = flight
        try:
            await self.budget.start_fetch(nbytes)
            flight.reserved = nbytes
            self._evict()
            self.budget.note_cached()
            yield flight
        except BaseException as e:
            flight.error = e
            raise
        finally:
            self._landed(flight)
            for key in keys:
                self._inflight.pop(key, None)
            flight.done.set()

    def _landed(self, flight: _Flight) -> None:
        """The fetch's bytes are here: they count as cached from now on, not as in flight."""
        self.budget.end_fetch(flight.reserved)
        flight.reserved = 0

    def _keep(self, data):
        """Fetched bytes as the cache keeps them (in a slot of the pool, if there is one)."""
        return data if self.pool is None else self.pool.keep(data)

    def _weigh(self, block) -> int:
        return len(block) if self.pool is None else self.pool.footprint(block)

    def _store(self, key, block: bytes) -> bool:
        budget = self.budget
        weight = self._weigh(block)
        if weight > budget.total:
            return False
        old = self._blocks.pop(key, None)
        if old is not None:
            budget.cached -= self._weigh(old)
            self._let_go(old)
        self._blocks[key] = block
        budget.cached += weight
        self._evict()
        budget.note_cached()
        return key in self._blocks

    def _evict(self) -> None:
        budget = self.budget
        blocks = self._blocks
        while budget.cached + budget.inflight > budget.total and blocks:
            key, evicted = blocks.popitem(last=False)
            budget.cached -= self._weigh(evicted)
            self._let_go(evicted)
            self.evictions += 1
            if key in self._unread:
                self._unread.discard(key)
                budget.prefetch_wasted += 1
                self.prefetch_wasted_bytes += len(evicted)
                if self.on_wasted is not None:
                    self.on_wasted(*key)


    def _prefetch_read(self, block) -> None:
        """A read-ahead block was read (for the first time)."""
        self.prefetch_used += 1
        self.prefetch_used_bytes += len(block)

    def _let_go(self, block) -> None:
        if self.pool is not None:
            self.pool.release(block)


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


def _register_metrics() -> None:
    """The block caches (fetch/registry.py): the memory one ("cache") and the disk one ("disk", cache/disk.py
    reports the same figures), labelled by cache."""
    from refmount.fetch.registry import register

    def of(key: str):
        def collect(stats: dict):
            for label, section in (("memory", "cache"), ("disk", "disk")):
                if isinstance(stats.get(section), dict):
                    yield {"cache": label}, stats[section].get(key)
        return collect

    for name, kind, key, what in (
            ("refmount_cache_hits_total", "counter", "hits", "Blocks found in the cache."),
            ("refmount_cache_misses_total", "counter", "misses", "Blocks not found in the cache (fetched)."),
            ("refmount_cache_evictions_total", "counter", "evictions", "Blocks evicted from the cache."),
            ("refmount_cache_dropped_read_total", "counter", "dropped_read",
             "Blocks let go of once a sequential reader had read past them (the page cache holds them)."),
            ("refmount_cache_bytes", "gauge", "bytes", "Bytes the cache holds."),
            ("refmount_cache_capacity_bytes", "gauge", "capacity", "What the cache may hold.")):
        register(name, kind, what, ("cache",), collect=of(key), component="cache")


_register_metrics()
