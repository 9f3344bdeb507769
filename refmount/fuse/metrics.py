"""`--metrics ADDR:PORT`: the mount's counters in Prometheus's text format, at GET /metrics.

The families are the registry's (fetch/registry.py: each component registers its own, with name, kind,
help and labels), the samples those of the mount's stats dict (the `stats()` of fuse/assemble.py),
made on the trio thread: `refmount stats` shows the same registry, so both always agree. The
responder is a few lines of trio on the daemon's own loop (a scrape is one short request): no
thread, no dependency.
"""

from __future__ import annotations

import logging
import math
import socket

import trio

from refmount.errors import RefmountError

log = logging.getLogger("refmount")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


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


def exposition(stats: dict) -> str:
    """The Prometheus text exposition of the registry's families with a mount's `stats()` samples,
    each labelled with the mountpoint."""
    from refmount.fetch.registry import REGISTRY

    out = _Families()
    mount = {"mountpoint": stats.get("mountpoint", "")}
    for family, samples in REGISTRY.collect(stats):
        for labels, value in samples:
            if family.kind == "histogram":
                out.histogram(family.name, family.help, {**mount, **labels}, value)
            else:
                out.add(family.name, family.kind, family.help, {**mount, **labels}, value)
    return out.text()


__all__ = ["bind_metrics", "serve_metrics", "exposition", "CONTENT_TYPE"]
