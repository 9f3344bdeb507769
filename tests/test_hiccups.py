"""Failures that may pass are asked again later, not refused for the mount's life (fetch/retry.py `passing`,
the one decision of every client):

- what may pass and what does not, from errors real clients raise (aiohttp against a loopback server,
  a closed port, botocore against a dead endpoint);
- a lazily mounted glob on a server that goes down: the first lookup of a file not scanned yet fails in
  seconds (not after a --read-timeout of retries: 22 s), EIO for a while, and the file is scanned once the
  server is back;
- a scanner killed (SIGKILL, as the out-of-memory killer does) while it scans: EIO for a while, then the
  file is scanned again;
- a catalog's store item whose load runs past --load-timeout: EIO for a while, then loaded;
- an S3 listing at a --refresh (moto stopped): gives up in about a second, not botocore's and s3fs's retries.
"""

from __future__ import annotations

import contextvars
import errno
import os
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from refmount.fetch.retry import ASKED_AGAIN, Passing, passing, retry_under
from tests.support.daily import make_daily
from tests.support.rangeserver import RangeServer
from tests.test_archive import scans  # noqa: F401 (each test's scan store its own)
from tests.test_refresh import wait_for as waited_for

HANG = 10.0  # seconds a lookup that must not wait out the read retries may take at most (it took 22 s)


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> list[Path]:
    return make_daily(tmp_path_factory.mktemp("days"), 3, nlat=6, nlon=8)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str, m=None, timeout: float = 120.0):
    return waited_for(condition, what, m, timeout)


def lists(path: Path):
    """os.listdir(path), or the OSError it raised."""
    try:
        return os.listdir(path)
    except OSError as e:
        return e


def same_as_file(directory: Path, path: Path) -> None:
    import xarray as xr

    with xr.open_zarr(directory, consolidated=False) as got, xr.open_dataset(path) as want:
        np.testing.assert_array_equal(got["tas"].values, want["tas"].values)


# -- the decision, from real clients' errors -------------------------------------------------------------

def test_what_may_pass_and_what_does_not_from_real_clients(tmp_path):
    import aiohttp
    import asyncio

    from refmount.errors import LoginFailed, NotFound, RefmountError, Unavailable
    from refmount.fetch.addresses import InternalAddress

    (tmp_path / "f").write_bytes(b"x" * 10)

    async def status_error(url: str):
        async with aiohttp.ClientSession() as session:
            async with session.get(url) as resp:
                resp.raise_for_status()

    def raised(coro) -> BaseException:
        try:
            asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - what a real client raised is the subject
            return e
        raise AssertionError("nothing raised")

    with RangeServer(tmp_path) as server:
        for status in (503, 502, 504, 429, 500, 408):
            server.fail_paths = {"f": status}
            assert passing(raised(status_error(server.url_for("f")))) == f"HTTP {status}" + \
                {503: " Service Unavailable", 502: " Bad Gateway", 504: " Gateway Timeout", 429: " Too Many Requests",
                 500: " Internal Server Error", 408: " Request Timeout"}[status]
        for status in (404, 403, 401, 400, 410):
            server.fail_paths = {"f": status}
            assert passing(raised(status_error(server.url_for("f")))) is None, status
    refused = raised(status_error(f"http://127.0.0.1:{closed_port()}/f"))
    assert passing(refused) == "connection refused"
    for error in (ConnectionResetError(104, "Connection reset by peer"), TimeoutError(), BrokenPipeError(),
                  OSError(errno.EHOSTUNREACH, "No route to host"), socket.gaierror(-3, "Temporary failure"),
                  Passing("206 without a valid Content-Range"), Unavailable("x: gave up after 3 attempts")):
        assert passing(error) is not None, error
    for error in (FileNotFoundError("f"), ValueError("malformed"), NotFound("x: HTTP 404"), LoginFailed("x"),
                  RefmountError("a certificate"), InternalAddress("10.0.0.1 is internal"),
                  OSError(errno.EACCES, "Permission denied"), KeyError("k")):
        assert passing(error) is None, error


# -- a lazily mounted glob whose server goes down ----------------------------------------------------------

@pytest.mark.usefixtures("scans")
def test_a_lazy_file_on_a_server_that_is_down_fails_fast_and_is_scanned_when_it_is_back(mount, days, tmp_path):
    """@FILE of three http urls, mounted lazily; the server stops: the first lookup of a file not scanned yet
    is EIO in seconds (it waited out the read retries, 22 s), said once; lookups within its backoff are EIO
    without asking; the server back on its port, a later lookup scans it, equal to the file. A 503 of one
    file is the same."""
    www = tmp_path / "www"
    www.mkdir()
    for path in days:
        (www / path.name).write_bytes(path.read_bytes())
    first, second, third = (p.name for p in days)
    server = RangeServer(www).start()
    try:
        listing = tmp_path / "list.txt"
        listing.write_text("".join(server.url_for(name) + "\n" for name in (first, second, third)))
        m = mount(f"@{listing}")
        same_as_file(m.path / first, www / first)

        server.fail_paths = {third: 503}
        started = time.monotonic()
        failed = lists(m.path / third)
        assert isinstance(failed, OSError) and failed.errno == errno.EIO, failed
        assert time.monotonic() - started < HANG, m.log()

        port = server.port
        server.stop()
        started = time.monotonic()
        failed = lists(m.path / second)
        took = time.monotonic() - started
        assert isinstance(failed, OSError) and failed.errno == errno.EIO, failed
        assert took < HANG, f"{took:.1f} s\n{m.log()}"
        again = lists(m.path / second)  # (within its backoff: EIO at once, said once)
        assert isinstance(again, OSError) and again.errno == errno.EIO
        said = [line for line in m.log().splitlines() if f"dataset '{second}' cannot be had now" in line]
        assert len(said) == 1, m.log()

        server = RangeServer(www, port=port).start()
        server.fail_paths = {}
        wait_for(lambda: isinstance(lists(m.path / second), list), "the file scanned once the server is back", m)
        same_as_file(m.path / second, www / second)
        wait_for(lambda: isinstance(lists(m.path / third), list), "the file scanned once it answers", m)
        same_as_file(m.path / third, www / third)
        assert m.log().count("works again") == 2, m.log()
    finally:
        server.stop()


@pytest.mark.usefixtures("scans")
def test_a_lazy_file_that_answers_404_fails_at_once_and_one_that_answers_503_waits(mount, days, tmp_path):
    """The lazy root asks `passing` (the one decision): a file whose url answers 404 fails its lookup with the
    404 in the log, not "cannot be had now" and a backoff of its directory; a later lookup asks again. A 503
    is one that may pass: EIO for a while, said so, then scanned once it answers."""
    www = tmp_path / "www"
    www.mkdir()
    for path in days:
        (www / path.name).write_bytes(path.read_bytes())
    first, second, third = (p.name for p in days)
    with RangeServer(www) as server:
        listing = tmp_path / "list.txt"
        listing.write_text("".join(server.url_for(name) + "\n" for name in (first, second, third)))
        m = mount(f"@{listing}")
        same_as_file(m.path / first, www / first)

        server.fail_paths = {second: 404, third: 503}
        for name in (second, third):
            failed = lists(m.path / name)
            assert isinstance(failed, OSError) and failed.errno == errno.EIO, (name, failed)
        log = m.log()
        assert any(second in line and "404" in line for line in log.splitlines()), log
        assert f"dataset '{second}' cannot be had now" not in log, log
        assert f"dataset '{third}' cannot be had now" in log, log

        server.fail_paths = {}
        for name in (second, third):
            wait_for(lambda: isinstance(lists(m.path / name), list), f"{name} scanned once it answers", m)
            same_as_file(m.path / name, www / name)
        assert f"dataset '{second}' works again" not in m.log() and f"dataset '{third}' works again" in m.log()


# -- a scanner killed while it scans -----------------------------------------------------------------------

def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


def scanners(daemon: int) -> list[int]:
    """The daemon's scan workers: the children of its fork server (multiprocessing's)."""
    servers = [pid for pid in children(daemon) if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    return [pid for server in servers for pid in children(server)]


@pytest.mark.usefixtures("scans")
def test_a_scanner_killed_while_it_scans_leaves_its_file_eio_for_a_while_then_scanned(mount, days, tmp_path):
    """A lazily mounted glob: its one scanner, stopped (SIGSTOP) while idle, is handed the next file's scan and
    killed by PID (SIGKILL: what the out-of-memory killer sends); that lookup is EIO, said once, and the file
    is not refused for the mount's life: a lookup after the backoff scans it in a new scanner."""
    src = tmp_path / "src"
    src.mkdir()
    for path in days:
        (src / path.name).write_bytes(path.read_bytes())
    first, second = days[0].name, days[1].name
    m = mount(f"{src}/*.nc")
    same_as_file(m.path / first, src / first)
    worker = wait_for(lambda: scanners(m.proc.pid), "the scanner that scanned the first file", m)
    assert len(worker) == 1, worker
    os.kill(worker[0], signal.SIGSTOP)
    outcome: list = []
    lookup = threading.Thread(target=lambda: outcome.append(lists(m.path / second)))
    lookup.start()
    time.sleep(1.0)  # (the scan handed to it, or about to be: a kill before or after fails that scan alike)
    os.kill(worker[0], signal.SIGKILL)
    lookup.join(60)
    assert not lookup.is_alive(), m.log()
    assert isinstance(outcome[0], OSError) and outcome[0].errno == errno.EIO, outcome
    said = [line for line in m.log().splitlines() if f"dataset '{second}' cannot be had now" in line]
    assert len(said) == 1 and "was killed (SIGKILL" in said[0], m.log()
    assert "cannot be scanned" not in m.log() and "internal error" not in m.log(), m.log()
    wait_for(lambda: isinstance(lists(m.path / second), list), "the file scanned again after its backoff", m)
    same_as_file(m.path / second, src / second)
    assert "works again" in m.log()


# -- an S3 listing at a --refresh ----------------------------------------------------------------------------

def test_an_s3_listing_under_a_refreshs_policy_gives_up_in_seconds_and_may_pass():
    """moto's endpoint gone (a closed port): the listing a --refresh makes gives up under its policy, in
    seconds, as a failure that may pass; the same listing at mount keeps botocore's and s3fs's retries."""
    pytest.importorskip("s3fs")
    from refmount.errors import Unavailable
    from refmount.refs.scan.sources import list_sources

    options = {"endpoint_url": f"http://127.0.0.1:{closed_port()}", "key": "k", "secret": "s"}

    def listing():
        retry_under(ASKED_AGAIN)
        started = time.monotonic()
        with pytest.raises(Unavailable, match="cannot list 's3://bucket/data/'") as e:
            list_sources("s3://bucket/data/", options)
        return time.monotonic() - started, e.value

    took, error = contextvars.copy_context().run(listing)
    assert took < HANG and passing(error) is not None, took


def test_an_s3_listing_at_a_refresh_of_a_lazy_mount_fails_fast_and_works_again(mount, days, tmp_path):
    """A lazily mounted s3:// prefix on moto with --refresh 1s; moto stops: the refresh fails, said once; a
    new moto on the same port with a new file: the next refresh works again and the file's directory
    appears, equal to it."""
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    import json
    import subprocess
    import sys


    port = closed_port()
    endpoint = f"http://127.0.0.1:{port}"

    def moto():
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k", aws_secret_access_key="s",
                          region_name="us-east-1")
        return proc, s3

    proc, s3 = moto()
    try:
        s3.create_bucket(Bucket="bucket")
        for path in days[:2]:
            s3.put_object(Bucket="bucket", Key=f"data/{path.name}", Body=path.read_bytes())
        options = json.dumps({"endpoint_url": endpoint, "key": "k", "secret": "s"})
        m = mount("s3://bucket/data/", "--remote-options", options, "--refresh", "1s")
        assert sorted(os.listdir(m.path)) == sorted(p.name for p in days[:2])
        proc.terminate()
        proc.wait(30)
        wait_for(lambda: "failed; the mount keeps what it showed" in m.log(), "the failed refresh said", m,
                 timeout=30)
        time.sleep(2.5)  # (two more intervals fail, not said again)
        assert m.log().count("failed; the mount keeps what it showed") == 1, m.log()
        assert sorted(os.listdir(m.path)) == sorted(p.name for p in days[:2])
        proc, s3 = moto()  # (a new moto: empty)
        s3.create_bucket(Bucket="bucket")
        for path in days:
            s3.put_object(Bucket="bucket", Key=f"data/{path.name}", Body=path.read_bytes())
        wait_for(lambda: days[2].name in os.listdir(m.path), "the new file's directory appears", m)
        assert "works again" in m.log()
        same_as_file(m.path / days[2].name, days[2])
    finally:
        proc.terminate()
        proc.wait(30)
