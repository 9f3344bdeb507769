"""GRIB2 by index (issue 40): a glob of GRIB2 files with NOAA's `.idx` beside them mounts from the
`.idx` files; the first file of each kind is scanned once and its mapping kept (refs/scan/gribidx.py).

The GRIB2 files are written with eccodes (tests/support/gribfiles.py) with wgrib2-style inventories; the
oracle is cfgrib on each file. nginx serves them (autoindex) and its access log says what was read.
Real NOAA inventories (kerchunk's test fixtures, tests/data/gribidx) are parsed by refmount's parser
and kerchunk's parse_grib_idx, which must agree."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.support.clients import ncdump, nczarr_url, parse_ncdump
from tests.support.gribfiles import write

FIXTURES = Path(__file__).parent / "data" / "gribidx"
LOG_FORMAT = '$request_method $uri "$http_range" $status'
T2M = "t2m/instant/heightAboveGround"  # grib_tree's group of 2 m temperature


@pytest.fixture
def scans(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache" / "refmount" / "scans"


@pytest.fixture(scope="module")
def cycles(tmp_path_factory) -> Path:
    """Four cycles of one forecast hour (f006), named so that their names' order is not their runs'."""
    root = tmp_path_factory.mktemp("cycles")
    runs = {"c3": dt.datetime(2023, 4, 8, 0), "c1": dt.datetime(2023, 4, 8, 6), "c2": dt.datetime(2023, 4, 8, 12),
            "c0": dt.datetime(2023, 4, 8, 18)}
    for k, (name, run) in enumerate(sorted(runs.items())):
        write(root, f"gfs.{name}.pgrb2.0p50.f006", run, 6, seed=k)
    return root


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> Path:
    """Four forecast hours of one cycle."""
    root = tmp_path_factory.mktemp("steps")
    for k, step in enumerate((0, 3, 6, 9)):
        write(root, f"gfs.t12z.pgrb2.0p50.f{step:03d}", dt.datetime(2023, 4, 8, 12), step, seed=10 + k)
    return root


def served(tmp_path: Path, *dirs: Path):
    from tests.support.nginx import Nginx

    www = tmp_path / "www"
    for d in dirs:
        shutil.copytree(d, www / "data" / d.name)
    return Nginx(tmp_path / "nginx", f"root {www}; location /data/ {{ autoindex on; }}", LOG_FORMAT)


def cfgrib_field(path: Path, short_name: str, level: float) -> tuple[np.ndarray, np.datetime64, np.timedelta64]:
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = xr.open_dataset(path, engine="cfgrib", indexpath="",
                             backend_kwargs={"filter_by_keys": {"shortName": short_name, "level": level}})
        (var,) = ds.data_vars.values()
        return var.values, ds.time.values, ds.step.values


def header(path: Path) -> str:
    """`ncdump -h` of a mounted dataset (Debian's netCDF-C)."""
    done = subprocess.run(["ncdump", "-h", nczarr_url(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def grib_gets(log: list[str]) -> set[str]:
    """The GRIB files (not their .idx) that some GET read."""
    return {line.split()[1] for line in log if line.startswith("GET /data/") and not line.split()[1].endswith(".idx")
            and not line.split()[1].endswith("/")}


# -- the inventory: refmount's parser agrees with kerchunk's on NOAA's own ----------------------------

@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.idx")))
def test_noaa_inventories_parse_as_kerchunk_parses_them(tmp_path, name):
    from kerchunk._grib_idx import parse_grib_idx

    from refmount.refs.scan.gribidx import messages, parse_idx

    text = (FIXTURES / name).read_bytes()
    size = int(text.splitlines()[-1].split(b":")[1]) + 1_000_000  # (the GRIB file is not stored: a stand-in)
    grib = tmp_path / name.removesuffix(".idx")
    with open(grib, "wb") as f:
        f.truncate(size)
    shutil.copy(FIXTURES / name, tmp_path / name)
    theirs = parse_grib_idx(str(grib))
    rows = parse_idx(text, size)
    assert [r.offset for r in rows] == theirs["offset"].tolist()
    assert [r.attrs for r in rows] == theirs["attrs"].tolist()
    assert [n for _, n in messages(rows, size).values()] == theirs["length"].tolist()


def test_kinds_split_by_rows_grid_size_and_origin():
    """Files share a mapping only with files of the same rows, name shape, size class and origin."""
    from refmount.refs.scan.gribidx import kind_of, parse_idx

    text = (FIXTURES / "hrrr.t01z.wrfsfcf00.grib2.test-limit-10.idx").read_bytes()
    rows = parse_idx(text, 8 << 20)
    a = kind_of(rows, "hrrr.t01z.wrfsfcf00.grib2", 8 << 20, "https://noaa-hrrr-bdp-pds.s3.amazonaws.com/x")
    assert a == kind_of(parse_idx(text.replace(b"d=2022101401", b"d=2023010218"), 8 << 20), "hrrr.t18z.wrfsfcf00.grib2",
                        9 << 20, "https://noaa-hrrr-bdp-pds.s3.amazonaws.com/y")  # another cycle: the same kind
    assert a != kind_of(rows, "hrrr.t01z.wrfsfcf00.grib2", 8 << 20, "https://evil.example/x")  # another origin
    assert a != kind_of(rows, "hrrr.t01z.wrfsfcf00.grib2", 32 << 20, "https://noaa-hrrr-bdp-pds.s3.amazonaws.com/x")
    assert a != kind_of(rows, "hrrr.t01z.wrfprsf00.grib2", 8 << 20, "https://noaa-hrrr-bdp-pds.s3.amazonaws.com/x")
    assert a != kind_of(rows[:-1], "hrrr.t01z.wrfsfcf00.grib2", 8 << 20, "https://noaa-hrrr-bdp-pds.s3.amazonaws.com/x")


# -- hostile inventories: refused in one line naming the .idx, bounded ---------------------------------

@pytest.mark.parametrize("text, why", [
    (b"1:0:d=2023040812:TMP:2 m above ground:anl:\n2:-5:d=2023040812:UGRD:10 m above ground:anl:\n",
     "line 2 is not a wgrib2 inventory row"),
    (b"1:0:d=2023040812:TMP:2 m above ground:anl:\n2:99999999:d=2023040812:UGRD:10 m above ground:anl:\n",
     "line 2: offset 99,999,999 is past the end of its GRIB file"),
    (b"1:500:d=2023040812:TMP:2 m above ground:anl:\n2:100:d=2023040812:UGRD:10 m above ground:anl:\n",
     "line 2: offset 100 goes back"),
    (b"1:0:d=2023040812:TMP:\xff\xfe:anl:\n", "it is not UTF-8 text"),
    (b"".join(b"%d:0:d=2023040812:A%d:\n" % (n, n) for n in range(60_000)), "it has more than 50,000 rows"),
    (b"1:0:d=2023040812:TMP:2 m above ground:anl:\n2:10:d=2023040900:TMP:2 m above ground:anl:\n",
     "its rows are of several run dates"),
    # (a month 13 or a year 0 passed, and failed the first file's mapping later: ValueError, a traceback)
    (b"1:0:d=2023139912:TMP:2 m above ground:anl:\n", "line 1: d=2023139912 is not a date"),
    (b"1:0:d=0000010100:TMP:2 m above ground:anl:\n", "line 1: d=0000010100 is not a date"),
    (b"1:0:d=202304081261:TMP:2 m above ground:anl:\n", "line 1: d=202304081261 is not a date"),
])
def test_hostile_inventory_is_refused(text, why):
    from refmount.refs.scan.gribidx import IdxRefused, parse_idx

    with pytest.raises(IdxRefused, match=why):
        parse_idx(text, 20_000)


def test_a_million_rows_are_refused_before_they_are_read(scans, cycles, tmp_path):
    """An idx larger than MAX_IDX_BYTES (a million rows) is refused by its size, from the HEAD or stat,
    with no GET of it; a hostile idx leaves its file out in one line naming the idx, the others mount."""
    from tests.conftest import run_refmount

    data = tmp_path / "data"
    shutil.copytree(cycles, data)
    bad = min(data.glob("*.f006"))
    Path(str(bad) + ".idx").write_bytes(b"".join(b"%d:0:d=2023040812:A:\n" % n for n in range(1_000_000)))
    worse = sorted(data.glob("*.f006"))[1]
    Path(str(worse) + ".idx").write_bytes(b"1:0:d=2023040812:TMP:2 m above ground:6 hour fcst:\n2:-1:d=x\n")
    result = run_refmount("scan", f"{data}/*.f006", "-o", tmp_path / "refs.json", "--cache-dir", tmp_path / "c")
    assert result.returncode == 0, result.stderr
    assert f"{bad}: its index {bad}.idx is refused: it is larger than 4 MiB; left out of the mount" in result.stderr
    assert f"{worse}: its index {worse}.idx is refused: line 2 is not a wgrib2 inventory row" in result.stderr
    assert "Traceback" not in result.stderr
    import json

    refs = json.loads((tmp_path / "refs.json").read_text())
    names = {k.split("/")[0] for k in refs if "/" in k}
    assert names == {p.name for p in sorted(data.glob("*.f006"))[2:]}


# -- a glob mounts from its .idx files; values equal cfgrib's -----------------------------------------

def test_glob_mounts_from_idx_files_after_one_scan_and_equals_cfgrib(mount, scans, cycles, tmp_path):
    import netCDF4

    files = sorted(cycles.glob("*.f006"))
    with served(tmp_path, cycles) as nginx:
        url = f"{nginx.url}/data/{cycles.name}/*.f006"
        m = mount(url)
        assert sorted(os.listdir(m.path)) == [p.name for p in files]
        for p in files:  # every file's metadata, as ncdump -h reads it
            with netCDF4.Dataset(nczarr_url(m.path / p.name)) as ds:
                assert "t2m" in ds[T2M].variables
        headers = grib_gets(nginx.access_log())
        assert len(headers) == 1, headers  # the first file of the kind, scanned; the others from their .idx
        idx_gets = [line for line in nginx.access_log() if line.startswith("GET") and line.split()[1].endswith(".idx")]
        assert len(idx_gets) == len(files), idx_gets  # one GET per .idx
        for p in files:
            expected, run, _ = cfgrib_field(p, "2t", 2)
            with netCDF4.Dataset(nczarr_url(m.path / p.name)) as ds:
                group = ds[T2M]
                t2m = group["t2m"]
                t2m.set_auto_maskandscale(False)
                assert np.array_equal(np.asarray(t2m[...]).reshape(expected.shape), expected.astype(t2m.dtype)), p.name
                times = netCDF4.num2date(group["time"][:], group["time"].units,
                                         only_use_cftime_datetimes=False, only_use_python_datetimes=True)
                assert np.datetime64(times[0], "ns") == run, p.name
        m.stop()
        # warm: the scan store has every file by its .idx's version; nothing is read again, and a new
        # cycle of the same product is read from its .idx alone (the kind's mapping is kept)
        new = write(tmp_path / "www" / "data" / cycles.name, "gfs.c4.pgrb2.0p50.f006", dt.datetime(2023, 4, 9, 0), 6, seed=9)
        before = len(nginx.access_log())
        warm = mount(url)
        for p in [*files, new]:
            with netCDF4.Dataset(nczarr_url(warm.path / p.name)) as ds:
                assert "t2m" in ds[T2M].variables
        again = nginx.access_log()[before:]
        gets = [line.split()[1] for line in again if line.startswith("GET") and not line.split()[1].endswith("/")]
        assert gets == [f"/data/{cycles.name}/{new.name}.idx"], again  # (and HEADs of the .idx files)
        expected, run, _ = cfgrib_field(new, "2t", 2)
        with netCDF4.Dataset(nczarr_url(warm.path / new.name)) as ds:
            assert np.array_equal(np.asarray(ds[T2M]["t2m"][...]).reshape(expected.shape), expected)


def test_a_settled_glob_is_identified_by_its_listing_and_mounts_warm_with_one_request(mount, scans, cycles,
                                                                                    tmp_path):
    """Files and .idx older than a day (an archive's): the index page's sizes and dates name every
    version, so a cold `--concat` mount sends no HEAD (the .idx GETs and the one scan of the kind's
    first file), and a warm one sends the index page and nothing else."""
    aged = tmp_path / "aged" / cycles.name
    shutil.copytree(cycles, aged)
    settled = time.time() - 3 * 86400  # (refs/scan/sources.py SETTLED: a day)
    for p in aged.iterdir():
        os.utime(p, (settled, settled))
    with served(tmp_path, aged) as nginx:
        url = f"{nginx.url}/data/{aged.name}/*.f006"
        cold = mount(url, "--concat", "time")
        assert "t2m(time, step, latitude, longitude)" in header(cold.path)
        cold.stop()
        log = nginx.access_log()
        assert not [line for line in log if line.startswith("HEAD")], log
        assert len(grib_gets(log)) == 1, log  # the kind's first file, scanned
        assert len([line for line in log if line.split()[1].endswith(".idx")]) == 4, log
        before = len(log)
        warm = mount(url, "--concat", "time")
        assert "t2m(time, step, latitude, longitude)" in header(warm.path)
        again = nginx.access_log()[before:]
        assert [line.split()[:2] for line in again] == [["GET", f"/data/{aged.name}/"]], again


def test_idx_references_equal_a_scan_of_each_file(scans, cycles, steps, tmp_path):
    """The references made from an .idx and the kind's mapping are exactly those a scan of the file makes:
    on a regular grid, and on HRRR's Lambert grid (its latitudes and longitudes referenced in the messages)."""
    from refmount.refs.scan.archive import ArchiveOptions, scan_source

    lambert = tmp_path / "lambert"
    lambert.mkdir()
    for k, hour in enumerate((1, 2, 3, 4)):
        write(lambert, f"hrrr.t{hour:02d}z.wrfsfcf01.grib2", dt.datetime(2023, 4, 8, hour), 1, seed=k, ni=40, nj=30,
              lambert=True)
    for root in (cycles, steps, lambert):
        _, by_idx, _ = scan_source(f"{root}/*[0-9]", ArchiveOptions(scan_dir=str(scans / "a")), max_refs_size=1 << 28,
                                   timeout=120)
        assert len(by_idx) == 4
        if root is lambert:  # (the coordinates are references into the messages, mapped as the fields are)
            assert isinstance(by_idx[-1].refs["t2m/instant/heightAboveGround/latitude/0.0"], list)
        for s in by_idx:
            _, direct, _ = scan_source(s.url, ArchiveOptions(scan_dir=str(scans / "b")), max_refs_size=1 << 28,
                                       timeout=120)
            assert s.refs == direct[0].refs, s.name


def test_a_message_the_scan_holds_inline_is_placed_and_referenced_in_later_files(scans, tmp_path, caplog):
    """grib_tree holds small messages inline (here 16 x 9 points: 467 bytes): the mapping places such a
    message by its bytes in the file scanned, and the kind's other files refer to theirs."""
    import logging

    from kerchunk.codecs import GRIBCodec

    from refmount.refs.scan.archive import ArchiveOptions, scan_source

    files = [write(tmp_path, f"gfs.t{h:02d}z.pgrb2.0p50.f006", dt.datetime(2023, 4, 8, h), 6, seed=k + 1, ni=16, nj=9)
             for k, h in enumerate((0, 6, 12))]
    caplog.set_level(logging.INFO, logger="refmount")
    _, scanned, _ = scan_source(f"{tmp_path}/gfs.*", ArchiveOptions(scan_dir=str(scans)), max_refs_size=1 << 28,
                                timeout=120)
    assert "does not map its messages" not in caplog.text
    key = "v10/instant/heightAboveGround/v10/0.0.0.0"
    by_name = {s.name: s for s in scanned}
    # The kind's first file to take its lock is scanned (inline, as kerchunk wrote it): which one depends
    # on the scanners' timing; the others refer to their own bytes.
    inline = [path for path in files if isinstance(by_name[path.name].refs[key], str)]
    assert len(inline) == 1, [by_name[path.name].refs[key] for path in files]
    for path in files:
        if path in inline:
            continue
        value = by_name[path.name].refs[key]
        assert isinstance(value, list) and value[0] == str(path), value
        data = path.read_bytes()[value[1]:value[1] + value[2]]
        assert data[:4] == b"GRIB" and len(data) < 500
        expected, _, _ = cfgrib_field(path, "10v", 10)
        got = GRIBCodec(var="v10", dtype="float64").decode(data).reshape(expected.shape)
        assert np.array_equal(got, expected)


# -- --concat along the run time and the step, as Herbie users expect ----------------------------------

def test_concat_time_over_cycles_and_step_over_forecast_hours(mount, scans, cycles, steps, tmp_path):
    import netCDF4

    with served(tmp_path, cycles, steps) as nginx:
        for root, dim in ((cycles, "time"), (steps, "step")):
            files = sorted(root.glob("gfs.*[0-9]"))
            m = mount(f"{nginx.url}/data/{root.name}/gfs.*[0-9]", "--concat", dim)
            dumped = ncdump(nczarr_url(m.path), variables=[f"{T2M}/t2m"])  # Debian's netCDF-C, decoded view
            assert "t2m(time, step, latitude, longitude)" in dumped
            fields = [cfgrib_field(p, "2t", 2) for p in files]
            by_coord = sorted(fields, key=lambda f: f[1] if dim == "time" else f[2])
            with netCDF4.Dataset(nczarr_url(m.path)) as ds:
                group = ds[T2M]
                t2m = group["t2m"]
                t2m.set_auto_maskandscale(False)
                assert t2m.dimensions[:2] == ("time", "step")
                assert len(group[dim]) == 4
                values = np.asarray(t2m[...])
                for k, (expected, run, step) in enumerate(by_coord):
                    got = values[k, 0] if dim == "time" else values[0, k]
                    assert np.array_equal(got, expected.astype(t2m.dtype)), (dim, k)
                from_ncdump = parse_ncdump(dumped)[f"{T2M}/t2m"].array(values.shape, values.dtype, None)
                assert np.array_equal(from_ncdump, values)
                coord = group[dim][:]
                assert np.all(np.diff(coord) > 0), coord  # in the order of the runs (steps), not the names'
                valid = group["valid_time"][:]
                wanted = [np.datetime64(run + step, "s").astype(np.int64) for _, run, step in by_coord]
                assert np.array_equal(np.asarray(valid).ravel(), wanted), (dim, valid)
            m.stop()
