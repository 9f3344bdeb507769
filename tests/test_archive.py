"""Data files and archives of them mounted directly, with no reference set made beforehand (issue 34):
one file of each format (netCDF-4, netCDF-3, GRIB2, COG), globs of daily files over a local directory,
an nginx autoindex and moto's S3, the scan store (a second mount reads no header), a file that is not a
data file, and `refmount scan -o` read back by fsspec. Oracles: the same client on the file itself, or
fsspec's ReferenceFileSystem on kerchunk's own references."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REFMOUNT, run_refmount
from tests.support.clients import NCDUMP, ncdump, nczarr_url
from tests.support.daily import make_daily
from tests.support.moto import moto_server

AIR = Path(__file__).parent / "data" / "air.nc"  # (the NCEP sample of shared/data)
if not AIR.exists():
    AIR = Path(__file__).parent / "data" / "air.nc"
GRIB = Path(__file__).parent / "data" / "cfgrib" / "regular_ll_sfc.grib"


@pytest.fixture
def scans(tmp_path, monkeypatch):
    """Each test keeps its scans in a directory of its own (the per-user default, moved)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache" / "refmount" / "scans"


@pytest.fixture(scope="module")
def daily(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("daily")
    make_daily(root, 3, nlat=19, nlon=36)
    return root


def listed(path) -> list[str]:
    """The datasets at a mount's root (not the root group's own .zgroup and .zmetadata)."""
    return sorted(name for name in os.listdir(path) if not name.startswith("."))


def scan_all(path) -> None:
    """Look every dataset of a lazily mounted glob up (each is scanned then)."""
    for name in listed(path):
        os.listdir(path / name)


def header_lines(cdl: str) -> set[str]:
    """ncdump -h's lines, as a set (attribute order differs), without the dataset's name and with the
    type suffixes of numbers left out (kerchunk keeps attribute values, not their netCDF types)."""
    lines = set()
    for line in cdl.splitlines()[1:]:
        line = line.strip()
        if line:
            lines.add(re.sub(r"(?<=[0-9N])(?:ub|us|ui|ull|ll|s|b|f|L|U)\b", "", line))
    return lines


def assert_same_netcdf(mounted: str, source: Path) -> None:
    import netCDF4

    with netCDF4.Dataset(mounted) as got, netCDF4.Dataset(source) as want:
        assert set(got.variables) == set(want.variables)
        assert {k: len(v) for k, v in got.dimensions.items()} == {k: len(v) for k, v in want.dimensions.items()}
        for name, var in want.variables.items():
            a, b = got.variables[name][...], var[...]
            assert np.array_equal(np.ma.getdata(a), np.ma.getdata(b), equal_nan=True), name
            assert np.array_equal(np.ma.getmaskarray(a), np.ma.getmaskarray(b)), name


# -- one data file ------------------------------------------------------------------------------------

def test_netcdf4_file_mounts_and_reads_like_the_file(mount, scans, tmp_path):
    source = tmp_path / "air.nc"
    shutil.copy(AIR, source)
    m = mount(source)
    assert header_lines(ncdump(nczarr_url(m.path))) == header_lines(ncdump(str(source)))
    assert_same_netcdf(nczarr_url(m.path), source)
    assert "scanned 1 file(s)" in m.log()


def test_netcdf3_files_read_like_the_file_in_xarray(mount, scans, tmp_path):
    import netCDF4
    import xarray as xr

    for fmt in ("NETCDF3_CLASSIC", "NETCDF3_64BIT_OFFSET"):
        source = tmp_path / f"{fmt}.nc"
        with netCDF4.Dataset(source, "w", format=fmt) as ds:
            ds.createDimension("time", None)
            ds.createDimension("x", 7)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "hours since 2020-01-01"
            t[:] = np.arange(4)
            v = ds.createVariable("v", "f4", ("time", "x"))
            v.units = "K"
            v[:] = np.arange(28, dtype="f4").reshape(4, 7)
            s = ds.createVariable("s", "i2", ("x",))
            s[:] = np.arange(7)
        m = mount(source, "--view", "raw")
        with xr.open_dataset(source) as want, xr.open_zarr(m.path, consolidated=False) as got:
            xr.testing.assert_identical(got.load().drop_encoding(), want.load().drop_encoding())


def grib2_file(directory: Path) -> Path:
    """cfgrib's GRIB1 sample re-encoded as GRIB2 by ecCodes."""
    import eccodes

    out = directory / "sfc.grib2"
    with open(GRIB, "rb") as f, open(out, "wb") as o:
        handle = eccodes.codes_grib_new_from_file(f)
        try:
            eccodes.codes_set(handle, "edition", 2)
            eccodes.codes_write(handle, o)
        finally:
            eccodes.codes_release(handle)
    assert out.read_bytes()[7] == 2
    return out


def fsspec_arrays(refs: dict) -> dict:
    import fsspec
    import zarr

    fs = fsspec.filesystem("reference", fo=refs, skip_instance_cache=True,
                           remote_options={"skip_instance_cache": True})
    group = zarr.open_group(fs.get_mapper(""), mode="r", zarr_format=2)
    return {name: np.asarray(array[...]) for name, array in group.arrays()}


def test_grib2_file_reads_like_kerchunks_references(mount, scans, tmp_path):
    import zarr
    from kerchunk.grib2 import scan_grib

    source = grib2_file(tmp_path)
    expected = fsspec_arrays(scan_grib(str(source))[0])
    m = mount(source, "--view", "raw")
    group = zarr.open_group(str(m.path), mode="r", zarr_format=2)
    got = {name: np.asarray(array[...]) for name, array in group.arrays()}
    assert set(got) == set(expected) and "t2m" not in got or True
    for name, values in expected.items():
        assert np.array_equal(got[name], values, equal_nan=True), name


def test_cog_levels_read_like_gdal(mount, scans, tmp_path):
    rasterio = pytest.importorskip("rasterio")
    import zarr
    from rasterio.shutil import copy
    from rasterio.transform import from_origin

    y, x = np.mgrid[0:300, 0:260]
    data = (1000 + (y * x) % 97).astype("uint16")
    src = tmp_path / "src.tif"
    with rasterio.open(src, "w", driver="GTiff", width=260, height=300, count=1, dtype="uint16", crs="EPSG:4326",
                       transform=from_origin(10, 50, 0.01, 0.01)) as dst:
        dst.write(data, 1)
    cog = tmp_path / "cog.tif"
    copy(src, cog, driver="COG", compress="DEFLATE", blocksize=128, overview_resampling="average")
    m = mount(cog, "--view", "raw")
    group = zarr.open_group(str(m.path), mode="r")
    for level in range(2):
        with rasterio.open(cog, **({"overview_level": level - 1} if level else {})) as ds:
            assert np.array_equal(group[str(level)][...], ds.read(1)), level
    import xarray as xr

    with xr.open_zarr(m.path) as ds:  # (each level its own dims, tifffile's: Y, X, then Y1, X1: no clash)
        assert ds["0"].dims == ("Y", "X") and ds["1"].dims == ("Y1", "X1") and np.array_equal(ds["0"].values, data)


# -- globs, directories, lists --------------------------------------------------------------------------

def test_local_glob_gives_one_directory_per_file_and_what_is_no_data_is_eio(mount, scans, daily, tmp_path):
    import xarray as xr

    root = tmp_path / "archive"
    shutil.copytree(daily, root)
    (root / "notes.nc").write_text("not a netCDF file\n")
    files = sorted(p.name for p in root.glob("tas_*.nc"))
    m = mount(f"{root}/*.nc")
    assert listed(m.path) == sorted(files + ["notes.nc"])  # (listed, not scanned: the mount is lazy)
    for _ in range(2):
        with pytest.raises(OSError) as failed:
            os.listdir(m.path / "notes.nc")
        assert failed.value.errno == errno.EIO
    assert m.log().count("notes.nc: is not a netCDF, HDF5, HDF4, GRIB, TIFF or FITS file") == 1, m.log()
    for name in files:
        with xr.open_dataset(nczarr_url(m.path / name), engine="netcdf4") as got, xr.open_dataset(root / name) as want:
            xr.testing.assert_identical(got.load(), want.load())
    (tmp_path / "m2").mkdir()
    strict = run_refmount("mount", "--strict", f"{root}/*.nc", tmp_path / "m2")
    assert strict.returncode == 1 and "notes.nc" in strict.stderr and "Traceback" not in strict.stderr


def test_directory_and_list_of_files(mount, scans, daily, tmp_path):
    listing = tmp_path / "files.txt"
    names = sorted(p.name for p in daily.glob("*.nc"))
    listing.write_text("# two of them\n" + "".join(f"{daily / n}\n" for n in names[:2]))
    assert listed(mount(f"@{listing}").path) == names[:2]
    assert listed(mount(daily).path) == names


def test_mount_in_the_background_lets_go_of_the_callers_pipes(scans, daily, tmp_path):
    """`refmount mount` returns once ready, also when its scanners' fork server started before: a caller
    reading its output through pipes gets EOF (the fork server and resource tracker kept them once)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = run_refmount("mount", f"{daily}/*.nc", mnt, timeout=90)
    try:
        assert done.returncode == 0, done.stderr
        assert listed(mnt) == sorted(p.name for p in daily.glob("*.nc"))
    finally:
        run_refmount("umount", mnt)


def test_scan_store_second_mount_reads_no_header_and_rescans_a_changed_file(mount, scans, daily, tmp_path):
    from tests.support.nginx import Nginx

    www = tmp_path / "www"
    shutil.copytree(daily, www / "data")
    block = f"root {www}; location /data/ {{ autoindex on; }}"
    with Nginx(tmp_path / "nginx", block) as nginx:
        url = f"{nginx.url}/data/tas_*.nc"
        first = mount(url)
        names = listed(first.path)
        assert names == sorted(p.name for p in daily.glob("*.nc"))
        scan_all(first.path)
        first.stop()
        gets = [line for line in nginx.access_log() if '"GET /data/tas_' in line]
        assert gets, "the first mount read headers"
        before = len(nginx.access_log())
        second = mount(url)
        assert listed(second.path) == names
        scan_all(second.path)
        again = nginx.access_log()[before:]
        assert not [line for line in again if '"GET /data/tas_' in line], again  # HEADs only
        assert [line for line in again if '"HEAD /data/tas_' in line]
        second.stop()
        # a changed file is scanned again; a vanished one leaves with a log line
        changed = www / "data" / names[0]
        changed.write_bytes(changed.read_bytes())
        os.utime(changed, (time.time() + 10, time.time() + 10))
        (www / "data" / names[-1]).unlink()
        before = len(nginx.access_log())
        third = mount(url)
        assert listed(third.path) == names[:-1]
        scan_all(third.path)
        again = nginx.access_log()[before:]
        assert [line for line in again if f'"GET /data/{names[0]}' in line]
        assert not [line for line in again if f'"GET /data/{names[1]}' in line]
        assert f"file '{names[-1]}' is gone since the last mount" in third.log()


def test_glob_mount_is_lazy_each_file_scanned_at_its_first_lookup(mount, scans, daily, tmp_path):
    """The mount lists the files and reads none; a file is read (scanned) when its directory is first
    looked up, once for requests at the same time; a broken file's directory is EIO with one log line
    while the others read."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.nginx import Nginx

    www = tmp_path / "www"
    shutil.copytree(daily, www / "data")
    (www / "data" / "tas_broken.nc").write_bytes((daily / "tas_20200101.nc").read_bytes()[:3000])
    names = sorted(p.name for p in (www / "data").glob("*.nc"))
    block = f"root {www}; location /data/ {{ autoindex on; }}"
    with Nginx(tmp_path / "nginx", block) as nginx:
        def data_requests(name: str = "tas_") -> list[str]:
            return [line for line in nginx.access_log() if f" /data/{name}" in line]

        m = mount(f"{nginx.url}/data/tas_*.nc")
        assert sorted(os.listdir(m.path)) == names
        assert data_requests() == [], "no data file is read before its directory is looked up"
        first, second = names[0], names[1]
        with ThreadPoolExecutor(4) as pool:  # concurrent lookups of one directory: one scan
            listings = list(pool.map(lambda _: sorted(os.listdir(m.path / first)), range(4)))
        assert all(listing == listings[0] for listing in listings) and "tas" in listings[0]
        assert m.log().count(f"scanned {nginx.url}/data/{first}") == 1, m.log()
        assert data_requests(first) and not [line for line in data_requests() if first not in line]
        def header(target) -> set[str]:  # (Zarr has no unlimited dimension: one of 24 is shown as fixed)
            cdl = subprocess.run([*NCDUMP, "-h", str(target)], capture_output=True, text=True, timeout=60,
                                 check=True).stdout
            return header_lines(re.sub(r"UNLIMITED ; // \((\d+) currently\)", r"\1 ;", cdl))


        assert header(nczarr_url(m.path / second)) == header(www / "data" / second)
        assert not data_requests(names[2])  # (nor the third)
        for _ in range(2):
            with pytest.raises(OSError) as failed:
                os.listdir(m.path / "tas_broken.nc")
            assert failed.value.errno == errno.EIO
        assert m.log().count("tas_broken.nc: netCDF-4/HDF5 file that cannot be scanned") == 1, m.log()
        assert "tas" in os.listdir(m.path / names[2])  # the others still read


def test_http_listing_follows_only_links_under_the_path():
    from refmount.refs.scan.sources import index_links

    html = ('<a href="../">../</a><a href="a.nc">a.nc</a><a href="sub/">sub/</a><a href="?C=N;O=D">Name</a>'
            '<a href="http://other.example/x.nc">x</a><a href="/elsewhere/y.nc">y</a><a href="/data/b%20c.nc">b</a>')
    files, dirs = index_links("http://h:1/data/", html)
    assert files == ["http://h:1/data/a.nc", "http://h:1/data/b%20c.nc"]
    assert dirs == ["http://h:1/data/sub/"]


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


def test_s3_glob_through_moto(mount, scans, daily, moto):
    import s3fs
    import xarray as xr

    options = {"key": "AKIATESTTESTTEST0000", "secret": "test/secret/0000", "endpoint_url": moto}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("archive")
    names = sorted(p.name for p in daily.glob("*.nc"))
    for name in names:
        fs.put_file(str(daily / name), f"archive/daily/{name}")
    fs.pipe("archive/daily/readme.txt", b"hello")
    m = mount("s3://archive/daily/*.nc", "--remote-options", json.dumps(options), "--view", "raw")
    assert listed(m.path) == names
    with xr.open_zarr(m.path / names[1], consolidated=False) as got, xr.open_dataset(daily / names[1]) as want:
        xr.testing.assert_equal(got.load(), want.load())
    prefix = mount("s3://archive/daily/", "--remote-options", json.dumps(options))
    assert listed(prefix.path) == sorted(names + ["readme.txt"])
    with pytest.raises(OSError):
        os.listdir(prefix.path / "readme.txt")
    assert "readme.txt: is not a netCDF" in prefix.log()


# -- export ---------------------------------------------------------------------------------------------

def test_scan_output_read_by_fsspec_equals_the_mount(mount, scans, daily, tmp_path):
    import fsspec
    import xarray as xr

    out = tmp_path / "refs.json"
    result = run_refmount("scan", f"{daily}/*.nc", "-o", out)
    assert result.returncode == 0, result.stderr
    refs = json.loads(out.read_text())
    m = mount(f"{daily}/*.nc", "--view", "raw")
    name = listed(m.path)[0]
    fs = fsspec.filesystem("reference", fo=refs, skip_instance_cache=True)
    with xr.open_zarr(fs.get_mapper(name), consolidated=False, zarr_format=2) as exported, \
            xr.open_zarr(m.path / name, consolidated=False) as mounted:
        xr.testing.assert_identical(exported.load(), mounted.load())
    parquet = tmp_path / "refs.parq"
    result = run_refmount("scan", daily / name, "-o", parquet)
    assert result.returncode == 0, result.stderr
    with xr.open_zarr(mount(parquet, "--view", "raw").path, consolidated=False) as got, \
            xr.open_zarr(m.path / name, consolidated=False) as want:
        xr.testing.assert_identical(got.load(), want.load())


def test_a_file_that_is_no_data_file_or_truncated_is_one_line(scans, tmp_path):
    truncated = tmp_path / "cut.nc"
    truncated.write_bytes(AIR.read_bytes()[:3000])
    result = run_refmount("scan", truncated, "-o", tmp_path / "x.json")
    assert result.returncode == 1 and "cut.nc" in result.stderr and "netCDF-4/HDF5" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# -- combined along a dimension -------------------------------------------------------------------------

def test_concat_time_equals_open_mfdataset_and_ncrcat(mount, scans, daily, tmp_path):
    """Each daily file has its own time units: the combined times are re-encoded to one unit."""
    import xarray as xr

    files = sorted(daily.glob("*.nc"))
    m = mount(f"{daily}/*.nc", "--concat", "time", "--view", "raw")
    with xr.open_zarr(m.path) as got, xr.open_mfdataset(files, combine="by_coords") as want:
        xr.testing.assert_allclose(got.load(), want.load())
        assert got.time.values.tolist() == want.time.values.tolist()
        assert got.tas.attrs == want.tas.attrs
    decoded = mount(f"{daily}/*.nc", "--concat", "time")
    ncrcat = shutil.which("ncrcat")
    if ncrcat:
        joined = tmp_path / "joined.nc"
        subprocess.run([ncrcat, "-O", *map(str, files), str(joined)], check=True, capture_output=True)
        import netCDF4

        with netCDF4.Dataset(nczarr_url(decoded.path)) as got, netCDF4.Dataset(joined) as want:
            assert netCDF4.num2date(got["time"][:], got["time"].units).tolist() == \
                netCDF4.num2date(want["time"][:], want["time"].units).tolist()
            assert np.array_equal(got["tas"][:], want["tas"][:])


def test_what_cannot_be_referenced_is_said_and_the_rest_mounts(mount, scans, tmp_path):
    import h5py

    source = tmp_path / "odd.h5"
    with h5py.File(source, "w") as f:
        f["good"] = np.arange(10.0)
        f.create_dataset("packed", data=np.arange(100), compression="lzf")  # a filter kerchunk refuses
    m = mount(source, "--view", "raw")
    assert listed(m.path) == ["good"]
    assert "variable packed: /packed uses szip or lzf compression - not supported by kerchunk" in m.log()
    result = run_refmount("inspect", source)
    assert result.returncode == 0, result.stderr
    assert "packed: not referenced (/packed uses szip or lzf compression" in result.stdout


def test_formats_are_told_by_their_first_bytes():
    from refmount.refs.scan.formats import HDF5_SIGNATURE, sniff

    assert sniff(AIR.read_bytes()[:4096]) == "hdf5"
    for block in (512, 1024, 2048, 32768):  # an HDF5 user block before the signature (HDF-EOS5 has one)
        assert sniff(b"\0" * block + HDF5_SIGNATURE + b"\0" * 64) == "hdf5", block
    assert sniff(b"\0" * 700 + HDF5_SIGNATURE) is None  # not at a power of two
    assert [sniff(m + b"\0" * 8) for m in (b"CDF\x01", b"CDF\x02", b"CDF\x05")] == ["netcdf3"] * 3
    assert sniff(b"CDF\x03" + b"\0" * 8) is None
    assert sniff(GRIB.read_bytes()[:64]) == "grib"
    assert [sniff(m + b"\0" * 8) for m in (b"II*\0", b"MM\0*", b"II+\0")] == ["tiff"] * 3
    assert sniff(b'{"version": 1}') is None and sniff(b"") is None


def test_apache_index_links():
    from refmount.refs.scan.sources import index_links, matches

    html = """<table><tr><th><a href="?C=N;O=D">Name</a></th></tr>
    <tr><td><a href="/pub/">Parent Directory</a></td></tr>
    <tr><td><a href="tas_20200101.nc">tas_20200101.nc</a></td></tr>
    <tr><td><a href="2021/">2021/</a></td></tr></table>"""
    files, dirs = index_links("https://h/pub/data", html)
    assert files == ["https://h/pub/data/tas_20200101.nc"] and dirs == ["https://h/pub/data/2021/"]
    assert matches(["**", "tas_*.nc"], ["2021", "x", "tas_1.nc"]) and matches(["tas_*.nc"], ["tas_1.nc"])
    assert not matches(["tas_*.nc"], ["2021", "tas_1.nc"]) and not matches(["*.nc"], ["a.nc.dmrpp"])


def test_a_glob_of_data_files_lists_their_dmrpp_sidecars(tmp_path):
    """`*.nc` names the data files; with sidecars wanted, each matched file's X.nc.dmrpp comes along
    (and nothing else), paired with its file (read instead of it); a DMR++ alone stands for its file."""
    from refmount.refs.scan.sources import list_sources

    for name in ("a.nc", "a.nc.dmrpp", "b.nc", "c.txt", "c.txt.dmrpp", "d.nc.dmrpp"):
        (tmp_path / name).write_bytes(b"x")
    assert [e.name for e in list_sources(f"{tmp_path}/*.nc")] == ["a.nc", "b.nc"]
    paired = {e.name: e.sidecar for e in list_sources(f"{tmp_path}/*.nc", sidecars=True)}
    assert paired == {"a.nc": str(tmp_path / "a.nc.dmrpp"), "b.nc": None, "d.nc": str(tmp_path / "d.nc.dmrpp")}


def test_one_remote_data_file_over_http(mount, scans, server):
    import xarray as xr

    shutil.copy(AIR, server.root / "air")  # no suffix: told by its first bytes
    m = mount(server.url_for("air"), "--view", "raw")
    with xr.open_zarr(m.path, consolidated=False) as got, xr.open_dataset(AIR) as want:
        xr.testing.assert_allclose(got.load(), want.load())


def test_scan_concat_read_by_fsspec_equals_the_concat_mount(mount, scans, daily, tmp_path):
    import fsspec
    import xarray as xr

    out = tmp_path / "tas.json.gz"
    result = run_refmount("scan", f"{daily}/*.nc", "--concat", "time", "-o", out)
    assert result.returncode == 0, result.stderr
    fs = fsspec.filesystem("reference", fo=str(out), target_options={"compression": "gzip"}, skip_instance_cache=True)
    m = mount(f"{daily}/*.nc", "--concat", "time", "--view", "raw")
    with xr.open_zarr(fs.get_mapper(""), consolidated=False, zarr_format=2) as exported, \
            xr.open_zarr(m.path, consolidated=False) as mounted:
        xr.testing.assert_identical(exported.load(), mounted.load())
        assert exported.sizes["time"] == 24 * len(list(daily.glob("*.nc")))


def test_dmrpp_sidecars_concat_reads_no_nc_until_data_is_read(mount, scans, tmp_path):
    """Issue 35: a glob of .nc files with their .dmrpp beside them, --concat time: the mount and ncdump -h
    read the DMR++ files only (nginx's access log says which ranges of which files were asked for); data
    reads ask the .nc files for ranges, and the values equal xarray's open_mfdataset of the files."""
    import xarray as xr

    from tests.support.dmrpp_files import write_dmrpp
    from tests.support.nginx import Nginx

    www = tmp_path / "www" / "data"
    files = make_daily(www, 4, nlat=7, nlon=12)
    for f in files:
        write_dmrpp(f, f.with_name(f.name + ".dmrpp"))
    block = f"root {www.parent}; location /data/ {{ autoindex on; }}"
    with Nginx(tmp_path / "nginx", block, log_format='$request_method $uri "$http_range" $status') as nginx:
        def nc_requests(since: int) -> list[str]:
            return [line for line in nginx.access_log()[since:] if re.search(r"/data/tas_\d+\.nc ", line)]

        url = f"{nginx.url}/data/tas_*.nc"
        decoded = mount(url, "--concat", "time")
        header = subprocess.run([*NCDUMP, "-h", nczarr_url(decoded.path)], capture_output=True, text=True,
                                timeout=60).stdout
        assert "float tas(time, lat, lon)" in header and re.search(r"time = (UNLIMITED ; // \()?96", header), header
        log = nginx.access_log()
        assert [line for line in log if ".dmrpp " in line and line.startswith("GET")], log
        # the .nc files are asked only for their coordinates' chunks (time's values are combined, lat and lon
        # checked equal across files), each range alone: no header, no block around them
        want = {(f"/data/{f.name}", f'"bytes={start}-{end - 1}"') for f in files for start, end in coordinate_chunks(f)}
        got = [line.split() for line in nc_requests(0)]
        assert got and all(method == "GET" for method, *_ in got), got
        assert {(uri, rng) for _, uri, rng, _ in got} == want, (got, want)
        # a warm mount (the scan store keeps each DMR++'s references and the combination, keyed by the
        # DMR++'s validator): the index and one HEAD per DMR++, no GET of any file
        before = len(nginx.access_log())
        m = mount(url, "--concat", "time", "--view", "raw")
        warm = nginx.access_log()[before:]
        assert [line for line in warm if line.startswith("HEAD") and ".dmrpp " in line], warm
        assert not [line for line in warm if line.startswith("GET") and not line.startswith('GET /data/ ')], warm
        before = len(nginx.access_log())
        with xr.open_zarr(m.path, consolidated=False) as got, xr.open_mfdataset(files, combine="by_coords") as want:
            xr.testing.assert_equal(got.load(), want.load())
        ranges = nc_requests(before)
        assert ranges and all(line.startswith("GET") and '"bytes=' in line for line in ranges), ranges


def coordinate_chunks(path) -> list[tuple[int, int]]:
    """(start, end) of every stored chunk of the file's coordinate variables (time, lat, lon), from HDF5."""
    import h5py

    out = []
    with h5py.File(path, "r") as f:
        for name in ("time", "lat", "lon"):
            ds = f[name].id
            if ds.get_offset() is not None:  # contiguous
                out.append((ds.get_offset(), ds.get_offset() + ds.get_storage_size()))
            else:
                for i in range(ds.get_num_chunks()):
                    info = ds.get_chunk_info(i)
                    out.append((info.byte_offset, info.byte_offset + info.size))
    return out


def test_a_file_of_many_groups_of_compound_datasets_scans_without_hanging(scans, tmp_path):
    """Shaped like kerchunk's NEONDSTowerTemperatureData.hdf5 (groups of compound datasets, which
    kerchunk refuses): the garbage collector, run by zarr's I/O thread, deadlocked on h5py's lock while
    kerchunk walked the file, so every scan of it hung (now the collector is off during a scan)."""
    import h5py

    record = np.dtype([("date", "S30"), ("numPts", "<i4"), ("mean", "<f8"), ("min", "<f8"), ("max", "<f8")])
    source = tmp_path / "tower.h5"
    with h5py.File(source, "w") as f:
        for d in range(2):
            for s in range(2):
                for b in range(5):
                    g = f.create_group(f"D{d}/S{s}/min_1/boom_{b}")
                    g.attrs["Sensor Height"] = f"{b} m"
                    g.create_dataset("temperature", data=np.zeros(4000, record), chunks=(500,))
    result = run_refmount("scan", source, "-o", tmp_path / "tower.json", timeout=50)
    assert result.returncode == 0, result.stderr
    refs = json.loads((tmp_path / "tower.json").read_text())
    assert json.loads(refs["D1/S1/min_1/boom_4/.zattrs"]) == {"Sensor Height": "4 m"}


def test_index_pages_give_settled_files_a_version_from_their_date_and_size():
    """nginx's and Apache's index pages give each file a date (to the minute) and a size: together the
    file's version, for a file modified more than a day ago (sources.SETTLED); a file of the last day, a
    size that is no byte count ('317K') or no date at all give none (then a HEAD tells)."""
    from refmount.refs.scan.sources import SETTLED, index_entries, listed_version

    now = time.time()
    old = time.strftime("%d-%b-%Y %H:%M", time.gmtime(now - 3 * 86400))
    new = time.strftime("%d-%b-%Y %H:%M", time.gmtime(now - 600))
    html = (f'<pre><a href="../">../</a>\n<a href="sub/">sub/</a>   {old}   -\n'
            f'<a href="a.nc">a.nc</a>   {old}   324130\n<a href="b.nc">b.nc</a>   {new}   324130\n'
            '<a href="c.nc">c.nc</a>\n</pre>'
            '<table><tr><td><a href="d.nc">d.nc</a></td><td align="right">2019-05-06 11:12  </td>'
            '<td align="right">4096</td></tr><tr><td><a href="e.nc">e.nc</a></td>'
            '<td align="right">2019-05-06 11:12  </td><td align="right">317K</td></tr></table>')
    files, dirs, listed_ = index_entries("http://h:1/d/", html)
    assert [f.rsplit("/", 1)[1] for f in files] == ["a.nc", "b.nc", "c.nc", "d.nc", "e.nc"]
    assert dirs == ["http://h:1/d/sub/"]
    assert listed_ == {"http://h:1/d/a.nc": (324130, f"listed {time.strftime('%Y-%m-%d %H:%M', time.gmtime(now - 3 * 86400))}"),
                       "http://h:1/d/d.nc": (4096, "listed 2019-05-06 11:12")}
    assert listed_version(" 01-Jan-2020 00:00  12", now=1577836800 + SETTLED) == (None, None)  # (not yet settled)
    assert listed_version(" 01-Foo-2020 00:00  12") == (None, None) and listed_version(" 99-Jan-2020 00:00  1") == (None, None)


def test_archive_of_settled_files_cold_one_request_a_file_warm_none(mount, scans, tmp_path):
    """Files listed with a date and a size (an archive's, modified more than a day ago) need no HEAD: a
    cold --concat mount reads each file once (its header; the coordinates --concat combines are kept
    from it, not asked again), a warm one reads nothing but the index page. A file changed in place
    (another date or size on the page) is read again, and the mount shows its new values."""
    import netCDF4
    import xarray as xr

    from tests.support.nginx import Nginx

    www = tmp_path / "www" / "data"
    files = make_daily(www, 4, nlat=7, nlon=12)
    settled = time.time() - 3 * 86400
    for f in files:
        os.utime(f, (settled, settled))
    block = f"root {www.parent}; location /data/ {{ autoindex on; }}"
    with Nginx(tmp_path / "nginx", block, log_format='$request_method $uri "$http_range" $status') as nginx:
        def file_requests(since: int) -> list[str]:
            return [line for line in nginx.access_log()[since:] if re.search(r"/data/tas_\d+\.nc ", line)]

        url = f"{nginx.url}/data/tas_*.nc"
        cold = mount(url, "--concat", "time", "--view", "raw")
        got = file_requests(0)
        assert sorted(line.split()[:2] for line in got) == sorted(["GET", f"/data/{f.name}"] for f in files), got
        with xr.open_zarr(cold.path, consolidated=False) as ds:
            assert ds.sizes["time"] == 96
        cold.stop()
        before = len(nginx.access_log())
        warm = mount(url, "--concat", "time", "--view", "raw")
        assert file_requests(before) == [], nginx.access_log()[before:]
        assert [line for line in nginx.access_log()[before:] if line.startswith("GET /data/ ")]
        # ... on the stdlib engine alone: aiohttp (0.2-0.7 s of imports) is not loaded on that way
        assert "/aiohttp/" not in Path(f"/proc/{warm.proc.pid}/maps").read_text()
        warm.stop()
        with netCDF4.Dataset(files[0], "a") as nc:  # changed in place: another size, a later (settled) date
            nc.variables["tas"][0, 0, 0] = 1234.5
            nc.setncattr("note", "x" * 100)
        os.utime(files[0], (settled + 120, settled + 120))
        before = len(nginx.access_log())
        again = mount(url, "--concat", "time", "--view", "raw")
        assert {line.split()[1] for line in file_requests(before)} >= {f"/data/{files[0].name}"}
        with xr.open_zarr(again.path, consolidated=False) as ds:
            assert float(ds["tas"][0, 0, 0]) == pytest.approx(1234.5)


def test_the_first_index_page_is_asked_once_as_the_daemon_starts(scans, tmp_path):
    """A mount of an http(s) glob asks its first index page in a thread as its daemon starts
    (fuse/early.py), and the listing takes that answer: one GET of the page, cold and warm; the
    message names the source as the daemon shows it. A page that fails fails the mount with one
    line, asked once too (its retries are not run twice)."""
    from tests.support.nginx import Nginx

    www = tmp_path / "www" / "data"
    files = make_daily(www, 2, nlat=5, nlon=8)
    settled = time.time() - 3 * 86400
    for f in files:
        os.utime(f, (settled, settled))
    block = (f"root {www.parent}; location /data/ {{ autoindex on; }} "
             "location /gone/ { return 404; }")
    with Nginx(tmp_path / "nginx", block, log_format='$request_method $uri "$http_range" $status') as nginx:
        url = f"{nginx.url}/data/tas_*.nc"
        for state in ("cold", "warm"):
            mnt = tmp_path / f"mnt-{state}"
            mnt.mkdir()
            before = len(nginx.access_log())
            done = subprocess.run([*REFMOUNT, "mount", "--concat", "time", "--view", "raw", url, str(mnt)],
                                  capture_output=True, text=True, timeout=300)
            try:
                assert done.returncode == 0, done.stderr
                assert f"refmount: mounted {url} on {mnt}; log: " in done.stderr
                assert json.loads((mnt / "tas" / ".zarray").read_text())["shape"][0] == 48
                pages = [line for line in nginx.access_log()[before:] if line.startswith("GET /data/ ")]
                assert len(pages) == 1, nginx.access_log()[before:]
            finally:
                subprocess.run([*REFMOUNT, "umount", str(mnt)], capture_output=True, timeout=60)
        mnt = tmp_path / "mnt-gone"
        mnt.mkdir()
        before = len(nginx.access_log())
        done = subprocess.run([*REFMOUNT, "mount", "--concat", "time", f"{nginx.url}/gone/*.nc", str(mnt)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 1 and not os.path.ismount(mnt)
        assert done.stderr.count("\n") == 1 and "cannot list" in done.stderr and "404" in done.stderr, done.stderr
        asked = [line for line in nginx.access_log()[before:] if line.startswith("GET /gone/ ")]
        assert 1 <= len(asked) <= 2, asked  # (the stdlib engine's try, then aiohttp's: once each)


def test_warm_concat_mount_of_an_unchanged_listing_reads_one_kept_combination(mount, scans, tmp_path):
    """A warm --concat mount whose listing names the same files at the same dates and sizes loads the
    combination kept in the scan store (no file's own scan is needed: they are removed here, and no file
    is read). A file changed in place is a miss: the mount shows its new values. A kept combination that
    was altered is a miss (its digest), never its data."""
    import gzip

    import netCDF4
    import xarray as xr

    from tests.support.nginx import Nginx

    www = tmp_path / "www" / "data"
    files = make_daily(www, 3, nlat=5, nlon=8)
    settled = time.time() - 3 * 86400
    for f in files:
        os.utime(f, (settled, settled))

    def expected():
        def values(f):
            with netCDF4.Dataset(f) as nc:
                return nc.variables["tas"][:].filled(np.nan)

        return np.concatenate([values(f) for f in files])

    def check(mounted):
        with xr.open_zarr(mounted.path, consolidated=False, decode_times=False) as ds:
            np.testing.assert_array_equal(ds["tas"].values, expected())

    block = f"root {www.parent}; location /data/ {{ autoindex on; }}"
    with Nginx(tmp_path / "nginx", block, log_format='$request_method $uri "$http_range" $status') as nginx:
        def file_requests(since: int) -> list[str]:
            return [line for line in nginx.access_log()[since:] if re.search(r"/data/tas_\d+\.nc ", line)]

        url = f"{nginx.url}/data/tas_*.nc"
        args = (url, "--concat", "time", "--view", "raw")
        mount(*args).stop()
        for kept in scans.glob("file-*"):  # (the warm mount must not need them)
            kept.unlink()
        before = len(nginx.access_log())
        warm = mount(*args)
        assert file_requests(before) == [], warm.log()
        assert "combination of 3 file(s)" in warm.log()
        check(warm)
        warm.stop()

        with netCDF4.Dataset(files[1], "a") as nc:  # changed in place: another value, size and (settled) date
            nc.variables["tas"][0, 0, 0] = 1234.5
            nc.setncattr("note", "x" * 100)
        os.utime(files[1], (settled + 120, settled + 120))
        changed = mount(*args)
        assert "combination of 3 file(s)" not in changed.log()
        check(changed)
        changed.stop()

        for kept in scans.glob("combined-*"):  # altered: a valid gzip of other references
            with gzip.open(kept) as f:
                header, refs = f.read().split(b"\n", 1)
            with gzip.open(kept, "wb") as f:
                f.write(header + b"\n" + refs.replace(b'"time/0"', b'"time/9"', 1).replace(b"[", b"[ ", 1))
        altered = mount(*args)
        assert "combination of 3 file(s)" not in altered.log()
        check(altered)
        altered.stop()
