"""One mount (no flags), read at the same time by every kind of reader, each compared with the same
reader on the source file (issue 24; the conformance harness's snapshots and rules):
Debian's ncdump, NCO (ncks) and CDO (netCDF-C 4.9.0 on Debian 12, 4.9.3 on Debian 13), GDAL's Zarr
driver (gdalmdiminfo), netCDF4-python from its wheel (netCDF-C 4.10.1), xarray's zarr engine (a
process without netCDF-C) and xarray's netcdf4 engine. Each gets its own metadata form
(refmount.view.forms), told from the libraries its process has loaded; `refmount stats` says which
program got which. netCDF-C reads in `#mode=nczarr,file`, the mode the docs name.

REFMOUNT_TEST_NETCDF_ROOT=/var/cache/refmount/trixie runs the Debian programs of that userland
(tests/support/clients.py: `tool`), and the expectations follow their netCDF-C version.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from tests.conftest import Mount
from tests.support.clients import netcdf_form, netcdf_version, nczarr_url, tool, tool_exists
from tests.support.datasets import kerchunk_refs

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("ncdump", "ncks", "cdo", "gdalmdiminfo", "nccopy")
CLIENTS = ("ncdump", "nco", "cdo", "gdal", "netcdf4", "xarray", "xarray-netcdf4")

pytestmark = pytest.mark.skipif(not all(tool_exists(t) for t in TOOLS),
                                reason="needs Debian's netcdf-bin, nco, cdo and gdal-bin (apt-get install -y ...)")


def write_source(path: Path) -> None:
    """Characters (2-D names, one not ASCII: netCDF-C >= 4.10 reads '|S1' as one-byte strings, which
    netCDF4-python decodes as UTF-8, so its form joins them into strings; 1-D flags), variable-length strings, a gridded float with a fill, an
    `_Unsigned` short holding values above 32767, and a scalar (a CF grid mapping)."""
    with netCDF4.Dataset(path, "w") as d:
        d.createDimension("station", 3)
        d.createDimension("name_len", 8)
        d.createDimension("y", 4)
        d.createDimension("x", 5)
        names = d.createVariable("station_name", "S1", ("station", "name_len"))
        names[:] = np.array([b"Oslo", b"Bergen", "Tromsø".encode()], "S8").view("S1").reshape(3, 8)
        d.createVariable("flag", "S1", ("station",))[:] = np.array([b"a", b"b", b"c"], "S1")
        d.createVariable("comment", str, ("station",))[:] = np.array(["first", "", "third één"], object)
        tas = d.createVariable("tas", "f4", ("y", "x"), fill_value=np.float32(-999.0))
        tas.units, tas.grid_mapping = "K", "crs"
        values = np.arange(20, dtype="f4").reshape(4, 5) + 270
        values[1, 1] = -999.0
        tas[:] = values
        count = d.createVariable("count", "i2", ("y", "x"), fill_value=np.int16(-1))
        count._Unsigned = "true"
        count.set_auto_maskandscale(False)
        raw = (np.arange(20, dtype="i4").reshape(4, 5) * 3000).astype("u2").view("i2")  # up to 57000 unsigned
        raw[3, 4] = -1
        count[:] = raw
        crs = d.createVariable("crs", "i4", ())
        crs.grid_mapping_name = "latitude_longitude"
        crs[:] = 0
        d.title = "every reader"


def snapshot_in_child(client: str, path: Path, zarr: bool, work: Path) -> dict:
    """A client's snapshot taken by a program of its own (the way a user runs it), at the same time
    as the others: the harness's --snapshot entry point."""
    import pickle

    out = work / f"snap_{client}_{'zarr' if zarr else 'file'}.pkl"
    cmd = [sys.executable, "-m", "tests.conformance.run", "--snapshot", client, str(path),
           "zarr" if zarr else "file", json.dumps([""]), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{client}: {proc.stderr[-2000:]}"
    with open(out, "rb") as f:
        return pickle.load(f)


@pytest.fixture(scope="module")
def every_reader(tmp_path_factory):
    work = tmp_path_factory.mktemp("every_reader")
    source = work / "source.nc"
    write_source(source)
    refs = work / "refs.json"
    refs.write_text(json.dumps(kerchunk_refs(source)))
    mnt = Mount(refs, work / "mnt").start()
    try:
        with ThreadPoolExecutor(len(CLIENTS)) as pool:  # every reader on the one mount at once
            mounted = dict(zip(CLIENTS, pool.map(lambda c: snapshot_in_child(c, mnt.path, True, work), CLIENTS)))
        served = mnt.stats()["forms_served"]
        sources = {c: snapshot_in_child(c, source, False, work) for c in CLIENTS}
        yield {"work": work, "source": source, "refs": json.loads(refs.read_text()), "mounted": mounted,
               "sources": sources, "served": served, "log": mnt.log()}
    finally:
        mnt.stop()


def results(every_reader, client: str) -> list[dict]:
    from tests.conformance.compare import Refs, compare_snapshots

    compared_as = "xarray" if client == "xarray-netcdf4" else client
    return compare_snapshots(compared_as, every_reader["sources"][client], every_reader["mounted"][client],
                             Refs(every_reader["refs"]))


@pytest.mark.parametrize("client", CLIENTS)
def test_read_right_by_every_reader_at_once(every_reader, client):
    bad = [r for r in results(every_reader, client) if r["cls"] not in ("identical", "lost by kerchunk")]
    assert not bad, f"{client}: " + "; ".join(f"{r['var']}: {r['cls']}: {r['reason']}" for r in bad)


def test_each_program_got_its_own_form(every_reader):
    served = every_reader["served"]
    labels = {form: " ".join(readers) for form, readers in served.items()}
    version = ".".join(map(str, netcdf_version()))
    tools = labels[netcdf_form(netcdf_version())]  # nc49 (Debian 12's 4.9.0), nc493 (Debian 13's 4.9.3)
    assert f"ncdump (netCDF-C {version})" in tools and f"ncks (netCDF-C {version})" in tools
    assert f"cdo (netCDF-C {version})" in tools
    assert "gdalmdiminfo (GDAL)" in labels["gdal"]
    assert "(netCDF-C 4.10" in labels["nc410"]  # netCDF4-python, and xarray's netcdf4 engine
    assert "python" in labels["zarr"]  # xarray's zarr engine, in a process without netCDF-C


def test_unsigned_values_in_gdal(every_reader):
    """GDAL's Zarr driver ignores `_Unsigned`: its form has the unsigned dtype, and GDAL reads the
    source's values (its netCDF driver's UInt16, 57000 and all)."""
    got = every_reader["mounted"]["gdal"]["vars"]["count"]
    want = every_reader["sources"]["gdal"]["vars"]["count"]
    assert got.type == want.type == "UInt16"
    assert got.values == want.values and max(max(row) for row in got.values) == 65535
    assert got.attrs["(nodata_value)"][1] == want.attrs["(nodata_value)"][1] == 65535


def test_scalar_in_ncks(every_reader):
    """netCDF-C 4.9.0 (Debian 12's NCO 5.1) reads no Zarr scalar: a rank-0 array crashes it on reading,
    in zarr mode and in nczarr mode alike, even in a store its own nccopy wrote; so its form serves it
    [1] with netCDF-C's own scalar dimension name, `_scalar_`, and ncks reads the value right. (A store
    nccopy 4.9.0 wrote shows the scalar as [1] too, with a dimension named `_zdim_1`.) netCDF-C >= 4.9.3
    (Debian 13's NCO 5.3) reads NCZarr's own scalar, [1] marked "scalar", as a scalar in nczarr mode: its
    form serves that, and ncks shows `int crs` as for the source."""
    work, source = every_reader["work"], every_reader["source"]
    got = every_reader["mounted"]["nco"]["vars"]["crs"]
    assert every_reader["sources"]["nco"]["vars"]["crs"].dims == ()
    own = work / "own_nczarr"
    shutil.rmtree(own, ignore_errors=True)
    subprocess.run([*tool("nccopy"), "-V", "crs", str(source), f"file://{own}#mode=nczarr,file"], check=True)
    if netcdf_form(netcdf_version()) != "nc49":
        assert got.dims == () and got.values == 0
        own_scalar = subprocess.run([*tool("ncks"), "--jsn_fmt=1", "-v", "crs", nczarr_url(own)],
                                    capture_output=True, text=True, check=True)
        assert "shape" not in json.loads(own_scalar.stdout)["variables"]["crs"]
        return
    assert got.dims == ("_scalar_",) and got.values == [0]
    crashed = subprocess.run([*tool("ncks"), "-v", "crs", f"file://{own}#mode=nczarr,file"], capture_output=True)
    assert crashed.returncode != 0  # (a segmentation fault: netCDF-C 4.9.0 reads "dimrefs" past their end)
    zarr_mode = subprocess.run([*tool("ncks"), "--jsn_fmt=1", "-v", "crs", f"file://{own}#mode=zarr,file"],
                               capture_output=True, text=True, check=True)
    assert json.loads(zarr_mode.stdout)["variables"]["crs"]["shape"] == ["_zdim_1"]


def test_copy_in_a_readers_form(every_reader, tmp_path):
    """`cp -r` gives a copy in cp's form (zarr: what zarr/xarray read); REFMOUNT_FORM picks another: the
    form of this system's ncdump, which reads the copy's characters as text."""
    work = every_reader["work"]
    form = netcdf_form(netcdf_version())
    mnt = Mount(work / "refs.json", tmp_path / "mnt").start()
    try:
        subprocess.run(["cp", "-r", str(mnt.path), str(tmp_path / "plain")], check=True)
        subprocess.run(["cp", "-r", str(mnt.path), str(tmp_path / "forncdump")], check=True,
                       env={**os.environ, "REFMOUNT_FORM": form})
    finally:
        mnt.stop()
    plain = json.loads((tmp_path / "plain/station_name/.zarray").read_text())
    copied = json.loads((tmp_path / "forncdump/station_name/.zarray").read_text())
    assert (plain["dtype"], copied["dtype"]) == ("|S1", {"nc49": "<U1", "nc493": ">S1", "nc410": ">S1"}[form])
    dumped = subprocess.run([*tool("ncdump"), "-v", "station_name", nczarr_url(tmp_path / "forncdump")],
                            capture_output=True, text=True, check=True).stdout
    assert '"Oslo"' in dumped and '"Bergen"' in dumped and "char station_name(station, name_len)" in dumped
