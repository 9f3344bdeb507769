"""The decoded view's NCZarr forms (refmount.view.forms: nc493 for netCDF-C 4.9.3 to 4.9.x, nc410 for
>= 4.10), read the way the docs name (`#mode=nczarr,file`) by netCDF4-python (the wheel's netCDF-C
4.10.1) and by this system's ncdump, NCO and CDO, against the same clients reading the source file
(issue 32): characters as char over their dimensions, scalars as scalars, dimensions in their groups,
fills. `#mode=zarr,file` reads the mount as netCDF-C reads a store its own library wrote.

The ncdump/NCO/CDO checks follow the netCDF-C version those programs use: Debian 12's 4.9.0 gets the
nc49 form (scalars over `_scalar_`, as before); Debian 13's 4.9.3 the nc493 form, read exactly.
REFMOUNT_TEST_NETCDF_ROOT=/var/cache/refmount/trixie runs that userland's programs (tests/support/clients.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from refmount.view.arrays import ArrayInfo, _plan
from refmount.view.forms import FORMS, nczarr_tree, served_array, served_group_attributes
from tests.support import clients as C
from tests.support.datasets import kerchunk_refs

CDL = Path(__file__).resolve().parent / "conformance" / "cdl" / "ncdump" / "ref_ctest1_nc4.cdl"


def write_source(path: Path) -> None:
    """A CF file with what NCZarr keeps and plain Zarr loses: chars (2-D with a non-ASCII name, 1-D),
    scalars (root and group), a group with a dimension of its own beside the root's, fills (declared,
    never written)."""
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("site", 3)
        d.createDimension("nchar", 8)
        d.createDimension("time", 4)
        names = d.createVariable("site_name", "S1", ("site", "nchar"))
        names[:] = np.array([b"Oslo", b"Bergen", "Tromsø".encode()], "S8").view("S1").reshape(3, 8)
        d.createVariable("flag", "S1", ("site",))[:] = np.array([b"a", b"b", b"c"], "S1")
        d.createVariable("version", "i4", ())[:] = 3
        tas = d.createVariable("tas", "f4", ("time", "site"), fill_value=np.float32(-999))
        tas.units, tas.valid_range = "K", np.array([0, 400], "f4")
        values = np.arange(12, dtype="f4").reshape(4, 3) + 270
        values[1, 1] = -999
        tas[:] = values
        d.createVariable("never", "i2", ("site",))  # never written: netCDF's default fill
        d.title = "nczarr form"
        obs = d.createGroup("obs")
        obs.createDimension("n", 2)
        code = obs.createVariable("code", "S1", ("n", "nchar"))
        code[:] = netCDF4.stringtochar(np.array([b"ab", b"c"], "S8"))
        obs.createVariable("val", "f8", ("n", "site"), fill_value=-1.0)[:] = np.ma.masked_array(
            np.ones((2, 3)), [[0, 1, 0], [0, 0, 0]])
        obs.createVariable("height", "f4", ())[:] = 1.5
        obs.note = "a group"


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    from tests.conftest import Mount

    work = tmp_path_factory.mktemp("nczarr_form")
    source = work / "source.nc"
    write_source(source)
    refs = work / "refs.json"
    refs.write_text(json.dumps(kerchunk_refs(source)))
    mnt = Mount(refs, work / "mnt").start()
    try:
        yield {"work": work, "source": source, "mnt": mnt}
    finally:
        mnt.stop()


def walk(group, prefix=""):
    yield prefix, group
    for name, child in group.groups.items():
        yield from walk(child, f"{prefix}/{name}")


def netcdf4_view(url) -> dict:
    """What netCDF4-python shows: each group's dimensions, each variable's dtype, dimensions, masked
    values and raw values, attributes with their dtypes."""
    out = {}
    with netCDF4.Dataset(url) as ds:
        for path, g in walk(ds):
            out[path or "/"] = {name: len(dim) for name, dim in g.dimensions.items()}
            for name, v in g.variables.items():
                v.set_auto_chartostring(False)
                masked = v[...]
                v.set_auto_maskandscale(False)
                attrs = {a: (np.asarray(v.getncattr(a)).dtype.str, np.asarray(v.getncattr(a)).tolist())
                         for a in v.ncattrs()}
                out[f"{path}/{name}"] = (v.dtype, v.dimensions, np.ma.getmaskarray(masked).tolist(),
                                         np.asarray(v[...]).tolist(), attrs)
    return out


def test_netcdf4_reads_chars_scalars_groups_and_fills_as_the_source(mounted):
    """netCDF4-python (4.10.1) in nczarr mode: every group's dimensions and every variable exactly as
    in the source: `site_name` is S1 over (site, nchar), `version` and `obs/height` are scalars, `n` is
    the group's dimension, fills mask the same points."""
    want = netcdf4_view(mounted["source"])
    got = netcdf4_view(C.nczarr_url(mounted["mnt"].path))
    assert got == want
    assert want["/site_name"][:2] == (np.dtype("S1"), ("site", "nchar")) and want["/obs/height"][1] == ()
    assert want["/obs"] == {"n": 2}


def test_ref_ctest1_nc4_chars_in_netcdf4(tmp_path, mount):
    """netCDF-C's own test file ref_ctest1_nc4: every char variable reads with the source's dtype,
    dimensions and bytes (it showed as strings of one dimension fewer before issue 32)."""
    source = tmp_path / "ctest1.nc"
    subprocess.run([*C.tool("ncgen"), "-k", "nc4", "-o", str(source), str(CDL)], check=True)
    mnt = mount(kerchunk_refs(source))
    chars = 0
    with netCDF4.Dataset(source) as want, netCDF4.Dataset(C.nczarr_url(mnt.path)) as got:
        for name, v in want.variables.items():
            if v.dtype != np.dtype("S1"):
                continue
            chars += 1
            w = got.variables[name]
            v.set_auto_chartostring(False)
            w.set_auto_chartostring(False)
            assert (w.dtype, w.dimensions) == (v.dtype, v.dimensions), name
            assert np.array_equal(np.ma.filled(w[...], b""), np.ma.filled(v[...], b"")), name
    assert chars >= 5


def test_zarr_mode_reads_as_netcdf_c_reads_its_own_store(mounted, tmp_path):
    """`#mode=zarr,file` ignores NCZarr's keys: netCDF4-python then reads the mount as it reads the
    NCZarr store its own library writes from the source (characters as one-character strings, scalars
    over `_scalar_`): same dtypes and shapes."""
    from tests.conformance.run import copy_with_netcdf4

    own = tmp_path / "own"
    copy_with_netcdf4(mounted["source"], f"file://{own}#mode=nczarr,file")

    def shapes(root):
        with netCDF4.Dataset(f"file://{root}#mode=zarr,file") as ds:
            return {f"{p}/{n}": (str(v.dtype), v.shape) for p, g in walk(ds) for n, v in g.variables.items()}

    got, want = shapes(mounted["mnt"].path), shapes(own)
    assert got == want
    assert got["/site_name"] == ("<class 'str'>", (3, 8)) and got["/version"][1] == (1,)


def _header(target: str) -> list[str]:
    text = subprocess.run([*C.tool("ncdump"), "-h", target], capture_output=True, text=True, check=True).stdout
    return sorted(line.strip() for line in text.splitlines()[1:] if line.strip())


# what kerchunk loses of the source: the title's and count's types (JSON has none) are not in this file;
# the group and variable order (kerchunk sorts its keys): the headers are compared line by line, sorted
def test_ncdump_ncks_and_cdo_read_as_the_source(mounted):
    """This system's ncdump (-h), NCO (ncks -m) and CDO (sinfon) on the mount in nczarr mode print
    what they print for the source (4.9.3 and later; Debian 12's 4.9.0 gets its own form, in which
    scalars have the dimension `_scalar_`, as before)."""
    source, url = str(mounted["source"]), C.nczarr_url(mounted["mnt"].path)
    got, want = _header(url), _header(source)
    if C.netcdf_form(C.netcdf_version()) == "nc49":
        assert "int version(_scalar_) ;" in got and "char site_name(site, nchar) ;" in got
        return
    assert got == want and "int version ;" in got and "char site_name(site, nchar) ;" in got

    def run(*args):
        return subprocess.run([*C.tool(args[0]), *args[1:]], capture_output=True, text=True, check=True).stdout

    assert run("ncks", "-m", url).splitlines()[1:] == run("ncks", "-m", source).splitlines()[1:]
    cdo_got, cdo_want = run("cdo", "-s", "sinfon", url), run("cdo", "-s", "sinfon", source)
    assert cdo_got.replace("NCZarr", "NetCDF4") == cdo_want and "tas" in cdo_got
    values = ("ncks", "-H", "-v", "site_name,tas,version")  # (the data, fill included; the first line names the file)
    assert run(*values, url).splitlines()[1:] == run(*values, source).splitlines()[1:]


# -- the form's metadata, without a mount ---------------------------------------------------------

def planned(path: str, zarray: dict, zattrs: dict) -> ArrayInfo:
    info = ArrayInfo(path=path, dir_id=1, zarray=zarray, zattrs=zattrs)
    _plan(info)
    return info


def zarray(dtype, shape, fill=None):
    return {"zarr_format": 2, "dtype": dtype, "shape": shape, "chunks": shape, "fill_value": fill,
            "order": "C", "compressor": None, "filters": None}


def test_nczarr_keys_as_netcdf_c_writes_them():
    """As trixie's nccopy writes NCZarr (measured, issue 32): chars '>S1' with their dimension
    references, a scalar [1] over `_scalar_` with none and "scalar": 1, each group's dimensions, arrays
    and subgroups, the superblock at the root, every attribute typed (text left to netCDF-C, which
    reads it as char). A dimension kerchunk names "obs/n" is the group's own."""
    arrays = [planned("site_name", zarray("|S1", [3, 8]), {"_ARRAY_DIMENSIONS": ["site", "nchar"]}),
              planned("version", zarray("<i4", []), {"_ARRAY_DIMENSIONS": []}),
              planned("tas", zarray("<f4", [4, 3], -999.0), {"_ARRAY_DIMENSIONS": ["time", "site"], "units": "K",
                                                             "valid_range": [0.0, 400.0]}),
              planned("obs/code", zarray("|S1", [2, 8]), {"_ARRAY_DIMENSIONS": ["obs/n", "nchar"]}),
              planned("nodims", zarray("<i2", [5]), {})]
    from refmount.view.arrays import _rename_clashing_dimensions

    _rename_clashing_dimensions(arrays)
    for name in ("nc493", "nc410"):
        form = FORMS[name]
        served = [(info, *served_array(info, form)) for info in arrays]
        tree = nczarr_tree(["", "obs"], served)
        z, a = {}, {}
        for info in arrays:
            z[info.path], a[info.path] = served_array(info, form, tree)
        assert z["site_name"]["dtype"] == ">S1" and z["version"]["shape"] == [1]
        assert a["site_name"]["_nczarr_array"] == {"dimension_references": ["/site", "/nchar"], "storage": "chunked"}
        assert a["version"]["_nczarr_array"] == {"dimension_references": [], "scalar": 1, "storage": "chunked"}
        assert a["version"]["_ARRAY_DIMENSIONS"] == ["_scalar_"]
        assert a["obs/code"]["_nczarr_array"]["dimension_references"] == ["/obs/n", "/nchar"]
        assert a["nodims"]["_nczarr_array"]["dimension_references"] == ["/_Anonymous_Dim_5"]
        assert a["tas"]["_nczarr_attr"]["types"] == {"_FillValue": "<f4", "valid_range": "<f4",
                                                      "_nczarr_array": "|J0", "_nczarr_attr": "|J0"}
        assert "_NCZARR_ATTR" not in a["tas"]
        root = served_group_attributes({"title": "t", "count": 7}, {}, form, "", tree)
        assert root["_nczarr_superblock"] == {"version": "2.0.0"}
        assert root["_nczarr_group"] == {"dimensions": {"site": 3, "nchar": 8, "time": 4, "_Anonymous_Dim_5": 5},
                                         "arrays": ["site_name", "version", "tas", "nodims"], "groups": ["obs"]}
        assert root["_nczarr_attr"]["types"]["count"] == "<i4" and "title" not in root["_nczarr_attr"]["types"]
        group = served_group_attributes({}, {}, form, "obs", tree)
        assert group["_nczarr_group"] == {"dimensions": {"n": 2}, "arrays": ["code"], "groups": []}
        assert "_nczarr_superblock" not in group
    for name in ("nc49", "zarr", "gdal", "portable"):  # (only the NCZarr forms have NCZarr's keys)
        assert not any(k.startswith("_nczarr_") and k != "_nczarr_attr" for k in served_array(arrays[0], FORMS[name])[1])


def test_inspect_names_the_mode(mounted):
    """`refmount inspect` says that netCDF-C >= 4.9.3 reads chars and scalars exactly in nczarr mode."""
    from tests.conftest import REFMOUNT

    out = subprocess.run([*REFMOUNT, "inspect", str(mounted["work"] / "refs.json")],
                         capture_output=True, text=True, check=True).stdout
    assert "exactly as 'file:///MNT#mode=nczarr,file'" in out
    assert "decoded netcdf-c >= 4.9.3 yes, characters as char ('>S1') in #mode=nczarr,file" in out
    assert "decoded form nc493    <i4 [1] fill None (_nczarr_attr, NCZarr keys: a scalar in #mode=nczarr,file)" in out
