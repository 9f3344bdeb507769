"""Views decide what each key's file contains.

`RawView` serves the referenced bytes verbatim: inline data from memory, byte ranges and whole
files through the block cache. The decoded view (refmount.view.decoded) builds on it. A view answers:
which keys/directories are hidden, each file's size, its bytes, and its extended attributes.
"""

from __future__ import annotations

import logging

import numpy as np

from refmount.cache.blocks import BlockCache
from refmount.errors import Absent, FetchError, NotFound
from refmount.fetch import Fetcher, redact
from refmount.cache.lru import SingleFlightLRU
from refmount.fetch.protocols import is_remote
from refmount.readahead.streams import ReadStreams
from refmount.view.gridahead import GridAhead
from refmount.refs import INLINE, WHOLE_FILE, RefSet
from refmount.refs.origins import origins_of

log = logging.getLogger("refmount")

_WALKED_CHUNK_MAX = 16 << 20  # chunks up to this size read in a walk over their grid are fetched whole


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
                                    opening=offset == 0 and end >= self.cache.block_size, next_key_end=next_key_end,
                                    served=not exact)  # (exact: a shard's inner chunks, for a decoder)
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
