"""Icechunk format spec 2 (Icechunk >= 2.0), end to end, from committed fixtures.

The fixtures (tests/data/icechunk2, made by make.py there with icechunk 2.3.0, VirtualiZarr 2.8.0 and
zarr 3.4.2) need no icechunk package here, so format 2 is checked on every Python the suite runs on:
- `virtual`: VirtualiZarr -> Icechunk, every chunk url relative to the named container `sources`
  (vcc://sources/part0.nc), split manifests, dictionary-compressed locations;
- `native`: xarray.to_zarr into Icechunk sessions (chunk objects and inline chunks);
- `mixed`: virtual and native chunks in one repository;
- `spec1`: `native` written by icechunk 2.3.0 in format spec 1, and `migrated`: the same after
  Icechunk's upgrade to spec 2 (a `repo` file over spec-1 snapshots and manifests, refs/ left).
Each has main (both sources), tag v1 and its snapshot S1 (the first source), branch dev (S1 and an
attribute), a deleted tag `old`. The container is re-pointed at the test's own copy of the sources
(served over loopback HTTP, read locally, or put into moto's S3), as Icechunk users re-point one.

Oracles: the source netCDF files themselves (netCDF4 for stored values, xarray for decoded ones).
Where the running Python has icechunk >= 2, repositories are also written at test time (absolute
urls, an S3 container on another endpoint) and read back through icechunk itself.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.support import zarr_clients
from tests.support.rangeserver import RangeServer

DATA = Path(__file__).parent / "data" / "icechunk2"
FACTS = json.loads((DATA / "fixture.json").read_text())
CONTAINER = FACTS["container"]
NAMES = FACTS["sources"]
VARIABLES = ("time", "lat", "lon", "air", "prcp", "count")
KINDS = ("virtual", "native", "mixed")
VIRTUAL_KINDS = ("virtual", "mixed")
# version -> (options, sources it holds)
VERSIONS = {"main": ([], NAMES), "tag v1": (["--tag", "v1"], NAMES[:1]), "branch dev": (["--branch", "dev"], NAMES[:1]),
            "snapshot S1": (["--snapshot", "S1"], NAMES[:1])}


def elevation() -> np.ndarray:  # as make.py writes it into `mixed`
    return (np.arange(6 * 8, dtype="i4").reshape(6, 8) * 10 - 100).astype("i4")


def version_args(kind: str, version: str) -> list[str]:
    args = list(VERSIONS[version][0])
    if args and args[0] == "--snapshot":
        args[1] = FACTS["snapshots"][kind]["S1"]
    return args


def copy_sources(target: Path) -> Path:
    """The sources, with the modification time they had when the fixtures were committed (so that
    their last-modified and ETag checksums hold)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        shutil.copyfile(DATA / "sources" / name, target / name)
        os.utime(target / name, ns=(FACTS["sources_mtime_ns"], FACTS["sources_mtime_ns"]))
    return target


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The sources over loopback HTTP, and the oracles."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    root = copy_sources(tmp_path_factory.mktemp("ic2") / "sources")
    with RangeServer(root) as server:
        yield {"server": server, "root": root, "prefix": server.url + "/"}


def oracles(names) -> dict:
    paths = [DATA / "sources" / n for n in names]
    return {"stored": zarr_clients.concatenated_oracle(paths), "decoded": zarr_clients.source_dataset(paths)}


def pointing(prefix: str, kind: str) -> list[str]:
    """Options that re-point the fixture's container at `prefix` and authorise it."""
    if kind not in VIRTUAL_KINDS:
        return []
    return ["--container", f"{CONTAINER}={prefix}", "--authorize-container", prefix]


def check_decoded(mnt: Path, kind: str, names) -> None:
    o = oracles(names)
    variables = VARIABLES + (("elevation",) if kind == "mixed" else ())
    if kind == "mixed":
        o["stored"]["elevation"] = (elevation(), None)
        o["decoded"]["elevation"] = (("lat", "lon"), elevation())
    zarr_clients.assert_decoded_clients(mnt, o["stored"], o["decoded"], variables)


def check_raw(mnt: Path, kind: str, names) -> None:
    o = oracles(names)
    expected = {name: values for name, (values, _) in o["stored"].items()}
    if kind == "mixed":
        expected["elevation"] = elevation()
    zarr_clients.assert_raw_clients(mnt, expected, o["decoded"], VARIABLES)


# -- every kind, every version, both views, over HTTP ------------------------------------------------

@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("kind", KINDS)
def test_versions_read_right(mount, served, kind, version):
    """ncdump and netCDF4-python through the decoded view, zarr and xarray through the raw view, equal
    the sources the version holds."""
    names = VERSIONS[version][1]
    args = version_args(kind, version) + pointing(served["prefix"], kind)
    decoded = mount(DATA / kind, *args)
    check_decoded(decoded.path, kind, names)
    assert "format spec 2, ic-2.3.0" in decoded.log()
    raw = mount(DATA / kind, "--view", "raw", *args)
    assert json.loads((raw / "air" / "zarr.json").read_text())["zarr_format"] == 3
    check_raw(raw.path, kind, names)
    attributes = json.loads((raw / "zarr.json").read_text())["attributes"]
    assert (attributes.get("history") == "dev branch") == (version == "branch dev")
    assert json.loads((decoded / ".zattrs").read_text()).get("history") == attributes.get("history")


@pytest.mark.parametrize("kind", ["spec1", "migrated"])
def test_spec1_and_migrated(mount, kind):
    """Format spec 1 as icechunk 2.3 still writes it, and a repository migrated to spec 2 (whose
    snapshots and manifests stay spec 1): main through the decoded view, tag v1 through the raw one."""
    decoded = mount(DATA / kind)
    check_decoded(decoded.path, "native", NAMES)
    assert f"format spec {1 if kind == 'spec1' else 2}" in decoded.log()
    raw = mount(DATA / kind, "--view", "raw", "--tag", "v1")
    check_raw(raw.path, "native", NAMES[:1])
    dev = mount(DATA / kind, "--view", "raw", "--branch", "dev")
    assert json.loads((dev / "zarr.json").read_text())["attributes"]["history"] == "dev branch"


def test_chunk_kinds_and_split_manifests():
    """What the fixtures hold, as loaded: relative urls resolved, split manifests merged, native chunk
    objects, inline chunks, checksums."""
    from refmount.refs import load_refs
    from refmount.refs.icechunk import Version

    prefix = "http://127.0.0.1:1/data/"
    virtual = load_refs(str(DATA / "virtual"), containers={CONTAINER: prefix})
    assert sorted(virtual.urls) == [prefix + n for n in NAMES]
    assert [k for k in (virtual.key(i) for i in range(len(virtual))) if k.startswith("air/c/")] == [
        f"air/c/{t}/{y}/0" for t in range(4) for y in range(2)]  # 4 manifests (split along time), one each
    assert set(virtual.checksums.values()) == {("modified", FACTS["last_updated"])}
    assert set(virtual.icechunk_containers) == {prefix}
    etag = load_refs(str(DATA / "virtual"), containers={CONTAINER: prefix}, version=Version(branch="etag"))
    assert {kind for kind, _ in etag.checksums.values()} == {"etag"}
    native = load_refs(str(DATA / "native"))
    assert not native.icechunk_containers
    assert all(u.startswith(str(DATA / "native" / "chunks")) for u in native.urls)
    inline = [native.ref(i).is_inline for i in range(len(native)) if "/c" in native.key(i)]
    assert any(inline) and not all(inline)
    mixed = load_refs(str(DATA / "mixed"), containers={CONTAINER: prefix})
    refs = [mixed.ref(i) for i in range(len(mixed)) if "/c" in mixed.key(i)]
    kinds = {"inline" if r.is_inline else "virtual" if r.url.startswith("http") else "native" for r in refs}
    assert kinds == {"inline", "virtual", "native"}


# -- where the sources and the repository are ---------------------------------------------------------

def test_local_sources(mount, tmp_path):
    """The container re-pointed at a local directory (file://): the same values."""
    root = copy_sources(tmp_path / "local sources")
    prefix = root.as_uri() + "/"
    m = mount(DATA / "mixed", *pointing(prefix, "mixed"))
    check_decoded(m.path, "mixed", NAMES)
    raw = mount(DATA / "virtual", "--view", "raw", *pointing(prefix, "virtual"))
    check_raw(raw.path, "virtual", NAMES)


def test_repository_over_http(mount, served):
    """The repository itself on an HTTP server: the repo file, snapshots, manifests and native chunk
    objects are fetched from it."""
    with RangeServer(DATA) as repos:
        for kind in ("mixed", "native"):
            repos.reset_stats()
            m = mount(f"{repos.url}/{kind}/", "--view", "raw", *pointing(served["prefix"], kind))
            check_raw(m.path, kind, NAMES)
            paths = [path for _, path, _ in repos.stats["log"]]
            assert f"/{kind}/repo" in paths and any(p.startswith(f"/{kind}/chunks/") for p in paths)
        m = mount(f"{repos.url}/virtual", "--tag", "v1", *pointing(served["prefix"], "virtual"))
        check_decoded(m.path, "virtual", NAMES[:1])


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server, in this process, so that a test can give an object the modification time it
    had before the repository was committed."""
    pytest.importorskip("moto")
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"key": "testing", "secret": "testing", "endpoint_url": f"http://{host}:{port}"}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("ic2-bucket")
    for kind in KINDS:
        fs.put(str(DATA / kind), f"ic2-bucket/repos/{kind}", recursive=True)
    for name in NAMES:
        fs.put(str(DATA / "sources" / name), f"ic2-bucket/sources/{name}")
    backdate_s3("ic2-bucket", [f"sources/{name}" for name in NAMES])
    try:
        yield {"fs": fs, "options": options}
    finally:
        server.stop()


def backdate_s3(bucket: str, keys) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    when = datetime.datetime.fromtimestamp(FACTS["sources_mtime_ns"] / 1e9, datetime.timezone.utc).replace(tzinfo=None)
    for key in keys:
        s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[bucket].keys[key].last_modified = when


@pytest.mark.parametrize("kind", KINDS)
def test_over_s3(mount, s3, kind):
    """Repository and sources in S3 (moto): the container re-pointed at s3://, read with the mount's
    --remote-options."""
    args = ["--remote-options", json.dumps(s3["options"]), *pointing("s3://ic2-bucket/sources/", kind)]
    raw = mount(f"s3://ic2-bucket/repos/{kind}", "--view", "raw", *args)
    check_raw(raw.path, kind, NAMES)
    decoded = mount(f"s3://ic2-bucket/repos/{kind}", "--tag", "v1", *args)
    check_decoded(decoded.path, kind, NAMES[:1])


# -- checksums: a changed object reads as EIO, never as its new bytes --------------------------------

def rewrite_source(path: Path) -> None:
    """Same size, other bytes, modified now."""
    data = bytearray(path.read_bytes())
    data[-4096:] = bytes(4096)
    path.write_bytes(bytes(data))


def chunk_of(mnt, source: str) -> Path:
    """A chunk file of `air` that comes from `source` (part0: time chunks 0-1, part1: 2-3)."""
    return mnt / "air" / "c" / ("2" if source == "part1.nc" else "0") / "0" / "0"


@pytest.mark.parametrize("branch", ["main", "etag"])
def test_changed_source_is_eio(mount, tmp_path, branch):
    """main records last-modified checksums (as VirtualiZarr writes them), branch etag ETags: after
    part1.nc changes, its chunks read as EIO with a log line; part0's still read."""
    root = copy_sources(tmp_path / "sources")
    with RangeServer(root) as server:
        args = ["--view", "raw", "--branch", branch, *pointing(server.url + "/", "virtual")]
        before = mount(DATA / "virtual", *args)
        good = chunk_of(before, "part1.nc").read_bytes()
        if branch == "main":
            rewrite_source(root / "part1.nc")
        else:  # the same bytes, another ETag: Icechunk refuses it too
            os.utime(root / "part1.nc", ns=(FACTS["sources_mtime_ns"] + 1000, FACTS["sources_mtime_ns"] + 1000))
        m = mount(DATA / "virtual", *args)
        assert len(chunk_of(m, "part0.nc").read_bytes()) > 0
        with pytest.raises(OSError) as e:
            chunk_of(m, "part1.nc").read_bytes()
        assert e.value.errno == 5
        assert "changed after the Icechunk commit" in m.log() and "part1.nc" in m.log()
        assert chunk_of(before, "part1.nc").read_bytes() == good  # (read before: cached, the committed bytes)


def test_changed_source_in_s3_is_eio(mount, s3):
    """An S3 object rewritten after the commit (its Last-Modified now later than the checksum)."""
    s3["fs"].put(str(DATA / "sources" / "part1.nc"), "ic2-bucket/changed/part1.nc")
    s3["fs"].put(str(DATA / "sources" / "part0.nc"), "ic2-bucket/changed/part0.nc")
    backdate_s3("ic2-bucket", ["changed/part0.nc"])
    m = mount("s3://ic2-bucket/repos/virtual", "--view", "raw", "--remote-options", json.dumps(s3["options"]),
              *pointing("s3://ic2-bucket/changed/", "virtual"))
    assert len(chunk_of(m, "part0.nc").read_bytes()) > 0
    with pytest.raises(OSError) as e:
        chunk_of(m, "part1.nc").read_bytes()
    assert e.value.errno == 5 and "changed after the Icechunk commit" in m.log()


# -- refusals: one line, the culprit named, no traceback ----------------------------------------------

def refused(*args) -> str:
    out = run_refmount("mount", "--dry-run", *map(str, args), "/nonexistent-mountpoint")
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_containers_must_be_authorised(served):
    line = refused(DATA / "virtual", "--container", f"{CONTAINER}={served['prefix']}")
    assert served["prefix"] in line and "--authorize-container" in line and "not authorised" in line
    line = refused(DATA / "mixed", "--container", f"{CONTAINER}={served['prefix']}",
                   "--authorize-container", "http://elsewhere.invalid/")
    assert served["prefix"] in line
    line = refused(DATA / "virtual", "--authorize-container", FACTS["placeholder_prefix"], "--container",
                   f"nope={served['prefix']}")
    assert "no virtual chunk container named 'nope'" in line and "'sources'" in line
    ok = run_refmount("mount", "--dry-run", DATA / "native", "/nonexistent-mountpoint")
    assert ok.returncode == 0, ok.stderr  # native chunks need no authorisation


def test_a_remote_repository_reaches_no_local_file_even_through_an_authorised_container(served, tmp_path):
    """A repository fetched over HTTP is a remote document: its virtual chunks may not be local files,
    even when its container points there and is authorised (fetch/trust.py; issue 38). Mounted from
    a local path, the same container is yours to point at local files."""
    local = copy_sources(tmp_path / "local")
    prefix = local.as_uri() + "/"
    with RangeServer(DATA) as repos:
        line = refused(f"{repos.url}/virtual", "--container", f"{CONTAINER}={prefix}", "--authorize-container", prefix)
    assert "can reach local files" in line and str(local) in line, line
    ok = run_refmount("mount", "--dry-run", DATA / "virtual", "--container", f"{CONTAINER}={prefix}",
                      "--authorize-container", prefix, "/nonexistent-mountpoint")
    assert ok.returncode == 0, ok.stderr


def test_versions_refused(tmp_path):
    assert "tag 'old'" in refused(DATA / "virtual", "--tag", "old") and "deleted" in refused(DATA / "virtual", "--tag", "old")
    line = refused(DATA / "native", "--branch", "nope")
    assert "branch 'nope'" in line and "dev" in line and "main" in line
    assert "snapshot 'AAAAAAAAAAAAAAAAAAAA'" in refused(DATA / "native", "--snapshot", "AAAAAAAAAAAAAAAAAAAA")


def newer_format(tmp_path: Path, relpath: str) -> Path:
    """A copy of the native repository with one file's spec version byte set to 3."""
    repo = tmp_path / "newer"
    shutil.copytree(DATA / "native", repo)
    target = repo / relpath
    data = bytearray(target.read_bytes())
    data[36] = 3
    target.write_bytes(bytes(data))
    return repo


def test_newer_format_refused(tmp_path):
    """An unknown spec version: one line naming the version found, its writer and the versions read."""
    line = refused(newer_format(tmp_path / "a", "repo"))
    assert "format spec 3" in line and "ic-2.3.0" in line and "format specs 1 and 2" in line
    assert ".zmetadata" not in line
    main = json.loads((DATA / "fixture.json").read_text())["snapshots"]["native"]["S2"]
    line = refused(newer_format(tmp_path / "b", f"snapshots/{main}"))
    assert "format spec 3" in line and main in line


def test_inspect_and_dry_run(served):
    out = run_refmount("inspect", DATA / "virtual", "--tag", "v1", "--container", f"{CONTAINER}={served['prefix']}")
    assert out.returncode == 0, out.stderr
    assert "air:" in out.stdout and "zlib" in out.stdout
    dry = run_refmount("mount", "--dry-run", DATA / "mixed", *pointing(served["prefix"], "mixed"),
                       "/nonexistent-mountpoint")
    assert dry.returncode == 0 and "keys:" in dry.stdout, dry.stderr


# -- the configuration (FlexBuffers) and container rules, without a mount -----------------------------

def test_repo_file_and_configuration():
    from refmount.refs.icechunk_files import RepoFiles
    from refmount.refs.icechunk_repo import read_repo_info

    info = read_repo_info(RepoFiles(str(DATA / "virtual")))
    assert (info.spec, info.writer) == (2, "ic-2.3.0")
    snapshots = FACTS["snapshots"]["virtual"]
    assert info.branches == {"main": snapshots["S2"], "dev": snapshots["S3"], "etag": snapshots["S4"]}
    assert info.tags == {"v1": snapshots["S1"]} and info.deleted_tags == {"old"}
    assert set(snapshots.values()) < info.snapshots
    containers = info.config["virtual_chunk_containers"]
    assert containers == {FACTS["placeholder_prefix"]: {"name": CONTAINER, "url_prefix": FACTS["placeholder_prefix"],
                                                        "store": {"http": {}}}}
    assert info.config["manifest"]["virtual_chunk_location_compression"]["min_num_chunks"] == 1


def test_container_rules():
    from refmount.errors import RefmountError, RefsError
    from refmount.refs.icechunk_containers import Container, Containers, check_authorized

    config = {"virtual_chunk_containers": {
        "s3://bucket/": {"name": None, "url_prefix": "s3://bucket/", "store": {"s3": {"endpoint_url": None}}},
        "s3://bucket/deep/": {"name": "deep", "url_prefix": "s3://bucket/deep", "store": {"s3_compatible": {
            "endpoint_url": "http://127.0.0.1:9000"}}},
        "file:///data/": {"name": "local", "url_prefix": "file:///data/", "store": {"local_file_system": "/data"}},
        "http://wrong/": {"name": None, "url_prefix": "http://wrong/", "store": {"s3": {}}},  # scheme misfits store
        "file:///a/../b/": {"name": None, "url_prefix": "file:///a/../b/", "store": {"local_file_system": "/"}},
    }}
    c = Containers(config, "repo")
    assert [x.prefix for x in c.containers] == ["s3://bucket/deep/", "file:///data/", "s3://bucket/"]
    assert c.resolve("vcc://deep/x%20y.nc", "a") == "s3://bucket/deep/x y.nc"
    assert c.resolve("s3://bucket/deep/z.nc", "a") == "s3://bucket/deep/z.nc"
    assert c.resolve("file:///data/sub/../f%23.nc", "a") == "/data/f#.nc"
    with pytest.raises(RefsError, match="not under any virtual chunk container"):
        c.resolve("file:///data/../etc/passwd", "a")
    with pytest.raises(RefsError, match="names no virtual chunk container"):
        c.resolve("vcc://nope/x.nc", "a")
    with pytest.raises(RefsError, match="'..'"):
        c.resolve("s3://bucket/deep/../x.nc", "a")
    with pytest.raises(RefsError, match="not under any"):
        c.resolve("http://wrong/x.nc", "a")
    assert set(c.used) == {"s3://bucket/deep/", "file:///data/"}
    with pytest.raises(RefmountError, match="not authorised.*--authorize-container file:///data/"):
        check_authorized(c.used, {"s3://bucket/deep/"}, {}, "repo")
    with pytest.raises(RefmountError, match="endpoint http://127.0.0.1:9000"):
        check_authorized(c.used, {"s3://bucket/deep/", "file:///data/"}, {}, "repo")
    check_authorized(c.used, {"s3://bucket/deep/", "file:///data/"}, {"endpoint_url": "http://127.0.0.1:9000/"}, "r")
    tigris = {"tigris://b/": Container("tigris://b/", None, "tigris")}
    with pytest.raises(RefmountError, match="t3.storage.dev"):
        check_authorized(tigris, {"tigris://b/"}, {}, "repo")
    moved = Containers(config, "repo", {"deep": "http://mirror/deep"})
    assert moved.resolve("vcc://deep/z.nc", "a") == "http://mirror/deep/z.nc"
    assert moved.used["http://mirror/deep/"].store == ""  # re-pointed: refmount's own http backend


def test_flexbuffers_reader():
    """Buffers written by the reference encoder (flatbuffers 25.12's flexbuffers.Dumps)."""
    from refmount.refs.flexbuf import FlexError, loads

    assert loads(bytes.fromhex("610062000178000201046814020d0c020102070b0428042401")) == {"a": 7, "b": [True, "x"]}
    assert loads(bytes.fromhex(
        "6e616d65006e006600626967006e657374656400733300656e64706f696e745f75726c000d687474703a2f2f683a3930"
        "303000616e6f6e796d6f757300020b28020102001f6814013401010109246c6973740003010203040404656d70747900"
        "00000100075c0c601a646a5e000000000b000000000000000100000000000000070000000000000000000000000100002c"
        "00000000000000000000000000f83f4c0000000000000090eefeffffffffff00000000000000006c0000000000000007240f"
        "280703243f2701")) == {"name": None, "n": -70000, "f": 1.5, "big": 2**40, "list": [1, 2, 3], "empty": {},
                              "nested": {"s3": {"endpoint_url": "http://h:9000", "anonymous": False}}}
    with pytest.raises(FlexError):
        loads(bytes([200, 9 << 2, 1]))


# -- written here and now, where this Python has icechunk >= 2 ----------------------------------------

def icechunk2():
    icechunk = pytest.importorskip("icechunk")
    if int(icechunk.__version__.split(".")[0]) < 2:
        pytest.skip(f"icechunk {icechunk.__version__} writes format spec 1 (icechunk >= 2 needs Python >= 3.12)")
    return icechunk


def needs_virtualizarr() -> None:
    """VirtualiZarr, found but not imported here: its h5py and hdf5plugin, imported into a process
    whose netCDF4 has already opened files, break netCDF4's next open ("NetCDF: HDF error", measured
    with the netCDF4 1.7.5 and h5py 3.16 wheels, whose libhdf5 differ); it runs in a child process."""
    import importlib.util

    if importlib.util.find_spec("virtualizarr") is None:
        pytest.skip("virtualizarr is not installed")


WRITE_ABSOLUTE = """
import sys, warnings
warnings.filterwarnings("ignore")
import icechunk as ic, numpy as np, xarray as xr, zarr
from obspec_utils.registry import ObjectStoreRegistry
from obstore.store import HTTPStore
from virtualizarr import open_virtual_dataset
from virtualizarr.parsers import HDFParser

repo_path, base, names = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
prefix = base + "/"
registry = ObjectStoreRegistry({base: HTTPStore.from_url(base, client_options={"allow_http": True})})
parts = [open_virtual_dataset(f"{base}/{n}", registry=registry, parser=HDFParser(), loadable_variables=[])
         for n in names]
vds = xr.concat(parts, dim="time", coords="minimal", compat="override", combine_attrs="override")
config = ic.RepositoryConfig.default()
config.set_virtual_chunk_container(ic.VirtualChunkContainer(prefix, ic.http_store()))
repo = ic.Repository.create(ic.local_filesystem_storage(repo_path), config,
                            authorize_virtual_chunk_access={prefix: ic.credentials.HttpAccess})
session = repo.writable_session("main")
vds.vz.to_icechunk(session.store)
print(session.commit("virtual"))
session = repo.writable_session("main")
elevation = (np.arange(48, dtype="i4").reshape(6, 8) * 10 - 100).astype("i4")
zarr.open_group(session.store, mode="r+").create_array("elevation", data=elevation, chunks=(3, 4),
                                                        dimension_names=["lat", "lon"])
session.commit("native on top")
"""


def test_written_now_with_absolute_urls(mount, served, tmp_path):
    """VirtualiZarr's default output: an unnamed container and absolute urls (with the port), and a
    native commit on top; read back by refmount, and compared with icechunk's own reading. (Written
    in a child process: VirtualiZarr's h5py and netCDF4 each bring their own libhdf5.)"""
    ic = icechunk2()
    needs_virtualizarr()
    import subprocess
    import sys

    import zarr

    server, prefix = served["server"], served["prefix"]
    env = {**os.environ, "RUST_LOG": "error"}
    written = subprocess.run([sys.executable, "-c", WRITE_ABSOLUTE, str(tmp_path / "repo"), server.url, ",".join(NAMES)],
                             capture_output=True, text=True, env=env, timeout=300)
    assert written.returncode == 0, written.stderr[-3000:]
    first = written.stdout.split()[-1]
    from refmount.refs import load_refs

    assert sorted(load_refs(str(tmp_path / "repo")).urls) == [server.url_for(n) for n in NAMES]  # port kept (2.1)
    raw = mount(tmp_path / "repo", "--view", "raw", "--authorize-container", prefix)
    expected = {name: values for name, (values, _) in oracles(NAMES)["stored"].items()} | {"elevation": elevation()}
    zarr_clients.assert_raw_clients(raw.path, expected, oracles(NAMES)["decoded"], VARIABLES)
    storage = ic.local_filesystem_storage(str(tmp_path / "repo"))
    theirs = zarr.open_group(ic.Repository.open(storage, authorize_virtual_chunk_access={
        prefix: ic.credentials.HttpAccess}).readonly_session("main").store, mode="r")
    ours = zarr.open_group(str(raw.path), mode="r")
    for name in expected:
        assert np.array_equal(ours[name][...], theirs[name][...]), name
    old = mount(tmp_path / "repo", "--snapshot", first, "--authorize-container", prefix)
    check_decoded(old.path, "virtual", NAMES)


def test_written_now_s3_container_on_its_endpoint(mount, s3, tmp_path):
    """A container of store type s3_compatible names its own endpoint: refmount refuses to send the
    user's S3 requests elsewhere until --remote-options names that endpoint."""
    ic = icechunk2()
    import zarr

    endpoint = s3["options"]["endpoint_url"]
    prefix = "s3://ic2-bucket/sources/"
    config = ic.RepositoryConfig.default()
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(
        prefix, ic.s3_store(endpoint_url=endpoint, allow_http=True, region="us-east-1", force_path_style=True)))
    repo = ic.Repository.create(ic.local_filesystem_storage(str(tmp_path / "repo")), config)
    session = repo.writable_session("main")
    group = zarr.create_group(session.store, zarr_format=3)
    raw = (DATA / "sources" / NAMES[0]).read_bytes()
    group.create_array("blob", shape=(len(raw),), chunks=(len(raw),), dtype="u1", compressors=None,
                       dimension_names=["byte"])
    # (moto's object was modified just now: the reference records it as current until 2100)
    session.store.set_virtual_ref("blob/c/0", prefix + NAMES[0], offset=0, length=len(raw),
                                  checksum=datetime.datetime(2100, 1, 1, tzinfo=datetime.timezone.utc))
    session.commit("one virtual chunk on S3")
    line = refused(tmp_path / "repo", "--authorize-container", prefix)
    assert endpoint in line and "--remote-options" in line
    m = mount(tmp_path / "repo", "--view", "raw", "--authorize-container", prefix,
              "--remote-options", json.dumps(s3["options"]))
    assert (m / "blob" / "c" / "0").read_bytes() == raw


def test_option_forms_and_local_etag(tmp_path):
    """--container takes NAME=PREFIX lists and the JSON object the Python API and config files pass;
    a local file's ETag is the one Icechunk's local store (object_store) gives it."""
    import trio

    from refmount.cache.checksums import current_validators
    from refmount.refs.icechunk_containers import parse_authorized, parse_repoint

    assert parse_repoint(["a=http://x/,b=s3://y/z", '{"c": "file:///d/"}']) == {
        "a": "http://x/", "b": "s3://y/z", "c": "file:///d/"}
    assert parse_authorized(["http://x", "s3://y/,file:///d/"]) == {"http://x/", "s3://y/", "file:///d/"}
    path = tmp_path / "object.bin"
    path.write_bytes(b"0123456789")
    etag, _ = trio.run(current_validators, None, str(path))
    obstore = pytest.importorskip("obstore")
    from obstore.store import LocalStore

    assert obstore.head(LocalStore(str(tmp_path)), "object.bin")["e_tag"].strip('"') == etag
