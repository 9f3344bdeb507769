"""Consolidated metadata (``.zmetadata``) built from the metadata a view serves.

With it, ``xarray.open_zarr`` opens a mount without its "consolidated metadata" warning (and
without one stat per array), and netCDF-C >= 4.10 can use ``#mode=zarr,file,consolidated``. It is
built once at mount from exactly the bytes served for every ``.zgroup``, ``.zattrs`` and
``.zarray``, so it never disagrees with them.
"""

from __future__ import annotations

import logging

import numpy as np

from refmount.refs.origins import origins_of
from refmount.view.arrays import load_json_value
from refmount.view.metajson import dump_json, json_key

log = logging.getLogger("refmount")

METADATA_NAMES = (".zgroup", ".zattrs", ".zarray")


def consolidated_metadata(refset, served_json) -> bytes:
    """The .zmetadata of every directory's served metadata; b"" when the set has no Zarr
    metadata at all (the key is then hidden). `served_json(i)` is the JSON value served for key
    index i, or None when it is hidden or cannot be read without I/O."""
    value = consolidated_value(refset, served_json)
    return dump_json(value) if value is not None else b""


def metadata_items(refset):
    """(key, index) of each .zgroup, .zattrs and .zarray of the set, directory by directory; none inside
    an array (a chunk subdirectory with the "/" separator)."""
    dirs = refset.dirs
    in_array = [False] * len(dirs.paths)
    for d, path in enumerate(dirs.paths):  # (a directory's parent comes before it)
        if d and in_array[dirs.parent[d]]:
            in_array[d] = True
            continue  # no metadata lives there (an array's name may be digits: kerchunk's TIFF levels 0, 1, 2)
        prefix = f"{path}/" if path else ""
        in_array[d] = refset.find(prefix + ".zarray") >= 0
        for name in METADATA_NAMES:
            i = refset.find(prefix + name)
            if i >= 0:
                yield prefix + name, i


def consolidated_value(refset, served_json, quiet: bool = False, keys=None) -> dict | None:
    """The JSON value of `consolidated_metadata` (None: no .zmetadata). `quiet`: say nothing of
    metadata stored remotely (a view building one per reader's form says it once). `keys`:
    metadata_items(refset), when a view builds one per form (each a lookup per directory)."""
    entries = {}
    unread = []
    for key, i in metadata_items(refset) if keys is None else keys:
        value = served_json(i)
        if value is None:
            if refset.inline_data(i) is None:
                unread.append(key)
            continue
        entries[key] = value
    if unread:
        if quiet:
            return None
        log.warning("no consolidated metadata: %s and %d more metadata keys are stored remotely",
                    unread[0], len(unread) - 1)
        return None
    if not entries:
        return None
    return {"metadata": entries, "zarr_consolidated_format": 1}


# dump_json({"metadata": entries, "zarr_consolidated_format": 1}), written a piece at a time
_HEAD = b'{\n    "metadata": {'
_TAIL = b'\n    },\n    "zarr_consolidated_format": 1\n}'
_ENTRY_INDENT = b"\n        "  # (an entry's value, two levels down)


def _entry(key: str, text: bytes, first: bool) -> bytes:
    """One entry of the .zmetadata text, given its value's text (dump_json's)."""
    return (b"" if first else b",") + _ENTRY_INDENT + json_key(key) + b": " + text.replace(b"\n", _ENTRY_INDENT)


def consolidated_text(value: dict, text_of=dump_json) -> bytes:
    """dump_json(value) of a `consolidated_value`, from its entries' texts, `text_of(entry)` (a view has
    made most of them already: the whole again was half of a 10,000-array decoded view's JSON)."""
    entries = value.get("metadata")
    if type(entries) is not dict or not entries or value.keys() != {"metadata", "zarr_consolidated_format"} \
            or type(value["zarr_consolidated_format"]) is not int or value["zarr_consolidated_format"] != 1:
        return dump_json(value)
    pieces = [_entry(key, text_of(entries[key]), n == 0) for n, key in enumerate(sorted(entries))]
    return b"".join([_HEAD, *pieces, _TAIL])


def metadata_keys(refset) -> np.ndarray | None:
    """The key indices of every .zgroup, .zattrs and .zarray, sorted by key (dump_json's order); None
    when one is stored remotely (said once: no .zmetadata then), or there is none. No JSON is read."""
    found = []
    unread = []
    for key, i in metadata_items(refset):
        found.append(i)
        if refset.inline_data(i) is None and len(unread) < 1:
            unread.append(key)
    if unread:
        count = sum(refset.inline_data(i) is None for i in found)
        log.warning("no consolidated metadata: %s and %d more metadata keys are stored remotely", unread[0], count - 1)
        return None
    if not found:
        return None
    keys = [refset.key(i) for i in found]
    order = sorted(range(len(found)), key=keys.__getitem__)
    del keys
    return np.asarray(found, dtype=np.int64)[np.asarray(order, dtype=np.int64)]


class StreamedConsolidated:
    """A raw view's .zmetadata, never held whole: built the first time its size is asked (not at
    mount), as each entry's length in a compact column, and each read re-emits only the entries it
    covers from the inline metadata. A set of 300,000 arrays made a .zmetadata of ~100 MB and took
    ~360 MB and 13 s to build at mount (issue 38 row 5); this holds 16 bytes per metadata key."""

    def __init__(self, refset, keys: np.ndarray) -> None:
        self.refset = refset
        self._keys = keys  # key index of each candidate entry, in key order
        self._ends = None  # end offset of each entry's piece (after the head); an unreadable one adds 0
        self._size = None
        self._lock = None

    def _value(self, i: int):
        data = self.refset.inline_data(i)
        try:
            return load_json_value(data) if data else None
        except (ValueError, RecursionError):
            return None

    def _piece(self, i: int, first: bool) -> bytes:
        value = self._value(i)
        return b"" if value is None else _entry(self.refset.key(i), dump_json(value), first)

    def _measure(self) -> None:
        ends = np.empty(len(self._keys), dtype=np.int64)
        total = len(_HEAD)
        first = True
        for n, i in enumerate(self._keys.tolist()):
            piece = self._piece(i, first)
            first = first and not piece
            total += len(piece)
            ends[n] = total
        self._ends = ends
        self._size = total + len(_TAIL)  # (no entry readable: "metadata" is empty)

    async def size(self) -> int:
        if self._size is None:
            import trio

            if self._lock is None:
                self._lock = trio.Lock()
            async with self._lock:  # (measured once, in a thread: seconds for a very large set)
                if self._size is None:
                    await trio.to_thread.run_sync(self._measure)
        return self._size

    def _slice(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self._size)
        if end <= offset:
            return b""
        out = []
        body_end = int(self._ends[-1])
        if offset < len(_HEAD):
            out.append(_HEAD[offset:end])
        lo, hi = max(offset, len(_HEAD)), min(end, body_end)
        if lo < hi:
            n = int(np.searchsorted(self._ends, lo, side="right"))
            start = int(self._ends[n - 1]) if n else len(_HEAD)
            keys = self._keys
            first_kept = int(np.searchsorted(self._ends, len(_HEAD), side="right"))  # (the first non-empty piece)
            while start < hi:
                piece = self._piece(int(keys[n]), n == first_kept)
                if len(piece) != int(self._ends[n]) - start:  # (inline bytes never change under a mount)
                    raise OSError(f".zmetadata: the metadata of {self.refset.key(int(keys[n]))!r} changed")
                out.append(piece[max(lo - start, 0): hi - start])
                start += len(piece)
                n += 1
        if end > body_end:
            out.append(_TAIL[max(offset - body_end, 0): end - body_end])
        return b"".join(out)

    async def read(self, offset: int, size: int) -> bytes:
        await self.size()
        if size > 1 << 20:
            import trio

            return await trio.to_thread.run_sync(self._slice, offset, size)
        return self._slice(offset, size)


class _RawWithConsolidated:
    """A raw view plus the .zmetadata its reference set lacks; every other key is the raw view's."""

    hides_nothing = True

    def __init__(self, raw, streamed: StreamedConsolidated) -> None:
        from refmount.view.overlay import OverlayRefSet

        self.raw = raw
        self.name = raw.name
        self.refset = OverlayRefSet(raw.refset, {".zmetadata": b""})  # (its bytes come from `streamed`)
        self._index = self.refset.find(".zmetadata")
        self._streamed = streamed

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def hidden(self, i: int) -> bool:
        return False

    def hidden_dir(self, d: int) -> bool:
        return False

    def known_size(self, i: int) -> int | None:
        return self._streamed._size if i == self._index else self.raw.known_size(i)

    async def size(self, i: int) -> int:
        return await self._streamed.size() if i == self._index else await self.raw.size(i)

    async def read(self, i: int, offset: int, size: int) -> bytes:
        return await self._streamed.read(offset, size) if i == self._index else await self.raw.read(i, offset, size)

    async def read_all(self, i: int) -> bytes:
        if i == self._index:
            return await self._streamed.read(0, await self._streamed.size())
        return await self.raw.read_all(i)

    def sources(self, i: int) -> list[str]:
        """(.zmetadata is made of every key's metadata: the files behind a key outside every dataset's
        directory, which in a glob's mount are all of them)"""
        return list(origins_of(self.refset).of(".zmetadata")) if i == self._index else self.raw.sources(i)

    def xattrs(self, i: int) -> dict[str, str]:
        if i == self._index:
            return {"user.refmount.source": "synthesised from the reference set's metadata"}
        return self.raw.xattrs(i)


def with_consolidated_metadata(raw):
    """The raw view, plus a .zmetadata when the set has none (and all its metadata is inline), streamed
    from the inline metadata (`StreamedConsolidated`)."""
    refset = raw.refset
    if refset.find(".zmetadata") >= 0:
        return raw
    keys = metadata_keys(refset)
    return _RawWithConsolidated(raw, StreamedConsolidated(refset, keys)) if keys is not None else raw
