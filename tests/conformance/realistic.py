"""netCDF-4 files shaped like the data users mount, beside netCDF-C's own CDL corpus: what xarray and
netCDF4-python write (CF packing, NaN fills, times, strings, groups, partly written records,
big-endian and unsigned data, string-typed attributes).

    python -m tests.conformance.realistic DIR      # writes DIR/*.nc
    python -m tests.conformance.run DIR/*.nc       # measures them like the corpus
"""

from __future__ import annotations

import sys
from pathlib import Path

import netCDF4
import numpy as np


def cf_mix(path: Path) -> None:
    """Packed int16 with valid_range, NaN fill, missing_value only, 64-bit integers, a dimension of
    length 1, scalars (one never written), big-endian data, typed and string-typed attributes."""
    rng = np.random.default_rng(1)
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("time", None)
        d.createDimension("lat", 7)
        d.createDimension("lon", 9)
        d.createDimension("one", 1)
        t = d.createVariable("time", "i8", ("time",))
        t.units, t.calendar = "hours since 2000-01-01", "noleap"
        t[:] = np.arange(5) * 6
        lat = d.createVariable("lat", "f8", ("lat",))
        lat[:], lat.units = np.linspace(-60, 60, 7), "degrees_north"
        v = d.createVariable("pr", "i2", ("time", "lat", "lon"), fill_value=np.int16(-32767), zlib=True, shuffle=True,
                             chunksizes=(2, 4, 4))
        v.scale_factor, v.add_offset, v.valid_range = 0.5, 100.0, np.array([-30000, 30000], "i2")
        v.set_auto_maskandscale(False)
        data = rng.integers(-100, 100, (5, 7, 9)).astype("i2")
        data[0, :2, :2] = -32767
        v[:] = data
        w = d.createVariable("sst", "f4", ("time", "lat", "lon"), fill_value=np.float32(np.nan), chunksizes=(3, 7, 9))
        x = rng.normal(size=(5, 7, 9)).astype("f4")
        x[1, 3] = np.nan
        w[:] = x
        m = d.createVariable("mv", "f8", ("lat",))
        m.missing_value = -1.0
        m[:] = [1, -1, 2, 3, -1, 4, 5]
        d.createVariable("big", "u8", ("lon",))[:] = np.arange(9, dtype="u8") * (2**60)
        s = d.createVariable("neg", "i8", ("lon",), fill_value=np.int64(-1))
        s[:] = np.ma.masked_array(np.arange(9), [i % 3 == 0 for i in range(9)])
        d.createVariable("onev", "f4", ("one", "lat"))[:] = 2
        d.createVariable("scal", "f8", ()).note = "never written"
        d.createVariable("scal2", "i4", ())[:] = 42
        d.title = "Ünïcode title"
        d.setncattr_string("tags", ["a", "b"])
        d.setncattr("vals", np.array([1.5, 2.5], "f4"))
        d.setncattr_string("sattr", "string-typed")
        d.createVariable("be", "f4", ("lat",), endian="big")[:] = np.arange(7)


def satellite(path: Path) -> None:
    """GOES-like: _Unsigned shorts and bytes with fills, flags, packing in float32, a scalar time."""
    rng = np.random.default_rng(2)
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("y", 6)
        d.createDimension("x", 5)
        d.createDimension("nb", 2)
        r = d.createVariable("Rad", "i2", ("y", "x"), fill_value=np.int16(1023), zlib=True, chunksizes=(3, 5))
        r._Unsigned = "true"
        r.scale_factor, r.add_offset = np.float32(0.5), np.float32(-1.0)
        r.valid_range = np.array([0, 1022], "i2")
        r.set_auto_maskandscale(False)
        data = rng.integers(0, 1022, (6, 5)).astype("i2")
        data[0, 0], data[1, 1] = 1023, -5  # -5 is 65531 unsigned
        r[:] = data
        q = d.createVariable("DQF", "i1", ("y", "x"), fill_value=np.int8(-1))
        q._Unsigned = "true"
        q.flag_values, q.flag_meanings = np.array([0, 1, 2, 3], "i1"), "good a b c"
        q.set_auto_maskandscale(False)
        flags = rng.integers(0, 4, (6, 5)).astype("i1")
        flags[2, 2], flags[3, 3] = -1, -100
        q[:] = flags
        t = d.createVariable("t", "f8", ())
        t.units = "seconds since 2000-01-01 12:00:00"
        t[:] = 6.5e8
        d.createVariable("time_bounds", "f8", ("nb",))[:] = [6.5e8, 6.5e8 + 600]
        e = d.createVariable("packed_mv", "i2", ("y",), fill_value=np.int16(-32767))
        e.missing_value, e.scale_factor, e.add_offset = np.int16(-32767), 0.001, 273.0
        e.set_auto_maskandscale(False)
        e[:] = np.array([1, 2, -32767, 4, 5, 6], "i2")
        d.createVariable("lat2d", "f4", ("y", "x"))[:] = rng.normal(size=(6, 5))


def grouped_records(path: Path) -> None:
    """An unlimited dimension of the root group, written to different lengths by variables of a
    subgroup; strings and characters."""
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("time", None)
        d.createDimension("x", 5)
        t = d.createVariable("time", "f8", ("time",))
        t.units = "days since 1990-01-01"
        t[:] = np.arange(3)
        g = d.createGroup("obs")
        v = g.createVariable("pr", "f4", ("time", "x"), fill_value=np.float32(-999.0))
        v.missing_value = np.float32(-999.0)
        v[0] = np.arange(5)
        g.createVariable("cnt", "i2", ("time", "x"))[:2] = 3
        g.createVariable("name", str, ("x",))[:] = np.array(["a", "bb", "", "dddd", "é"], object)
        d.createVariable("code", "S1", ("x",))[:] = np.array(list("hello"), "S1")
        d.setncattr("ints", np.array([1, 2, 3], "i2"))


def xarray_written(path: Path) -> None:
    """What xarray.to_netcdf writes: NaN fills, int64 times, packed int16 with zlib."""
    import pandas as pd
    import xarray as xr

    tas = np.random.default_rng(0).normal(280, 5, (6, 3, 4)).astype("f4")
    tas[0, 0, 0] = np.nan
    ds = xr.Dataset({"tas": (("time", "lat", "lon"), tas, {"units": "K"}),
                     "count": (("time",), np.arange(6, dtype="i4")),
                     "flag": (("lat",), np.array([0, 1, 255], "u1"))},
                    coords={"time": pd.date_range("2000-01-01", periods=6, freq="D"), "lat": [10.0, 20.0, 30.0],
                            "lon": np.arange(4, dtype="f8")}, attrs={"title": "test"})
    encoding = {"tas": {"dtype": "int16", "scale_factor": 0.01, "add_offset": 280, "_FillValue": -32767, "zlib": True}}
    ds.to_netcdf(path, engine="netcdf4", encoding=encoding)


FILES = {"cf_mix.nc": cf_mix, "satellite.nc": satellite, "grouped_records.nc": grouped_records,
         "xarray_written.nc": xarray_written}


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, make in FILES.items():
        make(directory / name)
        paths.append(directory / name)
    return paths


if __name__ == "__main__":
    for p in write_all(Path(sys.argv[1])):
        print(p)
