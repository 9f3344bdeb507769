"""--refresh: a growing archive, followed while it is read (issue 41).

- What changed between two listings (refs/scan/changes.py) and the generations' inode numbering
  (fuse/generations.py), without a mount.
- A `--concat time` mount of an nginx autoindex directory: files added while `ncdump -v time` and
  xarray read the mount in a loop (no error, no mixed value: every time axis seen is the whole axis of
  some listing); after the refresh `ncdump -v time` equals that of `ncrcat` (NCO) of all the files;
  a file open before the refresh keeps its version; a file replaced in place is scanned again; a file
  removed leaves; a refresh while nginx is stopped keeps the tree and says so once.
- A lazily mounted glob (one directory per file): a new file's directory appears, a removed one leaves,
  a replaced one is scanned again.
- A new file that cannot be combined: the tree stays, said once; an Icechunk branch: its newest snapshot.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from refmount.fuse.fs import ROOT_INODE
from refmount.fuse.generations import Generations
from refmount.refs.scan.changes import Changes, listing_changes
from tests.conftest import run_refmount
from tests.test_archive import scans  # noqa: F401 (each test's scan store its own)
from tests.support.daily import make_daily
from tests.support.nginx import Nginx

WAIT = 30.0  # seconds a refresh may take to show, at most (1 s interval; a loaded machine)


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> list[Path]:
    return make_daily(tmp_path_factory.mktemp("days"), 5, nlat=6, nlon=8)


def wait_for(condition, what: str, m=None, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout} s" + (f"\n{m.log()}" if m is not None else ""))
        time.sleep(0.1)


def time_values(cdl: str) -> list[float]:
    """The values of `time` in `ncdump -v time` output."""
    data = cdl.split("data:", 1)[1]
    text = re.search(r"\btime = ([^;]*);", data).group(1)
    return [float(v) for v in text.replace("\n", " ").split(",")]


def ncdump_time(path) -> list[float]:
    """`ncdump -v time` of a mount (a directory, as NCZarr) or a netCDF file."""
    target = f"file://{path}#mode=zarr,file" if Path(path).is_dir() else str(path)
    out = subprocess.run(["ncdump", "-v", "time", target], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return time_values(out.stdout)


# -- without a mount ---------------------------------------------------------------------------------

def test_listing_changes_are_new_changed_and_gone_in_listing_order():
    before = {"a.nc": ("a", 1), "b.nc": ("b", 1), "c.nc": ("c", 1)}
    after = {"a.nc": ("a", 1), "c.nc": ("c", 2), "d.nc": ("d", 1), "e.nc": ("e", 1)}
    changes = listing_changes(before, after)
    assert changes == Changes(added=("d.nc", "e.nc"), changed=("c.nc",), removed=("b.nc",))
    assert changes.describe() == "2 new ('d.nc', 'e.nc'), 1 changed ('c.nc'), 1 gone ('b.nc')"
    assert not listing_changes(after, dict(after))
    assert listing_changes({}, after).added == tuple(after)


def test_generations_keep_an_open_trees_inodes_and_give_the_root_to_the_newest():
    class Tree:
        def __init__(self, name):
            self.name = name
            self.invalidate = self.mount_info = self.local_access = None

        async def open(self, ino, flags, caller=None):
            return ino, False

        async def read(self, fh, offset, size):
            return f"{self.name}:{fh}".encode()

    import trio

    gens = Generations(Tree("old"))

    async def main():
        fh, _ = await gens.open(gens._inode(gens.current, 7), os.O_RDONLY)  # (as a lookup numbers it)
        assert gens._split(ROOT_INODE)[1].name == "old"
        gens.swap(Tree("new"))
        assert await gens.read(fh, 0, 10) == b"old:7"  # (the version it opened)
        fh2, _ = await gens.open(gens._inode(gens.current, 7), os.O_RDONLY)
        assert await gens.read(fh2, 0, 10) == b"new:7"
        assert gens._split(ROOT_INODE)[1].name == "new"
        for n in range(4):
            gens.swap(Tree(f"gen{n}"))
        assert await gens.read(fh, 0, 10) == b"old:7"  # still open: kept
        gens.release(fh)
        assert 0 not in gens.trees and 1 in gens.trees  # (released, more than KEEP behind; fh2 still open)
        gens.release(fh2)
        assert sorted(gens.trees) == [gens.current - 2, gens.current - 1, gens.current]

    trio.run(main)


def test_changes_that_failed_to_fetch_are_applied_again_and_refused_ones_are_not():
    """A listing whose changes could not be applied for a fetch error (a server down while the new tree
    was made) is applied again at the next refresh; one that was refused (a file that cannot be combined)
    is not, while the listing stays the same."""
    import trio

    from refmount.errors import RefmountError, Unavailable
    from refmount.fuse.refresh import Refresher

    listing = {"a": ("a", 1)}
    outcomes = [Unavailable("a: gave up after 3 attempts in 0.1s; last error: HTTP 503"), None]
    applied = []

    async def apply(changes, entries):
        applied.append(changes.added)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    refresher = Refresher("src", None, 1.0, apply, shown=set(), listing=lambda: ([], dict(listing)), known={})
    assert trio.run(refresher.refresh) is None and trio.run(refresher.refresh)
    assert applied == [("a",), ("a",)] and refresher.known == listing
    listing["b"] = ("b", 1)
    outcomes.append(RefmountError("b cannot be combined"))
    assert trio.run(refresher.refresh) is None and trio.run(refresher.refresh) is None
    assert applied == [("a",), ("a",), ("b",)] and refresher.failures == 2


def test_a_bad_refresh_value_is_one_line_naming_the_option(tmp_path):
    result = run_refmount("mount", "--refresh", "soon", str(tmp_path / "*.nc"), str(tmp_path / "mnt"))
    assert result.returncode != 0
    assert "--refresh" in result.stderr and "'soon' is not a duration" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.usefixtures("scans")
def test_refresh_of_one_file_is_refused_in_one_line(days, tmp_path):
    (tmp_path / "mnt").mkdir()
    result = run_refmount("mount", "--refresh", "5m", str(days[0]), str(tmp_path / "mnt"))
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--refresh" in lines[0] and "only a source that lists files" in lines[0], result.stderr


# -- a growing archive on nginx, combined along time -----------------------------------------------------

class Readers:
    """ncdump and xarray reading the mount in a loop, in threads, until stopped: each time axis they see
    is recorded; any error is kept."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[tuple[str, int]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._ncdump), threading.Thread(target=self._xarray)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _check(self, who: str, values) -> None:
        values = np.asarray(values, dtype="f8")
        if not np.array_equal(values, np.arange(len(values), dtype="f8")) or len(values) % 24:
            self.errors.append(f"{who} saw a mixed time axis: {values.tolist()}")
        self.seen.append((who, len(values)))

    def _ncdump(self) -> None:
        while not self._stop.is_set():
            try:
                self._check("ncdump", ncdump_time(self.path))
            except Exception as e:  # noqa: BLE001 - kept for the test to report
                self.errors.append(f"ncdump: {e}")

    def _xarray(self) -> None:
        import xarray as xr

        while not self._stop.is_set():
            try:
                with xr.open_zarr(self.path, consolidated=False, decode_times=False) as ds:
                    times = ds["time"].values
                    tas = ds["tas"].isel(lat=0, lon=0).values
                self._check("xarray", times)
                if tas.shape != times.shape:
                    self.errors.append(f"xarray: tas has {tas.shape} steps, time {times.shape}")
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"xarray: {type(e).__name__}: {e}")


def first_two(days: list[Path], directory: Path) -> Path:
    """`directory` holding the first two days: an archive about to grow."""
    directory.mkdir(parents=True)
    for path in days[:2]:
        shutil.copy(path, directory)
    return directory


def replace_in_place(path: Path, add: float) -> None:
    """Another version of a file under its name: `add` added to its tas (written beside it, renamed over)."""
    import netCDF4

    new = path.with_suffix(".new")
    shutil.copy(path, new)
    with netCDF4.Dataset(new, "r+") as ds:
        ds["tas"][:] = ds["tas"][:] + add
    os.replace(new, path)


def ncrcat_time(files, tmp_path) -> list[float]:
    out = tmp_path / "ncrcat.nc"
    subprocess.run(["ncrcat", "-O", *map(str, files), str(out)], check=True, capture_output=True, timeout=60)
    return ncdump_time(out)


@pytest.mark.usefixtures("scans")
def test_growing_archive_on_nginx_concat_time(mount, days, tmp_path):
    import xarray as xr

    www = first_two(days, tmp_path / "www" / "data")
    with Nginx(tmp_path / "nginx", f"root {www.parent}; location /data/ {{ autoindex on; }}") as nginx:
        m = mount(f"{nginx.url}/data/", "--concat", "time", "--refresh", "1s")
        assert ncdump_time(m.path) == list(range(48))
        pinned = open(m.path / "time" / ".zarray", "rb")  # a reader's file open across the refresh
        before = pinned.read()
        with Readers(m.path) as readers:
            wait_for(lambda: len(readers.seen) >= 2, "the readers read", m)
            for path in days[2:4]:
                shutil.copy(path, www)
            wait_for(lambda: len(ncdump_time(m.path)) == 96, "ncdump -v time shows the new steps", m)
            wait_for(lambda: {n for _, n in readers.seen[-4:]} == {96}, "the readers see 96 steps", m)
        assert not readers.errors, readers.errors[:5]
        assert {n for _, n in readers.seen} <= {48, 72, 96}, readers.seen
        assert ncdump_time(m.path) == ncrcat_time(sorted(www.iterdir()), tmp_path)
        pinned.seek(0)
        assert pinned.read() == before and os.fstat(pinned.fileno()).st_size == len(before)  # its version
        pinned.close()
        with open(m.path / "time" / ".zarray", "rb") as f:  # a new open sees the new one
            assert json.loads(f.read())["shape"] == [96] and json.loads(before)["shape"] == [48]
        # (the coordinate of a growing set comes in a chunk per file: adding files changes none of them)
        with open(m.path / "time" / "0", "rb") as f:
            assert np.frombuffer(f.read(), "<f8").tolist() == list(range(24))
        with open(m.path / "time" / "3", "rb") as f:
            assert np.frombuffer(f.read(), "<f8").tolist() == list(range(72, 96))

        # a file replaced in place (another size and date) is scanned again
        replace_in_place(www / days[1].name, 100)
        wait_for(lambda: "1 changed ('tas_20200102.nc')" in m.log(), "the replaced file rescanned", m)
        with xr.open_zarr(m.path, consolidated=False) as got, xr.open_mfdataset(sorted(www.iterdir())) as want:
            np.testing.assert_array_equal(got["tas"].values, want["tas"].values)
            assert float(got["tas"][30, 0, 0]) > 300

        # a file removed leaves
        (www / days[0].name).unlink()
        wait_for(lambda: len(ncdump_time(m.path)) == 72, "the removed file leaves", m)
        assert ncdump_time(m.path) == ncrcat_time(sorted(www.iterdir()), tmp_path)

        # the server stops: the tree stays (a refresh's listing of a server that is down fails in seconds)
        nginx.__exit__()
        wait_for(lambda: "failed; the mount keeps what it showed" in m.log(), "the failed refresh said", m)
        assert sorted(n for n in os.listdir(m.path) if not n.startswith(".")) == ["lat", "lon", "tas", "time"]
        assert len(ncdump_time(m.path)) == 72
        # it refuses the listing: the tree stays, and the log says why once (another reason: said again)
        served = nginx.server_block
        nginx.server_block = f"root {www.parent}; location /data/ {{ deny all; }}"
        nginx.__enter__()
        wait_for(lambda: "access refused" in m.log(), "the refused refresh said", m)
        time.sleep(2.5)  # (two more intervals fail)
        assert m.log().count("failed; the mount keeps what it showed") == 2, m.log()
        assert m.log().count("access refused") == 1, m.log()
        assert len(ncdump_time(m.path)) == 72
        stats = m.stats()["refresh"]
        assert stats["failing"] and stats["failures"] >= 2 and stats["changes"] >= 3, stats
        nginx.__exit__()
        nginx.server_block = served
        nginx.__enter__()
        wait_for(lambda: "works again" in m.log(), "the refresh works again", m)

    from refmount.fetch.registry import REGISTRY

    names = {family.name: samples for family, samples in REGISTRY.collect({"refresh": stats})}
    assert names["refmount_refresh_changes_total"] == [({}, stats["changes"])]
    assert ({"change": "added"}, stats["files_added"]) in names["refmount_refresh_files_total"]


@pytest.mark.usefixtures("scans")
def test_a_new_file_whose_server_answers_503_at_a_refresh_is_asked_again_at_the_next(mount, days, tmp_path):
    """A --concat set grows by a file whose server answers 503 (nginx, while a flag file exists): to its
    HEAD too, the refresh fails, said once in one line naming it; to its GETs only, the refresh leaves it
    out and says so, and does not take it as seen: once the server answers, a later refresh combines it,
    and ncdump -v time equals ncrcat of all the files."""
    www = first_two(days, tmp_path / "www" / "data")
    every, gets, new = tmp_path / "refuse-all", tmp_path / "refuse-get", days[2].name
    block = (f"root {www.parent}; location /data/ {{ autoindex on; }} "
             f"location = /data/{new} {{ set $refuse ''; if (-f {every}) {{ return 503; }} "
             f"if (-f {gets}) {{ set $refuse g; }} if ($request_method = GET) {{ set $refuse ${{refuse}}e; }} "
             f"if ($refuse = ge) {{ return 503; }} }}")
    with Nginx(tmp_path / "nginx", block) as nginx:
        m = mount(f"{nginx.url}/data/", "--concat", "time", "--refresh", "1s", "--read-timeout", "3")
        assert len(ncdump_time(m.path)) == 48
        every.touch()
        shutil.copy(days[2], www)
        wait_for(lambda: "failed; the mount keeps what it showed" in m.log(), "the failed refresh said", m)
        time.sleep(2.5)  # (two more intervals fail)
        failed = [line for line in m.log().splitlines() if "failed; the mount keeps what it showed" in line]
        assert len(failed) == 1 and new in failed[0] and "503" in failed[0], m.log()
        assert "internal error" not in m.log() and len(ncdump_time(m.path)) == 48
        gets.touch()
        every.unlink()
        wait_for(lambda: re.search(f"{new}: .*503.*left out of the mount", m.log()), "the file left out for now", m)
        assert len(ncdump_time(m.path)) == 48
        gets.unlink()
        wait_for(lambda: len(ncdump_time(m.path)) == 72, "the file asked again once its server answers", m)
        assert ncdump_time(m.path) == ncrcat_time(sorted(www.iterdir()), tmp_path)


# -- a lazily mounted glob: a directory per file ------------------------------------------------------

@pytest.mark.usefixtures("scans")
def test_lazy_glob_refresh_new_directory_appears_removed_leaves_replaced_rescanned(mount, days, tmp_path):
    import xarray as xr

    src = first_two(days, tmp_path / "src")
    m = mount(f"{src}/*.nc", "--refresh", "1s")
    first, second, third = (p.name for p in days[:3])
    assert sorted(os.listdir(m.path)) == [first, second]
    with xr.open_zarr(m.path / first, consolidated=False) as ds:
        assert ds.sizes["time"] == 24
    shutil.copy(days[2], src)
    wait_for(lambda: third in os.listdir(m.path), "the new file's directory appears", m)
    with xr.open_zarr(m.path / third, consolidated=False) as got, xr.open_dataset(days[2]) as want:
        np.testing.assert_array_equal(got["tas"].values, want["tas"].values)

    # replaced in place: its directory is the new version's
    replace_in_place(src / first, -100)
    wait_for(lambda: f"1 changed ('{first}')" in m.log(), "the replaced file seen", m)
    with xr.open_zarr(m.path / first, consolidated=False) as got:
        assert float(got["tas"].max()) < 200

    (src / second).unlink()
    wait_for(lambda: second not in os.listdir(m.path), "the removed file's directory leaves", m)
    assert not (m.path / second).exists()
    assert m.stats()["refresh"]["files_removed"] == 1


@pytest.mark.usefixtures("scans")
def test_a_refresh_of_an_index_page_whose_server_is_down_fails_fast_and_keeps_the_tree(mount, days, tmp_path):
    """nginx stops under a lazily mounted index page: the next refresh fails in seconds (not after a mount's
    --read-timeout of retries), said once; ls shows the last good tree and what was read is read again
    while refreshes keep failing; nginx back with a new file: the next refresh says it works again and
    the new file's directory appears, equal to the file."""
    import xarray as xr

    www = first_two(days, tmp_path / "www" / "data")
    first, third = days[0].name, days[2].name
    with Nginx(tmp_path / "nginx", f"root {www.parent}; location /data/ {{ autoindex on; }}") as nginx:
        m = mount(f"{nginx.url}/data/", "--refresh", "1s")
        with xr.open_dataset(days[0]) as want:
            expected = want["tas"].values
        with xr.open_zarr(m.path / first, consolidated=False) as got:
            np.testing.assert_array_equal(got["tas"].values, expected)
        nginx.__exit__()
        # (the bound: a refresh that retried as a mount's reads do took 22 s to fail)
        wait_for(lambda: "failed; the mount keeps what it showed" in m.log(), "the failed refresh said", m,
                 timeout=15)
        for _ in range(3):  # reads while refreshes keep failing: the tree and its cached bytes
            assert sorted(os.listdir(m.path)) == [first, days[1].name]
            with xr.open_zarr(m.path / first, consolidated=False) as got:
                np.testing.assert_array_equal(got["tas"].values, expected)
            time.sleep(1)
        assert m.log().count("failed; the mount keeps what it showed") == 1, m.log()
        assert "cannot list" in m.log() and m.stats()["refresh"]["failing"]
        shutil.copy(days[2], www)
        nginx.__enter__()
        wait_for(lambda: third in os.listdir(m.path), "the new file's directory appears", m)
        assert "works again" in m.log()
        with xr.open_zarr(m.path / third, consolidated=False) as got, xr.open_dataset(days[2]) as want:
            np.testing.assert_array_equal(got["tas"].values, want["tas"].values)


# -- an Icechunk branch: its newest snapshot ------------------------------------------------------------

def test_icechunk_branch_refresh_follows_its_newest_snapshot(mount, tmp_path):
    icechunk = pytest.importorskip("icechunk")
    import xarray as xr
    import zarr

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.writable_session("main")
    group = zarr.create_group(session.store, zarr_format=3)
    group.create_array("t", shape=(4,), dtype="f8", chunks=(4,), dimension_names=["t"])[...] = np.arange(4.0)
    session.commit("first")
    m = mount(tmp_path / "repo", "--refresh", "1s")
    with xr.open_zarr(m.path, consolidated=False) as ds:
        assert ds["t"].values.tolist() == [0, 1, 2, 3]
    session = repo.writable_session("main")
    array = zarr.open_array(session.store, path="t", mode="r+")
    array.resize((8,))
    array[4:] = np.arange(4.0, 8.0)
    session.commit("grown")
    wait_for(lambda: "1 changed ('snapshot')" in m.log(), "the new snapshot followed", m)
    with xr.open_zarr(m.path, consolidated=False) as ds:
        assert ds["t"].values.tolist() == list(range(8))
    assert m.stats()["refresh"]["changes"] == 1


@pytest.mark.usefixtures("scans")
def test_a_new_file_that_cannot_be_combined_keeps_the_tree_and_is_said_once(mount, days, tmp_path):
    src = first_two(days, tmp_path / "src")
    m = mount(f"{src}/*.nc", "--concat", "time", "--refresh", "1s")
    other = make_daily(tmp_path / "other", 1, nlat=3, nlon=8, start=datetime.date(2020, 1, 3))[0]
    shutil.copy(other, src)  # another grid: lat differs
    wait_for(lambda: "failed; the mount keeps what it showed" in m.log(), "the failed refresh said", m)
    time.sleep(2.5)  # (two more intervals: the same listing is not combined again)
    assert m.log().count("failed; the mount keeps what it showed") == 1, m.log()
    assert "tas_20200103.nc" in m.log() and len(ncdump_time(m.path)) == 48
    (src / other.name).unlink()
    shutil.copy(days[2], src)
    wait_for(lambda: "works again" in m.log(), "the refresh works again", m)
    wait_for(lambda: len(ncdump_time(m.path)) == 72, "the good file combined", m)
