"""The round trip to each host as the kernel measured it on the first connection the mount made
there (TCP_INFO's smoothed RTT), known before the first read-ahead: the pacer (cache/pacer.py)
sizes a host's opening from it. Loopback measures 6-35 µs, a long link its own 20-80 ms; the
request's own time adds this machine's load (a loopback HEAD took 1, 1, 20 and 84 ms at load 4-5),
so it counts only when it is long.

Written from the asyncio thread (fetch/http.py `_request`: the size probe, or whatever asks first) or
a worker thread (the stdlib engine's size probe, `HttpBackend.size_direct`), read on the trio thread:
one dict, first figure per host kept. aiohttp's session hands over the sockets it opens through
TCPConnector's public `socket_factory` (`opening`): a response has let go of its connection by the
time a HEAD, or a GET whose body came with its headers, returns."""

from __future__ import annotations

import contextlib
import contextvars
import socket
import struct

from refmount.fetch.stats import host_of

_TCPI_RTT = 68  # offset of struct tcp_info's tcpi_rtt (u32, microseconds) on Linux
_LATE = 0.025  # seconds: a loopback server answers a HEAD in about 1 ms (up to ~20 ms at load 5)
_seen: dict[str, float] = {}
# The sockets opened for the request under way in this task (None: nobody is listening). The
# connector opens them in the request's task or its happy-eyeballs children, which share the list.
_opened: contextvars.ContextVar[list | None] = contextvars.ContextVar("roundtrip_opened", default=None)


def opening(addr_info) -> socket.socket:
    """aiohttp's TCPConnector `socket_factory`: the socket aiohappyeyeballs would make, kept for
    `opened_by` when a request is listening."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family=family, type=type_, proto=proto)
    opened = _opened.get()
    if opened is not None:
        opened.append(sock)
    return sock


@contextlib.contextmanager
def opened_by():
    """The sockets the connector opens in this task while inside: a list, newest last (the losers
    of a happy-eyeballs race are closed by then)."""
    opened: list = []
    token = _opened.set(opened)
    try:
        yield opened
    finally:
        _opened.reset(token)


def connected(opened: list):
    """The connected socket among `opened`, or None (none opened: the connection was reused)."""
    for sock in reversed(opened):
        if sock.fileno() != -1:
            return sock
    return None


def tcp_rtt(sock) -> float | None:
    """The kernel's smoothed round-trip time of a connected TCP socket in seconds, or None where
    it does not tell (not Linux, not TCP, closed)."""
    option = getattr(socket, "TCP_INFO", None)
    if sock is None or option is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, option, 104)
    except (OSError, AttributeError, TypeError):
        return None
    if len(info) < _TCPI_RTT + 4:
        return None
    rtt = struct.unpack_from("=I", info, _TCPI_RTT)[0]
    return rtt / 1e6 if rtt else None


def note(url: str, sock, answered: float) -> None:
    """The first request to `url`'s host (direct, not through a configured proxy) was answered on
    `sock`, its headers `answered` seconds after it was asked."""
    host = host_of(url)
    if host not in _seen:
        rtt = tcp_rtt(sock)
        if rtt is not None:
            # A first hop next door that answered late: an ssh tunnel or a TCP-terminating proxy may
            # stand for a far origin (80 ms behind bench/delayproxy.py: 0.78x on a cold 64 MB read
            # opened with 2), or this machine is loaded: either way, the answer's time.
            _seen[host] = rtt if answered < _LATE else max(rtt, answered)


def of(url: str) -> float | None:
    """The round trip noted for `url`'s host, or None."""
    return _seen.get(host_of(url)) if _seen else None
