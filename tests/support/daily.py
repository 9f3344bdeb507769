"""Daily netCDF-4 files as archives hold them: hourly `tas` on a lat/lon grid, one file a day, each
with its own time units (`hours since <that day>`), as the archive benchmark and tests use them."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np


def make_daily(directory, days: int, nlat: int = 181, nlon: int = 360, start=datetime.date(2020, 1, 1)) -> list[Path]:
    import netCDF4

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lat = np.linspace(-90, 90, nlat, dtype="f4")
    lon = np.linspace(0, 360, nlon, endpoint=False, dtype="f4")
    paths = []
    for d in range(days):
        day = start + datetime.timedelta(days=d)
        path = directory / f"tas_{day:%Y%m%d}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("lat", nlat)
            ds.createDimension("lon", nlon)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = f"hours since {day:%Y-%m-%d}"
            t.calendar = "standard"
            t.standard_name = "time"
            t[:] = np.arange(24, dtype="f8")
            v = ds.createVariable("lat", "f4", ("lat",))
            v.units = "degrees_north"
            v[:] = lat
            v = ds.createVariable("lon", "f4", ("lon",))
            v.units = "degrees_east"
            v[:] = lon
            tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=True, complevel=1,
                                    chunksizes=(1, nlat, nlon))
            tas.units = "K"
            tas.long_name = "Near-surface air temperature"
            hours = np.arange(24)[:, None, None] + 24 * d
            tas[:] = (250 + 30 * np.cos(np.deg2rad(lat))[None, :, None] + np.sin(hours / 6.0)
                      + 0.01 * np.arange(nlon)[None, None, :]).astype("f4")
            ds.title = "daily tas"
        paths.append(path)
    return paths
