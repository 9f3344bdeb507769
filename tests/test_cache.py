"""The block cache's exact-range reads and the scan detector, without a mount; then the effect
through a mount: random small chunks cost one exact request each, scans coalesce into blocks."""

from __future__ import annotations

import trio
import trio.testing

from refmount.cache.blocks import BlockCache
from refmount.fetch.pieces import split
from refmount.view.raw import ReadStreams

KiB = 1 << 10
DATA = bytes(range(256)) * (16 * KiB)  # 4 MiB


class Remote:
    def __init__(self) -> None:
        self.requests: list[tuple[int, int]] = []

    async def fetch(self, source, start: int, end: int) -> list[bytes]:
        self.requests.append((start, end))
        await trio.sleep(0.01)
        return split(DATA[start:end], start, 256 * KiB)


def test_read_exact_fetches_only_the_range_once_even_for_concurrent_readers():
    remote = Remote()
    cache = BlockCache(remote.fetch, block_size=256 * KiB)
    results = []

    async def main():
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(lambda: _append(results, cache.read_exact("u", 1000, 9000)))
        results.append(await cache.read_exact("u", 1000, 9000))

    trio.run(main)
    assert remote.requests == [(1000, 9000)]
    assert results == [DATA[1000:9000]] * 6
    assert cache.statistics()["bytes"] == 8000


def test_read_exact_uses_cached_blocks_and_is_evicted_like_them():
    remote = Remote()
    cache = BlockCache(remote.fetch, block_size=256 * KiB, capacity=300 * KiB)

    async def main():
        assert await cache.read("u", 0, 10) == DATA[:10]
        assert await cache.read_exact("u", 5000, 6000) == DATA[5000:6000]  # inside the cached block
        assert remote.requests == [(0, 256 * KiB)]
        assert await cache.read_exact("u", 300 * KiB, 350 * KiB) == DATA[300 * KiB : 350 * KiB]
        assert cache.statistics()["bytes"] <= 300 * KiB  # the older block made room

    trio.run(main)


async def _append(results, awaitable):
    results.append(await awaitable)


class PrefetchLog:
    block_size = 1000

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    async def prefetch(self, uid: int, first: int, last: int) -> None:
        self.calls.append((uid, first, last))

    def read_ahead(self, uid: int, parts: list[tuple[int, int]], reader: int = 0, ranges: int = 1) -> None:
        trio.lowlevel.spawn_system_task(self.prefetch_parts, uid, parts)

    async def prefetch_parts(self, uid: int, parts: list[tuple[int, int]]) -> None:
        for first, last in parts:
            await self.prefetch(uid, first, last)


def test_read_streams_tell_scans_from_random_reads():
    streams = ReadStreams(PrefetchLog(), gap=1000, streams=4)

    def scan(uid, start, end):
        return streams.on_read(uid, start, end, end, None, prefetch=False)

    assert not scan(1, 0, 100)            # nothing seen yet
    assert scan(1, 100, 200)              # right after
    assert scan(1, 700, 800)              # a small gap
    assert not scan(1, 700, 800)          # the same chunk again is no scan
    assert not scan(1, 50_000, 50_100)    # a jump
    assert not scan(2, 800, 900)          # other files have their own streams
    # Two readers walking different parts of the same file each still look sequential.
    for k in range(5):
        assert scan(1, 800 + 100 * k, 900 + 100 * k)
        assert scan(1, 50_100 + 100 * k, 50_200 + 100 * k)


def test_read_streams_read_ahead_across_chunk_files_with_a_growing_window():
    log = PrefetchLog()

    async def main():
        streams = ReadStreams(log, gap=100, max_window=8000)
        streams.on_read(7, 0, 1000, 1000, None)  # a first chunk: nothing beyond its own end
        for k in range(1, 6):  # consecutive chunk files of the same remote file
            streams.on_read(7, k * 1000, (k + 1) * 1000, (k + 1) * 1000, None)
        await trio.testing.wait_all_tasks_blocked()  # the read-ahead tasks have run

    trio.run(main)
    calls = sorted(log.calls)  # background tasks run in any order
    # The second chunk proves a scan: the window grew 4x at once, to max_window (eight blocks) past
    # its end, fetched as parts of up to a quarter of it (without a pacer, four requests at a time),
    # the nearest first and smallest: one block, then two; whole parts then vary in size in turn.
    assert calls[:5] == [(7, 2, 2), (7, 3, 4), (7, 5, 5), (7, 6, 6), (7, 7, 7)]
    ends = [last for _, _, last in calls]
    assert ends[-1] == 6 + 8 - 1  # then it grows up to max_window ahead of the reads
    firsts = [first for _, first, _ in calls]
    assert all(f > prev_last for f, prev_last in zip(firsts[1:], ends))  # never fetched twice


def test_random_small_chunks_are_exact_requests_and_scans_coalesce(mount, http_data, tmp_path):
    root = http_data.path_for(http_data.url_for("x")).parent
    blob = root / "small-chunks.bin"
    blob.write_bytes(DATA)
    url = http_data.url_for(blob.name)
    chunk = 10_000
    refs = {f"c/{k}": [url, k * chunk, chunk] for k in range(len(DATA) // chunk)}
    m = mount(refs, "--view", "raw")

    http_data.reset_stats()
    for k in (300, 7, 150):
        assert (m / f"c/{k}").read_bytes() == DATA[k * chunk : (k + 1) * chunk]
    ranges = [r for method, _, r in http_data.stats["log"] if method == "GET"]
    assert ranges == [f"bytes={k * chunk}-{(k + 1) * chunk - 1}" for k in (300, 7, 150)]

    http_data.reset_stats()
    for k in range(20, 220):  # a scan: after its first chunk, whole blocks hold the next ones
        assert (m / f"c/{k}").read_bytes() == DATA[k * chunk : (k + 1) * chunk]
    assert http_data.stats["requests"] <= 6


def test_small_chunks_read_ahead_only_once_the_scan_is_proven():
    log = PrefetchLog()

    async def main():
        streams = ReadStreams(log, gap=100)
        streams.on_read(3, 0, 10, 10, None, small=True)     # a random small chunk: nothing ahead
        streams.on_read(3, 10, 20, 20, None, small=True)    # one neighbour may be chance: still nothing
        await trio.testing.wait_all_tasks_blocked()  # the read-ahead tasks have run
        assert log.calls == []
        streams.on_read(3, 20, 30, 30, None, small=True)    # the second in a row: a scan
        await trio.testing.wait_all_tasks_blocked()  # the read-ahead tasks have run
        assert log.calls and log.calls[0][0] == 3

    trio.run(main)


def test_chunks_up_to_a_block_read_at_random_are_one_exact_request_each(mount, http_data):
    """The kernel asks for a 600 kB chunk file in pieces (256 KiB, then the rest): a reader of
    whole chunks at random costs one request of exactly each chunk, not one per piece plus blocks."""
    root = http_data.path_for(http_data.url_for("x")).parent
    data = bytes(range(256)) * (64 * KiB)  # 16 MiB
    (root / "mid-chunks.bin").write_bytes(data)
    url = http_data.url_for("mid-chunks.bin")
    chunk = 600_000
    refs = {f"c/{k}": [url, k * chunk, chunk] for k in range(len(data) // chunk)}
    m = mount(refs, "--view", "raw")
    http_data.reset_stats()
    order = (20, 3, 11, 7)
    for k in order:
        assert (m / f"c/{k}").read_bytes() == data[k * chunk : (k + 1) * chunk]
    ranges = [r for method, _, r in http_data.stats["log"] if method == "GET"]
    assert ranges == [f"bytes={k * chunk}-{(k + 1) * chunk - 1}" for k in order]


def test_a_sequential_reader_of_one_key_leaves_no_blocks_behind_and_reuses_their_slots():
    """What a sequential reader of one key has read is in the kernel's page cache (keep_cache): the
    block cache lets go of the blocks it went past, and the next fetches take their pool slots
    (pages already faulted in) instead of fresh memory. A reader at random, a scan across keys
    (chunk files) and a decoder's reads keep their blocks as before. Every byte read is the remote's."""
    from refmount.cache.buffers import BufferPool
    from refmount.readahead import streams as streams_module

    bs = 64 * KiB

    async def fetch(source, start: int, end: int) -> list[bytes]:
        await trio.sleep(0)
        return split(DATA[start:end], start, bs)

    def setup():
        pool = BufferPool(min_pooled=16 * KiB)
        cache = BlockCache(fetch, block_size=bs, pool=pool)
        return pool, cache, ReadStreams(cache, gap=4 * KiB, max_window=4 * bs, max_part=2 * bs)

    async def read(streams, cache, start, end, key_end=len(DATA), served=True):
        streams.on_read(1, start, end, key_end, len(DATA), served=served)
        data = await cache.read(1, start, end)
        assert bytes(data) == DATA[start:end]  # (no view of a slot kept)

    async def sequential():
        pool, cache, streams = setup()
        for start in range(0, len(DATA), bs):
            await read(streams, cache, start, start + bs)
            await trio.testing.wait_all_tasks_blocked()
        behind = streams_module._KEEP_BEHIND
        # only the last blocks read (and none beyond the file) stay
        assert cache.statistics()["blocks"] <= behind + 1
        assert cache.dropped_read == len(DATA) // bs - behind - 1
        assert pool.reused > len(DATA) // bs // 2 and pool.mapped < len(DATA) // bs // 3, pool.statistics()

    async def at_random():
        pool, cache, streams = setup()
        for index in (40, 3, 17, 58, 9, 33, 21, 50):
            await read(streams, cache, index * bs, (index + 1) * bs)
        assert cache.dropped_read == 0 and cache.statistics()["blocks"] >= 8

    async def across_keys():
        pool, cache, streams = setup()
        for start in range(0, len(DATA), bs):  # chunk files of one block each, one after another
            await read(streams, cache, start, start + bs, key_end=start + bs)
            await trio.testing.wait_all_tasks_blocked()
        assert cache.dropped_read == 0 and cache.statistics()["blocks"] == len(DATA) // bs

    async def for_a_decoder():  # (a shard's inner chunks: not in the page cache as they are)
        pool, cache, streams = setup()
        for start in range(0, len(DATA), bs):
            await read(streams, cache, start, start + bs, served=False)
        assert cache.dropped_read == 0

    for case in (sequential, at_random, across_keys, for_a_decoder):
        trio.run(case)


def test_a_fresh_pool_slot_comes_with_its_pages_made_and_no_view_of_it_left():
    """`take` makes a fresh slot's pages before anything is written into it (MADV_POPULATE_WRITE,
    called through ctypes so that the GIL is free meanwhile): the write faults no page in. Taking the
    slot's address for that call leaves no view of it behind, or the slot could never be reused."""
    import mmap
    import platform
    import re
    import resource

    from refmount.cache.buffers import BufferPool, _exported

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    size = 4 << 20
    pages = size // mmap.PAGESIZE
    data = b"\x5a" * size
    pool = BufferPool()
    view = pool.take(size)
    slot = view.obj
    assert isinstance(slot, mmap.mmap)
    before = faults()
    view[:] = data
    written = faults() - before
    if tuple(int(n) for n in re.findall(r"\d+", platform.release())[:2]) >= (5, 14):
        assert written < pages // 16, f"{written} page faults writing a populated slot of {pages} pages"
    assert bytes(view) == data
    pool.release(view)
    del view
    assert not _exported(slot)
    again = pool.take(size)
    assert again.obj is slot and pool.reused == 1
