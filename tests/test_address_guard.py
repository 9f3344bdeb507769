"""A remote document that began on a public address never sends the mount into this machine's own
network, for the mount's whole life (fetch/trust.py decides once, fetch/auth.py holds it, fetch/
addresses.py and fetch/direct.py check every connection): a catalog item whose name answers a public
address at listing and 127.0.0.1 when its bytes are read is EIO on read, and the loopback server
sees no request (a real network namespace: tests/support/rebinding.py). Also the pieces one by one:
the decision, its record, and each client's connect-time check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_a_catalog_item_that_rebinds_to_loopback_is_eio_and_loopback_sees_nothing(tmp_path):
    """Listed while its name answers 93.184.215.15 (the item's header is scanned from there, a
    chunk read), then the name answers 127.0.0.1: every read of the item is EIO with one log
    line naming the url and the address, and the server on 127.0.0.1 at the same port gets nothing."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.fail("this test needs root, unshare(1) and ip(8) to make a network namespace")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(["unshare", "--net", "--mount", "--", sys.executable, "-m", "tests.support.rebinding",
                           str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    log = out["log"]
    assert out["listed"] == ["day"], log
    assert out["before"]["tas"] == "ok" and out["before"]["public_requests"] > 0, (out["before"], log)
    assert out["after"] == {"tas": "EIO"}, (out["after"], log)
    assert out["internal_requests"] == 0, log
    refused = [line for line in log.splitlines() if "rebind.example resolves to 127.0.0.1" in line]
    assert refused and all(line.startswith("refmount: ") and "http://rebind.example:8080/tas_20200101.nc" in line for line in refused), log
    assert "Traceback" not in log, log


# -- the pieces -------------------------------------------------------------------------------------

def test_a_public_documents_targets_are_recorded_public_only_and_internal_ones_refused():
    """The one decision (fetch/trust.py): a remote document from a public address names no internal
    address (a literal, or a name resolving there now), and each http(s) url it may name is recorded
    as reached on public addresses only; so is everything a document it named names. A document that
    began inside this machine's network (a lab's own server) names what it likes, recorded nowhere."""
    from refmount.fetch.auth import Logins
    from refmount.fetch.trust import Location, TargetRefused

    logins = Logins()
    public = Location.argument("https://93.184.215.14/refs.json", logins=logins)
    for url in ("http://127.0.0.1:8080/x.nc", "http://169.254.169.254/latest/x", "http://[::1]/x",
                "http://localhost:9/x.nc", "https://10.0.0.1/x"):
        with pytest.raises(TargetRefused, match="an address of this machine's own network"):
            public.check(url)
    public.check("https://93.184.215.15/x.nc")
    public.check("s3://bucket/key.nc")  # (signed for the user's own endpoint: no host of its own)
    sidecar = public.names("https://93.184.215.16/x.nc.dmrpp")
    sidecar.check("https://93.184.215.17/x.nc")
    assert logins.public_only == {"93.184.215.14", "93.184.215.15", "93.184.215.16", "93.184.215.17"}
    assert logins.is_public_only("https://93.184.215.17:443/other") and not logins.is_public_only("s3://bucket/k")
    inside = Location.argument("http://127.0.0.1:8080/refs.json", logins=Logins())
    inside.check("http://10.1.2.3/x.nc")
    assert not inside.policy.logins.public_only


def test_every_hop_of_a_public_only_url_is_guarded_and_a_literal_refused_before_sending():
    """auth.Trail: a chain that began at a recorded url guards every hop, its own host too (the
    classic rebinding: the same name, later another answer), and no flag lifts it."""
    from refmount.fetch.auth import Logins

    logins = Logins(allow_cross_host_redirects=True)
    logins.reach_public_only("http://data.example/x.nc")
    trail = logins.trail("http://data.example/x.nc")
    assert trail.guards("http://data.example/x.nc") == "data.example"
    assert trail.guards("http://login.example/oauth") == "login.example"
    assert "may not reach" in trail.redirect_refused(trail.origin, "http://127.0.0.1/x")
    other = logins.trail("http://elsewhere.example/x")
    assert other.guards("http://elsewhere.example/y") is None  # (not named by a public document)
    logins.reach_public_only("http://127.0.0.1:1/x")
    literal = logins.trail("http://127.0.0.1:1/x")
    assert "127.0.0.1 is an address of this machine's own network" in literal.unreachable("http://127.0.0.1:1/x")


@pytest.mark.parametrize("client", ["stdlib", "aiohttp"])
def test_both_engines_refuse_a_recorded_name_that_resolves_to_loopback(server, client):
    """The HTTP engine's two paths (the stdlib engine's own connections, aiohttp through the guarded
    resolver) refuse a recorded host whose name answers 127.0.0.1, at once, in one line naming the
    url and the address, and the server sees nothing; the same url unrecorded is read."""
    import trio

    from refmount.errors import FetchError
    from refmount.fetch import Fetcher
    from refmount.fetch.auth import Logins

    (server.root / "a.bin").write_bytes(b"x" * 5000)
    url = f"http://localhost:{server.port}/a.bin"

    async def read(logins):
        fetcher = Fetcher(http_client=client, logins=logins)
        try:
            return b"".join(map(bytes, await fetcher.read(url, 0, 100)))
        finally:
            await fetcher.aclose()

    assert trio.run(read, Logins()) == b"x" * 100
    seen = server.stats["requests"]
    logins = Logins()
    logins.reach_public_only(url)
    with pytest.raises(FetchError) as caught:
        trio.run(read, logins)
    message = str(caught.value)
    assert message.startswith(url) and "localhost resolves to 127.0.0.1" in message and "\n" not in message
    assert "gave up" not in message  # (final at the first try: no retries against it)
    assert server.stats["requests"] == seen


def test_the_stdlib_engines_connection_checks_what_it_connects_to(server):
    """addresses.connection (http.client's connect for the stdlib engine): resolved once, each address
    checked against the guard of the request in hand, only those tried."""
    from refmount.fetch import addresses

    sock = addresses.connection(("localhost", server.port), 5)
    sock.close()
    with addresses.guarded("localhost", "which the test forbids"):
        with pytest.raises(addresses.InternalAddress, match="localhost resolves to 127.0.0.1.*which the test forbids"):
            addresses.connection(("localhost", server.port), 5)
    assert server.stats["requests"] == 0


# -- the audit: local files and the mount's credentials ------------------------------------------------

HEADERS = {"Authorization": "Bearer user-s3cr3t", "X-Api-Key": "k3y"}


def test_a_public_document_names_no_host_naming_protocol_refmount_cannot_check():
    """ftp, sftp, smb, webhdfs...: fsspec's clients connect where the url says, unchecked; from a public
    document they are refused (one line), unless --allow-protocols lists them; a document of this
    machine's network (a lab's server) may name them. The public document's own host is held to public
    addresses from then on too (a --refresh fetches it again)."""
    from refmount.fetch.auth import Logins
    from refmount.fetch.trust import Location, TargetRefused

    logins = Logins()
    public = Location.argument("https://93.184.215.14/refs.json", logins=logins)
    for url in ("ftp://127.0.0.1/etc/passwd", "sftp://169.254.169.254/x", "webhdfs://10.0.0.1:9870/x",
                "smb://nas/share/x"):
        with pytest.raises(TargetRefused, match="cannot hold to public addresses") as e:
            public.check(url)
        assert "\n" not in str(e.value) and url.split("://")[0] in str(e.value)
    assert logins.public_only == {"93.184.215.14"}
    Location.argument("https://93.184.215.14/refs.json", ["https", "ftp"], logins=Logins()).check("ftp://93.184.215.15/x")
    Location.argument("http://127.0.0.1:8080/refs.json", logins=Logins()).check("ftp://127.0.0.1/x")


@pytest.mark.parametrize("client", ["stdlib", "aiohttp"])
def test_a_host_a_public_document_named_elsewhere_gets_no_user_header_nor_netrc_default(server, tmp_path,
                                                                                       monkeypatch, client):
    """The user's --remote-options headers and netrc's `default` entry are for the hosts the user named;
    a url a public document named on another origin than its own (recorded by fetch/trust.py) is read
    with neither, and over plain http with no credential at all (the document chose http: a bearer
    token or netrc entry would travel in clear); the user's own http url still carries them."""
    import trio

    from refmount.fetch import Fetcher
    from refmount.fetch.auth import Logins

    (server.root / "a.bin").write_bytes(b"y" * 5000)
    url = f"http://localhost:{server.port}/a.bin"
    netrc = tmp_path / "netrc"
    netrc.write_text("default login anyone password any-secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))

    def headers_sent(logins) -> dict:
        async def read():
            fetcher = Fetcher(http_client=client, logins=logins, remote_options={"headers": HEADERS})
            try:
                return b"".join(map(bytes, await fetcher.read(url, 0, 100)))
            finally:
                await fetcher.aclose()

        server.reset_stats()
        assert trio.run(read) == b"y" * 100
        return server.stats["headers"][-1]

    mine = headers_sent(Logins())
    assert mine["x-api-key"] == "k3y" and mine["authorization"] == HEADERS["Authorization"]
    def stranger() -> Logins:
        logins = Logins()
        logins.strangers.add(("http", f"localhost:{server.port}"))  # (as trust.py records it; localhost: not guarded)
        return logins

    sent = headers_sent(stranger())
    assert "x-api-key" not in sent and "authorization" not in sent, sent
    netrc.write_text("machine localhost login mine password its-own\n")
    assert "authorization" not in headers_sent(stranger())


def test_a_strangers_own_credentials_go_over_https_only():
    """Over https a host a public document named gets its own explicit netrc entry (the user's choice
    for that host), not netrc's default; the same host over http gets nothing."""
    import base64

    from refmount.fetch.auth import Logins

    logins = Logins()
    logins.reach_public_only("https://data.example/x.nc", stranger=True)
    logins.reach_public_only("http://data.example/x.nc", stranger=True)
    logins.netrc._parsed = _netrc("machine data.example login mine password its-own\ndefault login a password b\n")
    basic = "Basic " + base64.b64encode(b"mine:its-own").decode()
    assert logins.trail("https://data.example/x.nc").headers("https://data.example/x.nc") == {"Authorization": basic}
    assert logins.trail("http://data.example/x.nc").headers("http://data.example/x.nc") == {}
    assert logins.trail("https://other.example/x.nc").headers("https://other.example/x.nc")["Authorization"] \
        == "Basic " + base64.b64encode(b"a:b").decode()  # (not a stranger: its default, as before)


def _netrc(text: str):
    import netrc
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".netrc") as f:
        f.write(text)
        f.flush()
        return netrc.netrc(f.name)


def test_an_icechunk_repository_over_http_goes_through_the_mounts_trail(tmp_path):
    """The repository's own objects (refs/icechunk_files.py) were fetched by a plain fsspec client: every
    header of the user's to every host a redirect led to, no address guard. Now they go through the
    one Trail: a redirect of `repo` to another host carries none of the user's headers."""
    from refmount.refs.icechunk_files import RepoFiles
    from tests.support.rangeserver import RangeServer

    (tmp_path / "repos" / "r").mkdir(parents=True)
    (tmp_path / "other" / "r").mkdir(parents=True)
    (tmp_path / "other" / "r" / "repo").write_bytes(b"ICE")
    with RangeServer(tmp_path / "repos") as repos, RangeServer(tmp_path / "other", host="127.0.0.2") as other:
        repos.redirects = {"r/repo": other.url_for("r/repo")}
        files = RepoFiles(f"{repos.url}/r", {"headers": HEADERS})
        assert files.read("repo") == b"ICE"
        assert repos.stats["headers"][0].get("x-api-key") == "k3y"
        assert other.stats["requests"] and all("x-api-key" not in h and "authorization" not in h
                                               for h in other.stats["headers"]), other.stats["headers"]
