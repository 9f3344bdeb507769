"""Issue 41, catalogs as sources: a STAC static catalog (and a STAC item search), a THREDDS catalog.xml
tree and a CMR granule search mount as a glob does, each listed url through the trust rules of an
index page. Real servers on loopback (nginx, aiohttp), real FUSE mounts, nothing mocked."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from tests.conftest import run_refmount
from tests.support.daily import make_daily
from tests.support.nginx import Nginx, free_port

pytest.importorskip("xarray")


@pytest.fixture
def scans(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


@pytest.fixture(scope="module")
def daily(tmp_path_factory) -> list[Path]:
    return make_daily(tmp_path_factory.mktemp("daily"), 3, nlat=7, nlon=12)


def listed(path) -> list[str]:
    return sorted(name for name in os.listdir(path) if not name.startswith("."))


def assert_same(got_dir, want_file) -> None:
    import xarray as xr

    with xr.open_zarr(got_dir) as got, xr.open_dataset(want_file) as want:
        xr.testing.assert_allclose(got.load(), want.load())


# -- STAC -------------------------------------------------------------------------------------------------

def stac_item(ident: str, assets: dict) -> dict:
    """An item's JSON by hand, with the odd forms pystac would not write (test_catalog_servers.py has
    catalogs pystac wrote)."""
    return {"type": "Feature", "stac_version": "1.0.0", "id": ident,
            "geometry": {"type": "Polygon", "coordinates": [[[0, -90], [360, -90], [360, 90], [0, 90], [0, -90]]]},
            "bbox": [0, -90, 360, 90], "properties": {"datetime": "2020-01-01T00:00:00Z"},
            "links": [{"rel": "root", "href": "../../catalog.json", "type": "application/json"},
                      {"rel": "parent", "href": "../collection.json", "type": "application/json"}],
            "assets": assets}


def write_stac(www: Path, files: list[Path], kerchunk_of: Path | None = None) -> None:
    """www/stac/catalog.json -> daily/collection.json -> one item a file (data/NAME served beside it),
    with a thumbnail each (left out) and, for `kerchunk_of`, an item of kerchunk references instead."""
    data = www / "data"
    data.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, data / f.name)
    coll = www / "stac" / "daily"
    links = []
    for f in files:
        ident = f.stem
        (coll / ident).mkdir(parents=True, exist_ok=True)
        item = stac_item(ident, {
            "data": {"href": f"../../../data/{f.name}", "type": "application/x-netcdf", "roles": ["data"]},
            "thumbnail": {"href": "./thumb.png", "type": "image/png", "roles": ["thumbnail"]}})
        (coll / ident / f"{ident}.json").write_text(json.dumps(item))
        links.append({"rel": "item", "href": f"./{ident}/{ident}.json", "type": "application/json"})
    if kerchunk_of is not None:
        from kerchunk.hdf import SingleHdf5ToZarr

        refs = SingleHdf5ToZarr(str(data / kerchunk_of.name), inline_threshold=0).translate()
        for value in refs["refs"].values():  # the targets relative to the references, as archives give them
            if isinstance(value, list) and value:
                value[0] = f"../../../data/{kerchunk_of.name}"
        ident = "refs_" + kerchunk_of.stem
        (coll / ident).mkdir(parents=True, exist_ok=True)
        (coll / ident / "refs.json").write_text(json.dumps(refs))
        item = stac_item(ident, {"refs": {"href": "./refs.json", "type": "application/json",
                                          "roles": ["references"]}})
        (coll / ident / f"{ident}.json").write_text(json.dumps(item))
        links.append({"rel": "item", "href": f"./{ident}/{ident}.json", "type": "application/json"})
    collection = {"type": "Collection", "stac_version": "1.0.0", "id": "daily", "description": "daily tas",
                  "license": "CC-BY-4.0", "extent": {"spatial": {"bbox": [[0, -90, 360, 90]]},
                                                     "temporal": {"interval": [["2020-01-01T00:00:00Z", None]]}},
                  "links": [{"rel": "root", "href": "../catalog.json"}, {"rel": "parent", "href": "../catalog.json"},
                            *links]}
    (coll / "collection.json").write_text(json.dumps(collection))
    catalog = {"type": "Catalog", "stac_version": "1.0.0", "id": "root", "description": "test catalog",
               "links": [{"rel": "root", "href": "./catalog.json"}, {"rel": "child", "href": "./daily/collection.json"}]}
    (www / "stac" / "catalog.json").write_text(json.dumps(catalog))


def test_stac_static_catalog_each_item_a_dataset_equal_to_its_asset(mount, scans, daily, tmp_path):
    www = tmp_path / "www"
    write_stac(www, daily, kerchunk_of=daily[0])
    with Nginx(tmp_path / "nginx", f"root {www};") as nginx:
        m = mount(f"{nginx.url}/stac/catalog.json", "--view", "raw")
        assert listed(m.path) == sorted([f.stem for f in daily] + [f"refs_{daily[0].stem}"])
        for f in daily:
            assert_same(m.path / f.stem, f)
        assert_same(m.path / f"refs_{daily[0].stem}", daily[0])
        assert "asset(s) of other kinds left out" in m.log()
        assert not [line for line in nginx.access_log() if "thumb.png" in line]


def test_concat_time_over_a_stac_catalog_equals_open_mfdataset(mount, scans, daily, tmp_path):
    import xarray as xr

    www = tmp_path / "www"
    write_stac(www, daily)
    with Nginx(tmp_path / "nginx", f"root {www};") as nginx:
        m = mount(f"{nginx.url}/stac/daily/collection.json", "--concat", "time", "--view", "raw")
        with xr.open_zarr(m.path) as got, xr.open_mfdataset(daily, combine="by_coords") as want:
            xr.testing.assert_allclose(got.load(), want.load())
            assert got.time.values.tolist() == want.time.values.tolist()


class Loopback:
    """An aiohttp app on a loopback port in a thread of its own, stopped at exit."""

    def __init__(self, routes) -> None:
        self.routes = routes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        import asyncio

        from aiohttp import web

        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def start():
            app = web.Application()
            app.add_routes(self.routes)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(start()),
                                                       self.loop.run_forever()), daemon=True)
        self.thread.start()
        assert ready.wait(15)
        return self

    def __exit__(self, *exc):
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(15)


def test_stac_item_search_pages_with_next_links(mount, scans, daily, tmp_path):
    """A STAC API search (/search?datetime=..&limit=1): one item a page, `next` links to the last."""
    from aiohttp import web

    www = tmp_path / "www"
    write_stac(www, daily)
    with Nginx(tmp_path / "nginx", f"root {www};") as nginx:
        seen = []

        async def search(request):
            seen.append(dict(request.query))
            page = int(request.query.get("page", "0"))
            f = daily[page]
            item = stac_item(f.stem, {"data": {"href": f"{nginx.url}/data/{f.name}", "type": "application/x-netcdf",
                                               "roles": ["data"]}})
            links = [{"rel": "next", "href": f"/search?datetime=2020-01-01/2020-01-31&limit=1&page={page + 1}"}] \
                if page + 1 < len(daily) else []
            return web.json_response({"type": "FeatureCollection", "features": [item], "links": links})

        with Loopback([web.get("/search", search)]) as api:
            m = mount(f"{api.url}/search?datetime=2020-01-01/2020-01-31&limit=1", "--concat", "time", "--view", "raw")
            import xarray as xr

            with xr.open_zarr(m.path) as got, xr.open_mfdataset(daily, combine="by_coords") as want:
                xr.testing.assert_allclose(got.load(), want.load())
            assert [q.get("page", "0") for q in seen] == ["0", "1", "2"]
            assert all(q["datetime"] == "2020-01-01/2020-01-31" for q in seen)


# -- THREDDS ------------------------------------------------------------------------------------------------

THREDDS_HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<catalog xmlns="http://www.unidata.ucar.edu/namespaces/thredds/InvCatalog/v1.0"
         xmlns:xlink="http://www.w3.org/1999/xlink" name="{name}" version="1.0.1">
  <service name="all" serviceType="Compound" base="">
    <service name="odap" serviceType="OPENDAP" base="/thredds/dodsC/" />
    <service name="http" serviceType="HTTPServer" base="/thredds/fileServer/" />
  </service>
"""


def thredds_dataset(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return f"""    <dataset name="{name}" ID="testAll/{path}" urlPath="{path}">
      <dataSize units="Kbytes">12.5</dataSize>
      <date type="modified">2026-11-29T07:00:00Z</date>
    </dataset>
"""


def write_thredds(www: Path, daily: list[Path]) -> str:
    """catalog/daily/catalog.xml (one dataset, a catalogRef to 2020/catalog.xml with the others) as a TDS
    writes them, the files under /thredds/fileServer/; the nginx block that serves them."""
    data = www / "files" / "daily"
    data.mkdir(parents=True)
    for f in daily:
        shutil.copy(f, data / f.name)
    cat = www / "thredds" / "catalog" / "daily"
    (cat / "2020").mkdir(parents=True)
    (cat / "catalog.xml").write_text(
        THREDDS_HEAD.format(name="daily") + """  <dataset name="daily" ID="daily">
    <metadata inherited="true"><serviceName>all</serviceName></metadata>
""" + thredds_dataset(f"daily/{daily[0].name}") + """    <catalogRef xlink:href="2020/catalog.xml" xlink:title="2020" ID="daily/2020" name="" />
  </dataset>
</catalog>
""")
    (cat / "2020" / "catalog.xml").write_text(
        THREDDS_HEAD.format(name="2020") + """  <dataset name="2020" ID="daily/2020">
    <metadata inherited="true"><serviceName>all</serviceName></metadata>
""" + "".join(thredds_dataset(f"daily/{f.name}") for f in daily[1:]) + """  </dataset>
</catalog>
""")
    return f"root {www}; location /thredds/fileServer/ {{ alias {www}/files/; }}"


def test_thredds_catalog_tree_with_nested_catalogrefs(mount, scans, daily, tmp_path):
    block = write_thredds(tmp_path / "www", daily)
    with Nginx(tmp_path / "nginx", block) as nginx:
        m = mount(f"{nginx.url}/thredds/catalog/daily/catalog.xml", "--view", "raw")
        assert listed(m.path) == sorted(f.name for f in daily)
        for f in daily:
            assert_same(m.path / f.name, f)


def test_refmount_scan_of_a_thredds_catalog_concat_equals_open_mfdataset(scans, daily, tmp_path):
    import fsspec
    import xarray as xr

    block = write_thredds(tmp_path / "www", daily)
    with Nginx(tmp_path / "nginx", block) as nginx:
        out = tmp_path / "tas.json"
        result = run_refmount("scan", f"{nginx.url}/thredds/catalog/daily/catalog.xml", "--concat", "time", "-o", out)
        assert result.returncode == 0, result.stderr
        fs = fsspec.filesystem("reference", fo=str(out), skip_instance_cache=True)
        with xr.open_zarr(fs.get_mapper(""), consolidated=False, zarr_format=2) as got, \
                xr.open_mfdataset(daily, combine="by_coords") as want:
            xr.testing.assert_allclose(got.load(), want.load())


# -- CMR -----------------------------------------------------------------------------------------------------

def test_cmr_granule_search_pages_by_search_after_and_reads_dmrpp(mount, scans, tmp_path):
    """UMM-JSON pages as CMR documents them (`hits`, `took`, `items` of `meta` and `umm`), the next page
    asked for with the CMR-Search-After header of the last answer; each granule's GET DATA url on
    another host (nginx), its `.dmrpp` beside it read instead of the file's header."""
    from aiohttp import web

    from tests.support.dmrpp_files import write_dmrpp

    www = tmp_path / "www" / "data"
    files = make_daily(www, 3, nlat=7, nlon=12)
    for f in files[:2]:  # (the third has none: its header is scanned)
        write_dmrpp(f, f.with_name(f.name + ".dmrpp"))
    block = f"root {www.parent};"
    with Nginx(tmp_path / "nginx", block, log_format='$request_method $uri $status') as nginx:
        asked = []

        async def granules(request):
            after = request.headers.get("CMR-Search-After")
            asked.append((dict(request.query), after))
            start = int(json.loads(after)[0]) if after else 0
            size = int(request.query.get("page_size", "2"))
            chunk = files[start:start + size]
            items = [{"meta": {"concept-id": f"G{start + i}-TEST", "provider-id": "TEST", "native-id": f.stem},
                      "umm": {"GranuleUR": f.stem, "RelatedUrls": [
                          {"URL": f"{nginx.url}/data/{f.name}", "Type": "GET DATA", "Description": "the file"},
                          {"URL": f"s3://bucket/{f.name}", "Type": "GET DATA VIA DIRECT ACCESS"},
                          {"URL": f"{nginx.url}/data/{f.name}.png", "Type": "GET RELATED VISUALIZATION"},
                          *([{"URL": f"{nginx.url}/data/{f.name}.dmrpp", "Type": "EXTENDED METADATA"}]
                            if f == files[0] else [])]}}  # (the first lists its DMR++; the others are asked)
                     for i, f in enumerate(chunk)]
            headers = {"CMR-Hits": str(len(files)), "CMR-Took": "5"}
            if chunk:
                headers["CMR-Search-After"] = json.dumps([str(start + len(chunk))])
            return web.json_response({"hits": len(files), "took": 5, "items": items}, headers=headers)

        with Loopback([web.get("/search/granules.umm_json", granules)]) as cmr:
            url = (f"{cmr.url}/search/granules.umm_json?collection_concept_id=C1-TEST&page_size=2"
                   "&temporal=2020-01-01T00:00:00Z,2020-01-31T00:00:00Z&bounding_box=-180,-90,180,90")
            m = mount(url, "--view", "raw")
            assert listed(m.path) == [f.name for f in files]
            for f in files:
                assert_same(m.path / f.name, f)
            assert [a for _, a in asked] == [None, '["2"]', '["3"]']
            assert all(q["collection_concept_id"] == "C1-TEST" for q, _ in asked)
            log = nginx.access_log()
            dmrpp = {line.split()[1] for line in log if line.startswith("GET") and ".dmrpp " in line}
            assert dmrpp == {f"/data/{f.name}.dmrpp" for f in files[:2]}, log
            assert [line for line in log if line.startswith("HEAD") and f"{files[2].name}.dmrpp 404" in line], log
            assert not [line for line in log if line.startswith("GET") and ".png" in line]


# -- hostile catalogs -----------------------------------------------------------------------------------------

def test_hostile_stac_catalog_is_bounded_and_refused_link_by_link(mount, scans, daily, tmp_path):
    """Links to local files, to another origin, names with '..' or '/', a loop of children: each left
    out with one line; the good item mounts, nothing is read from anywhere else."""
    www = tmp_path / "www"
    write_stac(www, daily[:1])
    coll = www / "stac" / "daily"
    bad_items = {"shadow": {"href": "file:///etc/shadow", "type": "application/x-netcdf"},
                 "abs": {"href": "/etc/shadow", "type": "application/x-netcdf"}}
    doc = json.loads((coll / "collection.json").read_text())
    for ident, asset in bad_items.items():
        (coll / f"{ident}.json").write_text(json.dumps(stac_item(ident, {"data": asset})))
        doc["links"].append({"rel": "item", "href": f"./{ident}.json"})
    for ident in ("..", "a/b"):
        name = "dots" if ident == ".." else "slash"
        (coll / f"{name}.json").write_text(json.dumps(stac_item(ident, {"data": {
            "href": f"../../data/{daily[0].name}", "type": "application/x-netcdf"}})))
        doc["links"].append({"rel": "item", "href": f"./{name}.json"})
    other = free_port()
    doc["links"] += [{"rel": "child", "href": "file:///etc/shadow"},
                     {"rel": "child", "href": f"http://127.0.0.1:{other}/catalog.json"},
                     {"rel": "child", "href": "../catalog.json"},  # a loop back to the root
                     {"rel": "child", "href": "./collection.json"}]  # and to itself
    (coll / "collection.json").write_text(json.dumps(doc))
    with Nginx(tmp_path / "nginx", f"root {www};") as nginx:
        m = mount(f"{nginx.url}/stac/catalog.json", "--view", "raw")
        # '/etc/shadow' in a remote catalog is that server's path, not this machine's: a 404 there
        assert listed(m.path) == ["abs", daily[0].stem]
        with pytest.raises(OSError):
            os.listdir(m.path / "abs")
        assert [line for line in nginx.access_log() if "/etc/shadow" in line]
        log = m.log()
        assert "'file:///etc/shadow' is not http(s):// or s3://" in log, log
        assert "leaves the catalog's origin" in log and f"127.0.0.1:{other}" in log
        assert "was listed already (a loop)" in log
        assert "'..'" in log and "'a/b'" in log  # (name_problem's lines)
        assert_same(m.path / daily[0].stem, daily[0])


def test_thredds_loop_dtd_redirect_away_and_a_million_item_search_each_refused_with_one_line(scans, tmp_path):
    from aiohttp import web

    www = tmp_path / "www"
    cat = www / "thredds"
    cat.mkdir(parents=True)
    (cat / "catalog.xml").write_text(THREDDS_HEAD.format(name="loop") + """  <catalogRef
        xlink:href="catalog.xml" xlink:title="me" name="" />
  <catalogRef xlink:href="file:///etc/shadow" xlink:title="shadow" name="" />
""" + thredds_dataset("../../../etc/shadow") + "</catalog>\n")
    (cat / "bomb" / "").mkdir()
    (cat / "bomb" / "catalog.xml").write_text('<?xml version="1.0"?><!DOCTYPE c [<!ENTITY a "aaaa">'
                                              '<!ENTITY b "&a;&a;&a;&a;">]><catalog>&b;</catalog>')

    async def endless(request):  # 10^6 items promised, a next link on every page
        page = int(request.query.get("page", "0"))
        feats = [{"type": "Feature", "id": f"i{page}_{i}", "assets": {"d": {"href": f"/d/{page}_{i}.nc",
                                                                            "type": "application/x-netcdf"}}}
                 for i in range(2000)]
        return web.json_response({"type": "FeatureCollection", "numberMatched": 10 ** 6, "features": feats,
                                  "links": [{"rel": "next", "href": f"/search?page={page + 1}"}]})

    away = free_port()
    block = f"root {www}; location = /moved/catalog.json {{ return 302 http://127.0.0.1:{away}/catalog.json; }}"
    with Nginx(tmp_path / "nginx", block) as nginx, Loopback([web.get("/search", endless)]) as api:
        out = tmp_path / "out.json"
        loop = run_refmount("scan", f"{nginx.url}/thredds/catalog.xml", "-o", out)
        assert loop.returncode != 0
        assert "Traceback" not in loop.stderr
        assert "was listed already (a loop)" in loop.stderr, loop.stderr
        assert "'file:///etc/shadow' leaves the catalog's origin" in loop.stderr
        assert "urlPath '../../../etc/shadow' climbs out of the service" in loop.stderr
        assert "names no data files" in loop.stderr and "/etc/shadow" not in "".join(nginx.access_log())
        bomb = run_refmount("scan", f"{nginx.url}/thredds/bomb/catalog.xml", "-o", out)
        assert bomb.returncode != 0 and "declares a DTD or entities" in bomb.stderr, bomb.stderr
        assert "Traceback" not in bomb.stderr
        moved = run_refmount("scan", f"{nginx.url}/moved/catalog.json", "-o", out)
        assert moved.returncode != 0 and "Traceback" not in moved.stderr
        assert f"127.0.0.1:{away}" in moved.stderr and len(moved.stderr.strip().splitlines()) == 1, moved.stderr
        many = run_refmount("scan", f"{api.url}/search", "-o", out, timeout=300)
        assert many.returncode != 0 and "names more than 100,000 items" in many.stderr, many.stderr
        assert "Traceback" not in many.stderr and len(many.stderr.strip().splitlines()) <= 3


def test_a_stac_item_gone_is_left_out_in_one_line_and_any_other_failure_fails_the_mount(mount, scans, daily, tmp_path):
    """An item link that answers 404 (or 410: never retried) is no more: left out with one line naming
    it, the other items mount. An item that answers 503 however long it is asked fails the mount in one
    line (a passing outage must not mount a partial catalog), and so does a catalog whose items are all gone."""
    trees = {}
    for name in ("one_gone", "one_failing", "all_gone"):
        write_stac(tmp_path / name, daily)
        trees[name] = tmp_path / name / "stac" / "daily"
    gone, failing = daily[1].stem, daily[2].stem
    (trees["one_gone"] / gone / f"{gone}.json").unlink()
    for f in daily:
        (trees["all_gone"] / f.stem / f"{f.stem}.json").unlink()
    block = (f"root {tmp_path}; location = /one_failing/stac/daily/{failing}/{failing}.json {{ return 503; }} "
             f"location = /all_gone/stac/daily/{failing}/{failing}.json {{ return 410; }}")
    with Nginx(tmp_path / "nginx", block) as nginx:
        m = mount(f"{nginx.url}/one_gone/stac/catalog.json", "--view", "raw")
        assert listed(m.path) == sorted(f.stem for f in daily if f.stem != gone)
        for f in daily:
            if f.stem != gone:
                assert_same(m.path / f.stem, f)
        said = [line for line in m.log().splitlines() if "gone, left out" in line]
        gone_url = f"{nginx.url}/one_gone/stac/daily/{gone}/{gone}.json"
        assert len(said) == 1 and gone_url in said[0] and "HTTP 404" in said[0], m.log()

        failing_url = f"{nginx.url}/one_failing/stac/daily/{failing}/{failing}.json"
        with pytest.raises(RuntimeError) as failed:
            mount(f"{nginx.url}/one_failing/stac/catalog.json", "--view", "raw")  # (after 20 tries, ~21 s)
        said = [line for line in str(failed.value).splitlines() if failing_url in line]
        assert len(said) == 1 and "503" in said[0] and "gone" not in said[0], str(failed.value)

        with pytest.raises(RuntimeError) as failed:
            mount(f"{nginx.url}/all_gone/stac/catalog.json", "--view", "raw")
        text = str(failed.value)
        assert "every item of the catalog" in text and text.count("gone, left out") == 3, text
        assert f"{failing}.json' answered HTTP 410" in text, text


def test_with_strict_a_stac_item_gone_fails_the_mount_in_one_line(mount, daily, tmp_path):
    """--strict leaves nothing out (a file that cannot be scanned fails the mount): an item link that
    answers 404 fails it too, in one line naming the item's url, instead of a warning."""
    write_stac(tmp_path / "one_gone", daily)
    gone = daily[1].stem
    (tmp_path / "one_gone" / "stac" / "daily" / gone / f"{gone}.json").unlink()
    with Nginx(tmp_path / "nginx", f"root {tmp_path};") as nginx:
        with pytest.raises(RuntimeError) as failed:
            mount(f"{nginx.url}/one_gone/stac/catalog.json", "--view", "raw", "--strict")
    text = str(failed.value).removeprefix("refmount exited with 1: ").strip()
    gone_url = f"{nginx.url}/one_gone/stac/daily/{gone}/{gone}.json"
    assert text == f"refmount: the catalog's item {gone_url!r} answered HTTP 404: gone (--strict leaves no item out)", \
        text


@pytest.mark.parametrize("path", ["stac/catalog.json", "data/"])
def test_a_catalog_or_index_server_that_never_answers_fails_the_mount_within_read_timeout(tmp_path, path):
    """A catalog document (or an index page of a listing) whose server takes the connection and never
    answers: the listing retried under the built-in 30 s whatever --read-timeout said. It gives up
    under the mount's --read-timeout, in one line naming the url."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # (connections complete in the kernel's backlog; nothing is ever read or sent)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/{path}"
    (tmp_path / "mnt").mkdir()
    try:
        done = run_refmount("mount", "--foreground", "--read-timeout", "2", "--stall-timeout", "1", url,
                            tmp_path / "mnt", timeout=120)
    finally:
        silent.close()
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr
    assert url.rstrip("/") in lines[0] and "timed out" in lines[0] and "Traceback" not in done.stderr, lines[0]
