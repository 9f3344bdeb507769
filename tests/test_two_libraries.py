"""One process, two libraries (issue 38): a Python process that reads a local netCDF file with
netCDF4-python (netCDF-C is then loaded, and the process gets netCDF-C's form of the v2 files) and
then the mount with xarray's zarr engine, or the other way round, as notebooks do. Each library must
read the mount as it reads the source file: netCDF4 through the v2 files in netCDF-C's form, xarray
through zarr.json (refmount.view.zarrjson). Before zarr.json, xarray failed there on any character
array ("No Zarr data type found that matches {'name': '>S1'}").

Each order runs in a program of its own (tests/support/two_libraries.py): the test process itself
has netCDF4 loaded.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import xarray as xr

ROOT = Path(__file__).resolve().parents[1]
GROUPS = ["", "obs"]


def write_source(path: Path, plain: bool = False) -> None:
    """What the forms differ on: characters (2-D names, one not ASCII; 1-D flags), variable-length
    strings (with an empty one), fills (a float _FillValue; an integer one over chunks never written),
    an `_Unsigned` short above 32767, a scalar, a list of strings as an attribute, a group with its own
    dimension and characters. `plain`: only what netCDF-C reads from kerchunk's own metadata (the raw
    view): ASCII characters, no scalar (4.10.1 drops it), no variable-length strings (it fails the whole
    open on them), no group (kerchunk names its dimensions "obs/n", which it fails on)."""
    with netCDF4.Dataset(path, "w") as d:
        d.title = "two libraries"
        d.setncattr_string("keywords", ["char", "zarr"])
        d.createDimension("station", 3)
        d.createDimension("name_len", 8)
        d.createDimension("y", 4)
        d.createDimension("x", 6)
        names = d.createVariable("station_name", "S1", ("station", "name_len"))
        names.long_name = "station name"
        names[:] = np.array([b"Oslo", b"Bergen", b"Tromso" if plain else "Tromsø".encode()], "S8").view("S1").reshape(3, 8)
        d.createVariable("flag", "S1", ("station",))[:] = np.array([b"a", b"b", b"c"], "S1")
        if not plain:
            d.createVariable("comment", str, ("station",))[:] = np.array(["first", "", "third één"], object)
        tas = d.createVariable("tas", "f4", ("y", "x"), fill_value=np.float32(-999.0), chunksizes=(2, 3))
        tas.units = "K"
        values = np.arange(24, dtype="f4").reshape(4, 6) + 270
        values[1, 1] = -999.0
        tas[:] = values
        count = d.createVariable("count", "i2", ("y", "x"), fill_value=np.int16(-1))
        count._Unsigned = "true"
        count.set_auto_maskandscale(False)
        count[:] = (np.arange(24, dtype="i4").reshape(4, 6) * 2500).astype("u2").view("i2")
        sparse = d.createVariable("sparse", "i4", ("y", "x"), fill_value=np.int32(-7), chunksizes=(2, 3))
        sparse[0:2, 0:3] = np.arange(6, dtype="i4").reshape(2, 3)  # (the other chunks are never written)
        if plain:
            return
        crs = d.createVariable("crs", "i4", ())
        crs.grid_mapping_name = "latitude_longitude"
        crs[:] = 0
        obs = d.createGroup("obs")
        obs.createDimension("n", 2)
        obs.createVariable("code", "S1", ("n", "name_len"))[:] = \
            np.array([b"AB1", b"XYZ9"], "S8").view("S1").reshape(2, 8)
        obs.createVariable("value", "f8", ("n",))[:] = [1.5, -2.25]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("two") / "source.nc"
    write_source(path)
    return path


@pytest.fixture(scope="module")
def refs(source) -> dict:
    from tests.support.datasets import kerchunk_refs

    return kerchunk_refs(source)


def in_one_process(order: str, source: Path, mnt: Path, work: Path, mode: str = "nczarr", groups=GROUPS) -> dict:
    out = work / f"{order}.pkl"
    proc = subprocess.run([sys.executable, "-m", "tests.support.two_libraries", order, str(source), str(mnt),
                           json.dumps(groups), str(out), mode], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, "rb") as f:
        return pickle.load(f)


def assert_same_netcdf(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        g = got[key]
        if key.endswith("/"):
            assert g == w, key
            continue
        assert (g["dtype"], g["dimensions"]) == (w["dtype"], w["dimensions"]), key
        assert np.array_equal(np.asarray(g["values"]), np.asarray(w["values"])), f"{key}: {g['values']!r} != {w['values']!r}"
        assert {k: np.asarray(v).tolist() for k, v in g["attributes"].items()} == \
            {k: np.asarray(v).tolist() for k, v in w["attributes"].items()}, key


def assert_same_xarray(got: dict, source: Path, groups=GROUPS) -> None:
    for group in groups:
        with xr.open_dataset(source, group=group or None) as want:
            want = want.load()
            for consolidated in (None, True, False):
                ds = got[group, consolidated]
                assert not isinstance(ds, str), f"xarray.open_zarr(group={group!r}, consolidated={consolidated}): {ds}"
                xr.testing.assert_identical(ds, want)
                for name, v in want.variables.items():  # (identical does not compare dtypes; text is str in
                    # both, numpy's on the file, objects through zarr, as in the zarr form's v2 files)
                    kinds = {ds[name].dtype.kind, v.dtype.kind}
                    assert ds[name].dtype == v.dtype or kinds == {"U", "O"}, (group, name, ds[name].dtype, v.dtype)


@pytest.mark.parametrize("order", ["netcdf-first", "zarr-first"])
def test_both_libraries_in_one_process(mount, source, refs, order, tmp_path):
    """The decoded view, in both orders: netCDF4 reads it as the source (char, strings, scalar, fills,
    in nczarr mode), and xarray.open_zarr with and without consolidated metadata, in each group, as
    xarray reads the source."""
    from tests.support.two_libraries import read_netcdf

    m = mount(refs)
    result = in_one_process(order, source, m.path, tmp_path)
    assert result["netcdf_loaded_for_xarray"] == (order == "netcdf-first")
    assert_same_xarray(result["xarray"], source)
    # zarr-python warns only where it finds zarr.json beside .zgroup: after netCDF-C was loaded
    both = "Both zarr.json (Zarr format 3) and .zgroup (Zarr format 2)"
    for group in GROUPS:
        for consolidated in (None, True, False):
            caught = result["xarray"]["warnings", group, consolidated]
            if order == "zarr-first":
                assert caught == [], (group, consolidated)
            else:
                assert both in caught[0], (group, consolidated)
    want = read_netcdf(str(source))
    assert_same_netcdf(result["netcdf"], want)
    served = m.stats()["forms_served"]
    assert any("netCDF-C 4.10" in reader for reader in served.get("nc410", {})), served


def test_raw_view_in_one_process(mount, tmp_path):
    """The raw view serves every key as referenced, the same to every process (no zarr.json): both
    libraries read it in one process too, as each reads it alone (netCDF-C: kerchunk's '|S1' as
    one-character strings)."""
    from tests.support.datasets import kerchunk_refs
    from tests.support.two_libraries import read_netcdf

    source = tmp_path / "plain.nc"
    write_source(source, plain=True)
    m = mount(kerchunk_refs(source), "--view", "raw")
    assert not (m.path / "zarr.json").exists()
    want = read_netcdf(str(source))
    with xr.open_dataset(source) as w:
        w = w.load()
    for order in ("netcdf-first", "zarr-first"):
        result = in_one_process(order, source, m.path, tmp_path, mode="zarr", groups=[""])
        got = result["netcdf"]
        for key in ("/tas", "/count", "/sparse"):
            assert np.array_equal(got[key]["values"], want[key]["values"]), (order, key)
        for key in ("/station_name", "/flag"):
            text = np.vectorize(lambda c: c.encode() if isinstance(c, str) else c, otypes=["S1"])(got[key]["values"])
            assert np.array_equal(text, want[key]["values"]), (order, key)
        for consolidated in (None, True, False):
            ds = result["xarray"]["", consolidated]
            assert not isinstance(ds, str), (order, consolidated, ds)
            xr.testing.assert_identical(ds, w)


def test_zarr_json_is_the_zarr_form(mount, refs):
    """zarr.json is the zarr form (no reader's form changes it), served in each group and array; chunk
    keys are v2's, so the same chunk files serve both. It is listed nowhere, and found by name only by a
    process served another form than `zarr` (this one has netCDF-C loaded): one without netCDF-C or
    GDAL reads the v2 files, as before, with no warning from zarr-python."""
    m = mount(refs)
    assert "zarr.json" not in os.listdir(m.path) and "zarr.json" not in os.listdir(m.path / "tas")
    for program in ("import os, sys", "import netCDF4, os, sys"):
        proc = subprocess.run([sys.executable, "-c", f"{program}; print(os.path.exists(sys.argv[1]))",
                               str(m.path / "tas" / "zarr.json")], capture_output=True, text=True, check=True)
        assert proc.stdout.strip() == str("netCDF4" in program), program
    root = json.loads((m.path / "zarr.json").read_text())
    assert root["node_type"] == "group" and root["zarr_format"] == 3
    assert sorted(root["consolidated_metadata"]["metadata"]) == sorted(
        ["station_name", "flag", "comment", "tas", "count", "sparse", "crs", "obs", "obs/code", "obs/value"])
    name = json.loads((m.path / "station_name" / "zarr.json").read_text())
    assert name == root["consolidated_metadata"]["metadata"]["station_name"]
    assert name["data_type"] == {"name": "null_terminated_bytes", "configuration": {"length_bytes": 1}}
    assert name["chunk_key_encoding"] == {"name": "v2", "configuration": {"separator": "."}}
    assert name["dimension_names"] == ["station", "name_len"]
    crs = json.loads((m.path / "crs" / "zarr.json").read_text())
    assert crs["shape"] == [] and crs["dimension_names"] == []
    # (each reader's own form of the v2 files is unchanged: netCDF-C's char)
    proc = subprocess.run([sys.executable, "-c", "import netCDF4, sys; sys.stdout.write(open(sys.argv[1]).read())",
                           str(m.path / "station_name" / ".zarray")], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["dtype"] == ">S1"
    assert json.loads((m.path / "station_name" / ".zarray").read_text())["dtype"] == ">S1"  # (this process too)


def test_one_form_for_everyone_serves_no_zarr_json(mount, refs):
    """--form serves one form to every program: no zarr.json beside it."""
    m = mount(refs, "--form", "zarr")
    assert not (m.path / "zarr.json").exists() and not (m.path / "tas" / "zarr.json").exists()


def test_no_exact_v3_form_serves_no_zarr_json(mount, refs):
    """Characters that zarr-python cannot read in any format (`--chars char`: netCDF-C 4.9's '<U1' for
    every reader) have no Zarr v3 form: no zarr.json anywhere (never part of a tree), one log line."""
    m = mount(refs, "--chars", "char")
    assert not (m.path / "zarr.json").exists() and not (m.path / "tas" / "zarr.json").exists()
    assert "no zarr.json" in m.log() and ": dtype <U1" in m.log()


def test_v3_documents():
    """The v2 -> v3 rules, on what the decoded view's zarr form can hold."""
    from refmount.view.zarrjson import NotExpressible, array_document, zarr_json_documents

    def zarray(dtype, fill, **kw):
        return {"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": dtype, "fill_value": fill, "order": "C",
                "compressor": None, "filters": None, "dimension_separator": ".", **kw}

    nan = array_document(zarray("<f8", "NaN"), {"_ARRAY_DIMENSIONS": ["t"], "units": "K"})
    assert nan["fill_value"] == "NaN" and nan["dimension_names"] == ["t"]
    assert nan["attributes"] == {"units": "K", "_FillValue": "AAAAAAAA+H8="}  # (xarray's base64 of NaN)
    assert array_document(zarray("<i2", -9999.0), {})["fill_value"] == -9999
    unsigned = array_document(zarray("<i2", None), {"_FillValue": -1, "_Unsigned": "true"})
    assert unsigned["fill_value"] == 0 and unsigned["attributes"]["_FillValue"] == -1  # (as xarray masks on v2)
    assert array_document(zarray("|S3", None), {})["fill_value"] == ""
    assert array_document(zarray("|u1", 3), {})["codecs"] == [{"name": "bytes"}]
    assert array_document(zarray("<u2", 3, dimension_separator="/"), {})["chunk_key_encoding"] == \
        {"name": "v2", "configuration": {"separator": "/"}}
    for bad in (zarray("<U1", None), zarray("|S1", "IA=="), zarray("<f4", None, compressor={"id": "zlib"}),
                zarray("<M8[s]", None)):
        with pytest.raises(NotExpressible):
            array_document(bad, {})
    with pytest.raises(NotExpressible, match="g/x: in a directory without .zgroup"):
        zarr_json_documents({"metadata": {".zgroup": {"zarr_format": 2}, "g/x/.zarray": zarray("<f4", None)}})
    root = zarr_json_documents({"metadata": {".zarray": zarray("<f4", None), ".zattrs": {"_ARRAY_DIMENSIONS": ["t"]}}})
    assert list(root) == ["zarr.json"] and root["zarr.json"]["node_type"] == "array"
