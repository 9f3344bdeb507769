"""A mount's first connection, opened as its daemon starts (fuse/early.py) and before any of the fetch
code is imported (its package imports trio: 0.1 s and more): the TCP handshake's round trip passes
while the daemon imports, and the first plain-http connection the fetch code makes to that origin
(fetch/direct.py `Origin.connect`: the listing's first index page) is this one, already open.

Only for an http:// glob (whose first index page fuse/early.py asks ahead: refs/scan/sources.py
`ask_first_page`), plain http, no credentials in the url, no *_PROXY variable (a proxy's route is
fetch/http.py's to work out), and taken at most once; a connection nobody takes stays idle until the
server closes it."""

from __future__ import annotations

import os
import socket
import threading
from urllib.parse import urlsplit

_CONNECT_TIMEOUT = 10.0  # the ahead connect's own limit; whoever takes it waits its own connect timeout
_ahead: dict[tuple[str, int], _Connecting] = {}
_lock = threading.Lock()


class _Connecting:
    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.sock: socket.socket | None = None
        self.error: OSError | None = None
        self.abandoned = False  # (its taker stopped waiting: a late socket is closed)
        threading.Thread(target=self._run, args=(host, port), name="refmount-connect-ahead", daemon=True).start()

    def _run(self, host: str, port: int) -> None:
        try:
            sock = socket.create_connection((host, port), _CONNECT_TIMEOUT)
        except OSError as e:
            self.error = e
        else:
            with _lock:
                if self.abandoned:
                    sock.close()
                else:
                    self.sock = sock
        finally:
            self.done.set()


def connect_ahead(url: str) -> None:
    """Begin a connection to `url`'s origin, in a thread, for `taken` (see the module's doc). (A glob as
    sources.has_glob has it on http: "*" or "[" in the path.)"""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 80
    except ValueError:  # (a bad port: the listing says so)
        return
    if parts.scheme != "http" or not host or "@" in parts.netloc or not any(c in parts.path for c in "*[") \
            or any(name.lower().endswith("_proxy") for name in os.environ):
        return
    with _lock:
        if (host, port) not in _ahead:
            _ahead[host, port] = _Connecting(host, port)


def taken(host: str, port: int, timeout: float) -> socket.socket | None:
    """The connection begun ahead to host:port (plain http), taken once: its socket when its connect
    succeeds within `timeout` seconds, its connect's error raised (TimeoutError past `timeout`), or
    None when none was begun."""
    with _lock:
        connecting = _ahead.pop((host.lower(), port), None) if _ahead else None
    if connecting is None:
        return None
    if not connecting.done.wait(timeout):
        with _lock:
            connecting.abandoned = True
            late = connecting.sock
        if late is not None:  # (it came just now)
            return late
        raise TimeoutError("timed out")  # (as the connect it stands for would have)
    if connecting.error is not None:
        raise connecting.error
    return connecting.sock
