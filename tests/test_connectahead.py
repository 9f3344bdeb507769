"""refmount/connectahead.py: a mount's first plain-http connection, opened as its daemon starts and
taken by the fetch code's first connection to that origin (fetch/direct.py), over real loopback sockets."""

from __future__ import annotations

import os
import socket

import pytest

from refmount import connectahead
from refmount.fetch import direct


@pytest.fixture
def listener():
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        server.settimeout(30)
        yield server


@pytest.fixture(autouse=True)
def no_proxy_and_nothing_ahead(monkeypatch):
    for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    connectahead._ahead.clear()
    yield
    for connecting in connectahead._ahead.values():
        connecting.done.wait(30)
        if connecting.sock is not None:
            connecting.sock.close()
    connectahead._ahead.clear()


def accepted_none(server) -> bool:
    server.settimeout(0.3)
    try:
        server.accept()[0].close()
    except TimeoutError:
        return True
    return False


def test_an_http_glob_connects_once_and_is_taken_once(listener):
    port = listener.getsockname()[1]
    connectahead.connect_ahead(f"http://127.0.0.1:{port}/data/*.grib2")
    connectahead.connect_ahead(f"http://127.0.0.1:{port}/data/*.grib2")  # (one connection an origin)
    peer, _ = listener.accept()
    with peer:
        sock = connectahead.taken("127.0.0.1", port, timeout=30)
        with sock:
            assert sock.getsockname() == peer.getpeername()
        assert connectahead.taken("127.0.0.1", port, timeout=30) is None
        assert accepted_none(listener)


@pytest.mark.parametrize("url", ["https://127.0.0.1:{port}/data/*.nc", "http://127.0.0.1:{port}/data/a.nc",
                                 "http://user:pw@127.0.0.1:{port}/data/*.nc", "http://127.0.0.1:{port}/refs.json"])
def test_no_connection_ahead_but_for_a_plain_http_glob(listener, url):
    port = listener.getsockname()[1]
    connectahead.connect_ahead(url.format(port=port))
    assert connectahead.taken("127.0.0.1", port, timeout=30) is None
    assert accepted_none(listener)


def test_no_connection_ahead_with_a_proxy_variable(listener, monkeypatch):
    """(a proxy's route is the fetch code's to work out: the direct path is not taken then)"""
    port = listener.getsockname()[1]
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    connectahead.connect_ahead(f"http://127.0.0.1:{port}/data/*.nc")
    assert connectahead.taken("127.0.0.1", port, timeout=30) is None
    assert accepted_none(listener)


def test_a_failed_connect_ahead_is_the_takers_error():
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    connectahead.connect_ahead(f"http://127.0.0.1:{port}/data/*.nc")
    with pytest.raises(ConnectionRefusedError):
        connectahead.taken("127.0.0.1", port, timeout=30)


def origin(port: int, guard=None) -> direct.Origin:
    return direct.Origin("http", "127.0.0.1", port, ssl_context=None, connect_timeout=30, stall_timeout=30,
                         max_idle=0, guard=guard)


def test_the_first_plain_connection_to_the_origin_is_the_one_opened_ahead(listener):
    port = listener.getsockname()[1]
    connectahead.connect_ahead(f"http://127.0.0.1:{port}/data/*.nc")
    peer, _ = listener.accept()
    with peer:
        conn = origin(port).connect()
        try:
            assert conn.sock.getsockname() == peer.getpeername()
            assert conn.sock.gettimeout() == 30  # (set up as one of its own: the stall timeout)
            assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert accepted_none(listener)
            conn.close()
            conn.connect()  # (http.client's own reconnect: a new connection, not the one taken)
            with listener.accept()[0] as again:
                assert conn.sock.getsockname() == again.getpeername()
        finally:
            conn.close()
        second = origin(port).connect()  # (taken once: the next one connects)
        with listener.accept()[0]:
            second.close()


def test_a_guarded_origin_does_not_take_the_connection_opened_ahead(listener):
    """(its addresses are checked as it connects: addresses.py)"""
    from refmount.fetch.addresses import InternalAddress

    port = listener.getsockname()[1]
    connectahead.connect_ahead(f"http://127.0.0.1:{port}/data/*.nc")
    with listener.accept()[0]:
        with pytest.raises(InternalAddress):
            origin(port, guard=lambda: ("127.0.0.1", "a document from a public address named it")).connect()
        ahead = connectahead.taken("127.0.0.1", port, timeout=30)  # (still there: not taken)
        assert ahead is not None
        ahead.close()
