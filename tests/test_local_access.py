"""No way around file permissions: root mounts a local reference set with --allow-other, and user
nobody opens keys whose bytes come from local files only where nobody may read those files itself
(issue 25). Real mounts, a real other user (setpriv), real files; plus the permission rule itself.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from refmount.fuse.access import may_read
from tests.conftest import IN_CI, Mount, force_unmount

USER = "nobody"


@pytest.fixture
def shared_dir():
    """A directory every user can search (pytest's tmp_path is private to root); removed afterwards."""
    if os.geteuid() != 0:
        (pytest.fail if IN_CI else pytest.skip)("mounting for other users and switching users needs root")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is required")
    path = Path(tempfile.mkdtemp(prefix="refmount-access-"))
    path.chmod(0o755)
    mounts: list[Mount] = []
    yield path, mounts
    for m in mounts:
        m.stop()
        force_unmount(m.path)
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*command) -> subprocess.CompletedProcess:
    pw = pwd.getpwnam(USER)
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--",
                           *map(str, command)], capture_output=True, timeout=60)


def mounted(shared: Path, mounts: list, refs: dict, *args) -> Path:
    refs_path = shared / f"refs{len(mounts)}.json"
    refs_path.write_text(json.dumps(refs))
    return mounted_source(shared, mounts, refs_path, *args)


def mounted_source(shared: Path, mounts: list, source, *args) -> Path:
    """`source` (a reference file, a data file, a glob) mounted by root with --allow-other."""
    n = len(mounts)
    env = {**os.environ, "XDG_CACHE_HOME": str(shared / "xdg-cache")}  # (scans kept here, not in ~root)
    m = Mount(source, shared / f"mnt{n}", ["--allow-other", *args], log_path=shared / f"mount{n}.log", env=env)
    mounts.append(m)
    m.start()
    return m.path


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_nobody_gets_eacces_for_a_key_whose_target_is_etc_shadow(shared_dir, view):
    shared, mounts = shared_dir
    mnt = mounted(shared, mounts, {"secret": ["/etc/shadow", 0, 64], "note": "inline text"}, "--view", view)
    result = as_nobody("cat", mnt / "secret")
    assert result.returncode != 0 and b"Permission denied" in result.stderr, result
    assert result.stdout == b""
    assert as_nobody("cat", mnt / "note").stdout == b"inline text"  # inline keys: as before
    assert (mnt / "secret").read_bytes() == Path("/etc/shadow").read_bytes()[:64]  # root still reads it
    assert "may not read the local file(s) behind key 'secret'" in (shared / "mount0.log").read_text()


def test_nobody_still_reads_a_key_whose_target_is_world_readable(shared_dir):
    shared, mounts = shared_dir
    public = shared / "public.bin"
    public.write_bytes(os.urandom(5000))
    public.chmod(0o644)
    private = shared / "private.bin"
    private.write_bytes(b"root only")
    private.chmod(0o600)
    later = shared / "later.bin"  # does not exist when the set is mounted
    mnt = mounted(shared, mounts, {"public": [str(public), 100, 1000], "whole": [f"file://{public}"],
                                   "private": [str(private)], "later": [str(later), 0, 5]})
    assert as_nobody("cat", mnt / "public").stdout == public.read_bytes()[100:1100]
    assert as_nobody("cat", mnt / "whole").stdout == public.read_bytes()
    assert b"Permission denied" in as_nobody("cat", mnt / "private").stderr
    assert b"Permission denied" in as_nobody("cat", mnt / "later").stderr  # (cannot tell yet: refused)
    later.write_bytes(b"hello")
    later.chmod(0o644)
    result = as_nobody("cat", mnt / "later")
    assert result.stdout == b"hello", result.stderr
    later.chmod(0o600)  # checked at each open (after a second's memory of the last answer)
    subprocess.run(["sleep", "1.1"])
    assert b"Permission denied" in as_nobody("cat", mnt / "later").stderr


def test_permission_rule(shared_dir):
    """The kernel's rule, emulated: the owner's bits for the owner, else the group's for a member,
    else the others'; search permission on every directory; a missing file is not readable."""
    tmp_path, _ = shared_dir
    directory = tmp_path / "d"
    directory.mkdir()
    f = directory / "f"
    f.write_bytes(b"x")
    os.chown(directory, 0, 0)
    directory.chmod(0o755)
    os.chown(f, 1000, 2000)
    f.chmod(0o604)  # owner may read, group may not, others may
    assert may_read(str(f), 1000, {1000})
    assert not may_read(str(f), 3000, {2000})  # a member of the group: the group's bits, not the others'
    assert may_read(str(f), 3000, {3000})
    f.chmod(0o040)
    assert not may_read(str(f), 1000, {2000})  # the owner: the owner's bits only
    assert may_read(str(f), 3000, {2000, 5})
    f.chmod(0o444)
    directory.chmod(0o750)
    assert not may_read(str(f), 3000, {3000})  # no search permission on the directory
    assert may_read(str(f), 3000, {0})  # the directory's group
    assert not may_read(str(directory / "missing"), 0, {0})
    link = tmp_path / "link"
    link.symlink_to(f)
    directory.chmod(0o755)
    assert may_read(str(link), 3000, {3000})
    directory.chmod(0o700)
    assert not may_read(str(link), 3000, {3000})  # the link leads through a closed directory


# -- everything a local data file yields (issue 38, row 2) ----------------------------------------------
#
# A data file's attributes and small variables are inlined by its scan, and its metadata is made from
# them: with --allow-other, all of it is for those who may read the file, as a reference to it is.

AIR = Path(__file__).resolve().parent.parent / "examples" / "air-zlib.nc"  # netCDF-4 (HDF5), zlib


def netcdf3_file(path: Path) -> Path:
    """A small netCDF-3 file: every variable is under the 100 bytes its scan inlines."""
    import netCDF4
    import numpy as np

    with netCDF4.Dataset(path, "w", format="NETCDF3_CLASSIC") as ds:
        ds.title = "a secret title"
        ds.createDimension("x", 5)
        v = ds.createVariable("v", "f4", ("x",))
        v.units = "K"
        v[:] = np.arange(5, dtype="f4")
    return path


def private(path: Path) -> Path:
    os.chown(path, 0, 0)
    path.chmod(0o600)
    return path


def refused(path: Path) -> bool:
    """nobody's `cat` of it fails with EACCES and shows nothing."""
    result = as_nobody("cat", path)
    return result.returncode != 0 and b"Permission denied" in result.stderr and result.stdout == b""


def read_by_nobody(path: Path) -> bytes:
    result = as_nobody("cat", path)
    assert result.returncode == 0, result.stderr
    return result.stdout


def read_by_root(path: Path) -> bytes:
    """As root reads it with `cat` (a decoded view serves metadata in the form of the reader's process)."""
    return subprocess.run(["cat", str(path)], capture_output=True, check=True, timeout=60).stdout


def xattrs_refused(path: Path) -> bool:
    """nobody cannot see where a key's bytes come from (url, offset, source) either."""
    result = as_nobody("getfattr", "-d", "-m", "user.refmount", path)
    return b"Permission denied" in result.stderr and b"refmount" not in result.stdout


def assert_refused_then_readable(keys: list[Path], *, make_readable, listed: Path) -> None:
    """nobody sees the names but opens none of `keys`; root reads them all; after `make_readable()`
    (and the second access.py may remember an answer), nobody reads what root reads."""
    assert as_nobody("ls", listed).returncode == 0  # names in a readable directory stay visible
    for key in keys:
        assert refused(key), key
    assert xattrs_refused(keys[0])
    want = [read_by_root(key) for key in keys]  # root: as before
    make_readable()
    time.sleep(1.1)
    assert [read_by_nobody(key) for key in keys] == want
    assert b"refmount" in as_nobody("getfattr", "-d", "-m", "user.refmount", keys[0]).stdout


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_a_private_netcdf4_file_yields_nothing_to_nobody(shared_dir, view):
    shared, mounts = shared_dir
    source = private(Path(shutil.copy(AIR, shared / "air.nc")))
    mnt = mounted_source(shared, mounts, source, "--view", view)
    assert refused(mnt / "air" / "0.0.0")  # a reference to the file: as before
    keys = [mnt / ".zattrs", mnt / ".zgroup", mnt / ".zmetadata", mnt / "air" / ".zattrs", mnt / "lat" / ".zarray",
            mnt / "lat" / "0", mnt / "time" / "0"]  # (lat and time are inlined: under 500 bytes)
    assert_refused_then_readable(keys, make_readable=lambda: source.chmod(0o644), listed=mnt / "lat")


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_a_netcdf3_file_in_a_closed_directory_yields_nothing_to_nobody(shared_dir, view):
    """Search permission on each directory of the file's path counts, as for the file itself."""
    shared, mounts = shared_dir
    closed = shared / "closed"
    closed.mkdir(mode=0o700)
    source = netcdf3_file(closed / "small.nc")
    source.chmod(0o644)
    mnt = mounted_source(shared, mounts, source, "--view", view)
    keys = [mnt / ".zattrs", mnt / "v" / ".zarray", mnt / "v" / ".zattrs", mnt / "v" / "0"]  # (all inline)
    assert_refused_then_readable(keys, make_readable=lambda: closed.chmod(0o755), listed=mnt / "v")


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_a_lazy_glob_yields_each_file_only_to_those_who_may_read_it(shared_dir, view):
    shared, mounts = shared_dir
    files = shared / "files"
    files.mkdir(mode=0o755)
    hidden = private(Path(shutil.copy(AIR, files / "air.nc")))
    netcdf3_file(files / "small.nc").chmod(0o644)
    mnt = mounted_source(shared, mounts, f"{files}/*.nc", "--view", view)
    assert "each is scanned when its directory is first looked up" in (shared / "mount0.log").read_text()
    assert read_by_nobody(mnt / "small.nc" / ".zattrs") == read_by_root(mnt / "small.nc" / ".zattrs")
    assert read_by_nobody(mnt / "small.nc" / "v" / "0") == read_by_root(mnt / "small.nc" / "v" / "0")
    keys = [mnt / "air.nc" / ".zattrs", mnt / "air.nc" / "lat" / ".zarray", mnt / "air.nc" / "lat" / "0"]
    assert_refused_then_readable(keys, make_readable=lambda: hidden.chmod(0o644), listed=mnt)


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_an_eager_glob_gives_each_dataset_its_file_and_the_root_all_of_them(shared_dir, view):
    shared, mounts = shared_dir
    files = shared / "files"
    files.mkdir(mode=0o755)
    netcdf3_file(files / "a.nc").chmod(0o644)
    hidden = private(netcdf3_file(files / "b.nc"))
    mnt = mounted_source(shared, mounts, f"{files}/*.nc", "--strict", "--view", view)  # (--strict: scanned at mount)
    assert read_by_nobody(mnt / "a.nc" / ".zattrs") == read_by_root(mnt / "a.nc" / ".zattrs")
    keys = [mnt / "b.nc" / ".zattrs", mnt / "b.nc" / "v" / "0", mnt / ".zmetadata"]  # (.zmetadata: both files')
    assert_refused_then_readable(keys, make_readable=lambda: hidden.chmod(0o644), listed=mnt / "b.nc")


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_a_concatenation_needs_every_file_readable(shared_dir, view):
    """--concat time: the combined coordinate, metadata and attributes come from every file."""
    from tests.support.daily import make_daily

    shared, mounts = shared_dir
    days = make_daily(shared / "days", 2, nlat=30, nlon=40)  # (tas chunks too big to be inlined)
    (shared / "days").chmod(0o755)
    days[0].chmod(0o644)
    hidden = private(days[1])
    mnt = mounted_source(shared, mounts, f"{shared}/days/*.nc", "--concat", "time", "--view", view)
    assert refused(mnt / "tas" / "24.0.0")  # the second day's first chunk: a reference to its file
    assert read_by_nobody(mnt / "tas" / "0.0.0") == read_by_root(mnt / "tas" / "0.0.0")  # the first's: readable
    keys = [mnt / ".zattrs", mnt / ".zmetadata", mnt / "time" / "0", mnt / "time" / ".zarray", mnt / "tas" / ".zattrs",
            mnt / "lat" / "0"]
    assert_refused_then_readable(keys, make_readable=lambda: hidden.chmod(0o644), listed=mnt / "time")


def test_a_private_reference_file_keeps_its_inline_values(shared_dir):
    """A local reference file's inline values are its bytes: they are for those who may read it (the
    references it holds to other files are for those who may read those, as before)."""
    shared, mounts = shared_dir
    public = shared / "public.bin"
    public.write_bytes(b"public bytes")
    public.chmod(0o644)
    refs = shared / "refs.json"
    refs.write_text(json.dumps({"note": "inline text", ".zgroup": '{"zarr_format":2}', "public": [str(public)]}))
    private(refs)
    mnt = mounted_source(shared, mounts, refs, "--view", "raw")
    assert read_by_nobody(mnt / "public") == b"public bytes"
    assert_refused_then_readable([mnt / "note", mnt / ".zgroup"], make_readable=lambda: refs.chmod(0o644),
                                 listed=mnt)


def test_a_private_dmrpp_sidecar_keeps_its_values(shared_dir):
    """A data file read through its DMR++ beside it: its values come from the DMR++, its chunks from
    the file; both must be readable."""
    from tests.support.dmrpp_files import make_netcdf, write_dmrpp

    shared, mounts = shared_dir
    files = shared / "files"
    files.mkdir(mode=0o755)
    data = make_netcdf(files / "x.h5")
    data.chmod(0o644)
    sidecar = private(write_dmrpp(data, files / "x.h5.dmrpp"))
    mnt = mounted_source(shared, mounts, f"{files}/*", "--view", "raw")
    keys = [mnt / "x.h5" / ".zattrs", mnt / "x.h5" / ".zgroup"]
    assert_refused_then_readable(keys, make_readable=lambda: sidecar.chmod(0o644), listed=mnt / "x.h5")


def test_a_private_dmrpp_mounted_directly_keeps_its_values(shared_dir):
    from tests.support.dmrpp_files import make_netcdf, write_dmrpp

    shared, mounts = shared_dir
    data = make_netcdf(shared / "x.h5")
    data.chmod(0o644)
    sidecar = private(write_dmrpp(data, shared / "x.h5.dmrpp"))
    mnt = mounted_source(shared, mounts, sidecar, "--view", "raw")
    assert_refused_then_readable([mnt / ".zattrs", mnt / ".zgroup"], make_readable=lambda: sidecar.chmod(0o644),
                                 listed=mnt)


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_a_zarr_store_s_metadata_is_for_those_who_may_read_its_zarr_json(shared_dir, view):
    import numpy as np
    import zarr

    shared, mounts = shared_dir
    store = shared / "store"
    group = zarr.create_group(str(store), zarr_format=3, attributes={"title": "a secret title"})
    group.create_array("v", shape=(4,), chunks=(4,), dtype="i2", attributes={"units": "K"})[:] = np.arange(4)
    for path in store.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    store.chmod(0o755)
    hidden = [private(store / "zarr.json"), private(store / "v" / "zarr.json")]
    mnt = mounted_source(shared, mounts, store, "--view", view)
    keys = [mnt / "zarr.json", mnt / "v" / "zarr.json"] if view == "raw" else \
        [mnt / ".zattrs", mnt / ".zgroup", mnt / "v" / ".zarray", mnt / "v" / ".zattrs", mnt / ".zmetadata"]

    def make_readable():
        for path in hidden:
            path.chmod(0o644)

    assert_refused_then_readable(keys, make_readable=make_readable, listed=mnt / "v")


def test_a_key_s_origins_are_its_innermost_dataset_s():
    """(no mount) The rule refs/origins.py keeps: a key is its innermost listed directory's files', else
    the default's; the root's consolidated metadata is every file's."""
    from refmount.refs.origins import Origins, of_reference_source

    origins = Origins(("/d/a.nc", "/d/sub/b.nc"), {"a.nc": ("/d/a.nc",), "sub/b.nc": ("/d/sub/b.nc",),
                                                   "sub": ("/d/sub.nc",)})
    assert origins.of("a.nc/lat/.zarray") == ("/d/a.nc",)
    assert origins.of("sub/b.nc/.zattrs") == ("/d/sub/b.nc",)  # (not "sub"'s)
    assert origins.of("sub/x/.zattrs") == ("/d/sub.nc",)
    assert origins.of(".zgroup") == origins.of("a.ncx/.zattrs") == ("/d/a.nc", "/d/sub/b.nc")
    assert set(origins.of(".zmetadata")) == {"/d/a.nc", "/d/sub/b.nc", "/d/sub.nc"}
    assert of_reference_source("https://example.org/refs.json").of(".zattrs") == ()  # (nothing local)
