"""Earthdata Login and its kin (fetch/auth.py, cookies.py, s3creds.py), through real FUSE mounts and
real servers on loopback (tests/support/edl.py): a login host that checks HTTP Basic, a data host that
sets a session cookie on the code and sometimes redirects on to a signed url on a third host, a
host that takes EDL bearer tokens, a credentials endpoint behind the login, and moto's S3 behind a
gate that accepts only the live session tokens handed out. Every server logs every header it gets:
no credential may reach a host but its own. The 5-minute read loop is bench/bench_edl.py."""

from __future__ import annotations

import errno
import json
import os
import time

import pytest

from tests.conftest import run_refmount
from tests.support.edl import PASSWORD, USER, World, read_loop
from tests.support.moto import moto_server
from tests.support.refusals import refusal_line


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def world(tmp_path):
    w = World(str(tmp_path), object_size=256 << 10)
    yield w
    w.close()


def read_all(mount_path, world: World) -> None:
    for key, (_url, body) in world.targets().items():
        assert (mount_path / key).read_bytes() == body, key


@pytest.mark.parametrize("client", ["stdlib", "aiohttp"])
def test_the_reference_file_and_its_targets_read_through_earthdata_login(world, mount, client):
    """The reference file sits behind the login (fsspec's client), its targets too (the HTTP engine):
    data url -> login host (Basic, its own netrc entry) -> data host ?code= (session cookie) -> the
    data, or on to a signed url on a third host. One login for the whole mount; the cookie lands in
    --cookie-jar in Netscape format; no credential reaches another host."""
    world.data.files["refs.json"] = json.dumps(world.refs()).encode()
    m = mount(f"{world.data.url}/refs.json", *world.mount_args(), "--http-client", client, env=world.env())
    read_all(m.path, world)
    stats = m.stats()["logins"]
    assert stats["logins"] == {world.login.netloc: 1}, stats
    assert world.login.logins == 1 and stats["login_failures"] == {}
    assert stats["bearer_requests"][world.bearer.netloc] >= 1
    jar = (world.dir + "/urs_cookies")
    lines = [line for line in open(jar).read().splitlines() if "edl_session" in line]
    assert len(lines) == 1 and lines[0].split("\t")[:2] == ["#HttpOnly_127.0.0.3", "FALSE"], lines  # host-only
    assert oct(os.stat(jar).st_mode & 0o777) == "0o600"
    world.assert_credentials_stayed_home()
    assert world.signed.log and PASSWORD not in m.log()


def test_a_kept_cookie_needs_no_login_and_a_new_mount_reuses_it(world, mount):
    """NASA's ~/.urs_cookies: a mount that finds a live session cookie in --cookie-jar logs in no more."""
    m = mount(world.refs(), *world.mount_args(), env=world.env())
    read_all(m.path, world)
    m.stop()
    assert world.login.logins == 1
    m = mount(world.refs(), *world.mount_args(), env=world.env())
    read_all(m.path, world)
    assert world.login.logins == 1 and m.stats()["logins"]["logins"] == {}


def test_a_session_the_data_host_forgot_logs_in_again(world, mount):
    """A data host whose session ended (its cookie still in the jar) sends the read to the login host
    again: refmount logs in again and the read succeeds."""
    world.data.session_lifetime = 1.5
    m = mount(world.refs(), *world.mount_args(), env=world.env())
    assert (m.path / "cookie/a").read_bytes() == world.files["a.bin"]
    time.sleep(2)
    assert (m.path / "signed/b").read_bytes() == world.files["signed/b.bin"]
    assert m.stats()["logins"]["logins"] == {world.login.netloc: 2}
    world.assert_credentials_stayed_home()


def test_a_wrong_password_gives_eacces_and_one_clear_line(tmp_path, mount):
    """The read gets EACCES (not EIO); the log says once which host refused what (the netrc entry
    and its login name), never the password."""
    world = World(str(tmp_path), object_size=64 << 10, password="wrong password")
    try:
        m = mount(world.refs(), *world.mount_args(), env=world.env())
        with pytest.raises(PermissionError) as caught:
            (m.path / "cookie/a").read_bytes()
        assert caught.value.errno == errno.EACCES
        lines = [line for line in m.log().splitlines() if "login refused" in line]
        assert len(lines) == 1, m.log()
        assert world.login.netloc in lines[0] and f"login {USER!r}" in lines[0] and world.netrc in lines[0], lines
        assert "wrong password" not in m.log() and "HTTP 401" in lines[0]
        assert m.stats()["logins"]["login_failures"] == {world.login.netloc: 1}
        world.assert_credentials_stayed_home()
    finally:
        world.close()


def test_a_reference_file_behind_a_refused_login_fails_the_mount_in_one_line(tmp_path):
    """At mount time: one line naming the reference file, the login host and the missing netrc entry;
    non-zero exit, no traceback."""
    world = World(str(tmp_path), object_size=4096)
    try:
        world.data.files["refs.json"] = json.dumps(world.refs()).encode()
        (tmp_path / "mnt").mkdir()
        empty = tmp_path / "empty-netrc"
        empty.write_text("machine elsewhere.example login bob password x\n")
        empty.chmod(0o600)
        # (the redirect to the login host is followed with or without --allow-cross-host-redirects: it
        # carries no credential, and the chain began on loopback; the login host then says 401)
        says = f"HTTP 401 from {world.login.netloc}; sent no credentials (no entry for 127.0.0.2 in {empty})"
        for flag in ([], ["--allow-cross-host-redirects"]):
            err = refusal_line(f"{world.data.url}/refs.json", tmp_path / "mnt", *flag,
                                env={**os.environ, "NETRC": str(empty)})
            assert "refs.json" in err and world.login.netloc in err and says in err, err
    finally:
        world.close()


def test_a_rotated_bearer_token_is_reread_and_a_revoked_one_gives_eacces(world, mount):
    """--bearer-token HOST=FILE: the token goes to that host only, never on the command line or in
    the log; a new token in the file is used at once; a revoked one is EACCES with a line saying so."""
    world.bearer_files["d.bin"] = world.bearer_files["c.bin"][::-1]
    world.bearer_files["e.bin"] = world.bearer_files["c.bin"][::2]
    refs = world.refs()
    for name in ("d", "e"):
        refs["refs"][f"bearer/{name}"] = [f"{world.bearer.url}/{name}.bin", 0, len(world.bearer_files[f"{name}.bin"])]
    m = mount(refs, *world.mount_args(), env=world.env())
    first = open(world.token_file).read().strip()
    assert (m.path / "bearer/c").read_bytes() == world.bearer_files["c.bin"]
    second = world.rotate_token()  # rotated while mounted (the old one revoked): the file is read again
    assert (m.path / "bearer/d").read_bytes() == world.bearer_files["d.bin"]
    world.login.tokens.clear()  # revoked, and no new one
    with pytest.raises(PermissionError):
        (m.path / "bearer/e").read_bytes()
    lines = [line for line in m.log().splitlines() if "login refused" in line]
    assert len(lines) == 1 and "bearer token" in lines[0] and "expired or revoked" in lines[0], m.log()
    cmdline = open(f"/proc/{m.proc.pid}/cmdline", "rb").read()
    for token in (first, second):
        assert token.encode() not in cmdline and token not in m.log()
    world.assert_credentials_stayed_home()


def test_temporary_s3_credentials_refresh_during_reads_with_none_failed(tmp_path, mount, moto):
    """One mount, every way in: the login's cookie, a signed url on a third host, a bearer token, and
    s3:// signed with temporary credentials from the endpoint behind the login, which expire after
    20 s and are refreshed (at half-life) while a read loop runs: 0 failed reads, S3 never sees an
    expired or unknown session token, and no credential reaches another host. (5 minutes: bench/bench_edl.py.)"""
    world = World(str(tmp_path), moto_url=moto, object_size=4 << 20, credentials_lifetime=20)
    try:
        m = mount(world.refs(), *world.mount_args(), "--cache-size", "4M", "--block-size", "64K",
                  "--no-prefetch", env=world.env())
        counts = read_loop(m.path, world, seconds=32)
        assert counts["failed"] == 0 and counts["wrong"] == 0, counts
        stats = m.stats()["logins"]
        assert stats["s3_credential_refreshes"][world.data.netloc] >= 3, stats
        assert world.data.credentials_issued == stats["s3_credential_refreshes"][world.data.netloc]
        assert world.gate.refused == [] and world.gate.passed >= counts["reads"] // 8, (world.gate.refused, counts)
        assert stats["logins"] == {world.login.netloc: 1}, stats  # (parallel first reads wait for one login)
        world.assert_credentials_stayed_home()
    finally:
        world.close()


def test_the_cookie_jar_reads_curls_file_and_scopes_cookies_as_browsers_do(tmp_path):
    """A Netscape cookie file as curl -c writes it (#HttpOnly_ lines, session cookies with expiry 0,
    domain and host-only cookies, Secure, a path, an expired one): each cookie goes only where a
    browser would send it, and is written back in the same format."""
    from refmount.fetch.cookies import CookieJar

    later = int(time.time()) + 3600
    path = tmp_path / "urs_cookies"
    path.write_text("\n".join([
        "# Netscape HTTP Cookie File",
        f"#HttpOnly_urs.example.gov\tFALSE\t/\tTRUE\t{later}\turs_session\tU1",
        ".daac.example.gov\tTRUE\t/\tFALSE\t0\tdaac_wide\tD1",
        f"data.daac.example.gov\tFALSE\t/protected\tFALSE\t{later}\tnarrow\tN1",
        f"data.daac.example.gov\tFALSE\t/\tFALSE\t{int(time.time()) - 10}\tstale\tS1", ""]))
    jar = CookieJar(str(path))

    def names(url):
        return sorted(jar.names_for(url))

    assert names("https://urs.example.gov/oauth/authorize") == ["urs_session"]
    assert names("http://urs.example.gov/oauth/authorize") == []  # Secure: https only
    assert names("https://sub.urs.example.gov/") == []  # host-only
    assert names("https://data.daac.example.gov/protected/x.nc") == ["daac_wide", "narrow"]
    assert names("https://data.daac.example.gov/other/x.nc") == ["daac_wide"]  # path
    assert names("https://daac.example.gov.evil.example/") == [] and names("https://example.gov/") == []
    jar.take("https://data.daac.example.gov/protected/x.nc",
             ["fresh=F1; Path=/; HttpOnly", "wide=W; Domain=example.gov; Path=/"])  # (a parent domain: allowed)
    jar.take("https://data.daac.example.gov/", ["bad=B; Domain=other.example; Path=/"])  # another site: refused
    assert "bad" not in names("https://other.example/") and "fresh" in names("https://data.daac.example.gov/")
    assert "fresh" not in names("https://daac.example.gov/")  # set without Domain: host-only
    written = path.read_text()
    assert "#HttpOnly_data.daac.example.gov\tFALSE\t/\tFALSE\t0\tfresh\tF1" in written
    assert "stale" not in written and ".daac.example.gov\tTRUE\t/\tFALSE\t0\tdaac_wide\tD1" in written
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = CookieJar(str(path))
    assert sorted(again.names_for("https://data.daac.example.gov/protected/")) == ["daac_wide", "fresh", "narrow", "wide"]


def test_bearer_tokens_come_from_options_and_the_toml_config(tmp_path):
    """--bearer-token HOST=FILE (repeatable, comma-separated) and `bearer-token` in the TOML config
    (a list, or a table host = file); a bad value is one line naming the option."""
    from refmount.cli import build_parser, config_to_argv, options_from_args

    config = tmp_path / "m.toml"
    config.write_text('refs = "r.json"\nmountpoint = "/mnt/x"\ncookie-jar = "/home/u/.urs_cookies"\n'
                      'bearer-token = {"urs.earthdata.nasa.gov" = "/run/edl-token", "b.example:8443" = "/run/b"}\n'
                      's3-credentials-url = "https://data.daac.example/s3credentials"\n')
    options, positionals = config_to_argv(str(config), "mount")
    opts = options_from_args(build_parser().parse_args(["mount", *options, "--bearer-token", "c.example=/t/c,d.example=/t/d",
                                                        *positionals]))
    assert opts.bearer_tokens == {"urs.earthdata.nasa.gov": "/run/edl-token", "b.example:8443": "/run/b",
                                  "c.example": "/t/c", "d.example": "/t/d"}
    assert opts.cookie_jar == "/home/u/.urs_cookies"
    assert opts.s3_credentials_url == "https://data.daac.example/s3credentials"
    config.write_text('refs = "r.json"\nmountpoint = "/mnt/x"\nbearer-token = ["a.example=/t/a", "b.example=/t/b"]\n')
    options, positionals = config_to_argv(str(config), "mount")
    opts = options_from_args(build_parser().parse_args(["mount", *options, *positionals]))
    assert opts.bearer_tokens == {"a.example": "/t/a", "b.example": "/t/b"}
    (tmp_path / "mnt").mkdir()
    bad = run_refmount("mount", "--bearer-token", "just-a-token-value", "r.json", str(tmp_path / "mnt"))
    assert bad.returncode == 2 and "--bearer-token" in bad.stderr and "HOST=FILE" in bad.stderr
    assert "just-a-token-value" in bad.stderr  # (it is not a token: a token is never an option's value)
    (tmp_path / "r.json").write_text('{"version": 1, "refs": {}}')
    missing = run_refmount("mount", "--bearer-token", f"a.example={tmp_path}/none", str(tmp_path / "r.json"),
                           str(tmp_path / "mnt"))
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert "--bearer-token a.example" in missing.stderr and "No such file" in missing.stderr, missing.stderr
    both = run_refmount("mount", "--s3-credentials-url", "https://daac.example/s3credentials", "--remote-options",
                        '{"anon": true}', str(tmp_path / "r.json"), str(tmp_path / "mnt"))
    assert both.returncode == 1 and "--s3-credentials-url cannot be used with --remote-options anon" in both.stderr


def test_netrc_default_and_other_entries_never_follow_a_redirect(tmp_path):
    """netrc's `default` goes only to the host the url names, never to a host reached by a redirect; a
    login host gets its own entry only, and nothing goes over plain http from an https origin."""
    from refmount.fetch.auth import Logins

    netrc = tmp_path / "netrc"
    netrc.write_text("machine login.example login alice password A\ndefault login anyone password D\n")
    netrc.chmod(0o600)
    logins = Logins(netrc_path=str(netrc))
    trail = logins.trail("https://data.example/x.nc")
    assert trail.headers("https://data.example/x.nc")["Authorization"] == "Basic YW55b25lOkQ="  # default: the url's own host
    assert trail.headers("https://login.example/oauth/authorize")["Authorization"] == "Basic YWxpY2U6QQ=="
    assert trail.headers("https://bucket.s3.example/x.nc?X-Amz-Signature=s") == {}  # no default after a redirect
    assert trail.headers("http://login.example/oauth/authorize") == {}  # https origin: nothing over http
    assert trail.redirect_refused("https://data.example/x", "https://login.example/oauth/authorize") is None
    assert trail.redirect_refused("https://login.example/o", "https://data.example/x?code=1") is None  # back home
    # another host: followed, carrying nothing (above), on public addresses only (a guarded hop)
    assert trail.redirect_refused("https://data.example/x", "https://bucket.s3.example/x") is None
    assert trail.guards("https://bucket.s3.example/x") == "bucket.s3.example"
    assert trail.guards("https://login.example/oauth/authorize") is None  # (a login host of the user's)
    assert logins.trail("http://data.example/x").headers("http://login.example/a")["Authorization"]  # http origin


def test_s3_credentials_answers_are_read_as_nasa_writes_them():
    """NASA's `expiration` ("2026-11-28 04:10:00+00:00"), ISO with Z; a missing field or a login page
    is one line naming the url, never the secret."""
    from refmount.errors import LoginFailed
    from refmount.fetch.s3creds import parse_credentials

    url = "https://data.daac.example/s3credentials"
    body = {"accessKeyId": "ASIAX", "secretAccessKey": "very-secret", "sessionToken": "tok",
            "expiration": "2026-11-28 04:10:00+00:00"}
    assert parse_credentials(url, json.dumps(body).encode(), 1).expires == 1795839000.0
    assert parse_credentials(url, json.dumps({**body, "expiration": "2026-11-28T04:10:00Z"}).encode(), 1).expires \
        == 1795839000.0
    for bad, says in ((b"<html>Earthdata Login</html>", "did not answer JSON (a login page?)"),
                      (json.dumps({**body, "sessionToken": ""}).encode(), "the answer lacks sessionToken"),
                      (json.dumps({**body, "expiration": "soon"}).encode(), "expiration 'soon' is not a date")):
        with pytest.raises(LoginFailed) as caught:
            parse_credentials(url, bad, 1)
        assert says in str(caught.value) and url in str(caught.value) and "very-secret" not in str(caught.value)
