"""Small ranged GETs sent and received by the trio task that serves the read, on a kept-alive socket.

Why: through aiohttp a 64 KiB read crosses threads twice (trio -> the asyncio loop -> trio, 100-250 us
per wake-up on a VM) and runs aiohttp's request machinery: 1.2-1.7 ms above a bare keep-alive GET
(issue 13). Here the trio task writes the request itself and reads the answer from its own socket.

Taken only in the plain case (`FastGet.eligible`): the stdlib client, a range below DIRECT_MIN_BYTES
of a url that has answered 206 before, an origin the direct path may use (no proxy, no credentials in
the url), and an object slot and a host slot free at once (--connections is one count for every path,
see http.Slots; the fast path never waits for one). The answer must be a plain HTTP/1.1 206 with a
Content-Length that passes the backend's own checks (`_check_206`: Content-Range exact, Content-Length
agrees, validators) and a body that ends exactly there. Anything else goes to the asyncio path with
the time left (`HandOver`): at once for an answer this path is not meant for (a redirect, a 200,
chunked, 412, 416, an error status), after the retry loop's back-off when the attempt failed (a wrong
Content-Range, a short body, a reset, a stall, a retryable status). Bytes that failed a check are
never returned.
"""

from __future__ import annotations

import re
import ssl
import time

import trio

from refmount.errors import FetchError
from refmount.fetch import direct
from refmount.fetch.http import DIRECT_MIN_BYTES, _REDIRECTS, HttpBackend, _retry_after, _Retry
from refmount.fetch.pieces import piece_sizes

_MAX_HEAD = 64 << 10
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name
_BAD_VALUE = re.compile(r"[\r\n\0]")


class HandOver(Exception):
    """Send this read through the asyncio path; `failure` is (reason, retry_after) if the attempt failed."""

    def __init__(self, failure: tuple[str, float | None] | None = None) -> None:
        super().__init__(failure[0] if failure else "handed over")
        self.failure = failure


class _Failed(Exception):
    """The attempt failed (the asyncio path retries after its back-off)."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class _ClosedBeforeAnswer(Exception):
    """The connection ended before any byte of the answer (on a reused one: closed while idle)."""


class _Headers(dict):
    """Response headers by lower-case name (repeated ones joined with ', ', as HTTP allows)."""

    def get(self, name, default=None):
        return dict.get(self, name.lower(), default)


class FastGet:
    """The fast path of one HttpBackend. Used from the trio thread only (its idle sockets belong to one
    trio run; a new run starts with none)."""

    def __init__(self, backend: HttpBackend) -> None:
        self.backend = backend
        self._idle: dict[tuple, list] = {}  # (scheme, host, port) -> idle kept-alive (stream, since), newest last
        self._run = None  # the trio run the idle streams belong to
        self._not_fast: set[str] = set()  # urls whose answers are not plain 206s (redirects, chunked, ...)
        self._default_tls: ssl.SSLContext | None = None
        self.served = 0  # reads answered here (for tests and diagnostics)

    def eligible(self, url: str, start: int, end: int) -> bool:
        backend = self.backend
        if not (0 < end - start < DIRECT_MIN_BYTES and url in backend._honours_range
                and url not in backend._whole_only and url not in self._not_fast):
            return False
        size = backend.known_size(url)
        return (size is None or start < size) and backend._direct_target(url) is not None  # past the end: a 416

    async def read(self, url: str, start: int, end: int, piece: int, started: float) -> list[bytearray]:
        """Bytes [start, min(end, size)) as pieces split at multiples of `piece`; raises HandOver
        (the asyncio path takes the read), or FetchError (final: the object changed)."""
        backend = self.backend
        origin, path, extra = backend._direct_target(url)
        headers = {**backend.headers, **extra, "Range": f"bytes={start}-{end - 1}", **backend._conditions(url),
                   "Accept-Encoding": "identity"}
        request = self._request_bytes(url, origin, path, headers)
        if not backend.try_slots(url):
            raise HandOver()  # all taken, or someone waits: queue on the asyncio side
        try:
            # trio's clock is not time.monotonic(): the time left, on trio's clock.
            left = started + backend.policy.read_timeout - time.monotonic()
            with trio.move_on_after(max(left, 0)):
                pieces = await self._exchange(url, origin, request, start, end, piece)
                backend.stats.record(sum(map(len, pieces)), time.monotonic() - started)
                self.served += 1
                return pieces
            raise HandOver(("timed out", None))  # the asyncio path finds no time left and says so
        except _Failed as e:
            raise HandOver((str(e), e.retry_after)) from None
        except (HandOver, FetchError) as e:
            if isinstance(e, FetchError):
                backend.stats.errors += 1
            raise
        except Exception as e:  # noqa: BLE001 - an answer this code did not foresee: the asyncio path reads it
            raise HandOver((f"{type(e).__name__}: {e}", None)) from None
        finally:
            backend.release_slots(url)

    def _request_bytes(self, url: str, origin, path: str, headers: dict) -> bytes:
        host = f"[{origin.host}]" if ":" in origin.host else origin.host
        if origin.port is not None:
            host += f":{origin.port}"
        lines = [f"GET {path} HTTP/1.1"]
        if not any(name.lower() == "host" for name in headers):
            lines.append(f"Host: {host}")
        for name, value in headers.items():
            if not isinstance(name, str) or not isinstance(value, str) or not _TOKEN.fullmatch(name) \
                    or _BAD_VALUE.search(value):
                self._not_fast.add(url)  # aiohttp sends it or refuses it with its own error
                raise HandOver()
            lines.append(f"{name}: {value}")
        try:
            return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        except UnicodeEncodeError:
            self._not_fast.add(url)
            raise HandOver() from None

    async def _exchange(self, url, origin, request: bytes, start: int, end: int, piece: int) -> list[bytearray]:
        key = (origin.scheme, origin.host, origin.port)
        stream = self._take_idle(key)
        try:
            try:
                head, rest = await self._ask(stream, request) if stream is not None else (None, None)
            except _ClosedBeforeAnswer:  # the server closed it while idle: ask again on a new one at once
                _close_now(stream)
                stream = None
            if stream is None:
                stream = await self._connect(origin)
                try:
                    head, rest = await self._ask(stream, request)
                except _ClosedBeforeAnswer:
                    raise _Failed("connection closed before an answer") from None
            version, status, headers = _parse_head(head)
            length = self._accept(url, version, status, headers, start, end)
            if len(rest) > length:
                raise _Failed(f"206 body longer than its Content-Length {length}")
            sizes = piece_sizes(start, start + length, piece)
            pool = self.backend.pool
            if pool is not None and len(sizes) == 1 and length >= pool.min_pooled \
                    and isinstance(stream, trio.SocketStream):
                body = await self._receive_into(stream, pool.take(length), rest)
            else:
                body = rest
                while len(body) < length:
                    chunk = await self._receive(stream, length - len(body))
                    if not chunk:
                        raise _Failed(f"body ended after {len(body)} of {length} bytes")
                    body += chunk
        except BaseException:
            if stream is not None:
                _close_now(stream)  # cancelled or failed: this connection is never reused
            raise
        if "close" in headers.get("connection", "").lower():
            _close_now(stream)
        else:
            self._idle.setdefault(key, []).append((stream, time.monotonic()))
        if len(sizes) == 1:
            return [body]
        pieces, pos = [], 0
        for size in sizes:
            pieces.append(body[pos:pos + size])
            pos += size
        return pieces

    def _accept(self, url: str, version: str, status: int, headers: _Headers, start: int, end: int) -> int:
        """The body length of a plain 206 (its headers checked by the backend), else HandOver or _Failed."""
        if version != "HTTP/1.1":
            self._not_fast.add(url)  # HTTP/1.0 (an old proxy?): the asyncio path reads those
            raise HandOver()
        if status != 206:
            if status in _REDIRECTS:
                self._not_fast.add(url)
            if self.backend.policy.retryable_status(status):
                raise _Failed(f"HTTP {status}", _retry_after(headers.get("retry-after")))
            raise HandOver()  # 200, 412, 416, 404, ...: the asyncio path handles them
        if "transfer-encoding" in headers or "content-length" not in headers:
            self._not_fast.add(url)  # chunked, or a body ended by closing: aiohttp reads those
            raise HandOver()
        value = headers["content-length"]
        if not (value.isascii() and value.isdigit()):
            raise _Failed(f"206 with Content-Length {value!r}")
        try:
            return self.backend._check_206(url, headers, int(value), start, end)
        except _Retry as e:
            raise _Failed(str(e), e.retry_after) from None

    # -- the connection --------------------------------------------------------------------------

    def _take_idle(self, key: tuple):
        """An idle connection that is still open and quiet, and idle for at most direct.IDLE_TIMEOUT
        (see there), or None."""
        run = trio.lowlevel.current_trio_token()
        if run is not self._run:  # a new trio run: sockets of the old one are no use
            self.close()
            self._run = run
        idle = self._idle.get(key)
        while idle:
            stream, since = idle.pop()
            if time.monotonic() - since <= direct.IDLE_TIMEOUT and _quiet(stream):
                return stream
            _close_now(stream)
        return None

    async def _connect(self, origin):
        policy = self.backend.policy
        port = origin.port or (443 if origin.scheme == "https" else 80)
        stream = None
        try:
            with trio.move_on_after(policy.connect_timeout):
                stream = await trio.open_tcp_stream(origin.host, port)
                if origin.scheme == "https":
                    stream = trio.SSLStream(stream, origin.ssl_context or self._default_context(),
                                            server_hostname=origin.host, https_compatible=True)
                    await stream.do_handshake()
                return stream
        except (OSError, trio.BrokenResourceError) as e:
            if stream is not None:
                _close_now(stream)
            raise _Failed(f"cannot connect: {e}") from None
        except BaseException:
            if stream is not None:
                _close_now(stream)
            raise
        if stream is not None:
            _close_now(stream)
        raise _Failed("timed out connecting")

    def _default_context(self) -> ssl.SSLContext:
        if self._default_tls is None:  # as http.client's default (made once: loading the CAs takes ms)
            self._default_tls = ssl.create_default_context()
        return self._default_tls

    async def _ask(self, stream, request: bytes) -> tuple[bytes, bytearray]:
        """Send the request; the answer's head and the body bytes that came with it."""
        buffer = bytearray()
        try:
            await stream.send_all(request)
            self.backend.stats.requests += 1
            while True:
                chunk = await self._receive(stream, _MAX_HEAD)
                if not chunk:
                    break
                buffer += chunk
                end = buffer.find(b"\r\n\r\n")
                if end >= 0:
                    return bytes(buffer[:end]), buffer[end + 4:]
                if len(buffer) > _MAX_HEAD:
                    raise _Failed("response head too long")
        except (OSError, trio.BrokenResourceError) as e:
            if buffer:
                raise _Failed(f"{type(e).__name__}: {e}") from None
        if buffer:
            raise _Failed("connection closed in the middle of the response head")
        raise _ClosedBeforeAnswer()

    async def _receive_into(self, stream, body, rest):
        """The body received into `body` (a buffer of the caches' pool, its exact length), after the
        bytes `rest` that came with the head: no growing buffer, no copy into the cache later."""
        got = len(rest)
        body[:got] = rest
        while got < len(body):
            with trio.move_on_after(self.backend.policy.stall_timeout):
                try:
                    n = await stream.socket.recv_into(body[got:])
                except OSError as e:
                    raise _Failed(f"{type(e).__name__}: {e}") from None
                if not n:
                    raise _Failed(f"body ended after {got} of {len(body)} bytes")
                got += n
                continue
            raise _Failed("timed out (connection stalled)")
        return body

    async def _receive(self, stream, max_bytes: int) -> bytes:
        with trio.move_on_after(self.backend.policy.stall_timeout):
            try:
                return await stream.receive_some(max_bytes)
            except (OSError, trio.BrokenResourceError) as e:
                raise _Failed(f"{type(e).__name__}: {e}") from None
        raise _Failed("timed out (connection stalled)")

    def close(self) -> None:
        for idle in self._idle.values():
            for stream, _since in idle:
                _close_now(stream)
        self._idle.clear()


def _parse_head(head: bytes) -> tuple[str, int, _Headers]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/") or not (code.isascii() and code.isdigit()) or rest[3:4] not in ("", " "):
        raise _Failed(f"malformed status line {lines[0][:80]!r}")
    headers = _Headers()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):  # includes folded lines (leading white space)
            raise _Failed(f"malformed response header line {line[:80]!r}")
        name, value = name.lower(), value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return version, int(code), headers


def _quiet(stream) -> bool:
    """Nothing to read on an idle connection: readable means the server closed it (or sent what
    nobody asked for), and it is dropped before a request is wasted on it."""
    return not direct.readable(_socket_of(stream))


def _socket_of(stream):
    return stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket


def _close_now(stream) -> None:
    """Close at once, without a TLS close_notify (never awaits: also when cancelled)."""
    _socket_of(stream).close()
