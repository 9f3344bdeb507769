"""Compare one client's snapshot of the mount with its snapshot of the source file.

Per variable (and per group, for group attributes) the outcome is one of
- ``identical``;
- ``wrong``: values, mask, type, shape or an attribute differ and refmount is to blame;
- ``lost by kerchunk``: what differs the reference set itself already lacks or changed (checked in the
  refs JSON): attributes, an enum type written as its base type, or a _FillValue kept only as a
  fill_value the refs cannot tell from HDF5's own (`_undeclared_fill`), so those points read as data;
- ``error``: the client raises (or ncdump fails) on the mount;
- ``hidden``: the variable is absent from the mount;
- ``untranslatable``: kerchunk did not translate the variable;
- ``source unreadable``: the client cannot read the variable in the source file either (not counted).
The caller refines errors and wrong results with the ``cp -r`` proof and hidden ones with the log.
"""

from __future__ import annotations

import json
import math
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from tests.support.clients import FILL, parse_cdl_number, unescape_cdl_string

from refmount.view.ncattrs import left_out_for_49  # what the decoded view leaves out, saying so in the mount log

IDENTICAL, WRONG, LOST, ERROR, HIDDEN, UNTRANSLATABLE, SOURCE_UNREADABLE = (
    "identical", "wrong", "lost by kerchunk", "error", "hidden", "untranslatable", "source unreadable")

# NCZarr's attribute type hints: each netCDF-C version hides its own spelling and shows the other one
# as text. They say how to read the other attributes; one showing is a note, not a wrong attribute.
NCZARR_HINTS = ("_NCZARR_ATTR", "_nczarr_attr")
# ncdump's names of netCDF's atomic types; any other type name is a user type (enum, here)
NC_ATOMIC_TYPES = frozenset("byte ubyte short ushort int uint int64 uint64 float double char string".split())


# ----------------------------------------------------------------------------- the refs JSON


class Refs:
    """The kerchunk reference set, to tell what kerchunk itself lost from what refmount changed."""

    def __init__(self, refs: dict):
        self.refs = refs.get("refs", refs)

    def _json(self, key: str):
        v = self.refs.get(key)
        if v is None:
            return None
        if isinstance(v, (dict, list)):
            return v
        if isinstance(v, bytes):
            v = v.decode()
        if isinstance(v, str) and v.startswith("base64:"):
            import base64

            v = base64.b64decode(v[7:]).decode()
        return json.loads(v)

    def has_array(self, vpath: str) -> bool:
        return f"{vpath}/.zarray" in self.refs

    def attrs(self, path: str) -> Optional[dict]:
        """The .zattrs of an array or group ('' = root), or None if there is none."""
        return self._json(f"{path}/.zattrs" if path else ".zattrs")

    def zarray(self, vpath: str) -> Optional[dict]:
        return self._json(f"{vpath}/.zarray")

    def describe(self, vpath: str) -> str:
        """What kerchunk wrote for an array, to tell the cause of a wrong value at a glance."""
        z = self.zarray(vpath) or {}
        prefix = f"{vpath}/"
        chunks = sum(1 for k in self.refs if k.startswith(prefix) and not k[len(prefix):].startswith("."))
        return (f"refs: dtype {z.get('dtype')!r} shape {z.get('shape')} fill_value {z.get('fill_value')!r}, "
                f"{chunks} chunk refs")


# ----------------------------------------------------------------------------- values


def _equal_arrays(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "mM" and b.dtype.kind in "mM":
        return bool(np.array_equal(a.view("i8"), b.view("i8")))
    if a.dtype.kind in "fc" and b.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    if a.dtype.kind == "O" or b.dtype.kind == "O":
        return _equal_values(a.tolist(), b.tolist())
    try:
        return bool(np.array_equal(a, b))
    except TypeError:
        return _equal_values(a.tolist(), b.tolist())


def _equal_values(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal_values(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _equal_arrays(a, b)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _squeeze_scalar(src_shape, values, shape) -> Tuple[object, tuple, Optional[str]]:
    """A scalar served as shape [1] (the decoded view's rule) compares as the scalar it holds."""
    if tuple(src_shape) == () and tuple(shape) == (1,):
        return (values.reshape(()) if isinstance(values, np.ndarray) else values), (), "scalar served as [1]"
    return values, tuple(shape), None


def _items_equal(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    if a == b:  # fast path (FILL is one object; only NaNs need the slow path)
        return True
    for x, y in zip(a, b):
        if x is FILL or y is FILL:
            if x is not y:
                return False
        elif not _equal_values(x, y):
            return False
    return True


def _first_item_difference(a: list, b: list) -> str:
    if len(a) != len(b):
        return f"{len(b)} values printed, source has {len(a)}"
    for k, (x, y) in enumerate(zip(a, b)):
        same = (x is FILL and y is FILL) or (x is not FILL and y is not FILL and _equal_values(x, y))
        if not same:
            show = lambda v: "_" if v is FILL else repr(v)  # noqa: E731
            n = sum(1 for p, q in zip(a, b) if not ((p is FILL and q is FILL) or (
                p is not FILL and q is not FILL and _equal_values(p, q))))
            return f"{n} of {len(a)} values differ, first at {k}: mount {show(y)}, source {show(x)}"
    return "values differ"


def _array_difference(src, got, what: str) -> Optional[str]:
    src, got = np.asarray(src), np.asarray(got)
    if src.shape != got.shape:
        return f"{what}: shape {got.shape} != source {src.shape}"
    if _equal_arrays(src, got):
        return None
    try:
        if src.dtype.kind in "fc" and got.dtype.kind in "fc":
            bad = ~((src == got) | (np.isnan(src) & np.isnan(got)))
        else:
            bad = np.asarray(src != got)
        idx = np.argwhere(bad.reshape(src.shape)) if bad.shape == src.shape else []
        if len(idx):
            t = tuple(int(i) for i in idx[0])
            return f"{what}: {len(idx)} of {src.size} values differ, first at {t}: mount {got[t]!r}, source {src[t]!r}"
    except (TypeError, ValueError):
        pass
    return f"{what}: values differ"


# ----------------------------------------------------------------------------- attributes


def _refs_attr_matches_source(client: str, src_value, ref_value) -> bool:
    """Does the refs JSON hold the source's attribute value (ignoring its type, which JSON cannot hold)?"""
    if client == "ncdump":
        atype, toks = src_value
        try:
            if atype in ("char", "string"):
                vals = [unescape_cdl_string(t).decode("utf-8", "replace") for t in toks]
                joined = "".join(vals)
                return ref_value == joined or ref_value == vals or ref_value == vals[:1] * len(vals)
            nums = [parse_cdl_number(t) for t in toks]
        except (ValueError, IndexError):
            return False
    else:
        kind, v = src_value
        if kind in ("str", "bytes") or kind == "json" and isinstance(v, str):
            return ref_value == v or ref_value == [v]
        nums = v if isinstance(v, list) else [v]
    ref = ref_value if isinstance(ref_value, list) else [ref_value]
    if len(ref) != len(nums):
        return False
    def num(x):
        if isinstance(x, str):
            return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(x, x)
        return x
    return _equal_values([num(x) for x in ref], list(nums))


def attr_differences(client: str, src: dict, got: dict, refs_attrs: Optional[dict],
                     zarray: Optional[dict], notes: Optional[list] = None) -> Tuple[List[str], List[str]]:
    """(refmount's differences, kerchunk's losses) between two attribute dicts; a visible NCZarr hint
    attribute goes to ``notes``."""
    wrong, lost = [], []
    refs_attrs = refs_attrs or {}
    for name in sorted(set(src) | set(got)):
        if name == "__error__":
            continue
        if name in NCZARR_HINTS and name not in src:
            if notes is not None:
                notes.append(f"NCZarr hint {name} visible as an attribute")
            continue
        s, g = src.get(name), got.get(name)
        if s is not None and g is not None and _equal_values(list(s), list(g)):
            continue
        if name == "_Encoding" and s is None and g is not None and "utf-8" in repr(g):
            if notes is not None:  # (the decoded view adds it to strings it serves as bytes: xarray then gives text)
                notes.append("_Encoding = utf-8 added to strings served as bytes")
            continue
        if client == "xarray" and g is None and name.lower().startswith("_nc") and name in refs_attrs:
            if notes is not None:  # (xarray's zarr backend drops them from every Zarr store)
                notes.append(f"xarray hides attribute {name!r} (_nc*) of any Zarr store")
            continue
        if client == "ncdump" and s is not None and g is not None and s[0] not in NC_ATOMIC_TYPES:
            lost.append(f"[kerchunk] attribute {name!r} of enum type {s[0]} stored as its base type "
                        f"(mount {_short(g)})")
            continue
        if g is None:  # missing on the mount
            if name not in refs_attrs:
                if name == "_FillValue" and zarray and zarray.get("fill_value") is not None:
                    lost.append(f"[kerchunk] _FillValue missing (moved to .zarray fill_value={zarray['fill_value']!r})")
                else:
                    lost.append(f"[kerchunk] attribute {name!r} missing (not in the refs)")
            elif left_out_for_49(refs_attrs[name]):
                lost.append(f"[left out, logged] attribute {name!r}: netCDF-C 4.9.0 fails the whole open on "
                            "a list of strings, an empty list or null")
            else:
                wrong.append(f"attribute {name!r} missing (the refs have it)")
        elif s is None:  # extra on the mount
            if name in refs_attrs:
                lost.append(f"[kerchunk] extra attribute {name!r}={_short(g)} (kerchunk wrote it)")
            else:
                wrong.append(f"extra attribute {name!r}={_short(g)} (refmount added it)")
        else:
            if name in refs_attrs and not _refs_attr_matches_source(client, s, refs_attrs[name]):
                lost.append(f"[kerchunk] attribute {name!r}: mount {_short(g)}, source {_short(s)} (refs hold {_short(refs_attrs[name])})")
            elif name in refs_attrs and s[0] != g[0]:
                lost.append(f"[kerchunk] attribute {name!r} type: mount {g[0]}, source {s[0]} (JSON carries no type)")
            else:
                wrong.append(f"attribute {name!r}: mount {_short(g)}, source {_short(s)}")
    return wrong, lost


def _short(v, n: int = 80) -> str:
    text = repr(v)
    return text if len(text) <= n else text[: n - 3] + "..."


# ----------------------------------------------------------------------------- per variable


def _same_text(src_items: list, got_items: list) -> bool:
    def text(items):
        return "".join("" if x is FILL else x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
                       for x in items)

    return text(src_items) == text(got_items)


def _same_text_array(src_values, got_values) -> bool:
    """The same text in another of numpy's forms: bytes (char), fixed str, or objects (vlen str), as
    netCDF-C >= 4.10 reads any Zarr '|S' array in zarr mode (netCDF-C's own char arrays included)
    and xarray reads `_Encoding: utf-8` arrays."""
    src, got = np.ma.getdata(src_values), np.ma.getdata(got_values)
    src, got = np.asarray(src), np.asarray(got)
    if src.dtype.kind not in "SUO" or got.dtype.kind not in "SUO":
        return False
    if src.ndim and src.shape[:-1] == got.shape and src.dtype == np.dtype("S1"):
        # xarray joins the characters of the last dimension of a char array into one string (it
        # did not for the source, read through netCDF4-python)
        src = np.array([b"".join(row) for row in src.reshape(-1, src.shape[-1])]).reshape(got.shape)
    if src.shape != got.shape:
        return False

    def text(a):
        items = a.ravel().tolist()
        # (xarray gives NaN for a character it masks as _FillValue: NUL, so no text)
        items = ["" if isinstance(x, float) and math.isnan(x) else x for x in items]
        if not all(isinstance(x, (str, bytes)) for x in items):
            return None
        return [x.decode("utf-8", "replace").rstrip("\0") if isinstance(x, bytes) else x.rstrip("\0") for x in items]

    return text(src) is not None and text(src) == text(got)


def _only_default_fill(raw, differ) -> bool:
    import netCDF4

    raw = np.asarray(raw)
    default = netCDF4.default_fillvals.get(raw.dtype.str[1:])
    return default is not None and bool(np.all(raw[differ] == np.asarray(default, raw.dtype)))


def _default_fill_masked(src_values, got_values) -> bool:
    """xarray on the mount masks (NaN) exactly the points where the source holds netCDF's default fill
    for its type, and equals it elsewhere: the same data under netCDF's own rule (a default fill is a
    missing value), which xarray applies to Zarr's fill_value but not to a netCDF file without
    _FillValue."""
    import netCDF4

    src, got = np.asarray(src_values), np.asarray(got_values)
    if got.dtype.kind in "mM" or got.dtype == np.int64 and src.dtype != np.int64:
        got = got.view("i8")  # (xarray decoded it as a time: masked points are NaT, int64's minimum)
        nat = got == np.iinfo(np.int64).min
        got = np.where(nat, np.nan, got.astype("f8"))
    if src.shape != got.shape or src.dtype.kind not in "iuf" or got.dtype.kind != "f":
        return False
    default = netCDF4.default_fillvals.get(src.dtype.str[1:])
    if default is None:
        return False
    nan = np.isnan(got)
    if not nan.any() or not np.all(src[nan] == np.asarray(default, src.dtype)):
        return False
    rest = ~nan
    return bool(np.array_equal(src[rest].astype("f8"), got[rest].astype("f8")))


def _unpacked_in_float64(src_values, got_values, refs_attrs) -> bool:
    """xarray unpacks in the type of scale_factor/add_offset: the source's float32 ones are plain
    JSON numbers in the refs (float64 to xarray) when their float32 value is also a short float64
    one (0.5, -1.0). The same values, to float32's precision."""
    src, got = np.asarray(src_values), np.asarray(got_values)
    packing = [refs_attrs.get(k) for k in ("scale_factor", "add_offset") if k in (refs_attrs or {})]
    if not packing or not all(isinstance(v, (int, float)) for v in packing):
        return False
    if src.dtype != np.float32 or got.dtype != np.float64 or src.shape != got.shape:
        return False
    return bool(np.allclose(src, got, rtol=1e-6, atol=0, equal_nan=True))


def _native(type_name: str) -> str:
    """A numpy dtype string without its byte order ('>f4' -> 'float32'); other names as they are."""
    try:
        return str(np.dtype(type_name).newbyteorder("="))
    except TypeError:
        return type_name


def _undeclared_fill(refs_attrs, zarray) -> Optional[float]:
    """The fill_value the decoded view does not serve as _FillValue because the refs cannot tell it
    from HDF5's own fill (refmount.view.arrays: 0, or a 1-byte type's netCDF default, in a set without a
    null fill): kerchunk moved the source's _FillValue there and kept no other trace of it."""
    import netCDF4

    if zarray is None or "_FillValue" in (refs_attrs or {}) or zarray.get("fill_value") is None:
        return None
    fill = zarray["fill_value"]
    if not isinstance(fill, (int, float)) or isinstance(fill, bool):
        return None
    dtype = np.dtype(zarray.get("dtype")) if isinstance(zarray.get("dtype"), str) else None
    byte_default = dtype is not None and dtype.itemsize == 1 and fill == netCDF4.default_fillvals.get(dtype.str[1:])
    return fill if fill == 0 or byte_default else None


def _fill_shown_as_data(client: str, src, got_values, fill) -> bool:
    """Do the mount's values differ from the source's only where the source reads as fill and the
    mount shows the refs' fill_value as data?"""
    if client == "ncdump":
        a, b = src.values or [], got_values or []
        shown = [x is FILL and y is not FILL for x, y in zip(a, b)]
        return len(a) == len(b) and any(shown) and all(
            (x is FILL and y is FILL) or (x is not FILL and y is not FILL and _equal_values(x, y))
            or (s and _equal_values(float(y), float(fill))) for x, y, s in zip(a, b, shown))
    if client == "netcdf4":
        smask, gmask = np.ma.getmaskarray(src.values), np.ma.getmaskarray(got_values)
        if smask.shape != gmask.shape:
            return False
        differ = smask != gmask
        return bool(differ.any() and np.all(smask[differ]) and np.all(np.ma.getdata(got_values)[differ] == fill))
    sv, gv = np.asarray(src.values), np.asarray(got_values)
    if sv.shape != gv.shape or sv.dtype.kind != "f" or gv.dtype.kind == "f":
        return False
    nan = np.isnan(sv)
    return bool(nan.any() and np.all(gv[nan] == fill) and np.array_equal(sv[~nan], gv[~nan].astype(sv.dtype)))


def _with_fill_as_data(client: str, src, got, fill):
    """The source snapshot with the points `_fill_shown_as_data` found shown as the mount shows them."""
    import dataclasses

    if client == "ncdump":
        items = [y if x is FILL and y is not FILL else x for x, y in zip(src.values, got.values)]
        return dataclasses.replace(src, values=items)
    if client == "netcdf4":
        values = np.ma.array(np.ma.getdata(src.values), mask=np.ma.getmaskarray(got.values))
        return dataclasses.replace(src, values=values)
    values = np.where(np.isnan(src.values), fill, src.values)
    return dataclasses.replace(src, values=values, type=got.type)


def compare_var(client: str, src, got, refs_attrs, zarray, values_undefined: bool = False
                ) -> Tuple[str, str, List[str]]:
    """(class, reason, notes) of one variable present in both snapshots. ``values_undefined``: the source
    declares _NoFill, so its unwritten points are whatever the disk held; values are not compared."""
    notes: List[str] = []
    if values_undefined:
        notes.append("source has _NoFill: values not compared")
    if got.error:
        return ERROR, got.error, notes
    if client in TOOLS:
        return _compare_tool(client, src, got, refs_attrs, zarray, values_undefined, notes)
    problems: List[str] = []
    lost_values: List[str] = []
    if client == "ncdump" and src.type not in NC_ATOMIC_TYPES and got.type in NC_ATOMIC_TYPES:
        lost_values.append(f"[kerchunk] enum type {src.type} stored as its base type {got.type}")
    elif src.type != got.type and _native(src.type) == _native(got.type):
        # netCDF's types have no byte order: it is how the file stores them (the decoded view
        # serves big-endian data little-endian, the byte order netCDF-C reads from Zarr)
        notes.append(f"byte order: {got.type} (source {src.type})")
    elif src.type != got.type:
        problems.append(f"type {got.type} != source {src.type}")
    fill = _undeclared_fill(refs_attrs, zarray)
    if fill is not None and _fill_shown_as_data(client, src, got.values, fill) and not values_undefined:
        # everything but those points is compared below as usual
        lost_values.append(f"[kerchunk] _FillValue {fill!r} kept only as fill_value, which these refs cannot tell from "
                           "a fill the writer never declared (HDF5's 0, older netCDF-C's byte default): "
                           "served as data, not masked")
        problems = [p for p in problems if not p.startswith("type ")]
        src = _with_fill_as_data(client, src, got, fill)
    if client == "ncdump":
        if tuple(src.dims) != tuple(got.dims):
            if not (src.dims == () and len(got.dims) == 1):
                notes.append(f"dimensions {got.dims} != source {src.dims}")
            else:
                notes.append("scalar served as [1]")
        sv, gv = src.values or [], got.values or []
        if src.type == "string" and got.type == "char" and _same_text(sv, gv):
            # netCDF-C 4.9 has no string type in Zarr: the decoded view serves strings as characters
            # (ncdump prints those split at newlines); the text is what counts
            notes.append("strings served as characters")
            problems = [p for p in problems if not p.startswith("type ")]
        elif not values_undefined and not _items_equal(sv, gv):
            problems.append(_first_item_difference(sv, gv))
    else:
        gvals, gshape, note = _squeeze_scalar(src.shape, got.values, got.shape)
        if note:
            notes.append(note)
            graw = got.raw.reshape(()) if isinstance(got.raw, np.ndarray) else got.raw
        else:
            graw = got.raw
        if _same_text_array(src.raw, graw) if client == "netcdf4" else _same_text_array(src.values, gvals):
            notes.append(f"text read as {np.asarray(gvals).dtype} {tuple(gshape)} "
                         f"(source: {np.asarray(src.values).dtype} {tuple(src.shape)})")
            problems = [p for p in problems if not p.startswith("type ")]
        elif tuple(src.shape) != gshape:
            problems.append(f"shape {tuple(got.shape)} != source {tuple(src.shape)}")
        elif values_undefined:  # (whether xarray masks undefined points, and so turns ints into floats, is moot)
            problems = [p for p in problems if not p.startswith("type ")]
        elif client == "netcdf4":
            smask, gmask = np.ma.getmaskarray(src.values), np.ma.getmaskarray(gvals)
            if not np.array_equal(smask, gmask) and _only_default_fill(src.raw, smask != gmask):
                # a fully written array holding netCDF's default fill: served without a fill so that
                # xarray keeps integers integers, netCDF-C then does not mask those points
                notes.append("netCDF's default fill not masked on the mount (no fill served)")
            elif not np.array_equal(smask, gmask):
                k = int(np.count_nonzero(smask != gmask))
                problems.append(f"mask: {k} of {smask.size} points differ (mount masks "
                                f"{int(gmask.sum())}, source {int(smask.sum())})")
            else:
                sd = np.ma.getdata(src.values)[~smask] if smask.ndim else (
                    np.ma.getdata(src.values) if not smask else np.array([]))
                gd = np.ma.getdata(gvals)[~gmask] if gmask.ndim else (
                    np.ma.getdata(gvals) if not gmask else np.array([]))
                d = _array_difference(sd, gd, "masked values")
                if d:
                    problems.append(d)
            d = _array_difference(src.raw, graw, "raw values")
            if d:
                problems.append(d)
            if np.asarray(src.raw).dtype.newbyteorder("=") != np.asarray(graw).dtype.newbyteorder("="):
                problems.append(f"raw dtype {np.asarray(graw).dtype} != source {np.asarray(src.raw).dtype}")
        elif _default_fill_masked(src.values, gvals):
            notes.append("netCDF's default fill masked by xarray (NaN, or NaT for a time) on the mount")
            problems = [p for p in problems if not p.startswith("type ")]
        elif _unpacked_in_float64(src.values, gvals, refs_attrs):
            lost_values.append("[kerchunk] scale_factor/add_offset hold float32 values JSON cannot mark as "
                               "float32: xarray unpacks in float64 (same values)")
            problems = [p for p in problems if not p.startswith("type ")]
        else:
            d = _array_difference(src.values, gvals, "values")
            if d:
                problems.append(d)
        if tuple(src.dims) != tuple(got.dims) and not note:
            notes.append(f"dimensions {got.dims} != source {src.dims}")
    wrong_attrs, lost = attr_differences(client, src.attrs, got.attrs, refs_attrs, zarray, notes)
    problems += wrong_attrs
    lost = lost_values + lost
    if problems:
        return WRONG, "; ".join(problems + lost), notes
    if lost:
        return LOST, "; ".join(lost), notes
    return IDENTICAL, "", notes


# ----------------------------------------------------------------------------- NCO, CDO and GDAL

PACKING = ("scale_factor", "add_offset")

TOOLS = ("nco", "cdo", "gdal")
# CDO takes the unlimited dimension for time; netCDF-C 4.9.0 has none in Zarr, so CDO takes the first
# variable with time units (in the order netCDF-C lists them) and skips the others, saying so
CDO_TIME_AXIS = ("CDO took this variable for its time axis, or skipped it for another one (as it says): netCDF-C "
                 "4.9.0 has no unlimited dimension in Zarr, which CDO takes for time in the source")
# GDAL's drivers show these attributes' meaning as the array's unit, scale and offset (the Zarr driver
# only then); those are compared instead
GDAL_AS_PROPERTIES = {"units": "(unit)", "scale_factor": "(scale)", "add_offset": "(offset)"}


# netCDF's default fill per GDAL type name (netcdf.h NC_FILL_*)
_NC_DEFAULT_FILL = {"Int16": -32767, "Int32": -2147483647, "UInt16": 65535, "UInt32": 4294967295,
                    "Float32": 9.969209968386869e36, "Float64": 9.969209968386869e36}


def _gdal_raster_properties(src_type: str, src_attrs: dict, got_attrs: dict) -> list[str]:
    """GDAL's form serves the nodata and unit GDAL's netCDF driver gives a *raster band* (gdalinfo):
    netCDF's default fill where there is no _FillValue, and a `UNITS` of any case. Its multidimensional
    API (gdalmdiminfo, which this harness runs) shows neither for the source: those two are notes."""
    notes = []
    nodata = got_attrs.get("(nodata_value)")
    default = _NC_DEFAULT_FILL.get(src_type)
    if "(nodata_value)" not in src_attrs and nodata is not None and default is not None:
        bits = int(re.sub(r"\D", "", src_type))
        if (np.float32(nodata[1]) == np.float32(default) if src_type == "Float32" else nodata[1] == default) or (
                src_type.startswith("Int") and nodata[1] == default + (1 << bits)):
            del got_attrs["(nodata_value)"]
            notes.append("nodata: netCDF's default fill, GDAL's raster nodata for the source")
    unit = got_attrs.get("(unit)")
    if "(unit)" not in src_attrs and unit is not None and any(
            name.lower() == "units" and value == unit for name, value in src_attrs.items()):
        del got_attrs["(unit)"]
        notes.append("unit from the source's UNITS, as GDAL's netCDF raster driver reads it")
    return notes


def _unwrap_scalar(src_dims, got_dims, values):
    """A scalar served as [1] to netCDF-C 4.9 (which cannot read a Zarr scalar) compares as its value."""
    if tuple(src_dims) == () and len(got_dims) == 1 and isinstance(values, list) and len(values) == 1:
        return values[0], True
    return values, False


def _text(values) -> Optional[str]:
    """The text of printed character data (strings, or lists of them), NULs and padding aside."""
    if isinstance(values, str):
        return values.rstrip("\0")
    if isinstance(values, list) and all(isinstance(v, (str, list)) for v in values):
        parts = [_text(v) for v in values]
        # (ncks prints a 2-D char array's rows with an empty string after them)
        return None if None in parts else "\x1e".join(parts).rstrip("\x1e")
    return None


def _compare_tool(client, src, got, refs_attrs, zarray, values_undefined, notes):
    problems: List[str] = []
    lost: List[str] = []
    src_attrs, got_attrs = dict(src.attrs), dict(got.attrs)
    if client == "cdo":
        a, b = src.values or [], got.values or []
        if not values_undefined and a != b:
            integers = [k for k in PACKING if isinstance((refs_attrs or {}).get(k), int)]
            if integers:  # (CDO 2.1 ignores an int64 add_offset: applied on the mount, where it is an int)
                lost.append(f"[kerchunk] {'/'.join(integers)} a JSON integer (the source's integer type is lost): "
                            f"CDO unpacks differently ({_cdo_difference(a, b)})")
            else:
                problems.append(_cdo_difference(a, b))
    elif _user_type(client, src.type) and not _user_type(client, got.type):
        # (an enum is stored as its base type, a vlen of numbers as the text of its values' repr)
        lost.append(f"[kerchunk] user-defined type {src.type} stored as {got.type}")
    else:
        values, squeezed = _unwrap_scalar(src.dims, got.dims, got.values)
        if squeezed:
            notes.append("scalar served as [1] (netCDF-C 4.9.0 cannot read a Zarr scalar: docs/views-and-clients.md)")
        elif tuple(src.dims) != tuple(got.dims):
            notes.append(f"dimensions {got.dims} != source {src.dims}")
        same_text = _text(src.values) is not None and _text(src.values) == _text(values)
        if src.type != got.type and same_text:
            notes.append(f"text read as {got.type} (source: {src.type})")
        elif src.type != got.type and _native(src.type) != _native(got.type):
            problems.append(f"type {got.type} != source {src.type}")
        if not squeezed and tuple(src.shape) != tuple(got.shape) and not same_text:
            problems.append(f"shape {tuple(got.shape)} != source {tuple(src.shape)}")
        elif not values_undefined and not same_text and not _equal_values(src.values, values):
            problems.append(_array_difference(np.asarray(src.values, dtype=object), np.asarray(values, dtype=object),
                                              "values") or "values differ")
        if client == "gdal":
            refs_attrs = dict(refs_attrs or {})
            for name, prop in GDAL_AS_PROPERTIES.items():
                for attrs in (src_attrs, got_attrs):
                    attrs.pop(name, None)
                if name in refs_attrs:  # (what the refs hold of it, for telling kerchunk's losses)
                    refs_attrs[prop] = refs_attrs.pop(name)
            notes += _gdal_raster_properties(src.type, src_attrs, got_attrs)
    wrong_attrs, lost_attrs = attr_differences(client, src_attrs, got_attrs, refs_attrs, zarray, notes)
    problems += wrong_attrs
    lost += lost_attrs
    if problems:
        return WRONG, "; ".join(problems + lost), notes
    if lost:
        return LOST, "; ".join(lost), notes
    return IDENTICAL, "", notes


def _user_type(client: str, type_name: str) -> bool:
    """A netCDF user-defined type (enum, vlen, compound, opaque) as the client names it."""
    if client == "nco":
        return type_name not in NC_ATOMIC_TYPES
    if client == "gdal":  # (GDAL: its own type names; "Unknown" for what it cannot map, compounds by members)
        return type_name == "Unknown" or type_name.startswith("{")
    return False


def _cdo_difference(a: list, b: list) -> str:
    if len(a) != len(b):
        return f"{len(b)} rows of infon, source has {len(a)}"
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"infon row {k}: mount {' '.join(y)}, source {' '.join(x)}"
    return "infon differs"


def group_label(gpath: str) -> str:
    return f"(attributes of /{gpath})"


def compare_snapshots(client: str, src: dict, got: dict, refs: Refs, nofill=frozenset()) -> List[dict]:
    """One row per source variable and per source group: {var, class, reason, notes}.
    ``nofill``: paths of source variables with _NoFill (see compare_var)."""
    rows = []
    for gpath, sattrs in src["groups"].items():
        label = group_label(gpath)
        if "__error__" in sattrs:
            rows.append(dict(var=label, cls=SOURCE_UNREADABLE, reason=sattrs["__error__"], notes=[]))
            continue
        gattrs = got["groups"].get(gpath)
        if gattrs is None:
            cls, reason = (ERROR, got["error"]) if got["error"] else (HIDDEN, "group absent from the mount")
            rows.append(dict(var=label, cls=cls, reason=reason, notes=[]))
            continue
        if "__error__" in gattrs:
            rows.append(dict(var=label, cls=ERROR, reason=gattrs["__error__"], notes=[]))
            continue
        notes: List[str] = []
        wrong, lost = attr_differences(client, sattrs, gattrs, refs.attrs(gpath), None, notes)
        cls = WRONG if wrong else LOST if lost else IDENTICAL
        rows.append(dict(var=label, cls=cls, reason="; ".join(wrong + lost), notes=notes))
    for vpath, sv in src["vars"].items():
        if sv.error:
            rows.append(dict(var=vpath, cls=SOURCE_UNREADABLE, reason=sv.error, notes=[]))
            continue
        gv = got["vars"].get(vpath)
        if gv is None:
            gpath = vpath.rpartition("/")[0]
            gerr = got["groups"].get(gpath, {}).get("__error__")
            if got["error"] or gerr:
                rows.append(dict(var=vpath, cls=ERROR, reason=got["error"] or gerr, notes=[]))
            elif vpath in got.get("cdo_time_skipped", ()) and vpath not in src.get("cdo_time_skipped", ()):
                rows.append(dict(var=vpath, cls=HIDDEN, reason=CDO_TIME_AXIS, notes=[], limitation=True))
            else:
                rows.append(dict(var=vpath, cls=HIDDEN, reason="", notes=[]))
            continue
        cls, reason, notes = compare_var(client, sv, gv, refs.attrs(vpath), refs.zarray(vpath), vpath in nofill)
        if cls == WRONG:
            notes.append(refs.describe(vpath))
        rows.append(dict(var=vpath, cls=cls, reason=reason, notes=notes))
    return rows


def same_outcome(a: List[dict], b: List[dict]) -> Dict[str, bool]:
    """Per variable: do two comparisons (mount and its cp -r copy) give the same class and reason?"""
    bmap = {r["var"]: r for r in b}
    return {r["var"]: (r["var"] in bmap and bmap[r["var"]]["cls"] == r["cls"]
                       and bmap[r["var"]]["reason"] == r["reason"]) for r in a}
