"""One Python process that reads a mount with netCDF4-python and with xarray's zarr engine, in the
order given, as a notebook does (tests/test_two_libraries.py runs it as its own program):

    python -m tests.support.two_libraries netcdf-first|zarr-first SOURCE.nc MOUNT GROUPS OUT.pkl [MODE]

"netcdf-first" opens the local SOURCE with netCDF4 (which loads netCDF-C into the process), reads the
mount with it, then with xarray.open_zarr; "zarr-first" reads with xarray before netCDF4 is imported.
OUT gets what each read (or the error it raised), and whether netCDF-C was loaded when xarray read.
Nothing here imports netCDF4 or xarray before the order says so.
"""

from __future__ import annotations

import json
import pickle
import sys
import warnings


def netcdf_loaded() -> bool:
    with open("/proc/self/maps") as f:
        return "libnetcdf" in f.read()


def read_netcdf(url: str) -> dict:
    """Every variable of every group as netCDF4-python reads it (raw: no masking, scaling or
    characters joined), with its dimensions and attributes."""
    import netCDF4

    out = {}

    def walk(group, prefix):
        out[prefix + "/"] = {"attributes": {a: group.getncattr(a) for a in group.ncattrs()},
                            "dimensions": {n: len(d) for n, d in group.dimensions.items()}}
        for name, v in group.variables.items():
            v.set_auto_maskandscale(False)
            v.set_auto_chartostring(False)
            out[f"{prefix}/{name}"] = {"dtype": str(v.dtype), "dimensions": v.dimensions, "values": v[...],
                                       "attributes": {a: v.getncattr(a) for a in v.ncattrs()}}
        for name, sub in group.groups.items():
            walk(sub, f"{prefix}/{name}")

    with netCDF4.Dataset(url) as d:
        walk(d, "")
    return out


def read_xarray(path: str, groups: list[str]) -> dict:
    """xarray.open_zarr of each group, with consolidated metadata (None, True) and without (False)."""
    import xarray as xr

    out = {}
    for group in groups:
        for consolidated in (None, True, False):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with xr.open_zarr(path, group=group or None, consolidated=consolidated) as ds:
                        out[group, consolidated] = ds.load()
                except Exception as e:  # noqa: BLE001 - the parent reports it
                    out[group, consolidated] = f"{type(e).__name__}: {e}"
            out["warnings", group, consolidated] = sorted({str(w.message).split(" metadata objects")[0] for w in caught})
    return out


def main(order: str, source: str, mount: str, groups: str, out: str, mode: str = "nczarr") -> None:
    result = {}
    if order == "netcdf-first":
        import netCDF4

        with netCDF4.Dataset(source) as d:  # (a notebook reading a local file first)
            d.variables  # noqa: B018
        result["netcdf"] = read_netcdf(f"file://{mount}#mode={mode},file")
    result["netcdf_loaded_for_xarray"] = netcdf_loaded()
    result["xarray"] = read_xarray(mount, json.loads(groups))
    if order == "zarr-first":
        import netCDF4

        with netCDF4.Dataset(source) as d:
            d.variables  # noqa: B018
        result["netcdf"] = read_netcdf(f"file://{mount}#mode={mode},file")
    with open(out, "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
