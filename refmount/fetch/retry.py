"""The retry policy, as an immutable value (in the style of urllib3's Retry), and the one decision of
whether a failure may pass (`passing`): every client of the mount asks it, whatever raised the error
(the HTTP engine's attempts, fsspec's and s3fs's clients, a scan's loaders)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import random
from dataclasses import dataclass

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# errnos of a connection that failed for a reason that may pass (beside ConnectionError's and TimeoutError's)
_PASSING_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTDOWN,
                             errno.ECONNABORTED, errno.ETIMEDOUT})


@dataclass(frozen=True)
class RetryPolicy:
    read_timeout: float = 30.0  # total seconds one read may spend, retries included
    stall_timeout: float = 10.0  # seconds without a byte before a connection is abandoned
    connect_timeout: float = 10.0
    backoff_base: float = 0.05
    backoff_max: float = 2.0
    max_attempts: int = 20
    failure_memory: float = 5.0  # seconds a url that just gave up fails at once (the kernel retries reads)

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before attempt `attempt` (1-based count of failures so far):
        exponential with full jitter, or the server's Retry-After when it gave one."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max * 4)
        cap = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
        return random.uniform(cap / 2, cap)

    def retryable_status(self, status: int) -> bool:
        return passing_status(status)

    def asked_again(self) -> RetryPolicy:
        """This policy for a fetch whose caller asks again later anyway (a --refresh's listing, a lazy
        mount's first look at a file): once more after a hiccup, then give up. A server that is down
        then fails it in a second or two (connection refused) or a few (no answer), not after a
        --read-timeout of retries (22 s measured): bench/bench_refresh_down.py."""
        return dataclasses.replace(self, read_timeout=min(self.read_timeout, 6.0),
                                   connect_timeout=min(self.connect_timeout, 3.0),
                                   stall_timeout=min(self.stall_timeout, 3.0), max_attempts=3,
                                   backoff_max=min(self.backoff_max, 0.5))


ASKED_AGAIN = RetryPolicy().asked_again()

# The policy of fetches made in this context (None: each client's own): a --refresh's task and a lazy
# mount's scan set it; the threads they start through trio and the asyncio tasks they submit copy it.
_now: contextvars.ContextVar[RetryPolicy | None] = contextvars.ContextVar("refmount_retry_policy", default=None)


def retry_under(policy: RetryPolicy | None) -> None:
    """Fetches from now on by this task (or thread), and by what it starts, retry as `policy` says
    (None: as their client's own policy)."""
    _now.set(policy)


@contextlib.contextmanager
def retrying_under(policy: RetryPolicy | None):
    """`retry_under(policy)` for the fetches made inside the block (and by what they start) only."""
    token = _now.set(policy)
    try:
        yield
    finally:
        _now.reset(token)


def policy_now(default: RetryPolicy | None = None) -> RetryPolicy | None:
    """The policy this context's fetches retry under (`retry_under`), else `default`."""
    return _now.get() or default


_documents: RetryPolicy | None = None  # the mount's, for documents (bound_documents_by)


def bound_documents_by(policy: RetryPolicy | None) -> None:
    """The documents a mount reads to know what it serves (a listing's index pages, a catalog's
    documents, reference files and a store's metadata) are asked under `policy` from now on: the
    mount's --read-timeout and --stall-timeout, so that a server that hangs fails the mount in that
    time, in one line naming the url. None: the defaults."""
    global _documents
    _documents = policy


def documents_policy() -> RetryPolicy:
    """The policy documents are asked under: this context's (retry_under), else the mount's."""
    return policy_now(_documents or RetryPolicy())


def passing_status(status: int) -> bool:
    """An HTTP answer that asking again may change: 408, 429, 500, 502, 503, 504."""
    return status in RETRY_STATUSES


class Passing(Exception):
    """A failure the raiser knows may pass (an answer broken on the way: a short body, a wrong
    Content-Range; a 503), with the server's Retry-After if it gave one."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


def passing(error: BaseException) -> str | None:
    """Why `error` happened, when it may pass: asking again later may work (a connection refused, reset or
    timed out, a host not resolved or unreachable, an answer of `passing_status`, a `Passing`, an
    errors.Unavailable); read off `error` and its cause chain (fsspec's http gives a 503 as
    FileNotFoundError from the aiohttp error). None for anything else (a 404, a 403, a malformed
    document) and for a refusal that asking again does not change (a certificate that does not verify,
    an internal address, a redirect or login refused), whatever carries it."""
    import asyncio
    import socket
    import ssl
    import sys

    from refmount.errors import RefmountError, Unavailable
    from refmount.fetch.addresses import InternalAddress

    chain, cause = [], error
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        if isinstance(getattr(cause, "os_error", None), BaseException):  # (aiohttp's connector errors hold it)
            chain.append(cause.os_error)
        cause = cause.__cause__ or cause.__context__
    known = next((c for c in chain if isinstance(c, (Unavailable, Passing))), None)
    if known is not None:
        return str(known)
    aiohttp = sys.modules.get("aiohttp")  # (only an aiohttp already in use raised one of its errors)
    refused = (ssl.SSLCertVerificationError, InternalAddress, RefmountError) + \
        ((aiohttp.ClientConnectorCertificateError,) if aiohttp else ())
    if any(isinstance(c, refused) for c in chain):
        return None
    lost = (ConnectionError, TimeoutError, asyncio.TimeoutError, socket.gaierror) + \
        ((aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) if aiohttp else ())
    for cause in chain:  # (the most telling first)
        status = getattr(cause, "status", None)
        if type(status) is int and passing_status(status):
            return f"HTTP {status}" + (f" {cause.message}" if isinstance(getattr(cause, "message", None), str) else "")
        if isinstance(cause, socket.gaierror):
            return unresolved(cause, chain)
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
    found = next((c for c in chain if isinstance(c, lost) or
                  (type(c) is OSError and c.errno in _PASSING_ERRNOS)), None)
    if found is None:
        return None
    if isinstance(found, (TimeoutError, asyncio.TimeoutError)) and not str(found):  # (fsspec's FSTimeoutError)
        return "timed out"
    return f"{type(found).__name__}: {found}".rstrip(": ")


def unresolved(error, chain: list) -> str:
    """A name resolution's failure, naming the host when an error of the chain does (aiohttp's)."""
    host = next((getattr(c, "host", None) for c in chain if getattr(c, "host", None)), None)
    return "cannot resolve host" + (f" {host!r}" if host else "") + f" ({error.strerror})"
