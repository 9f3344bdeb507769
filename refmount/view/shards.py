"""Zarr v3 sharding (`sharding_indexed`) served as inner chunks in the decoded view.

A shard is one stored object holding a grid of inner chunks plus an index: for each inner chunk, in C
order, its (offset, nbytes) within the shard as little-endian uint64 pairs, (2^64-1, 2^64-1) for an
inner chunk that was never written; then, with the ``crc32c`` index codec, four bytes of CRC-32C. The
index sits at the shard's start or end (``index_location``).

The decoded view lists every inner chunk of every shard present as its own v2 chunk key (so a listing
needs no network), each pointing at its shard's bytes. `ShardLayout` is the per-array geometry (fixed
at mount); `ShardReader` reads an inner chunk: the shard's index first (verified, decoded and kept in a
small LRU per shard), then only that inner chunk's byte range. An empty inner chunk reads as the
array's fill value. A truncated shard, a bad checksum or an index pointing outside the shard is an
error (EIO), never wrong bytes.
"""

from __future__ import annotations

import math

import numpy as np
import trio

from refmount.errors import RefmountError, quote
from refmount.cache.lru import SingleFlightLRU

EMPTY = 2**64 - 1  # offset and nbytes of an inner chunk that was never written
# A shard's index is read whole for any inner chunk of it, and kept in an LRU of this size: a bigger one
# (a hostile [50,000,000] inner chunks a shard: 800 MB) would be fetched and held again at every read.
MAX_INDEX_BYTES = 16 << 20


class ShardError(RefmountError):
    """A shard's index is unreadable, fails its checksum, or points outside the shard."""


class UnsupportedSharding(ValueError):
    """A sharding configuration the decoded view does not serve (the array is hidden)."""


def _crc32c(data: bytes) -> int:
    from refmount.refs.codecs import make_codec

    codec = make_codec({"id": "crc32c"})
    return int.from_bytes(bytes(codec.encode(data))[-4:], "little")


class ShardLayout:
    """Geometry of one sharded array: shard and inner chunk shapes, where the index is and how it is
    encoded, which shards exist, and the bytes of an inner chunk that reads as fill."""

    def __init__(self, path: str, shape, shard_shape, chunk_shape, index_codecs, index_location: str) -> None:
        self.path = path
        self.shard_shape = tuple(int(s) for s in shard_shape)
        self.chunk_shape = tuple(int(c) for c in chunk_shape)
        sizes = self.chunk_shape + self.shard_shape
        if len(self.shard_shape) != len(self.chunk_shape) or not all(n > 0 for n in sizes):
            raise UnsupportedSharding(f"inner chunk shape {list(self.chunk_shape)} for shards {list(self.shard_shape)}")
        if any(s % c for s, c in zip(self.shard_shape, self.chunk_shape)):
            raise UnsupportedSharding(f"shard shape {list(self.shard_shape)} is not a multiple of the inner chunk "
                                      f"shape {list(self.chunk_shape)}")
        self.per_shard = tuple(s // c for s, c in zip(self.shard_shape, self.chunk_shape))
        self.shard_grid = tuple(-(-int(n) // s) for n, s in zip(shape, self.shard_shape))
        self.count = math.prod(self.per_shard)
        if index_location not in ("start", "end"):
            raise UnsupportedSharding(f"index_location {index_location!r}")
        self.at_start = index_location == "start"
        self.index_dtype, self.crc = _index_codecs(index_codecs)
        self.index_bytes = 16 * self.count + (4 if self.crc else 0)
        self.fill_chunk = b""  # decoded bytes of an empty inner chunk (set by the caller)
        # sorted C-order numbers of the shards that exist; None: not known (a native store's, which are
        # not listed: a missing one is found by reading it)
        self.present: np.ndarray | None = np.zeros(0, np.int64)

    def shard_of(self, coords: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
        """(shard coordinates, C-order position within the shard) of an inner chunk."""
        shard = tuple(c // p for c, p in zip(coords, self.per_shard))
        local = tuple(c % p for c, p in zip(coords, self.per_shard))
        return shard, int(np.ravel_multi_index(local, self.per_shard)) if local else 0

    def number(self, shard) -> int:
        """The C-order number of a shard in the shard grid."""
        return int(np.ravel_multi_index(tuple(shard), self.shard_grid)) if len(shard) else 0

    def has_shard(self, shard: tuple[int, ...]) -> bool:
        if self.present is None:
            return True
        number = self.number(shard)
        k = int(np.searchsorted(self.present, number))
        return k < len(self.present) and int(self.present[k]) == number

    def index_range(self, shard_length: int, key: str) -> tuple[int, int]:
        if shard_length < self.index_bytes:
            raise ShardError(f"chunk {quote(key)}: its shard is {shard_length} bytes, shorter than its "
                             f"{self.index_bytes}-byte index (truncated)")
        start = 0 if self.at_start else shard_length - self.index_bytes
        return start, start + self.index_bytes

    def decode_index(self, raw: bytes, shard_length: int, key: str) -> np.ndarray:
        """The (count, 2) uint64 index, checked: checksum, and every entry empty or inside the shard."""
        if len(raw) != self.index_bytes:
            raise ShardError(f"chunk {quote(key)}: read {len(raw)} bytes of its shard's {self.index_bytes}-byte index")
        body = raw[: 16 * self.count]
        if self.crc and _crc32c(body) != int.from_bytes(raw[-4:], "little"):
            raise ShardError(f"chunk {quote(key)}: its shard's index fails its CRC-32C checksum")
        index = np.frombuffer(body, self.index_dtype).astype(np.uint64).reshape(self.count, 2)
        offsets, sizes = index[:, 0], index[:, 1]
        empty = (offsets == EMPTY) & (sizes == EMPTY)
        length = np.uint64(shard_length)
        # offset + nbytes <= length, written so that uint64 cannot overflow
        outside = (offsets > length) | (sizes > length - np.minimum(offsets, length))
        if (outside & ~empty).any():
            raise ShardError(f"chunk {quote(key)}: its shard's index points past the shard's {shard_length} bytes")
        return index


def _index_codecs(codecs: list[dict]) -> tuple[str, bool]:
    """(dtype of the index entries, whether a CRC-32C follows) for the index codecs: ``bytes`` with
    either byte order, then optionally ``crc32c``; anything else is not a fixed-size index."""
    names = [c.get("name") for c in codecs or []]
    if not names or names[0] != "bytes" or names[1:] not in ([], ["crc32c"]):
        raise UnsupportedSharding(f"shard index codecs {names}")
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    return (">u8" if endian == "big" else "<u8"), names[1:] == ["crc32c"]


class ShardReader:
    """Reads inner chunks through a raw view: each shard's index once (kept in a small LRU), then the
    inner chunk's own byte range."""

    def __init__(self, raw, capacity: int = MAX_INDEX_BYTES) -> None:
        self.raw = raw
        self._indexes = SingleFlightLRU(capacity, weigh=lambda index: index.nbytes)
        self.index_reads = 0

    async def inner_chunk(self, i: int, layout: ShardLayout, shard: tuple[int, ...], local: int,
                          key: str) -> bytes | None:
        """The stored bytes of inner chunk `local` of the shard behind key index `i` (None: empty)."""
        length = await self.raw.size(i)

        async def load() -> np.ndarray:
            start, end = layout.index_range(length, key)
            self.index_reads += 1
            raw = await self.raw.read(i, start, end - start, exact=True)
            # (a checksum and a scan of up to 16 bytes per inner chunk: off the trio thread)
            return await trio.to_thread.run_sync(layout.decode_index, bytes(raw), length, key)

        index = await self._indexes.get((layout.path, shard), load)
        offset, nbytes = (int(v) for v in index[local])
        if offset == EMPTY:
            return None
        data = await self.raw.read(i, offset, nbytes, exact=True)
        if len(data) != nbytes:
            raise ShardError(f"chunk {quote(key)}: its shard ends before its inner chunk does (truncated)")
        return bytes(data)

    def statistics(self) -> dict:
        return {"shard_index_reads": self.index_reads, "shard_indexes_cached": len(self._indexes)}
