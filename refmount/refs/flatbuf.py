"""Just enough of the FlatBuffers wire format to read Icechunk's snapshots and manifests, with no
generated code: tables are read field by field (`Table`), and long vectors of tables (a manifest's
chunk references) column by column with numpy (`TableColumns`), so a million references cost numpy
calls, not a million Python objects.

Layout (flatbuffers.dev "internals"): a table starts with an int32 back to its vtable; the vtable
holds uint16 sizes then one uint16 offset per field (0: absent, use the default). Reference fields
(tables, vectors, strings) hold a uint32 forward offset from where it is stored; a vector starts
with its uint32 length; structs are stored inline.
"""

from __future__ import annotations

import struct

import numpy as np

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


class FormatError(ValueError):
    """The bytes are not the FlatBuffer they should be."""


class Table:
    __slots__ = ("buf", "pos", "_vt", "_vt_size")

    def __init__(self, buf: bytes, pos: int) -> None:
        if not 0 <= pos <= len(buf) - 4:
            raise FormatError(f"table offset {pos} outside the buffer")
        self.buf = buf
        self.pos = pos
        self._vt = pos - _I32.unpack_from(buf, pos)[0]
        if not 0 <= self._vt <= len(buf) - 4:
            raise FormatError(f"vtable offset {self._vt} outside the buffer")
        self._vt_size = _U16.unpack_from(buf, self._vt)[0]

    @classmethod
    def root(cls, buf: bytes) -> Table:
        if len(buf) < 8:
            raise FormatError("buffer too short")
        return cls(buf, _U32.unpack_from(buf, 0)[0])

    def _field(self, index: int) -> int:
        """Absolute position of field `index`, or 0 when absent."""
        slot = 4 + 2 * index
        if slot >= self._vt_size:
            return 0
        off = _U16.unpack_from(self.buf, self._vt + slot)[0]
        return self.pos + off if off else 0

    def _deref(self, index: int) -> int:
        p = self._field(index)
        return p + _U32.unpack_from(self.buf, p)[0] if p else 0

    def scalar(self, index: int, fmt: str, default=0):
        p = self._field(index)
        return struct.unpack_from("<" + fmt, self.buf, p)[0] if p else default

    def struct_bytes(self, index: int, size: int) -> bytes | None:
        p = self._field(index)
        return bytes(self.buf[p : p + size]) if p else None

    def bytes_(self, index: int) -> bytes | None:
        """A string or [ubyte] field."""
        v = self._deref(index)
        if not v:
            return None
        n = _U32.unpack_from(self.buf, v)[0]
        return bytes(self.buf[v + 4 : v + 4 + n])

    def string(self, index: int) -> str | None:
        raw = self.bytes_(index)
        return None if raw is None else raw.decode("utf-8")

    def tables(self, index: int) -> list[Table]:
        v = self._deref(index)
        if not v:
            return []
        n = _U32.unpack_from(self.buf, v)[0]
        out = []
        for k in range(n):
            e = v + 4 + 4 * k
            out.append(Table(self.buf, e + _U32.unpack_from(self.buf, e)[0]))
        return out

    def table(self, index: int) -> Table | None:
        v = self._deref(index)
        return Table(self.buf, v) if v else None

    def structs(self, index: int, fmt: str) -> list[tuple]:
        """A vector of structs, each unpacked with `fmt` (little-endian, no padding inside)."""
        v = self._deref(index)
        if not v:
            return []
        n = _U32.unpack_from(self.buf, v)[0]
        s = struct.Struct("<" + fmt)
        return [s.unpack_from(self.buf, v + 4 + k * s.size) for k in range(n)]

    def vector_position(self, index: int) -> int:
        return self._deref(index)


class TableColumns:
    """The tables of one vector-of-tables field, read column-wise with numpy. Methods take `rows`
    (indexes into the vector) to read only some tables: a million tables cost a few arrays of a
    million numbers, never a Python object each."""

    def __init__(self, buf: bytes, vector_pos: int) -> None:
        self.buf = buf
        self.u8 = np.frombuffer(buf, np.uint8)
        # FlatBuffers align every scalar to its size (the buffer is padded to its largest alignment),
        # so a column of them is one fancy index into a view of that width.
        self._views = {w: np.frombuffer(buf, f"<u{w}", count=len(buf) // w) for w in (2, 4, 8)}
        n = _U32.unpack_from(buf, vector_pos)[0] if vector_pos else 0
        self.n = n
        elements = vector_pos + 4 + 4 * np.arange(n, dtype=np.int64)
        self.pos = elements + self.u32(elements)
        del elements
        self.vt = self.pos - self.i32(self.pos)
        self.vt_size = self.u16(self.vt).astype(np.int32)

    def _gather(self, positions: np.ndarray, width: int) -> np.ndarray:
        """`width` bytes at each position, as rows (read a column at a time: no n x width index)."""
        if len(positions) and (positions.min() < 0 or positions.max() + width > len(self.u8)):
            raise FormatError("field outside the buffer")
        out = np.empty((len(positions), width), np.uint8)
        for c in range(width):
            out[:, c] = self.u8[positions + c]
        return out

    def _aligned(self, p: np.ndarray, width: int) -> np.ndarray:
        view = self._views[width]
        if len(p) and not (p.min() >= 0 and p.max() + width <= len(self.u8)):
            raise FormatError("field outside the buffer")
        if len(p) and (p % width).any():  # not as the format promises: read byte by byte
            return self._gather(p, width).view(view.dtype).reshape(-1)
        return view[p // width]

    def u16(self, p):
        return self._aligned(p, 2).astype(np.int64)

    def u32(self, p):
        return self._aligned(p, 4).astype(np.int64)

    def i32(self, p):
        return self._aligned(p, 4).view("<i4").astype(np.int64)

    def u64(self, p):
        return self._aligned(p, 8)

    def strings(self, start: np.ndarray, count: np.ndarray, block: int = 1 << 16) -> tuple[list[bytes], np.ndarray]:
        """The distinct byte strings at (start, count), and each one's index in that list; read
        `block` strings at a time, so that memory stays small whatever their number."""
        n = len(start)
        if n and (int((start + count).max()) > len(self.u8) or start.min() < 0):
            raise FormatError("string outside the buffer")
        distinct: dict[bytes, int] = {}
        which = np.empty(n, np.int64)
        for lo in range(0, n, block):
            s, c = start[lo : lo + block], count[lo : lo + block]
            longest = int(c.max())
            rows = np.empty((len(s), longest + 4), np.uint8)  # the bytes, zero-padded, then the length
            if longest:
                at = s[:, None] + np.arange(longest)
                np.minimum(at, len(self.u8) - 1, out=at)
                rows[:, :longest] = self.u8[at]
                del at
                rows[:, :longest][np.arange(longest) >= c[:, None]] = 0
            rows[:, longest:] = c.astype("<u4").view(np.uint8).reshape(len(s), 4)
            keyed = rows.view(np.dtype((np.void, longest + 4))).reshape(-1)
            _, first_of, inverse = np.unique(keyed, return_index=True, return_inverse=True)
            ids = np.array([distinct.setdefault(bytes(self.u8[int(s[k]) : int(s[k]) + int(c[k])]), len(distinct))
                            for k in first_of.tolist()], np.int64)
            which[lo : lo + len(s)] = ids[inverse.reshape(-1)]
        return list(distinct), which

    def field(self, index: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Absolute position of field `index` in each table (of `rows`); 0 where absent."""
        slot = 4 + 2 * index
        vt, vt_size, pos = (self.vt, self.vt_size, self.pos) if rows is None else (
            self.vt[rows], self.vt_size[rows], self.pos[rows])
        present = vt_size > slot
        off = np.zeros(len(vt), np.int64)
        off[present] = self.u16(vt[present] + slot)
        return np.where(off > 0, pos + off, 0)

    def present(self, index: int) -> np.ndarray:
        return self.field(index) > 0

    def scalar_u64(self, index: int, rows: np.ndarray | None = None) -> np.ndarray:
        p = self.field(index, rows)
        out = np.zeros(len(p), np.uint64)
        has = p > 0
        out[has] = self.u64(p[has])
        return out

    def scalar_u32(self, index: int, rows: np.ndarray | None = None) -> np.ndarray:
        p = self.field(index, rows)
        out = np.zeros(len(p), np.int64)
        has = p > 0
        out[has] = self.u32(p[has])
        return out

    def vectors(self, index: int, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(start of the elements, element count) of a vector/string field (of `rows`); count -1
        where absent."""
        p = self.field(index, rows)
        has = p > 0
        start = np.zeros(len(p), np.int64)
        count = np.full(len(p), -1, np.int64)
        v = p[has] + self.u32(p[has])
        start[has] = v + 4
        count[has] = self.u32(v)
        return start, count
