"""Open a reference file wherever it lives (local path, file://, http(s)://, any fsspec url) as a
binary stream, transparently decompressing gzip, bz2, xz and zstd (by suffix or magic bytes)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os

from refmount.errors import LoginFailed, RefmountError, Unavailable, quote
from refmount.fetch.protocols import is_remote, local_path, protocol_of

_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bz2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}
_SUFFIX = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}


def _open_raw(location: str, remote_options: dict):
    if not is_remote(location):
        path = local_path(location)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise RefmountError(f"reference file {quote(location)} does not exist") from None
        except IsADirectoryError:
            raise RefmountError(f"reference file {quote(location)} is a directory without .zmetadata") from None
        except OSError as e:
            raise RefmountError(f"cannot read reference file {quote(location)}: {e.strerror}") from None
    import fsspec

    from refmount.fetch.addresses import InternalAddress
    from refmount.fetch.stats import redact
    from refmount.fetch.tls import certificate_problem

    # http(s): read front to back as one stream (one GET, not one per 5 MiB block), so that a server
    # that ignores Range serves it too; --max-refs-size bounds how much of it is read
    streamed = {"block_size": 0} if protocol_of(location) in ("http", "https") else {}
    try:
        return fsspec.open(location, "rb", **fsspec_options(location, remote_options), **streamed).open()
    except LoginFailed as e:
        raise LoginFailed(f"reference file {redact(location)!r}: {e}") from None
    except RefmountError:
        raise
    except Exception as e:  # network errors of every kind from every fsspec backend
        login = _cause(e, LoginFailed)
        if login is not None:
            raise LoginFailed(f"reference file {redact(location)!r}: {login}") from None
        refused = _cause(e, RedirectRefused)
        if refused is not None:
            raise RefmountError(f"reference file {redact(location)!r}: {refused}") from None
        internal = _cause(e, InternalAddress)
        if internal is not None:
            raise RefmountError(f"reference file {redact(location)!r}: redirect refused: {internal}") from None
        tls = certificate_problem(e)
        if tls is not None:
            raise RefmountError(f"{tls} for reference file {redact(location)!r}") from None
        passing = unavailable(f"reference file {quote(redact(location))}", e)
        if passing is not None:
            raise passing from None
        if isinstance(e, FileNotFoundError):  # fsspec's http raises this for connection failures too
            reason = _connection_failure(e)
            if reason:
                raise RefmountError(f"cannot reach the server of reference file {quote(redact(location))}: "
                                    f"{reason}") from None
            raise RefmountError(f"reference file {quote(redact(location))} was not found on its server") from None
        if isinstance(e, ImportError):
            raise RefmountError(f"cannot open {quote(redact(location))}: {e}") from None
        raise RefmountError(f"cannot fetch reference file {quote(redact(location))}: {type(e).__name__}: {e}") from None


class RedirectRefused(RefmountError):
    """A redirect of the reference file that our policy does not follow."""


def fsspec_options(location: str, remote_options: dict) -> dict:
    """fsspec's options for the reference file. For http(s): the same certificate authorities as for
    targets, and the same headers, credentials and redirect policy, decided hop by hop by the one
    `Trail` of fetch/auth.py that the HTTP engine asks too: the user's headers (--remote-options
    "headers") go to the origin only (so they are taken out of what fsspec sends on every hop), each
    host gets only its own netrc entry, bearer token and cookies (the mount's jar), a redirect goes
    where `Trail.redirect_refused` lets it, and names are resolved through addresses.py's guard; a
    refused login fails the mount in one line."""
    from refmount.fetch.fsspec_backend import under_policy

    if protocol_of(location) not in ("http", "https"):
        return under_policy(protocol_of(location), remote_options)
    import contextvars

    import aiohttp

    from refmount.fetch import addresses
    from refmount.fetch.auth import active
    from refmount.fetch.retry import documents_policy
    from refmount.fetch.tls import ssl_setting

    logins = active()
    user_headers = dict(remote_options.get("headers") or {})
    chain: contextvars.ContextVar = contextvars.ContextVar("refmount_login_trail")

    async def on_start(session, context, params) -> None:  # (in the task that sends every hop)
        chain.set(logins.trail(str(params.url), user_headers))

    async def with_credentials(request, handler):
        url = str(request.url)
        trail = chain.get(None) or logins.trail(url, user_headers)
        request.headers.update(trail.headers(url))
        guard = trail.guards(url)
        if guard and trail.unreachable(url):  # (aiohttp resolves no address literal: judged here)
            raise addresses.InternalAddress(trail.unreachable(url))
        with addresses.guarded(guard, trail.why_guarded()):
            response = await handler(request)
        location = response.headers.get("Location")
        from urllib.parse import urljoin

        trail.answered(url, response.status, response.headers.getall("Set-Cookie", []),
                       urljoin(url, location) if location and response.status in (301, 302, 303, 307, 308) else None)
        return response

    async def on_redirect(session, context, params) -> None:
        from urllib.parse import urljoin, urlsplit

        here = urlsplit(str(params.url))
        target = urljoin(str(params.url), params.response.headers.get("Location", ""))
        trail = chain.get(None) or logins.trail(str(params.url), user_headers)
        refused = trail.redirect_refused(str(params.url), target)
        if refused:
            raise RedirectRefused(f"from {here.scheme}://{here.netloc}: {refused}")

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    trace.on_request_redirect.append(on_redirect)
    client_kwargs = dict(remote_options.get("client_kwargs") or {})
    # a server that hangs: no connection, or no byte, within the mount's --stall-timeout (aiohttp's own
    # bound is 5 minutes); the whole load is bounded by --load-timeout
    policy = documents_policy()
    client_kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=policy.connect_timeout,
                                                              sock_read=policy.stall_timeout))
    client_kwargs["trace_configs"] = [*client_kwargs.get("trace_configs", []), trace]
    client_kwargs["middlewares"] = [*client_kwargs.get("middlewares", []), with_credentials]

    async def get_client(**kwargs):  # (in fsspec's loop: a cookie jar needs one)
        kwargs.setdefault("cookie_jar", aiohttp.DummyCookieJar())  # the mount's jar keeps them
        kwargs.setdefault("connector", aiohttp.TCPConnector(resolver=addresses.resolver(), use_dns_cache=False))
        return aiohttp.ClientSession(**kwargs)

    options = under_policy("http", {**{k: v for k, v in remote_options.items() if k != "headers"},
                                    "ssl": ssl_setting(remote_options), "client_kwargs": client_kwargs})
    options.setdefault("get_client", get_client)
    return options


def _cause(error: BaseException | None, kind: type):
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _connection_failure(error: BaseException) -> str | None:
    """Why a connection failed, if the cause chain of `error` says so (else None: truly not found)."""
    import socket

    from refmount.fetch.retry import unresolved

    chain = []
    cause = error.__cause__ or error.__context__
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for cause in chain:
        if isinstance(cause, socket.gaierror):
            return unresolved(cause, chain)
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
    for cause in chain:
        if isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError):
            return f"{type(cause).__name__}: {cause}"
    return None


def unavailable(what: str, error: BaseException) -> Unavailable | None:
    """The error of `what` (its kind and quoted url: "reference file 'http://...'") when the reason it
    failed may pass (fetch/retry.py `passing`): asked again later where something asks again (a
    catalog's store item, refmount.fuse.datasets), not refused for good. None otherwise."""
    from refmount.fetch.retry import passing

    reason = passing(error)
    if reason is None:
        return None
    return Unavailable(f"{'cannot fetch' if reason.startswith('HTTP ') else 'cannot reach the server of'} {what}: "
                       f"{reason}")


def compression_of(location: str, head: bytes) -> str | None:
    for suffix, kind in _SUFFIX.items():
        if location.lower().endswith(suffix):
            return kind
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


def open_reference_file(location: str, remote_options: dict | None = None):
    """A readable binary stream of the (decompressed) reference file."""
    return decompressed(_open_raw(location, remote_options or {}), location)


def decompressed(raw, location: str):
    """Binary stream `raw` of `location`, decompressed if its name or first bytes say it is compressed."""
    if not isinstance(raw, io.BufferedIOBase) or not hasattr(raw, "peek"):
        raw = io.BufferedReader(raw) if hasattr(raw, "readinto") else raw
    head = raw.peek(8)[:8] if hasattr(raw, "peek") else b""
    kind = compression_of(location, head)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw)
    if kind == "bz2":
        return bz2.BZ2File(raw)
    if kind == "xz":
        return lzma.LZMAFile(raw)
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def is_parquet_location(location: str, remote_options: dict | None = None) -> bool:
    """A Parquet reference set is a directory holding .zmetadata. An http(s) url of a directory
    (`http://host/dir/`) is asked, once: a `.zmetadata` there makes it Parquet; without one it is a
    directory of data files (its HTML index lists them: refs/scan/sources.py)."""
    if not is_remote(location):
        return os.path.isdir(local_path(location))
    stripped = location.rstrip("/")
    if stripped.endswith((".parq", ".parquet")):
        return True
    if not location.endswith("/"):
        return False
    if protocol_of(location) not in ("http", "https"):
        return True
    found = _zmetadata_found.get(location)
    if found is None:
        from refmount.errors import FetchError
        from refmount.fetch.pages import exists
        from refmount.fetch.stats import redact

        try:
            found = _zmetadata_found[location] = exists(location + ".zmetadata", remote_options)
        except FetchError as e:  # (a server down for now: asked again where something asks again)
            kind = Unavailable if isinstance(e, Unavailable) else RefmountError
            raise kind(f"cannot tell what {quote(redact(location))} is: {e}") from None
    return found


_zmetadata_found: dict[str, bool] = {}  # http(s) directory url -> whether it has a .zmetadata (asked once)
