"""Issue 41, catalogs as sources, against the servers archives run: a STAC static catalog written by
pystac (normalize_hrefs + save) and served by nginx, with netCDF, COG and kerchunk reference assets; a
STAC API (stac-fastapi with its static-catalog backend, uvicorn on a loopback port) searched by
datetime, bbox and limit and paged by its `next` links; a POST-paged search; hostile catalogs (a
private address from a public origin, next-link loops, an endless page). Nothing mocked."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import run_refmount
from tests.support.daily import make_daily
from tests.support.nginx import Nginx, free_port
from tests.test_catalogs import Loopback, assert_same, listed

pystac = pytest.importorskip("pystac")
rasterio = pytest.importorskip("rasterio")
pytest.importorskip("xarray")

GEOMETRY = {"type": "Polygon", "coordinates": [[[-180, -90], [180, -90], [180, 90], [-180, 90], [-180, -90]]]}
BBOX = [-180, -90, 180, 90]
UTC = datetime.timezone.utc


@pytest.fixture
def scans(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def write_cog(path: Path):
    """A 150 x 130 uint16 Cloud-Optimised GeoTIFF (GDAL's COG driver, 128-pixel tiles); its values."""
    import numpy as np
    from rasterio.shutil import copy
    from rasterio.transform import from_origin

    y, x = np.mgrid[0:150, 0:130]
    data = (1000 + 7 * y + 3 * x).astype("uint16")
    src = path.with_name("src.tif")
    with rasterio.open(src, "w", driver="GTiff", width=130, height=150, count=1, dtype="uint16", crs="EPSG:4326",
                       transform=from_origin(10, 50, 0.01, 0.01)) as dst:
        dst.write(data, 1)
    copy(src, path, driver="COG", compress="DEFLATE", blocksize=128, overviews="NONE")
    src.unlink()
    return data


def daily_item(f: Path, day: int, href: str):
    item = pystac.Item(f.stem, GEOMETRY, BBOX, datetime.datetime(2020, 1, 1 + day, 12, tzinfo=UTC), {})
    item.add_asset("data", pystac.Asset(href, media_type="application/x-netcdf", roles=["data"]))
    item.add_asset("thumbnail", pystac.Asset(href.rsplit("/", 1)[0] + "/thumb.png", media_type=pystac.MediaType.PNG,
                                             roles=["thumbnail"]))
    return item


def collection(ident: str):
    extent = pystac.Extent(pystac.SpatialExtent([BBOX]),
                           pystac.TemporalExtent([[datetime.datetime(2020, 1, 1, tzinfo=UTC), None]]))
    return pystac.Collection(ident, f"{ident} test collection", extent)


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    """www/data: three daily netCDF files, a COG, the kerchunk references of the first day (targets
    relative to them); www/stac: a static catalog pystac wrote (relative hrefs throughout), collection
    `daily` (one item a day) and `other` (the COG, the references)."""
    from kerchunk.hdf import SingleHdf5ToZarr

    www = tmp_path_factory.mktemp("archive")
    data = www / "data"
    daily = make_daily(data, 3, nlat=7, nlon=12)
    cog = write_cog(data / "cog.tif")
    refs = SingleHdf5ToZarr(str(daily[0]), inline_threshold=0).translate()
    for value in refs["refs"].values():
        if isinstance(value, list) and value:
            value[0] = daily[0].name  # (relative to the references' own url)
    (data / "refs.json").write_text(json.dumps(refs))
    from tests.support.dmrpp_files import write_dmrpp

    write_dmrpp(daily[1], data / (daily[1].name + ".dmrpp"))  # (its dmrpp:href a placeholder, as build_dmrpp's)

    catalog = pystac.Catalog("archive", "a test archive")
    days, other = collection("daily"), collection("other")
    catalog.add_children([days, other])
    for i, f in enumerate(daily):
        days.add_item(daily_item(f, i, str(f)))
    item = pystac.Item("cog", GEOMETRY, BBOX, datetime.datetime(2020, 1, 1, tzinfo=UTC), {})
    item.add_asset("visual", pystac.Asset(str(data / "cog.tif"), media_type=pystac.MediaType.COG, roles=["data"]))
    other.add_item(item)
    item = pystac.Item("refs_" + daily[0].stem, GEOMETRY, BBOX, datetime.datetime(2020, 1, 1, tzinfo=UTC), {})
    item.add_asset("references", pystac.Asset(str(data / "refs.json"), media_type="application/json",
                                              roles=["references"]))
    item.add_asset("data", pystac.Asset(str(daily[0]), media_type="application/x-netcdf", roles=["data"]))
    other.add_item(item)
    item = pystac.Item("dmrpp_" + daily[1].stem, GEOMETRY, BBOX, datetime.datetime(2020, 1, 2, tzinfo=UTC), {})
    item.add_asset("data", pystac.Asset(str(daily[1]), media_type="application/x-netcdf", roles=["data"]))
    item.add_asset("dmrpp", pystac.Asset(str(daily[1]) + ".dmrpp", media_type="application/vnd.opendap.dap4.dmrpp+xml",
                                         roles=["metadata"]))
    other.add_item(item)
    catalog.normalize_hrefs(str(www / "stac"))
    catalog.make_all_asset_hrefs_relative()
    catalog.save(pystac.CatalogType.SELF_CONTAINED)
    with Nginx(www / "nginx", f"root {www};", log_format="$request_method $uri $status") as nginx:
        yield {"www": www, "daily": daily, "cog": cog, "nginx": nginx}


def test_pystac_static_catalog_each_item_a_dataset_equal_to_its_asset(mount, scans, archive):
    import numpy as np
    import zarr

    nginx, daily = archive["nginx"], archive["daily"]
    m = mount(f"{nginx.url}/stac/catalog.json", "--view", "raw")
    assert listed(m.path) == sorted([f.stem for f in daily] + ["cog", "refs_" + daily[0].stem, "dmrpp_" + daily[1].stem])
    for f in daily:
        assert_same(m.path / f.stem, f)
    assert_same(m.path / ("refs_" + daily[0].stem), daily[0])  # (its references, not its file's header)
    assert_same(m.path / ("dmrpp_" + daily[1].stem), daily[1])  # (its DMR++, the data asset's url for its href)
    # (a one-level TIFF is a group holding its image as `0`, the name of a COG's first level)
    assert np.array_equal(zarr.open_group(str(m.path / "cog"), mode="r")["0"][...], archive["cog"])
    log = nginx.access_log()
    assert not [line for line in log if "thumb.png" in line]
    assert [line for line in log if line.startswith(f"GET /data/{daily[1].name}.dmrpp 20")], [x for x in log if "/data/" in x]
    assert "asset(s) of other kinds left out" in m.log()


def test_concat_time_over_a_pystac_collection_equals_open_mfdataset(mount, scans, archive):
    import xarray as xr

    daily = archive["daily"]
    m = mount(f"{archive['nginx'].url}/stac/daily/collection.json", "--concat", "time", "--view", "raw")
    with xr.open_zarr(m.path) as got, xr.open_mfdataset(daily, combine="by_coords") as want:
        xr.testing.assert_allclose(got.load(), want.load())
        assert got.time.values.tolist() == want.time.values.tolist()


class StacFastapi:
    """stac-fastapi's static-catalog backend (stac-fastapi-static) under uvicorn on a loopback port,
    in a subprocess of its own, killed by its PID at exit."""

    def __init__(self, catalog: Path, logs: Path) -> None:
        self.catalog, self.logs = catalog, logs
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        pytest.importorskip("stac_fastapi.static")
        pytest.importorskip("uvicorn")
        env = {**os.environ, "CATALOG_HREF": self.catalog.as_uri(), "APP_HOST": "127.0.0.1",
               "APP_PORT": str(self.port), "RELOAD": "false"}
        self.out = open(self.logs, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "stac_fastapi.static.app:app", "--host",
                                      "127.0.0.1", "--port", str(self.port)], env=env, stdout=self.out,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/", timeout=5).read()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise AssertionError(f"stac-fastapi did not start: {self.logs.read_text()[-2000:]}")
                time.sleep(0.2)

    def __exit__(self, *exc):
        self.proc.kill()
        self.proc.wait(15)
        self.out.close()

    def requests(self) -> list[str]:
        return [line for line in self.logs.read_text().splitlines() if '"GET /search' in line]


def test_stac_api_search_by_datetime_bbox_limit_paged_concat_equals_open_mfdataset(mount, scans, archive, tmp_path):
    """stac-fastapi serves a catalog whose assets are on nginx; a search for two of three days, one item a
    page: the mount pages through the `next` links (token=...) and concatenates what the search found."""
    import xarray as xr

    nginx, daily = archive["nginx"], archive["daily"]
    catalog = pystac.Catalog("api", "the API's catalog")
    days = collection("daily")
    catalog.add_child(days)
    for i, f in enumerate(daily):
        days.add_item(daily_item(f, i, f"{nginx.url}/data/{f.name}"))
    catalog.normalize_hrefs(str(tmp_path / "api"))
    catalog.save(pystac.CatalogType.SELF_CONTAINED)
    with StacFastapi(tmp_path / "api" / "catalog.json", tmp_path / "uvicorn.log") as api:
        search = f"{api.url}/search?collections=daily&datetime=2020-01-02T00:00:00Z/2020-01-03T23:59:59Z" \
                 "&bbox=-10,-10,10,10&limit=1"
        m = mount(search, "--concat", "time", "--view", "raw")
        with xr.open_zarr(m.path) as got, xr.open_mfdataset(daily[1:], combine="by_coords") as want:
            xr.testing.assert_allclose(got.load(), want.load())
        asked = api.requests()
        assert len(asked) >= 2 and any("token=" in line for line in asked), asked  # (paged by its next links)
        out = tmp_path / "out.json"
        empty = run_refmount("scan", search.replace("2020-01-02", "2021-01-02").replace("2020-01-03", "2021-01-03"),
                             "-o", out)
        assert empty.returncode != 0 and "names no data files" in empty.stderr and "Traceback" not in empty.stderr


def test_post_paged_search_merges_the_next_body(mount, scans, archive):
    """A `next` link asking for a POST with a body to merge (STAC API item search's paging by POST)."""
    from aiohttp import web

    nginx, daily = archive["nginx"], archive["daily"]
    bodies = []

    def page(n: int):
        f = daily[n]
        item = daily_item(f, n, f"{nginx.url}/data/{f.name}").to_dict()
        links = [{"rel": "next", "href": "/search", "method": "POST", "body": {"token": f"n{n + 1}"}, "merge": True}] \
            if n + 1 < len(daily) else []
        return web.json_response({"type": "FeatureCollection", "features": [item], "links": links})

    async def get(request):
        return page(0)

    async def post(request):
        body = await request.json()
        bodies.append((request.headers.get("Content-Type"), body))
        return page(int(body["token"][1:]))

    with Loopback([web.get("/search", get), web.post("/search", post)]) as api:
        m = mount(f"{api.url}/search?limit=1", "--view", "raw")
        assert listed(m.path) == [f.stem for f in daily]
        assert_same(m.path / daily[2].stem, daily[2])
    assert bodies == [("application/json", {"token": "n1"}), ("application/json", {"token": "n2"})]


def test_asset_kinds_by_media_type_role_or_name():
    from refmount.refs.scan.catalogs import asset_kind

    cases = [
        ("data", "a.nc", "application/x-netcdf", ["data"], "netcdf"),
        ("data", "a.bin", "application/netcdf", None, "netcdf"),
        ("data", "a.nc", "application/octet-stream", None, "netcdf"),  # (a generic type: the name tells)
        ("h5", "a.h5", "application/x-hdf5", None, "hdf5"),
        ("grib", "a.grib2", "application/wmo-grib", None, "grib"),
        ("visual", "b.tif", pystac.MediaType.COG, ["data"], "tiff"),
        ("thumbnail", "t.tif", "image/tiff", ["thumbnail"], None),
        ("thumbnail", "t.png", "image/png", ["thumbnail"], None),
        ("refs", "r.json", "application/json", ["references"], "reference"),
        ("kerchunk", "r.json", None, None, "reference"),
        ("metadata", "m.json", "application/json", ["metadata"], None),
        ("dmrpp", "a.nc.dmrpp", None, None, "dmrpp"),
        ("dmrpp", "x", "application/vnd.opendap.dap4.dmrpp+xml", None, "dmrpp"),
        ("zarr", "s.zarr", "application/vnd+zarr", ["data"], "zarr"),
        ("store", "s.zarr", None, None, "zarr"),
        ("virtual", "repo", "application/vnd.zarr+icechunk", ["virtual"], "icechunk"),
        ("refs", "r.parq", None, ["references"], "parquet"),
        ("table", "items.parquet", "application/vnd.apache.parquet", ["data"], None),  # (GeoParquet)
    ]
    for key, href, media, roles, want in cases:
        assert asset_kind(key, pystac.Asset(href, media_type=media, roles=roles)) == want, (key, href, media, roles)


def test_without_pystac_a_stac_catalog_is_one_clear_error(monkeypatch):
    from refmount.refs.scan.catalogs import CatalogError, list_catalog

    monkeypatch.setitem(sys.modules, "pystac", None)  # (an import of it now fails, as where it is not installed)
    with pytest.raises(CatalogError, match=r"needs pystac: pip install 'refmount\[archives\]'"):
        list_catalog("http://127.0.0.1:9/stac/catalog.json", {})


# -- hostile ------------------------------------------------------------------------------------------------

def test_a_catalog_from_a_public_origin_names_no_private_address(caplog):
    """The decision itself (this machine has no public address to serve a catalog from): a catalog found
    on a public address may not send the mount into loopback, link-local (cloud metadata) or private
    ranges; one found inside the machine's network may (a lab's own server)."""
    from refmount.refs.scan.catalogs import _Stac

    public = _Stac("https://93.184.215.14/stac/catalog.json", {})
    for url in ("http://127.0.0.1:8080/x.nc", "http://169.254.169.254/latest/meta-data/x.nc", "https://10.1.2.3/x.nc",
                "http://[::1]/x.nc", "http://localhost/x.nc"):
        assert public.data_url(public.location, url) is None, url
    assert public.data_url(public.location, "https://93.184.215.15/x.nc") == "https://93.184.215.15/x.nc"
    assert "an address of this machine's own network" in caplog.text
    inside = _Stac("http://127.0.0.1:8080/stac/catalog.json", {})
    assert inside.data_url(inside.location, "http://10.1.2.3/x.nc") == "http://10.1.2.3/x.nc"


def test_next_link_loops_and_an_endless_page_are_bounded(scans, tmp_path):
    """A next link back to the same page (GET), a POST next link asking the same body again, and a page
    that never ends (read to 16 MiB, then refused): each ends with one line, no traceback, no hang."""
    from aiohttp import web

    feature = {"type": "Feature", "stac_version": "1.0.0", "id": "a", "geometry": GEOMETRY, "bbox": BBOX,
               "properties": {"datetime": "2020-01-01T00:00:00Z"}, "links": [],
               "assets": {"d": {"href": "/missing.nc", "type": "application/x-netcdf"}}}  # (a 404: fails at once)
    calls = {"loop": 0, "post": 0}

    async def loop(request):
        calls["loop"] += 1
        return web.json_response({"type": "FeatureCollection", "features": [feature],
                                  "links": [{"rel": "next", "href": str(request.url)}]})

    async def post_loop(request):
        calls["post"] += 1
        return web.json_response({"type": "FeatureCollection", "features": [feature],
                                  "links": [{"rel": "next", "href": "/post/search", "method": "POST",
                                             "body": {"token": "same"}}]})

    async def endless(request):
        resp = web.StreamResponse(headers={"Content-Type": "application/geo+json"})
        await resp.prepare(request)
        await resp.write(b'{"type": "FeatureCollection", "features": [')
        chunk = json.dumps(feature).encode() + b","
        try:
            for _ in range(200_000):  # (bounded here too: ~60 MB at most)
                await resp.write(chunk * 64)
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    routes = [web.get("/loop/search", loop), web.get("/post/search", post_loop), web.post("/post/search", post_loop),
              web.get("/huge/search", endless)]
    out = tmp_path / "out.json"
    with Loopback(routes) as api:
        # (missing.nc is not there: the listing ends first, then the scan says so)
        looped = run_refmount("scan", f"{api.url}/loop/search", "-o", out)
        assert "was listed already (a loop)" in looped.stderr and "Traceback" not in looped.stderr, looped.stderr
        assert calls["loop"] == 1
        posted = run_refmount("scan", f"{api.url}/post/search", "-o", out)
        assert "was listed already (a loop)" in posted.stderr and "Traceback" not in posted.stderr, posted.stderr
        assert calls["post"] == 2
        huge = run_refmount("scan", f"{api.url}/huge/search", "-o", out, timeout=120)
        assert huge.returncode != 0 and "Traceback" not in huge.stderr
        assert "larger than 16777216 bytes" in huge.stderr and len(huge.stderr.strip().splitlines()) == 1, huge.stderr


# -- items whose asset is a store: Zarr v2/v3, kerchunk Parquet references, an Icechunk repository ---------

@pytest.fixture(scope="module")
def stores(archive):
    """www/stores: the first day as a consolidated Zarr v2 store and a Zarr v3 store (xarray), its kerchunk
    references as Parquet (kerchunk's refs_to_dataframe; targets the netCDF file on nginx) and a native
    Icechunk repository (icechunk), all served by the archive's nginx; www/stores/stac: a static catalog pystac
    wrote with one item each, an item whose store is not there, and one whose Zarr asset is file:///etc."""
    import warnings

    import kerchunk.df
    import xarray as xr
    from kerchunk.hdf import SingleHdf5ToZarr

    www, nginx, first = archive["www"], archive["nginx"], archive["daily"][0]
    root = www / "stores"
    root.mkdir()
    with xr.open_dataset(first) as ds:
        ds = ds.load()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (consolidated v3 metadata is not in the v3 spec yet)
        ds.to_zarr(root / "v2.zarr", zarr_format=2, consolidated=True)
        ds.to_zarr(root / "v3.zarr", zarr_format=3, consolidated=True)
        refs = SingleHdf5ToZarr(str(first), inline_threshold=0).translate()["refs"]
        for value in refs.values():
            if isinstance(value, list) and value:
                value[0] = f"{nginx.url}/data/{first.name}"
        kerchunk.df.refs_to_dataframe(refs, str(root / "refs.parq"), record_size=10)
        icechunk = pytest.importorskip("icechunk")
        repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(root / "repo.icechunk")))
        session = repo.writable_session("main")
        ds.to_zarr(session.store, zarr_format=3, consolidated=False)
        session.commit("a native copy")

    catalog = pystac.Catalog("stores", "items whose asset is a store")
    assets = {"zarr2": ("v2.zarr", "application/vnd+zarr", ["data"]),
              "zarr3": ("v3.zarr", "application/vnd.zarr", ["data"]),
              "parquet": ("refs.parq", None, ["references"]),
              "icechunk": ("repo.icechunk", "application/vnd.zarr+icechunk", ["data"]),
              "gone": ("gone.zarr", "application/vnd.zarr", ["data"]),
              "local": ("file:///etc", "application/vnd.zarr", ["data"])}
    for ident, (href, media, roles) in assets.items():
        item = pystac.Item(ident, GEOMETRY, BBOX, datetime.datetime(2020, 1, 1, tzinfo=UTC), {})
        item.add_asset("store", pystac.Asset(href if ":" in href else str(root / href), media_type=media, roles=roles))
        catalog.add_item(item)
    catalog.normalize_hrefs(str(root / "stac"))
    catalog.make_all_asset_hrefs_relative()
    catalog.save(pystac.CatalogType.SELF_CONTAINED)
    return {"root": root, "dataset": ds, "url": f"{nginx.url}/stores/stac/catalog.json", "nginx": nginx}


def test_store_items_each_a_dataset_equal_to_the_store(mount, scans, stores, archive):
    """Each item whose asset is a Zarr v2/v3 store, Parquet references or an Icechunk repository is its
    dataset directory, loaded when first looked up as a direct mount of its url; xarray reads on it what it
    reads on the store itself. An item whose store is not there is EIO, said in one line naming its url;
    one whose Zarr asset is file:///etc is left out at listing."""
    import errno

    import xarray as xr

    root, nginx = stores["root"], stores["nginx"]
    for view in ("raw", "decoded"):
        m = mount(stores["url"], "--view", view)
        assert listed(m.path) == ["gone", "icechunk", "parquet", "zarr2", "zarr3"]
        if view == "raw":
            assert not [line for line in nginx.access_log() if "/stores/v2.zarr/" in line]  # (lazily: when looked up)
        for ident, store in (("zarr2", "v2.zarr"), ("zarr3", "v3.zarr"), ("parquet", None), ("icechunk", None)):
            with xr.open_zarr(m.path / ident) as got:
                xr.testing.assert_allclose(got.load(), stores["dataset"])
                if store:
                    with xr.open_zarr(root / store) as want:
                        xr.testing.assert_identical(got.load(), want.load())
        with pytest.raises(OSError) as e:
            os.listdir(m.path / "gone")
        assert e.value.errno == errno.EIO
        with pytest.raises(OSError):
            os.listdir(m.path / "gone")
        text = m.log()
        assert len([line for line in text.splitlines() if "gone.zarr" in line and "failed" in line]) == 1, text
        assert "file:///etc" in text and "left out" in text
    log = nginx.access_log()
    assert [line for line in log if line.startswith("GET /stores/v2.zarr/.zmetadata 200")]
    assert [line for line in log if line.startswith("GET /stores/repo.icechunk/snapshots/")]
    assert [line for line in log if line.startswith("GET /stores/refs.parq/") and ".parq 20" in line]


def test_concat_over_store_items_is_one_line_each(mount, scans, stores, tmp_path):
    """--concat combines data files and references only: an item that is a store is left out with one line
    (and a catalog of nothing else is refused, without a traceback)."""
    out = tmp_path / "out.json"
    done = run_refmount("scan", stores["url"], "-o", out)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "which mounts as its item's own directory only" in done.stderr, done.stderr


def test_a_public_catalog_names_no_private_or_local_store(caplog):
    """The decision at listing (the address rule: this machine has no public address to serve from): a Zarr,
    Icechunk or Parquet asset on a private address, or a local file, from a catalog on a public one is left
    out; the mount's trust boundary refuses a local store named by a remote catalog again."""
    from refmount.fetch.trust import Location, TargetRefused
    from refmount.refs.scan.catalogs import _Stac

    public = _Stac("https://93.184.215.14/stac/catalog.json", {})
    public.entries = []
    item = pystac.Item("evil", GEOMETRY, BBOX, datetime.datetime(2020, 1, 1, tzinfo=UTC), {})
    item.add_asset("a", pystac.Asset("http://169.254.169.254/latest/x.zarr", media_type="application/vnd.zarr"))
    item.add_asset("b", pystac.Asset("http://10.0.0.1/repo", media_type="application/vnd.zarr+icechunk"))
    item.add_asset("c", pystac.Asset("file:///etc", media_type="application/vnd.zarr"))
    item.add_asset("d", pystac.Asset("http://127.0.0.1/r.parq", roles=["references"]))
    public._item(public.location, item)
    assert public.entries == []
    assert caplog.text.count("left out") == 4, caplog.text
    with pytest.raises(TargetRefused, match="can reach local files"):
        Location.argument("http://127.0.0.1:1/stac/catalog.json").names("file:///etc")


def test_a_store_item_a_remote_catalog_names_locally_is_refused_at_lookup(tmp_path):
    """The second check, where the item's store is loaded (refs/scan/archive.py): its url as the remote
    catalog named it may not be a local directory, whatever reached the entry."""
    import trio

    from refmount.fetch.trust import Location
    from refmount.refs import load_refs
    from refmount.refs.scan.archive import ArchiveOptions, ArchiveScanner, LazyArchive, ScanRefused
    from refmount.refs.scan.entry import Entry

    local = tmp_path / "local.zarr"
    local.mkdir()
    (local / ".zgroup").write_text('{"zarr_format": 2}')
    catalog = "http://127.0.0.1:1/stac/catalog.json"
    options = ArchiveOptions(trust=Location.argument(catalog), scan_dir=str(tmp_path / "scans"), load_store=load_refs)
    archive = LazyArchive(catalog, [Entry("evil", local.as_uri(), store="zarr")], options, max_keys=1000,
                          max_refs_size=1 << 20, max_value_size=1 << 20, timeout=10)
    scanner = ArchiveScanner(archive, None, None, 1)
    try:
        with pytest.raises(ScanRefused, match=r"can reach local files") as e:
            trio.run(scanner.refset, 0)
        assert local.as_uri() in str(e.value) and e.value.once
    finally:
        scanner.close()


def test_a_store_item_whose_server_hiccups_is_tried_again_after_a_while(mount, scans, stores):
    """A store item whose server answers 503 (every store kind: its first metadata document) is EIO, said
    in one line naming the item and its url; lookups during the backoff are EIO without asking the server
    again; once the server recovers, a later lookup loads it and xarray reads what it reads on the store.
    A 404 of a store's metadata stays refused, said once."""
    import errno

    import xarray as xr

    from refmount.fuse.datasets import RETRY_AFTER
    from tests.support.rangeserver import RangeServer

    failing = {"zarr2": "stores/v2.zarr/.zmetadata", "zarr3": "stores/v3.zarr/zarr.json",
               "parquet": "stores/refs.parq/.zmetadata", "icechunk": "stores/repo.icechunk/refs/branch.main/ref.json"}
    with RangeServer(stores["root"].parent) as server:
        server.fail_paths = {path: 503 for path in failing.values()}
        m = mount(server.url_for("stores/stac/catalog.json"))
        def asked(ident: str) -> int:
            return sum(1 for _, path, _ in server.stats["log"] if path == "/" + failing[ident])

        for ident in failing:
            with pytest.raises(OSError) as e:  # (the first lookup asks, and fails)
                os.listdir(m.path / ident)
            failed, before = time.monotonic(), asked(ident)
            for _ in range(3):  # (the others fall in its backoff: EIO without asking)
                with pytest.raises(OSError) as e:
                    os.listdir(m.path / ident)
                assert e.value.errno == errno.EIO
            assert before > 0
            if time.monotonic() - failed < RETRY_AFTER[0]:  # (a machine so slow that the backoff passed: not checked)
                assert asked(ident) == before, ident
        text = m.log()
        for ident, path in failing.items():
            said = [line for line in text.splitlines() if f"dataset '{ident}' cannot be had now" in line]
            assert len(said) == 1 and "503" in said[0] and server.url_for("/".join(path.split("/")[:2])) in said[0], text

        server.fail_paths = {"stores/v2.zarr/.zmetadata": 404}  # the others recover; this one is gone for good
        deadline = time.monotonic() + 120
        for ident in ("zarr3", "parquet", "icechunk"):
            while True:
                try:
                    with xr.open_zarr(m.path / ident) as got:
                        xr.testing.assert_allclose(got.load(), stores["dataset"])
                    break
                except OSError:
                    assert time.monotonic() < deadline, m.log()
                    time.sleep(0.5)
        with xr.open_zarr(stores["root"] / "v3.zarr") as want, xr.open_zarr(m.path / "zarr3") as got:
            xr.testing.assert_identical(got.load(), want.load())
        while True:  # the 404: refused once its backoff has passed, and it stays so
            text = m.log()
            if "v2.zarr' has no consolidated metadata" in text:
                break
            with pytest.raises(OSError):
                os.listdir(m.path / "zarr2")
            assert time.monotonic() < deadline, text
            time.sleep(0.5)
        with pytest.raises(OSError):
            os.listdir(m.path / "zarr2")
        text = m.log()
        assert text.count("works again") == 3, text
        assert len([line for line in text.splitlines() if "v2.zarr' has no consolidated metadata" in line]) == 1, text


def test_a_store_item_whose_load_runs_past_load_timeout_is_tried_again_after_a_while(mount, scans, stores):
    """A store item whose server stalls (headers, then nothing) past --load-timeout is EIO, said once in one
    line naming --load-timeout, not refused for the mount's life: once the server answers, a later lookup
    loads it and xarray reads what it reads on the store."""
    import errno

    import xarray as xr

    from tests.support.rangeserver import RangeServer

    with RangeServer(stores["root"].parent) as server:
        server.stall_seconds = 20.0
        server.stall_paths = {"stores/v3.zarr/zarr.json"}
        m = mount(server.url_for("stores/stac/catalog.json"), "--load-timeout", "3")
        with pytest.raises(OSError) as e:
            os.listdir(m.path / "zarr3")
        assert e.value.errno == errno.EIO
        said = [line for line in m.log().splitlines() if "dataset 'zarr3' cannot be had now" in line]
        assert len(said) == 1 and "--load-timeout (3 s)" in said[0], m.log()
        server.stall_paths = set()
        deadline = time.monotonic() + 120
        while True:
            try:
                with xr.open_zarr(m.path / "zarr3") as got:
                    xr.testing.assert_allclose(got.load(), stores["dataset"])
                break
            except OSError:
                assert time.monotonic() < deadline, m.log()
                time.sleep(0.5)
        assert "works again" in m.log() and "cannot be scanned" not in m.log(), m.log()
