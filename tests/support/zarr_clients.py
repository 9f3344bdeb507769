"""Real clients reading a mounted Zarr dataset, compared with the netCDF files it came from.

- `concatenated_oracle(paths)`: each variable's stored values (netCDF4, no masking or scaling) of
  several files joined along `time`, with its fill value;
- `source_dataset(paths)`: the same files as xarray decodes them, joined along `time`;
- `assert_decoded_clients`: the decoded view (Zarr v2) read by Debian's ncdump, netCDF4-python and
  xarray;
- `assert_raw_clients`: the raw view (Zarr v3) read by zarr-python and xarray.
"""

from __future__ import annotations

import numpy as np

from tests.support.clients import compare_dumped, ncdump, nczarr_url, oracle_variables, parse_ncdump, served


def source_dataset(paths):
    import xarray as xr

    return xr.concat([xr.open_dataset(p).load() for p in paths], dim="time", data_vars="minimal")


def concatenated_oracle(paths) -> dict:
    """{name: (stored values of all files along time, fill)}."""
    per_file = [oracle_variables(p) for p in paths]
    out = {}
    for name, var in per_file[0].items():
        if "time" in var.dimensions:
            values = np.concatenate([f[name].values for f in per_file], axis=var.dimensions.index("time"))
        else:
            values = var.values
        out[name] = (values, var.fill)
    return out


def assert_decoded_clients(mnt, oracle: dict, decoded, variables, declared_fills=("air", "prcp")) -> None:
    """Decoded view: ncdump, netCDF4-python (stored values) and xarray (CF-decoded) equal the sources;
    the variables `declared_fills` have their source's _FillValue."""
    import netCDF4
    import xarray as xr

    dumped = parse_ncdump(ncdump(nczarr_url(mnt)))
    with netCDF4.Dataset(nczarr_url(mnt)) as ds:
        for name in variables:
            values, fill = oracle[name]
            expected = served(values)
            compare_dumped(dumped[name], expected, [fill], f"ncdump {name}")
            var = ds.variables[name]
            var.set_auto_maskandscale(False)
            got = np.asarray(var[...])
            assert got.dtype == expected.dtype and np.array_equal(got, expected), f"netCDF4 {name}"
            if name in declared_fills:
                assert var.getncattr("_FillValue") == fill, f"netCDF4 {name} _FillValue"
    opened = xr.open_zarr(mnt, zarr_format=2, consolidated=False)
    for name in variables:
        np.testing.assert_array_equal(opened[name].values, decoded[name].values, err_msg=f"xarray {name}")


def assert_raw_clients(mnt, expected: dict, decoded, variables) -> None:
    """Raw view: zarr-python 3 reads `expected` ({name: stored values}); xarray equals the CF-decoded
    sources."""
    import xarray as xr
    import zarr

    group = zarr.open_group(str(mnt), mode="r", zarr_format=3)
    assert sorted(group.array_keys()) == sorted(expected)
    for name, values in expected.items():
        got = group[name][...]
        assert got.dtype.kind == values.dtype.kind and got.dtype.itemsize == values.dtype.itemsize, f"zarr {name}"
        assert np.array_equal(got, values, equal_nan=True), f"zarr {name}"
    opened = xr.open_zarr(str(mnt), zarr_format=3, consolidated=False)
    for name in variables:
        np.testing.assert_array_equal(opened[name].values, decoded[name].values, err_msg=f"xarray {name}")
