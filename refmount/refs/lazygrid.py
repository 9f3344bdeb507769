"""Reference sets whose chunk keys are not stored but computed from each array's chunk grid: the index
arithmetic that lazy sets share (Parquet references, refs/parquet.py; native Zarr stores,
refs/zarrremote.py).

Key indexes: the metadata keys first (an ordinary, eager `RefSet`, `meta`), then each array's chunk n
(C order over its grid) at ``base[array] + n``, so that a key's index, name and directory follow from
arithmetic and inode numbers are stable without anything loaded. Chunk keys that nest (v3's default
"c/0/1", v2's "0/1") have directories that are not stored either: `ChunkDirs` numbers them after the
chunks (a directory takes one key index, which is no file), so that a directory's id, path, parent and
entries follow from arithmetic too. Subclasses say which chunks exist and what they refer to (`exists`,
`target`, `inline_data`, `ensure`, `files_from`).
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.arraymeta import ArrayMeta
from refmount.refs.model import RefSet

# Key indexes (and inode numbers) past this are refused: a grid no store holds. Below 2**56, where a
# file handle's reader-form bits begin (refmount.fuse.fs.FORM_SHIFT): an inode past it would be read as
# another one's.
MAX_CAPACITY = 2**55


@dataclass
class GridArray:
    path: str
    dir_id: int
    meta: ArrayMeta
    grid: tuple[int, ...]  # (a scalar's is (1,))
    count: int  # chunks in the grid
    base: int  # key index of chunk 0
    nested: "NestedChunks | None" = None  # its chunk keys' directories, when they nest


class NestedChunks:
    """The directories of one array's nested chunk keys: for the chunk (i0, .., ik) of "c/i0/../ik",
    the directories "c", "c/i0", .., "c/i0/../ik-1" (v2's "i0/../ik": from "i0" on). A directory is
    (level L, prefix number p): the first L coordinates raveled over grid[:L]; its key index is
    `first + offsets[L] + p`."""

    def __init__(self, meta: ArrayMeta, grid: tuple[int, ...], first: int) -> None:
        self.head = meta.key_prefix  # "c", or "" (v2 encoding: level 0 is the array's own directory)
        self.low = 0 if self.head else 1
        self.segments = len(grid) + (1 if self.head else 0)  # of a chunk key
        self.grid = grid
        self.first = first
        self.offsets: dict[int, int] = {}
        total = 0
        for level in range(self.low, len(grid)):
            self.offsets[level] = total
            total += math.prod(grid[:level])
        self.count = total
        # chunks below one directory of each level (its first chunk: p * below[L])
        self.below = [math.prod(grid[level:]) for level in range(len(grid) + 1)]

    def locate(self, j: int) -> tuple[int, int]:
        """(level, prefix number) of directory slot j (0 <= j < count)."""
        level = max(level for level, offset in self.offsets.items() if offset <= j)
        return level, j - self.offsets[level]

    def slot(self, level: int, p: int) -> int:
        return self.first + self.offsets[level] + p

    def relative(self, level: int, p: int) -> str:
        """A directory's path relative to its array's."""
        coords = [str(c) for c in np.unravel_index(p, self.grid[:level])] if level else []
        return "/".join(([self.head] if self.head else []) + coords)


def _nests(meta: ArrayMeta) -> bool:
    """Whether an array's chunk keys have directories of their own ("c/0/1", v2 "0/1"; not "0" alone)."""
    return meta.separator == "/" and not meta.scalar and (bool(meta.key_prefix) or meta.ndim > 1)


class LazyGridRefSet:
    """The access interface of `RefSet` for metadata held eagerly and chunk keys computed from grids."""

    lazy = True
    MAX_LISTED: int | None = None  # chunks a listing of one array shows (None: every one)

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
                raise RefsError(f"array {quote(path)}: the chunk grids make more than 2**55 chunks")
            array = GridArray(path, self.dirs.ids[path], array_meta, grid, count, base)
            self.arrays.append(array)
            self._array_of_dir[array.dir_id] = array
            base += count
        self.chunk_end = base  # key indexes of directories of nested chunk keys follow (`ChunkDirs`)
        for array in self.arrays:
            if _nests(array.meta):
                array.nested = NestedChunks(array.meta, array.grid, base)
                base += array.nested.count
                if base > MAX_CAPACITY:
                    raise RefsError(f"array {quote(array.path)}: its chunk keys make more than 2**55 directories")
        self._nested = [a for a in self.arrays if a.nested is not None]
        self._nested_depths = sorted({a.nested.segments for a in self._nested})
        self.chunk_dirs = ChunkDirs(self, self.MAX_LISTED) if self._nested else None
        self.capacity = base

    def listing_capped(self, array: GridArray) -> None:
        """A listing of `array`'s chunks stops at MAX_LISTED (a subclass may say so)."""

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
        if i < self.meta.capacity or i >= self.chunk_end:
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
        if array is None or array.nested is not None:
            array, name = self._nested_array(key)
        if array is None:
            return None
        index = array.meta.parse_chunk_key(name)
        if index is None:
            return None
        index = index or (0,)  # (a scalar's one chunk)
        if any(x >= g for x, g in zip(index, array.grid)):
            return None
        return array.base + int(np.ravel_multi_index(index, array.grid))

    def _nested_array(self, key: str) -> tuple[GridArray | None, str]:
        """(array, chunk key relative to it) of a key that may be a nested chunk key ("t/c/0/1")."""
        parts = key.split("/")
        for segments in self._nested_depths:
            if len(parts) < segments:
                continue
            path = "/".join(parts[:-segments])
            array = self._array_of_dir.get(self.dirs.ids.get(path, -1))
            if array is not None and array.nested is not None and array.nested.segments == segments:
                return array, "/".join(parts[-segments:])
        return None, ""

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
        """The key's directory; a nested chunk's is its array's (the views know stored directories only)."""
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
        """(the stored directories' metadata files: a chunk directory's files come from `files_from`)"""
        return self.meta.files_in(dir_id, start) if dir_id < len(self.dirs) else np.zeros(0, np.int64)

    def file_count(self, dir_id: int) -> int:
        return self.meta.file_count(dir_id) if dir_id < len(self.dirs) else 0

    def names(self, indexes: np.ndarray, dir_id: int) -> list[bytes]:
        """File names of key indexes directly in `dir_id`: all metadata or all chunks, as
        `files_from` gives them."""
        if not len(indexes):
            return []
        if self.meta.capacity <= int(indexes[0]) < self.chunk_end:
            first = self._locate(int(indexes[0]))[0]
            if first.nested is not None:  # (in a directory of their own: named by their last coordinate)
                return [str(c).encode() for c in ((indexes - first.base) % first.grid[-1]).tolist()]
        array = self._array_of_dir.get(dir_id)
        if array is None or len(indexes) == 0 or indexes[0] < self.meta.capacity:
            return self.meta.names(indexes, dir_id)
        if array.meta.scalar:
            return [array.meta.chunk_key(()).encode()] * len(indexes)
        columns = [list(map(str, c.tolist())) for c in np.unravel_index(indexes - array.base, array.grid)]
        lead, sep = array.meta.key_lead, array.meta.separator
        return [(lead + sep.join(parts)).encode() for parts in zip(*columns)]


class ChunkDirs:
    """The directories of nested chunk keys, as the filesystem sees them: directory id `len(dirs) + j`
    for the key index j that `NestedChunks` gives it (so that its inode, 1 + id, is that key index's).
    An array's stored directory has them as subdirectories ("c", or v2's "0", "1", ..). A directory's
    listing shows the entries under which its own first `max_listed` chunks (C order) lie: a walk from
    the array's directory sees about its first `max_listed` chunks, as a listing of a flat array's
    directory does (a few times that at most, one directory level adding what its last entry holds);
    every other entry is found by its name, and a directory so found lists its own first ones."""

    def __init__(self, refset: LazyGridRefSet, max_listed: int | None) -> None:
        self.refset = refset
        self.first_id = len(refset.dirs)
        self.max_listed = max_listed
        self._firsts = [a.nested.first for a in refset._nested]

    def _node(self, d: int) -> tuple[GridArray, int, int] | None:
        """(array, level, prefix number) of a directory id; level -1 is the array's stored directory
        when its keys begin with "c" (v2 encoding: level 0 is)."""
        array = self.refset._array_of_dir.get(d) if d < self.first_id else None
        if array is not None:
            return (array, -1 if array.nested.head else 0, 0) if array.nested is not None else None
        j = d - self.first_id
        k = bisect.bisect_right(self._firsts, j) - 1
        if k < 0 or d < self.first_id:
            return None
        array = self.refset._nested[k]
        if j >= array.nested.first + array.nested.count:
            return None
        return (array, *array.nested.locate(j - array.nested.first))

    def is_dir(self, d: int) -> bool:
        return d >= self.first_id and self._node(d) is not None

    def _id(self, array: GridArray, level: int, p: int) -> int:
        return self.first_id + array.nested.slot(level, p)

    def path(self, d: int) -> str:
        array, level, p = self._node(d)
        relative = array.nested.relative(level, p)
        return f"{array.path}/{relative}" if array.path else relative

    def parent(self, d: int) -> int:
        array, level, p = self._node(d)
        if level == array.nested.low:
            return array.dir_id
        return self._id(array, level - 1, p // array.grid[level - 1])

    def subdir_count(self, d: int) -> int:
        """Subdirectories listed of directory `d` (a stored one: those of its array's chunk keys)."""
        node = self._node(d)
        if node is None:
            return 0
        array, level, p = node
        if level == -1:
            return 1
        if level >= len(array.grid) - 1:
            return 0
        n = array.grid[level]
        if self.max_listed is not None:  # (children whose first chunk is among this one's first max_listed)
            listed = -(-self.max_listed // max(array.nested.below[level + 1], 1))  # (an empty axis: 0 below)
            if listed < n:
                self.refset.listing_capped(array)
                n = listed
        return n

    def subdir(self, d: int, pos: int) -> tuple[str, int]:
        """(name, id) of the listed subdirectory at position `pos` (< `subdir_count`)."""
        array, level, p = self._node(d)
        if level == -1:
            return array.nested.head, self._id(array, 0, 0)
        return str(pos), self._id(array, level + 1, p * array.grid[level] + pos)

    def child(self, d: int, name: str) -> int | None:
        """The id of subdirectory `name` of directory `d`, listed or not; None if it is none."""
        node = self._node(d)
        if node is None:
            return None
        array, level, p = node
        if level == -1:
            return self._id(array, 0, 0) if name == array.nested.head else None
        if level >= len(array.grid) - 1 or not (name.isascii() and name.isdigit()):
            return None
        k = int(name)
        return self._id(array, level + 1, p * array.grid[level] + k) if k < array.grid[level] else None

    def chunks(self, d: int) -> tuple[GridArray, int, int] | None:
        """(array, first chunk number, chunk count) of the chunk files of a directory of the last level."""
        node = self._node(d)
        if node is None or node[1] != len(node[0].grid) - 1:
            return None
        array, level, p = node
        return array, p * array.grid[-1], array.grid[-1]
