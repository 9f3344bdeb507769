"""Icechunk repositories and Zarr v3 reference sets, end to end.

Sources: three netCDF-4 files made here (one time step range each; zlib+shuffle, packed int16 with a
fill, a big-endian int32), served over loopback HTTP. From them:
- a *virtual* Icechunk repository: VirtualiZarr's HDF parser over HTTP, concatenated along time,
  written with `to_icechunk` (virtual chunk container = the loopback server);
- a *native* Icechunk repository: the same data, decoded by xarray and written with `to_zarr`
  (native chunk objects and inline chunks);
- a Zarr v3 kerchunk-style reference set built from VirtualiZarr's in-memory manifests.
Each is mounted: the decoded view is read by Debian's ncdump, netCDF4-python and xarray and compared
with the source files; the raw view by zarr-python 3 and xarray, compared with zarr reading the
repository itself through icechunk.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import warnings

import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.support import zarr_clients
from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump
from tests.support.rangeserver import RangeServer
from tests.support.zarr_clients import concatenated_oracle, source_dataset

icechunk = pytest.importorskip("icechunk")
pytest.importorskip("virtualizarr")

N_FILES, STEPS, NLAT, NLON = 3, 4, 6, 8
VARIABLES = ("time", "lat", "lon", "air", "prcp", "count")


def make_file(path, k: int, air_offset: float = 0.0) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "refmount icechunk test"
        ds.createDimension("time", None)
        ds.createDimension("lat", NLAT)
        ds.createDimension("lon", NLON)
        t = ds.createVariable("time", "f8", ("time",), chunksizes=(STEPS,))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(STEPS) + STEPS * k
        ds.createVariable("lat", "f4", ("lat",))[:] = np.linspace(-50, 50, NLAT)
        ds.createVariable("lon", "f4", ("lon",))[:] = np.linspace(0, 350, NLON)
        air = ds.createVariable("air", "f4", ("time", "lat", "lon"), zlib=True, shuffle=True,
                                chunksizes=(2, 3, NLON), fill_value=-999.0)
        air.units = "K"
        air.long_name = "air temperature"
        air[:] = np.arange(STEPS * NLAT * NLON, dtype="f4").reshape(STEPS, NLAT, NLON) / 4 + 200 + 100 * k + air_offset
        air[0, 0, 0] = np.ma.masked
        prcp = ds.createVariable("prcp", "i2", ("time", "lat", "lon"), chunksizes=(STEPS, NLAT, NLON), fill_value=-1)
        prcp.scale_factor = 0.1
        prcp[:] = (np.arange(STEPS * NLAT * NLON).reshape(STEPS, NLAT, NLON) * 7 + k) % 300
        prcp[1, 2, 3] = np.ma.masked
        count = ds.createVariable("count", ">i4", ("time", "lat"), endian="big", chunksizes=(2, NLAT))
        count[:] = np.arange(STEPS * NLAT).reshape(STEPS, NLAT) * 1000 + k


def virtual_dataset(server, names):
    import xarray as xr
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import HTTPStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    registry = ObjectStoreRegistry({server.url: HTTPStore.from_url(server.url, client_options={"allow_http": True})})
    parts = [open_virtual_dataset(server.url_for(n), registry=registry, parser=HDFParser(), loadable_variables=[])
             for n in names]
    return xr.concat(parts, dim="time", coords="minimal", compat="override", combine_attrs="override")


def no_credentials():
    """What authorises an http container that needs no credentials: icechunk 2's sentinel (None is
    deprecated there), None in icechunk 1."""
    return getattr(getattr(icechunk, "credentials", None), "HttpAccess", None)


def virtual_repo(path, server, names, last_updated_at=None):
    """An Icechunk repository of virtual references to `names` on `server`; returns the repository."""
    config = icechunk.RepositoryConfig.default()
    prefix = server.url + "/"
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, icechunk.http_store()))
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(path)), config,
                                      authorize_virtual_chunk_access={prefix: no_credentials()})
    session = repo.writable_session("main")
    virtual_dataset(server, names).vz.to_icechunk(session.store, last_updated_at=last_updated_at)
    session.commit("virtual references")
    return repo


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    root = tmp_path_factory.mktemp("icechunk")
    data = root / "data"
    data.mkdir()
    names = [f"part{k}.nc" for k in range(N_FILES)]
    for k, name in enumerate(names):
        make_file(data / name, k)
    paths = [data / n for n in names]
    with RangeServer(data) as server:
        virtual = root / "virtual.icechunk"
        virtual_repo(virtual, server, names)
        native = root / "native.icechunk"
        repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(native)))
        session = repo.writable_session("main")
        source_dataset(paths).to_zarr(session.store, zarr_format=3, consolidated=False)
        session.commit("native copy")
        yield {"root": root, "server": server, "names": names, "paths": paths, "virtual": virtual,
               "native": native, "oracle": concatenated_oracle(paths), "decoded": source_dataset(paths)}


def repo_values(path) -> dict:
    """Every array as zarr reads it from the repository through icechunk itself (the raw oracle of a
    native repository; icechunk 1.x cannot read our virtual one: it drops the port of virtual urls)."""
    import zarr

    session = icechunk.Repository.open(icechunk.local_filesystem_storage(str(path))).readonly_session("main")
    group = zarr.open_group(session.store, mode="r")
    return {name: group[name][...] for name in group.array_keys()}


def raw_oracle(sources, kind) -> dict:
    if kind == "native":
        return repo_values(sources["native"])
    return {name: values for name, (values, _) in sources["oracle"].items()}  # the source files' stored values


def authorized(sources, kind) -> list[str]:
    """A virtual repository's chunks are read only from containers the user authorises (as Icechunk)."""
    return ["--authorize-container", sources["server"].url + "/"] if kind == "virtual" else []


def assert_decoded_clients(mnt, sources) -> None:
    zarr_clients.assert_decoded_clients(mnt, sources["oracle"], sources["decoded"], VARIABLES)


def assert_raw_clients(mnt, expected: dict, sources) -> None:
    zarr_clients.assert_raw_clients(mnt, expected, sources["decoded"], VARIABLES)


@pytest.mark.parametrize("kind", ["virtual", "native"])
def test_icechunk_decoded_view(mount, sources, kind):
    m = mount(sources[kind], *authorized(sources, kind))
    assert os.path.exists(m / ".zgroup") and os.path.exists(m / "air" / ".zarray")
    assert "zarr.json" not in os.listdir(m.path)  # (the source's is in the raw view; the decoded view's own, of its
    # zarr form, is found by name only by some readers: tests/test_two_libraries.py)
    zarray = json.loads((m / "count" / ".zarray").read_text())
    assert zarray["dtype"] == "<i4"  # big-endian in the source: served little-endian
    assert json.loads((m / "air" / ".zattrs").read_text())["_ARRAY_DIMENSIONS"] == ["time", "lat", "lon"]
    assert_decoded_clients(m.path, sources)
    assert "snapshot" in m.log()


@pytest.mark.parametrize("kind", ["virtual", "native"])
def test_icechunk_raw_view(mount, sources, kind):
    m = mount(sources[kind], "--view", "raw", *authorized(sources, kind))
    assert json.loads((m / "air" / "zarr.json").read_text())["zarr_format"] == 3
    assert_raw_clients(m.path, raw_oracle(sources, kind), sources)


def test_kinds_of_chunks(sources):
    """Virtual chunks point at the server (port restored), native ones into the repository's chunks/,
    small ones are inline."""
    from refmount.refs import load_refs

    virtual = load_refs(str(sources["virtual"]))
    assert set(virtual.urls) == {sources["server"].url_for(n) for n in sources["names"]}
    ref = virtual.ref(virtual.find("air/c/0/0/0"))
    assert ref.url == sources["server"].url_for("part0.nc") and ref.length > 0
    native = load_refs(str(sources["native"]))
    assert all(u.startswith(str(sources["native"]) + "/chunks/") for u in native.urls)
    assert any(native.ref(native.find(f"{n}/c/0")).is_inline for n in ("lat", "lon", "time"))


def test_repository_over_http(mount, sources):
    """A repository served over HTTP: its snapshot, manifests and native chunk objects are fetched."""
    with RangeServer(sources["native"]) as server:
        m = mount(server.url + "/", "--view", "raw")
        assert_raw_clients(m.path, raw_oracle(sources, "native"), sources)
        paths = [path for _, path, _ in server.stats["log"]]
        assert any(p.startswith("/snapshots/") for p in paths) and any(p.startswith("/chunks/") for p in paths)


def test_snapshot_is_frozen_and_versions(mount, sources, tmp_path):
    """A commit after mounting does not change the mount; --snapshot and --tag pick versions; a new
    mount moves forward."""
    import zarr

    repo_path = tmp_path / "copy.icechunk"
    shutil.copytree(sources["native"], repo_path)
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(repo_path)))
    first = repo.lookup_branch("main")
    repo.create_tag("v1", first)
    before = mount(repo_path)
    before_raw = mount(repo_path, "--view", "raw")
    session = repo.writable_session("main")
    group = zarr.open_group(session.store, mode="r+")
    group["air"][...] = np.full(group["air"].shape, 7.5, "f4")
    second = session.commit("overwrite air")
    assert second != first

    original = sources["oracle"]["air"][0]
    import netCDF4

    with netCDF4.Dataset(nczarr_url(before.path)) as ds:
        ds.set_auto_maskandscale(False)
        assert np.array_equal(ds["air"][...], original)
    assert np.array_equal(zarr.open_group(str(before_raw.path), mode="r")["air"][...], original)
    after = mount(repo_path, "--view", "raw")
    assert (zarr.open_group(str(after.path), mode="r")["air"][...] == 7.5).all()
    for args in (["--snapshot", first], ["--tag", "v1"]):
        old = mount(repo_path, "--view", "raw", *args)
        assert np.array_equal(zarr.open_group(str(old.path), mode="r")["air"][...], original), args
    (tmp_path / "unused").mkdir()
    bad = run_refmount("mount", "--foreground", "--branch", "nope", repo_path, tmp_path / "unused")
    assert bad.returncode != 0 and "branch 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    dry = run_refmount("mount", "--dry-run", "--tag", "v1", repo_path, tmp_path / "unused")
    assert dry.returncode == 0, dry.stderr


def test_changed_virtual_object_is_eio(mount, tmp_path):
    """An object rewritten after the commit (Last-Modified later than the recorded checksum) reads as
    EIO with a log line; the other file's chunks still read."""
    data = tmp_path / "data"
    data.mkdir()
    names = ["a.nc", "b.nc"]
    for k, name in enumerate(names):
        make_file(data / name, k)
    with RangeServer(data) as server:
        committed = datetime.datetime.now(datetime.timezone.utc)
        for name in names:
            os.utime(data / name, (committed.timestamp() - 60, committed.timestamp() - 60))
        virtual_repo(tmp_path / "repo", server, names, last_updated_at=committed)
        make_file(data / "b.nc", 1, air_offset=1.0)  # same layout, other values
        os.utime(data / "b.nc", (committed.timestamp() + 5, committed.timestamp() + 5))
        m = mount(tmp_path / "repo", "--view", "raw", "--authorize-container", server.url + "/")
        first = (m / "air" / "c" / "0" / "0" / "0").read_bytes()
        assert len(first) > 0
        with pytest.raises(OSError) as e:
            (m / "air" / "c" / "2" / "0" / "0").read_bytes()
        assert e.value.errno == 5
        assert "changed after the Icechunk commit" in m.log()


def test_v3_reference_set(mount, sources, tmp_path):
    """A kerchunk-style JSON whose metadata is Zarr v3, from VirtualiZarr's in-memory manifests."""
    refs = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}})}
    combined = virtual_dataset(sources["server"], sources["names"])
    for name, var in combined.variables.items():
        marr = var.data
        meta = marr.metadata.to_dict()
        meta["attributes"] = {k: v for k, v in var.attrs.items()}
        meta["dimension_names"] = list(var.dims)
        refs[f"{name}/zarr.json"] = json.dumps(meta, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
        for index, entry in marr.manifest.dict().items():
            refs[f"{name}/c/" + index.replace(".", "/")] = [entry["path"], entry["offset"], entry["length"]]
    path = tmp_path / "v3.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    raw = mount(path, "--view", "raw")
    assert_raw_clients(raw.path, raw_oracle(sources, "virtual"), sources)
    decoded = mount(path)
    assert_decoded_clients(decoded.path, sources)


def test_inspect_icechunk(sources):
    out = run_refmount("inspect", sources["virtual"])
    assert out.returncode == 0, out.stderr
    assert "air:" in out.stdout and "zlib" in out.stdout
    bad = run_refmount("inspect", "--tag", "missing", sources["native"])
    assert bad.returncode == 1 and "tag 'missing'" in bad.stderr


def test_sharded_native_array(mount, tmp_path):
    """zarr-python writes a sharded array into an Icechunk repository natively (each shard one chunk
    object); the decoded view serves its inner chunks, read by ncdump, netCDF4-python and zarr."""
    import netCDF4
    import zarr
    from zarr.codecs import ZstdCodec

    from refmount.refs import load_refs

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.writable_session("main")
    group = zarr.create_group(session.store, zarr_format=3)
    values = np.arange(9 * 14, dtype="f4").reshape(9, 14)
    values[:2, :3] = 4.5  # an empty inner chunk
    values[4:8, 6:12] = 4.5  # a shard never written
    array = group.create_array("grid", shape=values.shape, dtype="f4", chunks=(2, 3), shards=(4, 6),
                               compressors=[ZstdCodec()], fill_value=4.5, dimension_names=["gy", "gx"])
    array[...] = values
    rng = np.random.default_rng(3)
    big = rng.normal(size=(41, 62)).astype("f8")  # shards big enough to be chunk objects, not inline
    group.create_array("big", shape=big.shape, dtype="f8", chunks=(5, 6), shards=(20, 30),
                       dimension_names=["by", "bx"])[...] = big
    session.commit("sharded")
    refs = load_refs(str(tmp_path / "repo"))
    assert refs.ref(refs.find("grid/c/0/0")).is_inline and not refs.ref(refs.find("big/c/0/0")).is_inline
    m = mount(tmp_path / "repo")
    zarray = json.loads((m / "grid" / ".zarray").read_text())
    assert zarray["chunks"] == [2, 3]
    assert zarray["fill_value"] == 4.5  # (declared as a v2 store's: the shard never written is not listed)
    assert len([n for n in os.listdir(m / "grid") if not n.startswith(".")]) == 5 * 5 - 4
    assert os.stat(m / "grid" / "4.4").st_size == 2 * 3 * 4
    assert np.array_equal(zarr.open_array(str(m / "grid"), mode="r", zarr_format=2)[...], values)
    dumped = parse_ncdump(ncdump(nczarr_url(m.path)))
    compare_dumped(dumped["grid"], values, [4.5], "ncdump grid")
    compare_dumped(dumped["big"], big, [], "ncdump big")
    assert np.array_equal(zarr.open_array(str(m / "big"), mode="r", zarr_format=2)[...], big)
    with netCDF4.Dataset(nczarr_url(m.path)) as ds:
        ds.set_auto_maskandscale(False)
        assert np.array_equal(ds["grid"][...], values) and np.array_equal(ds["big"][...], big)
    raw = mount(tmp_path / "repo", "--view", "raw")
    assert np.array_equal(zarr.open_group(str(raw.path), mode="r")["grid"][...], values)
