"""Decompression with an output bound: a chunk declared as 8,000 bytes must not inflate to 2 GiB
before its size is checked (issue 16). Compressors whose output size can be limited or read from a
header are decoded here and stop at the first byte past the bound; filters (shuffle, delta, ...)
do not grow their input by more than a small factor and are decoded as usual."""

from __future__ import annotations

import bz2
import lzma
import math
import struct
import zlib

import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray


class TooLarge(ValueError):
    """The data decodes to more than the bound."""


def _raw(data) -> bytes | memoryview:
    return memoryview(ensure_contiguous_ndarray(data)).cast("B")


def _incremental(decompressor, data, limit: int) -> bytes:
    out = decompressor.decompress(data, limit + 1)
    if len(out) > limit:
        raise TooLarge(f"decodes to more than the expected {limit} bytes")
    if not decompressor.eof:
        raise ValueError("the compressed stream is truncated")
    return out


def _zstd(data, limit: int) -> bytes:
    import zstandard

    out = zstandard.ZstdDecompressor().stream_reader(bytes(data), read_across_frames=True).read(limit + 1)
    if len(out) > limit:
        raise TooLarge(f"decodes to more than the expected {limit} bytes")
    return out


def _declared(size: int, limit: int) -> None:
    if size > limit:
        raise TooLarge(f"declares {size} decoded bytes, more than the expected {limit}")


def decode_bounded(codec, data, limit: int):
    """codec.decode(data), refusing output past `limit` bytes without producing it."""
    cid = getattr(codec, "codec_id", None)
    if cid == "zlib":
        return _incremental(zlib.decompressobj(), _raw(data), limit)
    if cid == "gzip":
        return _incremental(zlib.decompressobj(16 + zlib.MAX_WBITS), _raw(data), limit)
    if cid == "bz2":
        return _incremental(bz2.BZ2Decompressor(), _raw(data), limit)
    if cid == "lzma":
        return _incremental(lzma.LZMADecompressor(format=codec.format, filters=codec.filters), _raw(data), limit)
    if cid == "zstd":
        return _zstd(_raw(data), limit)
    if cid in ("blosc", "lz4"):
        # blosc's 16-byte header holds the decoded size at bytes 4-7; numcodecs' lz4 prefixes it
        raw = _raw(data)
        at = 4 if cid == "blosc" else 0
        _declared(struct.unpack_from("<I", raw, at)[0] if len(raw) >= at + 4 else 0, limit)
    if cid == "imagecodecs_rcomp":  # (it makes an array of its config's shape, which a reference set names)
        _declared(math.prod(codec.shape) * np.dtype(codec.dtype).itemsize, limit)
    return codec.decode(data)


def decode_into(codec, data, out) -> bool:
    """Decode `data` straight into `out` (writable, exactly the decoded size) when the codec can and
    the data says it decodes to exactly that size; False (nothing written) otherwise."""
    cid = getattr(codec, "codec_id", None)
    raw = _raw(data)
    if cid == "blosc":
        if len(raw) < 8 or struct.unpack_from("<I", raw, 4)[0] != out.nbytes:
            return False
    elif cid != "shuffle" or raw.nbytes != out.nbytes:
        return False
    codec.decode(raw, out=out)
    return True

