"""HDF5 storage and metadata archives hold that the earlier survey (tests/test_unseen_netcdf.py) did not
reach, mounted directly, read by netCDF4-python and xarray each in a process of its own against the same
client on the file. bench/NOTES.md (unseen3) has the whole survey these cases come from."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.support.clients import nczarr_url
from tests.test_unseen_netcdf import read


def _disagreeing_fill(path) -> None:
    """h5py datasets whose _FillValue attribute is set beside HDF5's own fill, with chunks never written."""
    import h5py

    with h5py.File(path, "w") as f:
        d = f.create_dataset("disagree", shape=(12,), dtype="i2", chunks=(4,), fillvalue=-1)
        d[:4] = [1, -2, -1, 4]
        d.attrs["_FillValue"] = np.int16(-2)
        b = f.create_dataset("big_endian", shape=(12,), dtype=">f8", chunks=(4,), fillvalue=7.5)
        b[4:8] = [1, -9, 7.5, 2]
        b.attrs["_FillValue"] = np.float64(-9)
        a = f.create_dataset("agree", shape=(12,), dtype="i2", chunks=(4,), fillvalue=-2)
        a[:4] = [1, -2, -1, 4]
        a.attrs["_FillValue"] = np.int16(-2)


def test_fill_attribute_beside_another_hdf5_fill_reads_as_the_file(tmp_path, mount):
    """netCDF-C reads a never-written chunk as HDF5's fill and masks only _FillValue's points; a direct
    mount did mask the never-written chunks (kerchunk's fill_value is the attribute)."""
    path = tmp_path / "fills.h5"
    _disagreeing_fill(path)
    m = mount(path)
    for client, target, on_file in (("netcdf4", nczarr_url(m.path), "netcdf4"), ("zarr", m.path, "xarray")):
        got, expected = read(client, target), read(on_file, path)
        for name in ("disagree", "big_endian", "agree"):
            assert got[name]["values"] == expected[name]["values"], (client, name)
    got = read("netcdf4", nczarr_url(m.path))
    assert got["disagree"]["values"] == [1, None, -1, 4] + [-1] * 8
    assert got["disagree"]["attrs"]["_FillValue"] == -2 and got["agree"]["values"][4:] == [None] * 8


def test_space_padded_strings_read_as_netcdf_c_reads_the_file(tmp_path, mount):
    """netCDF-C reads an HDF5 space-padded value's bytes to its first NUL, spaces kept, in datasets and
    attributes; a direct mount served h5py's value (trailing spaces stripped)."""
    import h5py

    path = tmp_path / "spacepad.h5"
    values = np.array([b"ab    ", b"abcdef", b"  x   ", b"y \0z  "], "S6")
    with h5py.File(path, "w") as f:
        tid = h5py.h5t.C_S1.copy()
        tid.set_size(6)
        tid.set_strpad(h5py.h5t.STR_SPACEPAD)
        h5py.h5d.create(f.id, b"spacepad", tid, h5py.h5s.create_simple(values.shape)).write(
            h5py.h5s.ALL, h5py.h5s.ALL, values, mtype=tid)
        for owner in (f, f["spacepad"]):  # (attributes too: h5py strips them, kerchunk reads h5py's)
            h5py.h5a.create(owner.id, b"units", tid, h5py.h5s.create(h5py.h5s.SCALAR)).write(
                np.array(b"m s-1 ", "S6"), mtype=tid)
    m = mount(path)
    expected = read("netcdf4", path)
    assert expected["spacepad"]["values"] == ["ab    ", "abcdef", "  x   ", "y "]
    assert expected["@"]["units"] == expected["spacepad"]["attrs"]["units"] == "m s-1 "
    got = read("netcdf4", nczarr_url(m.path))
    assert got["spacepad"]["values"] == expected["spacepad"]["values"]
    assert got["@"]["units"] == got["spacepad"]["attrs"]["units"] == "m s-1 "


def test_empty_dataspace_left_out_in_one_line_beside_a_64_bit_dimension(tmp_path, mount):
    """An H5S_NULL dataset (h5py.Empty), which netCDF-C cannot open the file beside, is left out naming
    why (was kerchunk's "object of type 'NoneType' has no len()"); a dimension of 2**33 reads right."""
    import h5py

    path = tmp_path / "empty.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("null", data=h5py.Empty("f4"))
        f.create_dataset("huge", shape=(2**33,), dtype="u1", chunks=(2**20,))[5:10] = 9
    m = mount(path)
    code = "import sys, netCDF4; ds = netCDF4.Dataset(sys.argv[1]); print(list(ds.variables), ds['huge'][:12].tolist())"
    proc = subprocess.run([sys.executable, "-c", code, nczarr_url(m.path)], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split("\n")[0] == "['huge'] [0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 0, 0]", proc.stderr[-2000:]
    assert "null: an empty dataspace (H5S_NULL)" in m.log()


def test_bzip2_chunks_decoded_on_a_direct_mount(tmp_path, mount):
    """HDF5's bzip2 filter (307: netCDF-C's nc_def_var_bzip2, hdf5plugin), alone and after shuffle:
    kerchunk refuses it, the direct scan references it (a plain bz2 stream per chunk, numcodecs' BZ2)."""
    import h5py
    import hdf5plugin

    path = tmp_path / "bzip2.h5"
    data = (np.arange(120 * 70, dtype="f4").reshape(120, 70) % 97) * 1.5
    with h5py.File(path, "w") as f:
        f.create_dataset("bz", data=data, chunks=(50, 30), **hdf5plugin.BZip2(blocksize=5))
        f.create_dataset("shuffle_bz", data=data.astype("i4"), chunks=(50, 30), shuffle=True, **hdf5plugin.BZip2())
    m = mount(path)
    code = ("import sys, json, netCDF4; ds = netCDF4.Dataset(sys.argv[1]); "
            "print(json.dumps({n: ds[n][:].tolist() for n in ('bz', 'shuffle_bz')}))")
    proc = subprocess.run([sys.executable, "-c", code, nczarr_url(m.path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["bz"] == data.tolist() and got["shuffle_bz"] == data.astype("i4").tolist()
