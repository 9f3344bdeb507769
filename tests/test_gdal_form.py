"""GDAL's form of the decoded view against GDAL's netCDF driver on the source (issue 32): Debian's
`gdalinfo -json -stats` reports the same nodata, statistics and unit for `ZARR:"MNT":/var` as for
`NETCDF:source.nc:var`.

- Values never written are nodata to GDAL's netCDF driver, where a variable has no `_FillValue`:
  netCDF's default fill of its type, except for bytes (xarray's test file example_1.nc, and netCDF-3
  and netCDF-4 files with one row of each type written).
- GDAL's Zarr driver takes the unit only from `units`; its netCDF driver from `UNITS` too (NASA's
  GOLD product writes `UNITS`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

netCDF4 = pytest.importorskip("netCDF4")
kerchunk_hdf = pytest.importorskip("kerchunk.hdf")
kerchunk_netcdf3 = pytest.importorskip("kerchunk.netCDF3")


def _gdalinfo(name: str, cwd: Path) -> dict:
    """Band 1 as `gdalinfo -json -stats` reports it: nodata, unit and statistics (none when no pixel
    is valid)."""
    result = subprocess.run(["gdalinfo", "-json", "-stats", name], capture_output=True, text=True, cwd=cwd,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    band = json.loads(result.stdout)["bands"][0]
    found = {key: band.get(key) for key in ("noDataValue", "unit", "minimum", "maximum", "mean")}
    if found["mean"] is not None:  # summed in another order (rows of the file, blocks of the Zarr array)
        found["mean"] = float(f"{found['mean']:.12g}")
    return found


def _write(path: Path, fmt: str) -> list[str]:
    """A netCDF file whose variables each have only their first row written; returns their names."""
    types = ["f4", "f8", "i2", "i4", "i1"] + (["u1", "u2", "u4"] if fmt == "NETCDF4" else [])
    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.createDimension("y", 3)
        ds.createDimension("x", 4)

        def variable(name, dtype, **attrs):
            v = ds.createVariable(name, dtype, ("y", "x"))
            v.setncatts(attrs)
            v.set_auto_maskandscale(False)
            v[0, :] = np.arange(4).astype(dtype)  # rows 1 and 2 are never written

        for t in types:
            variable(f"v_{t}", t)
        variable("unsigned", "i2", _Unsigned="true")  # GDAL: the default fill as unsigned, 32769
        variable("missing", "f4", missing_value=np.float32(3))
        variable("filled", "f4", _FillValue=np.float32(2))
        variable("upper_units", "f4", UNITS="K")
    return [*(f"v_{t}" for t in types), "unsigned", "missing", "filled", "upper_units"]


def _compare(mount, source: Path, refs: dict, variables: list[str]) -> None:
    m = mount(refs)
    for name, zarr_name in variables:
        on_source = _gdalinfo(f"NETCDF:{source.name}:{name}", source.parent)
        on_mount = _gdalinfo(f'ZARR:"{m.path}":/{zarr_name}', source.parent)
        assert on_mount == on_source, f"{source.name} {name}"


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_CLASSIC"])
def test_gdal_reads_nodata_statistics_and_units_on_the_mount_as_on_the_source(mount, tmp_path, fmt):
    source = tmp_path / f"{fmt}.nc"
    variables = _write(source, fmt)
    if fmt == "NETCDF4":
        refs = kerchunk_hdf.SingleHdf5ToZarr(str(source), inline_threshold=0).translate()
    else:
        refs = kerchunk_netcdf3.NetCDF3ToZarr(str(source), inline_threshold=0).translate()
    _compare(mount, source, refs, [(v, v) for v in variables])


def test_gdal_reads_xarrays_example_file_on_the_mount_as_on_the_source(mount, tmp_path):
    """xarray's example_1.nc (netCDF-3, in xarray's wheel): `temp` and `rh` were never written."""
    xarray = pytest.importorskip("xarray")
    source = tmp_path / "example_1.nc"
    source.write_bytes((Path(xarray.__file__).parent / "tests" / "data" / "example_1.nc").read_bytes())
    refs = kerchunk_netcdf3.NetCDF3ToZarr(str(source), inline_threshold=0).translate()
    # GDAL's Zarr driver names the indices of the extra dimensions; its netCDF driver's band 1 is 0, 0
    _compare(mount, source, refs, [("temp", "temp:0:0"), ("rh", "rh:0")])
