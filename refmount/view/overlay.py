"""Files a view adds to a reference set: metadata keys the set lacks (a synthesised ``.zmetadata``,
an array's ``.zattrs`` that has to carry ``_FillValue``).

`OverlayRefSet` wraps any reference set (the eager `RefSet` or the lazy Parquet one) behind the same
access interface and adds inline keys after its index space. Added keys live only in directories the
set already has; in a listing they come first. The view decides what they contain.
"""

from __future__ import annotations

import numpy as np

from refmount.refs import INLINE


class OverlayRefSet:
    def __init__(self, base, added: dict[str, bytes], alias=None) -> None:
        """`alias`: callable(key) -> another key of `base` that a key `base` lacks is found as (None:
        none), for names a view computes rather than lists (a lazy set's)."""
        self.base = base
        self._alias = alias
        self.dirs = base.dirs
        self.urls = base.urls
        self.lazy = getattr(base, "lazy", False)
        self._first = base.capacity
        self._keys = list(added)
        self._data = [added[k] for k in self._keys]
        self._index = {k: self._first + n for n, k in enumerate(self._keys)}
        self._by_dir: dict[int, list[int]] = {}
        for key, i in self._index.items():
            self._by_dir.setdefault(self.dirs.ids[key.rpartition("/")[0]], []).append(i)

    def __getattr__(self, name):  # statistics(), url_check, meta, ... of the wrapped set
        return getattr(self.base, name)

    def _added(self, i: int) -> int | None:
        n = i - self._first
        return n if 0 <= n < len(self._keys) else None

    def __len__(self) -> int:
        return len(self.base) + len(self._keys)

    @property
    def capacity(self) -> int:
        return self._first + len(self._keys)

    def key(self, i: int) -> str:
        n = self._added(i)
        return self.base.key(i) if n is None else self._keys[n]

    def key_bytes(self, i: int) -> bytes:
        return self.key(i).encode("utf-8", "surrogatepass")

    def find(self, key: str) -> int:
        found = self._index.get(key)
        if found is not None:
            return found
        found = self.base.find(key)
        if found < 0 and self._alias is not None and (other := self._alias(key)) is not None:
            return self.base.find(other)
        return found

    async def afind(self, key: str) -> int:
        found = self._index.get(key)
        if found is not None:
            return found
        found = await self.base.afind(key)
        if found < 0 and self._alias is not None and (other := self._alias(key)) is not None:
            return await self.base.afind(other)
        return found

    async def ensure(self, i: int) -> None:
        if self._added(i) is None:
            await self.base.ensure(i)

    def exists(self, i: int) -> bool:
        return self._added(i) is not None or self.base.exists(i)

    def dir_id(self, i: int) -> int:
        n = self._added(i)
        return self.base.dir_id(i) if n is None else self.dirs.ids[self._keys[n].rpartition("/")[0]]

    def target(self, i: int) -> tuple[int, int, int]:
        n = self._added(i)
        return self.base.target(i) if n is None else (INLINE, 0, len(self._data[n]))

    def inline_data(self, i: int) -> bytes | None:
        n = self._added(i)
        return self.base.inline_data(i) if n is None else self._data[n]

    def file_count(self, dir_id: int) -> int:
        return self.base.file_count(dir_id) + len(self._by_dir.get(dir_id, ()))

    def files_in(self, dir_id: int, start: int = 0):
        added = np.array(self._by_dir.get(dir_id, []), dtype=np.int64)
        return np.concatenate([added, self.base.files_in(dir_id)])[start:]

    async def files_from(self, dir_id: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        added = self._by_dir.get(dir_id, [])
        if start < len(added):  # a batch never mixes added and wrapped keys
            indexes = np.array(added[start : start + count], dtype=np.int64)
            return np.arange(start, start + len(indexes)), indexes
        positions, indexes = await self.base.files_from(dir_id, start - len(added), count)
        return positions + len(added), indexes

    def names(self, indexes: np.ndarray, dir_id: int) -> list[bytes]:
        if len(indexes) and self._added(int(indexes[0])) is not None:
            return [self._keys[int(i) - self._first].rpartition("/")[2].encode("utf-8", "surrogatepass")
                    for i in indexes]
        return self.base.names(indexes, dir_id)
