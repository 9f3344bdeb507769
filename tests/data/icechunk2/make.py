"""Make the committed Icechunk format-2 fixtures of tests/test_icechunk2.py (run it again only to
regenerate them; the tests never run it).

    $(pyenv root)/versions/3.12.1/bin/python3 -m venv /tmp/venv312
    /tmp/venv312/bin/pip install icechunk==2.3.0 'virtualizarr[hdf]==2.8.0' zarr==3.4.2 xarray h5py netCDF4 \
        obstore aiohttp
    /tmp/venv312/bin/python tests/data/icechunk2/make.py

Writes, beside this file:
- `sources/part0.nc`, `sources/part1.nc`: two netCDF-4 files (time steps 0-3 and 4-7 of `air`, zlib and
  shuffle with a fill value; `prcp`, packed int16 with a fill; `count`, big-endian int32);
- three repositories written by icechunk 2.3.0, each with the same history:
  snapshot S1 (part0) tagged `v1`; main = S2 (part1 appended along time); branch `dev` = S3 (S1 plus
  a root attribute); a tag `old` made and deleted.
  - `virtual/`: VirtualiZarr 2.8 -> Icechunk. Its one virtual chunk container is *named* `sources`
    (url prefix http://sources.invalid/data/, which nothing serves) and every chunk url is relative,
    `vcc://sources/part0.nc`: a test re-points the container at its own server, as Icechunk users
    do (Icechunk's way to move data without rewriting manifests). `air` manifests are split along
    time (one chunk per manifest), and chunk locations are zstd-compressed with a dictionary (both
    Icechunk options, turned on here for small data). Chunk checksums: last-modified LAST_UPDATED
    (as VirtualiZarr writes them); branch `etag` = S4 (S2 with `air` re-referenced with ETag checksums,
    the ETags the tests' RangeServer gives the sources at mtime SOURCES_MTIME_NS).
  - `native/`: the decoded sources written with xarray `to_zarr` into Icechunk sessions (native chunk
    objects in chunks/, small chunks inline).
  - `mixed/`: virtual and native in one repository: VirtualiZarr with lat and lon loaded (native),
    the rest virtual (relative urls), plus an array `elevation` written by zarr; a low inline
    threshold so that chunk objects, inline chunks and virtual chunks all occur.
- `spec1/`: `native`'s history written by icechunk 2.3.0 in format spec 1 (refs/, config.yaml), and
  `migrated/`: the same after `icechunk.upgrade_icechunk_repository` (a spec-2 `repo` file over the
  spec-1 snapshots and manifests, as Icechunk's migration leaves them).
- `fixture.json`: what the tests need to know (snapshot ids, times, the container).

Sources are served from a loopback RangeServer while writing, and every repository is read back with
icechunk itself (its container re-pointed at that server) and compared with the sources.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # the worktree: tests.support

STEPS, NLAT, NLON = 4, 6, 8
NAMES = ["part0.nc", "part1.nc"]
CONTAINER = "sources"
PLACEHOLDER = "http://sources.invalid/data/"
LAST_UPDATED = datetime.datetime(2026, 6, 1, tzinfo=datetime.timezone.utc)
SOURCES_MTIME_NS = int((LAST_UPDATED.timestamp() - 86400) * 1e9)  # a day before the commit


def make_source(path: Path, k: int) -> None:
    import netCDF4

    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "refmount icechunk 2 fixture"
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
        air[:] = np.arange(STEPS * NLAT * NLON, dtype="f4").reshape(STEPS, NLAT, NLON) / 4 + 200 + 100 * k
        air[0, 0, 0] = np.ma.masked
        prcp = ds.createVariable("prcp", "i2", ("time", "lat", "lon"), chunksizes=(STEPS, NLAT, NLON), fill_value=-1)
        prcp.scale_factor = 0.1
        prcp[:] = (np.arange(STEPS * NLAT * NLON).reshape(STEPS, NLAT, NLON) * 7 + k) % 300
        prcp[1, 2, 3] = np.ma.masked
        count = ds.createVariable("count", ">i4", ("time", "lat"), endian="big", chunksizes=(2, NLAT))
        count[:] = np.arange(STEPS * NLAT).reshape(STEPS, NLAT) * 1000 + k


def elevation() -> np.ndarray:
    return (np.arange(NLAT * NLON, dtype="i4").reshape(NLAT, NLON) * 10 - 100).astype("i4")


def virtual_part(server, name: str, loadable=()):
    """VirtualiZarr's virtual dataset of one source, its chunk urls made relative to the container."""
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import HTTPStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    registry = ObjectStoreRegistry({server.url: HTTPStore.from_url(server.url, client_options={"allow_http": True})})
    vds = open_virtual_dataset(server.url_for(name), registry=registry, parser=HDFParser(),
                               loadable_variables=list(loadable))
    return vds.vz.rename_paths(lambda path: f"vcc://{CONTAINER}/{path.rsplit('/', 1)[1]}")


def repo_config(*, split_air: bool = False, inline_threshold: int | None = None):
    import icechunk as ic

    config = ic.RepositoryConfig.default()
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(PLACEHOLDER, ic.http_store(), name=CONTAINER))
    manifest = {}
    if split_air:
        manifest["splitting"] = ic.ManifestSplittingConfig.from_dict(
            {ic.ManifestSplitCondition.name_matches("air"): {ic.ManifestSplitDimCondition.DimensionName("time"): 1}})
        manifest["virtual_chunk_location_compression"] = ic.ManifestVirtualChunkLocationCompressionConfig(
            min_num_chunks=1)
    if manifest:
        config.manifest = ic.ManifestConfig(**manifest)
    if inline_threshold is not None:
        config.inline_chunk_threshold_bytes = inline_threshold
    return config


def history(repo, write_first, write_second) -> dict:
    """S1 (tag v1, and a tag `old` deleted), S2 on main, branch dev = S1 + a root attribute."""
    import zarr

    session = repo.writable_session("main")
    write_first(session.store)
    s1 = session.commit("part0")
    repo.create_tag("v1", s1)
    repo.create_tag("old", s1)
    repo.delete_tag("old")
    session = repo.writable_session("main")
    write_second(session.store)
    s2 = session.commit("append part1")
    repo.create_branch("dev", s1)
    session = repo.writable_session("dev")
    zarr.open_group(session.store, mode="r+").attrs["history"] = "dev branch"
    s3 = session.commit("dev: an attribute")
    return {"S1": s1, "S2": s2, "S3": s3}


def write_virtual(root: Path, server) -> dict:
    import icechunk as ic
    import zarr

    repo = ic.Repository.create(ic.local_filesystem_storage(str(root)), repo_config(split_air=True))
    parts = [virtual_part(server, n) for n in NAMES]
    ids = history(repo,
                  lambda store: parts[0].vz.to_icechunk(store, validate_containers=False, last_updated_at=LAST_UPDATED),
                  lambda store: parts[1].vz.to_icechunk(store, append_dim="time", validate_containers=False,
                                                        last_updated_at=LAST_UPDATED))
    # branch etag: air's chunks again, each with the ETag of its source as the tests' server gives it
    repo.create_branch("etag", ids["S2"])
    session = repo.writable_session("etag")
    manifest_offset = 0
    for name, part in zip(NAMES, parts):
        size = (HERE / "sources" / name).stat().st_size
        etag = f'"{size:x}-{SOURCES_MTIME_NS:x}"'
        manifest = part["air"].data.manifest
        specs = []
        for index, entry in manifest.dict().items():
            coords = [int(c) for c in index.split(".")]
            coords[0] += manifest_offset
            specs.append(ic.VirtualChunkSpec(index=coords, location=entry["path"], offset=entry["offset"],
                                             length=entry["length"], etag_checksum=etag))
        failed = session.store.set_virtual_refs("air", specs, validate_containers=False)
        assert failed is None, failed
        manifest_offset += manifest.shape_chunk_grid[0]
    zarr.open_group(session.store, mode="r+").attrs["checksums"] = "etag"
    ids["S4"] = session.commit("air with ETag checksums")
    return ids


def write_native(root: Path, spec: int = 2) -> dict:
    import icechunk as ic
    import xarray as xr

    repo = ic.Repository.create(ic.local_filesystem_storage(str(root)), repo_config(inline_threshold=48),
                                spec_version=spec)
    parts = [xr.open_dataset(HERE / "sources" / n).load() for n in NAMES]
    return history(repo,
                   lambda store: parts[0].to_zarr(store, zarr_format=3, consolidated=False),
                   lambda store: parts[1].to_zarr(store, zarr_format=3, consolidated=False, append_dim="time"))


def write_migrated(spec1: Path, root: Path) -> None:
    import icechunk as ic

    shutil.copytree(spec1, root)
    ic.upgrade_icechunk_repository(ic.Repository.open(ic.local_filesystem_storage(str(root))), dry_run=False)


def write_mixed(root: Path, server) -> dict:
    import icechunk as ic
    import zarr

    repo = ic.Repository.create(ic.local_filesystem_storage(str(root)), repo_config(inline_threshold=24))
    parts = [virtual_part(server, n, loadable=("lat", "lon")) for n in NAMES]

    def first(store):
        parts[0].vz.to_icechunk(store, validate_containers=False, last_updated_at=LAST_UPDATED)
        group = zarr.open_group(store, mode="r+")
        group.create_array("elevation", data=elevation(), chunks=(3, 4), dimension_names=["lat", "lon"],
                           attributes={"units": "m"})

    return history(repo, first,
                   lambda store: parts[1].vz.to_icechunk(store, append_dim="time", validate_containers=False,
                                                         last_updated_at=LAST_UPDATED))


def source_values(names) -> dict:
    """{variable: values as xarray decodes them} of the sources concatenated along time."""
    import xarray as xr

    parts = [xr.open_dataset(HERE / "sources" / n).load() for n in names]
    return xr.concat(parts, dim="time", data_vars="minimal")


def check(root: Path, server, version: dict, names, extra=None) -> None:
    """Read one version back with icechunk itself (the container re-pointed) and compare."""
    import icechunk as ic
    import xarray as xr

    config = ic.RepositoryConfig.default()
    config.set_virtual_chunk_container(ic.VirtualChunkContainer(server.url + "/", ic.http_store(), name=CONTAINER))
    repo = ic.Repository.open(ic.local_filesystem_storage(str(root)), config=config,
                              authorize_virtual_chunk_access={server.url + "/": ic.credentials.HttpAccess})
    session = repo.readonly_session(**version)
    got = xr.open_zarr(session.store, zarr_format=3, consolidated=False).load()
    want = source_values(names)
    for name in ("time", "lat", "lon", "air", "prcp", "count"):
        np.testing.assert_array_equal(got[name].values, want[name].values, err_msg=f"{root.name} {version} {name}")
    if extra:
        extra(got)


def main() -> int:
    warnings.filterwarnings("ignore")
    import icechunk
    import virtualizarr
    import zarr

    from tests.support.rangeserver import RangeServer

    versions = {"icechunk": icechunk.__version__, "virtualizarr": virtualizarr.__version__, "zarr": zarr.__version__}
    print("writing with", versions)
    sources = HERE / "sources"
    for name in ("sources", "virtual", "native", "mixed", "spec1", "migrated"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    sources.mkdir()
    for k, name in enumerate(NAMES):
        make_source(sources / name, k)
        os.utime(sources / name, ns=(SOURCES_MTIME_NS, SOURCES_MTIME_NS))
    with RangeServer(sources) as server:
        snapshots = {"virtual": write_virtual(HERE / "virtual", server), "native": write_native(HERE / "native"),
                     "mixed": write_mixed(HERE / "mixed", server), "spec1": write_native(HERE / "spec1", spec=1)}
        write_migrated(HERE / "spec1", HERE / "migrated")
        snapshots["migrated"] = snapshots["spec1"]
        for repo, ids in snapshots.items():
            check(HERE / repo, server, {"branch": "main"}, NAMES)
            check(HERE / repo, server, {"tag": "v1"}, NAMES[:1])
            check(HERE / repo, server, {"snapshot_id": ids["S1"]}, NAMES[:1])
            check(HERE / repo, server, {"branch": "dev"}, NAMES[:1],
                  lambda ds: ds.attrs["history"] == "dev branch" or sys.exit("no dev attribute"))
        check(HERE / "virtual", server, {"branch": "etag"}, NAMES)
        check(HERE / "mixed", server, {"branch": "main"}, NAMES,
              lambda ds: np.testing.assert_array_equal(ds["elevation"].values, elevation()))
    facts = {"written_by": versions, "container": CONTAINER, "placeholder_prefix": PLACEHOLDER,
             "last_updated": int(LAST_UPDATED.timestamp()), "sources_mtime_ns": SOURCES_MTIME_NS,
             "sources": NAMES, "snapshots": snapshots}
    (HERE / "fixture.json").write_text(json.dumps(facts, indent=2) + "\n")
    total = sum(f.stat().st_size for f in HERE.rglob("*") if f.is_file())
    print(f"fixtures written and read back by icechunk: {total / 1024:.0f} KiB in {HERE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
