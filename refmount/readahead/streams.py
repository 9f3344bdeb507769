"""Sequential read-ahead of remote files' bytes (the byte streams), per reader.

Each stream holds a reservation of the read-ahead budget (refmount/cache/reservations.py) for its
lead, the bytes it asked for ahead of its reader: resized as the reader goes on and the stream asks
for more, released when the stream is replaced or forgotten. A read goes on only with a stream of
its own reader (the pid of the process whose open it goes through: refmount.readahead.READER), so
that readers reading side by side each get a stream of their own.
"""

from __future__ import annotations

from collections import OrderedDict

import trio

from refmount.cache.blocks import BlockCache
from refmount.cache.budget import MemoryBudget
from refmount.readahead import READER

_ACTIVE = 1.0  # seconds since its last read for which a stream counts as reading
# Whole read-ahead parts take these quarters of the part size in turn. Parts of one size started
# together share the link equally and end together; every connection then idles the round trip to
# its next part's first byte at the same moment (at 80 ms a sixth of the time with 8 MiB parts).
# Parts that end at different times leave the others to fill the link during each one's round trip.
_STAGGER = (4, 3, 2, 3)
# The least a range of a block spread over several connections may be (ReadStreams._read_ahead): the
# point is to bring the connections that carry the big parts that follow through their slow start.
# (Chosen when smaller ranges went over other connections than big ones; now every range of the
# stdlib engine shares one pool, and smaller spreads are untested.)
_SPREAD_MIN = 512 << 10
# A reader whose reads opened this many new streams in a row, none going on from the one before, reads
# at random: it is not predicted for (a run's opening, a stream proven by one read: see on_read) until
# its reads go on twice in a row.
_RANDOM_AFTER = 2
_READERS = 4096  # readers whose last reads are remembered (the least recently seen is forgotten)
# Blocks a sequential reader of one key has gone this many blocks past leave the block cache (see
# _let_go_behind): enough for the kernel's readahead requests that arrive late or out of order.
_KEEP_BEHIND = 4


class _Stream:
    """One sequential reader of a remote file, as ReadStreams sees it."""

    __slots__ = ("begin", "reached", "window", "next_block", "last_start", "in_a_row", "key_end", "crossings",
                 "scanning", "stopped", "parts", "run_end", "reader", "token", "passed")

    def __init__(self, start: int, end: int, key_end: int, window: int, reader: int = 0, token=None) -> None:
        self.begin = start
        self.reached = end  # the furthest byte read
        self.window = window  # bytes to keep fetched (or in flight) ahead of `reached`
        self.next_block = -1  # the first block not yet asked for ahead (-1: none asked)
        self.last_start = start
        self.in_a_row = 0  # reads in a row that went on from the one before
        self.key_end = key_end  # where the key of its last read ends
        self.crossings = 0  # times it went on from one key into another
        self.scanning = False  # its last read continued a scan
        self.stopped = False  # its read-ahead was evicted unread: read ahead no more
        self.parts = 0  # whole parts it asked for (their sizes take _STAGGER in turn)
        self.run_end = 0  # a stream opened at the start of a run of keys may read ahead to here before it crosses
        self.reader = reader  # the pid whose reads it follows (0: unknown, goes on with any)
        self.token = token  # its reservation of the read-ahead budget: its lead
        self.passed = 0  # blocks below this one were let go of behind it (see ReadStreams._let_go_behind)

    def lead(self, block_size: int) -> int:
        """Bytes asked for ahead of the reader (what its read-ahead holds of the budget)."""
        return max(self.next_block * block_size - self.reached, 0)

    def hold(self, block_size: int) -> None:
        """Its reservation holds its lead (after its lead changed)."""
        self.token.resize(self.lead(block_size))


class ReadStreams:
    """Sequential read-ahead per remote file, in the style of mountpoint-s3, over the remote file's
    own offsets: a scan through consecutive chunk files of one remote file is read ahead like one
    big file.

    Each remote file keeps a few streams (parallel readers walking different parts of it). A read
    continues a stream when it starts after the stream's last read did, and within `gap` of where
    the stream has got to (chunks of a netCDF-4 file sit between small metadata blocks; the kernel's
    readahead requests may arrive out of order, or overlap). The stream's window then grows, from
    two blocks (four per request the host gets at once, for a first read of a block or more from a
    key's start or beside a reader opened that wide), 4x per read once the stream is proven
    sequential and at once to twice the host's measured bandwidth-delay product, up to
    `max_window`. Any other read starts a new stream, replacing the oldest, whose read-ahead stays
    within the key it read (or the key after it, for a read at the start of a run of keys: see
    on_read). A stream reads ahead no further than
    where another stream reading now began: that reader fetches its own part of the file.

    Requests grow with the window: the stream asks for what it lacks of its window once that is at
    least a part (the window spread over the stream's share of the host's parallel requests, at most
    `max_part`), fetched in parallel, so a long scan keeps several big requests in flight (the
    bandwidth-delay product) while its first requests stay small; for a reader that has caught up
    the nearest part is one block and the next ones double, and whole parts vary in size in turn
    (`_STAGGER`); the block or two a run's opening asks for come as several ranges at once. All
    streams together claim at most the memory budget's read-ahead share; a stream whose read-ahead
    is evicted unread stops reading ahead. The parts are fetched by
    background tasks through the same single-flight cache, started nearest to their reader first."""

    def __init__(self, cache: BlockCache, gap: int = 64 << 10, max_window: int = 128 << 20,
                 streams: int = 8, files: int = 4096, max_part: int = 8 << 20) -> None:
        self.cache = cache
        self.gap = gap
        self.proof = cache.block_size // 4
        self.max_window = max_window
        self.max_part = max(max_part, cache.block_size)
        self.streams = streams
        self.files = files
        self.budget = getattr(cache, "budget", None) or MemoryBudget(1 << 62)
        self.spread_openings = False  # whether the cache may fetch a block in several ranges (see _read_ahead)
        if hasattr(cache, "on_wasted"):
            cache.on_wasted = self._wasted
        self._files: OrderedDict[int, list[_Stream]] = OrderedDict()  # url id -> its streams
        self._active: dict[_Stream, float] = {}  # streams reading ahead -> when they last did
        # reader -> how many of its reads in a row opened a new stream (see _RANDOM_AFTER)
        self._jumps: OrderedDict[int, int] = OrderedDict()
        self.openings_skipped = 0  # runs' openings not read ahead: their reader reads at random
        self._pruned = 0.0

    def on_read(self, uid: int, start: int, end: int, key_end: int, limit: int | None,
                prefetch: bool = True, small: bool = False, opening: bool = False,
                next_key_end: int = 0, served: bool = True) -> bool:
        """Record a read of [start, end) of remote file `uid` (of a key ending at `key_end`) and
        fetch ahead, up to `limit` if the remote file's end is known. A stream that has not gone on
        from one key into the next fetches ahead only within its key; for a `small` read, only a
        stream that went on twice in a row reads ahead. A read at the start of a run of keys that
        follow one another in the remote file (`next_key_end`: where the next of them ends) that
        starts a stream reads ahead to the end of that next key at once, as a scan would: a reader
        of one chunk costs at most one chunk more, and a scan need not wait for its second chunk to
        show itself. True if the read continued a scan of the remote file (one that crossed keys,
        or went on within a key that ends at `limit`), or opened one at the start of a run.
        `served`: the bytes go to the reader as they are (through the page cache), not to a decoder."""
        bs = self.cache.block_size
        budget = self.budget
        streams = self._files.pop(uid, None) or []
        reader = READER.get()
        for stream in streams:
            if reader and stream.reader and stream.reader != reader:
                continue  # another reader's stream: readers side by side are no scan of each other's
            # A proven scan may see the kernel's readahead requests arrive out of order: one a little
            # ahead continues it, one behind (inside what it read) is part of it, not a new stream.
            ahead = max(self.gap, 2 * bs) if stream.scanning else self.gap
            if stream.scanning and stream.begin <= start < stream.last_start and end <= stream.reached:
                self._files[uid] = streams
                return True
            if stream.last_start < start and stream.reached - self.gap <= start <= stream.reached + ahead:
                stream.reached = max(stream.reached, end)
                stream.last_start = start
                stream.in_a_row += 1
                if key_end != stream.key_end:
                    stream.key_end = key_end
                    stream.crossings += 1
                # Random small reads do land next to another now and then, and the kernel splits one
                # around pages it has: small reads are a scan once two went on from the one before,
                # across keys or over more than `proof` bytes. So are the reads of a reader at random
                # (one of its many threads reading a chunk right after another's is chance).
                proven = (not small and not self._at_random(reader)) or (
                    stream.in_a_row >= 2 and (stream.crossings >= 2 or stream.reached - stream.begin > self.proof))
                # The window grows 4x per read once the stream is proven sequential (2x before), and at
                # once to the host's measured bandwidth-delay product: on a long link every read the
                # ramp waits for costs a round trip.
                grown = stream.window * (4 if proven else 2)
                if proven:
                    grown = max(grown, self._link_window(uid))
                stream.window = min(max(grown, 2 * bs), self.max_window)
                # A reader walking through one key is no scan of the remote file until it goes on
                # into the next key: till then it reads ahead within its key only (or to the end of
                # the next key, if it began at the start of a run of keys).
                scan = stream.scanning = proven and (stream.crossings > 0 or key_end == limit or stream.run_end > 0)
                if not stream.crossings:
                    limit = max(key_end, stream.run_end)
                prefetch = prefetch and proven
                continued = proven
                stream.hold(bs)
                if proven:
                    self._note_reader(reader, went_on=True)
                    if served:
                        self._let_go_behind(uid, stream, start)
                break
        else:
            # A read of a block or more from the start of a key (how the kernel's readahead begins a
            # file) opens with a wider window, fetched as several parts at once: on a long link the
            # connections' slow start then runs in parallel rather than one after another.
            # So does a read of a block or more beside a wide reader of the remote file (parallel
            # readers of its parts, as `dd skip=`): each ramps as fast as a lone reader from its start
            # would, and those of them that began narrow before a wide one came open as wide. (Random
            # reads of a block or more stay narrow: their streams are never wide.)
            if self._note_reader(reader, went_on=False) >= _RANDOM_AFTER and next_key_end:
                next_key_end = 0  # (a reader at random: its chunk's successor would be wasted)
                self.openings_skipped += 1
            wide = self._opening(uid)
            siblings = [s for s in streams if s in self._active] if end - start >= bs else []
            opening = opening or next_key_end > 0 or any(s.window >= wide for s in siblings)
            stream = _Stream(start, end, key_end, wide if opening else 2 * bs, reader,
                             budget.reservations.reserve(0, ("stream", uid, reader)))
            if opening:
                for sibling in siblings:
                    sibling.window = max(sibling.window, wide)
            if len(streams) >= self.streams:
                for old in streams[: len(streams) + 1 - self.streams]:
                    old.token.release()
                streams = streams[len(streams) + 1 - self.streams :]
            streams.append(stream)
            if next_key_end:  # a scan's likely start: read as one (by blocks), ahead to the next key's end
                stream.run_end = limit = next_key_end
                stream.scanning = scan = continued = True
            else:
                limit = key_end  # one read is no scan yet: read ahead within its key only
                scan = continued = False
                prefetch = prefetch and not small
        self._files[uid] = streams
        if len(self._files) > self.files:
            for old in self._files.popitem(last=False)[1]:
                old.token.release()
        if prefetch and not stream.stopped:
            self._read_ahead(uid, stream, end, limit)
        return scan or continued

    def _let_go_behind(self, uid: int, stream: _Stream, start: int) -> None:
        """A proven sequential reader within one key (it never crossed into another) has read the
        blocks of that key it is `_KEEP_BEHIND` blocks past: the kernel's page cache holds their
        bytes (a key's file is opened with keep_cache), so the block cache lets go of them now and
        the pool reuses their slots for this stream's next fetches, pages already in memory. A cold
        read of a big file otherwise fills the cache with fresh memory, whose page faults were a
        third of the daemon's CPU (bench/NOTES.md, "where a GB goes"); mountpoint-s3 does not cache
        a sequential stream either. Readers at random, and scans across keys (chunk files), whose
        blocks straddle files the kernel has not all read, keep theirs as before. The price: a
        re-read after the kernel dropped its pages is fetched again (from --cache-dir, if given)."""
        drop = getattr(self.cache, "drop_read", None)
        if drop is None or stream.crossings:
            return
        bs = self.cache.block_size
        first = max(stream.passed, -(-stream.begin // bs))  # (a block the stream began inside: not all read)
        last = start // bs - _KEEP_BEHIND - 1
        if first <= last:
            drop(uid, first, last)
            stream.passed = last + 1

    def _at_random(self, reader: int) -> bool:
        """Did the last _RANDOM_AFTER reads of `reader` each open a new stream?"""
        return self._jumps.get(reader, 0) >= _RANDOM_AFTER

    def _note_reader(self, reader: int, went_on: bool) -> int:
        """Note a read of `reader` that went on with a proven stream of its own or opened a new one;
        returns how many of its reads in a row before this one opened new streams. A reader that
        does not walk (reads at random) gets no prediction: the opening of a run would fetch a chunk
        more for its read, and a read that lands by chance right after another of its reads would
        open a scan's window (32 random readers of whole chunks: bench_memory)."""
        jumps = self._jumps.pop(reader, 0)
        self._jumps[reader] = 0 if went_on else jumps + 1
        if len(self._jumps) > _READERS:
            self._jumps.popitem(last=False)
        return jumps

    def _read_ahead(self, uid: int, stream: _Stream, end: int, limit: int | None) -> None:
        bs = self.cache.block_size
        budget = self.budget
        window_end = end + stream.window
        # Not into the part of the remote file another reader is reading ahead of itself: its own
        # read-ahead fetches that, in bigger parts.
        stop = min(window_end, self._next_reader(uid, stream, end), limit if limit is not None else window_end)
        first = max(end // bs, stream.next_block)
        if stop <= end or first > (stop - 1) // bs:
            return
        # Within the read-ahead share of the budget (with what this stream holds already), split
        # fairly among the streams reading now.
        readers = self._scanning(stream)
        share = budget.prefetch_limit // readers
        room = budget.prefetch_room() + stream.token.nbytes
        last = min((stop - 1) // bs, (stream.reached + min(room, share)) // bs - 1)
        # Parts spread the window over the stream's share of the host's parallel requests: while
        # connections are new (TCP slow start) several small parts move more than one big one; a
        # long window gives big parts.
        part = min(max(stream.window // max(self._parallel(uid) // readers, 1), bs), self.max_part)
        # Wait until a whole part is lacking, unless the reader has caught up or the read-ahead
        # reaches its end (of the key, the object or where another reader is).
        reaches_end = stop < window_end and (last + 1) * bs >= stop
        if first > last or ((last - first + 1) * bs < part and first * bs > end and not reaches_end):
            return
        part_blocks = max(part // bs, 1)
        # A reader that has caught up waits for the first part: it starts at one block and the
        # next ones double, so that the nearest bytes come first (a new connection carries little
        # in its first round trips) while the later parts are big. Readers reading ahead together
        # share the host's connections, and each part leaves its connection idle for a round trip
        # before the next one's first byte: theirs start at four blocks (at 80 ms, 4 readers of one
        # file went from 0.93 to 0.95 of 8 curls; a reader alone lost as much, a run's opening too).
        opening_run = stream.run_end and not stream.crossings
        nearest = 1 if readers == 1 or opening_run else min(4, part_blocks)
        size = nearest if first * bs <= end + bs else part_blocks
        parts = []
        while first <= last:
            blocks = size
            if size == part_blocks:  # whole parts vary in size, in turn (see _STAGGER)
                blocks = max(part_blocks * _STAGGER[stream.parts % len(_STAGGER)] // 4, 1)
                stream.parts += 1
            part_last = min(first + blocks - 1, last)
            parts.append((first, part_last))
            first = stream.next_block = part_last + 1
            size = min(size * 2, part_blocks)
        # The opening of a run of chunks asks for a block or two (the next chunk's end bounds it):
        # each comes as several ranges at once (over the connections one object may use: all of
        # the host's but one), so that more connections go through their TCP slow start now, with
        # the bytes the reader needs first, rather than after it went on into the next chunk, when
        # the read-ahead opens wide (at 80 ms the opening took 0.57 s instead of 0.67).
        ranges = 1
        if self.spread_openings and opening_run and parts:
            ranges = max(1, min((self._parallel(uid) - 1) // len(parts), bs // _SPREAD_MIN))
        if parts:
            # One task starts them in order (tasks of their own would take the host's slots in any order)
            # (ranked by distance from where the stream began: in order within a stream, and the
            # streams of one object in turn)
            self.cache.read_ahead(uid, parts, stream.begin // bs, ranges)
        stream.hold(bs)

    def _next_reader(self, uid: int, stream: _Stream, end: int) -> int:
        """Where the nearest other stream of `uid` reading ahead now began, past `end` (else the
        largest int)."""
        return min((other.begin for other in self._files.get(uid, ())
                    if other is not stream and other.begin > end and other in self._active), default=1 << 62)

    def _opening(self, uid: int) -> int:
        """A new stream's first window: four blocks per request the host gets at once, so that every
        connection carries a part while the reader waits for its first block (8 blocks at least)."""
        return max(8, 4 * self._parallel(uid)) * self.cache.block_size

    def _parallel(self, uid: int) -> int:
        """How many read-ahead requests the host of `uid` gets at once (4 without a pacer)."""
        pacer = getattr(self.cache, "pacer", None)
        return pacer.parallel(uid) if pacer is not None else 4

    def _link_window(self, uid: int) -> int:
        """Twice the bandwidth-delay product measured for the host of `uid` (0 until measured)."""
        pacer = getattr(self.cache, "pacer", None)
        return pacer.bdp(uid) * 2 if pacer is not None else 0

    def _scanning(self, stream: _Stream) -> int:
        """How many streams read ahead within the last `_ACTIVE` seconds (this one included)."""
        now = trio.current_time()
        active = self._active
        active[stream] = now
        if now - self._pruned > _ACTIVE / 4:
            self._pruned = now
            for old in [s for s, seen in active.items() if now - seen > _ACTIVE]:
                del active[old]
        pacer = getattr(self.cache, "pacer", None)
        if pacer is not None:
            pacer.note_readers(len(active))
        return len(active)

    def statistics(self) -> dict:
        """What the read-ahead fetched ahead of readers, and what of it was read (used) or evicted
        unread (wasted); the rest is still in the cache, unread. Blocks, and their bytes: counters only
        (fuse/metrics.py exports every number of this section as one)."""
        cache = self.cache
        count = lambda name: getattr(cache, name, 0)  # noqa: E731 - (a cache without read-ahead counters)
        return {"fetched_blocks": count("prefetched"), "fetched_bytes": count("prefetched_bytes"),
                "used_blocks": count("prefetch_used"), "used_bytes": count("prefetch_used_bytes"),
                "wasted_blocks": self.budget.prefetch_wasted, "wasted_bytes": count("prefetch_wasted_bytes"),
                "openings_skipped": self.openings_skipped}

    def _wasted(self, uid: int, index: int) -> None:
        """Block `index` of `uid`, read ahead, was evicted unread: stop the stream that asked for it."""
        bs = self.cache.block_size
        for stream in self._files.get(uid, ()):
            if stream.reached // bs <= index < stream.next_block and not stream.stopped:
                stream.stopped = True
                stream.next_block = stream.reached // bs  # its lead no longer counts
                stream.hold(bs)
