"""Issue 38, rows 6, 7, 9 and 10 (part): what a listing may name, one listing for lazy and eager mounts,
and scan failures that say what failed.

- Names from outside (index-page links, local file names, @FILE lines, S3 keys) are checked by one
  function, refs.model.name_problem: a bad one is left out with one log line naming where it came from,
  and the rest of the listing mounts. Served by nginx from a hand-written index page (autoindex cannot
  write such links), and by moto for S3.
- A lazy glob of X.h5 files with X.h5.dmrpp beside them reads the DMR++ files, not the files' headers
  (nginx's access log says which files were asked for which ranges).
- A truncated file is said to be truncated, in one line naming it; a scanner that really dies is said to
  have died, with its signal; a zero-byte file is named and said to be empty.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.support.clients import NCDUMP, nczarr_url
from tests.support.daily import make_daily
from tests.support.nginx import Nginx

AIR = Path(__file__).parent / "data" / "air.nc"  # (the NCEP sample of shared/data)
if not AIR.exists():
    AIR = Path(__file__).parent / "data" / "air.nc"
LOG_FORMAT = '$request_method $uri "$http_range" $status'


@pytest.fixture
def scans(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def listed(path) -> list[str]:
    return sorted(name for name in os.listdir(path) if not name.startswith("."))


def left_out_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "left out of the mount" in line and "a file name" in line]


# -- row 6: names from outside ------------------------------------------------------------------------

HOSTILE = {  # link -> (the decoded name, what name_problem says)
    "..%2fdir%2fa.nc": ("../dir/a.nc", "contains '/'"),
    "%2e%2e": ("..", "is '..'"),
    "%2e%2e/": ("..", "is '..'"),
    "%2E/": (".", "is '.'"),
    "nul%00.nc": ("nul\x00.nc", "contains a NUL byte"),
    "x" * 2000 + ".nc": ("x" * 2000 + ".nc", "is longer than 255 bytes"),
    "sub%2f/": ("sub/", "contains '/'"),
}


def test_hostile_index_links_are_left_out_one_line_each_and_the_rest_mounts(mount, scans, tmp_path):
    """A hand-written index page linking '..%2fdir%2fa.nc' (nginx resolves it to /dir/a.nc, outside the
    listed directory), '%2e%2e', 'nul%00.nc' and a 2,003-byte name beside real files, globbed with
    `**/*`: main made `ls MNT` EIO (a '/' in a root entry), listed '..' and 'nul'. Now the good files mount
    and read, each bad link is one log line naming the index page, and no bad link is ever requested."""
    import xarray as xr

    www = tmp_path / "www"
    (www / "d" / "sub").mkdir(parents=True)
    (www / "dir").mkdir()
    shutil.copy(AIR, www / "d" / "good.nc")
    shutil.copy(AIR, www / "d" / "sub" / "deep.nc")
    shutil.copy(AIR, www / "dir" / "a.nc")  # what '..%2fdir%2fa.nc' reaches on nginx
    links = ["good.nc", "sub/", *HOSTILE]
    (www / "d" / "index.html").write_text(
        "<html><body><pre>" + "".join(f'<a href="{href}">{href[:20]}</a>\n' for href in links) + "</pre></body></html>")
    block = f"root {www}; location /d/ {{ index index.html; }} location /d/sub/ {{ autoindex on; }}"
    with Nginx(tmp_path / "nginx", block, log_format=LOG_FORMAT) as nginx:
        page = f"{nginx.url}/d/"
        m = mount(f"{nginx.url}/d/**/*", "--view", "raw")
        assert listed(m.path) == ["deep.nc", "good.nc"]
        lines = left_out_lines(m.log())
        assert len(lines) == len(HOSTILE), m.log()
        for name, problem in HOSTILE.values():
            assert [line for line in lines if f"{page}: a file name {repr(name)[:116]}" in line and problem in line], \
                (name, lines)
        with xr.open_zarr(m.path / "good.nc", consolidated=False) as got, xr.open_dataset(AIR) as want:
            xr.testing.assert_allclose(got.load(), want.load())
        assert "air" in os.listdir(m.path / "deep.nc")
        asked = {line.split()[1] for line in nginx.access_log()}
        assert asked <= {"/d/index.html", "/d/sub/", "/d/good.nc", "/d/sub/deep.nc"}, asked  # ($uri: the index)

        # refmount scan (the eager listing) leaves out the same, and names the same page
        out = tmp_path / "out.json"
        result = run_refmount("scan", f"{nginx.url}/d/*", "-o", out)
        assert result.returncode == 0, result.stderr
        assert sorted({key.split("/")[0] for key in json.loads(out.read_text())} - {".zgroup"}) == ["good.nc"]
        assert len(left_out_lines(result.stderr)) == len(HOSTILE), result.stderr


def test_index_links_decoded_to_bad_names_are_refused():
    from refmount.refs.scan.sources import index_links

    html = "".join(f'<a href="{href}">x</a>' for href in ["ok.nc", "dir/", *HOSTILE])
    files, dirs = index_links("http://h:1/d/", html)
    assert files == ["http://h:1/d/ok.nc"] and dirs == ["http://h:1/d/dir/"]


def test_local_file_names_with_odd_bytes(mount, scans, tmp_path):
    """A local file name is bytes: one that is no UTF-8 cannot be a key of the mount (main scanned it and
    failed with 'TypeError: str is not valid UTF-8', in the eager form the whole scan's JSON could not be
    written); it is left out, named, and the others mount. A newline is a legal name: it stays."""
    import xarray as xr

    d = tmp_path / "data"
    d.mkdir()
    shutil.copy(AIR, d / "good.nc")
    shutil.copy(AIR, os.fsdecode(bytes(d) + b"/bad\xff.nc"))
    shutil.copy(AIR, d / "new\nline.nc")
    m = mount(f"{d}/*.nc", "--view", "raw")
    assert listed(m.path) == ["good.nc", "new\nline.nc"]
    lines = left_out_lines(m.log())
    assert len(lines) == 1 and f"{d}/*.nc: a file name 'bad\\udcff.nc' is not UTF-8" in lines[0], m.log()
    with xr.open_zarr(m.path / "new\nline.nc", consolidated=False) as got, xr.open_dataset(AIR) as want:
        xr.testing.assert_allclose(got.load(), want.load())

    result = run_refmount("scan", d, "-o", tmp_path / "out.json")  # (a directory: every file below it)
    assert result.returncode == 0 and len(left_out_lines(result.stderr)) == 1, result.stderr
    keys = json.loads((tmp_path / "out.json").read_text())
    assert sorted({key.split("/")[0] for key in keys} - {".zgroup"}) == ["good.nc", "new\nline.nc"]

    # @FILE: each line's name checked the same way, the list named as the source
    listing = tmp_path / "list.txt"
    listing.write_text(f"{d}/good.nc\n{d}/nul\x00.nc\nhttp://127.0.0.1:9/d/..%2fdir%2fa.nc\n")
    from refmount.refs.scan.sources import list_sources

    assert [e.name for e in list_sources(f"@{listing}")] == ["good.nc"]
    result = run_refmount("scan", f"@{listing}", "-o", tmp_path / "out2.json")
    assert result.returncode == 0, result.stderr
    lines = left_out_lines(result.stderr)
    assert len(lines) == 2 and all(line.startswith(f"refmount: @{listing}: a file name ") for line in lines), lines


def test_same_named_files_get_distinct_checked_names(tmp_path, caplog):
    """Same-named files are named by their path ('/' shown as '~'); a joined name another file has
    already, or one too long, is left out with a line, never two directories of one name."""
    from refmount.refs.scan.sources import list_sources

    for rel in ("a/x.nc", "b/x.nc", "a~x.nc", "y" * 200 + "/q" * 30 + "/z.nc", "w" * 200 + "/q" * 30 + "/z.nc"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    with caplog.at_level("WARNING", logger="refmount"):
        names = [e.name for e in list_sources(str(tmp_path))]
    assert names == ["a~x.nc", "b~x.nc"], names  # (a/x.nc's 'a~x.nc' is the first file's)
    assert len(names) == len(set(names))
    assert len(caplog.records) == 3, caplog.text
    assert "'a~x.nc' is another file's name too" in caplog.text and "is longer than 255 bytes" in caplog.text


def test_s3_keys_that_are_bad_names_are_left_out(mount, scans, tmp_path):
    import s3fs

    from tests.support.moto import moto_server

    with moto_server() as endpoint:
        options = {"key": "AKIATESTTESTTEST0000", "secret": "test/secret/0000", "endpoint_url": endpoint}
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        fs.mkdir("bucket")
        fs.put_file(str(AIR), "bucket/d/good.nc")
        fs.pipe("bucket/d/" + "k" * 300 + ".nc", AIR.read_bytes())
        fs.pipe("bucket/d/e/..", AIR.read_bytes())
        m = mount("s3://bucket/d/", "--remote-options", json.dumps(options), "--view", "raw")
        assert listed(m.path) == ["good.nc"]
        lines = left_out_lines(m.log())
        assert len(lines) == 2 and all(line.count("s3://bucket/d/: a file name ") == 1 for line in lines), m.log()
        assert "air" in os.listdir(m.path / "good.nc")


def test_dataset_root_serves_no_bad_name():
    """The tree's own last line: a name that reached it unchecked is not shown (the kernel answers EIO
    for a whole directory listing holding a '/')."""
    from refmount.fuse.datasets import DatasetRoot
    from refmount.fuse.fs import ROOT_INODE

    root = DatasetRoot(["a.nc", "b/c.nc", "..", "a.nc", "d.nc"], None, view_name="raw")
    shown = [name for name, _, _ in root.subdir_entries(ROOT_INODE, 0)]
    assert shown == [b"a.nc", b"d.nc"]


# -- row 7: a lazy glob reads the DMR++ beside each file, not the file's header -------------------------

def test_lazy_glob_with_dmrpp_sidecars_reads_no_data_file_header(mount, scans, tmp_path):
    import xarray as xr

    from tests.support.dmrpp_files import write_dmrpp

    www = tmp_path / "www" / "data"
    files = []
    for f in make_daily(www, 3, nlat=7, nlon=12):
        h5 = f.rename(f.with_suffix(".h5"))
        write_dmrpp(h5, h5.with_name(h5.name + ".dmrpp"))
        files.append(h5)
    block = f"root {www.parent}; location /data/ {{ autoindex on; }}"
    with Nginx(tmp_path / "nginx", block, log_format=LOG_FORMAT) as nginx:
        def requests(suffix: str, since: int = 0) -> list[str]:
            return [line for line in nginx.access_log()[since:] if re.search(rf"/data/tas_\d+{re.escape(suffix)} ", line)]

        m = mount(f"{nginx.url}/data/tas_*.h5")  # (no --concat: a lazy mount)
        assert listed(m.path) == [f.name for f in files]
        for f in files:  # every dataset looked up and its header read: from the DMR++ alone
            header = subprocess.run([*NCDUMP, "-h", nczarr_url(m.path / f.name)], capture_output=True, text=True,
                                    timeout=60)
            assert "float tas(time, lat, lon)" in header.stdout, header.stderr
        assert len([line for line in requests(".h5.dmrpp") if line.startswith("GET")]) == len(files), nginx.access_log()
        assert requests(".h5") == [], "no byte of a data file is read for its header"
        assert "scanned" in m.log() and "netCDF-4/HDF5 file" not in m.log()
        before = len(nginx.access_log())
        raw = mount(f"{nginx.url}/data/tas_*.h5", "--view", "raw")
        for f in files:  # the values: ranges of the data files, equal to the files'
            with xr.open_zarr(raw.path / f.name, consolidated=False) as got, xr.open_dataset(f) as want:
                assert np.array_equal(got.tas.values, want.tas.values)
        data = requests(".h5", before)
        assert data and all(line.startswith("GET") and '"bytes=' in line for line in data), data


# -- row 9 and 10: what failed, said in one line naming the file -------------------------------------------

def mount_fails(source, tmp_path, *args) -> str:
    """The one line of `refmount mount` that refuses `source` (a mount that comes up is stopped, by PID)."""
    from tests.conftest import REFMOUNT, force_unmount

    mnt = tmp_path / "mnt-failing"
    mnt.mkdir(exist_ok=True)
    proc = subprocess.Popen([*REFMOUNT, "mount", "--foreground", *args, str(source), str(mnt)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate(timeout=30)
        force_unmount(mnt)
        pytest.fail(f"{source} was mounted")
    assert proc.returncode != 0
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_truncated_netcdf4_mounted_directly_is_said_truncated(scans, tmp_path):
    data = AIR.read_bytes()
    cut = tmp_path / "third.nc"
    cut.write_bytes(data[: len(data) // 3])
    line = mount_fails(cut, tmp_path)
    assert str(cut) in line and f"it is truncated ({len(data) // 3:,} bytes of the {len(data):,}" in line, line
    assert "died" not in line and "crash" not in line, line
    line = mount_fails(AIR, tmp_path, "--max-refs-size", "2K")  # (too large: said so)
    assert str(AIR) in line and "its references would exceed 2,048 bytes (--max-refs-size)" in line, line


def test_truncated_netcdf3_is_said_truncated(scans, tmp_path):
    import netCDF4

    whole = tmp_path / "whole.nc"
    with netCDF4.Dataset(whole, "w", format="NETCDF3_CLASSIC") as ds:
        ds.createDimension("x", 10000)
        ds.createVariable("v", "f8", ("x",))[:] = np.arange(10000.0)
    cut = tmp_path / "cut3.nc"
    cut.write_bytes(whole.read_bytes()[:20000])
    line = mount_fails(cut, tmp_path)
    assert str(cut) in line and "it is truncated (its header places data up to byte 80,080 of its 20,000)" in line


def test_a_zero_byte_nc_is_named_and_said_empty(scans, tmp_path):
    empty = tmp_path / "empty.nc"
    empty.write_bytes(b"")
    line = mount_fails(empty, tmp_path)
    assert repr(str(empty)) in line and "is empty" in line, line


def test_a_scanner_that_really_dies_is_said_to_have_died_with_its_signal():
    """'died' is kept for a real death: a crash (SIGSEGV: a parser's bug, or an allocation past the
    memory cap that the C code did not check) and a kill (SIGKILL: the out-of-memory killer)."""
    from refmount.fetch.retry import passing
    from refmount.refs.scan.pool import _Worker

    for sig, words, may_pass in ((signal.SIGSEGV, "died on it (SIGSEGV: a crash in the parser, or an allocation "
                                                  "past its 1024 MiB memory cap)", False),
                                 (signal.SIGKILL, "was killed (SIGKILL: the system's out-of-memory killer", True)):
        worker = _Worker(1 << 30, 1 << 20)
        try:
            os.kill(worker.process.pid, sig)
            death = worker.death()
            assert words in str(death) and (passing(death) is not None) == may_pass  # (a kill may be tried again)
        finally:
            worker.stop(kill=True)


def test_scan_failures_name_what_failed(scans, tmp_path):
    """In a glob, each file that cannot be scanned is one log line saying why, the rest mount."""
    data = AIR.read_bytes()
    d = tmp_path / "g"
    d.mkdir()
    (d / "good.nc").write_bytes(data)
    (d / "third.nc").write_bytes(data[: len(data) // 3])
    (d / "empty.nc").write_bytes(b"")
    (d / "text.nc").write_bytes(b"hello, no netCDF here\n" * 10)
    result = run_refmount("scan", f"{d}/*.nc", "-o", tmp_path / "out.json")
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stderr.strip().splitlines())
    assert len(lines) == 3, lines
    assert f"{d}/empty.nc: is empty" in lines[0]
    assert f"{d}/text.nc: is not a netCDF, HDF5, HDF4, GRIB, TIFF or FITS file" in lines[1]
    assert f"{d}/third.nc: netCDF-4/HDF5 file that cannot be scanned: it is truncated" in lines[2]


def test_grib_ranges_past_the_end_are_not_taken_for_truncation(scans, tmp_path):
    """kerchunk's GRIB scanner writes ranges past the end of a whole file (docs/reference-sets.md): only
    netCDF-3's header is held to its file's size."""
    grib = Path(__file__).parent / "data" / "cfgrib" / "regular_ll_sfc.grib"
    result = run_refmount("scan", grib, "-o", tmp_path / "g.json")
    assert result.returncode == 0, result.stderr
