"""Views decide what each key's file contains.

`RawView` serves the referenced bytes verbatim: inline data from memory, byte ranges and whole
files through the block cache. The decoded view (refmount.view.decoded) builds on it. A view answers:
which keys/directories are hidden, each file's size, its bytes, and its extended attributes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import numpy as np
import trio

from refmount.cache.budget import MemoryBudget
from refmount.cache.blocks import BlockCache
from refmount.errors import Absent, FetchError, NotFound
from refmount.fetch import Fetcher, redact
from refmount.cache.lru import SingleFlightLRU
from refmount.fetch.protocols import is_remote
from refmount.view.gridahead import GridAhead
from refmount.refs import INLINE, WHOLE_FILE, RefSet
from refmount.refs.origins import origins_of

log = logging.getLogger("refmount")

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
_WALKED_CHUNK_MAX = 16 << 20  # chunks up to this size read in a walk over their grid are fetched whole


class _Stream:
    """One sequential reader of a remote file, as ReadStreams sees it."""

    __slots__ = ("begin", "reached", "window", "next_block", "last_start", "in_a_row", "key_end", "crossings",
                 "scanning", "stopped", "parts", "run_end")

    def __init__(self, start: int, end: int, key_end: int, window: int) -> None:
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

    def lead(self, block_size: int) -> int:
        """Bytes asked for ahead of the reader (what its read-ahead holds of the budget)."""
        return max(self.next_block * block_size - self.reached, 0)


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
        self._pruned = 0.0

    def on_read(self, uid: int, start: int, end: int, key_end: int, limit: int | None,
                prefetch: bool = True, small: bool = False, opening: bool = False,
                next_key_end: int = 0) -> bool:
        """Record a read of [start, end) of remote file `uid` (of a key ending at `key_end`) and
        fetch ahead, up to `limit` if the remote file's end is known. A stream that has not gone on
        from one key into the next fetches ahead only within its key; for a `small` read, only a
        stream that went on twice in a row reads ahead. A read at the start of a run of keys that
        follow one another in the remote file (`next_key_end`: where the next of them ends) that
        starts a stream reads ahead to the end of that next key at once, as a scan would: a reader
        of one chunk costs at most one chunk more, and a scan need not wait for its second chunk to
        show itself. True if the read continued a scan of the remote file (one that crossed keys,
        or went on within a key that ends at `limit`), or opened one at the start of a run."""
        bs = self.cache.block_size
        budget = self.budget
        streams = self._files.pop(uid, None) or []
        for stream in streams:
            # A proven scan may see the kernel's readahead requests arrive out of order: one a little
            # ahead continues it, one behind (inside what it read) is part of it, not a new stream.
            ahead = max(self.gap, 2 * bs) if stream.scanning else self.gap
            if stream.scanning and stream.begin <= start < stream.last_start and end <= stream.reached:
                self._files[uid] = streams
                return True
            if stream.last_start < start and stream.reached - self.gap <= start <= stream.reached + ahead:
                budget.ahead -= stream.lead(bs)
                stream.reached = max(stream.reached, end)
                stream.last_start = start
                stream.in_a_row += 1
                if key_end != stream.key_end:
                    stream.key_end = key_end
                    stream.crossings += 1
                # Random small reads do land next to another now and then, and the kernel splits one
                # around pages it has: small reads are a scan once two went on from the one before,
                # across keys or over more than `proof` bytes.
                proven = not small or (stream.in_a_row >= 2 and (stream.crossings >= 2
                                                                  or stream.reached - stream.begin > self.proof))
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
                budget.ahead += stream.lead(bs)
                break
        else:
            # A read of a block or more from the start of a key (how the kernel's readahead begins a
            # file) opens with a wider window, fetched as several parts at once: on a long link the
            # connections' slow start then runs in parallel rather than one after another.
            # So does a read of a block or more beside a wide reader of the remote file (parallel
            # readers of its parts, as `dd skip=`): each ramps as fast as a lone reader from its start
            # would, and those of them that began narrow before a wide one came open as wide. (Random
            # reads of a block or more stay narrow: their streams are never wide.)
            wide = self._opening(uid)
            siblings = [s for s in streams if s in self._active] if end - start >= bs else []
            opening = opening or next_key_end > 0 or any(s.window >= wide for s in siblings)
            stream = _Stream(start, end, key_end, wide if opening else 2 * bs)
            if opening:
                for sibling in siblings:
                    sibling.window = max(sibling.window, wide)
            if len(streams) >= self.streams:
                for old in streams[: len(streams) + 1 - self.streams]:
                    budget.ahead -= old.lead(bs)
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
                budget.ahead -= old.lead(bs)
        if prefetch and not stream.stopped:
            self._read_ahead(uid, stream, end, limit)
        return scan or continued

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
        budget.ahead -= stream.lead(bs)
        # Within the read-ahead share of the budget, split fairly among the streams reading now.
        readers = self._scanning(stream)
        share = budget.prefetch_limit // readers
        last = min((stop - 1) // bs, (stream.reached + min(budget.prefetch_room(), share)) // bs - 1)
        # Parts spread the window over the stream's share of the host's parallel requests: while
        # connections are new (TCP slow start) several small parts move more than one big one; a
        # long window gives big parts.
        part = min(max(stream.window // max(self._parallel(uid) // readers, 1), bs), self.max_part)
        # Wait until a whole part is lacking, unless the reader has caught up or the read-ahead
        # reaches its end (of the key, the object or where another reader is).
        reaches_end = stop < window_end and (last + 1) * bs >= stop
        if first > last or ((last - first + 1) * bs < part and first * bs > end and not reaches_end):
            budget.ahead += stream.lead(bs)
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
        budget.ahead += stream.lead(bs)

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
                "wasted_blocks": self.budget.prefetch_wasted, "wasted_bytes": count("prefetch_wasted_bytes")}

    def _wasted(self, uid: int, index: int) -> None:
        """Block `index` of `uid`, read ahead, was evicted unread: stop the stream that asked for it."""
        bs = self.cache.block_size
        for stream in self._files.get(uid, ()):
            if stream.reached // bs <= index < stream.next_block and not stream.stopped:
                self.budget.ahead -= stream.lead(bs)
                stream.stopped = True
                stream.next_block = stream.reached // bs  # its lead no longer counts


class PastEnd:
    """Keys whose byte range runs past the end of their object, served as fsspec serves them: the
    bytes that exist. kerchunk's GRIB scanner writes such ranges (`["{{u}}", 0, 1653931904]` for a
    2772-byte file), and cfgrib's codec decodes what exists.

    A key's size is its reference's length until the object's size is known, then what the object
    holds of the range (0 if it starts past the end), so that stats agree with what reads return. An
    object's size becomes known at mount for objects whose sizes the caller already has (RawView.
    known_object_sizes: scanned files), at the first stat or listing of one of its keys for local
    objects, and with the first response of its server for remote ones. Then every key of the object
    whose range runs past it is resized at once, and `resized` (set by the filesystem) is told the keys
    whose old size the kernel may have cached (from a listing or a stat before the size was known), so
    that it invalidates them. One warning per key names it and both lengths. An object whose
    validators changed while mounted still fails with EIO (the fetcher raises RemoteChanged before any
    bytes are served).

    Object sizes are kept per url id in a growing int64 array (8 bytes per url; a stat costs an
    array lookup, not a call into the fetcher): UNSEEN, REMOTE_UNKNOWN (remote, no response told its
    size yet) or the size."""

    UNSEEN, REMOTE_UNKNOWN = -2, -1
    MAX_WARNINGS = 20

    def __init__(self, refset) -> None:
        self.refset = refset
        # the url ids the set refers to: all of its table, or (`url_span`) a part of a table shared by
        # many sets (a lazily mounted glob's files: 8 bytes for the file's own url, not for every file's)
        self._lo, self._hi = getattr(refset, "url_span", None) or (0, len(refset.urls))
        self.sizes = np.full(max(self._hi - self._lo, 1), self.UNSEEN, dtype=np.int64)
        self.clipping = False  # some object ends before a key's range does
        self.resized = None  # callable(list of key indexes) whose cached sizes must go (the filesystem's)
        self._warned: set[int] = set()
        self._furthest: np.ndarray | None = None  # per url id: where its keys' ranges end, at most (see learn)
        self._by_url: np.ndarray | None = None  # key indexes in url id order, and where each url's begin
        self._url_bounds: np.ndarray | None = None

    def get(self, uid: int) -> int:
        j = uid - self._lo
        return self.sizes.item(j) if 0 <= j < len(self.sizes) else self.UNSEEN

    def set(self, uid: int, size: int) -> None:
        if uid < self._lo:  # (a url outside the set's span: the span grows down to it)
            grown = np.full(len(self.sizes) + self._lo - uid, self.UNSEEN, dtype=np.int64)
            grown[self._lo - uid:] = self.sizes
            self.sizes, self._lo, self._furthest, self._by_url = grown, uid, None, None
        j = uid - self._lo
        if j >= len(self.sizes):  # a lazy (Parquet) set's url table grows as records load
            grown = np.full(max(2 * len(self.sizes), j + 1), self.UNSEEN, dtype=np.int64)
            grown[: len(self.sizes)] = self.sizes
            self.sizes = grown
        self.sizes[j] = size

    def clip(self, uid: int, offset: int, length: int) -> int:
        """The key's size: `length`, or what its object holds of the range once its size is known."""
        size = self.get(uid)
        return length if size < 0 or offset + length <= size else max(size - offset, 0)

    def learn(self, uid: int, size: int, serving: int = -1, shown: bool = True) -> None:
        """The object of url id `uid` holds `size` bytes (or at most that many: an empty read past the end
        of an object whose size no response told gives only that). Keys whose range runs past it are
        resized, warned about, and, if the kernel may have been `shown` their old size, passed to
        `resized`, but for `serving`, a key being read short (the kernel itself shrinks a file a read of
        which comes back short)."""
        known = self.get(uid)
        if 0 <= known <= size:
            return
        self.set(uid, size)
        keys = self._keys_past(uid, size)
        if not keys:
            return
        self.clipping = True
        for i in keys:
            self._warn(i, uid)
        if self.resized is not None and shown:
            stale = [i for i in keys if i != serving]
            if stale:
                self.resized(stale)

    def found(self, i: int, uid: int, object_size: int) -> None:
        """Key i, being stat'ed or read short, runs past its object's end, `object_size` (or an upper
        bound of it)."""
        self.learn(uid, object_size, serving=i)
        self.clipping = True
        self._warn(i, uid)

    def _keys_past(self, uid: int, size: int) -> list[int]:
        """The keys of url id `uid` whose range ends past `size` (of a lazy set: none; each is sized at
        its own first stat, once its records are loaded)."""
        refset = self.refset
        url_ids = getattr(refset, "url_id", None)
        if not isinstance(url_ids, np.ndarray):
            return []
        lo = self._lo  # (array positions are url id - lo)
        span = (self._hi if getattr(refset, "url_span", None) else len(refset.urls)) - lo
        if self._furthest is None or len(self._furthest) < span:
            # Where each object's furthest key ends, computed once: an object learnt then costs an
            # array lookup, not a pass over every key, unless some key of it does run past its end.
            furthest = np.zeros(span + 1, dtype=np.int64)
            ranged = (url_ids >= lo) & (url_ids < lo + span) & (refset.length != WHOLE_FILE)
            np.maximum.at(furthest, url_ids[ranged] - lo, refset.offset[ranged] + refset.length[ranged])
            self._furthest = furthest
            self._by_url = None
        j = uid - lo
        if not 0 <= j < len(self._furthest) or self._furthest[j] <= size:
            return []
        if self._by_url is None:
            # The keys grouped by url (once, on the first object that ends before a key): kerchunk's
            # GRIB sets have a key past the end in every file, a pass over every key for each costs
            # too much.
            order = np.argsort(url_ids, kind="stable")
            self._by_url = order.astype(np.int32) if len(order) < 2**31 else order
            self._url_bounds = np.searchsorted(url_ids[order], np.arange(lo, lo + len(self._furthest) + 1))
        keys = self._by_url[self._url_bounds[j] : self._url_bounds[j + 1]]
        past = (refset.length[keys] != WHOLE_FILE) & (refset.offset[keys] + refset.length[keys] > size) \
            & (refset.dir_of[keys] >= 0)
        return keys[past].tolist()

    def _warn(self, i: int, uid: int) -> None:
        if i in self._warned or len(self._warned) > self.MAX_WARNINGS:
            return
        self._warned.add(i)
        if len(self._warned) > self.MAX_WARNINGS:
            log.warning("more keys refer to bytes past their object's end (not logged; each serves the bytes "
                        "that exist)")
            return
        _, offset, length = self.refset.target(i)
        log.warning("key %r refers to %d bytes at offset %d of %s, whose object ends after %d bytes: serving the "
                    "%d bytes that exist (as fsspec does)", self.refset.key(i), length, offset,
                    redact(self.refset.urls[uid]), self.get(uid), self.clip(uid, offset, length))


class RawView:
    name = "raw"
    hides_nothing = True  # listings may skip asking hidden() per key

    def __init__(self, refset: RefSet, fetcher: Fetcher, cache: BlockCache, prefetch: bool = True,
                 exact_small_reads: bool = True, streams=None) -> None:
        """`streams`: the read-ahead of views sharing `cache` (one per cache: it keys by url id)."""
        self.refset = refset
        self.fetcher = fetcher
        self.cache = cache
        self.prefetch = prefetch
        self.streams = streams if streams is not None else ReadStreams(cache)
        # (the disk cache stores and fetches whole blocks only)
        self.streams.spread_openings = exact_small_reads
        # Chunks up to a quarter block read at random are fetched alone; scans fetch whole blocks,
        # which coalesces neighbouring chunks into one request. (The disk cache stores whole blocks
        # only, so with it every read goes by blocks.)
        self.small_chunk = cache.block_size // 4 if exact_small_reads else 0
        # Chunks of arrays read in a walk over their grid (a point's time series, a tile, a cube)
        # are predicted and fetched as exact ranges (view/gridahead.py); the byte streams above
        # read ahead only for scans. (Not over the disk cache, which fetches whole blocks only.)
        self.grid = GridAhead(refset, cache) if exact_small_reads else None
        self._whole_sizes = SingleFlightLRU(1 << 62)  # url id -> size of the whole remote object (all kept)
        # A native Zarr store's chunk keys come from each array's grid (refs/zarrremote.py), whether or not
        # the chunk was written: a 404 for one is a chunk that is not there, remembered (its url id).
        self._may_lack = bool(getattr(refset, "may_lack", False))
        self._absent: set[int] = set()
        self.past_end = PastEnd(refset)  # objects that end before a key's range does
        self.bytes_served = 0  # what readers got from remote objects (fetched / served = amplification)
        self.reads_served = 0

    # -- visibility -------------------------------------------------------------------------------

    def hidden(self, i: int) -> bool:
        return False

    def hidden_dir(self, d: int) -> bool:
        return False

    # -- sizes ------------------------------------------------------------------------------------

    def known_size(self, i: int) -> int | None:
        """The size without I/O, or None (a whole-file reference not yet looked up)."""
        uid, offset, length = self.refset.target(i)
        if length != WHOLE_FILE:
            return self.past_end.clip(uid, offset, length) if self.past_end.clipping and uid >= 0 else length
        return self._whole_sizes.peek(uid)

    async def size(self, i: int) -> int:
        """The key's size: its reference's length, or less where its object is known to end before
        the range does (see PastEnd)."""
        uid, offset, length = self.refset.target(i)
        if length == WHOLE_FILE:
            known = self._whole_sizes.peek(uid)
            if known is None:
                if uid in self._absent:
                    raise Absent(f"{self.refset.key(i)!r} is not in its store")
                try:
                    known = await self._whole_sizes.get(uid, self._object_size(uid))
                except NotFound:
                    if not self._may_lack:
                        raise
                    self._absent.add(uid)  # (a 403 or 5xx stays an error: only a 404 is a missing chunk)
                    raise Absent(f"{self.refset.key(i)!r} is not in its store") from None
                self.past_end.learn(uid, known)  # (ranges of other keys may run past it)
            return known
        if uid == INLINE:
            return length
        object_size = self.past_end.get(uid)
        if object_size == PastEnd.UNSEEN:
            object_size = await self._first_size(uid)
        if offset + length > object_size >= 0:
            self.past_end.found(i, uid, object_size)
            return self.past_end.clip(uid, offset, length)
        return length

    async def _first_size(self, uid: int) -> int:
        """What is known of an object's size at the first stat of one of its keys: a local file's is
        looked up (once); a remote one's only if a response told it already (no request is made)."""
        url = self.refset.urls[uid]
        size = self.fetcher.known_size(url)
        if size is None and not is_remote(url):
            try:
                size = await self._whole_sizes.get(uid, self._object_size(uid))
            except FetchError:
                return PastEnd.UNSEEN  # (a read reports why; the next stat tries again)
        if size is None:
            self.past_end.set(uid, PastEnd.REMOTE_UNKNOWN)
        else:  # (a local object's keys were not shown yet: every stat and listing of one comes here first;
            # a listing shows a remote object's keys with their declared length)
            self.past_end.learn(uid, size, shown=is_remote(url))
        return self.past_end.get(uid)

    async def learn_sizes(self, keys) -> None:
        """Before a listing shows these keys' sizes: look up the sizes of the local objects they refer to
        that no stat has seen yet (a listing's sizes are what the kernel shows `ls -l`). Remote objects
        are not asked: their sizes come with their first response."""
        if not self.refset.urls or not isinstance(getattr(self.refset, "url_id", None), np.ndarray):
            return
        keys = np.asarray(keys, dtype=np.int64)
        uids = self.refset.url_id[keys[keys < len(self.refset.url_id)]]
        # (a set, not np.unique: numpy 2's np.unique imports numpy.ma, 20-30 ms of the first listing)
        for uid in sorted(set(uids[uids >= 0].tolist())):
            if self.past_end.get(uid) == PastEnd.UNSEEN and not is_remote(self.refset.urls[uid]):
                await self._first_size(uid)

    def known_object_sizes(self, sizes: dict[str, int]) -> None:
        """Sizes of referenced objects that the caller knows already (url -> bytes; e.g. the files it
        scanned, at mount): keys whose range runs past their object's end are sized by it from their
        first stat on, with no request (unknown urls are ignored). Call it before serving, or from the
        trio thread (it may invalidate what the kernel was shown)."""
        ids = {url: n for n, url in enumerate(self.refset.urls)}
        for url, size in sizes.items():
            uid = ids.get(url)
            if uid is not None and size is not None and size >= 0:
                self.past_end.learn(uid, int(size))

    def watch_sizes(self, resized) -> None:
        """`resized(keys)` is called with the keys whose size shrank once their object's size was known
        (the kernel may hold their old size)."""
        self.past_end.resized = resized

    def _object_size(self, uid: int):
        return lambda: self.fetcher.size(self.refset.urls[uid])

    # -- bytes ------------------------------------------------------------------------------------

    async def read(self, i: int, offset: int, size: int, exact: bool = False):
        """Exactly the file's bytes [offset, offset+size) clipped to its size, or FetchError: bytes,
        or a memoryview of a cached block (a FUSE reply needs no copy). `exact`: fetch only these
        bytes even if the key is small (a shard's index or one inner chunk of it), unless they
        continue a scan."""
        uid, base, ref_length = self.refset.target(i)
        if uid == INLINE:
            return self.refset.inline_data(i)[offset : offset + size]
        length = await self.size(i)
        end = min(offset + size, length)
        if end <= offset:
            return b""
        whole = ref_length == WHOLE_FILE
        if whole:
            base = 0
        # a small chunk, or a small read of a big chunk or object: read-ahead only once a stream
        # went on twice in a row (the kernel's own sequential reads arrive as bigger pieces)
        small_key = not whole and length <= self.small_chunk
        small = small_key or end - offset <= self.small_chunk
        # Seen on arrival (the kernel's readahead requests may finish out of order).
        # Read-ahead stops at the end of the remote object once a response has told its size.
        limit = base + length if whole else self.fetcher.known_size(self.refset.urls[uid])
        # A chunk of up to a block is read whole by its readers (zarr, netCDF-C), though the kernel
        # may ask for it in pieces: a read from its start at random fetches all of it in one request,
        # and its other pieces come from that (nothing to read ahead for them).
        chunk = not whole and not exact and self.small_chunk and length <= self.cache.block_size
        # A chunk of an array walked over its grid (not scanned): the grid read-ahead may have it
        # fetched already, and the byte stream must not run ahead past the walk's chunks.
        walk = None if whole or exact or self.grid is None else self.grid.on_read(i, offset == 0, self.prefetch)
        chunk_fetched = (chunk or walk in ("walk", "scan")) and self.cache.has_exact(uid, base, base + length)
        # A read from the start of a chunk that begins a run of chunks following one another in the
        # remote file is how a scan of a variable starts (`cat` of its chunk files in order): read
        # ahead to the end of the next chunk at once rather than after it (a reader of that one
        # chunk alone pays one chunk more; the scan ramps up once it goes on into the next). A
        # chunk after another one read at random stays one exact request; small chunks wait for a
        # proven scan.
        # (a small chunk is no scan until its array's walk shows one: one read of it, whole, is all)
        walking = walk == "walk" or (walk == "new" and small_key)
        next_key_end = (self._next_in_run(i, uid, base, length)
                        if offset == 0 and not whole and not exact and length > self.small_chunk and not walking else 0)
        scan = self.streams.on_read(uid, base + offset, base + end, base + length, limit,
                                    prefetch=self.prefetch and not chunk_fetched and not walking, small=small,
                                    opening=offset == 0 and end >= self.cache.block_size, next_key_end=next_key_end)
        scan = scan and not walking
        # (a walk's chunk not predicted is fetched whole at its first read too: its readers read it
        # whole, and its other pieces then come from that rather than a request each)
        walked_chunk = walking and offset == 0 and length <= _WALKED_CHUNK_MAX
        whole_chunk = chunk_fetched or ((chunk or walked_chunk) and offset == 0 and not scan)
        if (small_key and not scan and not exact) or whole_chunk:  # (readers usually read a small chunk whole)
            data = (await self.cache.read_exact(uid, base, base + length))[offset:end]
        elif not scan and self.small_chunk and ((base + offset) % self.cache.block_size
                                                 or (base + end) % self.cache.block_size):
            # a read at random (of a big chunk, or inside one): exactly its bytes, not the blocks
            # around them, which a random reader would mostly never use (fetched / read stays ~1).
            # (Whole blocks are the same bytes either way, kept as blocks: the first read of a
            # reader that goes on is not fetched again as a block.)
            data = await self.cache.read_exact(uid, base + offset, base + end)
        else:
            data = await self.cache.read(uid, base + offset, base + end)
        if self.past_end.get(uid) < 0 and not whole:  # learn the object's size once a response told it
            known = self.fetcher.known_size(self.refset.urls[uid])
            if known is not None and len(data) == end - offset:
                self.past_end.learn(uid, known)
        if len(data) != end - offset:
            url = self.refset.urls[uid]
            # A short read: the object ends there (Fetcher.read), or before it if nothing came back.
            ends = base + offset + len(data)
            known = self.fetcher.known_size(url)
            if whole or (known is not None and known != ends and (len(data) > 0 or known > ends)):
                raise FetchError(f"{redact(url)}: the object ends before byte {base + end} "
                                 f"that key {self.refset.key(i)!r} refers to")
            self.past_end.found(i, uid, known if known is not None else ends)
        self.bytes_served += end - offset
        self.reads_served += 1
        return data

    def _next_in_run(self, i: int, uid: int, base: int, length: int) -> int:
        """If key `i` is the first of a run of chunks laid out one after another in one remote file
        (the key after it, in the reference set's order, starts where `i` ends, within the
        read-ahead's gap, and the key before does not end where `i` starts): where the key after it
        ends in the remote file. Otherwise 0."""
        refset, gap = self.refset, self.streams.gap
        if not refset.exists(i + 1):
            return 0
        after_uid, after_offset, after_length = refset.target(i + 1)
        if after_uid != uid or after_length == WHOLE_FILE or not 0 <= after_offset - (base + length) <= gap:
            return 0
        if i > 0 and refset.exists(i - 1):
            before_uid, before_offset, before_length = refset.target(i - 1)
            if before_uid == uid and before_length != WHOLE_FILE and 0 <= base - (before_offset + before_length) <= gap:
                return 0
        return after_offset + after_length

    async def read_all(self, i: int) -> bytes:
        data = await self.read(i, 0, await self.size(i))
        return data if isinstance(data, bytes) else bytes(data)

    def sources(self, i: int) -> list[str]:
        """Where key `i`'s bytes come from: its reference's url, or for inline data the files the
        reference set read or scanned it from (refs/origins.py; what --allow-other checks)."""
        uid = self.refset.target(i)[0]
        return list(origins_of(self.refset).of(self.refset.key(i))) if uid == INLINE else [self.refset.urls[uid]]

    # -- extended attributes ----------------------------------------------------------------------

    def xattrs(self, i: int) -> dict[str, str]:
        uid, offset, length = self.refset.target(i)
        if uid == INLINE:
            return {"user.refmount.source": "inline"}
        known = self.known_size(i)
        return {
            "user.refmount.url": redact(self.refset.urls[uid]),
            "user.refmount.offset": str(0 if length == WHOLE_FILE else offset),
            "user.refmount.length": str(known) if known is not None else "whole file",
        }
