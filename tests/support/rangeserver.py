"""A real loopback HTTP server that honours single byte ranges, with fault injection.

Used to exercise refmount's HTTP reader against a real socket instead of a mock:

    with RangeServer(root) as srv:
        url = srv.url_for("air.nc")            # http://127.0.0.1:PORT/air.nc
        srv.set_faults(rate=0.25, kinds=("503", "reset"), seed=1)
        ...
        srv.stats["requests"], srv.stats["status"][206]

The server runs aiohttp.web on its own asyncio loop in a daemon thread, so tests may use
blocking clients (urllib, requests, a FUSE mount) from the main thread. Every knob
(``faults``, ``fail_paths``, ``ignore_range``) may be changed while it runs.

Fault kinds (chosen per GET request with probability ``Faults.rate``):

- ``"500"``, ``"503"``: that status, empty body.
- ``"429"``: status 429 with ``Retry-After: <retry_after>``.
- ``"reset"``: the connection is aborted (RST) before any response byte.
- ``"stall"``: headers and half the body are sent, then the server sleeps ``stall_seconds``
  (asyncio sleep: other requests are still served) and closes the connection.
- ``"truncate"``: correct status and headers, but only half of ``Content-Length`` bytes
  are sent before the connection is closed.
- ``"bad_range"``: 206 whose ``Content-Range`` (and bytes) describe a different range than
  the one asked for (shifted by one byte, or one byte shorter).
- ``"full200"``: the Range header is ignored; 200 with the full body.

HEAD requests are never faulted (only ``fail_paths`` applies to them).

Lying and other modes (attributes, changeable while it runs):

- ``validators``: which of "etag", "last-modified" are sent (``send_validators = False`` sends none);
- ``lie``: "gzip" (a 206 whose body is the gzipped range, Content-Encoding gzip), "long206" (the right
  Content-Range, the whole object as body and Content-Length), "long206-chunked" (the same without
  Content-Length);
- ``stall_paths``: GETs of these paths send headers, then nothing until ``stall_seconds`` or stop();
- ``redirects``: path -> Location, answered with 302;
- ``body_rate``: bodies are sent at this many bytes per second, a tenth of a second's worth at a time;
- If-Match / If-Unmodified-Since are honoured (412) like a real server;
- ``ssl_context`` (constructor): serve https.

``stats["headers"]`` keeps each request's headers (lower-case names) for checks on what was sent,
``stats["peers"]`` the client's (host, port) it came from (which connection), ``stats["queries"]``
the query string (a presigned S3 request's signature).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import email.utils
import gzip
import random
import re
import socket
import struct
import threading
from pathlib import Path
from typing import Iterable, Optional, Tuple

from aiohttp import web

FAULT_KINDS = ("500", "503", "429", "reset", "stall", "truncate", "bad_range", "full200")

# Body data is streamed in slices of this size: the server never holds a whole large
# file in memory, only the requested slice, one chunk at a time.
_CHUNK = 1 << 20

_RANGE_RE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Faults:
    """Fault-injection settings. ``Faults()`` injects nothing (rate 0)."""

    rate: float = 0.0
    kinds: Tuple[str, ...] = FAULT_KINDS
    retry_after: float = 0.1
    stall_seconds: float = 30.0
    seed: Optional[int] = None

    def __post_init__(self):
        kinds = (self.kinds,) if isinstance(self.kinds, str) else tuple(self.kinds)
        bad = [k for k in kinds if k not in FAULT_KINDS]
        if bad:
            raise ValueError(f"unknown fault kinds {bad}; known: {FAULT_KINDS}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError("rate must be within [0, 1]")
        if self.rate > 0 and not kinds:
            raise ValueError("rate > 0 needs at least one kind")
        object.__setattr__(self, "kinds", kinds)


def _parse_range(header: Optional[str], total: int):
    """Interpret a Range header against a file of ``total`` bytes.

    Returns None (serve the full body with 200), "unsatisfiable" (416), or an inclusive
    (start, end) pair already clipped to the file. Following RFC 9110, a header we do
    not understand (syntax error, other unit, several ranges) is ignored, not refused.
    """
    if header is None:
        return None
    m = _RANGE_RE.match(header)
    if not m:  # includes multi-range "bytes=0-1,5-6": served as a plain 200
        return None
    first, last = m.group(1), m.group(2)
    if first == "" and last == "":
        return None
    if first == "":  # suffix range "bytes=-N": the last N bytes
        n = int(last)
        if n == 0 or total == 0:
            return "unsatisfiable"
        return (max(0, total - n), total - 1)
    start = int(first)
    if last != "" and int(last) < start:  # syntactically invalid -> ignore the header
        return None
    if start >= total:
        return "unsatisfiable"
    end = int(last) if last != "" else total - 1
    return (start, min(end, total - 1))


def _other_range(start: int, end: int, total: int):
    """A range different from [start, end] inside the file, for the bad_range fault."""
    if end + 1 < total:
        return (start + 1, end + 1)
    if start > 0:
        return (start - 1, end - 1)
    if end > start:
        return (start, end - 1)
    return None  # a one-byte file: no other non-empty range exists


class RangeServer:
    """Serve the files under ``root`` on http://127.0.0.1:<ephemeral port>."""

    def __init__(self, root, *, log_size: int = 1000, host: str = "127.0.0.1", ssl_context=None,
                 keepalive_timeout: float = 75.0, port: int = 0):
        self.root = Path(root).resolve()
        self.keepalive_timeout = keepalive_timeout  # seconds before an idle kept-alive connection is closed
        self.host = host
        self.ssl_context = ssl_context
        self.validators = ("etag", "last-modified")
        self.lie: str | None = None
        self.stall_paths: set = set()
        self.stall_seconds = 30.0
        self.redirects: dict = {}
        self.body_rate: float | None = None  # bytes per second for bodies (None: as fast as possible)
        self.port: Optional[int] = None
        self._port = port  # the port asked for (0: any free one)
        # Plain attributes: assignment is atomic in CPython, and the handler reads each
        # one once per request, so tests may flip them at any time.
        self.fail_paths: dict = {}
        self.head_status: int | None = None  # answer every HEAD with this (servers or signed urls that refuse HEAD)
        self.send_validators = True  # ETag and Last-Modified on every answer
        self.ignore_range = False
        self._lock = threading.Lock()
        self._log_size = log_size
        self._faults = Faults()
        self._rng = random.Random(None)
        self._stats = self._empty_stats()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._runner: Optional[web.AppRunner] = None
        self._stopping: Optional[asyncio.Event] = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "RangeServer":
        if self._thread is not None:
            raise RuntimeError("already started")
        ready = threading.Event()
        error = []

        def run():
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:  # report to the starting thread
                error.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="RangeServer", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            self._thread.join()
            self._thread = None
            raise error[0]
        return self

    async def _start_site(self):
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client that hangs up cancels its (possibly stalled)
        # handler; shutdown_timeout: stop() must not wait 60 s for stalled handlers.
        self._runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0,
            keepalive_timeout=self.keepalive_timeout,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port, ssl_context=self.ssl_context)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._thread is None:
            return
        loop = self._loop

        async def shutdown():
            self._stopping.set()  # wake stalled handlers so they finish now
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> "RangeServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ urls

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    def url_for(self, relpath) -> str:
        rel = Path(relpath).as_posix().lstrip("/")
        return f"{self.url}/{rel}"

    def path_for(self, url: str) -> Path:
        """Map one of our urls back to the local file (for oracles)."""
        prefix = self.url + "/"
        if not url.startswith(prefix):
            raise ValueError(f"{url!r} is not served by {self.url}")
        return self.root / url[len(prefix):]

    # ------------------------------------------------------------------ knobs

    @property
    def faults(self) -> Faults:
        return self._faults

    @faults.setter
    def faults(self, value: Faults) -> None:
        if not isinstance(value, Faults):
            raise TypeError("faults must be a Faults instance")
        with self._lock:
            self._faults = value
            self._rng = random.Random(value.seed)

    def set_faults(self, rate: float = 0.0, kinds: Iterable[str] = FAULT_KINDS, **kw) -> Faults:
        """``srv.faults = Faults(rate, kinds, **kw)``; returns the new settings."""
        self.faults = Faults(rate=rate, kinds=kinds, **kw)
        return self._faults

    def clear_faults(self) -> None:
        self.faults = Faults()

    def _pick_fault(self) -> Tuple[Optional[str], Faults]:
        with self._lock:
            f = self._faults
            if f.rate <= 0:
                return None, f
            # Draw exactly twice per request so a seed gives a reproducible sequence.
            hit = self._rng.random() < f.rate
            kind = self._rng.choice(f.kinds)
            return (kind if hit else None), f

    # ------------------------------------------------------------------ stats

    def _empty_stats(self) -> dict:
        return {
            "requests": 0,
            "bytes_sent": 0,  # body bytes handed to the socket
            "status": collections.Counter(),  # status code -> count (aborted resets excluded)
            "faults": collections.Counter(),  # fault kind -> count
            "log": collections.deque(maxlen=self._log_size),  # (method, path, range header)
            "headers": collections.deque(maxlen=self._log_size),  # each request's headers
            "peers": collections.deque(maxlen=self._log_size),  # each request's client (host, port)
            "queries": collections.deque(maxlen=self._log_size),  # each request's query string
        }

    @property
    def stats(self) -> dict:
        """A snapshot copy of the counters (safe to keep and compare)."""
        with self._lock:
            s = self._stats
            return {
                "requests": s["requests"],
                "bytes_sent": s["bytes_sent"],
                "status": dict(s["status"]),
                "faults": dict(s["faults"]),
                "log": list(s["log"]),
                "headers": list(s["headers"]),
                "peers": list(s["peers"]),
                "queries": list(s["queries"]),
            }

    def reset_stats(self) -> None:
        with self._lock:
            self._stats = self._empty_stats()

    def _count(self, *, status=None, fault=None, nbytes=0):
        with self._lock:
            if status is not None:
                self._stats["status"][status] += 1
            if fault is not None:
                self._stats["faults"][fault] += 1
            self._stats["bytes_sent"] += nbytes

    # ------------------------------------------------------------------ handler

    def _resolve(self, relpath: str) -> Optional[Path]:
        p = (self.root / relpath).resolve()
        if p != self.root and self.root not in p.parents:
            return None  # ".." escaping the root
        return p if p.is_file() else None

    async def _lie(self, request, lie: str, path: Path, rng, total: int, headers: dict) -> web.StreamResponse:
        start, end = rng
        headers = {**headers, "Content-Range": f"bytes {start}-{end}/{total}",
                   "Content-Type": "application/octet-stream"}
        data = path.read_bytes()
        if lie == "gzip":
            body = gzip.compress(data[start:end + 1])
            headers["Content-Encoding"] = "gzip"
        elif lie in ("long206", "long206-chunked"):
            body = data  # the right Content-Range, but the whole object as body
        else:
            raise ValueError(f"unknown lie {lie!r}")
        self._count(status=206, fault=lie, nbytes=len(body))
        if lie == "long206-chunked":
            resp = web.StreamResponse(status=206, headers=headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(body)
            await resp.write_eof()
            return resp
        return web.Response(status=206, headers=headers, body=body)

    async def _stall(self, request, headers: dict, rng, total: int) -> web.StreamResponse:
        """Headers, then nothing until stall_seconds pass or the server stops."""
        status, length = 200, total
        if rng is not None:
            status, length = 206, rng[1] - rng[0] + 1
            headers = {**headers, "Content-Range": f"bytes {rng[0]}-{rng[1]}/{total}"}
        resp = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(length)})
        self._count(status=status, fault="stall")
        await resp.prepare(request)
        try:
            await asyncio.wait_for(self._stopping.wait(), self.stall_seconds)
        except asyncio.TimeoutError:
            pass
        if request.transport is not None:
            request.transport.close()
        return resp

    def _simple(self, status: int, headers=None, fault=None) -> web.Response:
        self._count(status=status, fault=fault)
        return web.Response(status=status, headers=headers)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        relpath = request.match_info["tail"]
        range_header = request.headers.get("Range")
        with self._lock:
            self._stats["requests"] += 1
            self._stats["log"].append((request.method, "/" + relpath, range_header))
            self._stats["headers"].append({k.lower(): v for k, v in request.headers.items()})
            self._stats["peers"].append(request.transport.get_extra_info("peername")[:2])
            self._stats["queries"].append(request.query_string)

        if request.method not in ("GET", "HEAD"):
            return self._simple(405, {"Allow": "GET, HEAD"})
        forced = self.fail_paths.get(relpath, self.fail_paths.get("/" + relpath))
        if forced is not None:
            return self._simple(int(forced))
        location = self.redirects.get(relpath, self.redirects.get("/" + relpath))
        if location is not None:
            return self._simple(302, {"Location": location})
        path = self._resolve(relpath)
        if path is None:
            return self._simple(404)

        st = path.stat()
        total = st.st_size
        etag = f'"{total:x}-{st.st_mtime_ns:x}"'
        modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        headers = {}
        if self.send_validators and "etag" in self.validators:
            headers["ETag"] = etag
        if self.send_validators and "last-modified" in self.validators:
            headers["Last-Modified"] = modified
        if not self.ignore_range:
            headers["Accept-Ranges"] = "bytes"
        if_match = request.headers.get("If-Match")
        if_unmodified = request.headers.get("If-Unmodified-Since")
        # (an unquoted If-Match is compared as S3 does: Icechunk sends its recorded ETags so)
        if (if_match is not None and if_match.strip() not in ("*", etag, etag.strip('"'))) or (
                if_match is None and if_unmodified is not None
                and email.utils.parsedate_to_datetime(if_unmodified).timestamp() < int(st.st_mtime)):
            return self._simple(412, headers)

        if request.method == "HEAD" and self.head_status is not None:
            return self._simple(self.head_status)
        if request.method == "HEAD":
            self._count(status=200)
            # Response(body=None) with an explicit Content-Length: aiohttp keeps it for HEAD.
            return web.Response(status=200, headers={**headers, "Content-Length": str(total)})

        fault, cfg = self._pick_fault()
        rng = None if self.ignore_range else _parse_range(range_header, total)

        if fault in ("500", "503"):
            return self._simple(int(fault), fault=fault)
        if fault == "429":
            return self._simple(429, {"Retry-After": f"{cfg.retry_after:g}"}, fault=fault)
        if fault == "reset":
            self._count(fault=fault)
            # SO_LINGER(on, 0) makes the close send an RST (client sees ECONNRESET), not
            # a clean FIN. aiohttp then fails to write the returned response and ignores
            # that as a client disconnect.
            transport = request.transport
            if transport is not None:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                transport.abort()
            return web.Response()
        if fault == "full200":
            rng = None
        if fault == "bad_range":
            asked = (0, total - 1) if rng in (None, "unsatisfiable") else rng
            other = _other_range(asked[0], asked[1], total) if total else None
            if rng == "unsatisfiable" or other is None:
                fault = None  # nothing sensible to lie about; answer correctly
            else:
                rng = other

        if rng == "unsatisfiable":
            return self._simple(416, {**headers, "Content-Range": f"bytes */{total}"})
        lie = self.lie
        if lie is not None and rng is not None:
            return await self._lie(request, lie, path, rng, total, headers)
        if relpath in self.stall_paths or "/" + relpath in self.stall_paths:
            return await self._stall(request, headers, rng, total)

        if rng is None:
            status, start, length = 200, 0, total
        else:
            start, end = rng
            status, length = 206, end - start + 1
            headers["Content-Range"] = f"bytes {start}-{end}/{total}"
        headers["Content-Length"] = str(length)
        headers["Content-Type"] = "application/octet-stream"

        resp = web.StreamResponse(status=status, headers=headers)
        self._count(status=status, fault=fault)
        await resp.prepare(request)

        # How many body bytes to actually send: faults send only half (strictly fewer
        # than Content-Length) and then stall or close.
        to_send = length // 2 if fault in ("truncate", "stall") else length
        sent = 0
        try:
            with open(path, "rb") as fh:
                fh.seek(start)
                while sent < to_send:
                    # Local reads of a page-cached test file take microseconds, so a
                    # blocking read here does not starve other requests.
                    # paced bodies go out a tenth of a second's worth at a time (a steady trickle)
                    step = min(_CHUNK, max(int(self.body_rate / 10), 1)) if self.body_rate else _CHUNK
                    data = fh.read(min(step, to_send - sent))
                    if not data:  # file shrank under us
                        break
                    await resp.write(data)
                    sent += len(data)
                    self._count(nbytes=len(data))
                    if self.body_rate:
                        await asyncio.sleep(len(data) / self.body_rate)
        except ConnectionError:
            return resp  # client went away; aiohttp ignores the rest

        if fault == "stall":
            try:
                await asyncio.wait_for(self._stopping.wait(), cfg.stall_seconds)
            except asyncio.TimeoutError:
                pass
        if fault in ("stall", "truncate"):
            # close() flushes what was written, then FINs: the client sees a body
            # shorter than Content-Length. aiohttp's later write_eof fails with a
            # ConnectionError, which it treats as a client disconnect (no log noise).
            if request.transport is not None:
                request.transport.close()
            return resp
        await resp.write_eof()
        return resp
