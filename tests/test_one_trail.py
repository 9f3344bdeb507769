"""One decision for every http client (issue 38 rows 3, 4, 8 and two of row 10): index pages, the
reference file and the targets all go through fetch/auth.py's `Trail`, with the mount's logins.

- the user's --remote-options headers reach only the origin a chain began at, through every
  redirect, followed or not (a header-logging server on a second loopback address, 127.0.0.2, is
  the other host); a redirect to another scheme is refused;
- a redirect to another host is followed by default carrying no credential (the signed-url hop),
  but not from a public origin into loopback, link-local or private addresses (judged on the
  addresses connected to: fetch/addresses.py);
- index pages, sniffing, lazy and eager scans, --concat and `refmount scan` carry the mount's
  bearer token (nginx wants one), and a refused one is one line naming the url;
- `http://host/dir/` is a directory of data files unless it holds a `.zmetadata`; an index page
  redirected within its origin lists its files.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest

from tests.conftest import is_mounted, run_refmount
from tests.support.clients import nczarr_url
from tests.support.daily import make_daily
from tests.support.nginx import Nginx
from tests.support.rangeserver import RangeServer

HEADERS = {"Authorization": "Bearer user-s3cr3t", "X-Api-Key": "k3y"}
RAW = ("--view", "raw", "--block-size", "4K", "--no-prefetch")
TOKEN = "tok-" + "7" * 24


@pytest.fixture
def scans(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return tmp_path / "xdg-cache"


@pytest.fixture(scope="module")
def daily(tmp_path_factory):
    root = tmp_path_factory.mktemp("daily")
    make_daily(root, 2, nlat=7, nlon=12)
    return root


@pytest.fixture
def elsewhere(tmp_path):
    """Another host: a header-logging Range server on a second loopback address."""
    root = tmp_path / "elsewhere"
    root.mkdir()
    with RangeServer(root, host="127.0.0.2") as s:
        yield s


def user_headers_seen(server) -> list[dict]:
    return [h for h in server.stats["headers"] if "authorization" in h or "x-api-key" in h]


def refused(*args, env=None):
    """`refmount mount ARGS... MNT`, expected to fail (unmounted again if it mounted after all)."""
    result = run_refmount("mount", *args, env=env)
    if is_mounted(args[-1]):
        run_refmount("umount", args[-1])
    assert result.returncode != 0, result.stderr
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- row 3: an index page that redirects ------------------------------------------------------------

@pytest.mark.parametrize("where", ["another host", "ftp"])
def test_an_index_redirect_elsewhere_is_refused_before_anything_is_sent_there(tmp_path, scans, daily, elsewhere,
                                                                             where):
    """The glob's index page 302s to another host (or to ftp://): the listing refuses it, and the other
    host receives nothing at all (the user's headers least of all)."""
    shutil.copytree(daily, elsewhere.root / "d")
    target = f"{elsewhere.url}/d/" if where == "another host" else "ftp://127.0.0.2/d/"
    (tmp_path / "www").mkdir()
    with Nginx(tmp_path / "nginx", f"root {tmp_path / 'www'}; location /d/ {{ return 302 {target}; }}") as nginx:
        mnt = tmp_path / "m"
        mnt.mkdir()
        for flag in ([], ["--allow-cross-host-redirects"]):
            err = refused(*flag, "--remote-options", json.dumps({"headers": HEADERS}), f"{nginx.url}/d/*.nc", mnt)
            assert f"{nginx.url}/d/" in err and "refused" in err, err
            assert ("not http or https" if where == "ftp" else "own origin") in err, err
        assert elsewhere.stats["requests"] == 0, elsewhere.stats["log"]
        assert any('"GET /d/ ' in line for line in nginx.access_log())


# -- row 4: a reference file that redirects ---------------------------------------------------------

@pytest.mark.parametrize("flag", [[], ["--allow-cross-host-redirects"]])
def test_a_reference_file_redirected_to_another_host_carries_none_of_the_users_headers(mount, server, elsewhere,
                                                                                       flag):
    """fsspec's client of the reference file: the origin gets Authorization and X-Api-Key, the host it
    redirects to neither (it used to get X-Api-Key); the redirect is followed by default now (no
    credential goes with it, and the chain began on loopback)."""
    data = os.urandom(4096)
    (server.root / "a.bin").write_bytes(data)
    (elsewhere.root / "refs.json").write_text(json.dumps({"k": [server.url_for("a.bin"), 0, 4096]}))
    server.redirects = {"refs.json": elsewhere.url_for("refs.json")}
    m = mount(server.url_for("refs.json"), *RAW, *flag, "--remote-options", json.dumps({"headers": HEADERS}))
    assert (m / "k").read_bytes() == data
    assert [path for _, path, _ in elsewhere.stats["log"]] and not user_headers_seen(elsewhere), \
        elsewhere.stats["headers"]
    first = server.stats["headers"][0]
    assert first.get("authorization") == HEADERS["Authorization"] and first.get("x-api-key") == HEADERS["X-Api-Key"]


def test_a_targets_signed_url_hop_is_followed_by_default_and_carries_nothing(mount, server, elsewhere):
    """The HTTP engine (a target's reads): the hop to another host (Earthdata Cloud's signed url) is
    followed without --allow-cross-host-redirects, with none of the user's headers."""
    data = os.urandom(8192)
    (elsewhere.root / "a.bin").write_bytes(data)
    server.redirects = {"a.bin": elsewhere.url_for("a.bin") + "?X-Amz-Signature=abc"}
    m = mount({"k": [server.url_for("a.bin"), 0, 8192]}, *RAW, "--remote-options", json.dumps({"headers": HEADERS}))
    assert (m / "k").read_bytes() == data
    assert elsewhere.stats["requests"] and not user_headers_seen(elsewhere), elsewhere.stats["headers"]
    assert all(h.get("x-api-key") == "k3y" for h in server.stats["headers"])


def test_the_redirect_decision_refuses_internal_addresses_from_a_public_origin():
    """One decision (auth.Trail): another scheme, https -> http, and, from a chain that began on a public
    host, an address literal inside this machine's network are refused; names are judged where they
    resolve (below). Without a public address on this machine, the decision is tested as a function."""
    from refmount.fetch.auth import Logins

    trail = Logins().trail("https://93.184.216.34/data/x.nc", HEADERS)
    for there in ("https://127.0.0.1/x", "https://169.254.169.254/latest/meta-data/", "https://10.1.2.3/x",
                  "https://[::1]/x", "https://[::ffff:127.0.0.1]/x", "https://[fe80::1]/x"):
        assert "this machine's own network" in trail.redirect_refused(trail.origin, there), there
    assert trail.redirect_refused(trail.origin, "https://52.216.8.1/bucket/x?X-Amz-Signature=s") is None
    assert trail.redirect_refused(trail.origin, "ftp://93.184.216.34/x").endswith("(not http or https)")
    assert "https down to http" in trail.redirect_refused(trail.origin, "http://93.184.216.34/x")
    assert trail.guards("https://bucket.s3.example/x") == "bucket.s3.example"  # (checked as it resolves)
    assert trail.guards("https://93.184.216.34/other") is None  # (the chain's own host)
    assert trail.headers("https://93.184.216.34/y")["X-Api-Key"] == "k3y"
    assert trail.headers("https://bucket.s3.example/x") == {} and trail.headers("http://93.184.216.34:81/x") == {}
    allowed = Logins(allow_cross_host_redirects=True).trail("https://93.184.216.34/x")
    assert allowed.redirect_refused(allowed.origin, "https://127.0.0.1/x") is None
    inside = Logins().trail("http://127.0.0.1:8080/x")  # a chain that began inside: loopback is no step down
    assert inside.redirect_refused(inside.origin, "http://127.0.0.2:9000/x") is None


def test_a_guarded_name_that_resolves_inside_is_refused_as_it_connects():
    """The resolver every client uses checks each address of a guarded hop's host, and hands aiohttp
    exactly the addresses it checked (no second lookup to rebind)."""
    from refmount.fetch import addresses

    async def resolve(guard):
        resolver = addresses.resolver()
        try:
            with addresses.guarded(guard):
                return await resolver.resolve("localhost", 80)
        finally:
            await resolver.close()

    assert asyncio.run(resolve(None))  # unguarded: resolved
    assert asyncio.run(resolve("elsewhere.example"))  # guarded for another host: resolved
    with pytest.raises(addresses.InternalAddress, match="localhost resolves to"):
        asyncio.run(resolve("localhost"))
    assert addresses.began_internal("localhost") and not addresses.began_internal("93.184.216.34")


@pytest.mark.parametrize("client", ["engine", "reference file"])
def test_both_clients_refuse_a_guarded_hop_into_loopback_at_once(server, monkeypatch, client):
    """The HTTP engine and the reference file's fsspec client both connect through the guard: a hop
    the Trail guards (here every hop, as from a public origin, which this machine cannot have) to a
    name that resolves to loopback fails at once in one line, and the server sees nothing."""
    import time

    from refmount.errors import RefmountError
    from refmount.fetch.auth import Trail

    (server.root / "refs.json").write_text("{}")
    monkeypatch.setattr(Trail, "guards", lambda self, url: "localhost")
    url = f"http://localhost:{server.port}/refs.json"
    started = time.monotonic()
    with pytest.raises(RefmountError) as caught:
        if client == "engine":
            from refmount.fetch.pages import fetch_page

            fetch_page(url, 1000)
        else:
            from refmount.refs.source import open_reference_file

            open_reference_file(url)
    assert "localhost resolves to 127.0.0.1" in str(caught.value) and "\n" not in str(caught.value)
    assert time.monotonic() - started < 5 and server.stats["requests"] == 0


# -- row 8: logins for index pages, sniffing and scans ----------------------------------------------

@pytest.fixture
def token_server(tmp_path, daily):
    """nginx serving the daily files under /d/ (an autoindex) to `Authorization: Bearer TOKEN` only."""
    www = tmp_path / "www"
    shutil.copytree(daily, www / "d")
    block = (f'root {www}; location /d/ {{ if ($http_authorization != "Bearer {TOKEN}") {{ return 401; }} '
             "autoindex on; }")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    with Nginx(tmp_path / "nginx", block) as nginx:
        nginx.token_option = f"127.0.0.1:{nginx.port}={token}"
        nginx.www = www / "d"
        yield nginx


def assert_reads_like(mounted, source) -> None:
    import netCDF4
    import numpy as np

    with netCDF4.Dataset(nczarr_url(mounted)) as got, netCDF4.Dataset(source) as want:
        for name in ("time", "lat", "tas"):
            assert np.array_equal(np.ma.getdata(got.variables[name][...]), np.ma.getdata(want.variables[name][...]))


def test_a_glob_behind_a_bearer_token_lists_and_scans_with_it(mount, scans, token_server):
    """Lazy (no --concat): the index page and each file's scan carry the token."""
    names = sorted(p.name for p in token_server.www.glob("*.nc"))
    m = mount(f"{token_server.url}/d/*.nc", "--bearer-token", token_server.token_option)
    assert sorted(os.listdir(m.path)) == names
    assert_reads_like(m.path / names[1], token_server.www / names[1])
    assert m.stats()["logins"]["bearer_requests"], m.stats()["logins"]


def test_concat_sniffing_and_refmount_scan_carry_the_bearer_token(mount, scans, token_server, tmp_path):
    names = sorted(p.name for p in token_server.www.glob("*.nc"))
    m = mount(f"{token_server.url}/d/*.nc", "--concat", "time", "--bearer-token", token_server.token_option)
    import netCDF4

    with netCDF4.Dataset(nczarr_url(m.path)) as ds:
        assert ds.variables["tas"].shape[0] == 24 * len(names)
    m.stop()
    single = mount(f"{token_server.url}/d/{names[0]}", "--bearer-token", token_server.token_option)  # sniffed
    assert_reads_like(single.path, token_server.www / names[0])
    out = tmp_path / "out.json"
    result = run_refmount("scan", f"{token_server.url}/d/*.nc", "-o", out, "--bearer-token", token_server.token_option)
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    assert set(written.get("refs", written)) >= {f"{names[0]}/tas/.zarray", f"{names[1]}/tas/.zarray"}


def test_a_refused_token_is_one_line_naming_the_url(scans, token_server, tmp_path):
    bad = tmp_path / "bad-token"
    bad.write_text("tok-wrong\n")
    mnt = tmp_path / "m"
    mnt.mkdir()
    option = token_server.token_option.rsplit("=", 1)[0] + f"={bad}"
    for source, args in ((f"{token_server.url}/d/*.nc", ()), (f"{token_server.url}/d/*.nc", ("--concat", "time")),
                         (f"{token_server.url}/d/tas_20200101.nc", ())):
        err = refused(*args, "--bearer-token", option, source, mnt)
        assert "401" in err and f"{token_server.url}/d/" in err and "refused" in err, err
        assert "not a" not in err and "tok-wrong" not in err, err
    result = run_refmount("scan", f"{token_server.url}/d/*.nc", "-o", tmp_path / "o.json", "--bearer-token", option)
    assert result.returncode != 0 and "401" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_s3_glob_is_listed_and_scanned_with_the_temporary_s3_credentials(mount, scans, daily, tmp_path):
    """--s3-credentials-url reaches the listing of an s3:// glob and the scans of its files: the
    credentials are fetched through the login (netrc, cookie), and S3 (moto behind a gate that takes
    only the session tokens handed out) sees no request without them."""
    import s3fs

    from tests.support.edl import World
    from tests.support.moto import moto_server

    with moto_server() as moto:
        (tmp_path / "world").mkdir()
        world = World(str(tmp_path / "world"), moto_url=moto, object_size=4096)
        try:
            fs = s3fs.S3FileSystem(key="moto", secret="moto", endpoint_url=moto, skip_instance_cache=True)
            names = sorted(p.name for p in daily.glob("*.nc"))
            for name in names:
                fs.put(str(daily / name), f"daac-bucket/d/{name}")
            m = mount("s3://daac-bucket/d/*.nc", "--s3-credentials-url", f"{world.data.url}/s3credentials",
                      "--remote-options", json.dumps({"endpoint_url": world.gate.url}), env=world.env())
            assert sorted(os.listdir(m.path)) == names
            assert_reads_like(m.path / names[0], daily / names[0])
            assert world.gate.refused == [] and world.gate.passed >= 2 and world.login.logins == 1
            world.assert_credentials_stayed_home()
        finally:
            world.close()


# -- row 10: a directory url, and an index redirected within its origin -----------------------------

def test_a_directory_url_is_its_data_files_unless_it_holds_a_zmetadata(mount, scans, daily, tmp_path):
    import kerchunk.df

    www = tmp_path / "www"
    shutil.copytree(daily, www / "dir")
    array = {"chunks": [3], "compressor": None, "dtype": "|u1", "fill_value": 0, "filters": None, "order": "C",
             "shape": [3], "zarr_format": 2}
    kerchunk.df.refs_to_dataframe({".zgroup": json.dumps({"zarr_format": 2}), "x/.zarray": json.dumps(array),
                                   "x/0": "base64:AAEC"}, str(www / "refset"), record_size=10)
    with Nginx(tmp_path / "nginx", f"root {www}; location /dir/ {{ autoindex on; }} location /refset/ {{ }}") as nginx:
        m = mount(f"{nginx.url}/dir/")
        names = sorted(p.name for p in (www / "dir").glob("*.nc"))
        assert sorted(os.listdir(m.path)) == names
        assert_reads_like(m.path / names[0], www / "dir" / names[0])
        p = mount(f"{nginx.url}/refset/", "--view", "raw")
        assert (p / "x" / "0").read_bytes() == b"\x00\x01\x02"


def test_an_index_redirected_within_its_origin_lists_its_files(mount, scans, daily, tmp_path):
    www = tmp_path / "www"
    shutil.copytree(daily, www / "archive-2020")
    block = f"root {www}; location /archive-2020/ {{ autoindex on; }} location /d/ {{ return 301 /archive-2020/; }}"
    with Nginx(tmp_path / "nginx", block) as nginx:
        m = mount(f"{nginx.url}/d/*.nc")
        names = sorted(p.name for p in (www / "archive-2020").glob("*.nc"))
        assert sorted(os.listdir(m.path)) == names
        assert_reads_like(m.path / names[0], www / "archive-2020" / names[0])
