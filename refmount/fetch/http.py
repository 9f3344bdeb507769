"""HTTP(S) byte ranges through one pooled, keep-alive aiohttp session, with verification and retries.

Every answer is checked before its bytes are used: a 206 must carry exactly the Content-Range that
was asked for (clipped at the end of the object) and exactly that many bytes; a 200 to a ranged
request (a server ignoring Range) is sliced; the object's validator (ETag, else size) must not
change while mounted, so bytes of two versions are never mixed.
"""

from __future__ import annotations

import asyncio
import re
import time
from urllib.parse import urljoin, urlsplit

import aiohttp

from refmount.errors import FetchError, RemoteChanged
from refmount.fetch.pieces import piece_sizes
from refmount.fetch.retry import RetryPolicy
from refmount.fetch.stats import FetchStats, redact

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_MAX_REDIRECTS = 5


class _Retry(Exception):
    """A transient failure worth another attempt."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class HttpBackend:
    def __init__(self, policy: RetryPolicy, stats: FetchStats, *, connections_per_host: int = 8,
                 allow_cross_host_redirects: bool = False, headers: dict | None = None):
        self.policy = policy
        self.stats = stats
        self.connections_per_host = connections_per_host
        self.allow_cross_host_redirects = allow_cross_host_redirects
        self.headers = headers or {}
        self._session: aiohttp.ClientSession | None = None
        self._validators: dict[str, tuple[str | None, int | None]] = {}
        self._sizes: dict[str, int] = {}
        self._modified: dict[str, str] = {}

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.connections_per_host,
                                             keepalive_timeout=60, ttl_dns_cache=300)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.policy.connect_timeout,
                                            sock_read=self.policy.stall_timeout)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout,
                                                  headers=self.headers, auto_decompress=False,
                                                  trust_env=True)  # HTTP(S)_PROXY, NO_PROXY, --proxy
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- public operations (asyncio side) ----------------------------------------------------------

    async def read(self, url: str, start: int, end: int, piece: int = 0) -> list[bytes]:
        """Bytes [start, min(end, size)) of `url` as pieces split at multiples of `piece` (one piece if
        0); no pieces when start is at or past the end."""
        return await self._with_retries(url, lambda: self._get_range(url, start, end, piece))

    def known_size(self, url: str) -> int | None:
        """The object's size if a response has told it already (no I/O)."""
        return self._sizes.get(url) or self._validators.get(url, (None, None))[1]

    async def size(self, url: str) -> int:
        if url not in self._sizes:
            self._sizes[url] = await self._with_retries(url, lambda: self._probe_size(url))
        return self._sizes[url]

    async def identity(self, url: str) -> str | None:
        """What names this version of the object: a strong ETag, else its size and Last-Modified;
        None when the server gives neither (one HEAD per url, shared with size())."""
        size = await self.size(url)
        etag = self._validators.get(url, (None, None))[0]
        if etag and not etag.startswith("W/"):  # a weak ETag does not promise identical bytes
            return f"etag {etag}"
        modified = self._modified.get(url)
        return f"size {size} modified {modified}" if modified else None

    # -- one attempt -----------------------------------------------------------------------------

    async def _request(self, url: str, method: str, headers: dict):
        """Issue a request, following same-host redirects only (unless allowed)."""
        session = self._session_now()
        for _ in range(_MAX_REDIRECTS + 1):
            resp = await session.request(method, url, headers=headers, allow_redirects=False)
            if resp.status not in (301, 302, 303, 307, 308):
                return resp
            target = urljoin(url, resp.headers.get("Location", ""))
            resp.release()
            if urlsplit(target).netloc != urlsplit(url).netloc and not self.allow_cross_host_redirects:
                raise FetchError(f"{redact(url)}: redirect to another host {redact(target)} refused "
                                 "(--allow-cross-host-redirects allows it)")
            url = target
        raise FetchError(f"{redact(url)}: too many redirects")

    async def _get_range(self, url: str, start: int, end: int, piece: int) -> list[bytes]:
        if end <= start:
            return []
        t0 = time.monotonic()
        resp = await self._request(url, "GET", {"Range": f"bytes={start}-{end - 1}"})
        async with resp:
            self.stats.requests += 1
            status = resp.status
            if status == 206:
                pieces = await self._read_206(url, resp, start, end, piece)
            elif status == 200:
                pieces = await self._read_200_sliced(url, resp, start, end, piece)
            elif status == 416:
                total = _total_from(resp.headers.get("Content-Range", ""))
                if total is not None and start < total:
                    raise _Retry(f"416 for a range inside the object ({total} bytes)")
                pieces = []
            else:
                self._raise_for_status(url, resp)
        self.stats.record(sum(map(len, pieces)), time.monotonic() - t0)
        return pieces

    async def _read_206(self, url, resp, start, end, piece) -> list[bytes]:
        m = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
        if not m:
            raise _Retry("206 without a valid Content-Range")
        first, last = int(m.group(1)), int(m.group(2))
        total = None if m.group(3) == "*" else int(m.group(3))
        self._check_validator(url, resp, total)
        want_last = end - 1 if total is None else min(end, total) - 1
        if first != start or last != want_last:
            raise _Retry(f"Content-Range {m.group(0)!r} does not match the requested bytes={start}-{end - 1}")
        return await _read_pieces(resp, start, last + 1, piece)

    async def _read_200_sliced(self, url, resp, start, end, piece) -> list[bytes]:
        """The server ignored Range: stream the body, keeping only the wanted slice."""
        self._check_validator(url, resp, resp.content_length)
        if resp.content_length is not None and start >= resp.content_length:
            return []
        skipped = 0
        while skipped < start:
            chunk = await resp.content.read(min(start - skipped, 1 << 20))
            if not chunk:
                return []
            skipped += len(chunk)
        if resp.content_length is not None:
            end = min(end, resp.content_length)
        return await _read_pieces(resp, start, end, piece, allow_eof=resp.content_length is None)

    async def _probe_size(self, url: str) -> int:
        resp = await self._request(url, "HEAD", {})
        async with resp:
            self.stats.requests += 1
            if resp.status == 200 and resp.content_length is not None:
                self._check_validator(url, resp, resp.content_length)
                return resp.content_length
            if resp.status not in (200, 405, 501):
                self._raise_for_status(url, resp)
        # No usable HEAD: a one-byte GET tells the size through Content-Range.
        resp = await self._request(url, "GET", {"Range": "bytes=0-0"})
        async with resp:
            self.stats.requests += 1
            if resp.status == 206:
                total = _total_from(resp.headers.get("Content-Range", ""))
                if total is not None:
                    self._check_validator(url, resp, total)
                    return total
            elif resp.status == 416:
                return 0
            elif resp.status == 200 and resp.content_length is not None:
                return resp.content_length
            else:
                self._raise_for_status(url, resp)
        raise FetchError(f"{redact(url)}: the server does not tell the object's size")

    def _raise_for_status(self, url: str, resp) -> None:
        status = resp.status
        if self.policy.retryable_status(status):
            raise _Retry(f"HTTP {status}", _retry_after(resp.headers.get("Retry-After")))
        raise FetchError(f"{redact(url)}: HTTP {status} {resp.reason or ''}".rstrip())

    def _check_validator(self, url: str, resp, total: int | None) -> None:
        etag = resp.headers.get("ETag")
        if "Last-Modified" in resp.headers:
            self._modified.setdefault(url, resp.headers["Last-Modified"])
        seen = self._validators.get(url)
        if seen is None:
            self._validators[url] = (etag, total)
            return
        old_etag, old_total = seen
        if (etag and old_etag and etag != old_etag) or (total is not None and old_total is not None
                                                          and total != old_total):
            raise RemoteChanged(f"{redact(url)}: the remote object changed while mounted "
                                f"(ETag {old_etag} -> {etag}, size {old_total} -> {total})")
        if old_etag is None and etag or old_total is None and total is not None:
            self._validators[url] = (old_etag or etag, old_total if old_total is not None else total)

    # -- retries --------------------------------------------------------------------------------

    async def _with_retries(self, url: str, attempt_once):
        policy = self.policy
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + policy.read_timeout
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout(max(deadline - loop.time(), 0.001)):
                    return await attempt_once()
            except FetchError:
                self.stats.errors += 1
                raise
            except (_Retry, aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
                reason, retry_after = _describe(e)
            delay = policy.backoff(attempt, retry_after)
            if loop.time() + delay >= deadline or attempt >= policy.max_attempts:
                self.stats.errors += 1
                raise FetchError(f"{redact(url)}: gave up after {attempt} attempts in "
                                 f"{loop.time() - started:.1f}s; last error: {reason}")
            self.stats.retries += 1
            await asyncio.sleep(delay)


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
            raise _Retry(f"body ended after {got} of {n} bytes")
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
    if isinstance(e, _Retry):
        return str(e), e.retry_after
    if isinstance(e, asyncio.TimeoutError):
        return "timed out (connection stalled)", None
    return f"{type(e).__name__}: {e}".rstrip(": "), None
