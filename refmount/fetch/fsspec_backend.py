"""Every other protocol (s3://, gs://, az://, ...) through fsspec, with `--remote-options`."""

from __future__ import annotations

import asyncio
import time

from refmount.errors import FetchError, RefmountError, Unavailable
from refmount.fetch.pieces import split
from refmount.fetch.retry import RetryPolicy, passing, policy_now
from refmount.fetch.stats import FetchStats, redact
from refmount.fetch.tls import certificate_problem


def _with_ca_bundle(protocol: str, options: dict) -> dict:
    """For s3: --ca-bundle, and {"ssl": false} as botocore's verify=False (s3fs would ignore "ssl"),
    unless the options name their own "verify"; without --ca-bundle botocore reads AWS_CA_BUNDLE."""
    from refmount.fetch.tls import explicit_ca_bundle

    client_kwargs = options.get("client_kwargs") or {}
    if protocol not in ("s3", "s3a") or "verify" in client_kwargs:
        return options
    if options.get("ssl") is False:
        verify = False
    elif explicit_ca_bundle() is not None:
        verify = explicit_ca_bundle()
    else:
        return options
    options = {key: value for key, value in options.items() if key != "ssl"}
    return {**options, "client_kwargs": {**client_kwargs, "verify": verify}}


def under_policy(protocol: str, options: dict) -> dict:
    """fsspec's `options` for `protocol`, with the timeouts of this context's retry policy if it has one
    (fetch/retry.py `retry_under`: a --refresh's), so that a refresh's listing of S3 or its look at an
    Icechunk branch gives up as its listing of an index page does. Unbounded, s3fs and botocore each
    retry on their own (5-12 s to fail on a dead endpoint: botocore's backoff is seconds long; s3fs's own,
    kept, is 0.1 s growing), and fsspec's http waits up to aiohttp's 300 s for an answer (the policy's
    stall and connect timeouts instead: a large snapshot may take longer than a read_timeout)."""
    policy = policy_now()
    if policy is None:
        return options
    if protocol in ("s3", "s3a"):
        return {**options, "config_kwargs": {**(options.get("config_kwargs") or {}),
                                             "connect_timeout": policy.connect_timeout,
                                             "read_timeout": policy.stall_timeout,
                                             "retries": {"total_max_attempts": 1, "mode": "standard"}}}
    if protocol in ("http", "https"):
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=None, sock_connect=policy.connect_timeout, sock_read=policy.stall_timeout)
        return {**options, "client_kwargs": {**(options.get("client_kwargs") or {}), "timeout": timeout}}
    return options


class FsspecBackend:
    """Async fsspec filesystems run on fsspec's asyncio loop; the methods here are coroutines for it."""

    def __init__(self, protocol: str, options: dict, policy: RetryPolicy, stats: FetchStats) -> None:
        import fsspec

        self.protocol = protocol
        self.policy = policy
        self.stats = stats
        options = _with_ca_bundle(protocol, options)
        try:
            self.fs = fsspec.filesystem(protocol, **options)
        except (ImportError, ValueError) as e:
            raise RefmountError(f"protocol {protocol!r} is not available: {e}") from None
        self.is_async = getattr(self.fs, "async_impl", False)
        self._infos: dict[str, dict] = {}

    async def _call(self, url: str, method: str, *args, **kwargs):
        loop = asyncio.get_running_loop()
        started = loop.time()
        policy = policy_now(self.policy)
        attempt = 0
        while True:
            attempt += 1
            try:
                async with asyncio.timeout(max(started + policy.read_timeout - loop.time(), 0.001)):
                    if self.is_async:
                        return await getattr(self.fs, "_" + method)(*args, **kwargs)
                    return await asyncio.to_thread(getattr(self.fs, method), *args, **kwargs)
            except (FileNotFoundError, PermissionError) as e:
                if passing(e) is None:  # (fsspec's http says a 503 so too: asked again)
                    self.stats.error(url, e)
                    raise FetchError(f"{redact(url)}: {type(e).__name__}: {e}") from None
                reason, last = f"{type(e).__name__}: {e}", e
            except Exception as e:  # each backend raises its own error types
                tls = certificate_problem(e)
                if tls is not None:  # a certificate does not get better by asking again
                    self.stats.error(url, "tls")
                    raise FetchError(f"{tls} for {redact(url)}") from None
                reason = f"{type(e).__name__}: {e}"
                last = e
            delay = policy.backoff(attempt)
            if loop.time() + delay >= started + policy.read_timeout or attempt >= policy.max_attempts:
                self.stats.error(url, last)
                kind = Unavailable if passing(last) is not None else FetchError  # (another backend's own errors: unknown)
                raise kind(f"{redact(url)}: gave up after {attempt} attempts; last error: {reason}")
            self.stats.retry(url)
            await asyncio.sleep(delay)

    async def read(self, url: str, start: int, end: int, piece: int = 0) -> list[bytes]:
        t0 = time.monotonic()
        size = await self.size(url)
        end = min(end, size)
        if end <= start:
            return []
        data = await self._call(url, "cat_file", url, start=start, end=end)
        self.stats.request(url)
        if len(data) != end - start:
            self.stats.error(url, "protocol")
            raise FetchError(f"{redact(url)}: asked for {end - start} bytes, got {len(data)}")
        self.stats.record(url, len(data), time.monotonic() - t0)
        return split(data, start, piece)

    async def _info(self, url: str) -> dict:
        if url not in self._infos:
            self._infos[url] = await self._call(url, "info", url)
            self.stats.request(url)
        return self._infos[url]

    def forget(self, url: str) -> None:
        self._infos.pop(url, None)

    def known_size(self, url: str) -> int | None:
        info = self._infos.get(url)
        return int(info["size"]) if info is not None else None

    async def size(self, url: str) -> int:
        return int((await self._info(url))["size"])

    async def identity(self, url: str) -> str | None:
        """A strong validator from the object's info (ETag or generation, else size and modification
        time), or None; each store names these fields its own way."""
        info = await self._info(url)
        for key in ("ETag", "etag", "generation", "VersionId", "version_id"):
            if info.get(key) and not str(info[key]).startswith("W/"):
                return f"{key} {info[key]}"
        for key in ("LastModified", "last_modified", "mtime", "updated", "modified"):
            if info.get(key):
                return f"size {info['size']} modified {info[key]}"
        return None

    def validators(self, url: str) -> tuple[str | None, object]:
        """(ETag, last modification) of the object's info once fetched (no I/O), each None if absent;
        the modification is what the store gives (s3fs: a datetime)."""
        info = self._infos.get(url) or {}
        etag = next((str(info[k]) for k in ("ETag", "etag") if info.get(k)), None)
        modified = next((info[k] for k in ("LastModified", "last_modified", "mtime", "updated", "modified")
                         if info.get(k)), None)
        return etag, modified

    async def close(self) -> None:
        pass
