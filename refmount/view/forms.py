"""The metadata forms of the decoded view: what each kind of reader reads right.

No one Zarr form of netCDF data reads right in every client (NOTES §2, §6; measured again for
issues 24 and 32, see docs/views-and-clients.md):

- netCDF-C 4.9.0 (Debian 12's ncdump, NCO, CDO) reads characters only as its own '<U1' (one byte
  each) and crashes on any '|S'; it crashes reading a rank-0 array in every mode (also one its own
  nccopy wrote), so a scalar must be [1]; it fails the whole open on attributes that are lists of
  strings, [] or null; it types attributes right only with the `_NCZARR_ATTR` hint.
- netCDF-C >= 4.9.3 (Debian 13's 4.9.3, the netCDF4 wheels' 4.10.1) fails the whole open on '<U1'.
  In nczarr mode (`#mode=nczarr,file`) it reads the NCZarr keys its own nccopy writes in .zattrs
  (`_nczarr_superblock`, `_nczarr_group`, `_nczarr_array`, `_nczarr_attr`), and then reads '>S1' as
  char, [1] marked "scalar" as a scalar, and each dimension in its group, as in the source file; in
  zarr mode it ignores them (one-character strings, `_scalar_`), as on its own stores. It reads an
  empty '|Sn' string as NULL, which NCO 5.3 crashes on: 4.9.x gets strings as characters.
- zarr-python/xarray cannot read '<U1' holding one byte per character; they take real scalars.
- GDAL's Zarr driver ignores `_Unsigned` (65535 reads as -1): it needs the unsigned dtype; it reads
  '|S1' and '|Sn' as text, and real scalars.

So every metadata file (.zarray, .zattrs, .zmetadata) is served in the form of the program that
opens it (refmount.fuse.readers tells which). The form belongs to the process, not to the library in
it: a Python process with netCDF-C loaded gets NCZarr's '>S1', which zarr-python 3 refuses. So Zarr
v3's zarr.json is served beside the v2 files, in the `zarr` form (`zarr_json_form`,
refmount.view.zarrjson), to the processes in other forms (`sees_zarr_json`): zarr-python 3 opens it
first, netCDF-C and GDAL never do. A `Form` is a set of choices; `served_array` derives
an array's metadata in a form from its base plan (refmount.view.arrays: the netCDF-C 4.9 form, with
both hints); the NCZarr forms' `_nczarr_group` and `_nczarr_array` come from `nczarr_tree`, made of
every array as the form serves it. Chunk files are the same bytes in every form: characters are one
byte each in all of them, a scalar's one chunk is "0" at [] and at [1], an unsigned dtype reinterprets
the same bytes. Strings served as characters ('<U1', '>S1' or u1 with a last dimension) have their
chunk keys with an added ".0" as well (decoded.py); the forms that serve them as |Sn use the original
keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from refmount.view.arrays import CHAR_DTYPE_49, SCALAR_DIMENSION, ArrayInfo
from refmount.view.ncattrs import (HINT_49, HINT_410, HINT_KEYS, NCZARR_JSON, VARIABLE_TYPED, is_string_list,
                                   nczarr_types)

CHARS = ("char", "string", "ubyte", "gdal", "nczarr", "nczarr_strings")
# NCZarr's own keys (netCDF-C >= 4.9.3 reads them from .zattrs, 4.9.0 spelled them in capitals)
NCZARR_SUPERBLOCK, NCZARR_GROUP, NCZARR_ARRAY = "_nczarr_superblock", "_nczarr_group", "_nczarr_array"
NCZARR_VERSION = "2.0.0"  # the version netCDF-C 4.9.3 and 4.10.1 write
ANONYMOUS_DIMENSION = "_Anonymous_Dim_{}"  # netCDF-C's name of a Zarr dimension that has none (by length)


@dataclass(frozen=True)
class Form:
    name: str
    # "char": netCDF-C 4.9's '<U1'; "string": '|S1' and '|Sn'; "ubyte": '|u1' numbers; "gdal": as GDAL's
    # netCDF driver shows them, a 2-D char array as strings, others as bytes; "nczarr": NCZarr's own '>S1'
    # (char in nczarr mode, one-character strings in zarr mode), strings as for "char"; "nczarr_strings":
    # '>S1', strings '|Sn'
    chars: str
    zarr_scalars: bool  # a scalar as shape [] (else [1] with dimension _scalar_)
    hints: tuple  # the NCZarr attribute type hints kept (each netCDF-C shows the other one as text)
    all_attributes: bool  # keep attributes netCDF-C 4.9.0 fails the whole open on (JSON readers take them)
    unsigned_dtype: bool  # `_Unsigned` integers as an unsigned dtype (GDAL ignores `_Unsigned`)
    # fill_value is the nodata GDAL's netCDF driver gives the source (_FillValue, else missing_value,
    # else none); missing chunks are then served as files (decoded.py) so that they still read as fill
    nodata_fill: bool = False
    # strings served as UTF-8 bytes get `_Encoding: utf-8`, so that xarray's zarr engine gives str as for
    # the source; not for netCDF-C >= 4.10, which reads '|Sn' as strings itself (and xarray's netcdf4
    # engine then fails to decode them again)
    encoding_attribute: bool = False
    # NCZarr's own metadata as netCDF-C >= 4.9.3 writes it: `_nczarr_superblock` at the root, `_nczarr_group`
    # (dimensions, arrays, subgroups) in each group's .zattrs, `_nczarr_array` (dimension references; a
    # scalar as [1] with none) in each array's, every attribute typed in `_nczarr_attr`. Read in nczarr mode
    # (`#mode=nczarr,file`); in zarr mode netCDF-C ignores it, as on its own stores.
    nczarr: bool = False
    # of the attributes netCDF-C 4.9.0 fails the open on, lists of strings are kept (typed NC_STRING in
    # `_nczarr_attr`, which netCDF-C >= 4.10 reads; 4.9.3's reading of them is not measured here)
    string_lists: bool = False
    description: str = ""

    def with_chars(self, chars: str | None) -> "Form":
        return self if chars is None or chars == self.chars else dataclasses.replace(self, chars=chars)


NC49 = Form("nc49", chars="char", zarr_scalars=False, hints=(HINT_49,), all_attributes=False,
            unsigned_dtype=False,
            description="netCDF-C 4.9.0 and older (Debian 12's ncdump, NCO, CDO): characters '<U1', scalars [1], "
                        "_NCZARR_ATTR hints")
NC493 = Form("nc493", chars="nczarr", zarr_scalars=False, hints=(HINT_410,), all_attributes=False,
              unsigned_dtype=False, nczarr=True,
              description="netCDF-C 4.9.3 to 4.9.x (Debian 13's ncdump, NCO, CDO: 4.9.3): NCZarr's own metadata, "
                          "as its nccopy writes it; in #mode=nczarr,file characters are char ('>S1'), scalars "
                          "scalars, dimensions in their groups; strings as characters (netCDF-C reads an empty "
                          "NCZarr string as NULL, which crashes NCO); #mode=zarr,file reads it as netCDF-C reads "
                          "its own stores (characters as one-character strings, scalars over _scalar_)")
NC410 = Form("nc410", chars="nczarr_strings", zarr_scalars=False, hints=(HINT_410,), all_attributes=False,
             unsigned_dtype=False, nczarr=True, string_lists=True,
             description="netCDF-C >= 4.10 (netCDF4-python wheels): as nc493, with strings as strings ('|Sn')")
ZARR = Form("zarr", chars="string", zarr_scalars=True, hints=(), all_attributes=True, unsigned_dtype=False,
            encoding_attribute=True,
            description="programs without netCDF-C or GDAL (zarr-python, xarray's zarr engine, cp): '|S1', "
                        "real scalars, every attribute")
GDAL = Form("gdal", chars="gdal", zarr_scalars=True, hints=(), all_attributes=True, unsigned_dtype=True,
            nodata_fill=True,
            description="GDAL's Zarr driver: characters as GDAL's netCDF driver shows them (2-D as strings), "
                        "real scalars, `_Unsigned` integers as unsigned dtypes, fill_value as its nodata")
PORTABLE = Form("portable", chars="ubyte", zarr_scalars=False, hints=(HINT_49, HINT_410), all_attributes=False,
                unsigned_dtype=False,
                description="programs that cannot be identified: characters as numbers, scalars [1], both hints "
                            "(no reader crashes on it)")
FORMS = {f.name: f for f in (NC49, NC493, NC410, ZARR, GDAL, PORTABLE)}
FALLBACK = PORTABLE.name  # the form of a reader that cannot be identified


def zarr_json_form(forms: list[Form]) -> int | None:
    """The index in `forms` of the form in which Zarr v3's zarr.json is served, or None: no zarr.json.
    zarr-python 3 (3.1, 3.4) opens zarr.json rather than .zgroup when both exist and no zarr_format is
    named (xarray.open_zarr, consolidated or not), and reads it right in the `zarr` form; netCDF-C
    (4.9.0, 4.10.1, in zarr and nczarr mode) and GDAL's Zarr driver (3.6, 3.10) read the v2 files and
    never open zarr.json (measured: NOTES §6). So one process may use both. Only where forms are
    served by reader: with one form for everyone (`--form`) every file is that form's."""
    if len(forms) < 2:
        return None
    return next((n for n, f in enumerate(forms) if f.name == ZARR.name), None)


def sees_zarr_json(form: Form) -> bool:
    """Does a process served `form` find zarr.json (by its name: no listing shows it)? Not one in the
    `zarr` form: its zarr-python reads the v2 files right, and with zarr.json beside .zgroup it would
    warn at every open ("Both zarr.json (Zarr format 3) and .zgroup (Zarr format 2) metadata objects
    exist"). Every other one (netCDF-C's, GDAL's, unidentified) does: its zarr-python cannot read, or
    reads other values from, the v2 files in its form. Not listed, so that `cp -r`, `ls` and netCDF-C's
    listings see the v2 store they saw before."""
    return form.name != ZARR.name


def kept_attributes(left_out: dict, form: Form) -> dict:
    """Of the attributes left out for netCDF-C 4.9.0, those that `form`'s readers take."""
    if form.all_attributes:
        return left_out
    return {k: v for k, v in left_out.items() if form.string_lists and is_string_list(v)}


def served_array(info: ArrayInfo, form: Form, tree: "NCZarrTree | None" = None) -> tuple[dict, dict]:
    """(.zarray, .zattrs) of a planned, visible array in `form` (an NCZarr form's `_nczarr_array` comes
    from `tree`, made of every array's served metadata: `nczarr_tree`)."""
    z, a = dict(info.out_zarray), dict(info.zattrs)
    if z["dtype"] == CHAR_DTYPE_49:
        _characters(info, form, z, a)
    if info.scalar and form.zarr_scalars:
        z["shape"], z["chunks"] = [], []
        dims = a.get("_ARRAY_DIMENSIONS")
        if isinstance(dims, list) and dims[:1] == [SCALAR_DIMENSION]:
            a["_ARRAY_DIMENSIONS"] = dims[1:]
    if form.unsigned_dtype:
        _unsigned(z, a)
    if info.zarr_fill and form.name == ZARR.name:  # (xarray on the store masks no v3 fill: nor here)
        z["fill_value"] = None
        a.pop("_FillValue", None)
    if info.undeclared_fill:  # (a reader masks fill_value: this one is data; never-written chunks are files)
        z["fill_value"] = None
    if form.nodata_fill and info.dtype is not None and info.dtype.kind in "iuf" and not info.no_nodata:
        z["fill_value"] = _nodata(a, info.dtype, np.dtype(z["dtype"]))
    if form.name == GDAL.name:
        _gdal_units(a)
    served_hints(a, form)
    a.update(kept_attributes(info.left_out, form))
    if form.nczarr:
        a[HINT_410] = {"types": nczarr_types(a, z["dtype"])}
        if tree is not None and info.path in tree.references:
            _add_json(a, NCZARR_ARRAY, {"dimension_references": tree.references[info.path], "storage": "chunked",
                                        **({"scalar": 1} if info.scalar else {})})
    return z, a


def served_group_attributes(attrs: dict, left_out: dict, form: Form, path: str = "",
                            tree: "NCZarrTree | None" = None) -> dict:
    """A group's .zattrs in `form` (an NCZarr form's `_nczarr_group` comes from `tree`)."""
    a = dict(attrs)
    served_hints(a, form)
    a.update(kept_attributes(left_out, form))
    if form.nczarr:
        a[HINT_410] = {"types": nczarr_types(a, None)}
        if tree is not None and path in tree.groups:
            _add_json(a, NCZARR_GROUP, tree.groups[path])
            if not path:
                _add_json(a, NCZARR_SUPERBLOCK, {"version": NCZARR_VERSION})
    return a


def _add_json(a: dict, key: str, value: dict) -> None:
    """One of NCZarr's own keys, typed as its writer types them."""
    a[key] = value
    a[HINT_410]["types"].update({key: NCZARR_JSON, HINT_410: NCZARR_JSON})


@dataclass
class NCZarrTree:
    """What NCZarr's own metadata says of the tree: in nczarr mode netCDF-C >= 4.9.3 takes a group's
    dimensions, arrays and subgroups from its `_nczarr_group` (it lists no directory), and each
    array's dimensions from the absolute paths in its `_nczarr_array`."""
    groups: dict  # group path ("" the root) -> {"dimensions": {name: length}, "arrays": [...], "groups": [...]}
    references: dict  # array path -> its dimension references (["/site", "/obs/n"]; [] for a scalar)


def nczarr_tree(groups: list[str], arrays: list[tuple[ArrayInfo, dict, dict]]) -> NCZarrTree:
    """The NCZarr tree of the visible `groups` (paths of directories with a .zgroup, "" the root)
    and the visible arrays with their (.zarray, .zattrs) as an NCZarr form serves them. A dimension is
    defined in the group kerchunk names it by ("obs/n": group obs; the netCDF-4 source's own), else
    in the root, as netCDF-C's zarr mode defines every named dimension; one without a name is
    netCDF-C's `_Anonymous_Dim_<length>` in the root. A name given two lengths in one group gets
    the second as '<name>_<length>' (the decoded view's rename)."""
    known = set(groups)
    tree = NCZarrTree({g: {"dimensions": {}, "arrays": [], "groups": []} for g in groups}, {})
    for g in groups:
        parent = g.rpartition("/")[0]
        if g and parent in known:
            tree.groups[parent]["groups"].append(g.rpartition("/")[2])
    for info, z, a in arrays:
        group = info.path.rpartition("/")[0]
        if group not in known:
            continue  # (in a directory that is no group: nczarr mode does not see it)
        tree.groups[group]["arrays"].append(info.path.rpartition("/")[2])
        if info.scalar:
            tree.references[info.path] = []
            continue
        shape, dims = z["shape"], a.get("_ARRAY_DIMENSIONS")
        if not (isinstance(dims, list) and len(dims) == len(shape) and all(isinstance(d, str) and d for d in dims)):
            dims = [ANONYMOUS_DIMENSION.format(n) for n in shape]
        original = {new: old for old, new in info.renamed_dims.items()}
        references = []
        for name, length in zip(dims, shape):
            home, _, base = original.get(name, name).strip("/").rpartition("/")
            if home not in known or not (home == "" or group == home or group.startswith(home + "/")):
                home, base = "", name
            defined = tree.groups[home]["dimensions"]
            if defined.setdefault(base, length) != length:
                base = f"{base}_{length}"
                defined.setdefault(base, length)
            references.append(f"/{home}/{base}" if home else f"/{base}")
        tree.references[info.path] = references
    return tree


def served_hints(attrs: dict, form: Form) -> None:
    for key in HINT_KEYS:
        if key not in form.hints:
            attrs.pop(key, None)


def joins_last_dimension(info: ArrayInfo, form: Form) -> bool:
    """Does `form` serve this char array's rows as '|Sn' strings of its last dimension? "gdal" does
    so for a 2-D char array, as GDAL's netCDF driver shows it (1-D and 3-D ones are bytes: measured,
    GDAL 3.6). Only where one chunk spans that dimension (a chunk's bytes are then whole strings), with
    the "." separator: the chunk "i.0" of the characters is the chunk "i" of the strings (decoded.py)."""
    if form.chars != "gdal" or info.out_zarray["dtype"] != CHAR_DTYPE_49:
        return False
    shape, chunks = info.out_zarray["shape"], info.out_zarray["chunks"]
    return (not info.strlen and not info.scalar and len(shape) == 2 and chunks[-1] == shape[-1] > 0
            and info.separator == "." and not info.lazy)


def _drop_last_dimension(z: dict, a: dict) -> None:
    z["shape"], z["chunks"] = z["shape"][:-1], z["chunks"][:-1]
    dims = a.get("_ARRAY_DIMENSIONS")
    if isinstance(dims, list) and dims:
        a["_ARRAY_DIMENSIONS"] = dims[:-1]


def _characters(info: ArrayInfo, form: Form, z: dict, a: dict) -> None:
    if form.chars == "ubyte":
        z["dtype"] = "|u1"
    elif form.chars == "gdal":
        if info.strlen or joins_last_dimension(info, form):
            z["dtype"] = f"|S{info.strlen or z['shape'][-1]}"
            _drop_last_dimension(z, a)
        else:
            z["dtype"] = "|u1"
    elif form.chars in ("nczarr", "nczarr_strings"):
        # NCZarr's char, '|S1' said big-endian. Strings: '|Sn' as they are, or (for 4.9.x) with their
        # added last dimension as in "char": netCDF-C (4.9.3, 4.10.1) reads an empty '|Sn' string as a
        # NULL pointer, which ncdump prints as NIL and NCO 5.3 crashes on (the whole dump; on netCDF-C's
        # own NCZarr stores too), while netCDF4-python reads it as ''
        z["dtype"] = ">S1"
        if info.strlen and form.chars == "nczarr_strings":
            z["dtype"] = f"|S{info.strlen}"
            _drop_last_dimension(z, a)
    elif form.chars == "string":
        z["dtype"] = "|S1"
        if info.strlen:  # |Sn as it is: the added last dimension goes
            z["dtype"] = f"|S{info.strlen}"
            _drop_last_dimension(z, a)
        if info.recode_from is not None and form.encoding_attribute and "_Encoding" not in a:
            a["_Encoding"] = "utf-8"


# netCDF's default fill of each type (netcdf.h NC_FILL_*): what a value never written reads as. Not for
# 64-bit integers: GDAL 3.6's Zarr driver reads their nodata through a double (2**63 - 1 for int64's)
_NC_DEFAULT_FILL = {"i2": -32767, "i4": -2147483647, "u2": 65535, "u4": 4294967295,
                    "f4": 9.969209968386869e36, "f8": 9.969209968386869e36}


def _nodata(a: dict, source: np.dtype, served: np.dtype):
    """GDAL's netCDF driver's nodata: _FillValue, else missing_value, else netCDF's default fill of
    the variable's type, except for bytes (measured, GDAL 3.6: values never written are nodata; a
    signed type with `_Unsigned` gets its default fill as the unsigned value, -32767 as 32769)."""
    for name in ("_FillValue", "missing_value"):
        value = a.get(name)
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return value
    default = _NC_DEFAULT_FILL.get(f"{source.kind}{source.itemsize}")
    if default is not None and served.kind == "u" and source.kind == "i":
        default += 1 << (8 * source.itemsize)
    return default


def _gdal_units(a: dict) -> None:
    """GDAL's Zarr driver takes a band's unit only from `units`; its netCDF driver from the first
    attribute of that name in any case (`UNITS`, `Units`): that one is added as `units` too."""
    if "units" not in a:
        other = next((name for name in a if name.lower() == "units"), None)
        if other is not None and isinstance(a[other], str):
            a["units"] = a[other]


def _unsigned(z: dict, a: dict) -> None:
    """A signed integer with `_Unsigned = "true"` as the unsigned type of its size: the same bytes;
    its fill and the attributes that have the variable's type (CF) as that type's values, as GDAL's
    netCDF driver shows them for the source. `_Unsigned` stays: GDAL shows it for the source too."""
    if str(a.get("_Unsigned", "")).lower() != "true":
        return
    dtype = np.dtype(z["dtype"])
    if dtype.kind != "i":
        return
    unsigned = np.dtype(f"{dtype.byteorder if dtype.itemsize > 1 else '|'}u{dtype.itemsize}")
    z["dtype"] = unsigned.str
    modulus = 1 << (8 * dtype.itemsize)

    def convert(v):
        if isinstance(v, list):
            return [convert(x) for x in v]
        if isinstance(v, int) and not isinstance(v, bool) and v < 0:
            return v + modulus
        return v

    z["fill_value"] = convert(z.get("fill_value"))
    for name in VARIABLE_TYPED:
        if name in a:
            a[name] = convert(a[name])


def form_notes(info: ArrayInfo) -> dict[str, str]:
    """What each form serves of this array (dtype, shape, fill, hints, how the NCZarr forms read), where
    forms differ (for `refmount inspect`); {} when every form serves the same .zarray."""
    out = {}
    for name, form in FORMS.items():
        z, a = served_array(info, form)
        notes = [k for k in HINT_KEYS if k in a]
        if form.nczarr:  # (its reading in nczarr mode: the form is exact only there)
            notes.append("NCZarr keys" + (": a scalar in #mode=nczarr,file" if info.scalar else
                                          ": char in #mode=nczarr,file" if z["dtype"] == ">S1" else ""))
        out[name] = (f"{z['dtype']} {z['shape']} fill {z.get('fill_value')!r}"
                     + (f" ({', '.join(notes)})" if notes else ""))
    shown = {v.split(" (")[0] for v in out.values()}
    return out if len(shown) > 1 else {}
