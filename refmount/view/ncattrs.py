"""Attributes as netCDF-C reads them from a ``.zattrs`` file (the decoded view's metadata).

kerchunk moves a variable's ``_FillValue`` into ``.zarray`` ``fill_value`` and writes every
attribute as plain JSON, so the netCDF type of an attribute is lost. netCDF-C then guesses a type
from the JSON, and each version guesses differently (measured, NOTES §6):

- 4.9.0 gives an integer the smallest type that holds it (7 -> byte, 200 -> ubyte), every float
  double, and types a numeric list by its first element ([1, 2.5] -> bytes 1, 2);
- 4.10.x gives integers int (int64 when needed) and floats double;
- ncdump 4.9.0 prints ``_`` only when ``_FillValue`` has the variable's own type; 4.10 converts it.

NCZarr's type hints fix the types, but each version reads only its own spelling and shows the other
one as an ordinary attribute: 4.9.0 reads ``_NCZARR_ATTR``, 4.9.1 and later ``_nczarr_attr`` (both
``{"types": {name: dtype}}``). So a hint is written for a version only when that version would
otherwise get a type wrong, and only for types we know (the NCZarr forms of 4.9.3 and later type
every number, as netCDF-C's own writer does: `nczarr_types`):

- ``_FillValue`` (added from ``fill_value`` when absent), ``missing_value``, ``valid_*``, ``flag_values``
  and ``flag_masks`` have the variable's type (CF) whenever their values fit it exactly;
- a float that is exactly a float32 with a shorter float32 spelling (0.10000000149011612) was a
  float32 (kerchunk writes float32 attributes that way);
- other integers are int, or int64/uint64 when they do not fit.
"""

from __future__ import annotations

import base64
import binascii
import math

import numpy as np

from refmount.errors import quote

HINT_49 = "_NCZARR_ATTR"  # read (and hidden) by netCDF-C 4.9.0 (4.9.1 and 4.9.2 read both)
HINT_410 = "_nczarr_attr"  # read (and hidden) by netCDF-C >= 4.9.3
HINT_KEYS = (HINT_49, HINT_410)
# CF: these have the data type of the variable (the packed type for packed data).
VARIABLE_TYPED = ("_FillValue", "missing_value", "valid_min", "valid_max", "valid_range", "flag_values", "flag_masks")
PACKING = ("scale_factor", "add_offset")  # CF: both have the type of the unpacked data
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_INT_LADDER_49 = [np.dtype(t) for t in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8")]


def base64_fill(value, dtype: np.dtype) -> float | None:
    """xarray writes a float `_FillValue` attribute of Zarr v3 as base64 of its float64 bytes, and
    VirtualiZarr 2.8 writes it so into Zarr v2 (kerchunk) attributes too: the number, or None."""
    if dtype.kind != "f" or not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return float(np.frombuffer(raw, "<f8")[0]) if len(raw) == 8 else None


def fill_number(fill, dtype: np.dtype):
    """A .zarray fill_value as a Python number of the array's type (None if not numeric)."""
    if isinstance(fill, str):
        fill = _SPECIAL_FLOATS.get(fill)
    if fill is None or isinstance(fill, (list, dict)):
        return None
    if dtype.kind == "b" or isinstance(fill, bool):
        return int(bool(fill))
    if dtype.kind in "iu":
        return int(fill) if float(fill).is_integer() else None
    if dtype.kind == "f":
        return float(np.asarray(fill, dtype=dtype))
    return None


def stored_fill(fill, dtype: np.dtype):
    """A Zarr v2 fill_value (v3's in v2 form: zarr3.v2_fill) as one value of the stored `dtype`, as
    zarr-python reads a missing chunk; None when it is not one. No fill: zeros (empty strings)."""
    if fill is None:
        return np.zeros((), dtype)[()]
    try:
        if dtype.kind == "c" and isinstance(fill, list) and len(fill) == 2:  # [real, imaginary]
            part = np.dtype(f"f{dtype.itemsize // 2}")
            parts = [fill_number(x, part) for x in fill]
            return None if None in parts else np.array(complex(*parts), dtype)[()]
        if dtype.kind in "Mm":  # (the int64 of its ticks; NaT is the smallest)
            return np.array(fill, "i8").view(dtype)[()] if isinstance(fill, int) and not isinstance(fill, bool) \
                else np.array(fill, dtype)[()] if fill == "NaT" else None
        if dtype.kind == "S":  # (base64 of its bytes)
            return np.array(base64.b64decode(fill, validate=True), dtype)[()] if isinstance(fill, str) else None
        if dtype.kind == "U":
            return np.array(fill, dtype)[()] if isinstance(fill, str) else None
        number = fill_number(fill, dtype)
        return None if number is None else np.array(number, dtype)[()]
    except (TypeError, ValueError, OverflowError, binascii.Error):
        return None


def _numbers(value) -> list | None:
    """The value as a list of numbers (bools excluded), or None for anything else."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        return None
    return items


def _is_float32(x: float) -> bool:
    """x is exactly a float32 whose own shortest spelling is shorter: it was written from one."""
    if not math.isfinite(x) or x == 0:
        return False
    f = np.float32(x)
    return float(f) == x and len(repr(float(f))) > len(str(f))


def _fits(items: list, dtype: np.dtype) -> bool:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return all(float(v).is_integer() and info.min <= v <= info.max for v in items)
    if dtype.kind == "f":
        if dtype.itemsize >= 8:
            return True
        return all(not math.isfinite(v) or abs(v) <= float(np.finfo(np.float32).max) for v in items)
    return False


def _float32_values(items: list) -> bool:
    """Every value is exactly a float32 and one at least was evidently written from one (0.0 or
    1.0 alone prove nothing)."""
    with np.errstate(over="ignore"):  # (a double beyond float32's range is simply not one)
        return all(float(np.float32(x)) == x or not math.isfinite(x) for x in items) and any(
            isinstance(x, float) and _is_float32(x) for x in items)


def _own_type(items: list) -> np.dtype:
    if any(isinstance(v, float) for v in items):
        return np.dtype("f4") if _float32_values(items) else np.dtype("f8")
    if all(-(2**31) <= v < 2**31 for v in items):
        return np.dtype("i4")
    if all(-(2**63) <= v < 2**63 for v in items):
        return np.dtype("i8")
    return np.dtype("u8")


def _packing_is_float32(attrs: dict) -> bool:
    """scale_factor and add_offset share the unpacked type: float32 when one of them is evidently
    float32 and the other is exactly a float32 too (add_offset 10.0 is both)."""
    values = [v for name in PACKING if (v := attrs.get(name)) is not None]
    items = [x for v in values for x in (_numbers(v) or [None])]
    return bool(items) and None not in items and _float32_values(items)


def _kind(value) -> str:
    if value is None:
        return "a null"
    if value == []:
        return "an empty list"
    if any(isinstance(v, str) for v in value):
        return "a list of strings"
    return "a list of objects, lists or nulls"


def _guess_49(items: list) -> np.dtype:
    """4.9.0 types a list by its first element (and fails the open if a later one does not fit)."""
    if isinstance(items[0], float):
        return np.dtype("f8")
    for dtype in _INT_LADDER_49:
        if _fits(items[:1], dtype):
            return dtype if _fits(items, dtype) else np.dtype("O")
    return np.dtype("f8")


def _guess_410(items: list) -> np.dtype:
    """4.10 types a list by its first element too: int (int64 when needed) or double."""
    if isinstance(items[0], float):
        return np.dtype("f8")
    first = np.dtype("i4") if -(2**31) <= items[0] < 2**31 else np.dtype("i8")
    return first if _fits(items, first) else np.dtype("O")


def _type_name(dtype: np.dtype) -> str:
    return dtype.newbyteorder("<").str if dtype.itemsize > 1 else dtype.str


def _cast(items: list, dtype: np.dtype) -> list:
    if dtype.kind == "f":
        return [float(np.asarray(v, dtype=dtype)) for v in items]
    return [int(v) for v in items]


def left_out_for_49(value) -> bool:
    """netCDF-C 4.9.0 fails the whole open on this attribute value, whatever the hints say: an empty
    list, or a list holding anything but numbers and booleans (strings, objects, lists, null;
    kerchunk's TIFF reader writes OME's "multiscales", a list of objects). null is dropped by 4.9.0
    and read as the text "null" by 4.10."""
    return value is None or value == [] or (
        isinstance(value, list) and any(v is None or isinstance(v, (str, dict, list)) for v in value))


def served_attributes(zattrs: dict, dtype: np.dtype | None, fill) -> tuple[dict, list[str]]:
    """The .zattrs that netCDF-C reads faithfully for an array of `dtype` with .zarray `fill`
    (dtype None: a group). Returns (attributes, notes for the mount log)."""
    attrs = {k: v for k, v in zattrs.items() if k not in HINT_KEYS}
    given = {key: dict(zattrs[key].get("types", {})) if isinstance(zattrs.get(key), dict) else {}
             for key in HINT_KEYS}
    notes = []
    numeric = dtype is not None and dtype.kind in "biuf"
    if numeric and isinstance(attrs.get("_FillValue"), str):
        # a text _FillValue on a numeric variable makes netCDF-C 4.10 abort its caller (an assertion):
        # served as the number it encodes, or left out
        number = base64_fill(attrs["_FillValue"], dtype)
        if number is None:
            notes.append(f"attribute '_FillValue' left out: {quote(attrs.pop('_FillValue'), 40)} is text on a "
                         "numeric variable (netCDF-C 4.10 aborts on it); the raw view keeps it")
        else:
            attrs["_FillValue"] = number
    if numeric and "_FillValue" not in attrs:
        number = fill_number(fill, dtype)
        if number is not None:
            attrs["_FillValue"] = number
    for name, value in list(attrs.items()):
        if name == "_ARRAY_DIMENSIONS":
            continue
        # null is dropped by 4.9.0 and read as the text "null" by 4.10
        if left_out_for_49(value):
            del attrs[name]
            notes.append(f"attribute {name!r} left out: netCDF-C 4.9.0 cannot read {_kind(value)} attribute "
                         "(it fails the whole open); the raw view keeps it")
    packing_f4 = _packing_is_float32(attrs)
    hints = {HINT_49: {}, HINT_410: {}}
    for name, value in attrs.items():
        items = _numbers(value)
        if items is None:
            continue
        served_type = dtype.newbyteorder("=") if numeric and dtype.kind != "b" else np.dtype("u1")
        if numeric and name in VARIABLE_TYPED and _fits(items, served_type):
            wanted = served_type
        elif packing_f4 and name in PACKING:
            wanted = np.dtype("f4")
        else:
            wanted = _own_type(items)
        items = _cast(items, wanted)
        attrs[name] = items if isinstance(value, list) else items[0]
        if _guess_49(items) != wanted:
            hints[HINT_49][name] = _type_name(wanted)
        if _guess_410(items) != wanted and name != "_FillValue":  # 4.10 converts _FillValue itself
            hints[HINT_410][name] = _type_name(wanted)
    for key in HINT_KEYS:
        types = {**hints[key], **given[key]}
        if types:
            attrs[key] = {"types": types}
    return attrs, notes


NCZARR_TEXT = ">S1"  # NCZarr's name of netCDF's char type (a text attribute is a char attribute)
NCZARR_JSON = "|J0"  # NCZarr's name of its own JSON-valued keys (_nczarr_array, _nczarr_group, ...)
# netCDF-C >= 4.10's NCZarr writer's type of a string (NC_STRING) attribute: with it 4.10.1 reads a JSON
# list of strings as strings in either mode; without it, it fails the open in nczarr mode (measured)
NCZARR_STRINGS = "|S128"


def is_string_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def nczarr_types(attrs: dict, dtype: str | None) -> dict:
    """Every attribute's netCDF type as NCZarr's own writer names it in `_nczarr_attr` (netCDF-C >= 4.9.3
    then guesses none): the >= 4.10 hint where `served_attributes` gave one, else the type that
    netCDF-C >= 4.10 guesses (served_attributes cast each value so that the guess is right), text as
    char, `_FillValue` as the variable's type `dtype`, a list of strings as strings. Bools, objects and
    nulls stay unhinted."""
    given = attrs.get(HINT_410)
    types = dict(given.get("types", {})) if isinstance(given, dict) else {}
    for name, value in attrs.items():
        if name in types or name in HINT_KEYS or name == "_ARRAY_DIMENSIONS":
            continue
        if (items := _numbers(value)) is not None:
            if name == "_FillValue" and dtype is not None and np.dtype(dtype).kind in "iuf":
                types[name] = _type_name(np.dtype(dtype))
            elif (guess := _guess_410(items)).kind != "O":
                types[name] = _type_name(guess)
        elif is_string_list(value):
            types[name] = NCZARR_STRINGS
    return types
