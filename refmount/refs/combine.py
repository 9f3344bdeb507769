"""Combine the references of several scanned files into one dataset along a dimension (--concat DIM).

The semantics are kerchunk's MultiZarrToZarr with `concat_dims=[DIM]` and a "cf:" coordinate map,
checked rather than assumed:

- the files are ordered by the values of DIM's coordinate (decoded as CF times when its units are
  "<unit> since <date>"), not by the order they were given in; a file whose values do not increase, or
  overlap another file's, is refused;
- variables over DIM are concatenated by renumbering their chunk keys along DIM's axis: every file must
  start on a chunk boundary of the combined array (Zarr v2 has no uneven chunks; MultiZarrToZarr
  silently assumes this). A small variable that does not is read, decoded and written inline instead;
  a big one is refused;
- DIM's coordinate (and its CF `bounds`) is always read, decoded and written inline as one
  uncompressed chunk of its own dtype. When the files' units or calendars differ (daily files in
  "hours since <their day>"), its values are re-encoded in the units and calendar of the earliest file,
  as NCO's ncrcat does for files given in order (xarray decodes either way to the same times);
- every other variable is taken once, from the first file, when its metadata and values are the same
  in every file (encoded bytes compared first, then decoded values), and refused in one line naming the
  first file and variable that differ otherwise. `identical` names variables taken from the first file
  unchecked (MultiZarrToZarr's identical_dims); `skip_mismatched` drops the variables that differ, each
  with a log line;
- metadata and attributes (global, per group, per variable) are the earliest file's (the first along
  the dimension), as xarray.open_mfdataset and ncrcat keep them (MultiZarrToZarr keeps the first given
  file's); global attributes that differ between files are named in one log line.

The module is pure: it never fetches by itself. The caller passes `read(url, offset, length) -> bytes`
(length None: to the end of the object), which must be safe to call from several threads at once
(`workers` of them). Errors are one-line RefsErrors naming the file and the variable.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.arraymeta import ArrayMeta, ArrayMetaError

log = logging.getLogger("refmount")

COMPARE_LIMIT = 64 << 20  # encoded bytes of one variable per file that its identity check may read
PREFETCH_LIMIT = 64 << 20  # bytes of all files read at once, before the combination needs them
INLINE_LIMIT = 4 << 20  # decoded bytes a variable written inline (re-encoded, or unevenly chunked) may have
_CF_TIME = re.compile(r"^\s*(\w+)\s+since\s+(.+)$")
# CF time units of a fixed length, in seconds (months and years are converted through dates)
_SECONDS = {unit: seconds for names, seconds in (
    (("days", "day", "d"), 86400), (("hours", "hour", "hr", "hrs", "h"), 3600),
    (("minutes", "minute", "min", "mins"), 60), (("seconds", "second", "sec", "secs", "s"), 1),
    (("milliseconds", "millisecond", "msec", "ms"), 1e-3), (("microseconds", "microsecond", "usec", "us"), 1e-6),
) for unit in names}
# Calendars that name the same dates (as xarray and cftime treat them; "standard" differs from
# "proleptic_gregorian" only before 1582-10-15, which cftime checks when it converts).
_CALENDAR_ALIASES = {"gregorian": "standard", "noleap": "365_day", "all_leap": "366_day"}


@dataclass
class _Array:
    path: str  # e.g. "tas" or "group/tas"
    meta: ArrayMeta  # its .zarray
    attrs: dict  # .zattrs
    chunks: dict[tuple[int, ...], object] = field(default_factory=dict)  # chunk index -> reference value

    @property
    def dims(self) -> list[str]:
        return list(self.attrs.get("_ARRAY_DIMENSIONS", []))

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


@dataclass
class _File:
    name: str
    arrays: dict[str, _Array]
    groups: dict[str, dict]  # group path ("" for the root) -> its metadata keys (".zgroup", ".zattrs") as given


def combine_datasets(datasets, concat_dim: str, *, identical=(), skip_mismatched: bool = False, read,
                     decode=None, workers: int = 32, growing: bool = False) -> dict:
    """One Version-0 reference dict combining `datasets` (a list of (name, refs), refs each a scanned
    file's references, Version 0 or kerchunk's {"version": 1, "refs": ...}) along `concat_dim`.
    `decode(codec, data, limit)`: a decoder that refuses output past `limit` bytes without producing it
    (refmount.view.bounded.decode_bounded, which refs/ may not import itself); None decodes unbounded.
    `workers`: reads at once (`read` is called from that many threads). `growing`: files will be added
    (--refresh): the coordinate and its bounds are chunked so that adding files changes no chunk a
    reader of the smaller set may read (see _Combiner._write_inline)."""
    if not datasets:
        raise RefsError(f"--concat {concat_dim}: no files to combine")
    files = [_parse(name, refs) for name, refs in datasets]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return _Combiner(files, concat_dim, set(identical), skip_mismatched, read, pool, decode, growing).combine()


# -- reading the scanned files' references ----------------------------------------------------------------


def _parse(name: str, refs: dict) -> _File:
    if not isinstance(refs, dict):
        raise RefsError(f"file {quote(name)}: references must be a JSON object")
    if "version" in refs:
        if refs.get("templates") or refs.get("gen"):
            raise RefsError(f"file {quote(name)}: references with templates or gen cannot be combined")
        refs = refs.get("refs", {})
    metas: dict[str, dict] = {}
    chunk_values: dict[str, object] = {}
    for key, value in refs.items():
        base = key.rpartition("/")[2]
        if base in (".zarray", ".zattrs", ".zgroup"):
            try:
                metas[key] = _json(value)
            except (ValueError, TypeError):
                raise RefsError(f"file {quote(name)}: key {quote(key)} is not JSON") from None
        elif base != ".zmetadata":  # (consolidated metadata would be stale once combined)
            chunk_values[key] = value
    arrays, groups = {}, {}
    for key, meta in metas.items():
        parent, _, base = key.rpartition("/")
        if base == ".zarray":
            try:
                array_meta = ArrayMeta.from_zarray(meta)
            except ArrayMetaError as e:
                raise RefsError(f"file {quote(name)}: key {quote(key)}: {e}") from None
            arrays[parent] = _Array(parent, array_meta, metas.get(f"{parent}/.zattrs" if parent else ".zattrs", {}))
        elif base == ".zgroup" or (base == ".zattrs" and f"{parent}/.zarray" not in metas
                                   and (f"{parent}/.zgroup" if parent else ".zgroup") in metas):
            groups.setdefault(parent, {})[base] = meta
    for key, value in chunk_values.items():
        parent, _, index = key.rpartition("/")
        array = arrays.get(parent)
        if array is None or array.meta.separator == "/":
            parent, index = _split_slash_key(key, arrays)
            array = arrays.get(parent)
            if array is None:
                continue  # (a key outside every array: nothing reads it)
        position = array.meta.parse_chunk_key(index) if not array.meta.scalar else ()
        if position is None:
            raise RefsError(f"file {quote(name)}: chunk key {quote(key)} is not a chunk index")
        array.chunks[position] = value
    return _File(name, arrays, groups)


def _split_slash_key(key: str, arrays: dict[str, _Array]) -> tuple[str, str]:
    """The array and chunk index of a key of an array with dimension_separator "/" ("v/1/2")."""
    parts = key.split("/")
    for cut in range(len(parts) - 1, 0, -1):
        path = "/".join(parts[:cut])
        if path in arrays and arrays[path].meta.separator == "/":
            return path, "/".join(parts[cut:])
    return "\0", key  # (no such array)


def _json(value) -> dict:
    if isinstance(value, dict):
        return value
    if isinstance(value, bytes):
        value = value.decode()
    return json.loads(value)


def _inline_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if value.startswith("base64:"):
        return base64.b64decode(value[7:])
    return value.encode()


class _Combiner:
    def __init__(self, files: list[_File], dim: str, identical: set[str], skip_mismatched: bool, read, pool,
                 decode=None, growing: bool = False):
        self.files = files
        self.growing = growing
        self._step = 0  # growing: each file's length along the dimension, when they all have the same
        self.decode = decode
        self.dim = dim
        self.identical = identical
        self.skip_mismatched = skip_mismatched
        self.read = read
        self.pool = pool
        self.out: dict = {}
        self.dropped: set[str] = set()  # variables --skip-mismatched dropped
        self._reads: dict[tuple, object] = {}  # (url, offset, length) -> Future of its bytes (see _prefetch)

    # -- the whole combination ---------------------------------------------------------------------------

    def combine(self) -> dict:
        first = self.files[0]
        for name in sorted(self.identical):
            if name not in first.arrays:
                raise RefsError(f"--identical {name}: file {quote(first.name)} has no such variable")
            if self.dim in first.arrays[name].dims:
                raise RefsError(f"--identical {name}: the variable is over the --concat dimension {self.dim!r}")
        lengths = [self._length(f) for f in self.files]
        self._prefetch()
        coord = self._coordinate(lengths)
        order, values, units = coord
        # From here on the files are in the dimension's order, and "the first" is the earliest: its
        # attributes are the ones xarray.open_mfdataset and ncrcat (of files given in order) keep.
        self.files = files = [self.files[k] for k in order]
        first = files[0]
        lengths = [lengths[k] for k in order]
        self._step = lengths[0] if lengths[0] > 0 and len(set(lengths)) == 1 else 0
        starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()

        self._metadata(first)
        bounds = self._bounds_name(first)
        paths = sorted(set().union(*(f.arrays for f in self.files)))
        for path in paths:
            missing = next((f for f in self.files if path not in f.arrays), None)
            if missing is not None:
                self._mismatch(missing, path, "is missing")
                continue
            if path == self.dim:
                self._write_coordinate(files, values, units)
            elif self.dim in first.arrays[path].dims:
                if path == bounds and units is not None:
                    self._write_time_bounds(files, path, units)
                else:
                    self._concatenate(files, path, lengths, starts)
            elif path in self.identical:
                self._copy(first.arrays[path])
            else:
                self._take_if_identical(path)
        return self.out

    def _mismatch(self, file: _File, path: str, why: str) -> None:
        line = f"file {quote(file.name)}: variable {path!r} {why}"
        if not self.skip_mismatched:
            hint = "" if self.dim in self.files[0].arrays.get(path, _Array(path, {}, {})).dims \
                else f" (--identical {path} takes the first file's)"
            raise RefsError(f"{line}: cannot combine along {self.dim!r}{hint}; --skip-mismatched drops such variables")
        log.warning("%s: dropped (--skip-mismatched)", line)
        self.dropped.add(path)

    # -- the concatenated dimension ----------------------------------------------------------------------

    def _length(self, file: _File) -> int:
        """The file's length along the dimension (from its coordinate, else from its variables)."""
        lengths = {}
        for array in file.arrays.values():
            if self.dim in array.dims:
                lengths.setdefault(int(array.meta.shape[array.dims.index(self.dim)]), array.path)
        if not lengths:
            raise RefsError(f"file {quote(file.name)} has no dimension {self.dim!r} to concatenate along")
        if len(lengths) > 1:
            (a, pa), (b, pb) = list(lengths.items())[:2]
            raise RefsError(f"file {quote(file.name)}: variables {pa!r} and {pb!r} give dimension {self.dim!r} "
                            f"lengths {a} and {b}")
        return next(iter(lengths))

    def _coordinate_path(self) -> str:
        """The variable that orders the files: DIM's coordinate at the root, or, when no file has one
        there, the first group's (`t/instant/isobaricInhPa/time`: kerchunk's grib_tree gives every leaf
        group coordinates of its own, which are then concatenated in that order as its other variables)."""
        if any(self.dim in f.arrays for f in self.files):
            return self.dim
        first = self.files[0]
        grouped = sorted(p for p, a in first.arrays.items() if p.endswith("/" + self.dim) and a.dims == [self.dim])
        return grouped[0] if grouped else self.dim

    def _coordinate(self, lengths: list[int]):
        """The files' order along the dimension, the combined coordinate values (or None without a
        coordinate variable), and (units, calendar) when they are CF times (else None)."""
        files = self.files
        coord = self._coordinate_path()
        if coord not in files[0].arrays:
            if any(coord in f.arrays for f in files):
                other = next(f for f in files if coord in f.arrays)
                raise RefsError(f"file {quote(files[0].name)} has no variable {self.dim!r} but file "
                                f"{quote(other.name)} has")
            return list(range(len(files))), None, None
        for f in files:
            if coord not in f.arrays:
                raise RefsError(f"file {quote(f.name)} has no variable {coord!r} (the --concat coordinate)")
            if f.arrays[coord].dims != [self.dim]:
                raise RefsError(f"file {quote(f.name)}: variable {coord!r} is not a coordinate over {self.dim!r} "
                                f"alone (dimensions {f.arrays[coord].dims})")
        raw = list(self.pool.map(lambda f: self._values(f, f.arrays[coord]), files))
        cf = [self._cf_units(f, f.arrays[coord]) for f in files]
        if any(c is not None for c in cf):
            if any(c is None for c in cf):
                bad = files[[c is None for c in cf].index(True)]
                raise RefsError(f"file {quote(bad.name)}: variable {self.dim!r} has no CF time units while "
                                f"file {quote(files[cf.index(next(c for c in cf if c))].name)}'s has")
            calendars = {c[1] for c in cf}
            if len(calendars) > 1 and not calendars <= {"standard", "proleptic_gregorian"}:
                bad = next(f for f, c in zip(files, cf) if c[1] != cf[0][1])
                raise RefsError(f"file {quote(bad.name)}: variable {self.dim!r} is in another calendar than in file "
                                f"{quote(files[0].name)} ({cf[0][1]!r}): their dates cannot be combined")
            # Order by times expressed in one unit (the first file's), then write the earliest's.
            keys = [self._convert(f, v, c, cf[0]).astype(np.float64) for f, v, c in zip(files, raw, cf)]
        else:
            units = [f.arrays[coord].attrs.get("units") for f in files]
            for f, u in zip(files, units):
                if u != units[0]:
                    raise RefsError(f"file {quote(f.name)}: variable {self.dim!r} has units {u!r}, file "
                                    f"{quote(files[0].name)} {units[0]!r}")
            keys = [v.astype(np.float64) if v.dtype.kind in "iuf" else v for v in raw]
        for f, k in zip(files, keys):
            if len(k) > 1 and not np.all(k[1:] > k[:-1]):
                raise RefsError(f"file {quote(f.name)}: the values of {self.dim!r} do not increase")
        order = sorted(range(len(files)), key=lambda i: (keys[i][0] if len(keys[i]) else math.inf, i))
        order = [i for i in order if lengths[i] > 0] + [i for i in order if lengths[i] == 0]
        for a, b in zip(order, order[1:]):
            if len(keys[a]) and len(keys[b]) and not keys[a][-1] < keys[b][0]:
                raise RefsError(f"files {quote(files[a].name)} and {quote(files[b].name)} overlap along {self.dim!r} "
                                f"(or repeat a value of it)")
        if not any(cf):
            return order, np.concatenate([raw[i] for i in order]), None
        earliest = order[0]
        target = cf[earliest]
        values = np.concatenate([self._convert(files[i], raw[i], cf[i], target) for i in order])
        if len({c for c in cf}) > 1:
            log.info("--concat %s: %d files in %d different units or calendars, re-encoded as %r, calendar %r "
                     "(file %s's)", self.dim, len(files), len(set(cf)), target[0], target[1], files[earliest].name)
        return order, values, target

    @staticmethod
    def _cf_units(file: _File, array: _Array):
        units = array.attrs.get("units")
        if not isinstance(units, str) or not _CF_TIME.match(units):
            return None
        calendar = str(array.attrs.get("calendar", "standard")).lower()
        return units, _CALENDAR_ALIASES.get(calendar, calendar)

    def _convert(self, file: _File, values: np.ndarray, source, target) -> np.ndarray:
        """Times in `source` (units, calendar) expressed in `target`'s. Linear where the units have a fixed
        length (value * ratio + the source's reference date in target units), which keeps integers
        integers and floats as exact as the file's own; through cftime's dates otherwise (months, years)."""
        if source == target:
            return values
        unit_from, unit_to = (_CF_TIME.match(u).group(1).lower() for u in (source[0], target[0]))
        if unit_from in _SECONDS and unit_to in _SECONDS:
            zero = self._encode(self._dates(file, np.array([0]), source), target, file)[0]
            ratio = _SECONDS[unit_from] / _SECONDS[unit_to]
            if values.dtype.kind in "iu" and ratio == int(ratio) and zero == int(zero):
                return values.astype(np.int64) * int(ratio) + int(zero)
            return values.astype(np.float64) * ratio + zero
        return self._encode(self._dates(file, values, source), target, file)

    def _dates(self, file: _File, values: np.ndarray, cf):
        cftime = _cftime()
        try:
            return cftime.num2date(values, units=cf[0], calendar=cf[1], only_use_cftime_datetimes=True)
        except (ValueError, TypeError, OverflowError) as e:
            raise RefsError(f"file {quote(file.name)}: the times of {self.dim!r} cannot be decoded "
                            f"(units {cf[0]!r}, calendar {cf[1]!r}): {e}") from None

    def _encode(self, dates, cf, file: _File) -> np.ndarray:
        cftime = _cftime()
        try:
            if len(dates) and dates.ravel()[0].calendar != cftime.num2date(0, cf[0], cf[1]).calendar:
                # standard and proleptic_gregorian name the same days since 1582-10-15: convert by fields.
                dates = np.vectorize(lambda d: cftime.datetime(*d.timetuple()[:6], d.microsecond, calendar=cf[1]),
                                     otypes=[object])(dates)
            return np.asarray(cftime.date2num(dates, units=cf[0], calendar=cf[1]), dtype=np.float64)
        except (ValueError, TypeError, OverflowError) as e:
            raise RefsError(f"file {quote(file.name)}: the times of {self.dim!r} cannot be expressed in "
                            f"{cf[0]!r}, calendar {cf[1]!r}: {e}") from None

    def _bounds_name(self, first: _File) -> str | None:
        coord = first.arrays.get(self.dim)
        if coord is None:
            return None
        name = coord.attrs.get("bounds") or coord.attrs.get("climatology")
        return name if isinstance(name, str) and name in first.arrays else None

    def _write_coordinate(self, files: list[_File], values, units) -> None:
        """The coordinate as the earliest file has it (metadata, attributes, units), with every file's values."""
        array = files[0].arrays[self.dim]
        self._write_inline(array, self._as_dtype(values, array, files[0]), along=0)

    def _write_time_bounds(self, files: list[_File], path: str, units) -> None:
        """The coordinate's CF bounds: in its units (CF), re-encoded with it."""
        parts = []
        for f in files:
            array = f.arrays[path]
            cf = self._cf_units(f, array) or self._cf_units(f, f.arrays[self.dim])
            self._check_same(f, array, self.files[0].arrays[path])
            parts.append(self._convert(f, self._values(f, array), cf, units))
        values = np.concatenate(parts, axis=self.files[0].arrays[path].dims.index(self.dim))
        array = self.files[0].arrays[path]
        if "units" in array.attrs:
            array = _Array(array.path, array.meta, dict(array.attrs, units=units[0]))
        self._write_inline(array, self._as_dtype(values, array, files[0]), along=array.dims.index(self.dim))

    def _as_dtype(self, values: np.ndarray, array: _Array, file: _File) -> np.ndarray:
        """Values in the array's dtype; floats when an integer dtype cannot hold them exactly."""
        dtype = np.dtype(array.meta.dtype)
        if dtype.kind in "iu" and values.dtype.kind in "iuf":
            info = np.iinfo(dtype)
            exact = values.dtype.kind != "f" or (np.all(np.isfinite(values)) and np.all(values == np.round(values)))
            if not (exact and values.min(initial=0) >= info.min and values.max(initial=0) <= info.max):
                log.info("--concat %s: variable %r re-encoded as float64 (its values do not fit %s)",
                         self.dim, array.path, dtype)
                return values.astype(np.dtype("f8").newbyteorder(dtype.byteorder))
        return values.astype(dtype)

    # -- variables over the dimension --------------------------------------------------------------------

    def _concatenate(self, files: list[_File], path: str, lengths: list[int], starts: list[int]) -> None:
        first = self.files[0].arrays[path]
        for f in files:
            why = self._differs(f.arrays[path], first, over_dim=True)
            if why:
                return self._mismatch(f, path, why)
        axis = first.dims.index(self.dim)
        chunk = int(first.meta.chunks[axis])
        chunks = [int(f.arrays[path].meta.chunks[axis]) for f in files]
        # Each file must begin a chunk of the combined array, and fill its last chunk unless no file
        # with values follows (Zarr v2's chunks are all alike).
        uneven = next((k for k, (s, n, c) in enumerate(zip(starts, lengths, chunks))
                       if c != chunk or s % chunk or (n % chunk and sum(lengths[k + 1:]))), None)
        shape = list(first.meta.shape)
        shape[axis] = starts[-1]
        if uneven is not None:
            nbytes = math.prod(shape) * np.dtype(first.meta.dtype).itemsize
            if nbytes > INLINE_LIMIT or np.dtype(first.meta.dtype).kind == "O":
                other = f" (the earliest file's: {chunk})" if chunks[uneven] != chunk else ""
                return self._mismatch(files[uneven], path, f"has {lengths[uneven]} values along {self.dim!r} in chunks "
                                      f"of {chunks[uneven]}{other}: the combined chunks would be uneven, which Zarr v2 "
                                      "cannot express")
            values = np.concatenate([self._values(f, f.arrays[path]) for f in files], axis=axis)
            return self._write_inline(first, values)
        self._write_meta(first, dict(first.meta.document, shape=shape))
        for f, start in zip(files, starts):
            offset = start // chunk
            for position, value in f.arrays[path].chunks.items():
                moved = list(position)
                moved[axis] += offset
                self.out[_chunk_key(first, moved)] = value

    # -- other variables ---------------------------------------------------------------------------------

    def _take_if_identical(self, path: str) -> None:
        first = self.files[0].arrays[path]
        for f in self.files[1:]:
            array = f.arrays[path]
            why = self._differs(array, first, over_dim=False)
            if why:
                return self._mismatch(f, path, why)
        others = self.files[1:]
        for f, why in zip(others, self.pool.map(lambda f: self._values_differ(f, path), others)):
            if why:
                return self._mismatch(f, path, why)
        self._copy(first)

    def _values_differ(self, file: _File, path: str) -> str | None:
        """Why the variable's values in `file` differ from the first file's (None if they do not).
        Encoded bytes first; decoded values when those differ (another compression of the same values)."""
        first, array = self.files[0].arrays[path], file.arrays[path]
        size = self._encoded_size(first) + self._encoded_size(array)
        if size > 2 * COMPARE_LIMIT:
            return (f"is too large to compare across files ({size // 2 >> 20} MiB encoded, at most "
                    f"{COMPARE_LIMIT >> 20} MiB)")
        if first.chunks.keys() == array.chunks.keys():
            if all(a == b or self._bytes(self.files[0], first, a) == self._bytes(file, array, b)
                   for a, b in ((first.chunks[k], array.chunks[k]) for k in first.chunks)):
                return None
        a = self._values(self.files[0], first)
        b = self._values(file, array)
        same = a.shape == b.shape and (np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
                                       if a.dtype.kind != "O" else bool(np.all(a == b)))
        return None if same else "has other values than in file " + quote(self.files[0].name)

    def _encoded_size(self, array: _Array) -> int:
        total = 0
        for value in array.chunks.values():
            if isinstance(value, list) and len(value) == 3:
                total += int(value[2])
            elif isinstance(value, (str, bytes)):
                total += len(value)
            else:
                total += COMPARE_LIMIT  # a whole object: of unknown size, assumed big
        return total

    def _differs(self, array: _Array, first: _Array, over_dim: bool) -> str | None:
        """Why `array`'s metadata differs from the first file's in a way that stops combining it."""
        if array.dims != first.dims:
            return f"has dimensions {array.dims}, not {first.dims}"
        skip = {first.dims.index(self.dim)} if over_dim else set()
        for name in ("dtype", "chunks", "shape", "compressor", "filters", "fill_value", "order"):
            a, b = array.meta.document.get(name), first.meta.document.get(name)
            if name in ("chunks", "shape") and a is not None and b is not None:
                a = [x for i, x in enumerate(a) if i not in skip]
                b = [x for i, x in enumerate(b) if i not in skip]
            if name in ("compressor", "filters"):  # (as they decode: a zlib level is the writer's choice)
                a, b = _decoding(a), _decoding(b)
            if a != b and not (name == "fill_value" and _both_nan(a, b)):
                return f"has {name} {a!r}, not {b!r}"
        if not over_dim and array.attrs != first.attrs:
            changed = sorted(k for k in set(array.attrs) | set(first.attrs) if array.attrs.get(k) != first.attrs.get(k))
            return f"has other attributes ({', '.join(changed[:5])})"
        return None

    def _check_same(self, file: _File, array: _Array, first: _Array) -> None:
        why = self._differs(array, first, over_dim=True)
        if why:
            raise RefsError(f"file {quote(file.name)}: variable {array.path!r} {why}: "
                            f"cannot combine along {self.dim!r}")

    # -- values ------------------------------------------------------------------------------------------

    def _prefetch(self) -> None:
        """Start every read the combination will need (the coordinate's chunks, and those of the
        variables to compare), up to PREFETCH_LIMIT bytes, all at once: over a long link the reads of a
        thousand files then cost a few round trips, not one per file and variable."""
        wanted, total = [], 0
        for f in self.files:
            for array in f.arrays.values():
                if array.path != self.dim and (self.dim in array.dims or array.path in self.identical):
                    continue
                for value in array.chunks.values():
                    if isinstance(value, list) and len(value) == 3:
                        total += int(value[2])
                        wanted.append((f, array, value))
        if total > PREFETCH_LIMIT:  # (then the coordinate's alone, and the rest as it is compared)
            wanted = [w for w in wanted if w[1].path == self.dim]
        for f, array, value in wanted:
            ref = (value[0], int(value[1]), int(value[2]))
            if ref not in self._reads:
                self._reads[ref] = self.pool.submit(self._read_ref, f, array, value)

    def _bytes(self, file: _File, array: _Array, value) -> bytes:
        if isinstance(value, (str, bytes)):
            return _inline_bytes(value)
        if len(value) == 3:
            ref = (value[0], int(value[1]), int(value[2]))
            future = self._reads.get(ref)
            if future is not None:
                return future.result()
        return self._read_ref(file, array, value)

    def _read_ref(self, file: _File, array: _Array, value) -> bytes:
        try:
            if len(value) == 1:
                return self.read(value[0], 0, None)
            return self.read(value[0], int(value[1]), int(value[2]))
        except RefsError:
            raise
        except Exception as e:  # the caller's reader: its own errors, named with the key they were for
            raise RefsError(f"file {quote(file.name)}: variable {array.path!r}: reading {quote(value[0])} "
                            f"failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None

    def _values(self, file: _File, array: _Array) -> np.ndarray:
        """The array's decoded values, assembled from its chunks (fill value where a chunk is missing)."""
        meta = array.meta
        dtype = np.dtype(meta.dtype)
        shape = [int(n) for n in meta.shape]
        if math.prod(shape) * dtype.itemsize > max(INLINE_LIMIT, COMPARE_LIMIT):
            raise RefsError(f"file {quote(file.name)}: variable {array.path!r} is too large to read for --concat")
        chunks = [int(n) for n in meta.chunks] if shape else []
        out = np.full(shape, _fill(meta.fill_value, dtype), dtype=dtype)
        codecs = _codecs(file, array)
        # (no stage of a chunk's decoding may grow past a few times the chunk: a hostile chunk stops there)
        bound = 8 * max(math.prod(chunks or [1]) * dtype.itemsize, 1 << 20)
        for position, value in array.chunks.items():
            raw = self._bytes(file, array, value)
            try:
                for codec in codecs:
                    raw = self.decode(codec, raw, bound) if self.decode is not None else codec.decode(raw)
                block = np.frombuffer(raw, dtype=dtype) if dtype.kind != "O" else np.asarray(raw, dtype=object)
                block = block.reshape(chunks or [], order=meta.order)
            except Exception as e:  # (numcodecs raises many kinds)
                raise RefsError(f"file {quote(file.name)}: chunk {position} of variable {array.path!r} cannot be "
                                f"decoded: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            if not shape:
                out[...] = block
                continue
            where = tuple(slice(p * c, min((p + 1) * c, n)) for p, c, n in zip(position, chunks, shape))
            if any(s.start >= s.stop for s in where):
                continue  # (a chunk beyond the shape)
            out[where] = block[tuple(slice(0, s.stop - s.start) for s in where)]
        return out

    # -- writing -----------------------------------------------------------------------------------------

    def _metadata(self, first: _File) -> None:
        for group, metas in first.groups.items():
            for base, meta in metas.items():
                self.out[f"{group}/{base}" if group else base] = json.dumps(meta)
        root = first.groups.get("", {}).get(".zattrs", {})
        differ = sorted({k for f in self.files[1:] for k in set(root) | set(f.groups.get("", {}).get(".zattrs", {}))
                         if root.get(k) != f.groups.get("", {}).get(".zattrs", {}).get(k)})
        if differ:
            log.info("--concat %s: global attributes that differ between files, taken from file %s: %s",
                     self.dim, first.name, ", ".join(differ))
        for f in self.files[1:]:
            for group in f.groups:
                if group not in first.groups:
                    self._mismatch(f, group, "is a group that the first file lacks")

    def _copy(self, array: _Array) -> None:
        self._write_meta(array, array.meta.document)
        for position, value in array.chunks.items():
            self.out[_chunk_key(array, position)] = value

    def _write_meta(self, array: _Array, meta: dict) -> None:
        prefix = f"{array.path}/"
        self.out[prefix + ".zarray"] = json.dumps(meta)
        self.out[prefix + ".zattrs"] = json.dumps(array.attrs)

    def _write_inline(self, array: _Array, values: np.ndarray, along: int | None = None) -> None:
        """The array as one uncompressed chunk of the given values, written inline. Of a growing set
        (`along`: the dimension's axis), when every file has the same length L along it: in chunks of L
        (a chunk per file), so that a file added later changes no chunk a reader of the smaller set may
        read (one chunk of it all would grow; netCDF-C 4.9 refuses chunks larger than the shape, so no
        room can be left in it: view/decoded.py clips them)."""
        values = np.ascontiguousarray(values)
        shape = list(values.shape)
        chunks = list(shape)
        if self.growing and along is not None and self._step:
            chunks[along] = self._step
        meta = dict(array.meta.document, shape=shape, chunks=chunks or [], dtype=values.dtype.str, compressor=None,
                    filters=None, order="C")
        self._write_meta(array, meta)
        if chunks == shape:
            self.out[_chunk_key(array, [0] * len(shape))] = "base64:" + base64.b64encode(values.tobytes()).decode()
            return
        step = chunks[along]
        for n in range(-(-shape[along] // step)):
            part = np.take(values, range(n * step, min((n + 1) * step, shape[along])), axis=along)
            padded = np.zeros(chunks, dtype=values.dtype)
            padded[tuple(slice(0, k) for k in part.shape)] = part
            position = [0] * len(shape)
            position[along] = n
            self.out[_chunk_key(array, position)] = "base64:" + base64.b64encode(padded.tobytes()).decode()


def _chunk_key(array: _Array, position) -> str:
    return f"{array.path}/{array.meta.chunk_key(position)}"


# codec parameters that only the encoder uses: chunks written with any of them decode the same
_ENCODING_ONLY = {"zlib": ("level",), "gzip": ("level",), "bz2": ("level",), "zstd": ("level", "checksum"),
                  "lzma": ("preset",), "blosc": ("clevel", "cname", "shuffle", "blocksize"), "lz4": ("acceleration",)}


def _decoding(config):
    """A compressor or filters config without its encoding-only parameters."""
    if isinstance(config, list):
        return [_decoding(c) for c in config]
    if not isinstance(config, dict):
        return config
    drop = _ENCODING_ONLY.get(config.get("id"), ())
    return {k: v for k, v in config.items() if k not in drop}


def _codecs(file: _File, array: _Array) -> list:
    """numcodecs codecs in decoding order: the compressor, then the filters last to first."""
    from refmount.refs.codecs import make_codec

    configs = [array.meta.compressor] + list(reversed(array.meta.filters or []))
    try:
        return [make_codec(dict(c)) for c in configs if c]
    except Exception as e:
        raise RefsError(f"file {quote(file.name)}: variable {array.path!r} uses a codec that cannot be loaded: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _fill(value, dtype: np.dtype):
    if value is None:
        return 0 if dtype.kind != "O" else None
    if isinstance(value, str) and dtype.kind in "fc":
        return {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(value, 0)
    if isinstance(value, str) and dtype.kind in "SUV":
        try:
            return base64.b64decode(value)
        except ValueError:
            return value
    return value


def _both_nan(a, b) -> bool:
    def nan(x):
        return x == "NaN" or (isinstance(x, float) and math.isnan(x))
    return nan(a) and nan(b)


def _cftime():
    try:
        import cftime
    except ImportError:
        raise RefsError("--concat over CF times needs the cftime package (pip install cftime)") from None
    return cftime
