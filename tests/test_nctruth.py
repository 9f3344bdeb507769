"""netCDF truth through the decoded view: fill values, packed data, missing chunks, attribute types,
characters and consolidated metadata, read by Debian's ncdump (4.9.0), netCDF4-python (4.10.1) and
xarray, against the same clients reading the SOURCE file (issue 12).

The source is an ordinary CF file written by netCDF4-python, kerchunked as users do; kerchunk moves
``_FillValue`` into ``.zarray`` ``fill_value`` and writes attributes as plain JSON.
"""

from __future__ import annotations

import json
import subprocess
import warnings

import netCDF4
import numpy as np
import pytest

from tests.support import clients as C
from tests.support.datasets import kerchunk_refs

# What makes this system's ncdump read strings as characters: netCDF-C 4.9.0 (Debian 12) only with
# --chars char ('<U1'); >= 4.9.3 (Debian 13) in its own form, nc493 (NCZarr's '>S1', no option).
NCDUMP_CHARS = ("--chars", "char") if C.netcdf_form(C.netcdf_version()) == "nc49" else ()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A CF file: float with _FillValue 1e20 and 15 missing points, packed int16 with -9999 fill,
    a variable with one chunk never written, typed attributes, a char array."""
    path = tmp_path_factory.mktemp("cf") / "cf.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("t", 30)
        ds.createDimension("x", 5)
        ds.createDimension("n", 4)
        tas = ds.createVariable("tas", "f4", ("t",), fill_value=np.float32(1e20), chunksizes=(10,))
        tas.units = "K"
        values = np.arange(30, dtype="f4") + 250
        mask = np.zeros(30, bool)
        mask[::2] = True  # 15 missing points
        tas[:] = np.ma.masked_array(values, mask)
        packed = ds.createVariable("packed", "i2", ("x",), fill_value=np.int16(-9999))
        packed.scale_factor = np.float32(0.001)
        packed.add_offset = np.float32(10)
        packed.valid_range = np.array([-5000, 5000], "i2")
        packed.set_auto_maskandscale(False)
        packed[:] = np.array([-9999, -9999, 2000, 3000, 4000], "i2")
        gappy = ds.createVariable("gappy", "f4", ("t",), fill_value=np.float32(-1), chunksizes=(10,))
        gappy[:10] = np.arange(10)  # chunks 1 and 2 are never written
        ds.createVariable("nodata", "f4", ("x",))  # never written: reads as netCDF's default fill
        ds.createVariable("inodata", "i4", ("x",))
        small = ds.createVariable("small_int", "i1", ("x",))  # no _FillValue, every value written
        small[:] = np.arange(5)
        station = ds.createVariable("station", "S1", ("x", "n"))
        station[:] = netCDF4.stringtochar(np.array(["ab", "cde", "", "fghi", "x"], "S4"))
        ds.title = "héllo °C"
        ds.count = np.int16(7)
        ds.ratio = np.float32(0.1)
        ds.big = np.int64(2**40)
        ds.small = np.uint8(200)
        ds.empty = ""
    return path


@pytest.fixture(scope="module")
def mounts(source, tmp_path_factory):
    from tests.conftest import Mount

    root = tmp_path_factory.mktemp("cfmnt")
    refs = root / "refs.json"
    refs.write_text(json.dumps(kerchunk_refs(source)))
    made = {}
    try:
        for name, args in {"default": [], "string": ["--chars", "string"], "ubyte": ["--chars", "ubyte"],
                           "raw": ["--view", "raw"]}.items():
            made[name] = Mount(refs, root / f"mnt_{name}", args).start()
        yield made
    finally:
        for m in made.values():
            m.stop()


def _ncdump_vars(target, names):
    return C.parse_ncdump(C.ncdump(target, names))


def test_ncdump_prints_fill_as_in_the_source(source, mounts):
    names = ["tas", "packed", "gappy", "nodata", "inodata", "small_int"]
    want = _ncdump_vars(str(source), names)
    got = _ncdump_vars(C.nczarr_url(mounts["default"].path), names)
    for name in names:
        assert [x is C.FILL for x in got[name].items] == [x is C.FILL for x in want[name].items], name
        assert got[name].items == want[name].items, name
    assert sum(x is C.FILL for x in got["tas"].items) == 15


# What kerchunk loses: it writes 7, not 7 as a short (int is the best guess), and text
# without saying whether it was char or string (netCDF4-python writes non-ASCII text as string).
KERCHUNK_TYPE_LOSSES = {":count = 7s ;": ":count = 7 ;", ":small = 200UB ;": ":small = 200 ;",
                        'string :title = "héllo °C" ;': ':title = "héllo °C" ;',
                        ':empty = "" ;': ':empty = " " ;'}  # kerchunk writes "" as " "


def _attribute_lines(cdl: str) -> set[str]:
    header = cdl.split("data:")[0]
    return {line.strip() for line in header.splitlines() if ":" in line and "=" in line}


def test_ncdump_header_types_match_the_source(source, mounts):
    want = _attribute_lines(C.ncdump(str(source)))
    got = _attribute_lines(C.ncdump(C.nczarr_url(mounts["default"].path)))
    want = {KERCHUNK_TYPE_LOSSES.get(line, line) for line in want if "_NCProperties" not in line}
    extra = {line for line in got - want if not line.split("=")[0].strip().endswith(":_nczarr_attr")}
    assert not want - got and not extra, f"missing {sorted(want - got)}, extra {sorted(extra)}"
    assert "tas:_FillValue = 1.00000002e+20f ;" in got and "packed:valid_range = -5000s, 5000s ;" in got


def test_netcdf4_masks_and_unpacks_as_the_source(source, mounts):
    url = C.nczarr_url(mounts["string"].path)  # netCDF-C >= 4.10 cannot open 4.9's char form
    with netCDF4.Dataset(source) as want, netCDF4.Dataset(url) as got:
        for name in ("tas", "packed", "gappy", "nodata", "inodata", "small_int"):
            a, b = want[name][:], got[name][:]
            assert a.dtype == b.dtype, name
            assert np.array_equal(np.ma.getmaskarray(a), np.ma.getmaskarray(b)), name
            assert np.array_equal(a.filled(0), b.filled(0)), name
        assert float(got["packed"][:].mean()) == pytest.approx(float(want["packed"][:].mean()))
        assert got.getncattr("count").dtype == np.int32  # a short to the source: kerchunk lost the type
        assert got.getncattr("ratio").dtype == np.float32 and got.getncattr("big").dtype == np.int64
        assert got.getncattr("title") == "héllo °C" and got.getncattr("empty") == " "  # kerchunk's " " for ""


def test_xarray_masks_as_the_source(source, mounts):
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # consolidated metadata: no warning, except zarr's for zarr.json beside
        # .zgroup, found by a process with netCDF-C loaded such as this one (tests/test_two_libraries.py)
        warnings.filterwarnings("ignore", "Both zarr.json")
        got = xr.open_zarr(mounts["string"].path)
    with xr.open_dataset(source) as want, got:
        for name in ("tas", "gappy", "small_int"):  # (int8 stays int8: no fill to mask)
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)
        # xarray reads scale_factor from JSON as a Python float and so unpacks in float64 (the
        # source's float32 attribute gives float32): the same on any Zarr copy, so compare loosely
        np.testing.assert_allclose(got["packed"].values, want["packed"].values, rtol=1e-6)
        assert np.array_equal(np.isnan(got["packed"].values), np.isnan(want["packed"].values))
        assert got.attrs["title"] == want.attrs["title"]
        assert not any(k.lower().startswith("_nczarr") for k in got.attrs)


def test_consolidated_metadata_matches_every_served_key(mounts):
    for name in ("default", "raw"):
        root = mounts[name].path
        consolidated = json.loads((root / ".zmetadata").read_text())
        assert consolidated["zarr_consolidated_format"] == 1
        served = {str(p.relative_to(root)): json.loads(p.read_text()) for p in root.rglob(".z*")
                  if p.name in (".zarray", ".zattrs", ".zgroup")}
        assert consolidated["metadata"] == served, name


def test_netcdf_c_410_reads_consolidated(mounts, source):
    url = f"file://{mounts['string'].path}#mode=zarr,file,consolidated"
    with netCDF4.Dataset(url) as got, netCDF4.Dataset(source) as want:
        assert np.array_equal(np.ma.getmaskarray(got["tas"][:]), np.ma.getmaskarray(want["tas"][:]))


def test_chars_forms(mounts, source):
    with netCDF4.Dataset(source) as ds:
        text = [b"".join(row).decode() for row in ds["station"][:].filled(b"")]
    assert text == ["ab", "cde", "", "fghi", "x"]
    # default (--chars char): Debian 12's ncdump prints the text, as for the source
    dumped = _ncdump_vars(C.nczarr_url(mounts["default"].path), ["station"])["station"].items
    assert [s.decode() for s in dumped] == text
    # --chars string: netCDF-C 4.10 and zarr read the characters
    with netCDF4.Dataset(C.nczarr_url(mounts["string"].path)) as ds:
        assert ["".join(row) for row in ds["station"][:]] == text
    # --chars ubyte: bytes as numbers, readable by everyone
    ubyte = _ncdump_vars(C.nczarr_url(mounts["ubyte"].path), ["station"])["station"].items
    assert bytes(ubyte).rstrip(b"\0") .split(b"\0")[0] == b"ab"


def test_fixed_strings_served_as_characters(mount):
    import base64

    data = np.array([b"ab", b"hello", b"", b"xyzzy"], "S5")
    refs = {".zgroup": '{"zarr_format": 2}',
            "s/.zarray": json.dumps({"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "|S5",
                                     "compressor": None, "filters": None, "fill_value": None, "order": "C"}),
            "s/.zattrs": '{"_ARRAY_DIMENSIONS": ["n"]}',
            "s/0": "base64:" + base64.b64encode(data[:2].tobytes()).decode(),
            "s/1": "base64:" + base64.b64encode(data[2:].tobytes()).decode()}
    mnt = mount(refs, "--chars", "char")
    assert sorted(p.name for p in (mnt / "s").iterdir()) == [".zarray", ".zattrs", "0.0", "1.0"]
    zarray = json.loads((mnt / "s" / ".zarray").read_text())
    assert zarray["shape"] == [4, 5] and zarray["chunks"] == [2, 5]
    if not NCDUMP_CHARS:
        mnt = mount(refs)
    dumped = _ncdump_vars(C.nczarr_url(mnt.path), ["s"])["s"].items
    assert dumped == [b"ab", b"hello", b"", b"xyzzy"]


def test_variable_length_strings_served_fixed(tmp_path, mount):
    """kerchunk inlines HDF5 strings as |O + vlen-utf8: served with the longest string's length."""
    path = tmp_path / "s.nc"
    words = ["one", "two", "three", "", "é"]
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 5)
        ds.createVariable("s", str, ("x",))[:] = np.array(words, object)
    refs = kerchunk_refs(path)
    mnt = mount(refs, "--chars", "string")
    with netCDF4.Dataset(C.nczarr_url(mnt.path)) as ds:
        assert list(ds["s"][:]) == words
    mnt = mount(refs, *NCDUMP_CHARS)
    dumped = _ncdump_vars(C.nczarr_url(mnt.path), ["s"])["s"].items
    assert [b.decode() for b in dumped] == words


def test_utf32_strings_served_as_utf8(mount):
    import base64

    data = np.array(["ab", "héllo", "", "€"], "<U5")
    refs = {".zgroup": '{"zarr_format": 2}',
            "u/.zarray": json.dumps({"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<U5",
                                     "compressor": None, "filters": None, "fill_value": None, "order": "C"}),
            "u/.zattrs": '{"_ARRAY_DIMENSIONS": ["n"]}',
            "u/0": "base64:" + base64.b64encode(data.tobytes()).decode()}
    mnt = mount(refs, "--chars", "string")
    with netCDF4.Dataset(C.nczarr_url(mnt.path)) as ds:
        assert list(ds["u"][:]) == list(data)
    mnt = mount(refs, *NCDUMP_CHARS)
    assert [b.decode() for b in _ncdump_vars(C.nczarr_url(mnt.path), ["u"])["u"].items] == list(data)


def test_variable_never_written_along_the_unlimited_dimension(tmp_path, mount):
    """kerchunk gives a variable the records written to it (0 if none); netCDF gives it the
    dimension's length, fill where it was not written, in its own group and in subgroups."""
    import xarray as xr

    path = tmp_path / "u.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("time", None)
        ds.createDimension("x", 3)
        ds.createVariable("t", "f8", ("time",))[:] = np.arange(6.0)
        ds.createVariable("empty", "f4", ("time",), fill_value=np.float32(-9999))
        ds.createVariable("partial", "i4", ("time", "x"))[:2] = 7
        obs = ds.createGroup("obs")
        obs.createVariable("pr", "f4", ("time", "x"), chunksizes=(1, 3))[:4] = 1.5
        obs.createVariable("cnt", "i2", ("time", "x"), chunksizes=(1, 3))[:1] = 3
    mnt = mount(kerchunk_refs(path), "--chars", "string")
    names = ["empty", "partial", "obs/pr", "obs/cnt"]
    dumped = _ncdump_vars(C.nczarr_url(mnt.path), names)
    assert dumped["empty"].items == [C.FILL] * 6
    want = _ncdump_vars(str(path), names)
    for name in names:
        assert dumped[name].items == want[name].items, name
    with netCDF4.Dataset(path) as w, netCDF4.Dataset(C.nczarr_url(mnt.path)) as g:
        assert w["empty"][:].mask.all() and len(w["empty"][:]) == 6
        for name in names:
            a, b = w[name][:], g[name][:]
            assert a.shape == b.shape and np.array_equal(np.ma.getmaskarray(a), np.ma.getmaskarray(b)), name
            assert np.array_equal(a.filled(0), b.filled(0)), name
    with xr.open_dataset(path, group="obs") as w, xr.open_zarr(mnt.path, group="obs") as g:
        # xarray masks netCDF's default fill on the mount (a Zarr fill_value), not in the file
        source = w["pr"].values
        source[source == netCDF4.default_fillvals["f4"]] = np.nan
        np.testing.assert_array_equal(g["pr"].values, source)


def test_zero_fill_and_empty_dimensions(tmp_path, mount):
    """nccopy writes files without fill values: kerchunk then reports HDF5's fill 0 for a scalar, and
    h5py files have HDF5's fill 0 on every dataset. Neither may mask real zeros. An array with a
    0-length dimension everywhere is hidden (it would make ncdump 4.9.0 fail the whole dataset), with
    a log line."""
    import h5py

    path = tmp_path / "z.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 4)
        ds.createDimension("rec", None)
        ds.createVariable("precip", "f4", ("x",))[:] = [0.0, 1.5, 0.0, 2.0]
        ds.createVariable("level", "i4", ())[:] = 0
        ds.createVariable("norecords", "f4", ("rec",))
    nofill = tmp_path / "nofill.nc"
    subprocess.run(["nccopy", "-d4", "-s", str(path), str(nofill)], check=True)
    refs = kerchunk_refs(nofill)
    assert json.loads(refs["refs"]["level/.zarray"])["fill_value"] == 0  # HDF5's, not a _FillValue
    mnt = mount(refs)
    dumped = _ncdump_vars(C.nczarr_url(mnt.path), ["precip", "level"])
    assert dumped["precip"].items == [0.0, 1.5, 0.0, 2.0] and dumped["level"].items == [0]
    assert not (mnt / "norecords").exists() and "hiding array norecords" in mnt.log()

    plain = tmp_path / "plain.h5"  # an HDF5 file from h5py: every dataset has HDF5's fill 0
    with h5py.File(plain, "w") as f:
        f["counts"] = np.array([[0, 3], [0, 7]], "i4")
        f["flags"] = np.array([0, 255, 1], "u1")
    mnt = mount(kerchunk_refs(plain))
    with netCDF4.Dataset(C.nczarr_url(mnt.path)) as ds:
        assert not np.ma.is_masked(ds["counts"][:]) and ds["counts"][:].tolist() == [[0, 3], [0, 7]]
        assert not np.ma.is_masked(ds["flags"][:]) and ds["flags"][:].tolist() == [0, 255, 1]


def _declared_fills_source(path):
    """Variables with a declared _FillValue equal to netCDF's default, or 0, beside undeclared ones."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 4)
        ds.createVariable("x", "f4", ("x",))[:] = np.arange(4)  # a coordinate: kerchunk gives it no fill
        ds.createVariable("n", "i4", ("x",))[:] = [1, 2, 3, 4]  # no _FillValue: stays an integer in xarray
        v = ds.createVariable("counts", "i4", ("x",), fill_value=netCDF4.default_fillvals["i4"])
        v[:] = np.ma.masked_array([5, 6, 7, 8], [False, True, False, False])
        v = ds.createVariable("flags", "u1", ("x",), fill_value=np.uint8(0))
        v.set_auto_mask(False)
        v[:] = np.array([0, 1, 2, 0], "u1")
        v = ds.createVariable("tas", "f4", ("x",), fill_value=np.float32(netCDF4.default_fillvals["f4"]))
        v[:] = np.ma.masked_array([1, 2, 3, 4], [True, False, False, False])
        ds.createVariable("never", "i2", ("x",), fill_value=np.int16(0))  # never written


def test_declared_fills_are_served_as_in_the_source(tmp_path, mount):
    """kerchunk gives a netCDF-4 variable without _FillValue a null fill_value: with that sign in the
    set, a fill of 0 or of netCDF's default is the source's own _FillValue and is masked as there."""
    import xarray as xr

    path = tmp_path / "declared.nc"
    _declared_fills_source(path)
    refs = kerchunk_refs(path)
    assert json.loads(refs["refs"]["n/.zarray"])["fill_value"] is None
    mnt = mount(refs, "--chars", "string")
    names = ["n", "counts", "flags", "tas", "never"]
    want, got = _ncdump_vars(str(path), names), _ncdump_vars(C.nczarr_url(mnt.path), names)
    for name in names:
        assert got[name].items == want[name].items, name
    with netCDF4.Dataset(path) as w, netCDF4.Dataset(C.nczarr_url(mnt.path)) as g:
        for name in names:
            a, b = w[name][:], g[name][:]
            assert np.array_equal(np.ma.getmaskarray(a), np.ma.getmaskarray(b)), name
            assert np.array_equal(a.filled(0), b.filled(0)), name
            assert ("_FillValue" in g[name].ncattrs()) == (name != "n"), name
    with xr.open_dataset(path) as w, xr.open_zarr(mnt.path) as g:
        for name in names:
            assert g[name].dtype == w[name].dtype, name
            np.testing.assert_array_equal(g[name].values, w[name].values, err_msg=name)


def test_a_single_variable_with_netcdfs_default_declared(tmp_path, mount):
    """No null fill in the set to go by: netCDF's default fill on an array with dimensions is served
    (netCDF-C masks it anyway), so xarray masks it as in the source."""
    import xarray as xr

    path = tmp_path / "single.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.createDimension("x", 3)
        v = ds.createVariable("v", "i4", ("x",), fill_value=netCDF4.default_fillvals["i4"])
        v[:] = np.ma.masked_array([1, 2, 3], [False, True, False])
    mnt = mount(kerchunk_refs(path))
    with xr.open_dataset(path) as w, xr.open_zarr(mnt.path) as g:
        assert g["v"].dtype == w["v"].dtype == np.float64
        np.testing.assert_array_equal(g["v"].values, w["v"].values)


def test_files_combined_along_time_read_as_the_source(tmp_path, mount):
    """kerchunk's MultiZarrToZarr along time (how archives are mounted): declared fills of 0 and of
    a packed short are masked, undeclared integers stay integers, as xarray.open_mfdataset reads the
    files themselves."""
    import xarray as xr
    from kerchunk.combine import MultiZarrToZarr

    paths = []
    for k in range(3):
        path = tmp_path / f"f{k}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("x", 4)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "days since 2000-01-01"
            t[:] = np.arange(2) + 2 * k
            ds.createVariable("x", "f4", ("x",))[:] = np.arange(4)
            pr = ds.createVariable("pr", "i2", ("time", "x"), fill_value=np.int16(-32767))
            pr.scale_factor = 0.1
            pr.set_auto_maskandscale(False)
            values = np.full((2, 4), 10 * k, "i2")
            values[0, 0] = -32767
            pr[:] = values
            ds.createVariable("cnt", "i4", ("time", "x"))[:] = k
            flag = ds.createVariable("flag", "u1", ("time", "x"), fill_value=np.uint8(0))
            flag.set_auto_mask(False)
            flag[:] = np.array([[0, 1, 2, 3], [0, 0, 1, 1]], "u1")
        paths.append(path)
    combined = MultiZarrToZarr([kerchunk_refs(p) for p in paths], concat_dims=["time"],
                               identical_dims=["x"]).translate()
    mnt = mount(combined, "--chars", "string")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = xr.open_mfdataset(paths, combine="by_coords").load()
        got = xr.open_zarr(mnt.path).load()
    for name in ("pr", "cnt", "flag", "time"):
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=name)
    dumped = _ncdump_vars(C.nczarr_url(mnt.path), ["flag"])["flag"].items
    assert dumped[:4] == [C.FILL, 1, 2, 3] and dumped[4:6] == [C.FILL, C.FILL]
