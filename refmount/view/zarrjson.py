"""Zarr v3's ``zarr.json`` beside the decoded view's Zarr v2 files: the `zarr` form, for zarr-python 3.

The v2 files (``.zarray``, ``.zattrs``, ``.zgroup``, ``.zmetadata``) are served in the form of the
process that opens them (refmount.view.forms), and a Python process that has loaded netCDF-C gets
netCDF-C's form: NCZarr's ``>S1``, which zarr-python 3 refuses. zarr-python 3 opens ``zarr.json`` first
when it exists and no ``zarr_format`` is named, and neither netCDF-C nor GDAL ever opens it (measured:
NOTES §6), so each library in one process finds a file name of its own. `zarr_json_documents` makes
every ``zarr.json`` from the `zarr` form's consolidated metadata, as zarr-python 3 and xarray read it
there:

- an array's dtype as its v3 data type (``|Sn`` as ``null_terminated_bytes``, zarr-python's name for
  numpy's bytes), one ``bytes`` codec (the decoded view serves no compressor, no filter, C order, little
  endian), the v2 chunk key encoding with the same separator (the same chunk files serve both);
- ``_ARRAY_DIMENSIONS`` as ``dimension_names``;
- fill values: zarr-python fills a missing chunk with ``fill_value`` (v2's null is the dtype's zero),
  and xarray masks with the ``_FillValue`` attribute, in its own encoding (a float as base64 of its
  little-endian double), where on v2 it masks with ``fill_value``: so the v3 attribute is the v2
  ``fill_value`` (or, where that is null, v2's ``_FillValue`` attribute, which xarray then takes);
- the root's ``consolidated_metadata`` (every node, keyed by path, as zarr-python writes it), read by
  ``xarray.open_zarr`` and ``zarr.open_consolidated``; each node also has its own ``zarr.json``.

An array that this cannot express exactly (another dtype, codecs, Fortran order, a fill of bytes or
times that xarray's v3 coder cannot decode) raises `NotExpressible`; the view then serves no
``zarr.json`` at all (zarr-python reads the v2 files, in the process's form), never a partial tree.
"""

from __future__ import annotations

import base64
import struct

import numpy as np

from refmount.refs.arraymeta import ArrayMeta, ArrayMetaError

ZARR_JSON = "zarr.json"
_NUMBERS = {"b1": "bool", "i1": "int8", "u1": "uint8", "i2": "int16", "u2": "uint16", "i4": "int32", "u4": "uint32",
            "i8": "int64", "u8": "uint64", "f2": "float16", "f4": "float32", "f8": "float64",
            "c8": "complex64", "c16": "complex128"}
_DEFAULT_FILL = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": [0.0, 0.0], "S": ""}
_NO_CONSOLIDATED = {"kind": "inline", "must_understand": False, "metadata": {}}  # (a subgroup's, as zarr writes it)


class NotExpressible(ValueError):
    """This metadata has no exact Zarr v3 form here (the message names the array and why)."""


def zarr_json_documents(consolidated: dict) -> dict[str, dict]:
    """{"zarr.json": root, "<path>/zarr.json": node, ...} from a v2 ``.zmetadata`` value
    (``{"metadata": {"<path>/.zarray": ..., ...}}``); raises NotExpressible."""
    entries = consolidated.get("metadata") if isinstance(consolidated, dict) else None
    if not isinstance(entries, dict):
        raise NotExpressible("no consolidated metadata")
    if ".zgroup" not in entries:  # (a root array, or nothing)
        if ".zarray" not in entries:
            raise NotExpressible("no root group or array")
        return {ZARR_JSON: array_document(entries[".zarray"], _object(entries.get(".zattrs"), ""))}
    nodes: dict[str, dict] = {}
    for key, value in entries.items():
        path, _, name = key.rpartition("/")
        if name == ".zgroup":
            nodes[path] = {"zarr_format": 3, "node_type": "group",
                           "attributes": _object(entries.get(_key(path, ".zattrs")), path)}
        elif name == ".zarray":
            nodes[path] = array_document(value, _object(entries.get(_key(path, ".zattrs")), path), path)
    for path in nodes:
        parent = path.rpartition("/")[0]
        if path and nodes.get(parent, {}).get("node_type") != "group":  # (v3 has no implicit groups)
            raise NotExpressible(f"{path}: in a directory without .zgroup")
    root = dict(nodes.pop(""))
    root["consolidated_metadata"] = {"kind": "inline", "must_understand": False, "metadata": {
        path: {**node, "consolidated_metadata": _NO_CONSOLIDATED} if node["node_type"] == "group" else node
        for path, node in sorted(nodes.items())}}
    return {ZARR_JSON: root, **{f"{path}/{ZARR_JSON}": node for path, node in nodes.items()}}


def array_document(zarray: dict, zattrs: dict, path: str = "") -> dict:
    """One array's v3 ``zarr.json`` from its v2 ``.zarray`` and ``.zattrs``."""
    name = path or "/"
    try:
        meta = ArrayMeta.from_zarray(zarray)
        dtype = meta.numpy_dtype()
        shape, chunks = list(meta.shape), list(meta.chunks)
    except (ArrayMetaError, TypeError) as e:
        raise NotExpressible(f"array {name}: .zarray without a valid dtype, shape and chunks ({e})") from None
    if meta.compressor or meta.filters:
        raise NotExpressible(f"array {name}: codecs")
    if meta.order != "C" and len(shape) > 1:
        raise NotExpressible(f"array {name}: Fortran order")
    codec = {"name": "bytes"}
    if dtype.itemsize > 1 and dtype.kind != "S":
        codec["configuration"] = {"endian": "big" if dtype.byteorder == ">" else "little"}
    attrs = dict(zattrs)
    dims = attrs.pop("_ARRAY_DIMENSIONS", None)
    fill = meta.fill_value
    mask = fill if fill is not None else attrs.get("_FillValue")  # (what xarray masks on v2)
    attrs.pop("_FillValue", None)
    if mask is not None:
        attrs["_FillValue"] = _xarray_fill(mask, dtype, name)
    document = {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": data_type(dtype, name),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
                "chunk_key_encoding": {"name": "v2", "configuration": {
                    "separator": meta.separator}},
                "fill_value": _v3_fill(fill, dtype, name), "codecs": [codec], "attributes": attrs}
    if isinstance(dims, list) and len(dims) == len(shape) and all(isinstance(d, str) for d in dims):
        document["dimension_names"] = dims
    return document


def data_type(dtype: np.dtype, name: str = "/"):
    """A numpy dtype's Zarr v3 data type, as zarr-python 3 names it."""
    number = _NUMBERS.get(f"{dtype.kind}{dtype.itemsize}")
    if number is not None:
        return number
    if dtype.kind == "S":
        return {"name": "null_terminated_bytes", "configuration": {"length_bytes": dtype.itemsize}}
    raise NotExpressible(f"array {name}: dtype {dtype.str}")


def _v3_fill(fill, dtype: np.dtype, name: str):
    """v2's JSON fill_value in v3 (which has no null: the dtype's zero, as zarr-python fills v2's null)."""
    if fill is None:
        return _DEFAULT_FILL[dtype.kind]
    if dtype.kind == "b":
        return bool(fill)
    if dtype.kind in "iu":
        if isinstance(fill, float) and fill.is_integer():
            return int(fill)  # (-9999.0: zarr-python casts it)
        if not isinstance(fill, int) or isinstance(fill, bool):
            raise NotExpressible(f"array {name}: fill_value {fill!r} of {dtype.str}")
    return fill  # (numbers, "NaN", "Infinity", base64 bytes and [re, im] are spelled alike in v2 and v3)


def _xarray_fill(value, dtype: np.dtype, name: str):
    """A `_FillValue` as xarray's zarr backend encodes it in v3 attributes (xarray.backends.zarr
    FillValueCoder); it has no coding for bytes (or times)."""
    try:
        if dtype.kind == "f":
            return _b64_double(value)
        if dtype.kind == "c":
            return [_b64_double(part) for part in value]
        if dtype.kind in "iu":
            return int(value)
        if dtype.kind == "b":
            return bool(value)
    except (TypeError, ValueError, OverflowError):
        pass
    raise NotExpressible(f"array {name}: _FillValue {value!r} of {dtype.str}")


def _b64_double(value) -> str:
    number = float(value.replace("Infinity", "inf")) if isinstance(value, str) else float(value)
    return base64.standard_b64encode(struct.pack("<d", number)).decode()


def _object(value, path: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise NotExpressible(f"{path or '/'}: .zattrs is not a JSON object")
    return value


def _key(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name
