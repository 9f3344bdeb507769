"""Native Zarr stores that are not a local directory, as reference sets: a store over http(s) or S3
(``https://host/x.zarr``, ``s3://bucket/x.zarr``), Zarr v2 or v3, and a zipped store (``x.zarr.zip``, as
zarr's ZipStore writes it), local or remote.

A remote store:
- its metadata is read once, at mount, and served inline: v2's consolidated ``.zmetadata``, v3's
  consolidated metadata in the root ``zarr.json``; without them, the hierarchy is walked node by node
  (``.zgroup``/``.zarray``/``.zattrs`` or ``zarr.json``), each group's children found by the object store's
  listing (S3 ListObjects, one level at a time) or over plain HTTP by the server's HTML index page. A
  group without consolidated metadata on a server that gives no index cannot be listed: refused in one
  line (only a store whose root is an array mounts so);
- its chunk keys come from each array's grid (chunks are never listed), each a whole remote object,
  computed on demand (`ZarrStoreRefSet`, refs/lazygrid.py; nested ones, v3's "c/1/0" and v2's "1/0",
  with their directories); a chunk the server answers 404 for is one the store lacks
  (`RefSet.may_lack`: refmount.view.raw reads it as absent once and remembers; a 403 or 5xx stays an
  error);
- every key passes `key_problem` (no ``..``, no empty or over-long segment) and its url is the store's
  own url joined with it: no key reaches another host or a path outside the store.

A zipped store: the zip's central directory (read from the end of the file, by ranged reads when it is
remote) lists every member; each member's local header gives where its bytes begin. A STORED member
is a byte range of the zip; metadata members are inlined (DEFLATED ones decompressed); a DEFLATED chunk
refuses the mount in one line (zarr's ZipStore writes STORED members; ``zip -0`` makes them).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import struct
import zipfile
from urllib.parse import quote as url_quote
from urllib.parse import unquote, urlsplit

import numpy as np

from refmount.errors import FetchError, RefmountError, RefsError, format_size, quote
from refmount.fetch.protocols import is_remote, local_path, protocol_of
from refmount.refs.arraymeta import ArrayMeta, ArrayMetaError
from refmount.refs.lazygrid import LazyGridRefSet
from refmount.refs.model import INLINE, WHOLE_FILE, RefSet, RefSetBuilder, key_problem, name_problem

log = logging.getLogger("refmount")

BATCH = 4096
MAX_METADATA_BYTES = 64 << 20  # one metadata document (consolidated metadata of a big hierarchy included)
MAX_NODES = 100_000  # groups and arrays one walk of an unconsolidated store visits
MAX_DEPTH = 64
V2_METADATA = (".zgroup", ".zarray", ".zattrs", ".zmetadata")
METADATA_NAMES = frozenset((*V2_METADATA, "zarr.json"))
_REMOTE = ("http", "https", "s3", "s3a")


def zarr_store_kind(location: str) -> str | None:
    """What the name of `location` says of it: 'zip' for a zipped store (a name ending in .zip: a local
    file or a remote url), 'remote' for an http(s) or s3 url whose path ends in .zarr, 'maybe' for one
    whose name says nothing (a store's own suffix, .zr, .zarr-v3, no suffix, a trailing '/': asked, by
    loading it as a store: `NotAStore` when it holds none), else None. (No request.)"""
    from refmount.refs.scan.catalogs import _ENDINGS, catalog_kind
    from refmount.refs.scan.sources import REFERENCE_SUFFIXES, has_glob

    if location.startswith("@") or has_glob(location):  # (many sources: refs/scan)
        return None
    proto = protocol_of(location)
    path = urlsplit(location).path if proto in ("http", "https") else location.partition("?")[0]
    name = path.rstrip("/").lower()
    if name.endswith(".zip"):
        if proto in _REMOTE:
            return "zip"
        return "zip" if not is_remote(location) and os.path.isfile(local_path(location)) else None
    if proto not in _REMOTE:
        return None
    if name.endswith(".zarr"):
        return "remote"
    bucket = proto in ("s3", "s3a") and "/" not in name.partition("://")[2]
    if bucket or name.endswith((*REFERENCE_SUFFIXES, *_ENDINGS)) or catalog_kind(location):
        return None  # (a whole bucket, a reference or data file, a catalog)
    last = name.rpartition("/")[2]
    suffix = last.rpartition(".")[2] if "." in last else ""
    if suffix and not path.endswith("/") and not suffix.startswith(("zarr", "zr")):
        return None  # (a file's own suffix, .fits or .he5: not asked four times for a store's documents)
    return "maybe"


NO_ROOT = "no zarr.json, .zmetadata, .zgroup or .zarray under it"


class NotAStore(RefsError):
    """A remote url holds no Zarr store's root metadata; `nor` says how that was found."""

    def __init__(self, message: str, nor: str = NO_ROOT) -> None:
        super().__init__(message)
        self.nor = nor


class Denied(RefsError):
    """A store's server refused a request (403). S3 answers so, without s3:ListBucket on the bucket,
    also for a key that is not there."""


def load_zarr_location(location: str, kind: str, *, remote_options: dict | None = None,
                       max_keys: int | None = None, max_bytes: int | None = None) -> RefSet:
    if kind == "zip":
        return load_zipped_store(location, remote_options=remote_options, max_keys=max_keys, max_bytes=max_bytes)
    return load_remote_store(location, remote_options=remote_options, max_keys=max_keys, max_bytes=max_bytes)


# -- reading documents of a remote store -----------------------------------------------------------------

def _filesystem(location: str, remote_options: dict):
    import fsspec

    from refmount.refs.source import fsspec_options

    options = dict(remote_options)
    if protocol_of(location) in ("s3", "s3a"):
        options.pop("headers", None)
    fs, _ = fsspec.core.url_to_fs(location, **fsspec_options(location, options))
    return fs


def _fetch_failure(url: str, e: Exception) -> RefmountError:
    """`e`, met fetching `url`, in one line; secrets redacted (a client's error names the url it
    asked, a signed url's token with it)."""
    from refmount.fetch.stats import redact
    from refmount.refs.source import _connection_failure, unavailable

    if isinstance(e, RefmountError):
        return e
    where = quote(redact(url))
    passing = unavailable(where, e)  # (a FetchError: a catalog's store item is asked again later)
    if passing is not None:
        return type(passing)(redact(str(passing)))
    if isinstance(e, FileNotFoundError):
        reason = _connection_failure(e)
        if reason:
            return RefsError(redact(f"cannot reach the server of {where}: {reason}"))
    os_error = getattr(e, "os_error", None)  # (aiohttp's failed connections)
    if isinstance(os_error, OSError):
        return RefsError(redact(f"cannot reach the server of {where}: {os_error.strerror or os_error}"))
    if isinstance(e, PermissionError):
        return Denied(redact(f"{where}: access denied ({e})"))
    return RefsError(redact(f"cannot fetch {where}: {type(e).__name__}: {e}"))


class MetadataBudget:
    """The metadata text one store inlines, held to --max-refs-size as a reference set's text is: a
    zip's DEFLATED members and a server's gzip answers inflate (a 2 MB zip of forty 60 MB .zattrs)."""

    def __init__(self, limit: int | None, where: str) -> None:
        self.limit, self.where, self.used = limit, where, 0

    def take(self, n: int) -> None:
        self.used += n
        if self.limit is not None and self.used > self.limit:
            raise RefsError(f"{quote(self.where)}: its metadata exceeds --max-refs-size {format_size(self.limit)} "
                            "once decompressed")


class RemoteStore:
    """The documents of a store at `base` (http(s) or s3), each read whole in one request."""

    def __init__(self, base: str, remote_options: dict, max_bytes: int | None = None) -> None:
        from refmount.fetch.stats import redact

        parts = urlsplit(base)
        self.proto = protocol_of(base)
        if parts.fragment or (parts.query and self.proto not in ("http", "https")):
            what = "fragment" if parts.fragment else f"query over {self.proto}"
            raise RefsError(f"{quote(redact(base))}: a Zarr store's url takes no {what}")
        # An http(s) store's query (a signed url's token, a keeper's ?email=) goes with every key's
        # request, after the key: ".../x.zarr/temp/0.0?sig=..."; `base` is the url without it.
        self.query = f"?{parts.query}" if parts.query else ""
        self.base = base.partition("?")[0].rstrip("/")
        self.remote_options = remote_options
        self.fs = _filesystem(self.base, remote_options)
        self.listing = "s3" if self.proto in ("s3", "s3a") else "index"
        self.budget = MetadataBudget(max_bytes, redact(self.base))

    def url(self, key: str, slash: str = "") -> str:
        """The url of a key of the store: always under the store's own url (keys passed key_problem),
        its query after the key (and after `slash`, a directory's index page)."""
        if self.proto in ("http", "https"):
            return f"{self.base}/{url_quote(key, safe='/')}{slash}{self.query}" if key else \
                f"{self.base}/{self.query}"
        return f"{self.base}/{key}"

    def shown(self, key: str) -> str:
        """The url of `key` as messages name it: its query's secrets redacted."""
        from refmount.fetch.stats import redact

        return redact(self.url(key))

    def get(self, key: str) -> bytes | None:
        """The document at `key`, or None when the store does not hold it (404, NoSuchKey)."""
        url = self.url(key)
        path = url if self.proto in ("http", "https") else url.split("://", 1)[1]
        try:
            data = self._read_bounded(path)
        except FileNotFoundError as e:
            failure = _fetch_failure(url, e)
            if isinstance(failure, FetchError) or "cannot reach" in str(failure):
                raise failure from None
            return None
        except Exception as e:  # noqa: BLE001 - every backend's errors, said in one line
            failure = _fetch_failure(url, e)
            if isinstance(failure, Denied) and self.listing == "s3":  # (an optional .zattrs, say)
                raise Denied(f"{failure}; S3 answers so also for a key that is not there when s3:ListBucket "
                             "on the bucket is not granted") from None
            raise failure from None
        if len(data) > MAX_METADATA_BYTES:
            raise RefsError(f"{quote(self.shown(key))} is larger than {MAX_METADATA_BYTES >> 20} MiB")
        self.budget.take(len(data))
        return data

    def _read_bounded(self, path: str) -> bytes:
        """At most MAX_METADATA_BYTES + 1 bytes of the object: a server that sends more (or ignores
        Range) is read no further."""
        if self.proto not in ("http", "https"):
            return self.fs.cat_file(path, start=0, end=MAX_METADATA_BYTES + 1)
        pieces, total = [], 0
        # (one streamed GET: block_size 0 streams, and a size given spares fsspec's HEAD before it)
        with self.fs.open(path, "rb", block_size=0, size=MAX_METADATA_BYTES) as f:
            while total <= MAX_METADATA_BYTES:
                piece = f.read(min(1 << 20, MAX_METADATA_BYTES + 1 - total))
                if not piece:
                    break
                pieces.append(piece)
                total += len(piece)
        return b"".join(pieces)

    def children(self, prefix: str) -> list[str] | None:
        """The names of the directories directly under `prefix` (a group's path), or None when the
        store cannot be listed (a plain HTTP server without index pages)."""
        if self.listing == "s3":
            root = self.base.split("://", 1)[1] + (f"/{prefix}" if prefix else "")
            try:
                listed = self.fs.ls(root, detail=True, refresh=True)
            except FileNotFoundError:
                return []
            except Exception as e:  # noqa: BLE001
                failure = _fetch_failure(f"{self.proto}://{root}", e)
                if isinstance(failure, Denied):  # (what to grant, in the one line)
                    raise Denied(f"{failure}: a store without consolidated metadata is walked by listing "
                                 "it, which needs s3:ListBucket on the bucket") from None
                raise failure from None
            return sorted(posixpath.basename(item["name"].rstrip("/")) for item in listed
                          if item.get("type") == "directory")
        from refmount.refs.scan.sources import _fetch_index, index_links

        page = self.url(prefix, "/")
        try:
            final, html = _fetch_index(page, dict(self.remote_options.get("headers") or {}))
        except FetchError:
            raise  # (its server down: asked again later, not taken for a store without index pages)
        except RefmountError:
            return None  # no index page: the hierarchy below cannot be known
        _, dirs = index_links(final, html)
        return sorted(unquote(urlsplit(d).path.rstrip("/").rpartition("/")[2]) for d in dirs)


# -- the metadata of a store -------------------------------------------------------------------------------

def _json(data: bytes, where: str):
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise RefsError(f"{quote(where)} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise RefsError(f"{quote(where)} is not a JSON object")
    return value


def _join(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _checked(key: str, source: str) -> bool:
    """Whether a key named by the store's metadata or listing may be a key of the tree (else it is
    left out, with one log line naming it and where it came from)."""
    problem = key_problem(key)
    if problem is None:
        return True
    log.warning("%s: key %s left out: it %s", source, quote(key), problem)
    return False


def _consolidated_v2(store: RemoteStore, zmetadata: bytes) -> dict[str, bytes]:
    doc = _json(zmetadata, store.shown(".zmetadata"))
    entries = doc.get("metadata")
    if not isinstance(entries, dict):
        raise RefsError(f"{quote(store.shown('.zmetadata'))} has no 'metadata' object")
    documents = {".zmetadata": zmetadata}
    for key, value in entries.items():
        if not isinstance(key, str) or posixpath.basename(key) not in V2_METADATA[:3]:
            continue
        if _checked(key, store.shown(".zmetadata")) and isinstance(value, dict):
            documents[key] = json.dumps(value, allow_nan=True).encode()
    return documents


def _consolidated_v3(store: RemoteStore, root: bytes, doc: dict) -> dict[str, bytes] | None:
    consolidated = doc.get("consolidated_metadata")
    if not isinstance(consolidated, dict) or not isinstance(consolidated.get("metadata"), dict):
        return None
    documents = {"zarr.json": root}
    for path, node in consolidated["metadata"].items():
        if not isinstance(path, str) or not isinstance(node, dict):
            continue
        key = _join(path, "zarr.json")
        if _checked(key, store.shown("zarr.json")):
            documents[key] = json.dumps(node, allow_nan=True).encode()
    return documents


def _walk(store: RemoteStore, version: int, root_doc: bytes) -> dict[str, bytes]:
    """The metadata documents of an unconsolidated store, node by node from the root."""
    documents: dict[str, bytes] = {}
    todo = [("", 0, root_doc)]
    visited = 0
    while todo:
        path, depth, first = todo.pop()
        visited += 1
        if visited + len(todo) > MAX_NODES:  # (a listing of millions of children is refused as it comes)
            raise RefsError(f"{quote(store.base)} holds more than {MAX_NODES:,} groups and arrays")
        if version == 3:
            data = first or store.get(_join(path, "zarr.json"))
            if data is None:
                continue  # a directory that is no node (a chunk directory, a leftover)
            documents[_join(path, "zarr.json")] = data
            group = _json(data, store.shown(_join(path, "zarr.json"))).get("node_type") == "group"
        else:
            group = False
            for name in (".zarray", ".zgroup"):
                data = store.get(_join(path, name))
                if data is not None:
                    documents[_join(path, name)] = data
                    group = name == ".zgroup"
                    break
            else:
                continue
            attrs = store.get(_join(path, ".zattrs"))
            if attrs is not None:
                documents[_join(path, ".zattrs")] = attrs
        if not group:
            continue
        names = store.children(path)
        if names is None:
            if path == "":
                raise RefsError(f"{quote(store.base)} has no consolidated metadata and its server gives no index "
                                "page: the arrays of a group cannot be found over plain HTTP (consolidate it, "
                                "e.g. zarr.consolidate_metadata, or serve it with an index)")
            continue
        if depth >= MAX_DEPTH:
            raise RefsError(f"{quote(store.shown(path))}: groups nest deeper than {MAX_DEPTH} levels")
        for name in reversed(names):
            if name.startswith(".") or name_problem(name) is not None:
                if not name.startswith("."):
                    log.warning("%s: entry %s left out: it %s", store.shown(path), quote(name), name_problem(name))
                continue
            todo.append((_join(path, name), depth + 1, None))
    return documents


def _store_documents(store: RemoteStore) -> tuple[dict[str, bytes], bool]:
    """(metadata documents by key, consolidated?)"""
    denied = []

    def probe(name: str) -> bytes | None:
        try:
            return store.get(name)
        except Denied:
            if store.listing != "s3":
                raise
            denied.append(name)  # (absent, or denied: S3 without s3:ListBucket cannot tell us which)
            return None

    root = probe("zarr.json")
    if root is not None:
        doc = _json(root, store.shown("zarr.json"))
        if doc.get("zarr_format") != 3:  # (zarrita's draft v3 put a url there, and its metadata under meta/)
            raise RefsError(f"{quote(store.shown('zarr.json'))}: zarr_format is {doc.get('zarr_format')!r}, not 3: "
                            "not a Zarr v3 store of the final spec (a draft one?)")
        documents = _consolidated_v3(store, root, doc)
        if documents is not None:
            return documents, True
        return _walk(store, 3, root), False
    zmetadata = probe(".zmetadata")
    if zmetadata is not None:
        if "record_size" in _json(zmetadata, store.shown(".zmetadata")):  # (a kerchunk Parquet set's)
            raise NotAStore(f"{quote(store.base)} is a kerchunk Parquet reference set, not a Zarr store")
        return _consolidated_v2(store, zmetadata), True
    for name in (".zgroup", ".zarray"):
        if probe(name) is not None:
            return _walk(store, 2, None), False
    if denied:
        nor = (f"S3 denied {', '.join(denied)} under it: 403, which S3 also answers for a key that is not "
               "there when s3:ListBucket on the bucket is not granted")
        raise NotAStore(f"{quote(store.base)} cannot be told to be a Zarr store ({nor})", nor)
    raise NotAStore(f"{quote(store.base)} is not a Zarr store ({NO_ROOT})")


# -- chunk keys from each array's grid ---------------------------------------------------------------------

def _array_meta(meta: dict, version: int, where: str) -> ArrayMeta:
    """An array's metadata, its chunk grid checked (refused in one line naming `where`)."""
    try:
        array = ArrayMeta.from_document(meta, version)
        array.check()
    except ArrayMetaError as e:
        raise RefsError(f"{quote(where)}: {e}") from None
    return array


def _array_nodes(documents: dict[str, bytes]):
    """(array path, metadata, Zarr version, where) of every array the documents describe."""
    for key, data in documents.items():
        name = posixpath.basename(key)
        if name not in ("zarr.json", ".zarray"):
            continue
        path = posixpath.dirname(key)
        meta = _json(data, f"metadata {key}")
        if name == "zarr.json" and meta.get("node_type") != "array":
            continue
        yield path, meta, 3 if name == "zarr.json" else 2, key


class ZarrStoreRefSet(LazyGridRefSet):
    """A native store's chunk keys computed from its arrays' grids (refs/lazygrid.py), not stored: every
    chunk of a grid is a key whether or not the store holds it (`may_lack`), a whole remote object at
    the store's url joined with its key. A chunk's url is interned (given a url id, which the block
    cache and the views key by) the first time its target is asked for: memory grows with the chunks
    looked at, not with the grid. v3's nested keys ("c/0/1") have directories computed as well
    (lazygrid.ChunkDirs). `stored`: for a set that serves a store's arrays in another form (Zarr v3 as
    v2 for the decoded view, `v2_form`), each array's stored metadata, by which a chunk's object is
    named (a sharded array's inner chunk: its shard's)."""

    may_lack = True  # (a 404 is a chunk the store lacks: refmount.view.raw)
    MAX_LISTED = 10_000  # chunks a listing of one array's directory shows (a stat or read of any works)

    def __init__(self, store: RemoteStore, meta: RefSet, arrays: list[tuple[str, ArrayMeta]],
                 zarr_format: int = 2, stored: dict[str, ArrayMeta] | None = None) -> None:
        self.store = store
        self.location = store.base
        self.zarr_format = zarr_format
        self._stored = stored or {}
        self._unlisted_warned: set[int] = set()
        super().__init__(meta, arrays)

    def exists(self, i: int) -> bool:
        return self.meta.exists(i) if i < self.meta.capacity else i < self.chunk_end

    def _object_key(self, i: int) -> str:
        """The store's key of the object behind chunk key `i`."""
        array, n = self._locate(i)
        stored = self._stored.get(array.path)
        if stored is None:
            return self.key(i)
        index = np.unravel_index(n, array.grid) if not array.meta.scalar else ()
        if stored.sharding is not None:  # (the inner chunk's shard: shards are whole inner chunks)
            index = tuple(c * inner // shard for c, inner, shard in zip(index, array.meta.chunks, stored.chunks))
        key = stored.chunk_key(tuple(int(c) for c in index))
        return f"{array.path}/{key}" if array.path else key

    def target(self, i: int) -> tuple[int, int, int]:
        if i < self.meta.capacity:
            return self.meta.target(i)
        return self.intern(self.store.url(self._object_key(i))), 0, WHOLE_FILE

    def inline_data(self, i: int) -> bytes | None:
        return self.meta.inline_data(i) if i < self.meta.capacity else None

    async def ensure(self, i: int) -> None:
        """(nothing to load: a chunk's reference follows from its key)"""

    async def files_from(self, dir_id: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """As `RefSet.files_from`: metadata files, then the grid's chunks in C order, at most MAX_LISTED of
        them (a listing of a grid of millions would not end; said once per array). A directory of
        nested chunk keys holds chunks only: those of its last coordinate."""
        if dir_id >= len(self.dirs):
            found = self.chunk_dirs.chunks(dir_id) if self.chunk_dirs is not None else None
            if found is None:
                return _NO_FILES
            array, first, count_here = found
            return self._listed(array, first + start, first + min(start + count, count_here), -first, first)
        meta_count = self.meta.file_count(dir_id)
        array = self._array_of_dir.get(dir_id)
        if start < meta_count or array is None or array.nested is not None:
            return await self.meta.files_from(dir_id, start, count)
        n = start - meta_count
        return self._listed(array, n, min(n + count, array.count), meta_count)

    def _listed(self, array, n: int, stop: int, position: int, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(positions, key indexes) of chunks n to stop of `array` that a listing of a directory whose
        chunks begin at chunk `first` shows (chunk number + `position` is a chunk's position in it)."""
        stop_listed = first + self.MAX_LISTED
        if stop > stop_listed:
            self.listing_capped(array)
        chunks = np.arange(n, max(min(stop, stop_listed), n), dtype=np.int64)
        return position + chunks, array.base + chunks

    def listing_capped(self, array) -> None:
        """(said once per array)"""
        if array.dir_id not in self._unlisted_warned:
            self._unlisted_warned.add(array.dir_id)
            log.warning("%s: listing the first %s of its %s chunks (each of the others opens by its name)",
                        self.store.shown(array.path) if array.path else self.store.base,
                        f"{self.MAX_LISTED:,}", f"{array.count:,}")

    def v2_form(self, metadata: dict[str, bytes], arrays: list[tuple[str, ArrayMeta, ArrayMeta]]) -> ZarrStoreRefSet:
        """This v3 store's arrays as Zarr v2 (`arrays`: path, v2 form with "." keys, v3 metadata), beside
        `metadata` (every .zgroup, .zarray, .zattrs), for the decoded view (refmount.view.zarr3): chunk
        "0.1" is the object "c/0/1" (a sharded array's inner chunk: its shard), with the same url ids."""
        builder = RefSetBuilder()
        keys = list(metadata)
        builder.add_batch(keys, np.full(len(keys), INLINE, np.int32), np.zeros(len(keys), np.int64),
                          np.array([len(metadata[k]) for k in keys], np.int64), dict(enumerate(metadata.values())))
        meta = builder.build()
        arrays = sorted(arrays, key=lambda a: meta.dirs.ids[a[0]])
        form = ZarrStoreRefSet(self.store, meta, [(path, v2) for path, v2, _ in arrays], 2,
                               {path: v3 for path, _, v3 in arrays})
        form.urls, form._url_ids, form._intern_lock = self.urls, self._url_ids, self._intern_lock
        form.url_check = self.url_check
        return form

    def statistics(self) -> dict:
        return {"arrays": len(self.arrays), "chunk_urls_interned": len(self.urls)}


_NO_FILES = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def load_remote_store(location: str, *, remote_options: dict | None = None, max_keys: int | None = None,
                      max_bytes: int | None = None) -> RefSet | ZarrStoreRefSet:
    store = RemoteStore(location, remote_options or {}, max_bytes)
    documents, consolidated = _store_documents(store)
    builder = RefSetBuilder(max_keys, max_bytes)
    keys = list(documents)
    builder.reserve(len(keys), f"the metadata of {quote(store.base)}")
    builder.add_batch(keys, np.full(len(keys), INLINE, np.int32), np.zeros(len(keys), np.int64),
                      np.array([len(documents[k]) for k in keys], np.int64), dict(enumerate(documents.values())))
    arrays = [(path, _array_meta(meta, version, store.shown(where)), version)
              for path, meta, version, where in _array_nodes(documents)]
    refset = builder.build()  # (only metadata: a lazy set's url table holds chunks' urls alone)
    if arrays:  # (chunk keys computed from the grids, and nested ones' directories: refs/lazygrid.py)
        arrays.sort(key=lambda a: refset.dirs.ids[a[0]])
        refset = ZarrStoreRefSet(store, refset, [(path, array) for path, array, _ in arrays], _version_of(documents))
    refset.may_lack = True  # (chunk keys from the grid: a 404 is a chunk the store lacks)
    how = "consolidated metadata" if consolidated else \
        "metadata walked node by node, " + ("S3 listing" if store.listing == "s3" else "HTML index pages")
    refset.format = (f"Zarr v{_version_of(documents)} store over {store.proto} ({how}; chunk keys from each "
                     "array's grid, a chunk the server does not hold reads as the fill value)")
    return refset


def _version_of(documents: dict[str, bytes]) -> int:
    return 3 if any(posixpath.basename(k) == "zarr.json" for k in documents) else 2


# -- zipped stores -----------------------------------------------------------------------------------------

def _open_zip(location: str, remote_options: dict):
    if not is_remote(location):
        try:
            return open(local_path(location), "rb")
        except OSError as e:
            raise RefsError(f"cannot read {quote(location)}: {e.strerror}") from None
    fs = _filesystem(location, remote_options)
    path = location if protocol_of(location) in ("http", "https") else location.split("://", 1)[1]
    try:  # (ranged reads from the end: the central directory, then each local header)
        return fs.open(path, "rb", block_size=1 << 16, cache_type="readahead")
    except Exception as e:  # noqa: BLE001
        failure = _fetch_failure(location, e)
        if isinstance(e, FileNotFoundError) and "cannot reach" not in str(failure):
            raise RefsError(f"{quote(location)} was not found on its server") from None
        raise failure from None


def _zip_root(names: list[str]) -> str:
    """The store's root inside the zip: '' (zarr's ZipStore), or the one top-level directory that holds
    the root metadata (`zip -r x.zarr.zip x.zarr`)."""
    if any(n in METADATA_NAMES for n in names):
        return ""
    tops = {n.partition("/")[0] for n in names}
    if len(tops) == 1:
        top = tops.pop()
        if any(n == f"{top}/{m}" for n in names for m in METADATA_NAMES):
            return top + "/"
    return ""


def load_zipped_store(location: str, *, remote_options: dict | None = None, max_keys: int | None = None,
                      max_bytes: int | None = None) -> RefSet:
    url = os.path.abspath(local_path(location)) if not is_remote(location) else location
    with _open_zip(location, remote_options or {}) as f:
        try:
            archive = zipfile.ZipFile(f)
        except zipfile.BadZipFile as e:
            raise RefsError(f"{quote(location)} is not a zip file ({e})") from None
        except RefmountError:
            raise
        except Exception as e:  # noqa: BLE001 - a read of the remote file failed
            raise _fetch_failure(location, e) from None
        f.seek(0, os.SEEK_END)
        size = f.tell()
        # A name written twice (zarr's ZipStore appends a rewritten zarr.json or .zgroup): the last one
        # in the central directory is the member, as zipfile and zarr read it.
        members = list({m.filename: m for m in archive.infolist() if not m.is_dir()}.values())
        root = _zip_root([m.filename for m in members])
        builder = RefSetBuilder(max_keys, max_bytes)
        builder.reserve(len(members), f"the members of {quote(location)}")
        uid = builder.url_id(url)
        budget = MetadataBudget(max_bytes, location)
        keys, url_ids, offsets, lengths, inline = [], [], [], [], {}
        seen = set()
        for member in sorted(members, key=lambda m: m.header_offset):
            if not member.filename.startswith(root):
                continue
            key = member.filename[len(root):]
            seen.add(key)
            if not _checked(key, location) or any(s.startswith(".") and s not in METADATA_NAMES for s in key.split("/")):
                continue
            if member.flag_bits & 0x1:
                raise RefsError(f"{quote(location)}: member {quote(member.filename)} is encrypted")
            if posixpath.basename(key) in METADATA_NAMES:
                if member.file_size > MAX_METADATA_BYTES:
                    raise RefsError(f"{quote(location)}: member {quote(member.filename)} is larger than "
                                    f"{MAX_METADATA_BYTES >> 20} MiB")
                budget.take(member.file_size)  # (zipfile inflates no more than it)
                try:
                    data = archive.read(member)  # (checks its CRC; DEFLATED metadata is decompressed)
                except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError) as e:
                    raise RefsError(f"{quote(location)}: member {quote(member.filename)} cannot be read ({e})") from None
                inline[len(keys)] = data
                keys.append(key), url_ids.append(INLINE), offsets.append(0), lengths.append(len(data))
                continue
            if member.compress_type != zipfile.ZIP_STORED:
                kind = {zipfile.ZIP_DEFLATED: "DEFLATED"}.get(member.compress_type, f"compressed (method {member.compress_type})")
                raise RefsError(f"{quote(location)}: member {quote(member.filename)} is {kind}: only STORED chunks "
                                "are served as byte ranges (zarr's ZipStore writes them so; rezip with zip -0)")
            f.seek(member.header_offset)
            header = f.read(30)
            if len(header) != 30 or header[:4] != b"PK\x03\x04":
                raise RefsError(f"{quote(location)}: member {quote(member.filename)} has no local header at "
                                f"byte {member.header_offset}")
            name_length, extra_length = struct.unpack("<HH", header[26:30])
            start = member.header_offset + 30 + name_length + extra_length
            if start + member.compress_size > size or member.compress_size != member.file_size:
                raise RefsError(f"{quote(location)}: member {quote(member.filename)} runs past the end of the file")
            keys.append(key), url_ids.append(uid), offsets.append(start), lengths.append(member.compress_size)
            if len(keys) >= BATCH:
                builder.add_batch(keys, url_ids, offsets, lengths, dict(inline))
                keys, url_ids, offsets, lengths, inline = [], [], [], [], {}
        builder.add_batch(keys, url_ids, offsets, lengths, dict(inline))
    if not seen or not any(posixpath.basename(k) in METADATA_NAMES for k in seen):
        raise RefsError(f"{quote(location)} holds no Zarr store (no zarr.json, .zmetadata, .zgroup or .zarray)")
    refset = builder.build()
    version = 3 if any(posixpath.basename(k) == "zarr.json" for k in seen) else 2
    refset.format = f"zipped Zarr v{version} store ({len(seen):,} members; STORED chunks served as byte ranges of the zip)"
    return refset
