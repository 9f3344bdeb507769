"""Just enough of the FlexBuffers wire format to read an Icechunk 2 repository's configuration (the
`config` field of its `repo` file, which Icechunk writes with serde and the `flexbuffers` crate),
with no dependency: `loads(buf)` returns plain Python values (dict, list, str, bytes, int, float,
bool, None).

Layout (flatbuffers.dev "flexbuffers"): the buffer ends with the root value, its packed type byte and
its byte width. A packed type is `type << 2 | log2(width of the children)`. Scalars are stored inline
in their parent's width; everything else is an unsigned offset back from where it is stored. Strings
and blobs have a length before them; untyped vectors and maps have a length before their elements
and one packed type byte per element after them; a map also has, before its length, the offset and
width of its sorted key vector. serde writes a struct as a map of field names, `None` as null, and
an enum variant with data as a one-entry map {variant: data} (a unit variant as its name).
"""

from __future__ import annotations

import struct

NULL, INT, UINT, FLOAT, KEY, STRING, INDIRECT_INT, INDIRECT_UINT, INDIRECT_FLOAT, MAP, VECTOR = range(11)
VECTOR_INT, VECTOR_UINT, VECTOR_FLOAT, VECTOR_KEY, VECTOR_STRING_DEPRECATED = range(11, 16)
BLOB, BOOL, VECTOR_BOOL = 25, 26, 36
_FIXED = {16: (INT, 2), 17: (UINT, 2), 18: (FLOAT, 2), 19: (INT, 3), 20: (UINT, 3), 21: (FLOAT, 3),
          22: (INT, 4), 23: (UINT, 4), 24: (FLOAT, 4)}
_TYPED = {VECTOR_INT: INT, VECTOR_UINT: UINT, VECTOR_FLOAT: FLOAT, VECTOR_KEY: KEY,
          VECTOR_STRING_DEPRECATED: STRING, VECTOR_BOOL: BOOL}
_MAX_DEPTH = 64


class FlexError(ValueError):
    """The bytes are not a FlexBuffer."""


def _uint(buf: bytes, pos: int, width: int) -> int:
    if width not in (1, 2, 4, 8) or not 0 <= pos <= len(buf) - width:
        raise FlexError(f"value at {pos} (width {width}) outside the buffer")
    return int.from_bytes(buf[pos : pos + width], "little")


def _int(buf: bytes, pos: int, width: int) -> int:
    value = _uint(buf, pos, width)
    return value - (1 << (8 * width)) if value >> (8 * width - 1) else value


def _float(buf: bytes, pos: int, width: int) -> float:
    if width == 4:
        return struct.unpack_from("<f", buf, pos)[0]
    if width == 8:
        return struct.unpack_from("<d", buf, pos)[0]
    raise FlexError(f"float of width {width}")


def _target(buf: bytes, pos: int, width: int) -> int:
    target = pos - _uint(buf, pos, width)
    if not 0 <= target < len(buf):
        raise FlexError(f"offset at {pos} points outside the buffer")
    return target


def _key(buf: bytes, pos: int) -> str:
    end = buf.find(b"\0", pos)
    if end < 0:
        raise FlexError("unterminated key")
    return buf[pos:end].decode("utf-8")


def _scalar(buf: bytes, pos: int, width: int, kind: int):
    if kind == INT:
        return _int(buf, pos, width)
    if kind == UINT:
        return _uint(buf, pos, width)
    if kind == FLOAT:
        return _float(buf, pos, width)
    if kind == BOOL:
        return _uint(buf, pos, width) != 0
    raise FlexError(f"type {kind} is not a scalar")


def _value(buf: bytes, pos: int, parent_width: int, packed: int, depth: int):
    """The value stored at `pos` in a parent of `parent_width` bytes per slot."""
    if depth > _MAX_DEPTH:
        raise FlexError("nested too deeply")
    kind, width = packed >> 2, 1 << (packed & 3)
    if kind == NULL:
        return None
    if kind in (INT, UINT, FLOAT, BOOL):
        return _scalar(buf, pos, parent_width, kind)
    at = _target(buf, pos, parent_width)
    if kind in (INDIRECT_INT, INDIRECT_UINT, INDIRECT_FLOAT):
        return _scalar(buf, at, width, kind - INDIRECT_INT + INT)
    if kind == KEY:
        return _key(buf, at)
    if kind in (STRING, BLOB):
        n = _uint(buf, at - width, width)
        if at + n > len(buf):
            raise FlexError("string outside the buffer")
        raw = bytes(buf[at : at + n])
        return raw.decode("utf-8") if kind == STRING else raw
    if kind in (VECTOR, MAP):
        n = _uint(buf, at - width, width)
        types = at + n * width
        if types + n > len(buf):
            raise FlexError("vector outside the buffer")
        values = [_value(buf, at + i * width, width, buf[types + i], depth + 1) for i in range(n)]
        if kind == VECTOR:
            return values
        keys_at = _target(buf, at - 3 * width, width)
        keys_width = _uint(buf, at - 2 * width, width)
        if _uint(buf, keys_at - keys_width, keys_width) != n:
            raise FlexError("map keys and values differ in number")
        keys = [_key(buf, _target(buf, keys_at + i * keys_width, keys_width)) for i in range(n)]
        return dict(zip(keys, values))
    if kind in _TYPED:
        n = _uint(buf, at - width, width)
        element = _TYPED[kind]
        if element in (KEY, STRING):
            return [_value(buf, at + i * width, width, element << 2, depth + 1) for i in range(n)]
        return [_scalar(buf, at + i * width, width, element) for i in range(n)]
    if kind in _FIXED:
        element, n = _FIXED[kind]
        return [_scalar(buf, at + i * width, width, element) for i in range(n)]
    raise FlexError(f"unknown FlexBuffers type {kind}")


def loads(buf: bytes):
    """The value of a whole FlexBuffer."""
    buf = bytes(buf)
    if len(buf) < 3:
        raise FlexError("buffer too short")
    root_width = buf[-1]
    packed = buf[-2]
    return _value(buf, len(buf) - 2 - root_width, root_width, packed, 0)
