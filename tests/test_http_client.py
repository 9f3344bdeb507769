"""The http(s) receive paths of `Fetcher` without FUSE: `--http-client stdlib` (http.client in worker
threads for plain 206 answers, refmount/fetch/direct.py) and `aiohttp`, against the loopback Range
server. Each case runs on both paths: same bytes, same errors."""

from __future__ import annotations

import random
import time

import pytest
import trio

from refmount.errors import FetchError
from refmount.fetch import Fetcher, RetryPolicy

SIZE = 3 << 20
CLIENTS = ["stdlib", "aiohttp"]


@pytest.fixture
def blob(server):
    data = random.Random(5).randbytes(SIZE)
    (server.root / "blob.bin").write_bytes(data)
    return data


def read(client: str, url: str, start: int, end: int, piece: int = 0, **policy) -> list:
    async def main():
        fetcher = Fetcher(policy=RetryPolicy(**policy), http_client=client)
        try:
            return [bytes(p) for p in await fetcher.read(url, start, end, piece)]
        finally:
            await fetcher.aclose()

    return trio.run(main)


def aiohttp_requests(server) -> int:
    return sum("aiohttp" in h.get("user-agent", "") for h in server.stats["headers"])


@pytest.mark.parametrize("client", CLIENTS)
def test_ranges_arrive_whole_and_split_at_pieces(server, blob, client):
    url = server.url_for("blob.bin")
    pieces = read(client, url, 100, (2 << 20) + 7, piece=1 << 20)
    assert [len(p) for p in pieces] == [(1 << 20) - 100, 1 << 20, 7]
    assert b"".join(pieces) == blob[100:(2 << 20) + 7]
    assert (aiohttp_requests(server) == 0) == (client == "stdlib")
    assert read(client, url, SIZE - (1 << 20), SIZE + 100) == [blob[-(1 << 20):]]  # clipped at the end
    assert read(client, url, 10, 20) == [blob[10:20]]  # a small range: through aiohttp on both paths


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("kind", ["503", "reset", "truncate", "bad_range"])
def test_faults_are_retried_to_the_right_bytes(server, blob, client, kind):
    server.set_faults(rate=0.5, kinds=(kind,), seed=3)
    url = server.url_for("blob.bin")
    for start in range(0, SIZE, 512 << 10):
        assert b"".join(read(client, url, start, start + (512 << 10), backoff_base=0.001)) == \
            blob[start:start + (512 << 10)]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_redirect_is_followed_through_aiohttp(server, blob, client):
    server.redirects["/moved.bin"] = "/blob.bin"
    assert read(client, server.url_for("moved.bin"), 10, 1 << 20) == [blob[10:1 << 20]]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_server_ignoring_range_gives_the_right_slice(server, blob, client):
    server.ignore_range = True
    url = server.url_for("blob.bin")
    for start in (5, 1 << 20, 5):
        assert read(client, url, start, start + (600 << 10)) == [blob[start:start + (600 << 10)]]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stalled_body_fails_within_the_read_timeout(server, blob, client):
    server.stall_paths.add("/blob.bin")
    t0 = time.monotonic()
    with pytest.raises(FetchError):
        read(client, server.url_for("blob.bin"), 0, 1 << 20, read_timeout=1.0, stall_timeout=30)
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("client", CLIENTS)
def test_a_cancelled_read_lets_go_of_its_connection_at_once(server, blob, client):
    """A trio cancel aborts the blocked request (its socket is shut); the next read works."""
    url = server.url_for("blob.bin")

    async def main():
        fetcher = Fetcher(http_client=client)
        try:
            server.stall_paths.add("/blob.bin")
            t0 = time.monotonic()
            with trio.move_on_after(0.3):
                await fetcher.read(url, 0, 1 << 20)
            assert time.monotonic() - t0 < 1.5
            server.stall_paths.clear()
            assert b"".join(await fetcher.read(url, 0, 1 << 20)) == blob[:1 << 20]
        finally:
            await fetcher.aclose()

    trio.run(main)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_connection_the_server_closed_while_idle_is_replaced_without_a_retry(tmp_path, client):
    """Servers close kept-alive connections after a while (nginx 75 s, object stores sooner): the
    next range goes on a new connection at once, not after a failed attempt and a back-off."""
    from tests.support.rangeserver import RangeServer

    data = random.Random(6).randbytes(SIZE)
    (tmp_path / "blob.bin").write_bytes(data)
    with RangeServer(tmp_path, keepalive_timeout=0.2) as srv:
        url = srv.url_for("blob.bin")

        async def main():
            fetcher = Fetcher(policy=RetryPolicy(backoff_base=5.0), http_client=client)
            try:
                first = b"".join(map(bytes, await fetcher.read(url, 0, 1 << 20)))
                await trio.sleep(0.6)  # the server has closed the idle connection by now
                began = time.monotonic()
                second = b"".join(map(bytes, await fetcher.read(url, 1 << 20, 2 << 20)))
                return first + second, time.monotonic() - began, fetcher.stats.retries
            finally:
                await fetcher.aclose()

        got, seconds, retries = trio.run(main)
    assert got == data[: 2 << 20]
    assert retries == 0 and seconds < 2.5  # a back-off would take 5 s
