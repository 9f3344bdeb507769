"""What each Zarr array of a reference set is, and how netCDF-C copes with it.

`scan_arrays` reads every inline ``.zarray``/``.zattrs`` once and returns an `ArrayInfo` per
array with the plan for the decoded view: the rewritten metadata, how chunks are transformed
(decode, byte-swap, crop, Fortran to C order) or why the array is hidden. `refmount inspect` and
`DecodedView` both use it, so the report and the mount always agree.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field

import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from refmount.view.bounded import decode_bounded
from refmount.view.ncattrs import fill_number, left_out_for_49, served_attributes, stored_fill
from refmount.refs import RefSet
from refmount.refs.arraymeta import ArrayMeta, ArrayMetaError
from refmount.refs.codecs import RefusedCodec, check_codec, make_codec
from refmount.refs.hdf5 import MISSING_CHUNK_FILL_KEY, SERVED_PADS, STRING_PAD_KEY, UNDECLARED_FILL_KEY
from refmount.refs.scan.tiff import NO_NODATA_KEY, SHORT_LAST_CHUNK_KEY

log = logging.getLogger("refmount")

# Codec ids the netCDF4 wheel (netCDF-C 4.10.1) decodes with its bundled plugins (NOTES §2).
NC410_CODECS = {"zlib", "gzip", "shuffle", "blosc", "zstd", "bz2"}
# netCDF-C's default fill values (netCDF4.default_fillvals): what a missing value reads as when a
# variable has no _FillValue, and what netCDF-C masks then.
NC_DEFAULT_FILL = {"i1": -127, "u1": 255, "i2": -32767, "u2": 65535, "i4": -2147483647, "u4": 4294967295,
                   "i8": -9223372036854775806, "u8": 18446744073709551614,
                   "f4": 9.969209968386869e36, "f8": 9.969209968386869e36}
CHAR_DTYPE_49 = "<U1"  # netCDF-C 4.9.x's own char dtype, one byte per character
PHONY_DIMENSION = re.compile(r"phony_dim_\d+")  # kerchunk's (and netCDF-C's) name of an unnamed HDF5 axis
SCALAR_DIMENSION = "_scalar_"  # the dimension of a scalar served as [1] (netCDF-C's XARRAYSCALAR)
# A decoded chunk is held whole in memory: bigger ones (absurd chunk shapes) hide their array.
MAX_CHUNK_BYTES = 1 << 30


@dataclass
class ArrayInfo:
    path: str  # directory path of the array ('' for a root array)
    dir_id: int
    zarray: dict  # its .zarray as given (`meta.document`), {} if it could not be read
    zattrs: dict
    meta: ArrayMeta | None = None  # None if its .zarray could not be read
    dtype: np.dtype | None = None
    codecs: list[dict] = field(default_factory=list)  # filters then compressor, as configured
    # plan for the decoded view
    hidden_reason: str | None = None
    notes: list[str] = field(default_factory=list)
    out_zarray: dict | None = None
    out_dtype: np.dtype | None = None
    swap: bool = False
    fortran: bool = False
    crop: tuple | None = None  # slices applied to a decoded chunk (chunks larger than the shape)
    chunk_shape: tuple = ()
    out_chunk_shape: tuple = ()
    separator: str = "."
    renamed_dims: dict = field(default_factory=dict)
    strlen: int = 0  # |Sn (n > 1) served as characters: the length of the added last dimension
    recode_from: np.dtype | None = None  # |O or <U strings, served as the fixed-length UTF-8 `dtype`
    # attributes netCDF-C 4.9.0 cannot read (it fails the whole open): left out of its forms only
    left_out: dict = field(default_factory=dict)
    # a Zarr v3 fill_value without a CF _FillValue attribute: netCDF-C's forms declare it as a v2 store's,
    # the zarr form does not (xarray masks a v2 fill_value, never a v3 one)
    zarr_fill: bool = False
    lazy: bool = False  # of a Parquet set, whose chunk keys are not known at mount (none can be renamed)
    string_pad: str | None = None  # HDF5 fixed-length strings: each value cut at its terminator (refs.hdf5)
    # HDF5's own fill, not declared by the file (refs.hdf5): data, served with no fill_value (refmount.view.forms)
    # and chunks never written as files of it (decoded.py)
    undeclared_fill: bool = False
    # HDF5's fill where a _FillValue attribute is another value (refs.hdf5): one value as served, the bytes
    # chunks never written are made of (decoded.py); None: they read as fill_value
    missing_chunk_fill: bytes | None = None
    # the grid axis whose last chunk the file stores short (a TIFF's last strip: refs/scan/tiff.py): that
    # chunk is decoded short and padded with the fill (decoded.py); None: every chunk whole
    short_axis: int | None = None
    no_nodata: bool = False  # a TIFF without nodata: GDAL's form gives no nodata either (refs/scan/tiff.py)

    def __post_init__(self) -> None:
        if self.meta is None and self.zarray:  # (given its .zarray alone)
            self.meta = ArrayMeta.from_zarray(self.zarray)

    @property
    def scalar(self) -> bool:
        """A Zarr array of shape [] (the plan serves it as [1] to netCDF-C: refmount.view.forms)."""
        return self.meta is None or self.meta.scalar

    @property
    def name(self) -> str:
        return self.path or "/"

    @property
    def needs_decoding(self) -> bool:
        return bool(self.codecs)

    @property
    def transforms_chunks(self) -> bool:
        return (bool(self.codecs) or self.swap or self.fortran or self.crop is not None or self.recode_from is not None
                or self.string_pad is not None or self.short_axis is not None)

    @property
    def out_chunk_bytes(self) -> int:
        return math.prod(self.out_chunk_shape) * self.out_dtype.itemsize

    def chunk_index(self, name: str) -> tuple[int, ...] | None:
        """Grid index of a chunk key relative to the array directory ("1.0.3" or "1/0/3"; a scalar's
        "0" is (0,), as the [1] it is served as)."""
        index = self.meta.parse_chunk_key(name) if self.meta is not None else None
        return (0,) if index == () else index

    def chunk_count(self) -> int:
        """How many chunks the array's grid has (1 for an array whose .zarray is not known, 0 for one
        whose shape and chunks make no grid)."""
        try:
            return self.meta.nchunks() if self.meta is not None else 1
        except ArrayMetaError:
            return 0


def listed(names: list[str], shown: int = 8) -> str:
    """Array names for a log line: the first few, then how many more."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown:,} more" if len(names) > shown else "")


class NameSample:
    """The first few names of a possibly huge list and how many there are: what a summary log line
    shows (`listed`), without holding every name (a set may have 300,000 arrays)."""

    def __init__(self, shown: int = 8) -> None:
        self.shown = shown
        self.names: list[str] = []
        self.count = 0

    def add(self, name: str) -> None:
        if len(self.names) < self.shown:
            self.names.append(name)
        self.count += 1

    def __bool__(self) -> bool:
        return self.count > 0

    def __str__(self) -> str:
        more = self.count - len(self.names)
        return ", ".join(self.names) + (f" and {more:,} more" if more > 0 else "")


def compressed_arrays(refset: RefSet, shown: int = 8) -> NameSample:
    """The arrays whose inline .zarray names a compressor or filters: one .zarray parsed at a time,
    nothing kept but the first few names (the raw view's warning; `scan_arrays` would plan every
    array, hundreds of MB for a set of 300,000)."""
    found = NameSample(shown)
    for path in refset.dirs.paths:
        raw = _inline(refset, f"{path}/.zarray" if path else ".zarray")[1]
        if not raw:
            continue
        try:
            z = ArrayMeta.from_zarray(load_json_value(raw))
        except (ValueError, RecursionError):  # (ArrayMetaError too)
            continue
        if z.compressor or z.filters:
            found.add(path or "/")
    return found


def load_json_value(data: bytes):
    """Parse metadata JSON the way zarr does (NaN/Infinity allowed)."""
    return json.loads(data.decode("utf-8"))


def _inline(refset: RefSet, key: str):
    i = refset.find(key)
    if i < 0:
        return None, None
    return i, refset.inline_data(i)


def scan_arrays(refset: RefSet) -> list[ArrayInfo]:
    """Every array's plan, in its base form: the one netCDF-C 4.9 reads (characters as '<U1' with
    strings given a last dimension, scalars as [1], both NCZarr type hints, no attribute 4.9.0
    fails on). refmount.view.forms derives every reader's form from it."""
    arrays = []
    for d, path in enumerate(refset.dirs.paths):
        prefix = f"{path}/" if path else ""
        i, raw = _inline(refset, prefix + ".zarray")
        if i is None:
            continue
        info = ArrayInfo(path=path, dir_id=d, zarray={}, zattrs={}, lazy=getattr(refset, "lazy", False),
                         zarr_fill=path in (getattr(refset, "zarr_fills", None) or ()))
        if raw is None:
            info.hidden_reason = "its .zarray is stored remotely, so it cannot be rewritten at mount time"
        else:
            try:
                info.meta = ArrayMeta.from_zarray(load_json_value(raw))
                info.zarray = info.meta.document
                _, attrs_raw = _inline(refset, prefix + ".zattrs")
                info.zattrs = load_json_value(attrs_raw) if attrs_raw else {}
            except (ValueError, TypeError, KeyError, RecursionError) as e:
                info.hidden_reason = _malformed(e)
        arrays.append(info)
    fills_declared = _fills_are_declared(arrays)
    for info in arrays:
        if info.hidden_reason:
            continue
        try:
            _plan(info, refset, fills_declared)
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            info.hidden_reason = _malformed(e)
    layouts = getattr(refset, "shards", None) or {}  # sharded Zarr v3 arrays (refmount.view.zarr3)
    for info in arrays:
        layout = layouts.get(info.path)
        if layout is not None and not info.hidden_reason:
            info.notes.insert(0, f"Zarr v3 shards of {list(layout.shard_shape)} served as their inner chunks "
                                 f"({layout.count} per shard)")
    _extend_unwritten_records(arrays)
    _rename_clashing_dimensions(arrays)
    return arrays


def _malformed(e: Exception) -> str:
    return f"its metadata is malformed ({type(e).__name__}: {str(e)[:200]})"


def _fills_are_declared(arrays: list[ArrayInfo]) -> bool:
    """Does this set show kerchunk's netCDF rule at work? kerchunk gives a netCDF-4 variable (one with
    netCDF-C's ``_Netcdf4Coordinates``, which current netCDF-C writes on every variable with
    dimensions: measured with 4.9.0 and 4.10.1; older versions wrote it on few)
    a null fill_value unless the source declares ``_FillValue``. Then one numeric array with dimensions
    and a null fill shows that any other array's fill_value is a declared _FillValue, even one equal to
    netCDF's default or 0. Files from other HDF5 writers (and old netCDF-C) give HDF5's fill instead,
    declared or not: there a fill of 0 or the default may be nothing but HDF5's. An array over
    phony dimensions only is no netCDF-4 variable (netCDF-C names every dimension it writes): kerchunk
    nulls the fill of data it inlines (compact datasets, filters it cannot reference) in any file."""
    for info in arrays:
        m = info.meta
        if info.hidden_reason or m is None or m.scalar or m.fill_value is not None:
            continue
        if _is_time_like(info.zattrs) or isinstance(m.dtype, list) or _phony_dimensions(info.zattrs):
            continue  # (kerchunk nulls the fill of a time-like array, and of inlined data, in any file)
        try:
            if np.dtype(m.dtype).kind in "iuf":
                return True
        except TypeError:
            continue
    return False


def _phony_dimensions(zattrs: dict) -> bool:
    """Are an array's dimensions all kerchunk's names for an HDF5 dataset without dimension scales?"""
    dims = zattrs.get("_ARRAY_DIMENSIONS") if isinstance(zattrs, dict) else None
    return bool(dims) and isinstance(dims, list) and all(isinstance(d, str) and PHONY_DIMENSION.fullmatch(d)
                                                         for d in dims)


def _is_time_like(zattrs: dict) -> bool:
    """kerchunk's (and xarray's) test for a netCDF time: units containing "since"."""
    units = zattrs.get("units") if isinstance(zattrs, dict) else None
    return isinstance(units, str) and "since" in units


def _numeric_fill(value) -> bool:
    """A fill_value given as a number, or as a string that is no number ("NaN", "nan", "1e5" are)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return True
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _short(value, limit: int = 60) -> str:
    """repr(value), cut (a hostile metadata document's value goes into one log line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _plan(info: ArrayInfo, refset=None, fills_declared: bool = False) -> None:
    z, m = info.zarray, info.meta
    if z.get("zarr_format", 2) != 2:
        raise ValueError(f"zarr_format {z.get('zarr_format')} is not 2")
    dtype = m.numpy_dtype() if not isinstance(m.dtype, list) else None
    info.dtype = dtype
    filters = m.filters or []
    info.codecs = list(filters) + ([m.compressor] if m.compressor else [])
    shape = list(m.shape)
    chunks = list(m.chunks)
    info.chunk_shape = tuple(chunks)
    info.separator = m.separator
    if dtype is None:
        info.hidden_reason = "structured (compound) dtype: netCDF-C cannot read it from Zarr"
        return
    if dtype.kind == "O":
        longest, why = _longest_string(refset, info) if refset is not None else (0, "no reference set")
        if why:
            info.hidden_reason = f"variable-length strings: {why}"
            return
        info.notes.append(f"variable-length strings served as fixed-length UTF-8 (|S{longest}, the longest)")
    elif dtype.kind == "U":
        longest = dtype.itemsize  # n characters: 4n bytes of UTF-32, and at most 4n of UTF-8
        info.notes.append(f"UTF-32 strings {dtype.str} served as fixed-length UTF-8 (|S{longest})")
    if dtype.kind in "OU":
        info.recode_from = dtype
        info.dtype = dtype = np.dtype(f"S{longest}")
    if dtype.kind == "V":
        info.hidden_reason = f"dtype {m.dtype} (raw bytes) is not a netCDF type"
        return
    if dtype.kind == "c":  # (netCDF-C 4.9.0 crashes on the whole dataset with such a dtype)
        info.hidden_reason = f"dtype {m.dtype} (complex numbers) is not a netCDF type"
        return
    if dtype.kind in "Mm" and not _plan_times(info, dtype):
        return
    for config in info.codecs:
        try:
            check_codec(config)
        except RefusedCodec as e:
            info.hidden_reason = str(e)
            return
        except Exception as e:
            info.hidden_reason = f"codec {config.get('id')!r} is not available here ({type(e).__name__})"
            return
    # A stored chunk is decoded whole before it is cropped to the shape: chunks far past the shape (a
    # hostile [2**28] of an array of one value, a 2 MB zlib stream) would decode gigabytes to serve 8 bytes.
    stored_bytes = math.prod(chunks) * dtype.itemsize
    if stored_bytes > MAX_CHUNK_BYTES:
        info.hidden_reason = (f"its stored chunks decode to {stored_bytes:,} bytes each, more than the decoded view "
                              f"decodes ({MAX_CHUNK_BYTES:,})")
        return
    if dtype.kind in "iuf" and _numeric_fill(m.fill_value) and stored_fill(m.fill_value, dtype) is None:
        # (served, netCDF-C refuses the whole dataset: "Numeric conversion not representable")
        info.hidden_reason = f"fill_value {_short(m.fill_value)} is not a value of its dtype {dtype.str}"
        return
    out = dict(z)
    out["compressor"] = None
    out["filters"] = None
    pad = out.pop(STRING_PAD_KEY, None)
    marked = out.pop(UNDECLARED_FILL_KEY, None)
    short = out.pop(SHORT_LAST_CHUNK_KEY, None)
    info.no_nodata = out.pop(NO_NODATA_KEY, None) is True
    if short is not None:
        # (padding a short chunk at its end is right only if the chunk's rows are its outermost axis)
        if type(short) is not int or not 0 <= short < len(chunks) or any(c != 1 for c in chunks[:short]):
            info.hidden_reason = f"{SHORT_LAST_CHUNK_KEY} {short!r} is not an axis of its chunks {chunks} led by 1s"
            return
        info.short_axis = short
        info.notes.append(f"last chunk along axis {short} stored short (a TIFF's last strip): padded with the fill")
    undeclared, declared = marked is True, marked is False
    missing_fill = out.pop(MISSING_CHUNK_FILL_KEY, None)
    if dtype.kind == "S" and pad in SERVED_PADS:
        info.string_pad = pad
        info.notes.append(f"strings cut at their terminator ({pad}), as HDF5 reads them")
    out_dtype = dtype
    if dtype.kind == "b":
        out_dtype = np.dtype("u1")
        info.notes.append("bool stored as |u1 (0/1)")
        if isinstance(m.fill_value, bool):
            out["fill_value"] = int(m.fill_value)
    if dtype.kind in "Mm":  # (the same bytes: int64 ticks, with CF units: _plan_times)
        out_dtype = np.dtype("i8").newbyteorder(dtype.byteorder)
        fill = stored_fill(m.fill_value, dtype) if m.fill_value is not None else None
        out["fill_value"] = None if fill is None else int(np.array(fill).view("i8"))
    if dtype.byteorder == ">":
        out_dtype = out_dtype.newbyteorder("<")
        info.swap = True
        info.notes.append(f"big-endian {dtype.str} served as little-endian {out_dtype.str}")
    if dtype.kind == "S":
        _plan_characters(info, out, dtype)
    if dtype.kind == "S":
        out["dtype"], out_dtype = CHAR_DTYPE_49, np.dtype("u1")  # (one byte per character, in every form)
    else:
        out["dtype"] = out_dtype.str
    if m.order == "F" and len(chunks) > 1:
        info.fortran = True
        info.notes.append("Fortran-order chunks served in C order")
    out["order"] = "C"
    if not shape:
        out["shape"], out["chunks"] = [1], [1]
        info.notes.append("scalar served as shape [1] to netCDF-C (which cannot read a Zarr scalar), as [] to others")
        dims = info.zattrs.get("_ARRAY_DIMENSIONS")
        if not dims:  # (the name netCDF-C >= 4.9.2 itself gives a scalar's Zarr dimension)
            info.zattrs = {**info.zattrs, "_ARRAY_DIMENSIONS": [SCALAR_DIMENSION]}
    else:
        crop = []
        new_chunks = []
        for size, chunk in zip(shape, chunks):
            if chunk > size > 0 and math.ceil(size / chunk) == 1:
                new_chunks.append(size)
                crop.append(slice(0, size))
            else:
                new_chunks.append(chunk)
                crop.append(slice(None))
        if new_chunks != chunks:
            info.crop = tuple(crop)
            info.notes.append(f"chunks {chunks} cropped to the shape {new_chunks}")
        out["chunks"] = new_chunks
    if info.strlen:
        out["shape"] = list(out["shape"]) + [info.strlen]
        out["chunks"] = list(out["chunks"]) + [info.strlen]
        dims = info.zattrs.get("_ARRAY_DIMENSIONS")
        if isinstance(dims, list):
            info.zattrs = {**info.zattrs, "_ARRAY_DIMENSIONS": [*dims, f"string{info.strlen}"]}
    info.out_dtype = out_dtype
    info.out_chunk_shape = tuple(out["chunks"])
    if info.out_chunk_bytes > MAX_CHUNK_BYTES:
        info.hidden_reason = (f"its decoded chunks would be {info.out_chunk_bytes:,} bytes each, more than the "
                              f"decoded view serves ({MAX_CHUNK_BYTES:,})")
        return
    info.out_zarray = out
    # characters get no _FillValue (NUL is theirs), nor do booleans (a fill of false would mask every false)
    typed = out_dtype if dtype.kind in "iufMm" else None
    fill = out.get("fill_value")
    if typed is not None and undeclared and fill_number(fill, typed) is not None and not _is_default_fill(fill, typed):
        # HDF5's own fill, which the file's readers show as data: no _FillValue, no fill_value (a 0 needs
        # none: null reads as zeros), chunks never written as files of it
        info.undeclared_fill = fill_number(fill, typed) != 0
        info.notes.append(f"fill_value {_short(fill)} served as data (HDF5's own fill: the file declares no "
                          "_FillValue)")
        fill = None
        if not info.undeclared_fill:
            out["fill_value"] = None
    elif typed is not None and fill_number(fill, typed) is not None and (
            declared or _fill_is_declared(info, refset, fills_declared, typed)):
        pass  # served as _FillValue, whatever its value
    elif typed is not None and _is_default_fill(fill, typed):
        # (a scalar or a 1-byte array) netCDF's default fill needs no _FillValue: netCDF-C applies it
        # by itself. In .zarray it matters only for missing chunks; elsewhere it would make xarray
        # mask what the source may not.
        fill = None
        out["fill_value"] = NC_DEFAULT_FILL[typed.str[1:]] if _may_miss_chunks(refset, info) else None
    elif typed is not None and fill_number(fill, typed) == 0:
        # A fill of 0 not known to be declared is HDF5's own (h5py writers; nccopy's scalars, written
        # without fill values): there 0 is data, and a _FillValue of 0 (or xarray, which masks
        # fill_value) would mask it. Without a fill, netCDF-C reads missing chunks as 0, as HDF5 does.
        fill = out["fill_value"] = None
        info.notes.append("fill_value 0 not served (0 is data in files written without fill values)")
    if typed is not None and fill is not None and fill_number(missing_fill, typed) is not None:
        info.missing_chunk_fill = np.array(fill_number(missing_fill, typed)).astype(typed).tobytes()
        info.notes.append(f"chunks never written read as HDF5's fill {_short(missing_fill)}, not _FillValue "
                          f"{_short(fill)}")
    info.left_out = {k: v for k, v in info.zattrs.items() if k != "_ARRAY_DIMENSIONS" and left_out_for_49(v)}
    info.zattrs, attr_notes = served_attributes(info.zattrs, typed, fill)
    info.notes.extend(attr_notes)
    if info.codecs:
        info.notes.insert(0, "chunks decoded (" + "+".join(str(c.get("id")) for c in info.codecs) + ")")


# numpy's datetime64/timedelta64 units, as CF (UDUNITS) names them
_TIME_UNITS = {"D": "days", "h": "hours", "m": "minutes", "s": "seconds", "ms": "milliseconds",
               "us": "microseconds", "ns": "nanoseconds"}


def _plan_times(info: ArrayInfo, dtype: np.dtype) -> bool:
    """datetime64/timedelta64 (which netCDF-C 4.9.0 crashes on) served as their int64 ticks with CF
    units, as xarray writes times to netCDF; False (hidden) for a unit CF has no fixed length for."""
    unit, count = np.datetime_data(dtype)
    if unit not in _TIME_UNITS or count != 1:
        info.hidden_reason = f"dtype {dtype.str}: netCDF has no such time type, and CF no unit of {count} {unit}"
        return False
    units = _TIME_UNITS[unit] + (" since 1970-01-01T00:00:00" if dtype.kind == "M" else "")
    info.zattrs = {**info.zattrs, "units": units, **({"calendar": "proleptic_gregorian"} if dtype.kind == "M" else {})}
    info.notes.append(f"{dtype.str} served as int64 with units {units!r}")
    return True


def _fill_is_declared(info: ArrayInfo, refset, fills_declared: bool, typed: np.dtype) -> bool:
    """Is this array's non-null fill_value the source's own _FillValue, not just the fill HDF5 keeps
    for every dataset? kerchunk gives a time-like array without _FillValue a null fill in any file,
    and (see `_fills_are_declared`) any array with dimensions in a set that shows its netCDF rule.
    Without that sign, netCDF's default fill on an array with dimensions is served as well: netCDF-C
    masks it anyway, so the attribute changes nothing there, and xarray then masks what netCDF-C
    masks. Not for 1-byte types, whose default (-127, 255) netCDF4-python does not mask, and which
    full-range byte data uses as a value. Nor is 0, HDF5's own fill (h5py, nccopy), unless the array
    was never written: then serving it masks nothing but never-written points, right when the source
    declared it and harmless when not (a file written without fill values leaves them undefined).
    A scalar has no ``_Netcdf4Coordinates``: kerchunk gives it HDF5's fill, declared or not."""
    if _is_time_like(info.zattrs):
        return True
    if info.scalar:
        return False
    if fills_declared:
        return True
    if typed.itemsize > 1 and _is_default_fill(info.meta.fill_value, typed):
        return True
    return refset is not None and not getattr(refset, "lazy", False) and count_chunks(refset, info)[0] == 0


def _is_default_fill(fill, dtype: np.dtype) -> bool:
    """No fill, or netCDF's default fill for the type."""
    default = NC_DEFAULT_FILL.get(dtype.str[1:])
    if default is None:
        return False
    number = fill_number(fill, dtype)
    return number is None and fill is None or number == fill_number(default, dtype)


def count_chunks(refset, info: ArrayInfo) -> tuple[int, int]:
    """(chunk keys present, chunks the grid has) of an array of an eager reference set. Every file
    of the array's directory (and, for the "/" separator, its subdirectories) that is not metadata
    counts as a chunk: a count per directory, not a look at each key (a mount may have millions)."""
    expected = info.chunk_count()
    prefix = f"{info.path}/" if info.path else ""
    present = sum(refset.file_count(d) for d in _array_dirs(refset.dirs, info.dir_id, prefix))
    present -= sum(refset.find(prefix + name) >= 0 for name in (".zarray", ".zattrs", ".zgroup", ".zmetadata"))
    return present, expected


def _array_dirs(dirs, dir_id: int, prefix: str):
    """An array's directory and (not for a root array) every directory under it: walked down the
    registry's children, not found by testing every path (once per array, quadratic: 5,000 arrays
    took 7 s, 300,000 would take hours)."""
    children = getattr(dirs, "children", None)
    if children is None:  # (a registry without children links)
        yield from (d for d, path in enumerate(dirs.paths) if d == dir_id or (prefix and path.startswith(prefix)))
        return
    yield dir_id
    if not prefix:
        return
    stack = list(children[dir_id].values())
    while stack:
        d = stack.pop()
        yield d
        stack.extend(children[d].values())


def _may_miss_chunks(refset, info: ArrayInfo) -> bool:
    if refset is None or getattr(refset, "lazy", False):
        return True  # a Parquet set's rows load on demand: assume some are empty
    present, expected = count_chunks(refset, info)
    return present < expected


VLEN_CODECS = ("vlen-utf8", "vlen-bytes")


def _longest_string(refset, info: ArrayInfo) -> tuple[int, str | None]:
    """The longest UTF-8 string of an object array whose chunks are all inline (kerchunk inlines
    HDF5 strings): the fixed length to serve it with. (0, reason) when that cannot be known without
    fetching, or the codecs are not string codecs."""
    ids = [c.get("id") for c in info.codecs]
    if not ids or ids[0] not in VLEN_CODECS or getattr(refset, "lazy", False):
        return 0, f"codecs {ids} are not a vlen-utf8/vlen-bytes filter (then compressors) of an inline reference set"
    try:  # (Zarr v3 arrays compress their vlen bytes: zstd by default)
        codecs = [make_codec(c) for c in info.codecs]
    except Exception as e:
        return 0, str(e) if isinstance(e, RefusedCodec) else f"codecs {ids} cannot be made here ({type(e).__name__})"
    prefix = f"{info.path}/" if info.path else ""
    longest, found = 1, False
    for i in refset.files_in(info.dir_id).tolist():
        if info.chunk_index(refset.key(i)[len(prefix):]) is None:
            continue
        data = refset.inline_data(i)
        if data is None:
            return 0, "chunks stored remotely (their longest string is not known at mount)"
        found = True
        try:  # (a chunk its own decoder refuses, however: blosc's RuntimeError, fletcher32's IndexError)
            for codec in reversed(codecs):
                data = decode_bounded(codec, data, MAX_CHUNK_BYTES)
        except Exception as e:
            return 0, f"chunk {refset.key(i)!r} could not be decoded ({type(e).__name__}: {str(e)[:200]})"
        for item in data.ravel():
            longest = max(longest, len(item.encode("utf-8") if isinstance(item, str) else bytes(item)))
    if not found:  # kerchunk wrote no chunk: the strings are unknown, not empty
        return 0, "no chunk is referenced (the reference set does not hold the strings)"
    return longest, None


def fixed_strings(values, source: np.dtype, length: int) -> bytes:
    """Decoded strings (an object array, or the bytes of a <U array) as NUL-padded fixed-length
    UTF-8 bytes; a string longer than `length` is an error, never cut short."""
    if source.kind == "U":
        values = ensure_contiguous_ndarray(values).view(np.uint8).view(source)
    encoded = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in np.asarray(values).ravel()]
    if any(len(v) > length for v in encoded):
        raise ValueError(f"a string is longer than the {length} bytes served")
    return np.array(encoded, dtype=f"S{length}").tobytes()


def _plan_characters(info: ArrayInfo, out: dict, dtype: np.dtype) -> None:
    """Byte strings (netCDF char arrays are |S1; |Sn are fixed-length strings), planned as netCDF-C
    4.9's characters: '<U1' holding one byte each, |Sn with a last dimension of length n, named
    string<n> as xarray does. No Zarr form of characters reads as netCDF char in every netCDF-C
    (NOTES §6): 4.9.x reads only that form, which netCDF-C >= 4.10 and zarr refuse; any '|S' dtype
    crashes 4.9.0's ncdump for the whole dataset. refmount.view.forms gives each reader its form."""
    if dtype.itemsize > 1:
        info.strlen = dtype.itemsize
        info.notes.append(f"strings {dtype.str} served as characters with a last dimension string{dtype.itemsize} "
                          "to netCDF-C 4.9")
    # kerchunk's fill for text is a space or NUL ("IA==", "AA=="): xarray would mask every such
    # character, and netCDF-C >= 4.10 reads the base64 text itself as the value of a missing chunk
    out["fill_value"] = None


def _dimensions(info: ArrayInfo) -> list[str] | None:
    dims = info.zattrs.get("_ARRAY_DIMENSIONS")
    shape = info.out_zarray["shape"]
    if not isinstance(dims, list) or len(dims) != len(shape) or not all(isinstance(d, str) for d in dims):
        return None
    return [d.rsplit("/", 1)[-1] for d in dims]


def _extend_unwritten_records(arrays: list[ArrayInfo]) -> None:
    """netCDF's unlimited dimension is as long as its longest variable, and a variable reads fill
    where it was never written; kerchunk gives each variable the records written to it (0 if none).
    Such an array gets the dimension's length back: the records it lacks read as fill (missing
    chunks; allocated chunks hold HDF5's fill there). Only along a dimension that looks unlimited
    (`_chunked_as_unlimited`) in some array of its group; kerchunk's ``phony_dim_N`` names of plain
    HDF5 datasets are never one, and two lengths of another name stay two dimensions
    (`_rename_clashing_dimensions`). The dimension is
    the one of the array's own group, or an ancestor's when it looks unlimited in both (a group may
    define its own dimension of the same name)."""
    visible = [info for info in arrays if not info.hidden_reason and info.out_zarray is not None]
    longest: dict[tuple[str, str], int] = {}  # (group, dimension) -> the longest array's length
    unlimited: set[tuple[str, str]] = set()
    for info in visible:
        group = info.path.rpartition("/")[0]
        dims = _dimensions(info) or []
        for name, size in zip(dims, info.out_zarray["shape"]):
            longest[group, name] = max(longest.get((group, name), 0), size)
        if len(info.chunk_shape) == len(dims):  # (not a scalar served as [1])
            unlimited.update((group, n) for n, size, chunk in zip(dims, info.meta.shape, info.chunk_shape)
                             if _chunked_as_unlimited(size, chunk) and not n.startswith("phony_dim_"))
    groups = {grp for grp, _ in longest}
    for info in visible:
        dims = _dimensions(info)
        if not dims:
            continue
        group = info.path.rpartition("/")[0]
        ancestors = [g for g in groups if g != group and (g == "" or group.startswith(g + "/"))]
        shape, chunks = info.out_zarray["shape"], info.out_zarray["chunks"]
        lengths = []
        for name, size in zip(dims, shape):
            length = longest[group, name] if (group, name) in unlimited else size
            for g in ancestors:
                if (g, name) in unlimited and ((group, name) in unlimited or size == 0):
                    length = max(length, longest.get((g, name), 0))
            lengths.append(length)
        if lengths == list(shape):
            continue
        info.out_zarray["shape"] = lengths
        info.out_zarray["chunks"] = [min(c, n) if size == 0 else c for n, size, c in zip(lengths, shape, chunks)]
        info.out_chunk_shape = tuple(info.out_zarray["chunks"])
        # (numbers only: characters are served as one byte each, u1, but have no fill; nor has bool)
        if info.out_zarray.get("fill_value") is None and info.dtype.kind in "iuf":
            info.out_zarray["fill_value"] = NC_DEFAULT_FILL[info.out_dtype.str[1:]]
        short = [f"{n} ({s} of {n_})" for n, s, n_ in zip(dims, shape, lengths) if s != n_]
        info.notes.append(f"records never written along {', '.join(short)}: given the dimension's length, "
                          "reading as fill there")
    for info in visible:
        if 0 in info.out_zarray["shape"]:
            info.hidden_reason = ("a dimension of length 0 (an unlimited dimension with no records): netCDF-C 4.9.0 "
                                  "fails the whole open on such an array (the raw view keeps it)")


def _chunked_as_unlimited(size: int, chunk: int) -> bool:
    """An extent along a dimension only an unlimited one has: none yet, a chunk longer than the
    extent (HDF5 allows that only for an extendible dataset; netCDF-C chunks a fixed dimension at
    most to its length), or netCDF-C's default chunk of 1 record."""
    return size == 0 or chunk > size or chunk == 1 < size


def _rename_clashing_dimensions(arrays: list[ArrayInfo]) -> None:
    """A dimension name used with two lengths makes netCDF-C 4.9.0 return wrong data: the first
    length keeps the name, other lengths get '<name>_<length>'."""
    lengths: dict[str, int] = {}
    for info in arrays:
        if info.hidden_reason or info.out_zarray is None:
            continue
        dims = info.zattrs.get("_ARRAY_DIMENSIONS")
        shape = info.out_zarray["shape"]
        if not isinstance(dims, list) or len(dims) != len(shape) or not all(isinstance(d, str) for d in dims):
            continue
        new_dims = []
        for original, size in zip(dims, shape):
            # kerchunk writes subgroup dimensions as "group/dim", which makes netCDF-C 4.10 fail the
            # whole open ("No group found"): keep the last component (clashes are renamed below)
            name = original.rsplit("/", 1)[-1]
            if name != original:
                info.renamed_dims[original] = name
            first = lengths.setdefault(name, size)
            if first != size:
                renamed = f"{name}_{size}"
                info.renamed_dims[original] = renamed
                new_dims.append(renamed)
            else:
                new_dims.append(name)
        if info.renamed_dims:
            info.zattrs = {**info.zattrs, "_ARRAY_DIMENSIONS": new_dims}
            info.notes.append("dimensions renamed: " + ", ".join(f"{a}->{b}" for a, b in info.renamed_dims.items()))


# -- compatibility verdicts for `refmount inspect` ---------------------------------------------------

def raw_verdicts(info: ArrayInfo) -> tuple[str, str]:
    """(netCDF-C 4.9.0, netCDF-C >= 4.10) verdicts for the raw view."""
    z = info.zarray
    if not z:
        return "unknown", "unknown"
    dtype = info.dtype if info.recode_from is None else info.recode_from
    problems_49, problems_410 = [], []
    if info.codecs:
        problems_49.append("garbage: compressed/filtered and 4.9.0 has no filters")
        unsupported = [c.get("id") for c in info.codecs if c.get("id") not in NC410_CODECS]
        if unsupported:
            problems_410.append(f"no plugin for {', '.join(map(str, unsupported))}")
    if dtype is None or dtype.kind in "OUV":
        problems_49.append("unsupported dtype")
        problems_410.append("unsupported dtype fails the whole open")
    else:
        if dtype.byteorder == ">":
            problems_49.append("wrong values: big-endian not swapped")
        if dtype.kind == "b":
            problems_410.append("bool fails the whole open")
        if dtype.kind == "S" and dtype.itemsize == 1:
            problems_49.append("|S1 crashes ncdump")
    if info.scalar:
        problems_49.append("scalar crashes ncdump")
        problems_410.append("scalar silently dropped")
    if any(c > s > 0 for s, c in zip(info.meta.shape or [], info.meta.chunks or [])):
        problems_49.append("chunks larger than the shape rejected")
    return ("no: " + "; ".join(problems_49)) if problems_49 else "yes", \
        ("no: " + "; ".join(problems_410)) if problems_410 else "yes"


def decoded_verdicts(info: ArrayInfo) -> tuple[str, str]:
    """(netCDF-C 4.9.0, netCDF-C >= 4.9.3) verdicts for the decoded view, each reading its own form
    (refmount.view.forms); >= 4.9.3 reads exactly only in nczarr mode (NCZarr's keys)."""
    if info.hidden_reason:
        return (f"hidden: {info.hidden_reason}",) * 2
    if info.scalar:
        return ("yes, as shape [1] (it reads no Zarr scalar)",
                "yes, a scalar in #mode=nczarr,file (shape [1] over _scalar_ in #mode=zarr,file)")
    if info.dtype is not None and info.dtype.kind == "S":
        return ("yes, characters as its own '<U1'",
                "yes, characters as char ('>S1') in #mode=nczarr,file (one-character strings in #mode=zarr,file)")
    return "yes", "yes"
