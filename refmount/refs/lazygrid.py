"""Reference sets whose chunk keys are not stored but computed from each array's chunk grid: the index
arithmetic that lazy sets share (Parquet references, refs/parquet.py; native Zarr stores,
refs/zarrremote.py).

Key indexes: the metadata keys first (an ordinary, eager `RefSet`, `meta`), then each array's chunk n
(C order over its grid) at ``base[array] + n``, so that a key's index, name and directory follow from
arithmetic and inode numbers are stable without anything loaded. A lazily computed array's chunk keys
sit directly in its directory ("0.1", v3 "c.0.1"; not "c/0/1", whose directories would be stored).
Subclasses say which chunks exist and what they refer to (`exists`, `target`, `inline_data`, `ensure`,
`files_from`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.arraymeta import ArrayMeta
from refmount.refs.model import RefSet

MAX_CAPACITY = 2**60  # key indexes (and inode numbers) past this are refused: a grid no store holds


@dataclass
class GridArray:
    path: str
    dir_id: int
    meta: ArrayMeta
    grid: tuple[int, ...]  # (a scalar's is (1,))
    count: int  # chunks in the grid
    base: int  # key index of chunk 0


class LazyGridRefSet:
    """The access interface of `RefSet` for metadata held eagerly and chunk keys computed from grids."""

    lazy = True

    def __init__(self, meta: RefSet, arrays: list[tuple[str, ArrayMeta]], max_keys: int | None = None) -> None:
        self.meta = meta
        self.dirs = meta.dirs
        self.urls: list[str] = meta.urls  # grows as chunks' targets are interned; ids never change
        self._url_ids = {u: n for n, u in enumerate(self.urls)}
        self._intern_lock = threading.Lock()  # (Parquet records intern in worker threads)
        self.url_check = None  # optional callable(url) raising RefmountError (protocol policy)
        self.arrays: list[GridArray] = []
        self._array_of_dir: dict[int, GridArray] = {}
        base = meta.capacity
        for path, array_meta in arrays:
            grid = array_meta.grid() or (1,)
            count = math.prod(grid)
            if max_keys is not None and base + count > max_keys + meta.capacity:
                raise RefsError(f"array {quote(path)} makes more than --max-keys {max_keys:,} keys")
            if base + count > MAX_CAPACITY:
                raise RefsError(f"array {quote(path)}: the chunk grids make more than 2**60 chunks")
            array = GridArray(path, self.dirs.ids[path], array_meta, grid, count, base)
            self.arrays.append(array)
            self._array_of_dir[array.dir_id] = array
            base += count
        self.capacity = base

    def share_url_table(self, table) -> None:
        """Intern the chunks' targets into a table shared with other sets (a lazily mounted catalog's,
        refs/urltable.py: the mount's block cache keys are its ids), under its lock."""
        if self.urls:  # (the metadata is inline: no target is interned before the first chunk's)
            raise RefsError(f"lazy references {quote(getattr(self, 'location', ''))} name targets in their metadata")
        self.urls, self._url_ids, self._intern_lock = table.urls, table.ids, table.lock

    def intern(self, url: str) -> int:
        """The url id of `url`, checked by `url_check` the first time it is seen."""
        uid = self._url_ids.get(url)
        if uid is not None:
            return uid
        with self._intern_lock:
            uid = self._url_ids.get(url)
            if uid is None:
                if self.url_check is not None:
                    self.url_check(url)
                uid = self._url_ids[url] = len(self.urls)
                self.urls.append(url)
        return uid

    # -- index arithmetic -------------------------------------------------------------------------

    def _locate(self, i: int) -> tuple[GridArray, int] | None:
        """(array, chunk number) of a chunk key index (None for metadata indexes)."""
        if i < self.meta.capacity:
            return None
        lo, hi = 0, len(self.arrays)
        while lo < hi:  # arrays are in base order: binary search
            mid = (lo + hi) // 2
            if self.arrays[mid].base <= i:
                lo = mid + 1
            else:
                hi = mid
        array = self.arrays[lo - 1]
        return array, i - array.base

    def _chunk_name(self, array: GridArray, n: int) -> str:
        return array.meta.chunk_key(np.unravel_index(n, array.grid) if not array.meta.scalar else ())

    def _chunk_index(self, key: str) -> int | None:
        path, _, name = key.rpartition("/")
        d = self.dirs.ids.get(path)
        array = self._array_of_dir.get(d) if d is not None else None
        if array is None:
            return None
        index = array.meta.parse_chunk_key(name)
        if index is None:
            return None
        index = index or (0,)  # (a scalar's one chunk)
        if any(x >= g for x, g in zip(index, array.grid)):
            return None
        return array.base + int(np.ravel_multi_index(index, array.grid))

    # -- the RefSet access interface ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.meta) + sum(a.count for a in self.arrays)  # (Parquet: an upper bound, rows may be missing)

    def key(self, i: int) -> str:
        loc = self._locate(i)
        if loc is None:
            return self.meta.key(i)
        array, n = loc
        return f"{array.path}/{self._chunk_name(array, n)}" if array.path else self._chunk_name(array, n)

    def key_bytes(self, i: int) -> bytes:
        return self.key(i).encode("utf-8", "surrogatepass")

    def dir_id(self, i: int) -> int:
        loc = self._locate(i)
        return self.meta.dir_id(i) if loc is None else loc[0].dir_id

    def find(self, key: str) -> int:
        """Index of a metadata key, or of a chunk key known to exist (`exists`)."""
        i = self._chunk_index(key)
        if i is None:
            return self.meta.find(key)
        return i if self.exists(i) else -1

    async def afind(self, key: str) -> int:
        i = self._chunk_index(key)
        if i is None:
            return self.meta.find(key)
        await self.ensure(i)
        return i if self.exists(i) else -1

    def files_in(self, dir_id: int, start: int = 0):
        return self.meta.files_in(dir_id, start)

    def file_count(self, dir_id: int) -> int:
        return self.meta.file_count(dir_id)

    def names(self, indexes: np.ndarray, dir_id: int) -> list[bytes]:
        """File names of key indexes directly in `dir_id`: all metadata or all chunks, as
        `files_from` gives them."""
        array = self._array_of_dir.get(dir_id)
        if array is None or len(indexes) == 0 or indexes[0] < self.meta.capacity:
            return self.meta.names(indexes, dir_id)
        if array.meta.scalar:
            return [array.meta.chunk_key(()).encode()] * len(indexes)
        columns = [list(map(str, c.tolist())) for c in np.unravel_index(indexes - array.base, array.grid)]
        lead, sep = array.meta.key_lead, array.meta.separator
        return [(lead + sep.join(parts)).encode() for parts in zip(*columns)]
