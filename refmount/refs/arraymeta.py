"""One Zarr array's metadata, parsed in one place: `ArrayMeta`, from a v2 ``.zarray`` or a v3 ``zarr.json``.

As zarr-python's ``core/metadata`` (ArrayV2Metadata, ArrayV3Metadata, their chunk key encodings), with no
dependency on it: every reader of a reference set's array metadata (refs/combine, refs/zarrremote,
refs/icechunk, refs/parquet, the views' plans, grid read-ahead and v3-as-v2 form) takes it from here, so a
chunk key means the same thing everywhere. The constructors are lenient (a field that is absent or of the
wrong kind is kept as given, or None) because each reader has its own rule for bad metadata: hide the
array, refuse the mount, or not follow it; `grid()` and `check()` say in one line what is wrong.

Chunk keys are relative to the array's directory: v2 ``1.0`` (or ``1/0`` with dimension_separator "/"),
v3's default encoding ``c/1/0`` (``c.1.0`` with separator "."), v3's "v2" encoding ``1.0``; a scalar's one
chunk is ``0`` (``c`` in v3's default encoding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


class ArrayMetaError(ValueError):
    """Array metadata that makes no chunk grid or keys (the message says why, without the array's name)."""


def _object(value) -> dict:
    return value if isinstance(value, dict) else {}


def _is_count(n, least: int) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= least


@dataclass(eq=False)
class ArrayMeta:
    zarr_format: int  # 2 or 3
    document: dict  # the metadata as given (a writer copies it: refs/combine)
    shape: list | None  # as given (`grid()` checks it)
    chunks: list | None  # the chunk grid's chunk shape; with v3 sharding, the shard shape
    dtype: object  # v2 "dtype" (a string, or a list for a structured one); v3 "data_type"
    fill_value: object = None
    order: str = "C"
    compressor: dict | None = None  # v2
    filters: list | None = None  # v2
    codecs: list = field(default_factory=list)  # v3: the whole chain (a sharded array's outer one)
    grid_name: object = "regular"  # v3 chunk_grid name (v2's grid is always regular)
    encoding: object = "v2"  # chunk key encoding: "v2" or "default" (v3 may name another)
    key_prefix: str = ""  # "c" in v3's default encoding
    separator: str = "."

    # -- constructors --------------------------------------------------------------------------------

    @classmethod
    def from_zarray(cls, doc) -> ArrayMeta:
        """From a Zarr v2 ``.zarray`` (parsed JSON)."""
        if not isinstance(doc, dict):
            raise ArrayMetaError(f".zarray is a JSON {type(doc).__name__}, not an object")
        return cls(2, doc, doc.get("shape"), doc.get("chunks"), doc.get("dtype"), doc.get("fill_value"),
                   doc.get("order", "C"), doc.get("compressor"), doc.get("filters"),
                   separator=doc.get("dimension_separator") or ".")

    @classmethod
    def from_zarr_json(cls, doc) -> ArrayMeta:
        """From a Zarr v3 array's ``zarr.json`` (parsed JSON)."""
        if not isinstance(doc, dict):
            raise ArrayMetaError(f"zarr.json is a JSON {type(doc).__name__}, not an object")
        grid = doc.get("chunk_grid") or {}
        chunks = _object(_object(grid).get("configuration")).get("chunk_shape")
        encoding = doc.get("chunk_key_encoding") or {"name": "default"}
        name = encoding.get("name") if isinstance(encoding, dict) else encoding
        config = _object(_object(encoding).get("configuration"))
        if name == "v2":
            prefix, separator = "", config.get("separator", ".")
        else:  # "default" (and any other name, which `check` refuses)
            prefix, separator = "c", config.get("separator", "/")
        return cls(3, doc, doc.get("shape"), chunks, doc.get("data_type"), doc.get("fill_value"),
                   codecs=doc.get("codecs") or [], grid_name=grid.get("name") if isinstance(grid, dict) else grid,
                   encoding=name, key_prefix=prefix, separator=separator)

    @classmethod
    def from_document(cls, doc, zarr_format: int) -> ArrayMeta:
        return cls.from_zarr_json(doc) if zarr_format == 3 else cls.from_zarray(doc)

    # -- what it says ------------------------------------------------------------------------------------

    def numpy_dtype(self) -> np.dtype:
        """A v2 array's dtype as numpy's (v3's depends on its bytes codec: refmount.view.zarr3); raises
        ArrayMetaError when it has none, TypeError when numpy knows no such type."""
        if self.dtype is None:
            raise ArrayMetaError("no dtype")
        return np.dtype(self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape) if isinstance(self.shape, list) else 0

    @property
    def scalar(self) -> bool:
        return not self.shape

    @property
    def sharding(self) -> dict | None:
        """The configuration of a v3 array's ``sharding_indexed`` codec (None if it has none)."""
        for codec in self.codecs:
            if isinstance(codec, dict) and codec.get("name") == "sharding_indexed":
                return codec.get("configuration") or {}
        return None

    @property
    def inner_chunks(self) -> list | None:
        """The shape of the chunks a reader decodes: a sharded array's inner chunks, else `chunks`."""
        shard = self.sharding
        return shard.get("chunk_shape") if shard is not None else self.chunks

    def grid(self) -> tuple[int, ...]:
        """Chunks per axis (() for a scalar); raises ArrayMetaError if shape and chunks make no grid."""
        self._regular()
        if not isinstance(self.separator, str) or not self.separator:
            raise ArrayMetaError(f"separator {self.separator!r} is not a string")
        shape, chunks = self.shape, self.chunks
        if not (isinstance(shape, list) and isinstance(chunks, list) and len(shape) == len(chunks)
                and all(_is_count(n, 0) for n in shape) and all(_is_count(c, 1) for c in chunks)):
            raise ArrayMetaError(f"shape {shape!r} and chunks {chunks!r} do not make a chunk grid")
        return tuple(-(-n // c) for n, c in zip(shape, chunks))

    def _regular(self) -> None:
        if self.zarr_format == 3 and self.grid_name != "regular":
            raise ArrayMetaError(f"chunk grid {self.grid_name!r} is not 'regular'")

    def check(self) -> tuple[int, ...]:
        """`grid()`, also refusing a chunk key encoding or separator that is not known."""
        self._regular()
        if self.encoding not in ("v2", "default"):
            raise ArrayMetaError(f"chunk key encoding {self.encoding!r} is not known")
        if self.separator not in (".", "/"):
            raise ArrayMetaError(f"separator {self.separator!r} is neither '.' nor '/'")
        return self.grid()

    def nchunks(self) -> int:
        grid = self.grid()
        return math.prod(grid)

    # -- chunk keys ---------------------------------------------------------------------------------------

    @property
    def key_lead(self) -> str:
        """What every chunk key of an array with dimensions begins with ("c/" in v3's default encoding)."""
        return self.key_prefix + self.separator if self.key_prefix else ""

    def chunk_key(self, index) -> str:
        """The key of chunk `index` (a tuple of ints; () for a scalar), relative to the array."""
        if not len(index):
            return self.key_prefix or "0"
        return self.key_lead + self.separator.join(map(str, index))

    def parse_chunk_key(self, key: str) -> tuple[int, ...] | None:
        """The chunk index of a key relative to the array (() for a scalar's one chunk), None if it is
        not one of the array's chunk keys."""
        if self.scalar:
            return () if key == (self.key_prefix or "0") else None
        lead = self.key_lead
        if not key.startswith(lead):
            return None
        parts = key[len(lead):].split(self.separator)
        if len(parts) != self.ndim or not all(p.isascii() and p.isdigit() for p in parts):  # (int() refuses "²")
            return None
        return tuple(int(p) for p in parts)

    def chunk_indices(self):
        """Every chunk index of the grid, in C order (one () for a scalar, none when an axis is 0)."""
        return np.ndindex(*self.grid())

    def chunk_keys(self, prefix: str = ""):
        """Every chunk key of the grid, in C order (`chunk_indices`), each after `prefix` (the array's
        directory, "path/", for keys of the whole set)."""
        if self.scalar:
            yield prefix + self.chunk_key(())
            return
        lead, sep = prefix + self.key_lead, self.separator
        for index in self.chunk_indices():
            yield lead + sep.join(map(str, index))
