"""HTTP(S) byte ranges: the stdlib engine (direct.py) for plain answers, aiohttp for everything else.

With `client="stdlib"` every ranged GET is first tried by the trio task on the stdlib engine
(`read_direct`: http.client in a worker thread, the body received straight into block buffers, the
trio thread woken once when it is in). Only a plain 206 with a Content-Length is received there; a
url that answers anything else (a redirect, a 200 from a server that ignores Range, a chunked body)
and any url behind a proxy or with credentials in it goes through aiohttp, the general client, on
the asyncio loop: the engine hands the read over (`HandOver`) to this module's retry loop with the
time left, and with why its attempt failed if it did. Both paths run the same checks below, under
the same time limit, and share the host's --connections (`Slots`).

Every answer is checked before its bytes are used:
- no Content-Encoding but identity (we ask for identity: a gzipped body is not the object's bytes);
- a 206 must carry exactly the Content-Range asked for (clipped at the end of the object), a
  Content-Length that agrees, and a body that ends exactly there;
- a 200 to a ranged request (a server ignoring Range) is sliced, and the connection closed as soon
  as the wanted bytes are in (never a download of the rest);
- every validator the server gives (ETag, Last-Modified, size) must equal the first one seen for
  the url, on every response, so bytes of two versions are never mixed. With `verify_remote`, ranged
  requests are also conditional (If-Match / If-Unmodified-Since) and a 412 means "changed".

What no client can detect: a server that gives no validator at all and replaces an object with
one of the same size, or a server that lies in its validators.

Redirects and headers are auth.py's decision (`Trail`), on both paths: never from https to http
nor to another scheme; another host only with none of the user's headers (--remote-options
"headers", e.g. Authorization, go only to the origin the chain began at) and only its own
credentials (netrc entry, bearer token, cookies), and not into this machine's own network from a
chain that began outside it (addresses.py checks the addresses connected to).

A backend with a `signer` (s3.py: s3:// objects) keys everything by the object's own url, and sends
each request to the url `signer(url, method)` gives (a presigned one), which may change over time.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import http.client
import logging
import os
import re
import ssl
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

import trio
from yarl import URL

from refmount.errors import FetchError, LoginFailed, NotFound, ReadRefused, RemoteChanged, Unavailable, format_size
from refmount.fetch import addresses, direct, roundtrip
from refmount.fetch.bridge import run_in_worker
from refmount.fetch.pieces import piece_sizes, split
from refmount.fetch.retry import Passing, RetryPolicy, passing, passing_status, policy_now
from refmount.fetch.stats import FetchStats, redact
from refmount.fetch.tls import certificate_problem

if TYPE_CHECKING:  # (asyncio is imported where used: 20-35 ms of a daemon on the stdlib engine, which needs none)
    import asyncio

    import aiohttp

log = logging.getLogger("refmount")

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_MAX_REDIRECTS = 8  # (Earthdata Login: data -> login -> data ?code= -> data -> a signed url)
_REDIRECTS = (301, 302, 303, 307, 308)
# How far into an object a pass may stream for a server that ignores Range (--max-full-download)
DEFAULT_MAX_PASS = 1 << 30
_PASS_IDLE = 10.0  # seconds a pass waits, its connection open, for a read further on
# The direct path opens a host's --connections when it first meets the host (direct.Origin.start_warming),
# for this many hosts: a set spread over many hosts would hold that many idle sockets for each one
# it touched once.
_WARMED_ORIGINS = 8
SWEEP_EVERY = 1.0  # seconds between sweeps of the origins' idle connections, as new origins are met


def _aiohttp():
    """aiohttp, imported at its first use: 0.2-0.7 s of imports (two TLS contexts made at its import)
    that a mount whose answers are all plain (the stdlib engine's) never pays, nor a warm archive
    mount before it is ready."""
    import aiohttp

    return aiohttp


class HandOver(Exception):
    """The stdlib engine leaves this read to the asyncio path (aiohttp, and the retry loop);
    `failure` is (reason, retry_after) if its attempt failed (the loop then backs off first)."""

    def __init__(self, failure: tuple[str, float | None] | None = None) -> None:
        super().__init__(failure[0] if failure else "handed over")
        self.failure = failure


class _Version:
    """The validators first seen for a url; any later response must agree with each one it gives."""

    __slots__ = ("etag", "modified", "size")

    def __init__(self, etag: str | None, modified: str | None, size: int | None) -> None:
        self.etag, self.modified, self.size = etag, modified, size


class Slots:
    """A counting semaphore that both threads honour, so --connections holds across both paths:
    asyncio tasks (`async with`) and trio tasks (`take_trio`) wait their turn in one queue, and a
    slot is released from either thread. `users` counts holders and waiters (the backend drops a
    url's slots when none is left)."""

    def __init__(self, limit: int, lock: threading.Lock) -> None:
        self.limit = limit
        self.in_use = 0
        self.users = 0
        self._lock = lock  # the backend's slots lock, shared by all its Slots
        self._waiters: collections.deque = collections.deque()  # _AsyncioWaiter or _TrioWaiter, in arrival order

    def try_take(self) -> bool:
        """Take a slot if one is free and nobody waits (the caller holds the lock)."""
        if self.in_use < self.limit and not self._waiters:
            self.in_use += 1
            return True
        return False

    async def __aenter__(self) -> None:
        with self._lock:
            if self.try_take():
                return
            waiter = _AsyncioWaiter()
            self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:
            if not self._forget(waiter) and not waiter.future.cancelled():
                self.release()  # the slot was handed over just before the cancel: pass it on
            raise

    async def __aexit__(self, *exc) -> None:
        self.release()

    async def take_trio(self) -> None:
        """Take a slot from a trio task, waiting for one."""
        with self._lock:
            if self.try_take():
                return
            waiter = _TrioWaiter()
            self._waiters.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if not self._forget(waiter):  # handed over meanwhile: pass it on (now, or when it arrives)
                if waiter.granted:
                    self.release()
                else:
                    waiter.gone = True
            raise

    def _forget(self, waiter) -> bool:
        """Take a waiter that gave up out of the queue; False if a slot was handed to it already."""
        with self._lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return True
        return False

    def release(self) -> None:
        """Give a slot back (from any thread): to the first waiter as it is, else to the pool."""
        with self._lock:
            if not self._waiters:
                self.in_use -= 1
                return
            waiter = self._waiters.popleft()
        waiter.hand_over(self)


class _AsyncioWaiter:
    def __init__(self) -> None:
        import asyncio
        self.loop = asyncio.get_running_loop()
        self.future = self.loop.create_future()

    def hand_over(self, slots: Slots) -> None:
        self.loop.call_soon_threadsafe(self._arrived, slots)

    def _arrived(self, slots: Slots) -> None:
        if self.future.cancelled():  # its task gave up meanwhile: the next one gets the slot
            slots.release()
        else:
            self.future.set_result(None)


class _TrioWaiter:
    def __init__(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        self.event = trio.Event()
        self.granted = self.gone = False

    def hand_over(self, slots: Slots) -> None:
        try:
            self.token.run_sync_soon(self._arrived, slots)
        except trio.RunFinishedError:
            pass

    def _arrived(self, slots: Slots) -> None:
        if self.gone:  # its task gave up meanwhile: the next one gets the slot
            slots.release()
        else:
            self.granted = True
            self.event.set()


class HttpBackend:
    def __init__(self, policy: RetryPolicy, stats: FetchStats, *, connections_per_host: int = 8,
                 allow_cross_host_redirects: bool = False, headers: dict | None = None,
                 verify_remote: bool = False, ssl=True, client: str = "aiohttp", logins=None):
        from refmount.fetch.auth import Logins

        self.policy = policy
        # credentials per host, the cookie jar, what a refused login means (auth.py)
        self.logins = logins if logins is not None else Logins(allow_cross_host_redirects=allow_cross_host_redirects)
        self.stats = stats
        self.connections_per_host = connections_per_host
        self.allow_cross_host_redirects = allow_cross_host_redirects
        self.headers = dict(headers or {})
        self.verify_remote = verify_remote
        self._ssl = ssl  # an SSLContext, False ({"ssl": false} in --remote-options), or a function making one
        self._session: aiohttp.ClientSession | None = None
        self._versions: dict[str, _Version] = {}
        self._sizes: dict[str, int] = {}
        # One slow object must not take every connection of its host: each url gets all but one of
        # them (that one stays free for other objects; a long link needs the others for one object).
        self._per_object = max(1, connections_per_host - 1)
        # Slots are counted under one lock: trio tasks (the stdlib engine) take them too.
        self._slots_lock = threading.Lock()
        self._object_slots: dict[str, Slots] = {}  # url -> its slots, while anyone holds or waits for one
        self._range_ignored: set[str] = set()  # hosts warned about
        self._whole_only: set[str] = set()  # urls whose server answered a ranged GET with the whole object
        self._honours_range: set[str] = set()  # urls that have answered 206
        self._ignored_count: dict[str, int] = {}  # url -> 200s to ranged GETs
        self._downloads: dict[str, _SharedDownload] = {}  # url -> the whole-object pass reads may join
        self._routes: dict[tuple, dict] = {}  # (scheme, host) -> proxy options for its requests
        self._login_locks: dict[str, asyncio.Lock] = {}  # login host -> held by the chain logging in there
        self._versions_lock = threading.Lock()  # the direct path checks validators in its worker threads
        self.direct = client == "stdlib"
        self._direct_targets: dict[str, tuple | None] = {}  # url -> (origin, request target), None: aiohttp only
        self._origins: dict[tuple, direct.Origin] = {}  # (scheme, host) -> its direct connections
        self._swept = 0.0  # when the origins' idle connections were last swept (_sweep_origins)
        self._host_slots: dict[tuple, Slots] = {}  # (scheme, host) -> ranges of every path in flight
        # Where the stdlib engine receives bodies: anything with take(nbytes) -> a writable buffer of
        # that size (the caches' buffer pool, cache/buffers.py); None: a new bytes object per piece.
        self.pool = None
        self.passing = None  # cache/passing.py: keeps the referenced blocks a whole-object pass streams by
        self.max_pass = DEFAULT_MAX_PASS  # --max-full-download: how far into an object a pass may stream
        self.signer = None  # signer(url, method) -> the url a request goes to (s3.py), or None: the url itself

    @property
    def ssl(self):
        """The TLS setting, made when https first needs it (loading the trust store takes 30-400 ms,
        which a mount that speaks only http never pays)."""
        if callable(self._ssl):
            self._ssl = self._ssl()
        return self._ssl

    def _tls_for(self, scheme: str) -> ssl.SSLContext | None:
        """The stdlib engine's context for an origin of `scheme` (None for plain http: none made)."""
        if scheme != "https":
            return None
        return self.ssl if isinstance(self.ssl, ssl.SSLContext) else None if self.ssl else _unverified()

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            aiohttp = _aiohttp()
            # (names are resolved by addresses.py, which keeps answers itself: aiohttp's cache would
            # skip its check of a redirect's addresses)
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.connections_per_host,
                                             keepalive_timeout=direct.IDLE_TIMEOUT, use_dns_cache=False,
                                             resolver=addresses.resolver(), ssl=self.ssl,
                                             socket_factory=roundtrip.opening)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.policy.connect_timeout,
                                            sock_read=self.policy.stall_timeout)
            # trust_env is off: aiohttp would then look up the proxy and ~/.netrc in a worker thread
            # on every request (two thread hand-offs per read); `_route` finds the proxy once per
            # origin, auth.py the credentials.
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                                  headers={"Accept-Encoding": "identity"}, trust_env=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())  # (auth.py keeps them)
        return self._session

    def _route(self, url: str) -> dict:
        """The proxy (HTTP(S)_PROXY, NO_PROXY, --proxy) for `url`'s origin, as aiohttp's trust_env would
        find it, looked up once per origin. (Credentials are auth.py's, per request.)"""
        parts = urlsplit(url)
        key = (parts.scheme, _host(parts))
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = _route_from_env(url)
        return route

    async def open(self, first_url: str | None = None) -> None:
        """Start opening the connections of `first_url`'s host for the direct path (no request is
        sent); without it (client "aiohttp"), create aiohttp's session, so that the first read does
        not. (With the direct path, aiohttp is imported when an answer first needs it.)"""
        if not self.direct:
            self._session_now()
        elif first_url is not None:
            self._direct_target(first_url)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.close_direct()

    def close_direct(self) -> None:
        """The stdlib engine's connections closed: no asyncio loop needed (a fetcher that never used one)."""
        for origin in self._origins.values():
            origin.close()
        self._origins.clear()

    # -- public operations (asyncio side) ----------------------------------------------------------

    async def read(self, url: str, start: int, end: int, piece: int = 0, *, started: float | None = None,
                   failed: tuple[str, float | None] | None = None) -> list[bytes]:
        """Bytes [start, min(end, size)) of `url` as pieces split at multiples of `piece` (one piece if
        0); no pieces when start is at or past the end. A read the stdlib engine handed over passes
        when it began (time.monotonic()) and, if its attempt failed, (reason, retry_after)."""
        return await self._with_retries(url, lambda: self._get_range(url, start, end, piece), started, failed)

    def known_size(self, url: str) -> int | None:
        """The object's size if a response has told it already (no I/O)."""
        version = self._versions.get(url)
        return self._sizes.get(url) or (version.size if version else None)

    async def size(self, url: str) -> int:
        if url not in self._sizes:
            self._sizes[url] = await self._with_retries(url, lambda: self._probe_size(url))
        return self._sizes[url]

    def forget(self, url: str) -> None:
        """The object's size and validators as seen so far are forgotten (fetch.Fetcher.forget)."""
        with self._versions_lock:
            self._versions.pop(url, None)
            self._sizes.pop(url, None)

    def validators(self, url: str) -> tuple[str | None, str | None]:
        """(ETag, Last-Modified) first seen for `url`, if any response gave them."""
        version = self._versions.get(url)
        return (version.etag, version.modified) if version else (None, None)

    async def size_direct(self, url: str) -> int | None:
        """size()'s answer by a HEAD on the stdlib engine, from the trio thread, when it is a plain 200
        with a Content-Length: the first stat of a whole-file reference (and the disk cache's validator)
        then waits for neither aiohttp's import nor the asyncio loop (0.1-0.3 s after a mount:
        bench/NOTES.md, "the disk cache's re-read, measured in turn"). A 404 or 410 raises as the general
        path's would (asked once: a remote store's missing chunk). None for anything else (no stdlib
        engine, a proxy or signer, another status, a failure, a timeout): size() asks on the general
        path, with its retries."""
        if url in self._sizes:
            return self._sizes[url]
        if not self.direct or self.signer is not None:
            return None
        target = self._direct_target(url)
        if target is None:
            return None
        origin, path, wire = target
        headers = {**self.logins.trail(wire, self.headers).headers(wire, signed=False), "Accept-Encoding": "identity"}
        request = direct.Request(origin, path, headers)

        def plain(resp: http.client.HTTPResponse) -> int | None:  # (in the worker thread)
            if not self._route(url):  # (the pacer sizes the host's opening from its round trip: roundtrip.py)
                roundtrip.note(url, request.sock, time.monotonic() - asked)
            self.logins.keep_cookies(url, resp.headers.get_all("Set-Cookie") or [])
            if resp.status in (404, 410):  # (definite, never retried: as the general path says it, not asked twice)
                self._raise_for_status(url, resp)
            length = resp.headers.get("Content-Length", "")
            if resp.status != 200 or not length.isdigit():
                return None
            try:
                self._check_response(url, resp.headers, int(length))
            except Passing:  # (an encoded body: the general path says so)
                return None
            return int(length)

        size = None
        with trio.move_on_after(policy_now(self.policy).connect_timeout + policy_now(self.policy).stall_timeout):
            async with self._trio_slots(url):
                try:
                    asked = time.monotonic()
                    size = await run_in_worker(lambda: request.head(plain), request.abort)
                except (http.client.HTTPException, OSError, ValueError):
                    # (ssl, timeouts and a refused address are OSErrors; the general path says what went wrong)
                    size = None
                finally:
                    if request.sent:
                        self.stats.request(url)
        if size is not None:
            self._sizes[url] = size
        return size

    async def identity(self, url: str) -> str | None:
        """What names this version of the object: a strong ETag, else its size and Last-Modified;
        None when the server gives neither (one HEAD per url, shared with size())."""
        return self.identity_known(url, await self.size(url))

    def identity_known(self, url: str, size: int) -> str | None:
        """identity() once the object's size (and with it its validators) is known."""
        version = self._versions.get(url)
        etag = version.etag if version else None
        if etag and not etag.startswith("W/"):  # a weak ETag does not promise identical bytes
            return f"etag {etag}"
        modified = version.modified if version else None
        return f"size {size} modified {modified}" if modified else None

    async def document(self, url: str, limit: int) -> bytes:
        """The whole body of a small document (at most `limit` bytes) at `url`, a 200 answer."""
        return (await self.page(url, limit))[2]

    async def page(self, url: str, limit: int, *, same_origin: bool = False) -> tuple[str, str, bytes]:
        """(the url it was found at after redirects, its Content-Type, its body) of a small document
        (at most `limit` bytes), a 200 answer. `same_origin`: no redirect to another origin (an
        index page: its links would name files there)."""
        found, answered, body = await self.page_answer(url, limit, same_origin=same_origin)
        return found, answered.get("Content-Type", ""), body

    def page_direct(self, url: str, limit: int) -> tuple[str, str, bytes] | None:
        """page()'s answer on the stdlib engine, synchronously in the calling thread (not the asyncio
        loop's), when it is a plain 200: an index page then costs no aiohttp import (0.2-0.7 s on a warm
        archive mount's way). None for anything else (a proxy, credentials in the url, a redirect, a
        login, an error status, a failure, a hop the trail guards): `page` then asks on the general path,
        with its retries."""
        parsed = URL(url)
        if not self.direct or self.signer is not None or parsed.scheme not in ("http", "https") \
                or not parsed.host or parsed.user is not None or self._route(url):
            return None
        trail = self.logins.trail(url, self.headers)
        if trail.guards(url) is not None:  # (its addresses are checked as it connects: the general path does)
            return None
        origin = direct.Origin(parsed.scheme, parsed.raw_host, parsed.explicit_port,
                               ssl_context=self._tls_for(parsed.scheme), connect_timeout=self.policy.connect_timeout,
                               stall_timeout=self.policy.stall_timeout, max_idle=0)
        headers = {**trail.headers(url, signed=False), "Accept-Encoding": "identity"}
        request = direct.Request(origin, parsed.raw_path_qs, headers)

        def plain(resp: http.client.HTTPResponse) -> bool:
            self.logins.keep_cookies(url, resp.headers.get_all("Set-Cookie") or [])
            return resp.status == 200 and resp.headers.get("Content-Encoding", "identity").lower() == "identity"

        try:
            answered = request.page(limit + 1, plain)
        except (http.client.HTTPException, OSError, ValueError):  # (ssl and timeouts are OSErrors)
            return None
        finally:
            if request.sent:
                self.stats.request(url)
        if answered is None:
            return None
        kind, body = answered
        if len(body) > limit:
            raise FetchError(f"{redact(url)}: the answer is larger than {limit} bytes")
        return url, kind, body

    async def page_answer(self, url: str, limit: int, *, same_origin: bool = False,
                          send: dict | None = None, post: bytes | None = None) -> tuple[str, dict, bytes]:
        """page()'s, with the answer's headers (a dict, case-insensitive) instead of its Content-Type;
        `send`: request headers of this page only (a catalog's paging header: CMR-Search-After); `post`:
        the body of a POST instead of a GET (a STAC API's next page asked by POST)."""
        async def once() -> tuple[str, dict, bytes]:
            resp = await self._request(url, "GET" if post is None else "POST", dict(send or {}),
                                       same_origin=same_origin, body=post)
            async with resp:
                self.stats.request(url)
                if resp.status != 200:
                    self._raise_for_status(url, resp)
                body = await _read_exactly(resp, limit + 1, allow_eof=True)
                found, answered = str(resp.url), resp.headers.copy()
            if len(body) > limit:
                raise FetchError(f"{redact(url)}: the answer is larger than {limit} bytes")
            return found, answered, body

        return await self._with_retries(url, once)

    # -- one attempt -----------------------------------------------------------------------------

    async def _request(self, url: str, method: str, headers: dict, *, same_origin: bool = False,
                       body: bytes | None = None):
        """Issue a request, following redirects as auth.py's `Trail` decides (the user's headers only
        to the origin, each host only its own credentials and cookies; never to another scheme or
        from https down to http; not into this machine's network from outside it). A request with a
        `body` follows only 307 and 308, which keep it (a 301-303 would turn it into a GET)."""
        import asyncio
        session = self._session_now()
        signed = self.signer is not None
        if signed:
            url = self.signer(url, method)
        trail = self.logins.trail(url, self.headers, same_origin=same_origin, signed=signed)
        login = None  # the lock of the login host this chain is logging in at, while it does
        first = url
        try:
            for _ in range(_MAX_REDIRECTS + 1):
                credentials = trail.headers(url, signed=signed)
                sent = {**credentials, **headers, "Accept-Encoding": "identity"}
                where = url if not signed else URL(url, encoded=True)  # (as signed, not re-quoted)
                guarded = trail.guards(url) if not self._route(url) else None  # (a proxy resolves it)
                refused = trail.unreachable(url) if guarded else None  # (aiohttp resolves no address literal)
                try:
                    if refused:
                        raise addresses.InternalAddress(refused)
                    with addresses.guarded(guarded, trail.why_guarded()), roundtrip.opened_by() as opened:
                        asked = time.monotonic()
                        resp = await session.request(method, where, headers=sent, allow_redirects=False,
                                                     data=body, **self._route(url))
                except (_aiohttp().ClientConnectorError, addresses.InternalAddress) as e:
                    internal = e if isinstance(e, addresses.InternalAddress) else e.os_error
                    if isinstance(internal, addresses.InternalAddress):
                        raise _refused_address(first, url, internal) from None
                    raise
                redirect = resp.status in _REDIRECTS
                target = urljoin(url, resp.headers.get("Location", "")) if redirect else None
                try:
                    trail.answered(url, resp.status, resp.headers.getall("Set-Cookie", []), target)
                except BaseException:
                    resp.release()
                    raise
                if not redirect:
                    sock = roundtrip.connected(opened)  # (None: a connection reused, noted when new)
                    if sock is not None and not self._route(url):  # (a proxy's round trip is not the origin's)
                        roundtrip.note(url, sock, time.monotonic() - asked)
                    return resp
                resp.release()
                here, there = urlsplit(url), urlsplit(target)
                refused = trail.redirect_refused(url, target) or (
                    f"a {method} redirected by {resp.status} is not followed" if body is not None
                    and resp.status not in (307, 308) else None)
                if refused:
                    raise FetchError(f"{redact(url)}: {refused}")
                if login is None and _host(there) != _host(here) and self.logins.is_login_host(target):
                    # Off to log in: one chain at a time per login host. A read that waited finds the
                    # session cookie the one before it got, and asks again with it instead.
                    login = self._login_locks.setdefault(_host(there), asyncio.Lock())
                    await login.acquire()
                    if self.logins.cookie_header(url) != credentials.get("Cookie"):
                        continue
                url = target
            raise FetchError(f"{redact(url)}: too many redirects")
        finally:
            if login is not None:
                login.release()

    @contextlib.asynccontextmanager
    async def _object_slot(self, url: str):
        slots = self._enter_object_slots(url)
        try:
            async with slots:
                yield
        finally:
            self._leave_object_slots(url, slots)

    def _enter_object_slots(self, url: str) -> Slots:
        """`url`'s slots, counted as used until `_leave_object_slots` (which forgets them when unused)."""
        with self._slots_lock:
            slots = self._object_slots.get(url)
            if slots is None:
                slots = self._object_slots[url] = Slots(self._per_object, self._slots_lock)
            slots.users += 1
            return slots

    def _leave_object_slots(self, url: str, slots: Slots) -> None:
        with self._slots_lock:
            slots.users -= 1
            if slots.users == 0:
                del self._object_slots[url]

    def _host_slot(self, url: str):
        """With the stdlib engine, one of the host's --connections for a range on either path
        (aiohttp's connector limits only its own connections)."""
        if not self.direct:
            return contextlib.nullcontext()
        return self._host_slots_of(_origin(url))

    def _host_slots_of(self, key: tuple) -> Slots:
        with self._slots_lock:
            slots = self._host_slots.get(key)
            if slots is None:
                slots = self._host_slots[key] = Slots(self.connections_per_host, self._slots_lock)
            return slots

    @contextlib.asynccontextmanager
    async def _trio_slots(self, url: str):
        """From a trio task: an object slot of `url` and a slot of its host, waiting for them."""
        slots = self._enter_object_slots(url)
        try:
            await slots.take_trio()
            try:
                host = self._host_slots_of(_origin(url))
                await host.take_trio()
                try:
                    yield
                finally:
                    host.release()
            finally:
                slots.release()
        finally:
            self._leave_object_slots(url, slots)

    def _conditions(self, url: str) -> dict:
        """With --verify-remote: ask the server itself to refuse (412) if the object is not the
        version we first saw."""
        version = self._versions.get(url)
        if not self.verify_remote or version is None:
            return {}
        if version.etag and not version.etag.startswith("W/"):
            return {"If-Match": version.etag}
        if version.modified:
            return {"If-Unmodified-Since": version.modified}
        return {}

    async def _get_range(self, url: str, start: int, end: int, piece: int) -> list[bytes]:
        if end <= start:
            return []
        t0 = time.monotonic()
        if url in self._whole_only:
            pieces = await self._shared_read(url, start, end, piece)
            self.stats.record(url, sum(map(len, pieces)), time.monotonic() - t0)
            return pieces
        ignored = False
        async with self._object_slot(url), self._host_slot(url):
            resp = await self._request(url, "GET", {"Range": f"bytes={start}-{end - 1}", **self._conditions(url)})
            async with resp:
                self.stats.request(url)
                status = resp.status
                if status == 206:
                    self._honours_range.add(url)
                    pieces = await self._read_206(url, resp, start, end, piece)
                elif status == 200:
                    # The whole object from byte 0: not read here, but through a pass that keeps
                    # what the reference set refers to as it goes (see _SharedDownload)
                    self._check_response(url, resp.headers, resp.content_length)
                    self._note_range_ignored(url)
                    resp.close()
                    ignored = True
                elif status == 416:
                    total = _total_from(resp.headers.get("Content-Range", ""))
                    if total is not None and start < total:
                        raise Passing(f"416 for a range inside the object ({total} bytes)")
                    if total is not None:  # the object's size (and a check that it is the version seen)
                        self._check_response(url, resp.headers, total)
                    pieces = []
                elif status == 412 and self._conditions(url):
                    raise RemoteChanged(f"{redact(url)}: the remote object changed while mounted "
                                        f"(the server refused {', '.join(self._conditions(url))} with 412)")
                else:
                    self._raise_for_status(url, resp)
        if ignored:  # (outside the slots: the pass takes one of its own)
            pieces = await self._shared_read(url, start, end, piece)
        self.stats.record(url, sum(map(len, pieces)), time.monotonic() - t0)
        return pieces

    async def _read_206(self, url, resp, start, end, piece) -> list[bytes]:
        length = self._check_206(url, resp.headers, resp.content_length, start, end)
        pieces = await _read_pieces(resp, start, start + length, piece)
        if await resp.content.read(1):  # the body must end where its Content-Range says
            raise Passing(f"206 body longer than its Content-Range {resp.headers.get('Content-Range')!r}")
        return pieces

    def _check_206(self, url, headers, content_length: int | None, start: int, end: int) -> int:
        """The body length a 206 to bytes=start-(end-1) must have, after checking its headers."""
        m = _CONTENT_RANGE.fullmatch(headers.get("Content-Range", "").strip())
        if not m:
            raise Passing("206 without a valid Content-Range")
        first, last = int(m.group(1)), int(m.group(2))
        total = None if m.group(3) == "*" else int(m.group(3))
        self._check_response(url, headers, total)
        want_last = end - 1 if total is None else min(end, total) - 1
        if first != start or last != want_last:
            raise Passing(f"Content-Range {m.group(0)!r} does not match the requested bytes={start}-{end - 1}")
        if content_length is not None and content_length != last - first + 1:
            raise Passing(f"206 with Content-Length {content_length} for Content-Range {m.group(0)!r}")
        return last - first + 1

    # -- the stdlib engine (direct.py), from the trio thread ----------------------------------------

    def takes(self, url: str, start: int, end: int) -> bool:
        """Whether the stdlib engine tries this read first (else the asyncio path takes it)."""
        if not self.direct or end <= start or url in self._whole_only:
            return False
        size = self.known_size(url)
        return (size is None or start < size) and self._direct_target(url) is not None  # past the end: a 416

    async def read_direct(self, url: str, start: int, end: int, piece: int, started: float) -> list:
        """One attempt on the stdlib engine, from a trio task, within --read-timeout after `started`
        (time.monotonic()): the pieces, FetchError (final), or HandOver."""
        origin, path, wire = self._direct_target(url)
        signed = self.signer is not None
        credentials = self.logins.trail(wire, self.headers).headers(wire, signed=signed)  # (the user's headers too)
        headers = {**credentials, "Range": f"bytes={start}-{end - 1}", **self._conditions(url),
                   "Accept-Encoding": "identity"}
        request = direct.Request(origin, path, headers, take=self.pool.take if self.pool is not None else None)
        left = started + policy_now(self.policy).read_timeout - time.monotonic()  # (trio's clock is not time.monotonic())
        with trio.move_on_after(max(left, 0)):
            async with self._trio_slots(url):
                try:
                    pieces = await run_in_worker(
                        lambda: request.run(start, piece, lambda resp: self._accept_direct(url, resp, start, end)),
                        request.abort)
                except FetchError as e:
                    self.stats.error(url, e)
                    raise
                except Passing as e:
                    raise HandOver((str(e), e.retry_after)) from None
                except ssl.SSLCertVerificationError as e:
                    self.stats.error(url, "tls")
                    raise FetchError(f"{certificate_problem(e)} for {redact(url)}") from None
                except ValueError as e:  # http.client refuses a header value (a line break in it)
                    self.stats.error(url, "other")
                    raise FetchError(f"{redact(url)}: {e}") from None
                except addresses.InternalAddress as e:  # (final: the same on every path, at every try)
                    self.stats.error(url, "other")
                    raise _refused_address(url, url, e) from None
                except TimeoutError:
                    raise HandOver(("timed out (connection stalled)", None)) from None
                except (direct.ShortBody, http.client.HTTPException, OSError) as e:
                    raise HandOver((f"{type(e).__name__}: {e}".rstrip(": "), None)) from None
                finally:
                    if request.sent:  # (not when no connection could be made: the server saw nothing)
                        self.stats.request(url)
            if pieces is None:
                raise HandOver()
            self.stats.record(url, sum(map(len, pieces)), time.monotonic() - started)
            return pieces
        raise HandOver(("timed out", None))  # the retry loop finds no time left and says so

    def _direct_target(self, url: str) -> tuple | None:
        """(origin's connection pool, request target, the url sent) for the direct path, or None when
        the url must go through aiohttp: a proxy, credentials in the url, or an answer that was
        not a plain 206 before. Worked out once per url (the request target anew, with a signer)."""
        if url in self._direct_targets:
            target = self._direct_targets[url]
            if target is None or self.signer is None:
                return target
            wire = self.signer(url, "GET")
            return target[0], URL(wire, encoded=True).raw_path_qs, wire
        target = None
        wire = url if self.signer is None else self.signer(url, "GET")
        parsed = URL(wire, encoded=self.signer is not None)
        if parsed.scheme in ("http", "https") and parsed.host and parsed.user is None and not self._route(wire):
            key = _origin(wire)
            origin = self._origins.get(key)
            if origin is None:  # setdefault: the asyncio thread may work this out at the same time
                self._sweep_origins()
                created = direct.Origin(parsed.scheme, parsed.raw_host, parsed.explicit_port,
                                        ssl_context=self._tls_for(parsed.scheme),
                                        connect_timeout=self.policy.connect_timeout,
                                        stall_timeout=self.policy.stall_timeout, max_idle=self.connections_per_host,
                                        guard=self._guard_of(wire))
                origin = self._origins.setdefault(key, created)
                if origin is created and len(self._origins) <= _WARMED_ORIGINS:  # first contact: open them now
                    origin.start_warming()
            target = (origin, parsed.raw_path_qs, wire)
        self._direct_targets[url] = target
        return target

    def _sweep_origins(self) -> None:
        """As a new origin is met, at most every SWEEP_EVERY seconds: the idle connections of the
        others that have expired or that their server closed are let go (direct.Origin.sweep)."""
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY:
            return
        self._swept = now
        for origin in list(self._origins.values()):
            origin.sweep()

    def _guard_of(self, url: str):
        """What the stdlib engine's connections to `url`'s origin are held to, asked as each one is made
        (a catalog may name the host after its first connection): (host, why) when a document from a
        public address named it (auth.py), else None."""
        def guard():
            trail = self.logins.trail(url)
            return (trail.guards(url), trail.why_guarded()) if trail.public_only else None
        return guard

    def _accept_direct(self, url: str, resp: http.client.HTTPResponse, start: int, end: int) -> int | None:
        """In the worker thread: the body length of a plain 206 (its headers checked), None to hand
        the request to aiohttp, or the error a failed status means."""
        status = resp.status
        if self.signer is None:
            self.logins.keep_cookies(url, resp.headers.get_all("Set-Cookie") or [])
        if status in (401, 403):  # aiohttp's path works out what was refused, and says so
            return None
        if status == 206 and resp.length is not None and not resp.chunked:
            length = self._check_206(url, resp.headers, resp.length, start, end)
            self._honours_range.add(url)
            return length
        if status in _REDIRECTS and self.signer is None and self.logins.is_login_host(
                urljoin(url, resp.headers.get("Location") or "")):
            return None  # off to log in, on aiohttp's path; with the session cookie it may be a plain 206 here
        if status in (206, *_REDIRECTS):  # chunked or redirected: this url goes through aiohttp from now on
            self._direct_targets[url] = None
            return None
        if status == 200:  # counted here too, so that a second 200 sends the read straight to a pass
            self._check_response(url, resp.headers, resp.length)
            self._note_range_ignored(url)
            return None
        if status in (412, 416):  # aiohttp's path handles these
            return None
        self._raise_for_status(url, resp)
        raise Passing(f"HTTP {status} to a ranged GET")

    def _note_range_ignored(self, url: str) -> None:
        """After a second 200 to a ranged GET, and none 206 ever (a lone 200 may be a fault), later reads
        of `url` share whole-object downloads; one warning per host."""
        if url in self._honours_range:
            return
        self._ignored_count[url] = self._ignored_count.get(url, 0) + 1
        if self._ignored_count[url] < 2:
            return
        self._whole_only.add(url)
        host = _host(urlsplit(url))
        if host not in self._range_ignored:
            self._range_ignored.add(host)
            log.warning("%s ignores Range requests (answers 200 with the whole object): reads of an object share "
                        "one pass over it, which keeps the blocks the reference set refers to as it goes", host)

    async def _shared_read(self, url: str, start: int, end: int, piece: int) -> list[bytes]:
        """A read of an object whose server ignores Range: join the pass over the object under way
        (or waiting) if it has not gone past `start` yet, else start one. Never past --max-full-download."""
        size = self.known_size(url)
        if size is not None:
            end = min(end, size)
        if end > self.max_pass:
            raise ReadRefused(f"{redact(url)} ignores Range: reads beyond byte {self.max_pass:,} of it would stream "
                              f"it from its start past --max-full-download {format_size(self.max_pass)} (raise "
                              "the option to read them)", once=f"--max-full-download {url}")
        download = self._downloads.get(url)
        if download is None or not download.can_join(start):
            if download is not None:
                download.stop_when_idle()
            download = self._downloads[url] = _SharedDownload(self, url)
        return split(await download.wait_for(start, end), start, piece)

    async def _probe_size(self, url: str) -> int:
        async with self._object_slot(url):
            resp = await self._request(url, "HEAD", {})
            async with resp:
                self.stats.request(url)
                if resp.status == 200 and resp.content_length is not None:
                    self._check_response(url, resp.headers, resp.content_length)
                    return resp.content_length
                if resp.status not in (200, 405, 501):
                    self._raise_for_status(url, resp)
            # No usable HEAD: a one-byte GET tells the size through Content-Range.
            resp = await self._request(url, "GET", {"Range": "bytes=0-0"})
            async with resp:
                self.stats.request(url)
                if resp.status == 206:
                    total = _total_from(resp.headers.get("Content-Range", ""))
                    if total is not None:
                        self._check_response(url, resp.headers, total)
                        return total
                elif resp.status == 416:
                    return 0
                elif resp.status == 200 and resp.content_length is not None:
                    self._check_response(url, resp.headers, resp.content_length)
                    resp.close()
                    return resp.content_length
                else:
                    self._raise_for_status(url, resp)
        raise FetchError(f"{redact(url)}: the server does not tell the object's size")

    def _raise_for_status(self, url: str, resp) -> None:
        status = resp.status
        temporary = getattr(self.signer, "temporary", None)
        if temporary is not None and status in (400, 401, 403):  # S3 refused the temporary credentials
            self.logins.count("login_failures", urlsplit(temporary.url).netloc)
            raise LoginFailed(f"{redact(url)}: HTTP {status} {resp.reason or ''} from S3 to a request signed with the "
                              f"temporary credentials from {redact(temporary.url)} (expired or revoked?)")
        if passing_status(status):
            raise Passing(f"HTTP {status}", _retry_after(resp.headers.get("Retry-After")))
        # (a 401/403 is said as such; a 404 may mean "absent": a remote Zarr store's missing chunk)
        error = (NotFound if status == 404 else FetchError)(f"{redact(url)}: HTTP {status} {resp.reason or ''}".rstrip())
        error.status = status
        raise error

    def _check_response(self, url: str, headers, total: int | None) -> None:
        """Refuse an encoded body, and any validator that differs from the first one seen."""
        encoding = headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("identity", ""):
            raise Passing(f"the server sent a body with Content-Encoding {encoding!r}, not the object's bytes")
        with self._versions_lock:
            self._check_version(url, headers.get("ETag"), headers.get("Last-Modified"), total)

    def _check_version(self, url: str, etag: str | None, modified: str | None, total: int | None) -> None:
        seen = self._versions.get(url)
        if seen is None:
            self._versions[url] = _Version(etag, modified, total)
            return
        for name, old, new in (("ETag", seen.etag, etag), ("Last-Modified", seen.modified, modified),
                               ("size", seen.size, total)):
            if name == "ETag" and old and new:  # a proxy may weaken a strong ETag; the tag itself must stay
                old, new = old.removeprefix("W/"), new.removeprefix("W/")
            if old is not None and new is not None and old != new:
                raise RemoteChanged(f"{redact(url)}: the remote object changed while mounted "
                                    f"({name} {old} -> {new})")
        seen.etag = seen.etag or etag
        seen.modified = seen.modified or modified
        seen.size = seen.size if seen.size is not None else total

    # -- retries --------------------------------------------------------------------------------

    async def _with_retries(self, url: str, attempt_once, started: float | None = None,
                            failed: tuple[str, float | None] | None = None):
        """`attempt_once` until it succeeds, a final error, or --read-timeout after `started` (now if
        None; the loop's clock is time.monotonic()). `failed`: the first attempt (on the stdlib engine)
        failed so, and this loop goes on from there."""
        import asyncio
        policy = policy_now(self.policy)
        loop = asyncio.get_running_loop()
        started = loop.time() if started is None else started
        deadline = started + policy.read_timeout
        attempt = 0
        earlier = None  # why the attempt before this one failed
        while True:
            attempt += 1
            if failed is not None:
                (reason, retry_after), failed = failed, None
            else:
                try:
                    async with asyncio.timeout(max(deadline - loop.time(), 0.001)):
                        return await attempt_once()
                except FetchError as e:
                    self.stats.error(url, e)
                    raise
                except (Passing, _aiohttp().ClientError, asyncio.TimeoutError, OSError) as e:
                    if passing(e) is None:  # (the same at every try: a certificate, an url aiohttp refuses)
                        tls = certificate_problem(e)
                        self.stats.error(url, "tls" if tls else "other")
                        raise FetchError(f"{tls} for {redact(url)}" if tls else f"{redact(url)}: {e}") from None
                    reason, retry_after = _describe(e)
                    if earlier is not None and isinstance(e, asyncio.TimeoutError) and loop.time() >= deadline:
                        # --read-timeout ran out during this attempt (a slow answer on a busy machine), no
                        # stall: the attempts before say why the read failed (say, a server answering 503)
                        reason = f"{earlier} (the last attempt cut short by --read-timeout)"
            delay = policy.backoff(attempt, retry_after)
            if loop.time() + delay >= deadline or attempt >= policy.max_attempts:
                self.stats.error(url, reason)
                raise Unavailable(f"{redact(url)}: gave up after {attempt} attempts in "
                                  f"{loop.time() - started:.1f}s; last error: {reason}")
            earlier = reason
            self.stats.retry(url)
            await asyncio.sleep(delay)


class _SharedDownload:
    """One pass over an object whose server ignores Range: a GET of the whole object that feeds
    every read that joined it before the stream passed its start. It streams only as far as the
    furthest byte a read has asked for, then waits, its connection open, up to _PASS_IDLE seconds
    for a read further on (reads one after the other, in offset order, take one pass). As it goes,
    the blocks that keys of the reference set refer to are handed to `backend.passing` (the block
    cache keeps them): a later read of bytes it went past needs no new pass while they are cached.
    A reader that gives up leaves; a pass nobody waits for ends after the idle time."""

    def __init__(self, backend: HttpBackend, url: str) -> None:
        import asyncio
        self.backend, self.url = backend, url
        self.pos = 0
        self.size: int | None = None
        self.done = False
        self.goal = 0  # the furthest byte asked for
        self.readers: list[list] = []  # [start, end, parts, future]
        self._wake = asyncio.Event()
        self._stop = False
        passing = backend.passing
        self._runs = passing.blocks_of(url) if passing is not None else []
        self._firsts = [first for first, _ in self._runs]
        self._block: tuple[int, bytearray] | None = None  # the referenced block being gathered
        self.task = asyncio.get_running_loop().create_task(self._run())

    def can_join(self, start: int) -> bool:
        return not self.done and not self._stop and start >= self.pos

    def stop_when_idle(self) -> None:
        """Another pass takes over: end once the reads waiting on this one are served."""
        self._stop = True
        self._wake.set()

    async def wait_for(self, start: int, end: int) -> bytes:
        import asyncio
        if self.size is not None:
            end = min(end, self.size)
        if end <= start:
            return b""
        reader = [start, end, [], asyncio.get_running_loop().create_future()]
        self.readers.append(reader)
        if end > self.goal:
            self.goal = end
            self._wake.set()
        try:
            return await reader[3]
        finally:
            if reader in self.readers:
                self.readers.remove(reader)

    async def _run(self) -> None:
        import asyncio
        backend, error, ended = self.backend, None, False
        try:
            async with backend._object_slot(self.url):
                resp = await backend._request(self.url, "GET", {})
                async with resp:
                    backend.stats.request(self.url)
                    if resp.status != 200:
                        if resp.status >= 400:
                            backend._raise_for_status(self.url, resp)
                        raise Passing(f"HTTP {resp.status} to a plain GET")  # (a 206 to no Range: a lying server)
                    backend._check_response(self.url, resp.headers, resp.content_length)
                    self.size = resp.content_length
                    self._clip()
                    while True:
                        while self.pos < self.goal and not ended:
                            chunk = await resp.content.read(1 << 20)
                            if not chunk:
                                ended = True
                                break
                            self._feed(chunk)
                        if ended or (self._stop and not self.readers):
                            break
                        self._wake.clear()
                        if self.pos < self.goal:
                            continue
                        try:  # as far as asked: wait for a read further on
                            await asyncio.wait_for(self._wake.wait(), _PASS_IDLE)
                        except asyncio.TimeoutError:
                            break
                    if ended:
                        self._flush_block()
                    resp.close()  # the rest is not wanted: drop the connection
        except BaseException as e:  # noqa: BLE001 - handed to every reader, which retries or fails
            error = e
        finally:
            self.done = True
            if backend._downloads.get(self.url) is self:
                del backend._downloads[self.url]
            for start, end, parts, future in self.readers:
                if future.done():
                    continue
                if error is None and ended and self.size is None:  # no Content-Length: the body's end is the object's
                    future.set_result(b"".join(parts))
                else:
                    future.set_exception(error if isinstance(error, Exception)
                                         else Passing(f"body ended after {self.pos} bytes"))

    def _clip(self) -> None:
        for reader in self.readers:
            reader[1] = min(reader[1], self.size) if self.size is not None else reader[1]
            if reader[1] <= reader[0] and not reader[3].done():
                reader[3].set_result(b"")
        if self.size is not None:
            self.goal = min(self.goal, self.size)

    def _feed(self, chunk: bytes) -> None:
        lo, hi = self.pos, self.pos + len(chunk)
        self.pos = hi
        for start, end, parts, future in self.readers:
            if future.done() or hi <= start or lo >= end:
                continue
            parts.append(chunk[max(start, lo) - lo:min(end, hi) - lo])
            if hi >= end:
                future.set_result(b"".join(parts))
        self.readers = [r for r in self.readers if not r[3].done()]
        if self._runs:
            self._keep_referenced(chunk, lo, hi)
        if self.size is not None and hi >= self.size:
            self._flush_block()

    def _keep_referenced(self, chunk: bytes, lo: int, hi: int) -> None:
        """Gather the referenced blocks in [lo, hi) and hand each whole one to `backend.passing`."""
        bs = self.backend.passing.block_size
        index = lo // bs
        while index * bs < hi:
            run = bisect.bisect_right(self._firsts, index) - 1
            if run < 0 or self._runs[run][1] < index:  # not referenced: on to the next run's first block
                if run + 1 >= len(self._runs):
                    return
                index = self._runs[run + 1][0]
                continue
            a, b = max(index * bs, lo), min((index + 1) * bs, hi)
            if self._block is None or self._block[0] != index:
                if a != index * bs:  # joined after the block began (a pass always starts at 0): skip it
                    index += 1
                    continue
                self._block = (index, bytearray())
            self._block[1].extend(chunk[a - lo:b - lo])
            if len(self._block[1]) == bs:
                self._flush_block()
            index += 1

    def _flush_block(self) -> None:
        """Hand the block being gathered over (a whole one, or the object's last, shorter one)."""
        if self._block is not None and self._block[1]:
            index, data = self._block
            self.backend.passing.keep(self.url, index, bytes(data))
        self._block = None


def _refused_address(first: str, url: str, internal: OSError) -> FetchError:
    """The final error of a request refused as it connected (its reader gets EIO), logged once by
    whoever reads it: the url and the address."""
    if url == first:
        return FetchError(f"{redact(url)}: not connected: {internal}")
    return FetchError(f"{redact(first)}: redirect refused: {internal}")


def _route_from_env(url: str) -> dict:
    """aiohttp request options for `url` from the environment: its proxy unless NO_PROXY exempts
    the host (with the proxy's credentials from its url or ~/.netrc)."""
    route: dict = {}
    if not any(name.lower().endswith("_proxy") for name in os.environ):  # (what urllib's getproxies reads:
        return route                                                      # no proxy at all, no aiohttp import)
    from aiohttp.helpers import get_env_proxy_for_url

    target = URL(url)
    try:
        proxy, proxy_auth = get_env_proxy_for_url(target)
    except LookupError:
        pass
    else:
        route["proxy"] = proxy
        if proxy_auth is not None:
            route["proxy_headers"] = {"Proxy-Authorization": proxy_auth.encode()}
    return route


def _unverified() -> ssl.SSLContext:
    """{"ssl": false}: https without certificate checks, as aiohttp's ssl=False."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme, _host(parts)


def _host(parts) -> str:
    """host:port without user info (credentials in the url are not part of where it goes)."""
    return parts.netloc.rpartition("@")[2].lower()


async def _read_pieces(resp, start: int, end: int, piece: int, allow_eof: bool = False) -> list[bytes]:
    """The body's bytes [start, end) as pieces split at multiples of `piece`: each piece is copied
    once from the socket chunks, and the block cache keeps them as they are."""
    pieces = []
    for size in piece_sizes(start, end, piece):
        data = await _read_exactly(resp, size, allow_eof)
        if data:
            pieces.append(data)
        if len(data) < size:
            break
    return pieces


async def _read_exactly(resp, n: int, allow_eof: bool = False) -> bytes:
    parts = []
    got = 0
    while got < n:
        chunk = await resp.content.read(n - got)
        if not chunk:
            if allow_eof:
                break
            raise Passing(f"body ended after {got} of {n} bytes")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _total_from(content_range: str) -> int | None:
    m = re.fullmatch(r"bytes (?:\d+-\d+|\*)/(\d+)", content_range.strip())
    return int(m.group(1)) if m else None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


def _describe(e: BaseException) -> tuple[str, float | None]:
    if isinstance(e, Passing):
        return str(e), e.retry_after
    if isinstance(e, TimeoutError):  # (asyncio's, since 3.11)
        return "timed out (connection stalled)", None
    return f"{type(e).__name__}: {e}".rstrip(": "), None
