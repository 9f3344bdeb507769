"""A GRIB2 file's references from the `.idx` beside it (refs/scan/gribidx.py says how and why).

Per file: the idx is identified (the listing's ETag, or its size and date, else one HEAD) and, if the
scan store has no result for that version, read (one GET); the GRIB file's size comes from the listing or one HEAD. The first
file of each kind is scanned as any GRIB file and the kind's mapping learnt from it and kept in the scan
store; the kind's other files are the mapping applied to their idx, in this process, with no byte of
their GRIB file read. A kind whose mapping cannot be learnt (its messages disagree with its idx) is said
once and its files are scanned.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import replace

import trio

from refmount.fetch.stats import redact
from refmount.refs.scan import gribidx

log = logging.getLogger("refmount")

# Per scan store (one per mount or scan): a lock per kind (its first file is scanned once, not by every
# file of it at the same time), and the mappings read so far (not read from disk again for each file).
_kind_locks: weakref.WeakKeyDictionary[object, dict[str, trio.Lock]] = weakref.WeakKeyDictionary()
_mappings: weakref.WeakKeyDictionary[object, dict[str, dict]] = weakref.WeakKeyDictionary()


async def from_idx(entry, fetcher, read, pool, store, lookups, max_refs_size: int, *, scan_entry, identify,
                   scanned_as):
    """`entry`'s Scanned from its idx (entry.sidecar). ScanFailed naming the idx when it is refused.
    `scan_entry`, `identify` and `scanned_as` (Scanned) are the archive's, handed down (refs/scan/archive.py
    calls this module: no import back)."""
    from refmount.refs.scan.pool import ScanFailed

    idx_url = entry.sidecar
    listed = entry.sidecar_listed or (None, None)  # (the listing's size and date of the idx name its version:
    async with lookups:                            # a warm mount then sends no request for it)
        idx_size, idx_version = await identify(fetcher, replace(entry, url=idx_url, size=listed[0], version=listed[1]))
    version = f"idx {idx_version}" if idx_version else None
    kept = store.get(idx_url, version, max_refs_size) if version else None
    if kept is not None:
        return scanned_as(entry.name, entry.url, "grib", kept["refs"], kept.get("refused", []), version)

    def refused(why: str) -> ScanFailed:
        return ScanFailed(f"its index {redact(idx_url)} is refused: {why}")

    if idx_size > gribidx.MAX_IDX_BYTES:
        raise refused(f"it is larger than {gribidx.MAX_IDX_BYTES >> 20} MiB")
    async with lookups:
        text = b"".join(map(bytes, await fetcher.read(idx_url, 0, idx_size))) if idx_size else b""
        grib_size = entry.size if entry.size is not None else await fetcher.size(entry.url)
    try:
        rows = await trio.to_thread.run_sync(gribidx.parse_idx, text, grib_size)
    except gribidx.IdxRefused as e:
        raise refused(str(e)) from None
    kind = gribidx.kind_of(rows, entry.name, grib_size, entry.url)
    locks, known = _kind_locks.setdefault(store, {}), _mappings.setdefault(store, {})
    async with locks.setdefault(kind, trio.Lock()):
        mapping = known.get(kind) or store.get(kind, gribidx.MAPPING_VERSION, max_refs_size)
        if mapping is not None:
            known[kind] = mapping
        else:
            scanned = await scan_entry(replace(entry, sidecar=None), fetcher, read, pool, store, lookups, max_refs_size)
            try:
                inline_at = await _place_inline(scanned.refs, rows, entry.url, grib_size, read)
                mapping = await trio.to_thread.run_sync(gribidx.learn, scanned.refs, rows, entry.url, grib_size,
                                                        inline_at)
            except gribidx.IdxRefused as e:
                log.warning("%s: its index %s does not map its messages (%s): files of its kind are scanned",
                            redact(entry.url), redact(idx_url), e)
                mapping = {"refused": str(e)}
            store.put(kind, gribidx.MAPPING_VERSION, mapping)
            known[kind] = mapping
            return _kept(store, scanned, idx_url, version, entry)
    if "refused" in mapping:
        scanned = await scan_entry(replace(entry, sidecar=None), fetcher, read, pool, store, lookups, max_refs_size)
        return _kept(store, scanned, idx_url, version, entry)
    try:
        refs = await trio.to_thread.run_sync(gribidx.apply, mapping, rows, entry.url, grib_size)
    except (gribidx.IdxRefused, KeyError, ValueError, TypeError) as e:  # (a damaged mapping: refused, not guessed)
        raise refused(str(e)) from None
    if version:
        store.put(idx_url, version, {"format": "grib", "refs": refs, "refused": []})
    return scanned_as(entry.name, entry.url, "grib", refs, [], version)


async def _place_inline(refs: dict, rows, url: str, grib_size: int, read) -> dict[str, int]:
    """key -> offset of the message whose bytes a key holds inline, where exactly one message of the
    file has them (compared with the file's bytes, still in the block cache from its scan)."""
    placed = {}
    for key, offsets in gribidx.inline_candidates(refs, rows, grib_size).items():
        data = gribidx.inline_bytes(refs[key])
        same = [o for o in offsets if bytes(await read(url, o, o + len(data))) == data]
        if len(same) == 1:
            placed[key] = same[0]
    return placed


def _kept(store, scanned, idx_url: str, version: str | None, entry):
    """A scanned file's result, kept under its idx too: a warm mount identifies only the idx."""
    if version:
        store.put(idx_url, version, {"format": scanned.format, "refs": scanned.refs, "refused": scanned.refused})
    return replace(scanned, name=entry.name, url=entry.url, version=version)

