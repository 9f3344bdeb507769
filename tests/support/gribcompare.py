"""Compare a mounted GRIB file with cfgrib on the file itself (issue 40's sweep, tests/sweeps/grib_sweep.py, and
tests/test_grib_sweep.py): per cfgrib variable, identical, hidden (a log line of the mount names it),
MISSING (neither read nor named) or WRONG (its values, coordinates or dims differ), read by netCDF-C on the
decoded view."""

from __future__ import annotations

import re
import traceback
import warnings
from pathlib import Path

import numpy as np

from tests.support.clients import nczarr_url

TIMES = ("time", "step", "valid_time")


def oracle(path: Path):
    import cfgrib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [ds.load() for ds in cfgrib.open_datasets(str(path), indexpath="", decode_timedelta=True)]


def groups(nc, prefix=""):
    yield prefix, nc
    for name, g in nc.groups.items():
        yield from groups(g, f"{prefix}/{name}")


def seconds(var) -> np.ndarray:
    values = np.asarray(var[:], dtype="f8").ravel()
    unit = var.units.split()[0]
    return values * {"hours": 3600, "seconds": 1, "minutes": 60, "days": 86400}[unit]


def want_seconds(da) -> np.ndarray:
    v = da.values.ravel()
    if np.issubdtype(v.dtype, np.datetime64):
        return v.astype("datetime64[s]").astype("f8")
    return v.astype("timedelta64[s]").astype("f8")


def compare_var(name, ds, var, group) -> str | None:
    """None when the mounted variable equals cfgrib's, else what differs."""
    a = ds[var].attrs
    v = group.variables[var]
    v.set_auto_maskandscale(False)
    got, want = np.asarray(v[...]), ds[var].values
    number = group.variables.get("number")
    if "number" in ds[var].dims and "number" not in v.dimensions and number is not None and number.dimensions:
        # (grib_tree's sparse form of members that never share a time and step: `number` a coordinate
        # over them, as NCEP's seasonal files; cfgrib's dense cube is NaN elsewhere)
        import xarray as xr

        number.set_auto_maskandscale(False)
        nums = np.asarray(number[:])
        present = np.isin(nums, ds["number"].values)  # (a time and step no member has: the mount's fill)
        pick = xr.DataArray(np.where(present, nums, ds["number"].values[0]), dims=number.dimensions)
        picked = ds[var].sel(number=pick).where(xr.DataArray(present, dims=number.dimensions))
        ds = ds.assign({var: picked.transpose(*[d for d in v.dimensions if d in picked.dims])})
        want = ds[var].values
    fill = getattr(v, "_FillValue", None)
    if fill is not None and np.issubdtype(got.dtype, np.floating) and not np.isnan(fill):
        got = np.where(got == fill, np.nan, got)
    level = a.get("GRIB_typeOfLevel")
    # cfgrib's dims beyond the grid, in its order; the mount's must hold the same values
    order = []
    gotdims = list(v.dimensions)
    for dim in ds[var].dims:
        if dim in ("latitude", "longitude", "y", "x", "values"):
            continue
        if dim not in group.variables and dim not in gotdims:
            return f"dim {dim} ({ds.sizes[dim]}) not mounted; mounted dims {gotdims}"
        order.append(dim)
    # (netCDF-C names a dimension of another size in a sibling group isobaricInhPa_3: its coordinate's)
    axis_of = {dim: (group.variables[dim].dimensions[0] if dim in group.variables and group.variables[dim].dimensions
                     else dim) for dim in order}
    squeezed = [d for d, n in zip(gotdims, got.shape) if n != 1 or d in axis_of.values()]
    got = got.reshape([n for d, n in zip(gotdims, got.shape) if d in squeezed])
    for i, dim in enumerate(order):  # reorder the mount's axis to cfgrib's values
        if axis_of[dim] not in squeezed:
            return f"dim {dim} not an axis of the mount ({gotdims})"
        axis = squeezed.index(axis_of[dim])
        mounted = np.asarray(group.variables[dim][:]).ravel() if dim not in TIMES else seconds(group.variables[dim])
        wanted = want_seconds(ds[dim]) if dim in TIMES else ds[dim].values.ravel()
        try:
            pick = [list(mounted).index(x) for x in wanted]
        except ValueError:
            return f"{dim}: mounted {mounted[:6]} != cfgrib {wanted[:6]}"
        got = np.take(got, pick, axis=axis)
        got = np.moveaxis(got, axis, i)
        squeezed.insert(i, squeezed.pop(axis))
    if got.size != want.size:
        return f"shape {got.shape} vs cfgrib {want.shape}"
    got = got.reshape(want.shape)
    if not np.array_equal(got.astype(want.dtype), want, equal_nan=True):
        bad = ~((got.astype(want.dtype) == want) | (np.isnan(want) & np.isnan(got.astype(want.dtype))))
        i = np.argwhere(bad)[0]
        return (f"values differ at {bad.sum()}/{bad.size} points, first {tuple(i)}: "
                f"{got[tuple(i)]} vs {want[tuple(i)]}")
    for coord in ("latitude", "longitude"):
        if coord in ds[var].coords and coord in group.variables:
            c = np.asarray(group.variables[coord][:], "f8")
            w = ds[coord].values.astype("f8")
            if c.size != w.size or not np.allclose(c.reshape(w.shape) if c.size == w.size else c, w, atol=1e-6):
                return f"{coord} differs: {c.ravel()[:4]} vs {w.ravel()[:4]}"
    for coord in TIMES:
        if coord in ds[var].coords and ds[coord].ndim == 0:
            if coord not in group.variables:
                return f"no {coord}"
            got_t = np.unique(seconds(group.variables[coord]))  # (valid_time may repeat along levels)
            if got_t.size != 1 or got_t[0] != want_seconds(ds[coord])[0]:
                return f"{coord} {got_t[:4]} vs cfgrib {want_seconds(ds[coord])}"
    if level and level in ds[var].coords and ds[level].ndim == 0 and level in group.variables:
        lv = np.asarray(group.variables[level][:]).ravel()
        if lv.size != 1 or lv[0] != ds[level].values:
            return f"{level} {lv[:4]} vs cfgrib {ds[level].values}"
    return None


def find_group(nc_groups, var, a):
    path = f"/{var}/{a.get('GRIB_stepType')}/{a.get('GRIB_typeOfLevel')}"
    if path in nc_groups and var in nc_groups[path].variables:
        return nc_groups[path]
    if var in nc_groups[""].variables:
        return nc_groups[""]
    return None


def sweep_file(path: Path, m):
    """(result, [lines]) for one file."""
    import netCDF4

    mnt = m.path

    try:
        expected = oracle(path)
    except Exception as e:
        expected, why = None, f"cfgrib: {type(e).__name__}: {e}"
    try:
        nc = netCDF4.Dataset(nczarr_url(mnt / path.name))
    except Exception as e:
        named = [line for line in m.log().splitlines() if f"/{path.name}:" in line]
        if expected is None:
            return "both fail", [why, f"mount: {e}"]
        tb = "Traceback" in "\n".join(named)
        return ("error" if tb or not named else "hidden"), [n.split("refmount:", 1)[-1].strip()[:600] for n in named] or [str(e)]
    lines, results = [], set()
    named = [line for line in m.log().splitlines() if f"/{path.name}:" in line]
    with nc:
        if expected is None:
            return "oracle fails", [why]
        g = dict(groups(nc))
        for ds in expected:
            for var in ds.data_vars:
                group = find_group(g, var, ds[var].attrs)
                if group is None:
                    hidden = [n for n in named if re.search(rf"(^|[ ;,]){re.escape(var)}[:,]", n)]
                    results.add("hidden" if hidden else "MISSING")
                    lines.append(f"{var}: {'hidden: ' + hidden[0][-200:] if hidden else 'MISSING (no log line)'}")
                    continue
                try:
                    diff = compare_var(path.name, ds, var, group)
                except Exception as e:
                    diff = f"compare failed: {type(e).__name__}: {e}"
                    traceback.print_exc()
                results.add("WRONG" if diff else "identical")
                lines.append(f"{var} {ds[var].attrs.get('GRIB_typeOfLevel')} {ds[var].attrs.get('GRIB_stepType')}: "
                             f"{diff or 'identical'}")
    for word in ("error", "WRONG", "MISSING", "hidden"):
        if word in results:
            return (word if len(results) == 1 else f"{word} (some)"), lines
    return "identical", lines
