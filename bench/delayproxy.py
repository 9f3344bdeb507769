"""A userspace WAN link for bench_wan.py on kernels without sch_netem: a TCP proxy that delays, rate-limits
and window-limits what it forwards.

    python bench/delayproxy.py --listen 10.213.7.2:8080 --upstream 127.0.0.1:8080 --rtt-ms 20

One asyncio process. Each accepted connection gets its own connection to the upstream (nginx); each
direction of it is a `Pipe` that models one TCP flow over a shared bottleneck:

- delay: every chunk reaches the other side RTT/2 after it left the bottleneck, in order;
- rate: one virtual clock per direction shared by all connections serialises chunks at --rate-mbit
  (a 1 Gbit/s full-duplex link; 0 = unlimited), like netem's `rate` with a deep queue;
- window: at most --window bytes of one connection are unacknowledged, a chunk being acknowledged one
  RTT after it left the bottleneck (RTT/2 to arrive, RTT/2 for the ack); the window opens from
  --init-window (10 segments, as Linux) by the bytes acknowledged, i.e. slow start doubling per RTT.
  With the default 4 MiB one stream at 80 ms gets W / (RTT + 2 ms of one 256 KiB piece) = 51 MB/s in
  steady state, and with slow start and the handshake curl measured 44 MB/s for 256 MB and 32 MB/s for
  64 MB (0.35 and 0.26 of 125 MB/s): about the third of the link real TCP reached on the netem link
  (NOTES §6). 3 MiB, half of Linux's classic 6 MiB tcp_rmem maximum, would give 0.25-0.3;
- handshake: a connection's first client byte leaves no earlier than 1 RTT after the accept, so its first
  response byte comes 2 RTT after connect(), as over TCP.

Timers are set EARLY (0.6 ms) before they are due, so that asyncio's late wake-ups (whole milliseconds)
even out. Not modelled: loss, slow start after idle, Nagle/delayed acks. Reads are 256 KiB (asyncio's transport
read size) and pieces are memoryviews of them: no per-byte Python work. Prints "ready" on stdout once it
listens; on SIGTERM/SIGINT it prints one JSON line of counters (connections, bytes each way, CPU seconds)
to stderr and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections import deque

HIGH_WATER = 4 << 20  # bytes queued before the bottleneck (the sender's socket buffer): pause reading above
LOW_WATER = 1 << 20
MIN_PIECE = 16 << 10  # do not send slivers of a chunk into a nearly full window
EOF = None
# asyncio's timers wake up to 1 ms late (epoll rounds its timeout up to whole milliseconds): a piece
# due at a random fraction of a millisecond would arrive 0.5 ms late on average. Timers are set this
# much early instead, so that such delays are right on average (within +-0.5 ms). What remains is the
# time to wake the process (about 0.2 ms on this VM), as for any receiver.
EARLY = 0.0006


class Bottleneck:
    """One direction of the shared link: a virtual clock of when it is next free (a FIFO queue)."""

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate = rate_bytes_s
        self.next_free = 0.0

    def leave_time(self, nbytes: int, ready: float) -> float:
        """When a piece of `nbytes` that is ready to send at `ready` has left the bottleneck."""
        if not self.rate:
            return ready
        start = max(self.next_free, ready)
        self.next_free = start + nbytes / self.rate
        return self.next_free


class Pipe:
    """One direction of one proxied connection: chunks read from `src`, written to `dst` after the link."""

    def __init__(self, link: Bottleneck, args, not_before: float, counters: dict, key: str) -> None:
        self.loop = asyncio.get_running_loop()
        self.link, self.delay = link, args.rtt_ms / 2000
        self.window, self.cwnd = args.window, min(args.init_window or args.window, args.window)
        self.not_before = not_before
        self.counters, self.key = counters, key
        self.src: asyncio.Transport | None = None
        self.dst: Side | None = None
        self.dst_ready = asyncio.Event()
        self.chunks: deque = deque()  # (receive time, memoryview) not yet sent into the link
        self.queued = 0
        self.paused_src = False
        self.data_ready = asyncio.Event()
        self.inflight = 0
        self.ack_time = 0.0  # virtual time of the latest acknowledgement
        self.window_open = asyncio.Event()
        self.deliveries: deque = deque()  # (due time, memoryview or EOF)
        self.delivery_ready = asyncio.Event()
        self.tasks = [asyncio.ensure_future(self.pace()), asyncio.ensure_future(self.deliver())]

    # -- fed by the source socket's protocol
    def push(self, data: bytes | None) -> None:
        if data is EOF:
            self.chunks.append((self.loop.time(), EOF))
        else:
            self.chunks.append((self.loop.time(), memoryview(data)))
            self.queued += len(data)
            if self.queued > HIGH_WATER and not self.paused_src and self.src is not None:
                self.src.pause_reading()
                self.paused_src = True
        self.data_ready.set()

    async def pace(self) -> None:
        """Send queued chunks into the bottleneck as the window allows; compute when each arrives."""
        last_due = 0.0
        while True:
            while not self.chunks:
                self.data_ready.clear()
                await self.data_ready.wait()
            ts, chunk = self.chunks[0]
            if chunk is EOF:
                self.chunks.popleft()
                self.deliveries.append((max(last_due, ts + self.delay), EOF))
                self.delivery_ready.set()
                return
            waited = False
            while min(self.cwnd, self.window) - self.inflight < min(len(chunk), MIN_PIECE, self.cwnd):
                self.window_open.clear()
                await self.window_open.wait()
                waited = True
            room = min(self.cwnd, self.window) - self.inflight
            if len(chunk) > room:
                piece = chunk[:room]
                self.chunks[0] = (ts, chunk[room:])
            else:
                piece = chunk
                self.chunks.popleft()
            n = len(piece)
            self.queued -= n
            if self.paused_src and self.queued < LOW_WATER:
                self.paused_src = False
                self.src.resume_reading()
            self.inflight += n
            ready = max(ts, self.not_before, self.ack_time if waited else 0.0)
            last_due = self.link.leave_time(n, ready) + self.delay
            self.deliveries.append((last_due, piece))
            self.delivery_ready.set()

    async def deliver(self) -> None:
        """Write each piece when it is due, in order; acknowledge it RTT/2 later."""
        while True:
            while not self.deliveries:
                self.delivery_ready.clear()
                await self.delivery_ready.wait()
            due, piece = self.deliveries.popleft()
            wait = due - EARLY - self.loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.dst_ready.wait()
            dst = self.dst
            if dst.closed:
                return
            if piece is EOF:
                if dst.transport.can_write_eof():
                    dst.transport.write_eof()
                dst.half_closed()
                return
            stalled = not dst.writable.is_set()
            if stalled:
                await dst.writable.wait()
            dst.transport.write(piece)
            self.counters[self.key] += len(piece)
            sent = self.loop.time() if stalled else due
            self.loop.call_at(sent + self.delay - EARLY, self.acknowledge, len(piece), sent + self.delay)

    def acknowledge(self, nbytes: int, at: float) -> None:
        self.inflight -= nbytes
        if self.cwnd < self.window:
            self.cwnd = min(self.window, self.cwnd + nbytes)
        self.ack_time = at
        self.window_open.set()

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


class Side(asyncio.Protocol):
    """One socket of a proxied connection: what it reads goes into `outgoing`; Pipes write to it."""

    def __init__(self, outgoing: Pipe, on_lost) -> None:
        self.outgoing, self.on_lost = outgoing, on_lost
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = False
        self.halves = 0

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=1 << 20)
        self.outgoing.src = transport

    def data_received(self, data: bytes) -> None:
        self.outgoing.push(data)

    def eof_received(self) -> bool:
        self.outgoing.push(EOF)
        self.half_closed()
        return True  # keep the socket open to write what is still on its way

    def half_closed(self) -> None:
        """Called once for our EOF read and once for the EOF written to us: then close."""
        self.halves += 1
        if self.halves == 2 and not self.closed:
            self.transport.close()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.writable.set()
        self.on_lost(self, exc)


class Proxy:
    def __init__(self, args) -> None:
        self.args = args
        rate = args.rate_mbit * 1e6 / 8
        self.up_link, self.down_link = Bottleneck(rate), Bottleneck(rate)
        self.counters = {"connections": 0, "bytes_up": 0, "bytes_down": 0}
        self.upstream = args.upstream.rsplit(":", 1)

    def accepted(self) -> Side:
        loop = asyncio.get_running_loop()
        self.counters["connections"] += 1
        now = loop.time()
        up = Pipe(self.up_link, self.args, now + self.args.rtt_ms / 1000, self.counters, "bytes_up")
        down = Pipe(self.down_link, self.args, 0.0, self.counters, "bytes_down")
        sides: list[Side] = []

        def lost(side: Side, exc) -> None:
            # An abort (or a close) of one side ends the other once nothing is left to deliver to it.
            others = [s for s in sides if s is not side]
            other = others[0] if others else None
            if exc is not None or other is None:
                up.cancel()
                down.cancel()
                if other is not None and not other.closed:
                    other.transport.abort()

        client = Side(up, lost)
        sides.append(client)
        down.dst = client
        down.dst_ready.set()

        async def connect() -> None:
            try:
                _, server = await loop.create_connection(lambda: Side(down, lost), self.upstream[0],
                                                         int(self.upstream[1]))
            except OSError:
                if not client.closed:
                    client.transport.abort()
                return
            sides.append(server)
            if client.closed:
                server.transport.abort()
                return
            up.dst = server
            up.dst_ready.set()

        asyncio.ensure_future(connect())
        return client

    async def serve(self) -> None:
        host, port = self.args.listen.rsplit(":", 1)
        server = await asyncio.get_running_loop().create_server(self.accepted, host, int(port), backlog=256)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        print("ready", flush=True)
        await stop.wait()
        server.close()
        t = os.times()
        print(json.dumps({**self.counters, "cpu_s": round(t.user + t.system, 3)}), file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, metavar="HOST:PORT")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip time; each direction gets half")
    p.add_argument("--rate-mbit", type=float, default=1000.0, help="link rate per direction (0: unlimited)")
    p.add_argument("--window", type=int, default=4 << 20, help="max unacknowledged bytes per connection and "
                   "direction (default 4 MiB: one stream at 80 ms gets about 1/3 of 1 Gbit/s)")
    p.add_argument("--init-window", type=int, default=10 * 1448, help="initial window (slow start); 0: start "
                   "at --window")
    return p.parse_args(argv)


def main(argv=None) -> int:
    asyncio.run(Proxy(parse_args(argv)).serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
