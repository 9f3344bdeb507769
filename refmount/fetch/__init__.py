"""Fetching remote bytes: one `Fetcher` routes each url to its backend by protocol.

- file paths and file:// -> `LocalBackend` (pread in a worker thread);
- http:// and https://  -> `HttpBackend`: with `http_client="stdlib"` (the default) the trio task hands
  each range to the stdlib engine (http.client in a worker thread, see direct.py), which takes plain
  206 answers and hands anything else to aiohttp on the asyncio loop thread (the general client);
- s3:// and s3a://      -> an `HttpBackend` whose requests go to urls obstore presigns (s3.py), unless
  `--remote-options` say something only s3fs can do;
- anything else         -> `FsspecBackend` (fsspec's async filesystems, `--remote-options`).

Callers are trio tasks; the asyncio side is reached through `run_on_asyncio`. A remote url whose
fetch just failed fails at once for a few seconds (the kernel retries a failed read immediately; that
retry must not get a second --read-timeout). Target protocols are classified in protocols.py.
"""

from __future__ import annotations

import threading
import time

import trio

from refmount.errors import FetchError, LoginFailed, NotFound, ReadRefused, Unavailable
from refmount.fetch.bridge import asyncio_loop, run_on_asyncio
from refmount.fetch.local import LocalBackend
from refmount.fetch.protocols import reaches_local
from refmount.fetch.retry import RetryPolicy
from refmount.fetch.stats import FetchStats, redact
from refmount.fetch.protocols import protocol_of

__all__ = ["Fetcher", "RetryPolicy", "FetchStats", "redact", "reaches_local"]

# The largest object size a server is believed: above every object store's own maximum (S3 50 TB,
# Azure 190.7 TiB, GCS 5 TiB). A size is shown (st_size) from a HEAD before any GET can check it: a
# claim past this is refused, not shown; one within it that the first GET's Content-Range contradicts
# is EIO with a "changed while mounted" line (fetch/http.py `_check_version`).
MAX_OBJECT_SIZE = 1 << 50
_FAILURES_KEPT = 10_000  # urls whose last failure a fetcher remembers (a retry within the window fails at once)


class Fetcher:
    def __init__(self, *, policy: RetryPolicy | None = None, remote_options: dict | None = None,
                 connections_per_host: int = 8, allow_cross_host_redirects: bool = False,
                 verify_remote: bool = False, http_client: str = "stdlib", logins=None,
                 s3_credentials_url: str | None = None) -> None:
        from refmount.fetch.auth import Logins
        from refmount.fetch.tls import ssl_setting

        self.policy = policy or RetryPolicy()
        self.remote_options = remote_options or {}
        self.stats = FetchStats()
        self.local = LocalBackend(self.stats)
        # netrc entries, cookies and bearer tokens per host, shared by every http path (auth.py)
        self.logins = logins if logins is not None else Logins(allow_cross_host_redirects=allow_cross_host_redirects)
        self.s3_credentials_url = s3_credentials_url  # temporary S3 credentials fetched from there (s3creds.py)
        self._http_options = dict(connections_per_host=connections_per_host,
                                  allow_cross_host_redirects=allow_cross_host_redirects,
                                  headers=self.remote_options.get("headers"), verify_remote=verify_remote,
                                  ssl=lambda: ssl_setting(self.remote_options), client=http_client, logins=self.logins)
        self._remotes: dict = {}  # protocol -> backend, made on first use (aiohttp alone takes 0.1 s to import)
        # url -> (when, kind, message) of its last failure: not the error itself, whose traceback holds
        # its frames (100,000 chunks answered 404 held 1.3 GB); at most _FAILURES_KEPT, the oldest forgotten
        self._failed: dict[str, tuple[float, type, str]] = {}
        self._loop = None
        self._warming: threading.Thread | None = None
        self._warm_protocols: set[str] = set()
        self.pool = None  # where the http paths receive bodies (the caches' buffer pool), if set
        self.passing = None  # keeps the referenced blocks of whole-object passes (cache/passing.py), if set
        self.max_full_download: int | None = None  # --max-full-download (None: the backend's default)

    def _backend(self, url: str):
        proto = protocol_of(url)
        if proto == "file":
            return self.local
        if proto in ("https", "s3a"):
            proto = proto[:-1]  # one backend, one connection pool
        backend = self._remotes.get(proto)
        if backend is None:
            if proto == "http":
                from refmount.fetch.http import HttpBackend

                backend = HttpBackend(self.policy, self.stats, **self._http_options)
                self._hand_over(backend)
            elif proto == "s3" and (backend := self._s3_backend()) is not None:
                pass
            else:
                from refmount.fetch.fsspec_backend import FsspecBackend

                backend = FsspecBackend(proto, self.remote_options, self.policy, self.stats)
            self._remotes[proto] = backend
        return backend

    def _s3_backend(self):
        """s3:// on the HTTP engine (s3.py), or None when the options need s3fs."""
        from refmount.fetch.s3 import s3_backend

        options = {k: v for k, v in self._http_options.items() if k not in ("headers", "ssl")}
        credentials = None
        if self.s3_credentials_url:
            from refmount.fetch.s3creds import TemporaryCredentials

            credentials = TemporaryCredentials(self.s3_credentials_url, self.fetch_document, self.logins)
        backend = s3_backend(self.remote_options, self.policy, self.stats, credentials=credentials, **options)
        if backend is not None:
            self._hand_over(backend)
        return backend

    def _hand_over(self, backend) -> None:
        """What an HTTP-engine backend shares with the caches: the buffer pool it receives into, the
        keeper of whole-object passes' blocks and --max-full-download."""
        backend.pool = self.pool
        backend.passing = self.passing
        if self.max_full_download is not None:
            backend.max_pass = self.max_full_download

    async def _signed(self, backend, url: str) -> None:
        """A backend that signs its requests (s3) has the bucket of `url` ready (in a thread, once)."""
        signer = getattr(backend, "signer", None)
        if signer is not None:
            await signer.ready(url)

    @staticmethod
    def import_backends(urls) -> None:
        """Import the code the remote backends for `urls` need. A mount does this in a thread while
        it comes up, and reports ready once they are in (see `warm_up`), rather than leave them to the
        first read (aiohttp takes 0.1 s)."""
        protocols = {protocol_of(url) for url in urls}
        if protocols & {"http", "https", "s3", "s3a"}:
            import refmount.fetch.cookies  # noqa: F401 - (a login's cookie: http.cookiejar takes 30 ms)
            import refmount.fetch.http  # noqa: F401
        if protocols & {"s3", "s3a"}:
            import refmount.fetch.s3  # noqa: F401
        if protocols - {"file", "http", "https"}:
            import refmount.fetch.fsspec_backend  # noqa: F401

    def begin_warm_up(self, urls) -> None:
        """Start importing the remote backends' code for `urls` in a thread now (aiohttp and fsspec's
        loop take 0.1 s each), while the mount comes up; `warm_up` finishes the job."""
        self._warming = threading.Thread(target=self._import_into, args=(urls,), name="refmount-warm-up",
                                         daemon=True)
        self._warming.start()

    def _import_into(self, urls) -> None:
        try:
            self._warm_protocols = self._import_remote(urls, self._http_options["client"] == "stdlib")
        except Exception:  # noqa: BLE001 - the first read that needs it reports the problem
            self._warm_protocols = set()

    async def warm_up(self, urls) -> None:
        """Have the remote backends for `urls` ready before the first read: their code imported, the
        asyncio loop running, the HTTP session open and the connections to the host of the first
        http(s) url opening. No request is made. Without it the first read of a mount paid 0.1-0.3 s
        for all of this, and a round trip (two with TLS) for its connection."""
        if self._warming is None:
            self.begin_warm_up(urls)
        await trio.to_thread.run_sync(self._warming.join)
        remote = self._warm_protocols
        if remote & {"http", "https"}:
            backend = self._backend("http://")
            first = next((url for url in urls if protocol_of(url) in ("http", "https")), None)
            if backend.direct:  # (its connections open in threads of their own: no asyncio needed)
                await backend.open(first)
            else:
                await run_on_asyncio(backend.open(first), self._asyncio())
        if remote & {"s3", "s3a"}:
            first = next(url for url in urls if protocol_of(url) in ("s3", "s3a"))
            backend = self._backend(first)
            if getattr(backend, "signer", None) is not None:
                await self._signed(backend, first)
                await run_on_asyncio(backend.open(first), self._asyncio())

    @staticmethod
    def _import_remote(urls, direct: bool = False) -> set[str]:
        """The remote protocols of `urls`, their backends' code imported and the asyncio loop started
        (not for http(s) alone on the stdlib engine (`direct`): the loop, and fsspec, come with the
        first answer that needs aiohttp)."""
        remote = {protocol_of(url) for url in urls} - {"file"}
        if remote:
            Fetcher.import_backends(f"{proto}://" for proto in remote)
            if not (direct and remote <= {"http", "https"}):
                asyncio_loop()  # starts fsspec's loop thread
        return remote

    def _asyncio(self):
        if self._loop is None:
            self._loop = asyncio_loop()
        return self._loop

    async def read(self, url: str, start: int, end: int, piece: int = 0) -> list[bytes]:
        """Bytes [start, min(end, size)) of `url` (shorter only at the end of the object), as pieces
        split at multiples of `piece` (one piece if 0; none past the end)."""
        backend = self._backend(url)
        if backend is self.local:
            try:
                return await trio.to_thread.run_sync(self.local.read, url, start, end, piece, abandon_on_cancel=True)
            except FetchError as e:
                self.stats.error(url, e)
                raise
        return await self._remembering_failure(url, lambda: self._read_remote(backend, url, start, end, piece))

    async def _read_remote(self, backend, url: str, start: int, end: int, piece: int) -> list[bytes]:
        """A range the http backend's stdlib engine takes is fetched from here (the request in a
        worker thread, no asyncio hop); anything else, or anything unusual there, on the asyncio side,
        within the same --read-timeout."""
        await self._signed(backend, url)
        takes = getattr(backend, "takes", None)
        if takes is None or not takes(url, start, end):
            return await run_on_asyncio(backend.read(url, start, end, piece), self._asyncio())
        from refmount.fetch.http import HandOver

        started = time.monotonic()
        try:
            return await backend.read_direct(url, start, end, piece, started)
        except HandOver as e:
            failed = e.failure
        return await run_on_asyncio(backend.read(url, start, end, piece, started=started, failed=failed),
                                    self._asyncio())

    async def _remembering_failure(self, url: str, operation):
        """Run a remote operation (an async callable), but fail at once if the url failed a moment ago:
        the kernel retries a failed read straight away, and that retry must not start a whole new
        --read-timeout."""
        failed = self._failed.get(url)
        if failed is not None:
            ago = time.monotonic() - failed[0]
            if ago < self._failure_window():
                self.stats.error(url, "repeated")
                # (the same kind: a refused login stays EACCES, a 404 stays a missing object, a hiccup one that may pass)
                kind = next((k for k in (LoginFailed, NotFound, Unavailable) if issubclass(failed[1], k)), FetchError)
                error = kind(f"{failed[2]} ({ago:.1f}s ago; not retried yet)")
                error.repeated = True  # (a refused login is logged once, not again at the kernel's retry)
                raise error
            del self._failed[url]
        try:
            return await operation()
        except ReadRefused:
            raise  # (a limit refused that read, the url did not fail)
        except FetchError as e:
            self._remember_failure(url, e)
            raise

    def _failure_window(self) -> float:
        return min(self.policy.failure_memory, max(1.0, self.policy.read_timeout))

    def _remember_failure(self, url: str, e: FetchError) -> None:
        now = time.monotonic()
        if len(self._failed) >= _FAILURES_KEPT:  # (past their window they only take room)
            window = self._failure_window()
            for gone in [u for u, (when, _, _) in self._failed.items() if now - when >= window]:
                del self._failed[gone]
            while len(self._failed) >= _FAILURES_KEPT:
                del self._failed[next(iter(self._failed))]  # (the oldest: dicts keep insertion order)
        self._failed.pop(url, None)
        self._failed[url] = (now, type(e), str(e))

    async def fetch_document(self, url: str) -> bytes:
        """A small http(s) document (e.g. temporary S3 credentials), through the login like any read."""
        from refmount.fetch.s3creds import MAX_DOCUMENT

        backend = self._backend(url)
        return await run_on_asyncio(backend.document(url, MAX_DOCUMENT), self._asyncio())

    def known_size(self, url: str) -> int | None:
        """The size of `url` if an earlier request told it (no I/O), else None."""
        return self._backend(url).known_size(url)

    async def size(self, url: str) -> int:
        backend = self._backend(url)
        if backend is self.local:
            return await trio.to_thread.run_sync(self.local.size, url, abandon_on_cancel=True)

        async def size():
            await self._signed(backend, url)
            size = await self._size_direct(backend, url)
            size = size if size is not None else await run_on_asyncio(backend.size(url), self._asyncio())
            if size > MAX_OBJECT_SIZE:
                raise FetchError(f"{redact(url)}: its server says it holds {size:,} bytes, more than any object "
                                 "store keeps (1 PiB): not believed")
            return size

        return await self._remembering_failure(url, size)

    async def identity(self, url: str) -> str | None:
        """A validator naming this version of a remote object (for the disk cache), or None when
        there is none or the object is a local file (not worth caching on local disk again)."""
        backend = self._backend(url)
        if backend is self.local:
            return None
        await self._signed(backend, url)
        size = await self._size_direct(backend, url)
        if size is not None:
            return backend.identity_known(url, size)
        return await run_on_asyncio(backend.identity(url), self._asyncio())

    @staticmethod
    async def _size_direct(backend, url: str) -> int | None:
        """The object's size from the stdlib engine's HEAD, if the backend has one and it answered
        plainly (HttpBackend.size_direct), else None."""
        size_direct = getattr(backend, "size_direct", None)
        return None if size_direct is None else await size_direct(url)

    def forget(self, url: str) -> None:
        """Forget the version of `url` seen so far (its size and validators, a local file's descriptor),
        so that the next request takes the object as it is now: a --refresh found another version."""
        self._failed.pop(url, None)
        forget = getattr(self._backend(url), "forget", None)
        if forget is not None:
            forget(url)

    def validators(self, url: str) -> tuple[str | None, str | None]:
        """(ETag, Last-Modified) first seen for `url` (no I/O; after identity() or a read), each None
        when the server gave none or the backend does not keep them."""
        return getattr(self._backend(url), "validators", lambda _: (None, None))(url)

    def close_unused(self) -> None:
        """Let go of a fetcher no trio run has used (a build dropped before it was mounted: a wrong
        page guess, fuse/daemon.py `_build`): its warm-up thread joined (it only imports, which cannot
        be stopped midway and which the build again needs too), its files and connections closed."""
        import asyncio

        if self._warming is not None:
            self._warming.join()
        self.local.close()
        for backend in self._remotes.values():
            asyncio.run_coroutine_threadsafe(backend.close(), self._asyncio()).result(timeout=30)
        self._remotes.clear()

    async def aclose(self) -> None:
        self.local.close()
        for backend in self._remotes.values():
            if self._loop is not None:
                await run_on_asyncio(backend.close(), self._loop)
            elif hasattr(backend, "close_direct"):  # (only the stdlib engine was used: no aiohttp session to close)
                backend.close_direct()
