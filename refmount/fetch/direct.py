"""The stdlib HTTP engine: ranged GETs sent and received by http.client in a worker thread, straight
into blocks.

The trio task that needs a range hands one `Request` to a worker thread and is woken once, when the
body is in (bridge.run_in_worker; no asyncio hop). The thread sends the request on a kept-alive
connection, lets http.client read the status and headers, and receives the body itself, one piece
per cache block, with the GIL released while the kernel copies it (kernel -> block, once), so the
trio thread serves FUSE meanwhile:
- plain http: one `MSG_WAITALL` receive per block, the socket in blocking mode (SO_RCVTIMEO bounds a
  stall): `recv_into` a buffer from `take` (a pool's reused block buffer) if given, else `recv`, where
  the kernel fills a new bytes object. (`bytearray(n)` + `recv_into` would zero the n bytes first
  with the GIL held, faulting in every fresh page while the FUSE thread waits for the GIL: 0.14 s
  of a 320 MB scan; only the block that starts with the bytes http.client buffered with the
  headers still goes that way. And each segment received would take the GIL back.)
- https: `readinto` buffers from `take`, or fresh bytearrays (TLS hands over one record at a time
  anyway).

Only the plain case is handled here: `accept` (the HTTP backend's checks) looks at the status and
headers and says how many body bytes to read, raises for a refused answer (an encoded body, a wrong
Content-Range), or returns None to hand the request to the general client, aiohttp (redirects, a
200 from a server that ignores Range, chunked bodies). Retries, time limits and validator checks
stay in the backend; `Request.abort` (on cancellation or timeout) shuts the socket, so the blocked
thread returns at once. Nothing writes into a block once it is returned.
"""

from __future__ import annotations

import http.client
import queue
import select
import socket
import ssl
import struct
import threading
import time

from refmount import connectahead
from refmount.fetch.pieces import piece_sizes


# Seconds a kept-alive connection may sit idle and still be used (both paths: this pool and aiohttp's
# keepalive_timeout). Beyond it the connection is closed, not tried: a NAT or
# firewall that dropped the idle flow without telling either end (AWS NAT 350 s, Azure 240 s) would
# swallow the request, and the read would wait --stall-timeout before asking again. (Go's http
# client keeps idle connections 90 s, nginx 75 s.)
IDLE_TIMEOUT = 60.0


class ShortBody(Exception):
    """The body ended before its Content-Length."""


class Origin:
    """A pool of idle keep-alive connections to one scheme://host:port (at most `max_idle`, each
    with the time it went idle; newest first)."""

    def __init__(self, scheme: str, host: str, port: int | None, *, ssl_context, connect_timeout: float,
                 stall_timeout: float, max_idle: int = 8, guard=None) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        # guard() -> (host, why) when each connection must reach public addresses only (addresses.py)
        self.guard = guard
        self.ssl_context = ssl_context
        self.connect_timeout, self.stall_timeout = connect_timeout, stall_timeout
        self.max_idle = max_idle
        self._idle: queue.LifoQueue = queue.LifoQueue()
        self._closed = False

    def start_warming(self) -> None:
        """Open connections until `max_idle` are idle, each in a thread, and return at once.
        The ranges that start later skip the handshake's round trip (two with TLS): on a long link a
        scan's parallel parts, which begin when the scan shows itself, start on open connections
        (at 80 ms a chunk-file scan went from 0.88-0.91 to 0.92-0.95 of 8 parallel curls). No
        request is sent; servers close connections left idle too long, and `Request` then simply
        takes a new one."""
        # all at once, each in a thread: opened one round trip after another, the last ones were
        # ready only after a scan had begun on cold connections (kernel TCP at 80 ms, bench/NOTES.md)
        for _ in range(self.max_idle - self._idle.qsize()):
            threading.Thread(target=self._open_one, name="refmount-connect", daemon=True).start()

    def _open_one(self) -> None:
        try:
            conn = self.connect()
        except Exception:  # noqa: BLE001 - the requests that need a connection report why there is none
            return
        if self._closed or self._idle.qsize() >= self.max_idle:
            conn.close()
        else:
            self._idle.put((conn, time.monotonic()))

    def take(self) -> http.client.HTTPConnection | None:
        """An idle connection that is still worth a request (`_worth_keeping`), or None; the others
        met on the way are closed."""
        while True:
            try:
                conn, since = self._idle.get_nowait()
            except queue.Empty:
                return None
            if _worth_keeping(conn, since, time.monotonic()):
                return conn
            conn.close()

    def sweep(self) -> None:
        """Close the idle connections `take` would close (idle too long, or closed by the server),
        without waiting for a request to this origin: one nobody asks again held its descriptor for
        the daemon's life (120 loopback origins read once, kept alive: 120 descriptors, for good)."""
        now = time.monotonic()
        with self._idle.mutex:  # (a LifoQueue's list, oldest first; each keeps its own idle time)
            idle = list(self._idle.queue)
            kept = [(conn, since) for conn, since in idle if _worth_keeping(conn, since, now)]
            self._idle.queue[:] = kept
        kept_ids = {id(conn) for conn, _ in kept}
        for conn, _ in idle:
            if id(conn) not in kept_ids:
                conn.close()

    def connect(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.connect_timeout,
                                               context=self.ssl_context)
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        guard = self.guard() if self.guard is not None else None
        if guard is None:
            ahead = connectahead.taken(self.host, self.port or 80, self.connect_timeout) \
                if self.scheme == "http" else None
            if ahead is not None:  # (opened as the daemon started: the first index page's)
                conn._create_connection = lambda *_args, **_kwargs: ahead
            try:
                conn.connect()
            finally:  # (once: a reconnect of this object makes a new connection)
                conn._create_connection = socket.create_connection
        else:  # (resolved once, each address checked, only those tried: addresses.connection)
            from refmount.fetch import addresses

            conn._create_connection = addresses.connection
            with addresses.guarded(*guard):
                conn.connect()
        conn.sock.settimeout(self.stall_timeout)  # from now on: seconds without a byte
        if not isinstance(conn.sock, ssl.SSLSocket):
            # a blocking receive of a body (_recv_body) waits at most half the stall timeout per call
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(self.stall_timeout / 2))
        return conn

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        """Keep a connection that served a request. With the pool full, the oldest idle one goes
        instead: this one's congestion window has grown, a connection opened ahead has not (closing
        the used one threw away its slow start on every scan's first parts)."""
        if self._closed:
            conn.close()
            return
        if self._idle.qsize() >= self.max_idle:
            with self._idle.mutex:  # (a LifoQueue's list: the oldest is first)
                oldest = self._idle.queue.pop(0) if self._idle.queue else None
            if oldest is not None:
                oldest[0].close()
        self._idle.put((conn, time.monotonic()))

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait()[0].close()
            except queue.Empty:
                return


class Request:
    """One ranged GET (or a page's GET, or a HEAD); `run` (`page`, `head`) blocks in a worker thread,
    `abort` may be called from any thread."""

    def __init__(self, origin: Origin, target: str, headers: dict, take=None) -> None:
        self.origin, self.target, self.headers = origin, target, headers
        self.take = take  # take(n) -> a writable buffer of n bytes to receive a piece into (cache/buffers.py)
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None  # the connection in use
        self._sock: socket.socket | None = None  # its socket (http.client drops conn.sock on Connection: close)
        self._aborted = False
        self.sent = False  # whether the request went out on a connection (the server may have seen it)
        self.method = "GET"

    @property
    def sock(self) -> socket.socket | None:
        """The socket of the connection in use (None before it is sent and after it is done)."""
        return self._sock

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

    def run(self, start: int, piece: int, accept) -> list | None:
        """The body as pieces split at multiples of `piece` (from offset `start`), after
        `accept(response)` gave its length; None (connection closed, body unread) when accept says
        the aiohttp path must take the request."""
        try:
            resp = self._send_on(self.origin.take())
            length = accept(resp)
            if length is None:
                return None
            if isinstance(self._sock, ssl.SSLSocket):
                pieces = _readinto_body(resp, start, length, piece, self.take)
            else:
                pieces = _recv_body(resp, self._sock, start, length, piece, self.origin.stall_timeout, self.take)
            self._give_back(resp)
            return pieces
        finally:
            self._close()

    def page(self, most: int, accept) -> tuple[str, bytes] | None:
        """(Content-Type, body) of a whole small answer (a page: its Content-Length or chunks, which
        http.client decodes), at most `most` bytes of it read, once `accept(response)` said True;
        None when it said False (the answer left unread). The connection is not kept."""
        try:
            resp = self._send_on(self.origin.take())
            if not accept(resp):
                return None
            return resp.headers.get("Content-Type", ""), resp.read(most)
        finally:
            self._close()

    def head(self, accept):
        """A HEAD: what `accept(response)` makes of its status and headers (None: the general path must
        ask). The connection goes back to the origin's pool (a HEAD's answer has no body)."""
        self.method = "HEAD"
        try:
            resp = self._send_on(self.origin.take())
            answer = accept(resp)
            resp.read()  # (nothing: http.client knows a HEAD's answer ends with its headers)
            sock = self._sock
            # a server that sent a body anyway: those bytes would be the next GET's answer on this
            # connection (the pool's check of an idle one skips TLS ones), so it is closed instead
            if sock is not None and not ((isinstance(sock, ssl.SSLSocket) and sock.pending()) or readable(sock)):
                self._give_back(resp)
            return answer
        finally:
            self._close()

    def _give_back(self, resp: http.client.HTTPResponse) -> None:
        """The connection, its answer read whole, goes back to the origin's pool (unless aborted or closing)."""
        with self._lock:
            if not self._aborted and not resp.will_close:
                self.origin.give_back(self._conn)
                self._conn = self._sock = None

    def _close(self) -> None:
        """Close the connection in use, if it was not given back."""
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
        self.sent = True
        conn.request(self.method, self.target, headers=self.headers)
        return conn.getresponse()


def _recv_body(resp: http.client.HTTPResponse, sock: socket.socket, start: int, length: int, piece: int,
               stall_timeout: float, take=None) -> list:
    """The body as pieces (see Request.run), received straight from the socket in blocking mode, one
    `MSG_WAITALL` receive per piece: into a buffer from `take` (the caches' pool: reused pages, no
    copy into the cache later), else into a new bytes object, or, for the piece that begins with
    what http.client buffered with the headers, into a bytearray after those bytes (joining bytes
    objects would hold that piece twice: 12-15 MiB more peak RSS with 64 streams of small parts)."""
    head = resp.fp.read1(min(length, 8192))
    if not head:
        raise ShortBody(f"body ended after 0 of {length} bytes")
    silence = _Silence(stall_timeout)
    pieces: list = []
    received = 0  # bytes of the pieces before this one
    sock.settimeout(None)
    try:
        for size in piece_sizes(start, start + length, piece):
            if head or take is not None:
                block = bytearray(size) if take is None else take(size)
                got = min(len(head), size)
                block[:got] = head[:got]
                head = head[got:]
                view = memoryview(block)
                while got < size and (n := silence.receive(sock.recv_into, view[got:], size - got)):
                    got += n
            else:
                parts, got = [], 0
                while got < size and (data := silence.receive(sock.recv, size - got)):
                    parts.append(data)
                    got += len(data)
                block = parts[0] if len(parts) == 1 else b"".join(parts)
            if got < size:
                raise ShortBody(f"body ended after {received + got} of {length} bytes")
            pieces.append(block)
            received += size
    finally:
        sock.settimeout(stall_timeout)
    resp.close()  # read to its end: http.client lets the connection carry the next request
    return pieces


class _Silence:
    """Blocking receives on a socket whose SO_RCVTIMEO is half the stall timeout: a receive that
    comes back empty-handed waited that long without a byte; two in a row are a stall."""

    def __init__(self, stall_timeout: float) -> None:
        self.stall_timeout = stall_timeout
        self.since: float | None = None  # silent since then, at least

    def receive(self, call, *args):
        """`call(*args, MSG_WAITALL)` until it returns (bytes or a count; empty at the end of the
        body), or TimeoutError once silent for the stall timeout."""
        while True:
            try:
                result = call(*args, socket.MSG_WAITALL)
            except BlockingIOError:  # SO_RCVTIMEO passed without a byte
                now = time.monotonic()
                if self.since is None:
                    self.since = now - self.stall_timeout / 2
                if now - self.since >= self.stall_timeout:
                    raise TimeoutError(f"no byte for {self.stall_timeout:g} s") from None
                continue
            self.since = None
            return result


def _worth_keeping(conn: http.client.HTTPConnection, since: float, now: float) -> bool:
    """Whether an idle connection (idle since `since`) is still worth a request: not idle longer than
    IDLE_TIMEOUT, and not closed by its server (a plain one readable while idle: its FIN. Not TLS
    ones: a session ticket nobody has read yet makes those readable too; a closed one fails the
    request at once and `Request._send_on` takes a new one)."""
    return (conn.sock is not None and now - since <= IDLE_TIMEOUT
            and (isinstance(conn.sock, ssl.SSLSocket) or not readable(conn.sock)))


def readable(sock: socket.socket) -> bool:
    """Something to read right now (on an idle connection: the server closed it, or sent what nobody
    asked for)."""
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)
    return bool(poll.poll(0))


def _timeval(seconds: float) -> bytes:
    """A struct timeval for SO_RCVTIMEO (never all zero: that would mean no limit)."""
    whole, fraction = divmod(seconds, 1.0)
    micro = int(fraction * 1e6)
    if not whole and not micro:
        micro = 1
    return struct.pack("ll", int(whole), micro)


def _readinto_body(resp: http.client.HTTPResponse, start: int, length: int, piece: int, take=None) -> list:
    pieces = []
    for size in piece_sizes(start, start + length, piece):
        block = bytearray(size) if take is None else take(size)
        view = memoryview(block)
        got = 0
        while got < size:
            n = resp.readinto(view[got:])
            if not n:
                raise ShortBody(f"body ended after {sum(map(len, pieces)) + got} of {length} bytes")
            got += n
        pieces.append(block)
    return pieces
