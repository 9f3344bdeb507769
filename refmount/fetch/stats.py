"""Fetch counters and latency samples, per host, plus the url redaction used by every log line.

The counters are what `refmount stats` shows and `--metrics` exports (fuse/metrics.py): requests
sent, body bytes received, retries, final errors by kind and a latency histogram, per host. They are
touched from the trio thread (the stdlib engine, local files' worker threads) and from the asyncio
thread (aiohttp, fsspec), so every update takes one lock: the counts must be exact.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
from collections import deque
from urllib.parse import urlsplit

from refmount.errors import one_line

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
# A query parameter named like a secret, alone or as the last word of its name (AWS's X-Amz-Signature,
# GCS's X-Goog-Signature, Azure's sig, session_token, client_secret, api_key, a login's code=...)
_SECRET_QUERY = re.compile(r"(?i)([?&](?:[\w.-]*[-_.])?(?:signature|sig|token|secret|key|apikey|password|passwd|"
                           r"credential|auth|authorization|jwt|code)=)[^&#\s'\"]+")  # (not a quote around the url)

# Upper bounds (seconds) of the latency histogram's buckets: loopback to a slow, far link
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LOCAL_HOST = "local"  # the host label of local files


def redact(url: str) -> str:
    """The url with credentials (user:password@, signed-query secrets) replaced by '***'."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub("***@", url))


class RedactingFormatter(logging.Formatter):
    """Every log line, whatever wrote it, with `redact` applied: a log file or syslog is often readable by
    more than the mount's user, and a line that names a url without redacting it must not leak its secret.
    And one line (errors.one_line): a message's control characters are escaped (`\\n`, `\\x1b`), so a name
    from a remote document cannot forge a line of its own in the log or send escapes to a terminal (a
    traceback after the message keeps its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def host_of(url: str) -> str:
    """The host an url is fetched from, as counters name it: host[:port] without any credentials
    (the bucket of an s3:// url), or 'local' for a local file."""
    if "://" not in url:
        return LOCAL_HOST
    parts = urlsplit(url)
    if parts.scheme in ("file", "local"):
        return LOCAL_HOST
    return parts.netloc.rpartition("@")[2] or parts.scheme


_HTTP_STATUS = re.compile(r"\bHTTP (\d)\d\d\b")
_PROTOCOL = ("Content-Range", "Content-Length", "Content-Encoding", "206 ", "416 ", "body longer", "short body")
_CONNECTION = ("connect", "disconnect", "reset", "refused", "broken pipe", "eof", "shortbody", "incompleteread",
               "oserror", "remote end closed", "unreachable", "name or service", "temporary failure in name")


def error_kind(error: BaseException | str) -> str:
    """What kind of failure `error` (an exception, or the reason a retry loop gave up on) is:
    http_4xx/http_5xx (the server's answer), timeout, connection, tls, protocol (an answer that
    breaks HTTP's rules: a wrong Content-Range...), changed (the object is not the version first
    seen), refused (a limit refused the read), not_found, denied, or other."""
    from refmount.errors import ReadRefused, RemoteChanged

    if isinstance(error, BaseException):
        import ssl

        if isinstance(error, ReadRefused):
            return "refused"
        if isinstance(error, RemoteChanged):
            return "changed"
        if isinstance(error, ssl.SSLError) or "certificate" in str(error).lower():
            return "tls"
        if isinstance(error, TimeoutError):
            return "timeout"
        if isinstance(error, FileNotFoundError):
            return "not_found"
        if isinstance(error, PermissionError):
            return "denied"
        text = f"{type(error).__name__}: {error}"
    else:
        text = error
    status = _HTTP_STATUS.search(text)
    if status:
        return f"http_{status.group(1)}xx"
    lower = text.lower()
    if "timed out" in lower or "timeout" in lower:
        return "timeout"
    if "certificate" in lower or "ssl" in lower:
        return "tls"
    if any(word in text for word in _PROTOCOL):
        return "protocol"
    if any(word in lower for word in _CONNECTION):
        return "connection"
    return "other"


class HostCounters:
    """One host's counters."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.retries = 0
        self.errors: dict[str, int] = {}  # kind -> final errors
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # not cumulative; the last one is +Inf
        self.seconds = 0.0
        self.fetches = 0

    def as_dict(self) -> dict:
        cumulative, total = {}, 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.buckets):
            total += n
            cumulative[bound] = total
        return {"requests": self.requests, "bytes": self.bytes, "retries": self.retries,
                "errors": dict(sorted(self.errors.items())),
                "latency_seconds": {"buckets": cumulative, "sum": round(self.seconds, 6), "count": self.fetches}}


class FetchStats:
    """Counters shared by all backends: totals, and per host (see the module's docstring)."""

    def __init__(self, samples: int = 2048) -> None:
        self.requests = 0
        self.bytes = 0
        self.retries = 0
        self.errors = 0
        self._latencies: deque[float] = deque(maxlen=samples)
        self._hosts: dict[str, HostCounters] = {}
        self._host_of: dict[str, str] = {}  # url -> its host (urlsplit once per url)
        self._lock = threading.Lock()

    def _host(self, url: str) -> HostCounters:
        """(Under the lock.)"""
        host = self._host_of.get(url)
        if host is None:
            if len(self._host_of) > 100_000:  # a reference set of very many urls: keep this bounded
                self._host_of.clear()
            host = self._host_of[url] = host_of(url)
        counters = self._hosts.get(host)
        if counters is None:
            counters = self._hosts[host] = HostCounters()
        return counters

    def request(self, url: str) -> None:
        """A request went to `url`'s host."""
        with self._lock:
            self.requests += 1
            self._host(url).requests += 1

    def record(self, url: str, nbytes: int, seconds: float) -> None:
        """A fetch from `url` received `nbytes` of body in `seconds` (with its retries)."""
        with self._lock:
            self.bytes += nbytes
            self._latencies.append(seconds)
            host = self._host(url)
            host.bytes += nbytes
            host.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            host.seconds += seconds
            host.fetches += 1

    def retry(self, url: str) -> None:
        with self._lock:
            self.retries += 1
            self._host(url).retries += 1

    def error(self, url: str, error: BaseException | str) -> None:
        """A fetch from `url` failed for good (no more retries): `error` is the exception, the
        reason given up on, or the kind itself (see error_kind)."""
        kind = error if isinstance(error, str) and error in _KINDS else error_kind(error)
        with self._lock:
            self.errors += 1
            errors = self._host(url).errors
            errors[kind] = errors.get(kind, 0) + 1

    def percentiles(self) -> dict[str, float]:
        with self._lock:
            samples = sorted(self._latencies)
        if not samples:
            return {}
        pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))] * 1000  # noqa: E731
        return {"p50_ms": round(pick(0.5), 3), "p90_ms": round(pick(0.9), 3), "p99_ms": round(pick(0.99), 3)}

    def hosts(self) -> dict[str, dict]:
        """Each host's counters (see HostCounters.as_dict)."""
        with self._lock:
            return {host: counters.as_dict() for host, counters in sorted(self._hosts.items())}

    def as_dict(self) -> dict:
        return {"requests": self.requests, "bytes": self.bytes, "retries": self.retries, "errors": self.errors,
                "latency": self.percentiles()}


_KINDS = {"http_4xx", "http_5xx", "timeout", "connection", "tls", "protocol", "changed", "refused", "not_found",
          "denied", "checksum", "repeated", "other"}


def _register_metrics() -> None:
    """Per host (fetch/registry.py): requests, bytes, retries, final errors by kind, and latency."""
    from refmount.fetch.registry import per, register

    def errors(stats: dict):
        for host, h in (stats.get("hosts") or {}).items():
            for kind, n in (h.get("errors") or {}).items() if isinstance(h, dict) else ():
                yield {"host": host, "kind": kind}, n

    register("refmount_fetch_requests_total", "counter", "Requests sent to the host (ranged GETs, HEADs, "
             "whole-object GETs; each attempt of a retried fetch).", ("host",), collect=per("hosts", "host", "requests"),
             component="fetch")
    register("refmount_fetch_bytes_total", "counter", "Body bytes received from the host.", ("host",),
             collect=per("hosts", "host", "bytes"), component="fetch")
    register("refmount_fetch_retries_total", "counter", "Fetches from the host attempted again after a failure.",
             ("host",), collect=per("hosts", "host", "retries"), component="fetch")
    register("refmount_fetch_errors_total", "counter", "Fetches from the host that failed for good (after any "
             "retries), by kind.", ("host", "kind"), collect=errors, component="fetch")
    register("refmount_fetch_duration_seconds", "histogram", "Time to fetch a range from the host, retries "
             "included.", ("host",), collect=per("hosts", "host", "latency_seconds"), component="fetch")


_register_metrics()
