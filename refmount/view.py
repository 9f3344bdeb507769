"""Views decide what each key's file contains.

`RawView` serves the referenced bytes verbatim: inline data from memory, byte ranges and whole
files through the block cache. The decoded view (refmount.decoded) builds on it. A view answers:
which keys/directories are hidden, each file's size, its bytes, and its extended attributes.
"""

from __future__ import annotations

from collections import OrderedDict

import trio

from refmount.cache import BlockCache
from refmount.errors import FetchError
from refmount.fetch import Fetcher, redact
from refmount.lru import SingleFlightLRU
from refmount.refs import INLINE, WHOLE_FILE, RefSet


class ReadStreams:
    """Sequential read-ahead per remote file, in the style of mountpoint-s3, over the remote file's
    own offsets: a scan through consecutive chunk files of one remote file is read ahead like one
    big file.

    Each remote file keeps a few streams (parallel readers walking different parts of it). A read
    continues a stream when it starts after the stream's last read did and at most `gap` past
    where the stream has got to (chunks of a netCDF-4 file sit between small metadata blocks; the
    kernel's readahead requests may arrive out of order); the stream's window then doubles, from
    two blocks up to `max_window`. Any other read starts a new stream, replacing the oldest, whose
    read-ahead stays within the key it read. The blocks ahead are fetched by background tasks
    through the same single-flight cache."""

    def __init__(self, cache: BlockCache, gap: int = 64 << 10, max_window: int = 64 << 20,
                 streams: int = 8, files: int = 4096) -> None:
        self.cache = cache
        self.gap = gap
        self.max_window = max_window
        self.streams = streams
        self.files = files
        # url id -> streams: [end reached, window, last block fetched ahead, start of the last read,
        # reads in a row that went on from the one before]
        self._files: OrderedDict[int, list[list[int]]] = OrderedDict()

    def on_read(self, uid: int, start: int, end: int, key_end: int, limit: int | None,
                prefetch: bool = True, small: bool = False) -> bool:
        """Record a read of [start, end) of remote file `uid` (of a key ending at `key_end`) and
        fetch ahead, up to `limit` if the remote file's end is known. A read that starts a stream
        fetches ahead only within its key; for a `small` chunk, only a stream that went on twice in
        a row reads ahead (random small reads do land right after another now and then). True if
        the read continued a scan."""
        bs = self.cache.block_size
        streams = self._files.pop(uid, None) or []
        for stream in streams:
            if stream[3] < start <= stream[0] + self.gap:
                stream[1] = min(max(stream[1] * 2, 2 * bs), self.max_window)
                stream[0] = max(stream[0], end)
                stream[3] = start
                stream[4] += 1
                prefetch = prefetch and (not small or stream[4] >= 2)
                scan = True
                break
        else:
            stream = [end, 2 * bs, -1, start, 0]
            streams = streams[len(streams) + 1 - self.streams :] + [stream]
            limit = key_end  # one read is no scan yet: read ahead within its key only
            prefetch = prefetch and not small
            scan = False
        self._files[uid] = streams
        if len(self._files) > self.files:
            self._files.popitem(last=False)
        stop = end + stream[1] if limit is None else min(limit, end + stream[1])
        first = max(end // bs, stream[2] + 1)
        last = (stop - 1) // bs
        if prefetch and stop > end and first <= last:
            stream[2] = last
            trio.lowlevel.spawn_system_task(self.cache.prefetch, uid, first, last)
        return scan


class RawView:
    name = "raw"
    hides_nothing = True  # listings may skip asking hidden() per key

    def __init__(self, refset: RefSet, fetcher: Fetcher, cache: BlockCache, prefetch: bool = True,
                 exact_small_reads: bool = True) -> None:
        self.refset = refset
        self.fetcher = fetcher
        self.cache = cache
        self.prefetch = prefetch
        self.streams = ReadStreams(cache)
        # Chunks up to a quarter block read at random are fetched alone; scans fetch whole blocks,
        # which coalesces neighbouring chunks into one request. (The disk cache stores whole blocks
        # only, so with it every read goes by blocks.)
        self.small_chunk = cache.block_size // 4 if exact_small_reads else 0
        self._whole_sizes = SingleFlightLRU(1 << 62)  # url id -> size of the whole remote object (all kept)

    # -- visibility -------------------------------------------------------------------------------

    def hidden(self, i: int) -> bool:
        return False

    def hidden_dir(self, d: int) -> bool:
        return False

    # -- sizes ------------------------------------------------------------------------------------

    def known_size(self, i: int) -> int | None:
        """The size without I/O, or None (a whole-file reference not yet looked up)."""
        uid, _, length = self.refset.target(i)
        if length != WHOLE_FILE:
            return length
        return self._whole_sizes.peek(uid)

    async def size(self, i: int) -> int:
        known = self.known_size(i)
        if known is not None:
            return known
        uid = self.refset.target(i)[0]
        return await self._whole_sizes.get(uid, lambda: self.fetcher.size(self.refset.urls[uid]))

    # -- bytes ------------------------------------------------------------------------------------

    async def read(self, i: int, offset: int, size: int) -> bytes:
        """Exactly the file's bytes [offset, offset+size) clipped to its size, or FetchError."""
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
        small = not whole and length <= self.small_chunk
        # Seen on arrival (the kernel's readahead requests may finish out of order).
        # Read-ahead stops at the end of the remote object once a response has told its size.
        limit = base + length if whole else self.fetcher.known_size(self.refset.urls[uid])
        scan = self.streams.on_read(uid, base + offset, base + end, base + length, limit,
                                    prefetch=self.prefetch, small=small)
        if small and not scan:
            data = (await self.cache.read_exact(uid, base, base + length))[offset:end]
        else:
            data = await self.cache.read(uid, base + offset, base + end)
        if len(data) != end - offset:
            raise FetchError(f"{redact(self.refset.urls[uid])}: the object ends before byte {base + end} "
                             f"that key {self.refset.key(i)!r} refers to")
        return data

    async def read_all(self, i: int) -> bytes:
        return await self.read(i, 0, await self.size(i))

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
