"""Regenerate the fixtures of tests/test_writers.py with today's writers (needs Python >= 3.12):

    python3.12 -m venv /tmp/venv-writers
    /tmp/venv-writers/bin/pip install "virtualizarr[hdf,kerchunk]==2.8.0" "zarr==3.4.2" xarray h5py \
        netCDF4 kerchunk fastparquet pyarrow obstore h5netcdf
    /tmp/venv-writers/bin/python tests/data/writers/make_fixtures.py

It writes, into this directory:
- `air_0.nc`, `air_1.nc`: two small netCDF-4 files (netCDF4-python), consecutive along time: the sources;
- `vz2.json`, `vz3.json`: VirtualiZarr's kerchunk JSON of both files combined along time
  (`vds.vz.to_kerchunk(..., format="json")`, with `zarr_format=2` and `zarr_format=3`);
- `vz.parq/`: the same as kerchunk Parquet (`format="parquet"`);
- `plain.zarr/`, `sharded.zarr/`: native Zarr v3 stores written by zarr 3.4 through xarray
  (`to_zarr(zarr_format=3)`), unsharded and sharded;
- `versions.json`: the versions of the writers.

VirtualiZarr records absolute urls, so the sources are referenced where this script wrote them,
under SOURCE_DIR; the tests copy air_*.nc there before mounting.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path("/tmp/refmount-writers-fixtures")


def write_sources() -> list[Path]:
    import netCDF4

    SOURCE_DIR.mkdir(exist_ok=True)
    rng = np.random.default_rng(28)
    paths = []
    for n in range(2):
        path = SOURCE_DIR / f"air_{n}.nc"
        with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
            ds.title = "refmount writers fixture"
            ds.history = f"part {n} of 2"
            ds.createDimension("time", 3)
            ds.createDimension("lat", 12)
            ds.createDimension("lon", 16)
            time = ds.createVariable("time", "f8", ("time",))
            time.units = "hours since 2000-01-01 00:00:00"
            time.calendar = "standard"
            time[:] = np.arange(3) * 6.0 + n * 18
            lat = ds.createVariable("lat", "f4", ("lat",))
            lat.units = "degrees_north"
            lat[:] = np.linspace(-55, 55, 12)
            lon = ds.createVariable("lon", "f4", ("lon",))
            lon.units = "degrees_east"
            lon[:] = np.linspace(0, 337.5, 16)
            air = ds.createVariable("air", "f4", ("time", "lat", "lon"), zlib=True, shuffle=True,
                                    chunksizes=(1, 6, 8), fill_value=np.float32(-9999.0))
            air.units = "K"
            air.long_name = "air temperature"
            values = (250 + 40 * rng.random((3, 12, 16))).astype("f4")
            values[1, 2:4, 3:5] = -9999.0  # missing values
            air[:] = values
            # packed data: int16 with scale_factor/add_offset
            pres = ds.createVariable("pres", "i2", ("time", "lat", "lon"), zlib=True, chunksizes=(3, 12, 16),
                                     fill_value=np.int16(-32767))
            pres.scale_factor = np.float32(0.1)
            pres.add_offset = np.float32(1000.0)
            pres.units = "hPa"
            pres[:] = np.round(rng.normal(0, 300, (3, 12, 16))).astype("i2")
            # an integer variable, no compression, contiguous
            ds.createVariable("station", "i4", ("lat",))[:] = np.arange(12, dtype="i4") * 7
        paths.append(path)
    return paths


def write_virtualizarr(paths: list[Path]) -> None:
    import obstore.store
    import xarray as xr
    from obspec_utils.registry import ObjectStoreRegistry
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    registry = ObjectStoreRegistry({"file://": obstore.store.LocalStore()})
    parts = [open_virtual_dataset(f"file://{p}", registry=registry, parser=HDFParser(),
                                  loadable_variables=[]) for p in paths]
    vds = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="override",
                    combine_attrs="override")
    for fmt in (2, 3):
        vds.vz.to_kerchunk(str(HERE / f"vz{fmt}.json"), format="json", zarr_format=fmt)
    shutil.rmtree(HERE / "vz.parq", ignore_errors=True)
    vds.vz.to_kerchunk(str(HERE / "vz.parq"), format="parquet", record_size=4)


def write_zarr3(paths: list[Path]) -> None:
    import xarray as xr

    parts = [xr.open_dataset(p, engine="netcdf4", mask_and_scale=False, decode_times=False).load() for p in paths]
    ds = xr.concat(parts, dim="time", data_vars="minimal", coords="minimal", compat="override")
    for name, shards in (("plain.zarr", None), ("sharded.zarr", (3, 12, 16))):
        out = HERE / name
        shutil.rmtree(out, ignore_errors=True)
        encoding = {"air": {"chunks": (1, 6, 8)}, "pres": {"chunks": (3, 6, 8)}}
        if shards:
            encoding["air"]["shards"] = shards
            encoding["pres"]["shards"] = (6, 12, 16)
        for var in ds.variables:
            enc = encoding.setdefault(var, {})
            for key in ("_FillValue", "scale_factor", "add_offset", "units", "calendar", "dtype"):
                enc.pop(key, None)
        ds.to_zarr(str(out), zarr_format=3, encoding=encoding, consolidated=False, mode="w")


def main() -> None:
    import virtualizarr
    import xarray
    import zarr

    paths = write_sources()
    write_virtualizarr(paths)
    write_zarr3(paths)
    for p in paths:
        shutil.copy(p, HERE / p.name)
    versions = {"python": sys.version.split()[0], "virtualizarr": virtualizarr.__version__,
                "zarr": zarr.__version__, "xarray": xarray.__version__}
    (HERE / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")
    print(versions)


if __name__ == "__main__":
    main()
