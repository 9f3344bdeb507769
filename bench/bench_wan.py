"""WAN benchmark: refmount against rclone mount, fsspec and curl over an emulated link (issue 13).

    bench/bench_wan.sh [--quick] [--rtt 0,2,20,80] [--runs N] [--link auto|netem|nfqueue|proxy]
                       [--refmount-options='...'] [--baseline TREE]

Needs root. Builds its own network namespace and veth pair (addresses only inside one /30 of its own),
adds `tc netem delay RTT/2 rate 1gbit` on both ends, and serves a random file and a kerchunked,
uncompressed netCDF-4 file (one chunk per time step; inputs from bench/harness) from an nginx
started INSIDE the namespace. From the host, at each RTT, with the contenders alternating in each run:

- refmount dd: cold `dd bs=1M` of a whole-file reference, 1 reader;
- refmount chunks: `cat` of every chunk file of the netCDF file in order, 1 reader;
- refmount chunks x4: 4 such readers at once, each of one quarter of the chunk files (consecutive keys);
- refmount 4 readers: 4 `dd` of the four quarters of the whole file at once;
- rclone dd: `rclone mount :http:` (no VFS cache), cold `dd bs=1M`;
- fsspec cat: ReferenceFileSystem.cat of all chunk keys in one call (batched), fresh process;
- curl x1 and curl x8 (8 parallel ranged requests of eighths of the file).

With --baseline TREE, "baseline dd", "baseline chunks" and "baseline 4 readers" run the same as the
refmount ones with refmount's code from TREE (another commit's checkout), in turn with the others.

Prints, per RTT, MB/s median (min-max), CPU-s per GB (the daemon's, or the client processes') and the
ratio to curl x8, and logs each refmount run's request count, mean request size and per-host pacing.
Then, per RTT, the p50 latency of random 64 KiB reads through refmount and of keep-alive ranged GETs.

A kernel without sch_netem (CONFIG_NET_SCH_NETEM unset, as on the 6.18 "fc" kernel this was written
on) cannot delay packets. The benchmark then emulates the link in userspace: bench/delayproxy.py runs
inside the namespace on the server address (nginx moves to the namespace's loopback), delaying each
chunk by RTT/2 per direction, serialising all connections through a 1 Gbit/s bottleneck per direction,
with a per-connection window (--window, default 4 MiB, with slow start) and a 1-RTT handshake; it is
restarted for each RTT. Its own ceiling (curl through it, unlimited, at RTT 0, against curl straight to
nginx) is measured first. CPU figures never include the proxy. --link proxy forces this mode.
--link nfqueue keeps the endpoints' own kernel TCP instead (issue 26): the host's veth leads to a router
namespace and on to the server's namespace; iptables (legacy) in the router sends each packet arriving
from either side to an NFQUEUE, where bench/nfqdelay.c (built with gcc at start, run real time in the
router namespace) holds it RTT/2 behind a 1 Gbit/s bottleneck per direction and accepts it, in order.
Both ends keep their kernel defaults (congestion control, tcp_rmem/tcp_wmem are logged). At each RTT the
TCP connect time checks the delay; the line's own ceiling (curl through the queue at 0 ms, unlimited,
against curl through the router without it) is measured first, and its counters (packets, drops,
releases more than 1 ms late) are logged at each RTT. --link auto picks netem, else nfqueue when
iptables-legacy, gcc and libnetfilter-queue-dev are here, else the proxy.
Everything it creates (mounts, nginx, proxy or delay line, namespaces, veths, rules) is removed at exit,
also on failure or a signal; bench_wan.sh adds a trap for a hard kill. --quick: smaller files, 2 runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import http.client
import random
from urllib.parse import urlsplit
from contextlib import ExitStack
from pathlib import Path

from harness.inputs import big_file, chunks_file
from harness.links import (Link, NfqLink, connect_ms, delay_proxy, link_up, nfq_delay, build_nfqdelay,
                           pick_link)
from harness.mounts import refmount_mounted, remove_scratch
from harness.peers import chunk_keys, curl_parallel, curl_whole, fsspec_cat, kerchunk_refs, rclone_mounted
from harness.record import Record
from harness.servers import DIRECT_PORT, nginx_in
from harness.system import (children_cpu_s, dd_bytes, drop_caches, exit_on_signals, log, percentile,
                            timed)

HERE = Path(__file__).resolve().parent

MB = 1e6
LATENCY_READS = 20
FULL = dict(big_mb=256, chunk_steps=400)  # chunk: 640 kB per time step
QUICK = dict(big_mb=64, chunk_steps=100)


# -- the link's ceiling --------------------------------------------------------------------------------


def nfq_ceiling(bench: "Bench", link: NfqLink, run_dir: Path, binary: Path) -> str:
    """curl x1 and x8 through the router without the queue and through the delay line at 0 ms and no
    rate limit: the most the line can carry here, which must stay well above the 125 MB/s it emulates."""
    rows: dict[str, dict[str, list[float]]] = {"curl x1": {"direct": [], "line": []},
                                               "curl x8": {"direct": [], "line": []}}
    for _ in range(2):
        for name, fn in (("curl x1", bench.curl_1), ("curl x8", bench.curl_8)):
            rows[name]["direct"].append(fn()["mbps"])
        link.queue(True)
        try:
            with nfq_delay(link, run_dir, binary, 0, rate_mbit=0):
                for name, fn in (("curl x1", bench.curl_1), ("curl x8", bench.curl_8)):
                    rows[name]["line"].append(fn()["mbps"])
        finally:
            link.queue(False)
    return "delay line ceiling (0 ms, unlimited; best of 2): " + ", ".join(
        f"{name} {max(r['line']):.0f} MB/s through the queue vs {max(r['direct']):.0f} without it"
        for name, r in rows.items())


def note_requests(m) -> None:
    """Log what the daemon asked the server for (request count and mean size, per-host pacing)."""
    stats = m.stats()
    fetch = stats["fetch"]
    log(f"  refmount: {fetch['requests']} requests, {fetch['bytes'] / max(fetch['requests'], 1) / 2**20:.1f} MiB "
        f"mean, latency {fetch.get('latency')}, hosts {stats.get('hosts')}, memory {stats.get('memory')}, "
        f"read-ahead {stats.get('readahead')}, grid {stats.get('grid_readahead')}")


# -- contenders: each returns {"mbps", "cpu_s_per_gb"} ------------------------------------------------


class Bench:
    def __init__(self, url: str, run_dir: Path, refs: dict[str, Path], big_size: int, chunks: list[str],
                 chunk_bytes: int, options: list[str], baseline: Path | None = None) -> None:
        self.url, self.run_dir, self.refs = url, run_dir, refs
        self.big_size, self.chunks, self.chunk_bytes = big_size, chunks, chunk_bytes
        self.options = options
        self.baseline = baseline  # refmount's code for the "baseline ..." contenders
        self.code: Path | None = None  # the code the next mount runs (None: this checkout's)

    def result(self, nbytes: int, seconds: float, cpu: float, expect: int) -> dict:
        if nbytes != expect:
            raise RuntimeError(f"read {nbytes} bytes, expected {expect}")
        return {"mbps": nbytes / seconds / MB, "cpu_s_per_gb": cpu / (nbytes / 1e9)}

    def mounted(self, refs: str):
        return refmount_mounted(self.refs[refs], self.run_dir / "mnt-refmount", ["--view", "raw", *self.options],
                                   self.code)

    def with_baseline(self, method: str) -> dict:
        self.code = self.baseline
        try:
            return getattr(self, method)()
        finally:
            self.code = None

    def refmount_dd(self) -> dict:
        with self.mounted("big") as m:
            drop_caches()
            seconds, cpu, out = timed(f"dd if={m.path / 'big'} of=/dev/null bs=1M", lambda: m.pid)
            note_requests(m)
            return self.result(dd_bytes(out), seconds, cpu, self.big_size)

    def refmount_4(self) -> dict:
        quarter_mib = -(-self.big_size // 4 // (1 << 20))
        with self.mounted("big") as m:
            drop_caches()
            cmd = " & ".join(f"dd if={m.path / 'big'} of=/dev/null bs=1M skip={k * quarter_mib} "
                             f"count={quarter_mib}" for k in range(4)) + " & wait"
            seconds, cpu, out = timed(cmd, lambda: m.pid)
            note_requests(m)
            return self.result(dd_bytes(out), seconds, cpu, self.big_size)

    def refmount_chunks(self) -> dict:
        with self.mounted("chunks") as m:
            listing = self.run_dir / "chunk-files"
            listing.write_text("\0".join(str(m.path / key) for key in self.chunks))
            drop_caches()
            seconds, cpu, out = timed(f"xargs -0 -n 1000 cat < {listing} | wc -c", lambda: m.pid)
            note_requests(m)
            return self.result(int(out.split()[0]), seconds, cpu, self.chunk_bytes)

    def refmount_chunks_4(self) -> dict:
        """4 readers at once, each `cat`ting one quarter of the chunk files (consecutive keys) in order."""
        with self.mounted("chunks") as m:
            quarter = -(-len(self.chunks) // 4)
            lists = []
            for k in range(4):
                listing = self.run_dir / f"chunk-files-{k}"
                listing.write_text("\0".join(str(m.path / key) for key in self.chunks[k * quarter:(k + 1) * quarter]))
                lists.append(listing)
            drop_caches()
            cmd = " & ".join(f"(xargs -0 -n 1000 cat < {listing} | wc -c)" for listing in lists) + " & wait"
            seconds, cpu, out = timed(cmd, lambda: m.pid)
            note_requests(m)
            return self.result(sum(map(int, out.split())), seconds, cpu, self.chunk_bytes)

    def rclone_dd(self) -> dict:
        with rclone_mounted(self.url, self.run_dir / "mnt-rclone", "big.bin", self.run_dir / "rclone.log") as m:
            drop_caches()
            seconds, cpu, out = timed(f"dd if={m.path / 'big.bin'} of=/dev/null bs=1M", lambda: m.pid)
            return self.result(dd_bytes(out), seconds, cpu, self.big_size)

    def fsspec_cat(self) -> dict:
        seconds_cpu = children_cpu_s()
        result = fsspec_cat(self.refs["chunks"])
        cpu = children_cpu_s() - seconds_cpu  # includes the interpreter's start and imports: a little high
        return self.result(result["bytes"], result["seconds"], cpu, self.chunk_bytes)

    def curl_1(self) -> dict:
        seconds, cpu, out = timed(curl_whole(self.url + "big.bin"))
        return self.result(int(out), seconds, cpu, self.big_size)

    def curl_8(self, url: str | None = None) -> dict:
        seconds, cpu, out = timed(curl_parallel((url or self.url) + "big.bin", self.big_size, 8))
        return self.result(sum(map(int, out.split())), seconds, cpu, self.big_size)

    def curl_1_at(self, url: str) -> dict:
        seconds, cpu, out = timed(curl_whole(url + "big.bin"))
        return self.result(int(out), seconds, cpu, self.big_size)

    def random_offsets(self, seed: int) -> list[int]:
        """LATENCY_READS + 1 (a warm-up) 64 KiB-aligned offsets at least 1 MiB apart (no read-ahead overlap)."""
        slots = random.Random(seed).sample(range(self.big_size // (1 << 20) - 1), LATENCY_READS + 1)
        return [slot * (1 << 20) + random.Random(slot).randrange(0, 15) * 65536 for slot in slots]

    def latency(self) -> dict:
        """p50 ms of random 64 KiB reads: through a fresh refmount (after one warm-up read, so the
        connection exists) and as keep-alive ranged GETs from one connection; and the link's round
        trip as seen by a client (keep-alive GETs of 1 byte), the yardstick of the RTT + 2 ms target."""
        offsets = self.random_offsets(13)
        mount_ms = []
        with self.mounted("big") as m:
            drop_caches()
            fd = os.open(m.path / "big", os.O_RDONLY)
            try:
                for k, offset in enumerate(offsets):
                    t0 = time.perf_counter()
                    got = len(os.pread(fd, 65536, offset))
                    if got != 65536:
                        raise RuntimeError(f"random read at {offset}: {got} bytes")
                    if k:
                        mount_ms.append((time.perf_counter() - t0) * 1000)
            finally:
                os.close(fd)
            note_requests(m)
        split = urlsplit(self.url)
        conn = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
        get_ms, rtt_ms = [], []
        try:
            # keep-alive ranged GETs of the same 64 KiB, then of 1 byte each (the link's own round trip)
            for times, length in ((get_ms, 65536), (rtt_ms, 1)):
                for k, offset in enumerate(offsets):
                    t0 = time.perf_counter()
                    conn.request("GET", "/big.bin", headers={"Range": f"bytes={offset}-{offset + length - 1}"})
                    body = conn.getresponse().read()
                    if len(body) != length:
                        raise RuntimeError(f"keep-alive GET at {offset}: {len(body)} bytes")
                    if k:
                        times.append((time.perf_counter() - t0) * 1000)
        finally:
            conn.close()
        return {"refmount_p50_ms": statistics.median(mount_ms), "refmount_p90_ms": percentile(mount_ms, 0.9),
                "get_p50_ms": statistics.median(get_ms), "round_trip_p50_ms": statistics.median(rtt_ms)}


CONTENDERS = {"refmount dd": "refmount_dd", "refmount chunks": "refmount_chunks",
              "refmount chunks x4": "refmount_chunks_4", "refmount 4 readers": "refmount_4",
              "rclone dd": "rclone_dd", "fsspec cat": "fsspec_cat", "curl x1": "curl_1", "curl x8": "curl_8"}


def measure(bench: Bench, runs: int, deadline: float, only: list[str] | None = None) -> dict[str, list[dict]]:
    """Every contender `runs` times, the order rotated each run (alternating, so drift hits all)."""
    contenders = dict(CONTENDERS)
    if bench.baseline:
        contenders.update({name.replace("refmount", "baseline"): method for name, method in CONTENDERS.items()
                           if name.startswith("refmount")})
    names = [n for n in contenders if not only or n in only]
    results: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(runs):
        for name in names[r % len(names):] + names[: r % len(names)]:
            if time.monotonic() > deadline:
                log(f"time is up: skipping {name}")
                continue
            try:
                if name.startswith("baseline"):
                    results[name].append(bench.with_baseline(contenders[name]))
                else:
                    results[name].append(getattr(bench, contenders[name])())
            except Exception as e:  # noqa: BLE001  (one failed contender must not lose the table)
                log(f"{name} failed: {e}")
    return results


def latency_table(latencies: dict[float, dict]) -> str:
    lines = ["| RTT | refmount 64 KiB p50 (p90) | keep-alive GET 64 KiB p50 | 1-byte GET p50 (round trip) | "
             "refmount over the round trip (target 2 ms) |", "|---|---|---|---|---|"]
    for rtt, lat in latencies.items():
        trip = lat.get("round_trip_p50_ms")
        lines.append(f"| {rtt:g} ms | {lat['refmount_p50_ms']:.1f} ms ({lat['refmount_p90_ms']:.1f}) | "
                     f"{lat['get_p50_ms']:.1f} ms | " + (f"{trip:.1f} ms | {lat['refmount_p50_ms'] - trip:.1f} ms |"
                                                        if trip is not None else "- | - |"))
    return "\n".join(lines)


def proxy_ceiling(bench: Bench, link: Link, run_dir: Path, window: int) -> str:
    """curl x1 and x8 straight to nginx and through the delay proxy (RTT 0, no rate limit): the most the
    proxy can forward on this machine, which must stay well above the 125 MB/s it emulates."""
    direct = f"http://{link.server_ip}:{DIRECT_PORT}/"
    rows = {}
    with delay_proxy(link, run_dir, 0, window, rate_mbit=0):
        for name, fn in (("curl x1", bench.curl_1_at), ("curl x8", bench.curl_8)):
            rows[name] = {"direct": fn(direct)["mbps"], "proxy": fn(bench.url)["mbps"]}
    return "proxy ceiling (RTT 0, unlimited): " + ", ".join(
        f"{name} {r['proxy']:.0f} MB/s through the proxy vs {r['direct']:.0f} direct" for name, r in rows.items())


def paired_ratios(runs: list[dict], ref: list[dict]) -> list[float]:
    """Each run's MB/s over curl x8's in the same run (both lists hold one entry per run, in run order,
    unless a run failed: then there is no pairing)."""
    if len(runs) != len(ref):
        return []
    return [r["mbps"] / c["mbps"] for r, c in zip(runs, ref)]


def table(rtt_results: dict[float, dict[str, list[dict]]]) -> str:
    lines = ["| RTT | contender | MB/s median (min-max) | CPU-s/GB | ratio to curl x8 | paired ratio median (min-max) |",
             "|---|---|---|---|---|---|"]
    for rtt, results in rtt_results.items():
        ref = [r["mbps"] for r in results.get("curl x8", [])]
        ref_median = statistics.median(ref) if ref else None
        for name, runs in results.items():
            if not runs:
                lines.append(f"| {rtt:g} ms | {name} | failed | | | |")
                continue
            mbps = [r["mbps"] for r in runs]
            cpu = statistics.median(r["cpu_s_per_gb"] for r in runs)
            med = statistics.median(mbps)
            ratio = f"{med / ref_median:.2f}" if ref_median else "-"
            paired = paired_ratios(runs, results.get("curl x8", []))
            pair = f"{statistics.median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f})" if paired else "-"
            lines.append(f"| {rtt:g} ms | {name} | {med:.0f} ({min(mbps):.0f}-{max(mbps):.0f}) | {cpu:.2f} | {ratio} "
                         f"| {pair} |")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller files, 2 runs")
    p.add_argument("--rtt", default="0,2,20,80", help="comma-separated round-trip times in ms (default 0,2,20,80)")
    p.add_argument("--only", help="comma-separated contenders: " + ", ".join(CONTENDERS))
    p.add_argument("--runs", type=int, help="runs per contender (default 3, or 2 with --quick)")
    p.add_argument("--refmount-options", default="", metavar="'OPTS'", help="extra options for every refmount mount")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/refmount-wan"), help="generated inputs (kept)")
    p.add_argument("--link", choices=("auto", "netem", "nfqueue", "proxy"), default="auto",
                   help="how to emulate the link: tc netem, kernel TCP through bench/nfqdelay.c on NFQUEUE, or "
                   "bench/delayproxy.py (auto: netem if the kernel has it, else nfqueue if its tools are here)")
    p.add_argument("--window", type=int, default=4 << 20, help="delay proxy: per-connection window in bytes "
                   "(default 4 MiB: one stream at 80 ms gets about 1/3 of the link, as real TCP did)")
    p.add_argument("--init-window", type=int, help="delay proxy: initial window in bytes (default 10 segments, "
                   "slow start as Linux; 0: every connection starts at --window)")
    p.add_argument("--no-latency", action="store_true", help="skip the random 64 KiB read latencies")
    p.add_argument("--baseline", type=Path, metavar="TREE",
                   help="also run the refmount contenders with refmount's code from TREE, in turn")
    p.add_argument("--max-minutes", type=float, default=40, help="stop starting measurements after this long")
    p.add_argument("--out", type=Path, default=HERE / "out" / "wan.json")
    p.add_argument("--run-dir", type=Path, help="scratch dir (default: a new temp dir; removed)")
    p.add_argument("--serve-dir", type=Path, help="tmpfs dir for the served files (default: new under /dev/shm)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench_wan.py needs root (network namespaces, FUSE mounts, drop_caches)")
    for tool in ("ip", "tc", "nginx", "curl", "rclone"):
        if shutil.which(tool) is None:
            sys.exit(f"bench_wan.py: {tool} is missing (bench/bench_wan.sh installs it)")
    exit_on_signals()
    record = Record("wan", args.quick)
    sizes = QUICK if args.quick else FULL
    runs = args.runs or (2 if args.quick else 3)
    rtts = [float(x) for x in args.rtt.split(",")]
    deadline = time.monotonic() + args.max_minutes * 60
    big = big_file(args.workdir, sizes["big_mb"])
    chunks_nc = chunks_file(args.workdir, sizes["chunk_steps"])
    tag = str(os.getpid() % 100000)
    kind = pick_link(args.link, tag, os.getpid() % 250)
    link = NfqLink(tag, os.getpid() % 250) if kind == "nfqueue" else Link(tag, os.getpid() % 250)
    netem, nfqueue = kind == "netem", kind == "nfqueue"
    results: dict[float, dict] = {}
    latencies: dict[float, dict] = {}
    with ExitStack() as stack:
        run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="refmount-wan-run."))
        serve = args.serve_dir or Path(tempfile.mkdtemp(prefix="refmount-wan-data.", dir="/dev/shm"))
        stack.callback(shutil.rmtree, serve, ignore_errors=True)
        stack.callback(remove_scratch, run_dir)  # unmounts mnt-* first
        link_up(stack, link, run_dir)
        log(f"namespace {link.ns}: server {link.server_ip}, host {link.host_ip}"
            + (f", router namespace {link.router}" if nfqueue else ""))
        shutil.copyfile(big, serve / "big.bin")
        shutil.copyfile(chunks_nc, serve / "chunks.nc")
        serve.chmod(0o755)
        if nfqueue:
            log("no tc netem (or --link nfqueue): kernel TCP through bench/nfqdelay.c holding packets on NFQUEUE "
                f"in the router namespace; TCP: {link.tcp_settings()}")
            nfqdelay = build_nfqdelay(run_dir)
        elif not netem:
            log("no tc netem (this kernel lacks sch_netem, or --link proxy): the link is emulated by "
                f"bench/delayproxy.py (window {args.window} bytes)")
        proxied = kind == "proxy"
        url = stack.enter_context(nginx_in(link, serve, run_dir, proxied=proxied))
        refs = {"big": run_dir / "big.json", "chunks": run_dir / "chunks.json"}
        refs["big"].write_text(json.dumps({"big": [url + "big.bin"]}))
        kerchunked = kerchunk_refs(chunks_nc, url + "chunks.nc")
        refs["chunks"].write_text(json.dumps(kerchunked))
        lengths = chunk_keys(kerchunked)
        order = sorted(lengths, key=lambda k: [int(p) if p.isdigit() else p for p in re.split(r"[/.]", k)])
        bench = Bench(url, run_dir, refs, big.stat().st_size, order, sum(lengths.values()),
                      shlex.split(args.refmount_options), args.baseline)
        ceiling = ""
        if proxied:
            ceiling = proxy_ceiling(bench, link, run_dir, args.window)
            log(ceiling)
        elif nfqueue:
            ceiling = nfq_ceiling(bench, link, run_dir, nfqdelay)
            log(ceiling)
        checks = []
        for rtt in rtts:
            log(f"RTT {rtt:g} ms")
            with ExitStack() as shaping:
                if netem:
                    link.set_rtt(rtt)
                elif nfqueue:
                    shaping.enter_context(nfq_delay(link, run_dir, nfqdelay, rtt))
                    link.queue(True)
                    shaping.callback(link.queue, False)
                    checks.append(f"RTT {rtt:g} ms: TCP connect p50 {connect_ms(url):.1f} ms")
                    log(checks[-1])
                else:
                    shaping.enter_context(delay_proxy(link, run_dir, rtt, args.window, init_window=args.init_window))
                results[rtt] = measure(bench, runs, deadline, args.only and args.only.split(","))
                log("\n" + table({rtt: results[rtt]}))
                if not args.no_latency and time.monotonic() < deadline:
                    try:
                        latencies[rtt] = bench.latency()
                        log("\n" + latency_table({rtt: latencies[rtt]}))
                    except Exception as e:  # noqa: BLE001
                        log(f"latency at {rtt:g} ms failed: {e}")
    out = table(results)
    link_kind = {"netem": "tc netem",
                 "nfqueue": f"kernel TCP, bench/nfqdelay.c on NFQUEUE at 1 Gbit/s; {ceiling}; {'; '.join(checks)}",
                 "proxy": f"bench/delayproxy.py, window {args.window} bytes; {ceiling}"}[kind]
    print(f"link: {link_kind}\n")
    print(out)
    if latencies:
        print("\n" + latency_table(latencies))
    print(f"\n{'quick' if args.quick else 'full'}: {sizes}, {runs} runs, load average {os.getloadavg()[0]:.1f} "
          f"at the end (2 shared cores: noisy)")
    tables = {"MB/s by RTT": out, **({"random 64 KiB reads": latency_table(latencies)} if latencies else {})}
    record.write(args.out, tables, notes=[f"link: {link_kind}", f"{sizes}, {runs} runs"], sizes=sizes, runs=runs,
                 link=link_kind, table=out, latency={str(k): v for k, v in latencies.items()},
                 results={str(k): v for k, v in results.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
