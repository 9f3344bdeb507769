"""Decompression with an output bound: a chunk declared as 8,000 bytes must not inflate to 2 GiB
before its size is checked (issue 16). Compressors whose output size can be limited or read from a
header are decoded here and stop at the first byte past the bound; filters (shuffle, delta, ...)
do not grow their input by more than a small factor and are decoded as usual.

Image codecs (imagecodecs' C decoders, refs/codecs.py) allocate the image their stream's header declares:
that size is read here first (JPEG's SOF, PNG's IHDR, JPEG 2000's SIZ, WebP's VP8/VP8L/VP8X) and
checked against the bound, counting the fewest samples a pixel may decode to (a PNG palette or a
WebP with alpha may give up to 4x that: a bounded overshoot). LZW and PackBits stop at the bound;
imagecodecs' deflate and zstd are decoded by the bounded zlib and zstd here."""

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
    if cid == "imagecodecs_deflate":
        return _incremental(zlib.decompressobj(-15 if codec.raw else zlib.MAX_WBITS), _raw(data), limit)
    if cid == "imagecodecs_zstd":
        return _zstd(_raw(data), limit)
    if cid in ("imagecodecs_lzw", "imagecodecs_packbits"):
        import imagecodecs

        decode = imagecodecs.lzw_decode if cid == "imagecodecs_lzw" else imagecodecs.packbits_decode
        out = decode(bytes(_raw(data)), out=limit + 1)  # (LZW stops there, PackBits raises)
        if len(out) > limit:
            raise TooLarge(f"decodes to more than the expected {limit} bytes")
        return out
    if cid in _IMAGE_SIZES:
        raw = _raw(data)
        if cid == "imagecodecs_jpeg" and codec.header is not None:  # (TIFF's JPEG header, given apart)
            raw = memoryview(bytes(codec.header) + bytes(raw))
        _declared(_IMAGE_SIZES[cid](bytes(raw), codec), limit)  # (a JPEG's APPn segments may come first)
    if cid == "grib":  # (its grid's point count, read from the message before its values are made)
        return codec.decode(data, limit=limit)
    if cid == "imagecodecs_rcomp":  # (it makes an array of its config's shape, which a reference set names)
        _declared(math.prod(codec.shape) * np.dtype(codec.dtype).itemsize, limit)
    if cid in _RETYPING or cid in ("FITSAscii", "packbits", "vlen-utf8", "vlen-bytes"):
        _declared(_filter_size(codec, cid, _raw(data)), limit)
    return codec.decode(data)


# Filters that change the item type, by their params: (the stored type's attribute, the decoded type's).
# A reference set may name any type: 64 bytes of u1 "decoded" as S100000000 were 6 GiB.
_RETYPING = {"astype": ("encode_dtype", "decode_dtype"), "delta": ("astype", "dtype"),
             "fixedscaleoffset": ("astype", "dtype"), "quantize": ("astype", "dtype"),
             "categorize": ("astype", "dtype")}


def _filter_size(codec, cid: str, raw) -> int:
    """The bytes a filter decodes `raw` to, from its params and the input's size alone."""
    if cid in _RETYPING or cid == "FITSAscii":
        if cid == "FITSAscii":  # (kerchunk's FITS ASCII table: a record type in, another out)
            stored, decoded = (np.dtype([tuple(d) for d in types]) for types in (codec.indtypes, codec.outdtypes))
        else:
            stored, decoded = (np.dtype(getattr(codec, name)) for name in _RETYPING[cid])
        return raw.nbytes // max(stored.itemsize, 1) * decoded.itemsize
    if cid == "packbits":  # (a byte of padding count, then 8 booleans a byte, less the padding)
        return max((raw.nbytes - 1) * 8 - (raw[0] if raw.nbytes else 0), 0)
    # vlen-utf8/vlen-bytes: a count of items, then each item's 4-byte length and bytes; numcodecs
    # makes the count's array of objects before it reads an item (2^31 items: 16 GiB)
    items = struct.unpack_from("<I", raw)[0] if raw.nbytes >= 4 else 0
    if 4 + 4 * items > raw.nbytes:
        raise ValueError(f"declares {items} strings, more than its {raw.nbytes} bytes can hold")
    return 0  # (strings, each no longer than its bytes: the fixed-length recoding checks their size)


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



# -- the decoded size an image stream's header declares (the fewest bytes it decodes to) ---------------

def _jpeg_size(head: bytes, codec) -> int:
    """From the frame header (SOFn): height x width x components x bytes per sample."""
    at = 2 if head[:2] == b"\xff\xd8" else 0
    while at + 4 <= len(head):
        if head[at] != 0xFF:
            break
        marker = head[at + 1]
        if marker == 0xFF:  # (fill bytes)
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        length = struct.unpack_from(">H", head, at + 2)[0]
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            if at + 10 > len(head):
                break
            precision, height, width, components = struct.unpack_from(">BHHB", head, at + 4)
            if height == 0:  # (the height given later, in a DNL marker: not known before decoding)
                raise ValueError("the JPEG stream declares no height in its frame header")
            return height * width * components * (2 if precision > 8 else 1)
        if marker == 0xDA:  # (scan data: no frame header before it)
            break
        at += 2 + length
    raise ValueError("the JPEG stream has no frame header (SOF) to size it")


_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_size(head: bytes, codec) -> int:
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR" or len(head) < 26:
        raise ValueError("the PNG stream has no IHDR to size it")
    width, height, depth, colour = struct.unpack_from(">IIBB", head, 16)
    return width * height * _PNG_SAMPLES.get(colour, 1) * (2 if depth > 8 else 1)


def _jpeg2k_size(head: bytes, codec) -> int:
    """From the codestream's SIZ segment (a JP2 file holds it in its jp2c box)."""
    at = _jp2_codestream(head)
    if head[at:at + 4] != b"\xff\x4f\xff\x51" or at + 42 > len(head):
        raise ValueError("the JPEG 2000 stream has no SIZ segment to size it")
    x, y, x0, y0 = struct.unpack_from(">IIII", head, at + 8)
    components = struct.unpack_from(">H", head, at + 40)[0]
    if x <= x0 or y <= y0 or components == 0 or at + 42 + 3 * components > len(head):
        raise ValueError("the JPEG 2000 SIZ segment is malformed")
    size = 0
    for c in range(components):
        bits = (head[at + 42 + 3 * c] & 0x7F) + 1
        size += 1 if bits <= 8 else 2 if bits <= 16 else 4
    return (x - x0) * (y - y0) * size


def _jp2_codestream(head: bytes) -> int:
    """Where the codestream starts: 0 for a bare one (SOC, then SIZ), else in a JP2 file's first jp2c
    box, which OpenJPEG decodes, found by walking the boxes (a SIZ searched for anywhere was found in
    a box before it: a 16x16 image declared, 3000x3000 decoded)."""
    if head[:2] == b"\xff\x4f":
        return 0
    at = 0
    while at + 8 <= len(head):
        length, kind = struct.unpack_from(">I4s", head, at)
        start = at + 8
        if length == 1:  # (the length in the next 8 bytes)
            if at + 16 > len(head):
                break
            length, start = struct.unpack_from(">Q", head, at + 8)[0], at + 16
        elif length == 0:  # (the last box: to the end)
            length = len(head) - at
        if kind == b"jp2c":
            return start
        if length < start - at:
            break
        at += length
    raise ValueError("the JPEG 2000 stream has no codestream (jp2c box) to size it")


def _webp_size(head: bytes, codec) -> int:
    if head[:4] != b"RIFF" or head[8:12] != b"WEBP" or len(head) < 30:
        raise ValueError("the WebP stream has no RIFF header to size it")
    kind = head[12:16]
    if kind == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        width, height = (v & 0x3FFF for v in struct.unpack_from("<HH", head, 26))
    elif kind == b"VP8L" and head[20] == 0x2F:
        bits = struct.unpack_from("<I", head, 21)[0]
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    elif kind == b"VP8X":
        width = int.from_bytes(head[24:27], "little") + 1
        height = int.from_bytes(head[27:30], "little") + 1
    else:
        raise ValueError("the WebP stream has no frame header to size it")
    return width * height * (4 if getattr(codec, "hasalpha", None) else 3)  # (alpha unless said: up to 4/3 more)


_IMAGE_SIZES = {"imagecodecs_jpeg": _jpeg_size, "imagecodecs_png": _png_size, "imagecodecs_jpeg2k": _jpeg2k_size,
                "imagecodecs_webp": _webp_size}
