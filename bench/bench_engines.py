"""HTTP engines for the bulk data path, FUSE-free: CPU seconds per GB and MB/s against curl (issue 26).

    python bench/bench_engines.py [--mb 256] [--sizes 1,4,8] [--parallel 1,4] [--rounds 3]
        [--engines direct,aiohttp,obstore-thread,...] [--cache-mb 0] [--latency N] [--baseline TREE]

Needs nginx (Debian's nginx-light); obstore (pip) and pycurl (pip 7.49.0 or Debian python3-pycurl) for
their engines. --latency N measures N random 64 KiB ranges one at a time instead (p50/p90, CPU per
request). --baseline TREE adds the engine "direct-baseline": "direct" with refmount's code from TREE
(another commit's checkout; before issue 26 small ranges took fastget.py there).

Serves a random file from tmpfs through a loopback nginx (bench/harness/servers.py) and fetches
all of it as ranges of each size (MiB), `parallel` ranges in flight, from trio tasks (as the daemon's
read-ahead does), into 1 MiB blocks that are kept (a cold cache fill; `--cache-mb N` keeps only the
last N MiB, an LRU at capacity). Each engine runs in a fresh child process; engines alternate within
a round (the order rotates), and the table shows medians over rounds. CPU is the child's own
(getrusage, every thread), from the first timed request to the last byte; the connections are opened
and the code imported before. Every block is compared with the file afterwards (kept blocks only).

Engines (each returns a range as 1 MiB pieces that the cache keeps):
- direct          refmount.fetch.Fetcher, http_client="stdlib" (the stdlib engine: http.client in a worker
                  thread per request, woken once on trio; phase 1 measured the asyncio-hop version)
- aiohttp         refmount.fetch.Fetcher, http_client="aiohttp"
- obstore-thread  obstore.get_range (sync; the GIL released while tokio fetches) in trio worker threads
- obstore-asyncio obstore.get_range_async on an asyncio loop thread, bridged as refmount does today
- obstore-trio    obstore.get_range_async resolved straight on the trio loop (a 40-line shim, no asyncio)
- obstore-checked as obstore-trio, through get_async with If-Match and the answer's range and meta checked
- pycurl          one libcurl multi handle driven by a thread (socket_action + epoll), WRITEFUNCTION
                  copying into the block buffers
- recvinto        a minimal HTTP/1.1 client: blocking sockets in trio worker threads, recv_into the
                  block buffers with the GIL released (the floor for Python threads); buffers from
                  64 MiB private mmap arenas, evicted ones reused
- recvinto-thp    the same, the arenas madvised MADV_HUGEPAGE (one fault per 2 MiB instead of per 4 KiB)
- curl            the curl binary, the same ranges from a --parallel config file, to /dev/null
Per-thread CPU is split into the trio thread, tokio's workers and the rest (other threads).
"""

from __future__ import annotations

import argparse
import collections
import json
import mmap
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from harness.engines import BLOCK, Sink, curl_run, pieces_of, thread_cpu, trio_shim
from harness.mounts import code_env
from harness.record import Record
from harness.servers import nginx_serving, write_certificates
from harness.inputs import write_big
from harness.system import percentile

HERE = Path(__file__).resolve().parent
ARENA = 64 << 20
ENGINES = ["direct", "aiohttp", "obstore-thread", "obstore-asyncio", "obstore-trio", "obstore-checked",
           "pycurl", "recvinto", "recvinto-thp", "curl"]


# -- the cache the engines fill ---------------------------------------------------------------------

# -- engines (each: `async fetch(start, end) -> pieces`, `async warm()`, `close()`) ----------------

class FetcherEngine:
    def __init__(self, url: str, client: str, conns: int) -> None:
        from refmount.fetch import Fetcher

        self.url = url
        self.fetcher = Fetcher(http_client=client, connections_per_host=conns)

    async def warm(self) -> None:
        await self.fetcher.warm_up([self.url])
        await self.fetcher.read(self.url, 0, 1 << 20, BLOCK)

    async def fetch(self, start: int, end: int):
        return await self.fetcher.read(self.url, start, end, BLOCK)

    async def aclose(self) -> None:
        await self.fetcher.aclose()


class ObstoreEngine:
    """obstore's HTTPStore; `bridge` says how a trio task waits for tokio."""

    def __init__(self, url: str, bridge: str, conns: int) -> None:
        import obstore
        from obstore.store import HTTPStore

        base, _, self.path = url.rpartition("/")
        self.obstore = obstore
        self.store = HTTPStore.from_url(base, client_options={"allow_http": True, "timeout": "120s",
                                                              "pool_max_idle_per_host": str(conns)},
                                        retry_config={"max_retries": 0})
        self.bridge = bridge
        self.etag = None

    async def warm(self) -> None:
        if self.bridge == "asyncio":
            from refmount.fetch.bridge import asyncio_loop

            self.loop = asyncio_loop()
        head = self.obstore.head(self.store, self.path)
        self.etag = head["e_tag"]
        await self.fetch(0, 1 << 20)

    async def fetch(self, start: int, end: int):
        ob, store, path = self.obstore, self.store, self.path
        if self.bridge == "thread":
            import trio

            data = await trio.to_thread.run_sync(lambda: ob.get_range(store, path, start=start, end=end))
        elif self.bridge == "asyncio":
            from refmount.fetch.bridge import run_on_asyncio

            async def on_asyncio():
                return await ob.get_range_async(store, path, start=start, end=end)

            data = await run_on_asyncio(on_asyncio(), self.loop)
        elif self.bridge == "trio":
            data = await trio_shim.awaiting(lambda: ob.get_range_async(store, path, start=start, end=end))
        else:  # checked: the answer's range, validators and encoding, If-Match on the first ETag
            result = await trio_shim.awaiting(
                lambda: ob.get_async(store, path, options={"range": (start, end), "if_match": self.etag}))
            if tuple(result.range) != (start, min(end, result.meta["size"])):
                raise RuntimeError(f"asked for {start}-{end}, got {result.range}")
            if result.meta["e_tag"] != self.etag:
                raise RuntimeError("ETag changed")
            if result.attributes.get("Content-Encoding", "identity") not in ("identity", ""):
                raise RuntimeError("encoded body")
            data = await trio_shim.awaiting(result.bytes_async)
        if len(data) != end - start:
            raise RuntimeError(f"got {len(data)} bytes of {end - start}")
        return pieces_of(data, start)

    async def aclose(self) -> None:
        pass


class CurlEngine:
    """One libcurl multi handle on a thread of its own (socket_action + epoll); requests come in
    through a queue and a pipe, and each body is copied by WRITEFUNCTION into its block buffers."""

    def __init__(self, url: str, conns: int, buffersize: int = 1 << 20) -> None:
        import pycurl

        self.pycurl, self.url, self.buffersize = pycurl, url, buffersize
        m = self.multi = pycurl.CurlMulti()
        m.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        m.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        m.setopt(pycurl.M_MAX_HOST_CONNECTIONS, conns)
        self.epoll = __import__("select").epoll()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.epoll.register(self.wake_r, 1)
        self.registered: set = set()
        self.timeout = -1.0
        self.queue: collections.deque = collections.deque()
        self.handles: list = []
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="curl-multi", daemon=True)
        self.thread.start()

    def _on_socket(self, what, fd, multi, data):
        import select as sel

        p = self.pycurl
        if what == p.POLL_REMOVE:
            if fd in self.registered:
                self.registered.discard(fd)
                self.epoll.unregister(fd)
            return
        mask = (sel.EPOLLIN if what & p.POLL_IN else 0) | (sel.EPOLLOUT if what & p.POLL_OUT else 0)
        if fd in self.registered:
            self.epoll.modify(fd, mask)
        else:
            self.epoll.register(fd, mask)
            self.registered.add(fd)

    def _on_timer(self, ms):
        self.timeout = ms / 1000 if ms >= 0 else -1.0

    def _run(self) -> None:
        import select as sel

        p, m = self.pycurl, self.multi
        while not self.closed:
            events = self.epoll.poll(self.timeout)
            if not events:
                self.timeout = -1.0
                m.socket_action(p.SOCKET_TIMEOUT, 0)
            for fd, ev in events:
                if fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    while self.queue:
                        self._start(*self.queue.popleft())
                    m.socket_action(p.SOCKET_TIMEOUT, 0)
                    continue
                flags = (p.CSELECT_IN if ev & sel.EPOLLIN else 0) | (p.CSELECT_OUT if ev & sel.EPOLLOUT else 0) \
                    | (p.CSELECT_ERR if ev & (sel.EPOLLERR | sel.EPOLLHUP) else 0)
                m.socket_action(fd, flags)
            while True:
                queued, ok, failed = m.info_read()
                for c in ok:
                    self._finish(c, None)
                for c, code, message in failed:
                    self._finish(c, f"curl error {code}: {message}")
                if not queued:
                    break

    def _start(self, start, end, done) -> None:
        from refmount.fetch.pieces import piece_sizes

        p = self.pycurl
        c = self.handles.pop() if self.handles else p.Curl()
        c.setopt(p.URL, self.url)
        c.setopt(p.RANGE, f"{start}-{end - 1}")
        c.setopt(p.BUFFERSIZE, self.buffersize)
        if os.environ.get("CURL_CA_BUNDLE"):
            c.setopt(p.CAINFO, os.environ["CURL_CA_BUNDLE"])
        c.pieces = [bytearray(n) for n in piece_sizes(start, end, BLOCK)]
        c.got = 0
        c.done = done
        c.headers = []
        state = {"piece": 0, "pos": 0}
        pieces = c.pieces

        def write(data, pieces=pieces, state=state):
            n, view = len(data), memoryview(data)
            i, pos = state["piece"], state["pos"]
            while view:
                room = len(pieces[i]) - pos
                take = min(room, len(view))
                pieces[i][pos:pos + take] = view[:take]
                view = view[take:]
                pos += take
                if pos == len(pieces[i]) and i + 1 < len(pieces):
                    i, pos = i + 1, 0
            state["piece"], state["pos"] = i, pos
            c.got += n

        c.setopt(p.WRITEFUNCTION, write)
        c.setopt(p.HEADERFUNCTION, c.headers.append)
        self.multi.add_handle(c)

    def _finish(self, c, error) -> None:
        self.multi.remove_handle(c)
        status = c.getinfo(self.pycurl.RESPONSE_CODE)
        done, pieces, got = c.done, c.pieces, c.got
        c.done = c.pieces = None
        self.handles.append(c)
        if error is None and status != 206:
            error = f"HTTP {status}"
        if error is None and got != sum(map(len, pieces)):
            error = f"short body {got}"
        done(pieces, error)

    async def warm(self) -> None:
        await self.fetch(0, 1 << 20)

    async def fetch(self, start: int, end: int):
        import trio

        token = trio.lowlevel.current_trio_token()
        event, box = trio.Event(), []

        def done(pieces, error):
            box.append((pieces, error))
            token.run_sync_soon(event.set)

        self.queue.append((start, end, done))
        os.write(self.wake_w, b"x")
        await event.wait()
        pieces, error = box[0]
        if error:
            raise RuntimeError(error)
        return pieces

    async def aclose(self) -> None:
        self.closed = True
        os.write(self.wake_w, b"x")
        self.thread.join(5)


def _piece_starts(start: int, size: int):
    pos = 0
    while pos < size:
        yield pos
        pos += min(BLOCK - (start + pos) % BLOCK, size - pos)


class RecvIntoEngine:
    """Blocking sockets in trio worker threads: send the request, read the head, then `recv_into`
    the block buffers (MSG_WAITALL, GIL released) from an mmap-backed pool; evicted blocks go back
    to the pool (a scan past the cache size stops faulting fresh pages)."""

    def __init__(self, url: str, conns: int, thp: bool = False) -> None:
        from urllib.parse import urlsplit

        self.thp = thp
        self.arena: list = []

        parts = urlsplit(url)
        self.host, self.port, self.path = parts.hostname, parts.port or 80, parts.path
        self.idle: list = []
        self.lock = threading.Lock()
        self.pool: list = []
        self.conns = conns

    def buffer(self, n: int):
        """A block buffer: a recycled one, else the next 1 MiB of an arena (private anonymous memory,
        64 MiB at a time; with `thp`, asked for as transparent huge pages: one fault per 2 MiB)."""
        with self.lock:
            if self.pool:
                return self.pool.pop()[:n]
            if not self.arena:
                arena = mmap.mmap(-1, ARENA, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                if self.thp:
                    arena.madvise(mmap.MADV_HUGEPAGE)
                whole = memoryview(arena)
                self.arena = [whole[i:i + BLOCK] for i in range(0, ARENA, BLOCK)][::-1]
            return self.arena.pop()[:n]

    def recycle(self, view) -> None:
        if view.nbytes == BLOCK:  # a short piece (the object's end) is not worth keeping
            with self.lock:
                self.pool.append(view)

    def _get(self, start: int, end: int):
        with self.lock:
            sock = self.idle.pop() if self.idle else None
        if sock is None:
            sock = socket.create_connection((self.host, self.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                     f"Range: bytes={start}-{end - 1}\r\nAccept-Encoding: identity\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(8192)
            if not chunk:
                raise RuntimeError("closed before the head")
            head += chunk
        head, _, rest = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        if lines[0].split()[1] != "206":
            raise RuntimeError(lines[0])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        if fields.get("content-range", "").split("/")[0] != f"bytes {start}-{end - 1}":
            raise RuntimeError(f"Content-Range {fields.get('content-range')}")
        length = int(fields["content-length"])
        pieces = []
        for pos in _piece_starts(start, length):
            n = min(BLOCK - (start + pos) % BLOCK, length - pos)
            view = self.buffer(n)
            got = min(len(rest), n)
            view[:got] = rest[:got]
            rest = rest[got:]
            while got < n:
                k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
                if not k:
                    raise RuntimeError("short body")
                got += k
            pieces.append(view)
        with self.lock:
            self.idle.append(sock)
        return pieces

    async def warm(self) -> None:
        import trio

        async with trio.open_nursery() as n:
            for _ in range(self.conns):
                n.start_soon(self.fetch, 0, 1 << 16)

    async def fetch(self, start: int, end: int):
        import trio

        return await trio.to_thread.run_sync(self._get, start, end)

    async def aclose(self) -> None:
        for sock in self.idle:
            sock.close()


# -- the child: one engine, one configuration ---------------------------------------------------------

async def latency(engine, size: int, count: int, result: dict) -> None:
    """`count` random 64 KiB ranges one after the other: seconds of each, CPU per request."""
    rng = random.Random(7)
    times = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(count):
        start = rng.randrange(0, size - (64 << 10)) // 4096 * 4096
        t0 = time.perf_counter()
        pieces = await engine.fetch(start, start + (64 << 10))
        times.append(time.perf_counter() - t0)
        if sum(len(p) for p in pieces) != 64 << 10:
            raise RuntimeError("short small read")
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    result.update(times=times, cpu=(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))


def child(args) -> dict:
    import trio

    url, size = args.url, args.size
    conns = max(8, args.par)
    kind = args.child
    if kind in ("direct", "aiohttp"):
        engine = FetcherEngine(url, "stdlib" if kind == "direct" else "aiohttp", conns)
    elif kind.startswith("obstore-"):
        engine = ObstoreEngine(url, kind.split("-", 1)[1], conns)
    elif kind == "pycurl":
        engine = CurlEngine(url, conns)
    elif kind in ("recvinto", "recvinto-thp"):
        engine = RecvIntoEngine(url, conns, thp=kind.endswith("thp"))
    else:
        raise SystemExit(f"unknown engine {kind}")
    sink = Sink(args.cache_mb << 20, getattr(engine, "recycle", None))
    span = args.range_mib << 20
    ranges = [(s, min(s + span, size)) for s in range(0, size, span)]
    result = {}

    async def main():
        await engine.warm()
        if args.latency:
            await latency(engine, size, args.latency, result)
            await engine.aclose()
            return
        todo = iter(ranges)
        r0, t0, c0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), thread_cpu()

        async def worker():
            for start, end in todo:
                sink.put(start, await engine.fetch(start, end))

        async with trio.open_nursery() as nursery:
            for _ in range(args.par):
                nursery.start_soon(worker)
        t1, r1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), thread_cpu()
        result.update(seconds=t1 - t0, cpu=(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                      minflt=r1.ru_minflt - r0.ru_minflt, threads={k: c1[k] - c0[k] for k in c1})
        await engine.aclose()

    trio.run(main)
    if args.latency:
        return result
    if sink.bytes != size:
        raise SystemExit(f"{kind}: fetched {sink.bytes} of {size} bytes")
    with open(args.file, "rb") as f:
        source = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        wrong = sum(1 for start, block in sink.blocks.items() if source[start:start + len(block)] != block)
    if wrong:
        raise SystemExit(f"{kind}: {wrong} blocks differ from the file")
    result["verified_blocks"] = len(sink.blocks)
    return result


BASELINE: Path | None = None  # --baseline: the "direct-baseline" engine runs refmount's code from this tree


def run_child(engine: str, url: str, size: int, range_mib: int, par: int, file: Path, cache_mb: int,
              latency: int = 0) -> dict:
    env = None
    if engine == "direct-baseline":
        env = code_env(BASELINE)
        engine_arg = "direct"
    else:
        engine_arg = engine
    done = subprocess.run([sys.executable, __file__, "--child", engine_arg, "--url", url, "--size", str(size),
                           "--range-mib", str(range_mib), "--par", str(par), "--file", str(file),
                           "--cache-mb", str(cache_mb), "--latency", str(latency)],
                          capture_output=True, text=True, timeout=300, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{engine} {range_mib} MiB x{par}: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256, help="MiB of data")
    p.add_argument("--sizes", default="1,4,8", help="range sizes, MiB")
    p.add_argument("--parallel", default="1,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--cache-mb", type=int, default=0, help="keep only this many MiB of blocks (0: all)")
    p.add_argument("--json", type=Path, help="write every run here")
    p.add_argument("--tls", action="store_true", help="https (a private CA; not for recvinto)")
    p.add_argument("--latency", type=int, default=0,
                   help="instead: this many random 64 KiB ranges one at a time (p50/p90 ms, CPU per request)")
    p.add_argument("--baseline", type=Path, metavar="TREE",
                   help="adds the engine 'direct-baseline': refmount's Fetcher from another commit's checkout")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--range-mib", type=int, help=argparse.SUPPRESS)
    p.add_argument("--par", type=int, help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    global BASELINE
    BASELINE = args.baseline
    engines = args.engines.split(",")
    if args.baseline and "direct-baseline" not in engines:
        engines.append("direct-baseline")
    sizes = [int(s) for s in args.sizes.split(",")]
    pars = [int(s) for s in args.parallel.split(",")]
    size = args.mb << 20
    results: dict = collections.defaultdict(list)
    record = Record("engines")
    load = [os.getloadavg()[0]]
    with ExitStack() as stack:
        run_dir = Path(tempfile.mkdtemp(prefix="refmount-engines-run."))
        serve = Path(tempfile.mkdtemp(prefix="refmount-engines-data.", dir="/dev/shm"))
        stack.callback(shutil.rmtree, serve, True)
        stack.callback(shutil.rmtree, run_dir, True)
        write_big(serve / "big.bin", size)
        serve.chmod(0o755)
        if args.tls:  # nginx with a private CA's certificate; every client trusts that CA through the environment
            ca = write_certificates(run_dir)
            for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
                os.environ[name] = str(ca)
        base = stack.enter_context(nginx_serving(serve, run_dir, tls=args.tls))
        if args.tls:
            base = base.replace("http://", "https://")
        url = base + "big.bin"
        for rnd in range(args.rounds if args.latency else 0):
            order = engines[rnd % len(engines):] + engines[:rnd % len(engines)]
            for engine in order:
                r = run_child(engine, url, size, 1, 1, serve / "big.bin", 0, args.latency)
                results[("lat", engine)].append(r)
                print(f"# round {rnd + 1} {engine}: p50 {percentile(r['times'], 0.5) * 1e3:.2f} ms",
                      file=sys.stderr, flush=True)
        for rnd in range(0 if args.latency else args.rounds):
            for rmib in sizes:
                for par in pars:
                    order = engines[rnd % len(engines):] + engines[:rnd % len(engines)]
                    for engine in order:
                        if engine == "curl":
                            r = curl_run(url, size, rmib, par, run_dir)
                        else:
                            r = run_child(engine, url, size, rmib, par, serve / "big.bin", args.cache_mb)
                        r.update(engine=engine, range_mib=rmib, par=par, round=rnd)
                        results[(rmib, par, engine)].append(r)
                        print(f"# round {rnd + 1} {rmib} MiB x{par} {engine}: {size / r['seconds'] / 1e6:.0f} MB/s "
                              f"{r['cpu'] / (size / 1e9):.2f} CPU-s/GB", file=sys.stderr, flush=True)
            load.append(os.getloadavg()[0])
    if args.latency:
        title = (f"random 64 KiB ranges one at a time, {args.latency} per run, {args.rounds} rounds (medians); "
                 f"load average {', '.join(f'{x:.1f}' for x in load)}")
        print(f"\n{title}\n")
        lines = ["| engine | p50 ms | p90 ms | CPU ms per request |", "|---|---|---|---|"]
        for engine in engines:
            runs = results[("lat", engine)]
            p50 = statistics.median(percentile(r["times"], 0.5) * 1e3 for r in runs)
            p90 = statistics.median(percentile(r["times"], 0.9) * 1e3 for r in runs)
            cpu = statistics.median(r["cpu"] / args.latency * 1e3 for r in runs)
            lines.append(f"| {engine} | {p50:.2f} | {p90:.2f} | {cpu:.3f} |")
        print("\n".join(lines))
        if args.json:
            record.write(args.json, {title: "\n".join(lines)}, runs=[r for runs in results.values() for r in runs])
        return 0
    gb = size / 1e9
    title = (f"{args.mb} MiB, {args.rounds} rounds (medians), cache {'all' if not args.cache_mb else args.cache_mb}"
             f" MiB; load average {', '.join(f'{x:.1f}' for x in load)}")
    print(f"\n{title}\n")
    lines = ["| ranges | engine | MB/s | CPU-s/GB | trio / tokio / other CPU-s/GB | faults/GB | MB/s ÷ curl | CPU ÷ curl |",
             "|---|---|---|---|---|---|---|---|"]
    for rmib in sizes:
        for par in pars:
            curl = results.get((rmib, par, "curl"))
            for engine in engines:
                runs = results[(rmib, par, engine)]
                mbps = statistics.median(size / r["seconds"] / 1e6 for r in runs)
                cpu = statistics.median(r["cpu"] / gb for r in runs)
                faults = statistics.median(r["minflt"] / gb for r in runs)
                split = " / ".join(f"{statistics.median(r['threads'].get(k, 0) / gb for r in runs):.2f}"
                                   for k in ("trio", "tokio", "other")) if engine != "curl" else "—"
                # ratios of paired runs (same round), then their median
                if curl:
                    rate = statistics.median(c["seconds"] / r["seconds"] for r, c in zip(runs, curl))
                    cpur = statistics.median(r["cpu"] / c["cpu"] for r, c in zip(runs, curl))
                    ratios = f"{rate:.2f} | {cpur:.2f}"
                else:
                    ratios = "— | —"
                lines.append(f"| {rmib} MiB x{par} | {engine} | {mbps:.0f} | {cpu:.2f} | {split} | {faults:.0f} | "
                             f"{ratios} |")
    print("\n".join(lines))
    if args.json:
        record.write(args.json, {title: "\n".join(lines)}, runs=[r for runs in results.values() for r in runs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
