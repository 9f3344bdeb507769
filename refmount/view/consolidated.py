"""Consolidated metadata (``.zmetadata``) built from the metadata a view serves.

With it, ``xarray.open_zarr`` opens a mount without its "consolidated metadata" warning (and
without one stat per array), and netCDF-C >= 4.10 can use ``#mode=zarr,file,consolidated``. It is
built once at mount from exactly the bytes served for every ``.zgroup``, ``.zattrs`` and
``.zarray``, so it never disagrees with them.
"""

from __future__ import annotations

import logging

from refmount.refs.origins import origins_of
from refmount.view.arrays import dump_json

log = logging.getLogger("refmount")

METADATA_NAMES = (".zgroup", ".zattrs", ".zarray")


def consolidated_metadata(refset, served_json) -> bytes:
    """The .zmetadata of every directory's served metadata; b"" when the set has no Zarr
    metadata at all (the key is then hidden). `served_json(i)` is the JSON value served for key
    index i, or None when it is hidden or cannot be read without I/O."""
    value = consolidated_value(refset, served_json)
    return dump_json(value) if value is not None else b""


def consolidated_value(refset, served_json, quiet: bool = False) -> dict | None:
    """The JSON value of `consolidated_metadata` (None: no .zmetadata). `quiet`: say nothing of
    metadata stored remotely (a view building one per reader's form says it once)."""
    entries = {}
    unread = []
    dirs = refset.dirs
    in_array = [False] * len(dirs.paths)  # inside an array: a chunk subdirectory ("/" separator)
    for d, path in enumerate(dirs.paths):  # (a directory's parent comes before it)
        if d and in_array[dirs.parent[d]]:
            in_array[d] = True
            continue  # no metadata lives there (an array's name may be digits: kerchunk's TIFF levels 0, 1, 2)
        prefix = f"{path}/" if path else ""
        in_array[d] = refset.find(prefix + ".zarray") >= 0
        for name in METADATA_NAMES:
            i = refset.find(prefix + name)
            if i < 0:
                continue
            value = served_json(i)
            if value is None:
                if refset.inline_data(i) is None:
                    unread.append(prefix + name)
                continue
            entries[prefix + name] = value
    if unread:
        if quiet:
            return None
        log.warning("no consolidated metadata: %s and %d more metadata keys are stored remotely",
                    unread[0], len(unread) - 1)
        return None
    if not entries:
        return None
    return {"metadata": entries, "zarr_consolidated_format": 1}


class _RawWithConsolidated:
    """A raw view plus the .zmetadata its reference set lacks; every other key is the raw view's."""

    hides_nothing = True

    def __init__(self, raw, data: bytes) -> None:
        from refmount.view.overlay import OverlayRefSet

        self.raw = raw
        self.name = raw.name
        self.refset = OverlayRefSet(raw.refset, {".zmetadata": data})
        self._index = self.refset.find(".zmetadata")
        self._data = data

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def hidden(self, i: int) -> bool:
        return False

    def hidden_dir(self, d: int) -> bool:
        return False

    def known_size(self, i: int) -> int | None:
        return len(self._data) if i == self._index else self.raw.known_size(i)

    async def size(self, i: int) -> int:
        return len(self._data) if i == self._index else await self.raw.size(i)

    async def read(self, i: int, offset: int, size: int) -> bytes:
        return self._data[offset : offset + size] if i == self._index else await self.raw.read(i, offset, size)

    async def read_all(self, i: int) -> bytes:
        return self._data if i == self._index else await self.raw.read_all(i)

    def sources(self, i: int) -> list[str]:
        """(.zmetadata is made of every key's metadata: the files behind a key outside every dataset's
        directory, which in a glob's mount are all of them)"""
        return list(origins_of(self.refset).of(".zmetadata")) if i == self._index else self.raw.sources(i)

    def xattrs(self, i: int) -> dict[str, str]:
        if i == self._index:
            return {"user.refmount.source": "synthesised from the reference set's metadata"}
        return self.raw.xattrs(i)


def with_consolidated_metadata(raw):
    """The raw view, plus a .zmetadata when the set has none (and all its metadata is inline)."""
    from refmount.view.arrays import load_json_value

    refset = raw.refset
    if refset.find(".zmetadata") >= 0:
        return raw

    def served_json(i: int):
        data = refset.inline_data(i)
        try:
            return load_json_value(data) if data else None
        except (ValueError, RecursionError):
            return None

    data = consolidated_metadata(refset, served_json)
    return _RawWithConsolidated(raw, data) if data else raw
