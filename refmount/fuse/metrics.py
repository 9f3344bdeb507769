"""`--metrics ADDR:PORT`: the mount's counters in Prometheus's text format, at GET /metrics.

The figures are the ones `refmount stats` shows: the exposition is made from the same dict (the
`stats()` of fuse/assemble.py), on the trio thread, so both always agree. The responder is a few
lines of trio on the daemon's own loop (a scrape is one short request): no thread, no dependency.
"""

from __future__ import annotations

import logging
import math
import re
import socket

import trio

from refmount.errors import RefmountError

log = logging.getLogger("refmount")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Every number in these sections is exported as a counter, except those named as what is there now
# (a key that is or ends in one of _NOW_WORDS: 'pending', 'in_flight'...), exported as gauges.
_READAHEAD_SECTIONS = ("readahead", "grid_readahead")
_NOW_WORDS = ("pending", "in_flight", "window", "now")


def shown_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_metrics(address: tuple[str, int]) -> socket.socket:
    """A listening socket on `address`, or a one-line error naming --metrics."""
    host, port = address
    shown = shown_address(host, port)
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as e:
        raise RefmountError(f"--metrics {shown}: cannot listen there ({getattr(e, 'strerror', None) or e})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.set_inheritable(False)
        sock.bind(where)
        sock.listen(16)
    except OSError as e:
        sock.close()
        hint = " (another process listens there: pick another port)" if e.errno == 98 else ""
        raise RefmountError(f"--metrics {shown}: cannot listen there ({e.strerror}){hint}") from None
    return sock


async def serve_metrics(sock: socket.socket, stats) -> None:
    """Answer scrapes on `sock` until cancelled: GET /metrics gets `exposition(stats())`."""
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    limiter = trio.CapacityLimiter(8)  # a flood of connections waits; it never takes the loop over

    async def answer(stream: trio.SocketStream) -> None:
        async with limiter:
            try:
                with trio.move_on_after(10):
                    await _answer(stream, stats)
            except Exception as e:  # noqa: BLE001 - a broken scrape must not end the mount
                log.debug("metrics: a scrape failed: %s: %s", type(e).__name__, e)
            finally:
                with trio.move_on_after(1):
                    await stream.aclose()

    await trio.serve_listeners(answer, [listener])


async def _answer(stream: trio.SocketStream, stats) -> None:
    request = b""
    while b"\r\n\r\n" not in request and b"\n\n" not in request:
        data = await stream.receive_some(4096)
        if not data:
            return
        request += data
        if len(request) > 16384:
            await _reply(stream, 431, "request header too large\n")
            return
    method, _, rest = request.split(b"\r\n", 1)[0].split(b"\n", 1)[0].decode("latin-1").partition(" ")
    path = rest.split(" ", 1)[0].split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        await _reply(stream, 405, "only GET\n", head=False, extra="Allow: GET, HEAD\r\n")
    elif path == "/metrics":
        await _reply(stream, 200, exposition(stats()), head=method == "HEAD", content_type=CONTENT_TYPE)
    elif path == "/":
        await _reply(stream, 200, "refmount: the metrics are at /metrics\n", head=method == "HEAD")
    else:
        await _reply(stream, 404, "not found: the metrics are at /metrics\n", head=method == "HEAD")


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Request Header Fields Too Large"}


async def _reply(stream, status: int, text: str, head: bool = False, content_type: str = "text/plain; charset=utf-8",
                 extra: str = "") -> None:
    body = text.encode()
    header = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
              f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode()
    await stream.send_all(header if head else header + body)


# -- the exposition ------------------------------------------------------------------------------

class _Families:
    """Metric families in the order first added; all samples of a family together, as the format
    requires."""

    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list]] = {}

    def add(self, name: str, kind: str, help_text: str, labels: dict, value) -> None:
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        family = self._families.setdefault(name, (kind, help_text, []))
        family[2].append(("", labels, value))

    def histogram(self, name: str, help_text: str, labels: dict, histogram: dict) -> None:
        family = self._families.setdefault(name, ("histogram", help_text, []))
        for bound, count in histogram["buckets"].items():
            family[2].append(("_bucket", {**labels, "le": bound}, count))
        family[2].append(("_sum", labels, histogram["sum"]))
        family[2].append(("_count", labels, histogram["count"]))

    def text(self) -> str:
        lines = []
        for name, (kind, help_text, samples) in self._families.items():
            lines.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2)}")
            lines.append(f"# TYPE {name} {kind}")
            for suffix, labels, value in samples:
                shown = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                lines.append(f"{name}{suffix}{{{shown}}} {_number(value)}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _metric_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


def exposition(stats: dict) -> str:
    """The Prometheus text exposition of a mount's `stats()` dict (fuse/assemble.py)."""
    out = _Families()
    mount = {"mountpoint": stats.get("mountpoint", "")}
    for host, h in stats.get("hosts", {}).items():
        labels = {**mount, "host": host}
        out.add("refmount_fetch_requests_total", "counter", "Requests sent to the host (ranged GETs, HEADs, "
                "whole-object GETs; each attempt of a retried fetch).", labels, h.get("requests"))
        out.add("refmount_fetch_bytes_total", "counter", "Body bytes received from the host.", labels, h.get("bytes"))
        out.add("refmount_fetch_retries_total", "counter", "Fetches from the host attempted again after a failure.",
                labels, h.get("retries"))
        for kind, n in h.get("errors", {}).items():
            out.add("refmount_fetch_errors_total", "counter", "Fetches from the host that failed for good (after "
                    "any retries), by kind.", {**labels, "kind": kind}, n)
        if "latency_seconds" in h:
            out.histogram("refmount_fetch_duration_seconds", "Time to fetch a range from the host, retries "
                          "included.", labels, h["latency_seconds"])
        out.add("refmount_host_in_flight_requests", "gauge", "Read-ahead requests to the host in flight now.",
                labels, h.get("in_flight"))
        out.add("refmount_host_parallel_requests", "gauge", "Read-ahead requests the host gets at once, at most.",
                labels, h.get("parallel"))
    logins = stats.get("logins", {})
    for key, per_host in logins.items():  # (fetch/auth.py: each counter by host; "cookies" is a count now)
        if isinstance(per_host, dict):
            for host, n in per_host.items():
                out.add(_metric_name(f"refmount_{key}_total"), "counter", f"Logins and credentials: "
                        f"{key.replace('_', ' ')}, by host.", {**mount, "host": host}, n)
    out.add("refmount_cookies", "gauge", "Cookies the mount's jar holds.", mount, logins.get("cookies"))
    served = stats.get("served", {})
    out.add("refmount_served_bytes_total", "counter", "Bytes readers got from the mount (every file).", mount,
            served.get("reader_bytes"))
    out.add("refmount_served_reads_total", "counter", "Reads readers made of the mount's files.", mount,
            served.get("reader_reads"))
    out.add("refmount_served_remote_bytes_total", "counter", "Bytes of remote objects the raw view served (fetched "
            "bytes divided by these is the amplification).", mount, served.get("bytes"))
    caches = [("memory", stats.get("cache", {})), ("disk", stats.get("disk", {}))]
    for name, cache in caches:
        labels = {**mount, "cache": name}
        out.add("refmount_cache_hits_total", "counter", "Blocks found in the cache.", labels, cache.get("hits"))
        out.add("refmount_cache_misses_total", "counter", "Blocks not found in the cache (fetched).", labels,
                cache.get("misses"))
        out.add("refmount_cache_evictions_total", "counter", "Blocks evicted from the cache.", labels,
                cache.get("evictions"))
        out.add("refmount_cache_bytes", "gauge", "Bytes the cache holds.", labels, cache.get("bytes"))
        out.add("refmount_cache_capacity_bytes", "gauge", "What the cache may hold.", labels, cache.get("capacity"))
    for section in _READAHEAD_SECTIONS:
        for key, value in _flat(stats.get(section, {})):
            what = f"Read-ahead ({section}): {key.replace('_', ' ')}."
            if any(key == word or key.endswith("_" + word) for word in _NOW_WORDS):
                out.add(_metric_name(f"refmount_{section}_{key}"), "gauge", what + " (now)", mount, value)
            else:
                out.add(_metric_name(f"refmount_{section}_{key}_total"), "counter", what, mount, value)
    decoded = stats.get("decoded", {})
    out.add("refmount_decoded_chunks_total", "counter", "Chunks the decoded view decoded.", mount,
            decoded.get("decodes"))
    memory = stats.get("memory", {})
    for key, help_text in (("rss", "Resident memory of the daemon."), ("target", "The daemon's memory target."),
                           ("cached", "Bytes of cached blocks."), ("prefetch_ahead", "Bytes read ahead of readers.")):
        out.add(f"refmount_memory_{key}_bytes", "gauge", help_text, mount, memory.get(key))
    out.add("refmount_keys", "gauge", "Keys of the mounted reference set.", mount, stats.get("keys"))
    return out.text()


def _flat(section: dict, prefix: str = ""):
    for key, value in section.items():
        if isinstance(value, dict):
            yield from _flat(value, f"{prefix}{key}_")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield prefix + key, value


__all__ = ["bind_metrics", "serve_metrics", "exposition", "CONTENT_TYPE"]
