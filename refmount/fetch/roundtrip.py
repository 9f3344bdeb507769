"""The round trip to each host as the kernel measured it on the first connection the mount made
there (TCP_INFO's smoothed RTT), known before the first read-ahead: the pacer (cache/pacer.py)
sizes a host's opening from it. Loopback measures 6-35 µs, a long link its own 20-80 ms; a
request's own time would add this machine's load to it (a loaded loopback answers in 5-30 ms).

Written from the asyncio thread (fetch/http.py) and the worker threads (fetch/direct.py), read on
the trio thread: one dict, first figure per host kept."""

from __future__ import annotations

import socket
import struct

from refmount.fetch.stats import host_of

_TCPI_RTT = 68  # offset of struct tcp_info's tcpi_rtt (u32, microseconds) on Linux
_seen: dict[str, float] = {}


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


def note(url: str, sock) -> None:
    """The first connection to `url`'s host (direct, not through a proxy: a proxy's round trip is
    not the origin's) answered on `sock`."""
    host = host_of(url)
    if host not in _seen:
        rtt = tcp_rtt(sock)
        if rtt is not None:
            _seen[host] = rtt


def of(url: str) -> float | None:
    """The round trip noted for `url`'s host, or None."""
    return _seen.get(host_of(url)) if _seen else None
