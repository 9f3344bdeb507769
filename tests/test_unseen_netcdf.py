"""Files ncgen cannot make but archives hold, mounted both ways (the file itself, and kerchunk's references
of it over a loopback HTTP server), read by netCDF4-python and xarray each in a process of its own (the
mount serves each library its form), against the same client on the file. bench/NOTES.md (unseen) has
the whole survey these cases come from."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from tests.support.clients import nczarr_url
from tests.support.rangeserver import RangeServer

# Every variable's values (masked points as null) and attributes, as a client reads them: JSON on stdout.
_READ = """
import json, sys, warnings
import numpy as np
warnings.simplefilter("ignore")

def plain(v):
    if isinstance(v, (bytes, str)):
        return v.decode() if isinstance(v, bytes) else v
    a = np.ma.asarray(v)
    items = [None if m else x for x, m in zip(a.filled(0).ravel().tolist(), np.ma.getmaskarray(a).ravel().tolist())]
    return items if a.ndim else items[0]

client, target = sys.argv[1:3]
out = {}
if client == "netcdf4":
    import netCDF4
    with netCDF4.Dataset(target) as ds:
        out["@"] = {k: plain(v) for k, v in ds.__dict__.items()}
        for name, var in ds.variables.items():
            out[name] = {"values": plain(var[...]), "attrs": {k: plain(v) for k, v in var.__dict__.items()}}
else:
    import xarray as xr
    engine = "zarr" if client == "zarr" else "netcdf4"
    with xr.open_dataset(target, engine=engine, mask_and_scale=True) as ds:
        for name, var in ds.variables.items():
            values = np.ma.masked_invalid(var.values) if var.dtype.kind == "f" else var.values
            out[name] = {"values": plain(values), "attrs": {}}
print(json.dumps(out))
"""


def read(client: str, target) -> dict:
    proc = subprocess.run([sys.executable, "-c", _READ, client, str(target)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _pure_hdf5(path) -> None:
    """An h5py file without dimension scales (phony dimensions), HDF5's fill 0 everywhere, zeros as data,
    and a compact dataset: kerchunk gives a compact (inlined) dataset a null fill_value in any file."""
    import h5py

    data = np.arange(600, dtype="f4").reshape(20, 30) * 0.5  # (its first value is 0)
    with h5py.File(path, "w") as f:
        f.create_dataset("contiguous", data=data)
        f.create_dataset("edge", data=np.arange(23 * 17, dtype="i2").reshape(23, 17), chunks=(5, 4))
        f.create_dataset("shuffle_gzip", data=data, chunks=(6, 7), shuffle=True, compression="gzip")
        f.create_dataset("unsigned", data=np.array([0, 2**63, 2**64 - 1], "u8"))
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_layout(h5py.h5d.COMPACT)
        compact = np.arange(12, dtype="i4").reshape(3, 4)
        tid = h5py.h5t.py_create(compact.dtype)
        h5py.h5d.create(f.id, b"compact", tid, h5py.h5s.create_simple(compact.shape), dcpl).write(
            h5py.h5s.ALL, h5py.h5s.ALL, compact)


def _kerchunk_refs(path, url: str) -> dict:
    """kerchunk's references with its default inline threshold (the compact dataset's bytes inline)."""
    import gc

    from kerchunk.hdf import SingleHdf5ToZarr

    gc.collect()
    gc.disable()  # (h5py's lock and zarr's I/O thread: refs/scan/worker.py)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with open(path, "rb") as f:
                return SingleHdf5ToZarr(f, url).translate()
    finally:
        gc.enable()


@pytest.mark.parametrize("way", ["direct", "kerchunk"])
def test_pure_hdf5_zeros_stay_data_beside_a_compact_dataset(tmp_path, mount, way):
    """A compact dataset's null fill_value is no sign of kerchunk's netCDF rule: HDF5's fill 0 of every
    other dataset stays data (was served as _FillValue 0, masking every zero of the file)."""
    path = tmp_path / "www" / "pure.h5"
    path.parent.mkdir()
    _pure_hdf5(path)
    with RangeServer(path.parent) as server:
        source = path if way == "direct" else _kerchunk_refs(path, server.url_for("pure.h5"))
        m = mount(source)
        for client, target, on_file in (("netcdf4", nczarr_url(m.path), path), ("zarr", m.path, path)):
            got, expected = read(client, target), read("netcdf4" if client == "netcdf4" else "xarray", on_file)
            for name in ("contiguous", "edge", "shuffle_gzip", "unsigned", "compact"):
                assert got[name]["values"] == expected[name]["values"], (client, name)
                assert "_FillValue" not in got[name]["attrs"], (client, name)
