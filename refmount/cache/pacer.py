"""How many read-ahead requests each host gets at once: enough to fill the link, measured.

A fixed number of parallel requests is too few on a long fat link (one TCP stream reaches a third
of 1 Gbit/s at 80 ms) and needlessly many on loopback. Per host we measure the throughput while
requests are in flight (the best recent figure) and the latency (the quickest recent small
request), and allow enough parts in flight to hold three times the bandwidth-delay product, plus
two so that a faster link can show itself, and at least one per sequential reader plus one; never
more than `stream_parallel` (8, or --connections if fewer), which is also where an unmeasured host
starts, unless the kernel's round trip of a connection the mount made there already is short
(fetch/roundtrip.py): then it opens with what that round trip needs at 10 Gbit/s, 2 on loopback (8 at
once beside the reader's own block, on two cores, held that block back: bench/NOTES.md "cold
sequential"), all 8 from about 2 ms (1 MiB blocks). The chunk-grid read-ahead's exact ranges (small,
one round trip each) have slots of their own, up to `max_parallel` (--connections): a sparse walk
at 80 ms needs about 20 in flight, where scans lost a tenth of the link with that many big parts at
once (bench/NOTES.md, issue 33). Readers' own requests are never held back here: only read-ahead
waits, and its slots are granted in the order asked for. The measured product also sizes a new stream's window (view.ReadStreams).

Everything here runs on the trio thread.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio

_INTERVAL = 0.25  # seconds over which throughput is measured
_FAST_LINK = 1.25e9  # bytes per second an opening from a known round trip assumes (10 Gbit/s)


class _Host:
    __slots__ = ("limiter", "exact", "active", "busy_since", "busy", "bytes", "rate", "latency", "part", "wanted")

    def __init__(self, tokens: int, exact_tokens: int) -> None:
        self.wanted = tokens  # parts in flight that fill the link, by the last measurement
        self.limiter = trio.CapacityLimiter(tokens)  # byte-stream read-ahead parts
        self.exact = trio.CapacityLimiter(exact_tokens)  # the chunk-grid read-ahead's exact ranges
        self.active = 0
        self.busy_since = 0.0
        self.busy = 0.0  # seconds with a request in flight in the current interval
        self.bytes = 0  # bytes completed in the current interval
        self.rate = 0.0  # best recent throughput, bytes per second (decaying)
        self.latency = 0.0  # quickest recent small request, seconds (0: none seen)
        self.part = 0  # the size of recent read-ahead parts


class _Ticket:
    __slots__ = ("began", "nbytes", "host", "limiter")

    def __init__(self, began: float, host: _Host | None = None, limiter=None) -> None:
        self.began = began
        self.nbytes = 0
        self.host = host
        self.limiter = limiter


class HostPacer:
    def __init__(self, host_of, max_parallel: int, block_size: int, start: int = 8,
                 stream_parallel: int = 8, round_trip=None) -> None:
        self._host_of = host_of  # source -> host name
        self._round_trip = round_trip  # source -> the host's round trip in seconds, or None (not known)
        self.max_parallel = max(1, max_parallel)
        self.stream_parallel = min(self.max_parallel, max(1, stream_parallel))
        self.block_size = block_size
        self.start = min(start, self.stream_parallel)
        self.readers = 1
        self._hosts: dict[str, _Host] = {}

    def _host(self, source) -> _Host:
        name = self._host_of(source)
        host = self._hosts.get(name)
        if host is None:
            host = self._hosts[name] = _Host(self._opening(source), self.max_parallel)
            self._apply(host)
        return host

    def _opening(self, source) -> int:
        rtt = self._round_trip(source) if self._round_trip is not None else None
        if rtt is None:
            return self.start
        return min(self.start, int(3 * _FAST_LINK * rtt // self.block_size) + 2)  # (as _retarget)

    @asynccontextmanager
    async def slot(self, source):
        """Hold one of the host's read-ahead slots; the caller sets `.nbytes` on what it yields to
        the bytes its request fetched (left at 0 when it found nothing to fetch)."""
        host = self._host(source)
        async with host.limiter:
            ticket = _Ticket(self._began(host))
            try:
                yield ticket
            finally:
                self._ended(host, ticket.began, ticket.nbytes)

    async def acquire(self, source, exact: bool = False) -> _Ticket:
        """One of the host's read-ahead slots, for a request another task will make: slots are
        granted in the order asked for (FIFO), so a part nearer the reader is never overtaken by
        one further ahead. `exact`: a slot for the chunk-grid read-ahead's exact ranges. The caller
        sets `.nbytes` and hands the ticket to `release`."""
        host = self._host(source)
        ticket = _Ticket(0.0, host, host.exact if exact else host.limiter)
        await ticket.limiter.acquire_on_behalf_of(ticket)
        ticket.began = self._began(host)
        return ticket

    def release(self, ticket: _Ticket) -> None:
        ticket.limiter.release_on_behalf_of(ticket)
        self._ended(ticket.host, ticket.began, ticket.nbytes)

    def parallel(self, source) -> int:
        """Read-ahead requests the host of `source` may have in flight now."""
        return self._host(source).limiter.total_tokens

    def bdp(self, source) -> int:
        """The host's measured bandwidth-delay product in bytes (0 until both are measured)."""
        host = self._host(source)
        return int(host.rate * host.latency)

    def observe(self, source, began: float, nbytes: int) -> None:
        """A reader's own request of `nbytes` that began at `began` (trio clock) just ended."""
        if 0 < nbytes <= 2 * self.block_size:  # nothing fetched: no network time to learn from
            self._note_latency(self._host(source), trio.current_time() - began)

    def _began(self, host: _Host) -> float:
        now = trio.current_time()
        if host.active == 0:
            host.busy_since = now
        host.active += 1
        return now

    def _ended(self, host: _Host, began: float, nbytes: int) -> None:
        now = trio.current_time()
        host.active -= 1
        host.bytes += nbytes
        if nbytes:
            host.part = nbytes if host.part == 0 else (host.part * 3 + nbytes) // 4
        if 0 < nbytes <= 2 * self.block_size:
            self._note_latency(host, now - began)
        if host.active == 0:
            host.busy += now - host.busy_since
            host.busy_since = now
        busy = host.busy + (now - host.busy_since if host.active else 0.0)
        if busy >= _INTERVAL:
            host.rate = max(host.bytes / busy, host.rate * 0.8)
            host.bytes, host.busy, host.busy_since = 0, 0.0, now
            self._retarget(host)

    @staticmethod
    def _note_latency(host: _Host, seconds: float) -> None:
        # The quickest recent one, drifting up slowly so that a changed route shows.
        host.latency = seconds if host.latency == 0 else min(seconds, host.latency * 1.05)

    def note_readers(self, count: int) -> None:
        """How many sequential readers are reading ahead now: each needs a part of its own in
        flight, or it stalls waiting for its next part while the others' parts take the slots."""
        if count != self.readers:
            self.readers = count
            for host in self._hosts.values():
                self._apply(host)

    def _retarget(self, host: _Host) -> None:
        if host.latency == 0 or host.part == 0:
            return
        # Bytes in flight to fill the link three times over: each part also idles a round trip
        # between requests, and one connection's window may carry only a share of the link.
        target = 3 * host.rate * host.latency
        host.wanted = int(target // host.part) + 2
        self._apply(host)

    def _apply(self, host: _Host) -> None:
        host.limiter.total_tokens = max(1, min(self.stream_parallel, max(host.wanted, self.readers + 1)))

    def statistics(self) -> dict:
        return {name: {"parallel": h.limiter.total_tokens, "in_flight": h.active,
                       "rate_mb_s": round(h.rate / 1e6, 1), "latency_ms": round(h.latency * 1000, 2)}
                for name, h in self._hosts.items()}


def _register_metrics() -> None:
    """The read-ahead's pace per host (fetch/registry.py)."""
    from refmount.fetch.registry import per, register

    register("refmount_host_in_flight_requests", "gauge", "Read-ahead requests to the host in flight now.", ("host",),
             collect=per("hosts", "host", "in_flight"), component="cache.pacer")
    register("refmount_host_parallel_requests", "gauge", "Read-ahead requests the host gets at once, at most.",
             ("host",), collect=per("hosts", "host", "parallel"), component="cache.pacer")


_register_metrics()
