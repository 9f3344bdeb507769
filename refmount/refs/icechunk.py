"""Icechunk repositories as reference sets, read from the on-disk format: format spec 1 (Icechunk
1.x) and spec 2 (Icechunk 2.x), with no icechunk package and no generated code.

The icechunk Python package can read chunks but does not tell where they are, so the repository's
files are read directly (icechunk_files.py: a header and a zstd-compressed FlatBuffer each; schemas
in icechunk-format/flatbuffers/*.fbs of the Icechunk repository): the entry point names the snapshot
(icechunk_repo.py: `refs/` in spec 1, the `repo` file in spec 2), the snapshot lists the nodes and,
per array, the manifests that hold its chunk references.

What one snapshot becomes (Zarr v3 keys, as an Icechunk store presents them):
- every node's ``zarr.json`` (the node's user data) -> inline bytes;
- every chunk of an array, keyed by the array's chunk key encoding (``c/0/0``):
  virtual -> (its url, offset, length); native -> (``<repo>/chunks/<id>``, offset, length);
  inline -> its bytes.

The version is resolved once, at load: a branch or tag names a snapshot id, and the mount serves that
snapshot for its whole life (later commits do not change it).
Virtual chunk urls resolve through the repository's virtual chunk containers (icechunk_containers.py:
relative `vcc://` urls, re-pointing, authorisation); the containers a snapshot uses are kept in
``refset.icechunk_containers`` for the mount to check against the user's authorisation. ETag or
last-modified checksums are kept in ``refset.checksums`` (url id -> (kind, value)) for the fetch layer.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from dataclasses import dataclass

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.arraymeta import ArrayMeta
from refmount.refs.flatbuf import FormatError, Table, TableColumns
from refmount.refs.icechunk_containers import Containers
from refmount.refs.icechunk_files import (FILE_MANIFEST, FILE_SNAPSHOT, MAGIC, RepoFiles, object_id,
                                          read_flatbuffer)
from refmount.refs.icechunk_repo import REPO_FILE, Version, read_repo_info, resolve_snapshot
from refmount.refs.model import INLINE, RefSetBuilder
from refmount.fetch.protocols import is_remote, local_path

log = logging.getLogger("refmount")

__all__ = ["Version", "version_from_options", "reject_version", "is_icechunk_location", "load_icechunk",
           "object_id", "chunk_key_batches", "chunk_key_layout"]

_REFERENCE_SUFFIXES = (".json", ".parq", ".parquet", ".gz", ".bz2", ".xz", ".zst", ".zstd")


def version_from_options(opts) -> Version | None:
    """The --branch/--tag/--snapshot choice of mount or inspect options, None if none was given."""
    version = Version(getattr(opts, "branch", None), getattr(opts, "tag", None), getattr(opts, "snapshot", None))
    return version if (version.branch or version.tag or version.snapshot) else None


def reject_version(location: str, version: Version | None) -> None:
    if version is not None and (version.branch or version.tag or version.snapshot):
        raise RefsError(f"--branch, --tag and --snapshot apply to Icechunk repositories only; {quote(location)} "
                        "is not one (no repo file, nor refs/ and snapshots/)")


def _starts_with_magic(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def is_icechunk_location(location: str, remote_options: dict | None = None, version: Version | None = None) -> bool:
    """Locally: a directory with an Icechunk `repo` file (spec 2 and later: any version, so that a newer
    one is refused by name), or with refs/ and snapshots/ (spec 1). Remotely: any version option given,
    or a url that does not look like a reference file and holds a repo file, a main branch or a
    config.yaml."""
    if not is_remote(location):
        root = local_path(location)
        if _starts_with_magic(os.path.join(root, REPO_FILE)):
            return True
        snapshots = os.path.isdir(os.path.join(root, "snapshots"))
        return snapshots and (os.path.isdir(os.path.join(root, "refs")) or os.path.exists(os.path.join(root, REPO_FILE)))
    if version is not None and (version.branch or version.tag or version.snapshot):
        return True
    if location.rstrip("/").lower().endswith(_REFERENCE_SUFFIXES):
        return False
    try:
        files = RepoFiles(location, remote_options)
    except Exception:
        return False
    return any(files.exists(p) for p in (REPO_FILE, "refs/branch.main/ref.json", "config.yaml"))


@dataclass
class _Array:
    path: str  # '' for the root
    node_id: bytes
    ndim: int
    key_prefix: str  # e.g. "air/c/"
    separator: str
    scalar_key: str  # the one chunk key of a 0-d array ("air/c", or "air/0" in the v2 encoding)
    manifests: list[tuple[str, list[tuple[int, int]]]]  # (manifest id, [from, to) chunk indexes per dimension)


def chunk_key_layout(meta: ArrayMeta, path: str) -> tuple[str, str, str]:
    """(key prefix, separator, key of the single chunk of a 0-d array) of an array's chunks, from its
    chunk_key_encoding (Zarr v3: "default" is c/0/0, "v2" is 0.0)."""
    base = f"{path}/" if path else ""
    return base + meta.key_lead, meta.separator, base + meta.chunk_key(())


# Field numbers of snapshot.fbs and manifest.fbs (a union takes two: its type, then its value).
_NODE_ID, _NODE_PATH, _NODE_USER_DATA, _NODE_DATA_TYPE, _NODE_DATA = 0, 1, 2, 3, 4
_ARRAY_SHAPE, _ARRAY_MANIFESTS, _ARRAY_SHAPE_V2 = 0, 2, 3
_MANIFEST_REF_ID, _MANIFEST_REF_EXTENTS = 0, 1
_MANIFEST_ARRAYS, _MANIFEST_DICTIONARY, _MANIFEST_LOCATION_COMPRESSION = 1, 2, 3
_CHUNK_INDEX, _CHUNK_INLINE, _CHUNK_OFFSET, _CHUNK_LENGTH, _CHUNK_ID, _CHUNK_LOCATION = 0, 1, 2, 3, 4, 5
_CHUNK_ETAG, _CHUNK_MODIFIED, _CHUNK_COMPRESSED_LOCATION = 6, 7, 8
_NODE_ARRAY = 1  # NodeData union: 1 array, 2 group


def _nodes(snapshot: bytes, location: str) -> tuple[list[tuple[str, bytes]], list[_Array]]:
    """(zarr.json key, bytes) of every node, and the arrays with their manifests. Spec 1 gives an
    array's dimensions in `shape`; spec 2 leaves that empty and fills `shape_v2`."""
    root = Table.root(snapshot)
    metadata, arrays = [], []
    for node in root.tables(2):
        path = (node.string(_NODE_PATH) or "/").strip("/")
        user_data = node.bytes_(_NODE_USER_DATA) or b""
        metadata.append((f"{path}/zarr.json" if path else "zarr.json", user_data))
        if node.scalar(_NODE_DATA_TYPE, "B") != _NODE_ARRAY:
            continue
        data = node.table(_NODE_DATA)
        if data is None:
            raise FormatError(f"array {path or '/'} has no array data")
        ndim = len(data.structs(_ARRAY_SHAPE, "QQ")) or len(data.tables(_ARRAY_SHAPE_V2))
        manifests = [(object_id(ref.struct_bytes(_MANIFEST_REF_ID, 12) or b""),
                      ref.structs(_MANIFEST_REF_EXTENTS, "II")) for ref in data.tables(_ARRAY_MANIFESTS)]
        try:
            meta = ArrayMeta.from_zarr_json(json.loads(user_data))
        except ValueError:  # (ArrayMetaError too: not a JSON object)
            raise RefsError(f"array {quote(path or '/')} of Icechunk repository {quote(location)} "
                            "has malformed zarr.json") from None
        if ndim == 0 and meta.shape:
            ndim = len(meta.shape)  # (a snapshot that lists no dimensions: trust the metadata)
        arrays.append(_Array(path, node.struct_bytes(_NODE_ID, 8), ndim, *chunk_key_layout(meta, path), manifests))
    return metadata, arrays


class _Checksums:
    """Expected validators per virtual url: an ETag, or "not modified after" (seconds)."""

    def __init__(self) -> None:
        self.by_url: dict[str, tuple[str, object]] = {}

    def add(self, url: str, etag: str | None, modified: int) -> None:
        if etag:
            new = ("etag", etag)
        elif modified:
            new = ("modified", modified)
        else:
            return
        old = self.by_url.get(url)
        if old is None:
            self.by_url[url] = new
        elif old[0] == new[0] == "modified":
            self.by_url[url] = ("modified", min(old[1], new[1]))  # the strictest bound


class _Locations:
    """Virtual chunk locations -> url ids, each distinct location resolved once per load."""

    def __init__(self, builder: RefSetBuilder, containers: Containers) -> None:
        self.builder = builder
        self.containers = containers
        self._resolved: dict[bytes, str] = {}

    def urls(self, distinct: list[bytes], array_path: str) -> list[str]:
        out = []
        for raw in distinct:
            url = self._resolved.get(raw)
            if url is None:
                url = self._resolved[raw] = self.containers.resolve(raw.decode("utf-8"), array_path)
            out.append(url)
        return out


def _decompressor(manifest: Table):
    """Spec 2: virtual chunk locations may be zstd-compressed with a dictionary kept in the manifest."""
    dictionary = manifest.bytes_(_MANIFEST_DICTIONARY)
    if manifest.scalar(_MANIFEST_LOCATION_COMPRESSION, "B", 1) != 1 or not dictionary:
        return None
    import zstandard

    return zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(dictionary))


def _decimal_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ASCII digits of non-negative ints, right-aligned in a fixed width, and which bytes are digits
    (made a digit column at a time: no n x width array of int64)."""
    values = values.astype(np.int64, copy=False)
    width = len(str(int(values.max()))) if len(values) else 1
    digits = np.empty((len(values), width), np.uint8)
    used = np.empty((len(values), width), bool)
    for k in range(width):
        power = 10 ** (width - 1 - k)
        digits[:, k] = values // power % 10 + 48
        used[:, k] = values >= power
    used[:, -1] = True  # (0 has one digit)
    return digits, used


def chunk_key_batches(prefix: str, coords: np.ndarray, separator: str):
    """The keys prefix + coords joined by `separator`, rendered with numpy, as (NUL-joined UTF-8 keys,
    first, stop) runs whose keys share a directory (so that the builder needs no per-key work)."""
    n, ndim = coords.shape
    pieces = [np.frombuffer(prefix.encode(), np.uint8)[None, :].repeat(n, 0)]
    masks = [np.ones(pieces[0].shape, bool)]
    sep = np.frombuffer(separator.encode(), np.uint8)
    for j in range(ndim):
        if j:
            pieces.append(sep[None, :].repeat(n, 0))
            masks.append(np.ones((n, len(sep)), bool))
        digits, used = _decimal_columns(coords[:, j])
        pieces.append(digits)
        masks.append(used)
    pieces.append(np.zeros((n, 1), np.uint8))  # the NUL after each key
    masks.append(np.ones((n, 1), bool))
    keep = np.concatenate(masks, axis=1)
    blob = np.concatenate(pieces, axis=1)[keep].tobytes()
    ends = np.cumsum(keep.sum(axis=1))  # just past each key's NUL
    if separator == "/" and ndim > 1:
        change = np.flatnonzero((coords[1:, :-1] != coords[:-1, :-1]).any(axis=1)) + 1
        bounds = [0, *change.tolist(), n] if len(change) < n // 4 else [0, n]
    else:
        bounds = [0, n]
    for first, stop in zip(bounds[:-1], bounds[1:]):
        start = int(ends[first - 1]) if first else 0
        yield blob[start : int(ends[stop - 1]) - 1], first, stop


def _virtual_urls(cols: TableColumns, refs: np.ndarray, field: int, decompressor, array: _Array,
                  locations: _Locations) -> tuple[list[str], np.ndarray]:
    """(urls, index into them of each ref) of the virtual refs `refs`, whose location is in `field`
    (compressed with the manifest's dictionary if `decompressor`)."""
    start, count = cols.vectors(field, refs)
    distinct, which = cols.strings(start, count)
    del start, count
    if decompressor is not None:
        import zstandard

        try:
            distinct = [decompressor.decompress(raw, max_output_size=1024) for raw in distinct]
        except zstandard.ZstdError as e:
            raise RefsError(f"array {quote(array.path or '/')}: a compressed virtual chunk location does not "
                            f"decompress ({e})") from None
        # (two compressed forms of one location are one url: merge them)
        merged, remap = {}, np.empty(len(distinct), np.int64)
        for k, raw in enumerate(distinct):
            remap[k] = merged.setdefault(raw, len(merged))
        distinct, which = list(merged), remap[which]
    return locations.urls(distinct, array.path), which


def _note_checksums(cols: TableColumns, refs: np.ndarray, urls: list[str], which: np.ndarray,
                    checksums: _Checksums) -> None:
    modified = cols.scalar_u32(_CHUNK_MODIFIED, refs)
    dated = modified > 0
    if dated.any():
        oldest = np.full(len(urls), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(oldest, which[dated], modified[dated])
        for j in np.flatnonzero(oldest < np.iinfo(np.int64).max).tolist():
            checksums.add(urls[j], None, int(oldest[j]))
    del modified, dated
    etag_start, etag_count = cols.vectors(_CHUNK_ETAG, refs)
    for k in np.flatnonzero(etag_count > 0).tolist():
        a, c = int(etag_start[k]), int(etag_count[k])
        checksums.add(urls[which[k]], bytes(cols.buf[a : a + c]).decode("utf-8", "replace"), 0)


def _within(coords: np.ndarray, extents: list[tuple[int, int]]) -> np.ndarray | None:
    """Which chunks lie in a manifest ref's extents ([from, to) per dimension); None: all of them.
    (Icechunk looks a chunk up only in the manifest whose extents hold it.)"""
    if not extents or len(extents) != coords.shape[1]:
        return None
    keep = np.ones(len(coords), bool)
    for j, (lo, hi) in enumerate(extents):
        keep &= (coords[:, j] >= lo) & (coords[:, j] < hi)
    return None if keep.all() else keep


@dataclass
class _Chunks:
    """One array's chunk references out of one manifest, in arrays of their own (the manifest's
    buffer can go before the keys are made)."""

    array: _Array
    coords: np.ndarray  # (n, ndim) uint32
    url_ids: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    inline: dict[int, bytes]


def _read_chunks(builder: RefSetBuilder, files: RepoFiles, array: _Array, manifest: Table, vector_pos: int,
                 extents: list[tuple[int, int]], locations: _Locations, checksums: _Checksums) -> _Chunks | None:
    """The chunk references of `array` in a manifest (its ChunkRef vector at `vector_pos`), read
    column by column: each kind (native, virtual, inline) only where it is."""
    buf = manifest.buf
    cols = TableColumns(buf, vector_pos)
    n = cols.n
    if n == 0:
        return None
    index_start, index_count = cols.vectors(_CHUNK_INDEX)
    if (index_count != array.ndim).any() and not (array.ndim == 0 and (index_count <= 0).all()):
        raise RefsError(f"array {quote(array.path or '/')}: a manifest chunk index does not have "
                        f"{array.ndim} dimensions")
    coords = np.empty((n, array.ndim), np.uint32)
    for j in range(array.ndim):
        coords[:, j] = cols.u32(index_start + 4 * j)
    del index_start, index_count
    keep = _within(coords, extents)
    rows = None if keep is None else np.flatnonzero(keep)
    if rows is not None:
        coords, n = coords[rows], len(rows)
        if n == 0:
            return None
        # (from here on, only the tables kept: `rows` maps their order to the manifest's)
        cols.pos, cols.vt, cols.vt_size = cols.pos[rows], cols.vt[rows], cols.vt_size[rows]
        cols.n = n
    offsets = cols.scalar_u64(_CHUNK_OFFSET).view(np.int64)
    lengths = cols.scalar_u64(_CHUNK_LENGTH).view(np.int64)
    url_ids = np.full(n, INLINE, np.int32)

    # Which kind each ref is, in Icechunk's order: a chunk id, else a compressed location, else a
    # location, else inline bytes.
    is_native = cols.present(_CHUNK_ID)
    is_compressed = ~is_native & cols.present(_CHUNK_COMPRESSED_LOCATION)
    is_plain = ~is_native & ~is_compressed & cols.present(_CHUNK_LOCATION)
    is_inline = ~is_native & ~is_compressed & ~is_plain & cols.present(_CHUNK_INLINE)
    neither = ~(is_native | is_compressed | is_plain | is_inline)
    if neither.any():
        k = int(np.flatnonzero(neither)[0])
        raise RefsError(f"array {quote(array.path or '/')}: manifest entry {k} is neither inline, native nor virtual")
    del neither

    refs = np.flatnonzero(is_native)
    if len(refs):
        ids = cols._gather(cols.field(_CHUNK_ID, refs), 12)
        urls = [files.url("chunks/" + object_id(row.tobytes())) for row in ids]
        url_ids[refs] = builder.url_ids(urls)
        del ids, urls

    for mask, field in ((is_plain, _CHUNK_LOCATION), (is_compressed, _CHUNK_COMPRESSED_LOCATION)):
        refs = np.flatnonzero(mask)
        if not len(refs):
            continue
        decompressor = None
        if field == _CHUNK_COMPRESSED_LOCATION:
            decompressor = _decompressor(manifest)
            if decompressor is None:
                raise RefsError(f"array {quote(array.path or '/')}: compressed virtual chunk locations in a "
                                "manifest without a location dictionary")
        urls, which = _virtual_urls(cols, refs, field, decompressor, array, locations)
        url_ids[refs] = builder.url_ids(urls)[which]
        _note_checksums(cols, refs, urls, which, checksums)
        del which

    inline: dict[int, bytes] = {}
    refs = np.flatnonzero(is_inline)
    if len(refs):
        inline_start, inline_count = cols.vectors(_CHUNK_INLINE, refs)
        for k, a, c in zip(refs.tolist(), inline_start.tolist(), inline_count.tolist()):
            inline[k] = bytes(buf[a : a + c])
            lengths[k] = c
    return _Chunks(array, coords, url_ids, offsets, lengths, inline)


def _add_chunks(builder: RefSetBuilder, chunks: _Chunks) -> int:
    """Key every chunk reference by the array's chunk key encoding and add it."""
    array, n = chunks.array, len(chunks.url_ids)
    if array.ndim == 0:
        builder.add_batch([array.scalar_key] * n, chunks.url_ids, chunks.offsets, chunks.lengths, chunks.inline)
        return n
    inline_at = np.array(sorted(chunks.inline), np.int64)
    for encoded, first, stop in chunk_key_batches(array.key_prefix, chunks.coords, array.separator):
        lo, hi = np.searchsorted(inline_at, [first, stop])
        batch_inline = {k - first: chunks.inline[k] for k in inline_at[lo:hi].tolist()}
        builder.add_encoded(encoded, stop - first, chunks.url_ids[first:stop], chunks.offsets[first:stop],
                            chunks.lengths[first:stop], batch_inline)
    return n


def _chunks_by_manifest(arrays: list[_Array]) -> dict[str, list[tuple[_Array, list[tuple[int, int]]]]]:
    """manifest id -> the (array, extents) that read it, so that each manifest is read once and let go."""
    out: dict[str, list] = {}
    for array in arrays:
        for manifest_id, extents in array.manifests:
            out.setdefault(manifest_id, []).append((array, extents))
    return out


def current_snapshot(location: str, remote_options: dict | None = None, version: Version | None = None) -> str:
    """The snapshot id the branch (or tag) points at now: what --refresh follows (a new commit to the
    branch is a new version of the mount's tree)."""
    files = RepoFiles(location, remote_options)
    return resolve_snapshot(files, read_repo_info(files), version or Version())


def load_icechunk(location: str, *, remote_options: dict | None = None, version: Version | None = None,
                  max_keys: int | None = None, containers: dict[str, str] | None = None,
                  max_bytes: int | None = None):
    """The RefSet of one snapshot of the Icechunk repository at `location`. `containers` re-points
    named virtual chunk containers (name -> url prefix); `max_bytes` (--max-refs-size) bounds each of
    its metadata files once decompressed."""
    version = version or Version()
    if sum(bool(x) for x in (version.branch, version.tag, version.snapshot)) > 1:
        raise RefsError("give at most one of --branch, --tag and --snapshot")
    files = RepoFiles(location, remote_options, max_bytes)
    info = read_repo_info(files)
    snapshot_id = resolve_snapshot(files, info, version)
    vccs = Containers(info.config, location, containers)
    try:
        _, _, snapshot = read_flatbuffer(files, f"snapshots/{snapshot_id}", FILE_SNAPSHOT)
        metadata, arrays = _nodes(snapshot, location)
        del snapshot
        builder = RefSetBuilder(max_keys)
        builder.add_batch([k for k, _ in metadata], np.full(len(metadata), INLINE, np.int32),
                          np.zeros(len(metadata), np.int64), np.array([len(v) for _, v in metadata], np.int64),
                          {k: v for k, (_, v) in enumerate(metadata)})
        locations = _Locations(builder, vccs)
        checksums = _Checksums()
        chunks = 0
        for manifest_id, readers in _chunks_by_manifest(arrays).items():
            _, _, buf = read_flatbuffer(files, f"manifests/{manifest_id}", FILE_MANIFEST)
            manifest = Table.root(buf)
            by_node = {a.struct_bytes(0, 8): a.vector_position(1) for a in manifest.tables(_MANIFEST_ARRAYS)}
            found = [_read_chunks(builder, files, array, manifest, by_node[array.node_id], extents, locations,
                                  checksums) for array, extents in readers if array.node_id in by_node]
            del manifest, buf, by_node  # (the keys are made once the manifest is let go)
            for part in found:
                if part is not None:
                    chunks += _add_chunks(builder, part)
            del found
        refset = builder.build()
    except (FormatError, struct.error, IndexError, UnicodeDecodeError) as e:
        raise RefsError(f"Icechunk repository {quote(location)}: malformed snapshot or manifest "
                        f"({type(e).__name__}: {e})") from None
    refset.snapshot_id = snapshot_id
    refset.icechunk_containers = vccs.used
    refset.icechunk_location = location
    refset.checksums = {builder.url_ids([url])[0].item(): value for url, value in checksums.by_url.items()}
    written = f" (format spec {info.spec}" + (f", {info.writer})" if info.writer else ")")
    log.info("Icechunk repository %s%s: %s is snapshot %s (%d arrays, %d chunk references); this mount stays "
             "on that snapshot", location, written, version.describe(), snapshot_id, len(arrays), chunks)
    return refset
