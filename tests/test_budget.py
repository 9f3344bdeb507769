"""Read-ahead request sizes, the memory budget and wasted read-ahead: first on the cache and read
streams alone (a fake remote that records requests), then through a mount: 64 files streaming at
once stay within the budget, and 32 random readers do not fetch much more than they read."""

from __future__ import annotations

import os
import random
import threading
import time

import trio
import trio.testing

from refmount.cache.budget import MemoryBudget
from refmount.cache.blocks import BlockCache
from refmount.fetch.pieces import piece_sizes
from refmount.view.raw import ReadStreams
from tests.conftest import run_refmount

KiB, MiB = 1 << 10, 1 << 20
BLOCK = bytes(MiB)


class Remote:
    """Objects of `size` zero bytes; records every request and how many overlap."""

    def __init__(self, size: int, delay: float = 0.002) -> None:
        self.size = size
        self.delay = delay
        self.requests: list[tuple[object, int, int]] = []
        self.active = 0
        self.most_active = 0

    async def fetch(self, source, start: int, end: int) -> list[bytes]:
        self.requests.append((source, start, end))
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            await trio.sleep(self.delay)
        finally:
            self.active -= 1
        return [BLOCK[:n] for n in piece_sizes(start, min(end, self.size), MiB)]


def _clock():
    """Virtual time: the same schedule however loaded the machine is."""
    return trio.testing.MockClock(autojump_threshold=0)


async def scan(cache: BlockCache, streams: ReadStreams, uid, size: int, read: int = 128 * KiB) -> None:
    """One sequential reader, as the kernel asks: `read` bytes at a time."""
    for offset in range(0, size, read):
        streams.on_read(uid, offset, offset + read, size, size)
        assert len(await cache.read(uid, offset, offset + read)) == read
        await trio.sleep(0)


def test_a_scan_asks_for_growing_parts_several_at_once():
    remote = Remote(64 * MiB)
    cache = BlockCache(remote.fetch, block_size=MiB, capacity=256 * MiB)
    streams = ReadStreams(cache)
    trio.run(scan, cache, streams, "u", 64 * MiB, clock=_clock())
    sizes = [end - start for _, start, end in remote.requests]
    assert sizes[0] == MiB  # the first request is small
    assert max(sizes) == 8 * MiB  # then they grow to 8 MiB parts
    print(f"\nparts of a 64 MiB scan (MiB): {[size // MiB for size in sizes]}")
    assert sum(size for size in sizes if size >= 4 * MiB) >= 48 * MiB  # most bytes come in parts of 4-8 MiB
    assert len({size for size in sizes if size >= 4 * MiB}) >= 3  # of several sizes: they end at different times
    assert len(sizes) <= 20
    assert remote.most_active >= 3  # several parts in flight
    fetched = sorted((start, end) for _, start, end in remote.requests)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(fetched, fetched[1:]))  # never twice


def test_many_streams_stay_within_the_budget_and_share_the_read_ahead():
    remote = Remote(16 * MiB)
    budget = MemoryBudget(96 * MiB)  # a block and a half per stream
    cache = BlockCache(remote.fetch, block_size=MiB, budget=budget)
    streams = ReadStreams(cache)
    most_ahead = 0

    async def watch():
        nonlocal most_ahead
        while True:
            most_ahead = max(most_ahead, budget.ahead)
            assert budget.used <= budget.total
            await trio.sleep(0.001)

    async def main():
        async with trio.open_nursery() as watcher:
            watcher.start_soon(watch)
            async with trio.open_nursery() as nursery:
                for uid in range(64):
                    nursery.start_soon(scan, cache, streams, uid, 16 * MiB, 256 * KiB)
            watcher.cancel_scope.cancel()

    trio.run(main, clock=_clock())
    assert budget.peak <= budget.total
    assert most_ahead <= budget.prefetch_limit
    fetched = sum(end - start for _, start, end in remote.requests)
    assert fetched <= 1.5 * 64 * 16 * MiB  # read-ahead evicted unread is stopped, not repeated


def test_read_ahead_evicted_unread_is_counted_and_stops_its_stream():
    remote = Remote(64 * MiB)
    budget = MemoryBudget(12 * MiB)
    cache = BlockCache(remote.fetch, block_size=MiB, budget=budget)
    streams = ReadStreams(cache)

    async def main():
        for offset in range(0, 2 * MiB, 128 * KiB):  # a scan gets going: its read-ahead is out
            streams.on_read("scan", offset, offset + 128 * KiB, 64 * MiB, 64 * MiB)
            await cache.read("scan", offset, offset + 128 * KiB)
        await trio.sleep(0.05)
        for k in range(20):  # another reader's blocks push the read-ahead out before it is read
            await cache.read("other", k * MiB, k * MiB + 1)
        before = len(remote.requests)
        streams.on_read("scan", 2 * MiB, 2 * MiB + 128 * KiB, 64 * MiB, 64 * MiB)
        await trio.sleep(0.05)
        return [r for r in remote.requests[before:] if r[0] == "scan"]

    after = trio.run(main, clock=_clock())
    assert budget.prefetch_wasted > 0
    assert cache.statistics()["evictions"] > 0
    assert after == []  # that stream reads ahead no more


# -- through a mount -------------------------------------------------------------------------------


def _rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _serve_copies(http_data, name: str, data: bytes, count: int) -> list[str]:
    """`count` urls of the same bytes (symlinks: each its own remote object to refmount)."""
    root = http_data.path_for(http_data.url_for("x")).parent
    (root / name).write_bytes(data)
    urls = []
    for k in range(count):
        link = root / f"{name}.{k}"
        if not link.exists():
            link.symlink_to(name)
        urls.append(http_data.url_for(link.name))
    return urls


def test_64_files_streaming_at_once_stay_within_the_memory_budget(mount, http_data):
    size = 4 * MiB
    data = random.Random(5).randbytes(size)
    urls = _serve_copies(http_data, "stream64.bin", data, 64)
    m = mount({f"f{k}": [url] for k, url in enumerate(urls)}, "--cache-size", "32M")
    pid = m.proc.pid
    os.stat(m / "f0")  # sizes looked up: the daemon is settled
    baseline, _ = _rss_mib(pid)
    peak = baseline
    errors: list[str] = []

    def reader(k: int) -> None:
        with open(m / f"f{k}", "rb") as f:
            got = f.read()
        if got != data:
            errors.append(f"f{k}: wrong bytes")

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(64)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        peak = max(peak, _rss_mib(pid)[0])
        time.sleep(0.02)
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 1))
    assert not errors
    hwm = _rss_mib(pid)[1]
    stats = m.stats()
    memory = stats["memory"]
    print(f"\n64 streams, --cache-size 32M: daemon RSS {baseline:.0f} MiB before, peak {max(peak, hwm):.0f} MiB "
          f"(VmHWM {hwm:.0f}); budget peak {memory['peak'] / MiB:.1f} MiB, wasted {memory['prefetch_wasted']}, "
          f"fetched/served {stats['served']['amplification']}")
    assert memory["peak"] <= memory["budget"]
    shown = run_refmount("stats", m.path).stdout  # what a user sees
    for name in ("refmount_memory_budget_bytes", "refmount_memory_used_bytes", "refmount_memory_inflight_bytes",
                 "refmount_memory_prefetch_wasted_total"):
        assert name in shown
    # Loose: the budget, plus the pieces aiohttp and FUSE replies hold beyond it, over the baseline.
    assert hwm - baseline <= 32 + 64, (baseline, hwm)


def test_32_random_readers_fetch_little_more_than_they_read(mount, http_data):
    size = 64 * MiB
    data = random.Random(6).randbytes(size)
    (url,) = _serve_copies(http_data, "random32.bin", data, 1)
    chunk = 100_000
    refs = {"whole": [url]}
    refs.update({f"c/{k}": [url, k * chunk, chunk] for k in range(size // chunk)})
    m = mount(refs, "--cache-size", "64M")
    errors: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        fd = os.open(m / "whole", os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # the kernel's own readahead off
            for _ in range(12):
                if rng.random() < 0.5:  # a random 64 KiB of the whole file
                    offset = rng.randrange(size - 64 * KiB)
                    if os.pread(fd, 64 * KiB, offset) != data[offset : offset + 64 * KiB]:
                        errors.append(f"whole @{offset}")
                else:  # a random chunk file
                    k = rng.randrange(size // chunk)
                    if (m / f"c/{k}").read_bytes() != data[k * chunk : (k + 1) * chunk]:
                        errors.append(f"c/{k}")
        finally:
            os.close(fd)

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    stats = m.stats()
    fetched, served = stats["fetch"]["bytes"], stats["served"]["bytes"]
    print(f"\n32 random readers: served {served / MiB:.1f} MiB, fetched {fetched / MiB:.1f} MiB "
          f"({fetched / served:.2f}x), wasted read-ahead {stats['memory']['prefetch_wasted']}")
    assert served >= 32 * 12 * 64 * KiB * 0.9
    assert fetched / served <= 1.5


def _paced_scan(rtt: float, link: float, per_connection: float, max_parallel: int = 16) -> int:
    """Read-ahead parts of 8 MiB through the pacer over a modelled link (bytes/s shared by the
    requests in flight, each at most `per_connection`, plus one RTT); the parallelism it settles on."""
    from refmount.cache.pacer import HostPacer

    pacer = HostPacer(lambda source: "host", max_parallel, MiB)
    active = 0

    async def request(nbytes: int) -> None:
        nonlocal active
        active += 1
        try:
            await trio.sleep(rtt + nbytes / min(link / active, per_connection))
        finally:
            active -= 1

    async def part() -> None:
        async with pacer.slot("u") as ticket:
            await request(8 * MiB)
            ticket.nbytes = 8 * MiB

    async def main():
        for _ in range(3):  # a reader's own small requests tell the latency
            began = trio.current_time()
            await request(MiB)
            pacer.observe("u", began, MiB)
        async with trio.open_nursery() as nursery:
            for _ in range(120):
                nursery.start_soon(part)
                await trio.sleep(0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return pacer.statistics()["host"]["parallel"]


def test_the_pacer_keeps_enough_parts_in_flight_for_the_link():
    # 1 Gbit/s at 80 ms, one connection reaching a third of it: many parts in flight.
    far = _paced_scan(rtt=0.08, link=125e6, per_connection=42e6)
    # The same link next door: a couple suffice.
    near = _paced_scan(rtt=0.0005, link=125e6, per_connection=125e6)
    print(f"\npacer: {far} parts in flight at 80 ms, {near} next door")
    assert far >= 4
    assert near <= 3
    assert _paced_scan(rtt=0.08, link=125e6, per_connection=42e6, max_parallel=3) == 3  # the hard cap


def test_a_host_whose_round_trip_is_known_opens_with_what_its_link_needs():
    """Before any measurement: a short round trip (loopback) opens with 2 parts in flight, not 8 at
    once that would delay the reader's own block; a long one, or none known, with all 8."""
    from refmount.cache.pacer import HostPacer

    def opening(rtt):
        return HostPacer(lambda source: "host", 16, MiB, round_trip=lambda source: rtt).parallel("u")

    assert opening(30e-6) == 2
    assert opening(0.02) == opening(0.08) == opening(None) == 8
    assert 2 < opening(0.001) < 8
    assert HostPacer(lambda source: "host", 16, MiB).parallel("u") == 8
    assert HostPacer(lambda source: "host", 3, MiB, round_trip=lambda source: 0.08).parallel("u") == 3  # the cap


def test_read_ahead_parts_start_nearest_first_whatever_the_pacer_allows():
    """Parts wait for the host's slots; they must start in the order of the object, or a reader
    waits for its next part behind parts far ahead (trio starts tasks in any order)."""
    from refmount.cache.pacer import HostPacer

    for seed in range(5):
        remote = Remote(96 * MiB, delay=0.01)
        pacer = HostPacer(lambda source: "host", 2, MiB)
        cache = BlockCache(remote.fetch, block_size=MiB, capacity=256 * MiB, pacer=pacer)
        streams = ReadStreams(cache)
        trio.run(scan, cache, streams, "u", 96 * MiB, 512 * KiB,
                 clock=_clock())
        starts = [start for _, start, _ in remote.requests]
        ahead = [s for s in starts if s > 2 * MiB]  # read-ahead parts (the reader's own come first)
        assert ahead == sorted(ahead), (seed, [s // MiB for s in starts])


class _MeasuredPacer:
    """A host whose link was measured: 16 MiB of bandwidth-delay product, 8 requests at once."""

    def parallel(self, source) -> int:
        return 8

    def bdp(self, source) -> int:
        return 16 * MiB

    def note_readers(self, count: int) -> None:
        pass


def test_a_proven_stream_reads_ahead_the_measured_bandwidth_delay_product_at_once():
    from tests.test_cache import PrefetchLog

    log = PrefetchLog()
    log.block_size = MiB
    log.pacer = _MeasuredPacer()

    async def main():
        streams = ReadStreams(log)
        streams.on_read("u", 0, 128 * KiB, 64 * MiB, 64 * MiB)  # a first read: two blocks ahead at most
        await trio.testing.wait_all_tasks_blocked()
        first = max(last for _, _, last in log.calls)
        streams.on_read("u", 128 * KiB, 1 * MiB, 64 * MiB, 64 * MiB)  # it goes on: proven
        await trio.testing.wait_all_tasks_blocked()
        return first, max(last for _, _, last in log.calls), sorted(log.calls)

    first, proven, calls = trio.run(main)
    assert first <= 2
    assert (proven + 1) * MiB >= 1 * MiB + 2 * 16 * MiB  # twice the BDP ahead of the reader, at once
    sizes = [last - first_ + 1 for _, first_, last in calls[1:]]  # the parts asked for once proven
    assert sizes[0] == 1 and sizes[:3] == sorted(sizes[:3]) and max(sizes) == 4  # nearest smallest, then 32/8


def test_sequential_read_through_a_mount_uses_growing_parallel_parts(mount, http_data):
    size = 40 * MiB
    data = random.Random(9).randbytes(size)
    (url,) = _serve_copies(http_data, "seq40.bin", data, 1)
    m = mount({"whole": [url]}, "--view", "raw")
    os.stat(m / "whole")
    http_data.reset_stats()
    with open(m / "whole", "rb") as f:
        assert f.read() == data
    sizes = []
    for method, _, ranges in http_data.stats["log"]:
        if method == "GET" and ranges:
            a, b = map(int, ranges.removeprefix("bytes=").split("-"))
            sizes.append(b - a + 1)
    print(f"\n40 MiB read: {len(sizes)} requests (MiB): {[round(s / MiB, 1) for s in sizes]}")
    assert sum(sizes) <= 1.1 * size  # nothing fetched twice
    assert max(sizes) >= 4 * MiB  # parts grew past the block size
    assert len(sizes) <= 24


def test_parallel_readers_each_open_wide_and_read_ahead_only_their_own_part():
    """Readers of the quarters of one object (dd skip=...): each opens with the wide window of a
    reader at the object's start, and none reads ahead into the part where another one reads."""
    quarter = 32 * MiB
    remote = Remote(4 * quarter)
    cache = BlockCache(remote.fetch, block_size=MiB, capacity=512 * MiB)
    streams = ReadStreams(cache)

    async def first_reads():
        for k in range(4):
            streams.on_read("u", k * quarter, k * quarter + MiB, 4 * quarter, 4 * quarter, opening=k == 0)
        await trio.testing.wait_all_tasks_blocked()
        return [max(end for _, start, end in remote.requests if k * quarter <= start < (k + 1) * quarter)
                - k * quarter for k in range(4)]

    assert min(trio.run(first_reads, clock=_clock())) >= 8 * MiB  # not 2 blocks, for the later ones too

    remote = Remote(4 * quarter)
    cache = BlockCache(remote.fetch, block_size=MiB, capacity=512 * MiB)
    streams = ReadStreams(cache)

    async def scan_below_another_reader():
        streams.on_read("u", quarter, quarter + MiB, 4 * quarter, 4 * quarter)  # a reader at the second quarter
        await cache.read("u", quarter, quarter + MiB)
        after_it = max(end for _, _, end in remote.requests)
        for offset in range(0, quarter - 8 * MiB, MiB):  # another one scans the first quarter
            streams.on_read("u", offset, offset + MiB, 4 * quarter, 4 * quarter)
            assert len(await cache.read("u", offset, offset + MiB)) == MiB
        return after_it

    after_it = trio.run(scan_below_another_reader, clock=_clock())
    assert max(end for _, _, end in remote.requests) == after_it  # nothing beyond what the other asked for
    assert all(end <= quarter or start >= quarter for _, start, end in remote.requests)


def test_read_ahead_parts_of_two_readers_start_by_distance_from_their_reader():
    """With one slot, the parts of two readers of one object alternate, nearest to its reader first:
    the reader further into the object does not wait behind all of the first one's parts."""
    from refmount.cache.pacer import HostPacer

    remote = Remote(96 * MiB, delay=0.01)
    cache = BlockCache(remote.fetch, block_size=MiB, capacity=256 * MiB,
                       pacer=HostPacer(lambda source: "host", 1, MiB))

    async def main():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cache.prefetch_parts, "u", [(1, 1), (2, 3), (4, 7)], 0)
            nursery.start_soon(cache.prefetch_parts, "u", [(41, 41), (42, 43), (44, 47)], 40)

    trio.run(main, clock=_clock())
    distances = [start // MiB - (40 if start >= 40 * MiB else 0) for _, start, _ in remote.requests]
    assert sorted(distances) == [1, 1, 2, 2, 4, 4]
    assert distances[1:] == sorted(distances[1:])  # (the first may start before the other reader's parts exist)


class _Sizes:
    """The fetcher as RawView asks it, for objects whose size a response has told."""

    def __init__(self, size: int) -> None:
        self.size = size

    def known_size(self, url: str) -> int:
        return self.size


def test_a_read_of_the_first_of_contiguous_chunks_reads_ahead_to_the_next_ones_end():
    """`cat` of a variable's chunk files starts at its first chunk: the next chunk is fetched at once
    (not after it is asked for), but a reader of that first chunk alone costs at most one chunk
    more; going on into the next chunk makes it a scan that reads further ahead. A chunk with a
    contiguous one before it read at random is one exact request, as before."""
    from refmount.refs import refs_from_dict
    from refmount.view.raw import RawView

    chunk, first, count = 600_000, 11_328, 40
    size = first + chunk * count
    refset = refs_from_dict({"version": 1, "refs": {
        ".zattrs": "{}", **{f"c/{k}": ["http://host/x.nc", first + k * chunk, chunk] for k in range(count)}}})

    def read_pieces(key: str, pieces: list[int]) -> list[tuple[int, int]]:
        remote = Remote(size)
        view = RawView(refset, _Sizes(size), BlockCache(remote.fetch, block_size=MiB, capacity=256 * MiB))

        async def main():
            for k in pieces:  # 256 KiB pieces of consecutive chunks, as the kernel asks for them
                i = refset.find(f"c/{int(key[2:]) + k // 3}")
                assert len(await view.read(i, (k % 3) * 256 * KiB, 256 * KiB)) > 0
                await trio.testing.wait_all_tasks_blocked()

        trio.run(main, clock=_clock())
        return [(start, end) for _, start, end in remote.requests]

    alone = read_pieces("c/0", [0, 1, 2])  # the whole first chunk
    assert max(end for _, end in alone) >= first + 2 * chunk  # the next chunk came along
    assert sum(end - start for start, end in alone) <= 2 * MiB  # and nothing more (whole blocks)
    on = read_pieces("c/0", [0, 1, 2, 3, 4, 5])  # into the second chunk: a scan
    assert max(end for _, end in on) >= first + 8 * chunk
    k = 7
    assert read_pieces(f"c/{k}", [0]) == [(first + k * chunk, first + (k + 1) * chunk)]


def test_the_opening_of_a_run_of_chunks_comes_over_several_connections():
    """The blocks a run's first chunk reads ahead (to the next chunk's end) come as ranges of 512 KiB
    at once: on a long link the connections go through their slow start with these bytes, not
    after the reader went on into the next chunk. The same bytes as whole blocks; with the disk
    cache (whole blocks only), and for a chunk read at random, as before."""
    from refmount.cache.pacer import HostPacer
    from refmount.refs import refs_from_dict
    from refmount.view.raw import RawView

    chunk, first, count = 600_000, 11_328, 40
    size = first + chunk * count
    refset = refs_from_dict({"version": 1, "refs": {
        ".zattrs": "{}", **{f"c/{k}": ["http://host/x.nc", first + k * chunk, chunk] for k in range(count)}}})

    def requests(key: str, exact_small_reads: bool) -> tuple[list[tuple[int, int]], int]:
        remote = Remote(size)
        cache = BlockCache(remote.fetch, block_size=MiB, capacity=256 * MiB, pacer=HostPacer(lambda s: "host", 8, MiB))
        view = RawView(refset, _Sizes(size), cache, exact_small_reads=exact_small_reads)

        async def main():
            i = refset.find(key)
            for k in range(3):  # the whole chunk, 256 KiB at a time
                data = await view.read(i, k * 256 * KiB, 256 * KiB)
                assert len(data) == min(256 * KiB, chunk - k * 256 * KiB)
                await trio.testing.wait_all_tasks_blocked()

        trio.run(main, clock=_clock())
        return sorted((start, end) for _, start, end in remote.requests), remote.most_active

    half = 512 * KiB
    assert requests("c/0", True) == ([(k * half, (k + 1) * half) for k in range(4)], 4)
    assert requests("c/0", False) == ([(0, MiB), (MiB, 2 * MiB)], 2)
    assert requests("c/7", True)[0] == [(first + 7 * chunk, first + 8 * chunk)]  # at random: one exact request


def test_a_run_of_blocks_fetched_as_several_ranges_ends_with_the_object():
    remote = Remote(MiB + 300_000)
    cache = BlockCache(remote.fetch, block_size=MiB, capacity=256 * MiB)

    async def main():
        blocks = await cache._fetch_run("u", 0, 2, prefetched=True, ranges=6)
        assert [len(block) for block in blocks.values()] == [MiB, 300_000]
        assert len(await cache.read("u", 0, 3 * MiB)) == MiB + 300_000

    trio.run(main, clock=_clock())
    assert len(remote.requests) == 6


def test_readers_reading_ahead_together_start_with_parts_of_four_blocks():
    """A reader alone gets its nearest block first; readers of one object reading ahead together
    share the connections, and a part of one block would cost its connection a round trip for
    little: theirs start at four blocks."""
    remote = Remote(64 * MiB)
    cache = BlockCache(remote.fetch, block_size=MiB, capacity=256 * MiB)
    streams = ReadStreams(cache)

    async def main():
        streams.on_read("u", 0, MiB, 64 * MiB, 64 * MiB, opening=True)  # alone
        streams.on_read("u", 32 * MiB, 33 * MiB, 64 * MiB, 64 * MiB, opening=True)  # beside it
        await trio.testing.wait_all_tasks_blocked()

    trio.run(main, clock=_clock())
    parts = sorted((start, end - start) for _, start, end in remote.requests)
    assert [size for start, size in parts if start < 32 * MiB][0] == MiB
    assert [size for start, size in parts if start >= 32 * MiB][0] == 4 * MiB
