"""Ranged GETs received by the standard library's http.client in worker threads, straight into blocks.

The aiohttp path copies each body several times (socket chunks, stream buffer, joined pieces) and
runs Python per chunk on the asyncio thread. Here a worker thread sends the request on a kept-alive
connection and `readinto`s the body into one fresh buffer per cache block: http.client hands a
Content-Length body to the socket's recv_into, which releases the GIL, so the bytes are copied once
(kernel -> block) while the trio thread serves FUSE on the other core.

Only the plain case is handled here: `accept` (the HTTP backend's checks) looks at the status and
headers and says how many body bytes to read, raises for a refused answer (an encoded body, a wrong
Content-Range), or returns None to hand the request back to the aiohttp path (redirects, a 200 from
a server that ignores Range, chunked bodies). Retries, time limits and validator checks stay in the
backend; `Request.abort` (on cancellation or timeout) shuts the socket, so the blocked thread
returns at once. The blocks are bytearrays: nothing writes into a cached block.
"""

from __future__ import annotations

import http.client
import queue
import socket
import ssl
import threading

from refmount.fetch.pieces import piece_sizes


class ShortBody(Exception):
    """The body ended before its Content-Length."""


class Origin:
    """A pool of idle keep-alive connections to one scheme://host:port."""

    def __init__(self, scheme: str, host: str, port: int | None, *, ssl_context, connect_timeout: float,
                 stall_timeout: float) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        self.ssl_context = ssl_context
        self.connect_timeout, self.stall_timeout = connect_timeout, stall_timeout
        self._idle: queue.LifoQueue = queue.LifoQueue()

    def take(self) -> http.client.HTTPConnection | None:
        """An idle connection, or None."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return None

    def connect(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.connect_timeout,
                                               context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        conn.connect()
        conn.sock.settimeout(self.stall_timeout)  # from now on: seconds without a byte
        return conn

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        self._idle.put(conn)

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


class Request:
    """One ranged GET; `run` blocks in a worker thread, `abort` may be called from any thread."""

    def __init__(self, origin: Origin, target: str, headers: dict) -> None:
        self.origin, self.target, self.headers = origin, target, headers
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None  # the connection in use
        self._sock: socket.socket | None = None  # its socket (http.client drops conn.sock on Connection: close)
        self._aborted = False

    def abort(self) -> None:
        """Make the blocked `run` fail now (its connection is never reused)."""
        with self._lock:
            self._aborted = True
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self, start: int, piece: int, accept) -> list[bytearray] | None:
        """The body as pieces split at multiples of `piece` (from offset `start`), after
        `accept(response)` gave its length; None (connection closed, body unread) when accept says
        the aiohttp path must take the request."""
        try:
            resp = self._send_on(self.origin.take())
            length = accept(resp)
            if length is None:
                return None
            pieces = _read_body(resp, start, length, piece)
            with self._lock:
                if not self._aborted and not resp.will_close:
                    self.origin.give_back(self._conn)
                    self._conn = self._sock = None
            return pieces
        finally:
            with self._lock:
                conn, self._conn, self._sock = self._conn, None, None
            if conn is not None:
                conn.close()

    def _send_on(self, idle: http.client.HTTPConnection | None) -> http.client.HTTPResponse:
        if idle is not None:
            try:
                return self._send(idle)
            except (ConnectionError, ssl.SSLEOFError):  # RemoteDisconnected is one too
                idle.close()  # the server closed it while it was idle: ask once more on a new one
        return self._send(self.origin.connect())

    def _send(self, conn: http.client.HTTPConnection) -> http.client.HTTPResponse:
        with self._lock:  # from now on `abort` shuts this connection
            self._conn, self._sock = conn, conn.sock
            aborted = self._aborted
        if aborted:
            raise ConnectionAbortedError("request cancelled")
        conn.request("GET", self.target, headers=self.headers)
        return conn.getresponse()


def _read_body(resp: http.client.HTTPResponse, start: int, length: int, piece: int) -> list[bytearray]:
    pieces = []
    for size in piece_sizes(start, start + length, piece):
        block = bytearray(size)
        view = memoryview(block)
        got = 0
        while got < size:
            n = resp.readinto(view[got:])
            if not n:
                raise ShortBody(f"body ended after {sum(map(len, pieces)) + got} of {length} bytes")
            got += n
        pieces.append(block)
    return pieces
