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


class SequentialPrefetch:
    """Adaptive read-ahead in the style of mountpoint-s3: per file, a window that starts at two
    blocks, doubles while reads stay sequential (up to `max_window`) and resets on a seek. The
    blocks ahead are fetched by background tasks through the same single-flight cache."""

    def __init__(self, cache: BlockCache, max_window: int = 64 << 20, tracked: int = 1024) -> None:
        self.cache = cache
        self.max_window = max_window
        self.tracked = tracked
        self._files: OrderedDict[int, list] = OrderedDict()  # key index -> [next offset, window, ahead]

    def on_read(self, i: int, uid: int, base: int, offset: int, end: int, length: int) -> None:
        bs = self.cache.block_size
        state = self._files.get(i)
        if state is not None and offset == state[0]:
            state[1] = min(state[1] * 2, self.max_window)
        elif offset == 0:
            state = [0, 2 * bs, -1]
        else:
            self._files.pop(i, None)
            return
        state[0] = end
        self._files[i] = state
        self._files.move_to_end(i)
        if len(self._files) > self.tracked:
            self._files.popitem(last=False)
        stop = min(base + length, base + end + state[1])
        if stop <= base + end:
            return
        first = max((base + end) // bs, state[2] + 1)
        last = (stop - 1) // bs
        if first <= last:
            state[2] = last
            trio.lowlevel.spawn_system_task(self.cache.prefetch, uid, first, last)


class AccessPattern:
    """Tells random reads of small chunks from scans. A read is part of a scan when it starts at or
    just after (within `gap`: chunks of a netCDF-4 file are interleaved with small metadata blocks)
    where a recent read of the same remote file ended; several recent ends are kept per
    file so that parallel readers walking different parts of it each still look sequential."""

    def __init__(self, gap: int, recent: int = 8, files: int = 4096) -> None:
        self.gap = gap
        self.recent = recent
        self.files = files
        self._ends: OrderedDict[int, list[int]] = OrderedDict()  # url id -> recent end offsets

    def is_scan(self, uid: int, start: int, end: int) -> bool:
        ends = self._ends.pop(uid, None) or []
        scan = any(0 <= start - e <= self.gap for e in ends)
        ends.append(end)
        self._ends[uid] = ends[-self.recent :]
        if len(self._ends) > self.files:
            self._ends.popitem(last=False)
        return scan


class RawView:
    name = "raw"

    def __init__(self, refset: RefSet, fetcher: Fetcher, cache: BlockCache, prefetch: bool = True,
                 exact_small_reads: bool = True) -> None:
        self.refset = refset
        self.fetcher = fetcher
        self.cache = cache
        self.prefetch = SequentialPrefetch(cache) if prefetch else None
        # Chunks up to a quarter block read at random are fetched alone; scans fetch whole blocks,
        # which coalesces neighbouring chunks into one request. (The disk cache stores whole blocks
        # only, so with it every read goes by blocks.)
        self.small_chunk = cache.block_size // 4 if exact_small_reads else 0
        self.pattern = AccessPattern(gap=64 << 10)
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
        if ref_length == WHOLE_FILE:
            base = 0
        small = ref_length != WHOLE_FILE and length <= self.small_chunk
        if small and not self.pattern.is_scan(uid, base, base + length):
            data = (await self.cache.read_exact(uid, base, base + length))[offset:end]
        else:
            if self.prefetch is not None:  # on arrival: the kernel's readahead reads may finish out of order
                self.prefetch.on_read(i, uid, base, offset, end, length)
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
