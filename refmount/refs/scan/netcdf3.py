"""netCDF-3 attributes as the file holds them, over what kerchunk's NetCDF3ToZarr writes.

kerchunk (0.2.x) writes every attribute that is not text as the text of its numpy value (a global
``att = 1.5, -2.`` becomes ``"[ 1.5 -2. ]"``, ``valid_range`` of a variable ``"[  0 100]"``; only
``scale_factor`` and ``add_offset`` are made numbers again), leaves ``missing_value`` out, and makes
``missing_value`` the array's ``fill_value`` when there is one, before ``_FillValue``: a variable with
both then masks the wrong value, and one with ``missing_value`` alone masks nothing else in netCDF-C.
Here each ``.zattrs`` gets the numbers back (JSON numbers: the decoded view types the CF ones as their
variable, refmount.view.ncattrs), ``missing_value`` its place, and ``fill_value`` is ``_FillValue`` or,
without one, null (netCDF-C then fills and masks with netCDF's default, as on the file)."""

from __future__ import annotations

import json
import math

import numpy as np


def restore_attributes(translator, refs: dict) -> None:
    """Rewrite, in `refs` (kerchunk's Version-1 output of `translator`), the root's and each variable's
    numeric attributes and each variable's fill_value from the file's own (scipy's) attributes."""
    keys = refs.get("refs", refs)
    _update(keys, ".zattrs", translator._attributes, skip=("filename",))
    for name, var in translator.variables.items():
        prefix = f"{name}/"
        _update(keys, prefix + ".zattrs", var._attributes, skip=("_FillValue",))
        if prefix + ".zarray" in keys:
            meta = json.loads(keys[prefix + ".zarray"])
            fill = _fill(var._attributes.get("_FillValue"))
            if np.dtype(meta["dtype"]).kind in "iuf" and meta.get("fill_value") != fill:  # (characters: kerchunk's)
                meta["fill_value"] = fill
                keys[prefix + ".zarray"] = json.dumps(meta)


def _update(keys: dict, key: str, attributes: dict, skip: tuple) -> None:
    if key not in keys:
        return
    attrs = json.loads(keys[key])
    for name, value in attributes.items():
        if name not in skip and not isinstance(value, (bytes, str)):
            attrs[name] = _number(value)
    keys[key] = json.dumps(attrs)


def _number(value):
    """A numeric attribute as JSON: a netCDF attribute of one value is that value, else a list."""
    values = np.asarray(value).ravel().tolist()
    return values[0] if len(values) == 1 else values


def _fill(value):
    """A _FillValue as Zarr v2's fill_value (NaN and infinities as their names), None without one."""
    if value is None:
        return None
    number = np.asarray(value).ravel()[0].item()
    if isinstance(number, float) and not math.isfinite(number):
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    return number
