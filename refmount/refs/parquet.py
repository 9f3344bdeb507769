"""Parquet reference sets (fsspec's LazyReferenceMapper layout), loaded lazily.

Layout (NOTES §1): ``<root>/.zmetadata`` = {"metadata": {key: JSON}, "record_size": N}; for every
array ``<root>/<array>/refs.<R>.parq`` holds the references of chunks R*N .. R*N+N-1 in C order over
the chunk grid ``ceil(shape/chunks)`` (scalars: grid [1], key "0"). Row meaning: raw set -> inline
bytes; path set and size 0 -> whole file; path set -> range; neither -> the key does not exist.

Mounting reads only .zmetadata. A record file is read with pyarrow (in a worker thread) the first
time a key inside it is needed, and a bounded LRU keeps the loaded ones. Key indexes: metadata keys
first (an ordinary `RefSet`), then each array's chunk n at ``base[array] + n``, so inode numbers
are stable without loading anything.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import numpy as np
import orjson
import trio

from refmount.errors import RefmountError, RefsError, quote
from refmount.cache.lru import SingleFlightLRU
from refmount.refs.arraymeta import ArrayMeta
from refmount.refs.jsonrefs import add_mapping
from refmount.refs.lazygrid import GridArray, LazyGridRefSet
from refmount.refs.limits import RefsTooBig
from refmount.refs.model import INLINE, MAX_LENGTH, WHOLE_FILE, RefSet, RefSetBuilder
from refmount.refs.origins import Origins, files
from refmount.refs.relative import RelativeTargets, base_of
from refmount.fetch.protocols import is_remote, local_path
from refmount.refs.source import fsspec_options, unavailable

MISSING = -2  # url id of a row that holds no reference
DEFAULT_LOADED_RECORDS = 128  # as fsspec's LazyReferenceMapper
_NO_FILES = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


@dataclass
class _Record:
    url_id: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    raw: dict[int, bytes]


def _read_bytes(location: str, remote_options: dict, max_bytes: int | None = None) -> bytes:
    """The file's bytes; RefsTooBig past `max_bytes` (read one more byte to know)."""
    size = -1 if max_bytes is None else max_bytes + 1
    if not is_remote(location):
        with open(local_path(location), "rb") as f:
            data = f.read(size)
    else:
        import fsspec

        with fsspec.open(location, "rb", **fsspec_options(location, remote_options)) as f:
            data = f.read(size)
    if max_bytes is not None and len(data) > max_bytes:
        raise RefsTooBig(max_bytes)
    return data


def _dumps(key: str, value) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as e:  # nested deeper than orjson writes (255 levels)
        raise RefsError(f"key {quote(key)} in .zmetadata cannot be stored: {e}") from None


def _join(root: str, *parts: str) -> str:
    return posixpath.join(root.rstrip("/"), *parts)


def load_parquet(location: str, *, remote_options: dict, max_keys: int | None = None,
                 loaded_records: int = DEFAULT_LOADED_RECORDS, max_bytes: int | None = None) -> ParquetRefSet:
    try:
        raw = _read_bytes(_join(location, ".zmetadata"), remote_options, max_bytes)
    except Exception as e:  # (every backend's errors)
        passing = unavailable(quote(_join(location, ".zmetadata")), e)  # (fsspec's http says 503 as FileNotFoundError)
        if passing is not None:
            raise passing from None
        if isinstance(e, FileNotFoundError):
            raise RefmountError(f"{quote(location)} is a directory without .zmetadata (not a Parquet reference "
                                "set)") from None
        if isinstance(e, OSError):
            raise RefmountError(f"cannot read {quote(_join(location, '.zmetadata'))}: {e}") from None
        raise
    try:
        zmeta = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RefsError(f"{quote(_join(location, '.zmetadata'))} is not valid JSON: {e}") from None
    if not isinstance(zmeta, dict) or not isinstance(zmeta.get("metadata"), dict):
        raise RefsError(f"{quote(_join(location, '.zmetadata'))} lacks a 'metadata' object")
    record_size = zmeta.get("record_size")
    if type(record_size) is not int or record_size <= 0:
        raise RefsError(f"{quote(_join(location, '.zmetadata'))}: 'record_size' must be a positive integer")
    metadata = {k: (v if isinstance(v, str) else _dumps(k, v)) for k, v in zmeta["metadata"].items()}
    builder = RefSetBuilder(max_keys)
    add_mapping(builder, metadata)
    meta = builder.build()
    refset = ParquetRefSet(location, meta, record_size, remote_options, max_keys, loaded_records)
    refset.check_schema()
    if not is_remote(location):  # (--allow-other: what its keys were read from, refs/origins.py)
        metadata = _join(location, ".zmetadata")
        refset.origins = Origins(files(metadata), {a.path: files(metadata, _join(location, a.path))
                                                   for a in refset.arrays if a.path})
    return refset


class ParquetRefSet(LazyGridRefSet):
    """A lazily loaded reference set with the same access interface as `RefSet`."""

    def __init__(self, location, meta: RefSet, record_size: int, remote_options: dict, max_keys, loaded_records):
        import pyarrow as pa

        # The daemon lives long and reads record after record: Arrow's default jemalloc pool keeps
        # the pages of every table it ever decoded, the system allocator gives them back.
        pa.set_memory_pool(pa.system_memory_pool())
        self.location = location
        self.record_size = record_size
        self.remote_options = remote_options
        self._relative = RelativeTargets(location)
        self._records = SingleFlightLRU(loaded_records)  # (array dir id, record number) -> _Record
        arrays = []
        for path in meta.dirs.paths:
            prefix = f"{path}/" if path else ""
            i = meta.find(prefix + ".zarray")
            if i < 0:
                continue
            try:
                zarray = ArrayMeta.from_zarray(orjson.loads(meta.inline_data(i)))
                zarray.grid()
            except ValueError as e:  # (orjson's JSONDecodeError and ArrayMetaError are ValueErrors)
                raise RefsError(f"{quote(prefix + '.zarray')} is not valid array metadata: {e}") from None
            if zarray.separator == "/":
                raise RefsError(f"array {quote(path)}: dimension_separator '/' is not supported in Parquet references")
            arrays.append((path, zarray))
        super().__init__(meta, arrays, max_keys)

    # -- which chunks exist, and their references ---------------------------------------------------

    def _record(self, array: GridArray, n: int) -> _Record | None:
        return self._records.peek((array.dir_id, n // self.record_size))

    def exists(self, i: int) -> bool:
        loc = self._locate(i)
        if loc is None:
            return self.meta.exists(i)
        rec = self._record(*loc)
        row = loc[1] % self.record_size
        return rec is not None and row < len(rec.url_id) and rec.url_id[row] != MISSING

    def target(self, i: int) -> tuple[int, int, int]:
        loc = self._locate(i)
        if loc is None:
            return self.meta.target(i)
        rec = self._record(*loc)
        row = loc[1] % self.record_size
        return int(rec.url_id[row]), int(rec.offset[row]), int(rec.length[row])

    def inline_data(self, i: int) -> bytes | None:
        loc = self._locate(i)
        if loc is None:
            return self.meta.inline_data(i)
        rec = self._record(*loc)
        return rec.raw.get(loc[1] % self.record_size) if rec is not None else None

    async def ensure(self, i: int) -> None:
        loc = self._locate(i)
        if loc is not None:
            await self._load(loc[0], loc[1] // self.record_size)

    async def files_from(self, dir_id: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """As `RefSet.files_from`: metadata files, then existing chunks in chunk order, loading record
        files as needed. A batch never mixes metadata and chunks."""
        meta_count = self.meta.file_count(dir_id)
        array = self._array_of_dir.get(dir_id)
        if start < meta_count or array is None:
            return await self.meta.files_from(dir_id, start, count)
        n = start - meta_count
        while n < array.count:
            record = n // self.record_size
            rec = await self._load(array, record)
            first = record * self.record_size
            stop = min(first + self.record_size, array.count, n + count)
            chunks = n + np.flatnonzero(rec.url_id[n - first : stop - first] != MISSING)
            if len(chunks):
                return meta_count + chunks, array.base + chunks
            n = stop  # rows that hold no reference: look further
        return _NO_FILES

    # -- record files -------------------------------------------------------------------------------

    async def _load(self, array: GridArray, record: int) -> _Record:
        async def read() -> _Record:
            return await trio.to_thread.run_sync(self._read_record, self._record_path(array, record))

        return await self._records.get((array.dir_id, record), read)

    def _read_record(self, path: str) -> _Record:
        """Runs in a worker thread: read one record file with pyarrow into compact arrays."""
        import pyarrow.parquet as pq

        try:
            source = _open_for_arrow(path, self.remote_options)
            parquet = pq.ParquetFile(source)
            problem = _record_problem(parquet.metadata, self.record_size)
            if problem is None:
                # One small file per call, already on a worker thread: Arrow's own pool would only add
                # threads. Text columns stay dictionary-encoded until their decoded size is known.
                text = [f.name for f in parquet.schema_arrow if f.name in ("path", "raw") and _is_text(f.type)]
                table = pq.read_table(source, use_threads=False, read_dictionary=text)
                problem = _decoded_problem(table)
        except FileNotFoundError:  # kerchunk's refs_to_dataframe skips records with no references
            empty = np.zeros(0, dtype=np.int64)
            return _Record(np.zeros(0, dtype=np.int32), empty, empty, {})
        except Exception as e:  # pyarrow raises many kinds for corrupt files
            raise RefsError(f"Parquet record file {quote(path)} cannot be read: {type(e).__name__}: {e}") from None
        if problem is not None:
            raise RefsError(f"Parquet record file {quote(path)} {problem}")
        return record_from_table(table, path, lambda urls: self._intern(urls, base_of(path)))

    def _intern(self, urls: list, base: str) -> np.ndarray:
        """Url ids of a record file's distinct paths (None: no path), relative ones resolved
        against the record file's directory (as GDAL resolves them)."""
        urls = self._relative.resolve_all(urls, base)
        ids = np.full(len(urls), MISSING, dtype=np.int32)
        for n, url in enumerate(urls):
            if url is not None:
                ids[n] = self.intern(url)
        return ids

    def check_schema(self) -> None:
        """Read the schema (not the rows) of the first record file, so that a set written with the
        wrong columns fails the mount instead of every read."""
        import pyarrow.parquet as pq

        for array in self.arrays:
            path = self._record_path(array, 0)
            try:
                names = set(pq.read_schema(_open_for_arrow(path, self.remote_options)).names)
            except FileNotFoundError:
                continue
            except Exception as e:  # noqa: BLE001 - pyarrow's many error types
                raise RefsError(f"Parquet record file {quote(path)} cannot be read: {type(e).__name__}: {e}") from None
            _check_columns(names, path)
            return

    def _record_path(self, array: GridArray, record: int) -> str:
        parts = (array.path, f"refs.{record}.parq") if array.path else (f"refs.{record}.parq",)
        return _join(self.location, *parts)

    def statistics(self) -> dict:
        return {"records_loaded": self._records.computed, "records_cached": len(self._records),
                "arrays": len(self.arrays), "record_size": self.record_size}


# What one record file may decode to, its paths and inline values counted as decoded: a record of
# 100,000 chunks with 100-byte paths and kerchunk's inline values is about 10 MB. A 1 kB file whose one
# dictionary value of 1 MiB its 4,000 rows repeat would otherwise be 4 GB in the daemon at a read.
MAX_RECORD_BYTES = 64 << 20


def _is_text(kind) -> bool:
    import pyarrow as pa

    return any(is_type(kind) for is_type in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                               pa.types.is_large_binary, pa.types.is_dictionary))


def _record_problem(metadata, record_size: int) -> str | None:
    """Why a record file's footer is refused before any row is read (None: it is not)."""
    if metadata.num_rows > record_size:
        return f"holds {metadata.num_rows:,} rows, more than the set's record_size {record_size:,}"
    stored = sum(metadata.row_group(g).column(c).total_uncompressed_size
                 for g in range(metadata.num_row_groups) for c in range(metadata.num_columns))
    if stored > MAX_RECORD_BYTES:
        return f"decompresses to {stored:,} bytes, more than the {MAX_RECORD_BYTES >> 20} MiB a record may hold"
    return None


def _decoded_problem(table) -> str | None:
    """Why a record's text columns are refused before they are decoded (None: they are not): their
    values' total length, each row counted, dictionary or not."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total = 0
    for name in ("path", "raw"):
        if name not in table.column_names or not _is_text(table.column(name).type):
            continue
        for chunk in table.column(name).chunks:
            if pa.types.is_dictionary(chunk.type):
                lengths = pc.binary_length(chunk.dictionary.cast(pa.large_binary()))
                total += pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0
            else:
                total += pc.sum(pc.binary_length(chunk.cast(pa.large_binary()))).as_py() or 0
    if total > MAX_RECORD_BYTES:
        return f"holds paths and inline values of {total:,} bytes, more than the {MAX_RECORD_BYTES >> 20} MiB a record may hold"
    return None


def _open_for_arrow(path: str, remote_options: dict):
    if not is_remote(path):
        return local_path(path)
    import fsspec

    return fsspec.open(path, "rb", **fsspec_options(path, remote_options)).open()


def _check_columns(names: set[str], path: str) -> None:
    if not {"offset", "size"} <= names or not names & {"path", "raw"}:
        raise RefsError(f"Parquet record file {quote(path)} has columns {sorted(names)}; "
                        "expected path, offset, size, raw")


def record_from_table(table, path: str, intern) -> _Record:
    """Normalise a record table written by fastparquet or pyarrow: dictionary-encoded or null-typed
    path/raw columns, nullable offset/size, padding rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = set(table.column_names)
    _check_columns(names, path)
    n = table.num_rows

    def column(name):
        if name not in names:
            return pa.nulls(n)
        col = table.column(name).combine_chunks()
        return col.dictionary_decode() if pa.types.is_dictionary(col.type) else col

    paths = table.column("path").combine_chunks() if "path" in names else pa.nulls(n)
    raws = column("raw")
    path_type = paths.type.value_type if pa.types.is_dictionary(paths.type) else paths.type
    for name, kind in (("path", path_type), ("raw", raws.type)):
        if not (pa.types.is_null(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            raise RefsError(f"Parquet record file {quote(path)}: column {name!r} has type {kind}")

    def integers(name):
        col = column(name)
        if not (pa.types.is_integer(col.type) or pa.types.is_null(col.type) or pa.types.is_floating(col.type)):
            raise RefsError(f"Parquet record file {quote(path)}: column {name!r} has type {col.type}")
        bad = RefsError(f"Parquet record file {quote(path)}: column {name!r} holds values that are not byte offsets "
                        "(integers from 0 to 2**53)")
        if pa.types.is_integer(col.type):  # range first: a float64 cast refuses integers past 2**53
            low, high = (v.as_py() for v in pc.min_max(col).values())
            if low is not None and (low < 0 or high >= MAX_LENGTH):
                raise bad
            return np.array(pc.fill_null(col, 0).cast(pa.int64()), dtype=np.int64)  # a writable copy
        values = pc.fill_null(col.cast(pa.float64()), 0).to_numpy(zero_copy_only=False)
        if len(values) and (values.min() < 0 or values.max() >= MAX_LENGTH or np.any(values != np.floor(values))):
            raise bad
        return values.astype(np.int64)

    offsets = integers("offset")
    sizes = integers("size")
    url_ids = _url_ids(paths, n, intern)
    raw = {}
    if not pa.types.is_null(raws.type) and raws.null_count < n:
        rows = np.flatnonzero(raws.is_valid().to_numpy(zero_copy_only=False))
        for row, value in zip(rows.tolist(), raws.take(pa.array(rows)).to_pylist()):
            raw[row] = value if isinstance(value, bytes) else value.encode()
    length = sizes.copy()
    for row, data in raw.items():
        url_ids[row] = INLINE
        offsets[row] = 0
        length[row] = len(data)
    remote = url_ids >= 0
    whole = remote & (sizes == 0)
    length[whole] = WHOLE_FILE
    offsets[whole] = 0
    return _Record(url_ids, _narrow(offsets), _narrow(length), raw)


def _narrow(values: np.ndarray) -> np.ndarray:
    """int32 when every value fits (the usual case: a loaded record then takes 40% less memory)."""
    if len(values) == 0 or (values.min() >= -(2**31) and values.max() < 2**31):
        return values.astype(np.int32)
    return values


def _url_ids(paths, n: int, intern) -> np.ndarray:
    """The url id of each row, interning each distinct path once: the column is usually dictionary-
    encoded, and turning every row's path into a Python string costs memory and time per record."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_null(paths.type) or paths.null_count == n:
        return np.full(n, MISSING, dtype=np.int32)
    if not pa.types.is_dictionary(paths.type):
        paths = pc.dictionary_encode(paths)
    distinct = [p or None for p in paths.dictionary.cast(pa.string()).to_pylist()]  # NaN/empty: no path
    ids = np.append(intern(distinct), np.int32(MISSING))  # the last entry answers null rows
    rows = pc.fill_null(paths.indices.cast(pa.int64()), len(distinct)).to_numpy(zero_copy_only=False)
    return ids[rows]
