"""Icechunk repositories as reference sets, read from the on-disk format (Icechunk 1.x, spec 1).

The icechunk Python package can read chunks but does not tell where they are, so the snapshot and
manifest files are read directly: each is a 39-byte header (magic, writer name, spec version, file
type, compression) and a zstd-compressed FlatBuffer (schemas: icechunk/flatbuffers/*.fbs).

What one snapshot becomes (Zarr v3 keys, as an Icechunk store presents them):
- every node's ``zarr.json`` (the node's user data) -> inline bytes;
- every chunk of an array, keyed by the array's chunk key encoding (``c/0/0``):
  virtual -> (its url, offset, length); native -> (``<repo>/chunks/<id>``, offset, length);
  inline -> its bytes.

The version is resolved once, at load: a branch or tag names a snapshot id, and the mount serves that
snapshot for its whole life (later commits do not change it).
Virtual chunk urls must lie under one of the repository's virtual chunk containers. Their ETag or
last-modified checksums are kept in ``refset.checksums`` (url id -> (kind, value)) for the fetch layer.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import struct
from dataclasses import dataclass

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.flatbuf import FormatError, Table, TableColumns
from refmount.refs.model import INLINE, RefSetBuilder
from refmount.fetch.protocols import is_remote, local_path

log = logging.getLogger("refmount")

MAGIC = "ICE🧊CHUNK".encode()
HEADER_BYTES = len(MAGIC) + 24 + 3
FILE_SNAPSHOT, FILE_MANIFEST = 1, 2
SPEC_VERSION = 1
_RFC4648 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_CROCKFORD = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = bytes.maketrans(_RFC4648, _CROCKFORD)
_REFERENCE_SUFFIXES = (".json", ".parq", ".parquet", ".gz", ".bz2", ".xz", ".zst", ".zstd")


@dataclass(frozen=True)
class Version:
    """Which snapshot to mount: exactly one of branch, tag, snapshot (default: branch main)."""

    branch: str | None = None
    tag: str | None = None
    snapshot: str | None = None

    def describe(self) -> str:
        if self.snapshot:
            return f"snapshot {self.snapshot}"
        return f"tag {self.tag!r}" if self.tag else f"branch {self.branch or 'main'!r}"


def version_from_options(opts) -> Version | None:
    """The --branch/--tag/--snapshot choice of mount or inspect options, None if none was given."""
    version = Version(getattr(opts, "branch", None), getattr(opts, "tag", None), getattr(opts, "snapshot", None))
    return version if (version.branch or version.tag or version.snapshot) else None


def reject_version(location: str, version: Version | None) -> None:
    if version is not None and (version.branch or version.tag or version.snapshot):
        raise RefsError(f"--branch, --tag and --snapshot apply to Icechunk repositories only; {quote(location)} "
                        "is not one (no refs/ and snapshots/)")


def object_id(raw: bytes) -> str:
    """Icechunk's text form of an object id: Crockford base32, no padding."""
    return base64.b32encode(raw).rstrip(b"=").translate(_TO_CROCKFORD).decode()


class RepoFiles:
    """Reads the repository's own objects (local directory, or any fsspec url)."""

    def __init__(self, location: str, remote_options: dict | None = None) -> None:
        self.location = location.rstrip("/")
        self.remote = is_remote(location)
        self.remote_options = remote_options or {}
        self._fs = None
        if self.remote:
            import fsspec

            self._fs, self._root = fsspec.core.url_to_fs(self.location, **self.remote_options)
        else:
            self._root = os.path.abspath(local_path(self.location))

    def url(self, relpath: str) -> str:
        """The url a chunk object is read from (an absolute path for a local repository)."""
        return f"{self.location}/{relpath}" if self.remote else os.path.join(self._root, relpath)

    def exists(self, relpath: str) -> bool:
        if not self.remote:
            return os.path.exists(os.path.join(self._root, relpath))
        try:
            return bool(self._fs.exists(f"{self._root}/{relpath}"))
        except Exception:
            return False

    def read(self, relpath: str) -> bytes:
        try:
            if not self.remote:
                with open(os.path.join(self._root, relpath), "rb") as f:
                    return f.read()
            return self._fs.cat_file(f"{self._root}/{relpath}")
        except FileNotFoundError:
            raise RefsError(f"Icechunk repository {quote(self.location)} has no {relpath}") from None
        except OSError as e:
            raise RefsError(f"cannot read {relpath} of Icechunk repository {quote(self.location)}: {e}") from None
        except Exception as e:  # network errors of every kind from every fsspec backend
            raise RefsError(f"cannot read {relpath} of Icechunk repository {quote(self.location)}: "
                            f"{type(e).__name__}: {e}") from None


def is_icechunk_location(location: str, remote_options: dict | None = None, version: Version | None = None) -> bool:
    """A local directory with refs/ and snapshots/; remotely, any version option given, or a url that
    does not look like a reference file and holds a main branch or a config.yaml."""
    if not is_remote(location):
        root = local_path(location)
        return os.path.isdir(os.path.join(root, "snapshots")) and os.path.isdir(os.path.join(root, "refs"))
    if version is not None and (version.branch or version.tag or version.snapshot):
        return True
    if location.rstrip("/").lower().endswith(_REFERENCE_SUFFIXES):
        return False
    try:
        files = RepoFiles(location, remote_options)
    except Exception:
        return False
    return files.exists("refs/branch.main/ref.json") or files.exists("config.yaml")


def read_flatbuffer(files: RepoFiles, relpath: str, file_type: int) -> bytes:
    data = files.read(relpath)
    if len(data) < HEADER_BYTES or not data.startswith(MAGIC):
        raise RefsError(f"{relpath} of Icechunk repository {quote(files.location)} is not an Icechunk file")
    spec, kind, compression = data[HEADER_BYTES - 3 : HEADER_BYTES]
    if spec != SPEC_VERSION:
        raise RefsError(f"{relpath}: Icechunk format spec {spec} is not supported (refmount reads spec "
                        f"{SPEC_VERSION}, as written by Icechunk 1.x)")
    if kind != file_type:
        raise RefsError(f"{relpath}: Icechunk file type {kind}, expected {file_type}")
    body = memoryview(data)[HEADER_BYTES:]
    if compression == 0:
        return bytes(body)
    if compression != 1:
        raise RefsError(f"{relpath}: unknown Icechunk compression {compression}")
    import zstandard

    try:
        return zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True).read()
    except zstandard.ZstdError as e:
        raise RefsError(f"{relpath}: corrupt zstd data: {e}") from None


def resolve_snapshot(files: RepoFiles, version: Version) -> str:
    """The snapshot id a branch or tag points at now (or the given snapshot id, checked)."""
    if version.snapshot:
        if not files.exists(f"snapshots/{version.snapshot}"):
            raise RefsError(f"Icechunk repository {quote(files.location)} has no snapshot {version.snapshot!r}")
        return version.snapshot
    if version.tag:
        relpath = f"refs/tag.{version.tag}/ref.json"
        if files.exists(f"refs/tag.{version.tag}/ref.json.deleted"):
            raise RefsError(f"tag {version.tag!r} of Icechunk repository {quote(files.location)} was deleted")
    else:
        relpath = f"refs/branch.{version.branch or 'main'}/ref.json"
    if not files.exists(relpath):
        raise RefsError(f"Icechunk repository {quote(files.location)} has no {version.describe()}")
    try:
        snapshot = json.loads(files.read(relpath))["snapshot"]
    except (ValueError, KeyError, TypeError):
        raise RefsError(f"{relpath} of Icechunk repository {quote(files.location)} is malformed") from None
    return str(snapshot)


def virtual_container_prefixes(files: RepoFiles) -> list[str]:
    """url_prefix of every virtual chunk container in the repository's config.yaml."""
    if not files.exists("config.yaml"):
        return []
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    # store types are YAML tags (!http, !s3, ...): only the url prefixes matter here
    _Loader.add_multi_constructor("!", lambda loader, suffix, node: (
        loader.construct_mapping(node) if isinstance(node, yaml.MappingNode) else None))
    try:
        config = yaml.load(files.read("config.yaml"), Loader=_Loader) or {}
    except yaml.YAMLError as e:
        raise RefsError(f"config.yaml of Icechunk repository {quote(files.location)} is malformed: "
                        f"{str(e).splitlines()[0]}") from None
    containers = config.get("virtual_chunk_containers") or {}
    return [str(c.get("url_prefix") or name) for name, c in containers.items() if isinstance(c, dict)]


def container_url(url: str, prefixes: list[str], array_path: str) -> str:
    """`url` if it lies under one of the virtual chunk containers, else a one-line error.

    Icechunk 1.x stores virtual urls without their port (http://host:8080/x.nc is written as
    http://host/x.nc; fixed in Icechunk 2.1, issue earth-mover/icechunk#2223): a url that matches no
    container as written, but exactly one container whose prefix has a port once that port is left
    out, gets the port back from that container."""
    if any(url.startswith(prefix) for prefix in prefixes):
        return url
    from urllib.parse import urlsplit

    candidates = []
    for prefix in prefixes:
        parts = urlsplit(prefix)
        if parts.port is not None:
            portless = prefix.replace(parts.netloc, parts.netloc.rsplit(":", 1)[0], 1)
            if url.startswith(portless):
                candidates.append(prefix + url[len(portless):])
    if len(candidates) == 1:
        return candidates[0]
    raise RefsError(f"virtual chunk url {quote(url)} of array {quote(array_path or '/')} is not under any "
                    "virtual chunk container of the repository's configuration")


@dataclass
class _Array:
    path: str  # '' for the root
    node_id: bytes
    ndim: int
    key_prefix: str  # e.g. "air/c/"
    separator: str
    scalar_key: str  # the one chunk key of a 0-d array ("air/c", or "air/0" in the v2 encoding)
    manifests: list[str]


def chunk_key_layout(meta: dict, path: str) -> tuple[str, str, str]:
    """(key prefix, separator, key of the single chunk of a 0-d array) of an array's chunks, from its
    chunk_key_encoding (Zarr v3: "default" is c/0/0, "v2" is 0.0)."""
    base = f"{path}/" if path else ""
    encoding = meta.get("chunk_key_encoding") or {"name": "default"}
    config = encoding.get("configuration") or {}
    if encoding.get("name") == "v2":
        return base, config.get("separator", "."), base + "0"
    return base + "c/", config.get("separator", "/"), base + "c"



def _nodes(snapshot: bytes, location: str) -> tuple[list[tuple[str, bytes]], list[_Array]]:
    """(zarr.json key, bytes) of every node, and the arrays with their manifests."""
    root = Table.root(snapshot)
    metadata, arrays = [], []
    for node in root.tables(2):
        path = (node.string(1) or "/").strip("/")
        user_data = node.bytes_(2) or b""
        metadata.append((f"{path}/zarr.json" if path else "zarr.json", user_data))
        if node.scalar(3, "B") != 1:  # NodeData union: 1 array, 2 group
            continue
        data = node.table(4)
        shape = data.structs(0, "QQ")
        manifests = [object_id(ref.struct_bytes(0, 12)) for ref in data.tables(2)]
        try:
            meta = json.loads(user_data)
        except ValueError:
            raise RefsError(f"array {quote(path or '/')} of Icechunk repository {quote(location)} "
                            "has malformed zarr.json") from None
        arrays.append(_Array(path, node.struct_bytes(0, 8), len(shape), *chunk_key_layout(meta, path), manifests))
    return metadata, arrays


class _Manifests:
    """Manifest files, read once each: node id -> (buffer, position of its ChunkRef vector)."""

    def __init__(self, files: RepoFiles) -> None:
        self.files = files
        self._read: dict[str, dict[bytes, tuple[bytes, int]]] = {}

    def refs_of(self, manifest_id: str, node_id: bytes) -> tuple[bytes, int] | None:
        found = self._read.get(manifest_id)
        if found is None:
            buf = read_flatbuffer(self.files, f"manifests/{manifest_id}", FILE_MANIFEST)
            found = {}
            for array in Table.root(buf).tables(1):
                found[array.struct_bytes(0, 8)] = (buf, array.vector_position(1))
            self._read[manifest_id] = found
        return found.get(node_id)


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


def _decimal_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ASCII digits of non-negative ints, right-aligned in a fixed width, and which bytes are digits."""
    width = len(str(int(values.max()))) if len(values) else 1
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (values[:, None] // powers % 10 + 48).astype(np.uint8)
    used = np.maximum((values[:, None] >= powers).sum(axis=1), 1)
    return digits, np.arange(width) >= width - used[:, None]


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


def _add_array_chunks(builder: RefSetBuilder, files: RepoFiles, array: _Array, buf: bytes, vector_pos: int,
                      allowed_prefixes: list[str], checksums: _Checksums) -> int:
    cols = TableColumns(buf, vector_pos)
    n = cols.n
    if n == 0:
        return 0
    mem = memoryview(buf)
    index_start, index_count = cols.vectors(0)
    if (index_count != array.ndim).any() and not (array.ndim == 0 and (index_count <= 0).all()):
        raise RefsError(f"array {quote(array.path or '/')}: a manifest chunk index does not have "
                        f"{array.ndim} dimensions")
    offsets = cols.scalar_u64(2).astype(np.int64)
    lengths = cols.scalar_u64(3).astype(np.int64)
    url_ids = np.full(n, INLINE, np.int32)
    inline: dict[int, bytes] = {}

    inline_start, inline_count = cols.vectors(1)
    for k in np.flatnonzero(inline_count >= 0).tolist():
        a = int(inline_start[k])
        inline[k] = bytes(mem[a : a + int(inline_count[k])])
        lengths[k] = len(inline[k])

    native = cols.field(4)
    has_native = np.flatnonzero(native > 0)
    if len(has_native):
        ids = cols._gather(native[has_native], 12)
        urls = [files.url("chunks/" + object_id(row.tobytes())) for row in ids]
        url_ids[has_native] = builder.url_ids(urls)

    loc_start, loc_count = cols.vectors(5)
    virtual = np.flatnonzero(loc_count >= 0)
    if len(virtual):
        distinct, which = cols.strings(loc_start[virtual], loc_count[virtual])
        urls = [container_url(raw.decode("utf-8"), allowed_prefixes, array.path) for raw in distinct]
        url_ids[virtual] = builder.url_ids(urls)[which]
        modified = cols.scalar_u32(7)[virtual]
        dated = modified > 0
        if dated.any():
            oldest = np.full(len(urls), np.iinfo(np.int64).max, np.int64)
            np.minimum.at(oldest, which[dated], modified[dated])
            for j in np.flatnonzero(oldest < np.iinfo(np.int64).max).tolist():
                checksums.add(urls[j], None, int(oldest[j]))
        etag_start, etag_count = cols.vectors(6)
        for k in np.flatnonzero(etag_count[virtual] > 0).tolist():
            a, c = int(etag_start[virtual[k]]), int(etag_count[virtual[k]])
            checksums.add(urls[which[k]], bytes(mem[a : a + c]).decode("utf-8", "replace"), 0)

    neither = (url_ids == INLINE) & (inline_count < 0)
    if neither.any():
        k = int(np.flatnonzero(neither)[0])
        raise RefsError(f"array {quote(array.path or '/')}: manifest entry {k} is neither inline, native nor virtual")
    if array.ndim == 0:
        builder.add_batch([array.scalar_key] * n, url_ids, offsets, lengths, inline)
        return n
    coords = cols.u32((index_start[:, None] + 4 * np.arange(array.ndim)).reshape(-1)).reshape(n, array.ndim)
    inline_at = np.array(sorted(inline), np.int64)
    for encoded, first, stop in chunk_key_batches(array.key_prefix, coords, array.separator):
        lo, hi = np.searchsorted(inline_at, [first, stop])
        batch_inline = {k - first: inline[k] for k in inline_at[lo:hi].tolist()}
        builder.add_encoded(encoded, stop - first, url_ids[first:stop], offsets[first:stop], lengths[first:stop],
                            batch_inline)
    return n


def load_icechunk(location: str, *, remote_options: dict | None = None, version: Version | None = None,
                  max_keys: int | None = None):
    """The RefSet of one snapshot of the Icechunk repository at `location`."""
    version = version or Version()
    if sum(bool(x) for x in (version.branch, version.tag, version.snapshot)) > 1:
        raise RefsError("give at most one of --branch, --tag and --snapshot")
    files = RepoFiles(location, remote_options)
    snapshot_id = resolve_snapshot(files, version)
    try:
        snapshot = read_flatbuffer(files, f"snapshots/{snapshot_id}", FILE_SNAPSHOT)
        metadata, arrays = _nodes(snapshot, location)
        builder = RefSetBuilder(max_keys)
        builder.add_batch([k for k, _ in metadata], np.full(len(metadata), INLINE, np.int32),
                          np.zeros(len(metadata), np.int64), np.array([len(v) for _, v in metadata], np.int64),
                          {k: v for k, (_, v) in enumerate(metadata)})
        prefixes = virtual_container_prefixes(files)
        manifests = _Manifests(files)
        checksums = _Checksums()
        chunks = 0
        for array in arrays:
            for manifest_id in array.manifests:
                found = manifests.refs_of(manifest_id, array.node_id)
                if found is not None:
                    chunks += _add_array_chunks(builder, files, array, *found, prefixes, checksums)
        del manifests
        refset = builder.build()
    except (FormatError, struct.error, IndexError, UnicodeDecodeError) as e:
        raise RefsError(f"Icechunk repository {quote(location)}: malformed snapshot or manifest "
                        f"({type(e).__name__}: {e})") from None
    refset.snapshot_id = snapshot_id
    refset.checksums = {builder.url_ids([url])[0].item(): value for url, value in checksums.by_url.items()}
    log.info("Icechunk repository %s: %s is snapshot %s (%d arrays, %d chunk references); this mount stays "
             "on that snapshot", location, version.describe(), snapshot_id, len(arrays), chunks)
    return refset

