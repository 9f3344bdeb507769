"""Speed benchmarks: refmount's data path against rclone mount, curl, fsspec and a local Zarr copy.

    bench/run-speed.sh [--quick]                      # installs nginx-light/rclone/matplotlib if missing
    /tmp/v/bin/python bench/bench_speed.py [--quick] [--only NAME[,NAME]] [--runs N]
        [--refmount-options='--block-size 4M'] [--out PREFIX] [--workdir DIR] [--baseline TREE]

NAME is one of: sequential, chunks, memory, disk, cold_random, ncdump. Needs root (FUSE mounts and
`echo 3 > /proc/sys/vm/drop_caches`). Everything is served by a loopback nginx that this script starts
with its own configuration on a free 127.0.0.1 port (sendfile on, Range honoured, autoindex for rclone)
and stops at exit. The served files live on tmpfs, so dropping the page cache empties only the client
side (the FUSE mounts), never the server's copy; inputs are generated once under --workdir and reused.

1. sequential: cold `dd bs=1M` of a whole-file reference (`{"big": [url]}`, `--view raw`) against
   `rclone mount` of the same url (no VFS cache) and against `curl -o /dev/null` (the wire limit).
2. chunks: every chunk file of a kerchunked, uncompressed netCDF-4 file, `cat` by 4 parallel readers,
   against fsspec `ReferenceFileSystem(...).cat(all chunk keys)` in one fresh Python process.
3. memory: `--cache-size 1G --cache-dir DIR`; read the big file once, drop the page cache, re-read it
   (refmount's block cache); then remount with the same DIR, drop the page cache and read it again
   (the disk cache, against the memory re-read).
   disk: the disk cache's re-read after a remount against `cat` of its block files (listed once, in
   block order), both cold and in turn, over one cache filled once; the remount's first stat (a HEAD
   for the object's size and validator) is waited for before the timed re-read and shown apart.
4. memory / cold_random: random `os.pread` of 4 KiB–1 MiB (log-uniform sizes) with the page cache dropped
   for the file before every read (posix_fadvise DONTNEED): cache hits after the full read, and cold
   reads on a fresh mount (one read per equal slice of the file, so no read finds another's blocks).
5. ncdump: `ncdump 'file://DIR#mode=zarr,file' > /dev/null` of a zlib-compressed netCDF-4 file through
   `refmount mount` (default --view decoded) against a local copy of that decoded tree (`cp -r`).

--baseline TREE also mounts refmount's code from TREE (a checkout of another commit, put first on the
daemon's PYTHONPATH) for sequential, chunks, memory and disk, alternating with this code in every run, and
adds rows comparing the two ("today's code").

Each refmount mount is fresh (cold block cache) and every timed run starts after drop_caches, except the
cache-hit measurements, whose point is a warm refmount. Each measurement runs 3 times (contenders
interleaved within a run, in an order that rotates from run to run for sequential and chunks) and the
table shows medians; a ratio is the median of the runs' own ratios
(paired: both sides of a pair ran moments apart); --quick runs once on smaller files (< 3 min).
Prints one markdown table, writes PREFIX.json and draws PREFIX.png (default bench/out/speed) from the same
rows. MB = 10**6 bytes (as dd and curl count); peak RSS is the daemon's VmHWM in MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.inputs import generated, write_big, write_netcdf
from harness.mounts import (cat_cold_mbps, disk_cache_blocks, refmount_mounted, scratch_dir, stat_after_remount_ms,
                            wait_cache_dir_free)
from harness.peers import chunk_keys, fsspec_cat, kerchunk_refs, rclone_mounted
from harness.record import Record
from harness.servers import nginx_serving
from harness.system import (drop_caches, exit_on_signals, log, machine_line, percentile, run, timed_run,
                            wait_for)

PYTHON = sys.executable
HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "speed"
NCDUMP_TIMEOUT_S = 240
MB = 1e6

# big: whole-file bytes; chunks: time steps of a (t, 400, 400) float32 array, one 640 kB chunk per step;
# ncdump: time steps of a (t, 500, 500) float32 zlib array (1 MB per step before compression).
FULL = dict(big_mb=320, chunk_steps=500, ncdump_steps=250, hit_reads=500, cold_reads=100)
QUICK = dict(big_mb=64, chunk_steps=100, ncdump_steps=20, hit_reads=200, cold_reads=50)


# ---------------------------------------------------------------------------------------------------
# Inputs: generated once under --workdir (bench/harness/inputs.py), copied to tmpfs for serving
# ---------------------------------------------------------------------------------------------------

@dataclass
class Inputs:
    big: Path
    chunks_nc: Path
    zlib_nc: Path


def ensure_inputs(work: Path, sizes: dict) -> Inputs:
    work.mkdir(parents=True, exist_ok=True)
    big_mb, cs, ns = sizes["big_mb"], sizes["chunk_steps"], sizes["ncdump_steps"]
    return Inputs(
        big=generated(work / f"big_{big_mb}MB.bin", lambda p: write_big(p, big_mb * 1_000_000)),
        chunks_nc=generated(work / f"chunks_{cs}.nc", lambda p: write_netcdf(p, cs, 400, zlib=False)),
        zlib_nc=generated(work / f"zlib_{ns}.nc", lambda p: write_netcdf(p, ns, 500, zlib=True)))


# ---------------------------------------------------------------------------------------------------
# Probes: one timed run of one contender, each returning a dict of numbers
# ---------------------------------------------------------------------------------------------------

def dd_mbps(path: Path, expect: int) -> float:
    done, seconds = timed_run(["dd", f"if={path}", "of=/dev/null", "bs=1M"])
    copied = int(re.search(r"^(\d+) bytes", done.stderr, re.M).group(1))
    if copied != expect:
        raise RuntimeError(f"dd read {copied} bytes of {path}, expected {expect}")
    return expect / seconds / MB


def cold_dd(path: Path, expect: int) -> float:
    drop_caches()
    return dd_mbps(path, expect)


def probe_curl(url: str, expect: int) -> dict:
    drop_caches()
    done, seconds = timed_run(["curl", "-s", "-o", "/dev/null", "-w", "%{size_download}", url])
    if int(done.stdout) != expect:
        raise RuntimeError(f"curl got {done.stdout} bytes of {url}, expected {expect}")
    return {"mbps": expect / seconds / MB}


def random_plan(size: int, count: int, seed: int, slotted: bool) -> list[tuple[int, int]]:
    """(offset, length) pairs, lengths log-uniform in 4 KiB..1 MiB. slotted: one read in each of `count`
    equal slices of the file, in shuffled order, so that no read is served by blocks an earlier one fetched."""
    rng = random.Random(seed)
    plan = []
    slot = size // count
    for n in range(count):
        length = int(2 ** rng.uniform(12, 20))
        if slotted:
            length = min(length, slot // 2)
            plan.append((n * slot + rng.randrange(slot - length), length))
        else:
            plan.append((rng.randrange(size - length), length))
    if slotted:
        rng.shuffle(plan)
    return plan


def pread_latencies_ms(path: Path, plan: list[tuple[int, int]]) -> list[float]:
    """Time each pread after evicting the file from the page cache, so that the FUSE daemon answers."""
    fd = os.open(path, os.O_RDONLY)
    try:
        latencies = []
        for offset, length in plan:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            got = len(os.pread(fd, length, offset))
            latencies.append((time.perf_counter() - t0) * 1000)
            if got != length:
                raise RuntimeError(f"pread({length} at {offset}) of {path} returned {got} bytes")
        return latencies
    finally:
        os.close(fd)


def latency_summary(latencies: list[float], prefix: str) -> dict:
    return {f"{prefix}_p50_ms": percentile(latencies, 0.5), f"{prefix}_p99_ms": percentile(latencies, 0.99),
            f"{prefix}_max_ms": max(latencies)}


# ---------------------------------------------------------------------------------------------------
# Table rows and their targets
# ---------------------------------------------------------------------------------------------------

@dataclass
class Target:
    subject: str  # "ratio" (refmount / compared) or "refmount"
    op: str  # ">=" or "<="
    limit: float

    def passed(self, row: Row) -> bool | None:
        value = row.ratio if self.subject == "ratio" else row.refmount
        if value is None:
            return None
        return value >= self.limit if self.op == ">=" else value <= self.limit

    def text(self, unit: str) -> str:
        sign = "≥" if self.op == ">=" else "≤"
        return f"ratio {sign} {self.limit:g}" if self.subject == "ratio" else f"{sign} {self.limit:g} {unit}"

    def level(self, row: Row) -> float | None:
        """The refmount value that would just meet the target (for the chart)."""
        if self.subject == "refmount":
            return self.limit
        return None if row.compared is None else row.compared * self.limit


@dataclass
class Row:
    group: str  # chart panel: "throughput", "latency" or "time"
    name: str
    short: str  # chart label
    unit: str
    refmount: float | None
    compared_with: str = ""
    compared: float | None = None
    target: Target | None = None
    peak_rss_mib: float | None = None
    note: str = ""
    compared_peak_rss_mib: float | None = None
    paired_ratio: float | None = None  # median of the runs' own ratios, where both were measured in each run

    @property
    def ratio(self) -> float | None:
        if self.paired_ratio is not None:
            return self.paired_ratio
        if self.refmount is None or not self.compared:
            return None
        return self.refmount / self.compared

    def cells(self) -> list[str]:
        def fmt(v):
            if v is None:
                return "n/a"
            return f"{v:,.0f} {self.unit}" if v >= 100 else f"{v:.3g} {self.unit}"

        passed = None if self.target is None else self.target.passed(self)
        return [self.name + (f" ({self.note})" if self.note else ""), fmt(self.refmount),
                self.compared_cell(fmt),
                "—" if self.ratio is None else f"{self.ratio:.2f}",
                self.target.text(self.unit) if self.target else "—",
                "—" if passed is None else "pass" if passed else "FAIL",
                "—" if self.peak_rss_mib is None else f"{self.peak_rss_mib:,.0f} MiB"]

    def compared_cell(self, fmt) -> str:
        if not self.compared_with:
            return "—"
        rss = "" if self.compared_peak_rss_mib is None else f" (peak RSS {self.compared_peak_rss_mib:,.0f} MiB)"
        return f"{self.compared_with}: {fmt(self.compared)}{rss}"

    def to_json(self) -> dict:
        data = asdict(self)
        data["ratio"] = self.ratio
        data["passed"] = None if self.target is None else self.target.passed(self)
        return data


# ---------------------------------------------------------------------------------------------------
# Measurements: each repeats one run (all contenders interleaved) and turns the medians into rows
# ---------------------------------------------------------------------------------------------------

@dataclass
class Context:
    runs: int
    sizes: dict
    inputs: Inputs
    run_dir: Path
    base_url: str
    refs: dict[str, Path]  # "big", "chunks", "zlib" -> reference set path
    options: list[str]  # extra refmount mount options (--refmount-options)
    raw: dict = field(default_factory=dict)
    baseline: Path | None = None  # refmount's code to compare with (--baseline)

    def mount(self, refs: str, *options: str, code: Path | None = None):
        return refmount_mounted(self.refs[refs], self.run_dir / "mnt-refmount", [*options, *self.options], code)

    def in_turn(self, contenders: dict) -> dict:
        """Run each contender once, {name: its result}, in an order that rotates from call to call."""
        names = list(contenders)
        self.turn = getattr(self, "turn", -1) + 1
        shift = self.turn % len(names)
        return {name: contenders[name]() for name in names[shift:] + names[:shift]}

    def paired(self, name: str, who: str, other: str, metric: str, other_metric: str | None = None) -> float:
        """The median over the runs of measurement `name` of who[metric] / other[other_metric]."""
        return statistics.median(r[who][metric] / r[other][other_metric or metric] for r in self.raw[name])

    def repeat(self, name: str, one_run) -> dict:
        """Run `one_run()` (-> {contender: {metric: value}}) `runs` times; keep every run, return medians."""
        runs = []
        for n in range(self.runs):
            t0 = time.perf_counter()
            runs.append(one_run())
            log(f"{name} run {n + 1}/{self.runs}: {time.perf_counter() - t0:.1f} s")
        self.raw[name] = runs
        return {who: {metric: statistics.median(r[who][metric] for r in runs) for metric in runs[0][who]}
                for who in runs[0]}


def measure_sequential(ctx: Context) -> list[Row]:
    big = ctx.inputs.big
    size = big.stat().st_size

    def refmount_run() -> dict:
        with ctx.mount("big", "--view", "raw") as m:
            return {"mbps": cold_dd(m.path / "big", size), "peak_rss_mib": m.peak_rss_mib()}

    def rclone_run() -> dict:
        with rclone_mounted(ctx.base_url, ctx.run_dir / "mnt-rclone", "big.bin", ctx.run_dir / "rclone.log") as mnt:
            return {"mbps": cold_dd(mnt.path / "big.bin", size)}

    def baseline_run() -> dict:
        with ctx.mount("big", "--view", "raw", code=ctx.baseline) as m:
            return {"mbps": cold_dd(m.path / "big", size), "peak_rss_mib": m.peak_rss_mib()}

    def one_run() -> dict:
        return ctx.in_turn({"refmount": refmount_run, "rclone": rclone_run,
                            "curl": lambda: probe_curl(ctx.base_url + "big.bin", size),
                            **({"baseline": baseline_run} if ctx.baseline else {})})

    med = ctx.repeat("sequential", one_run)
    ours, name = med["refmount"], f"cold sequential read, {size / MB:.0f} MB file (dd bs=1M)"
    rows = [Row("throughput", name, "seq. cold\nvs rclone", "MB/s", ours["mbps"], "rclone mount", med["rclone"]["mbps"],
                Target("ratio", ">=", 1.5), ours["peak_rss_mib"],
                paired_ratio=ctx.paired("sequential", "refmount", "rclone", "mbps")),
            Row("throughput", name, "seq. cold\nvs curl", "MB/s", ours["mbps"], "curl", med["curl"]["mbps"],
                Target("ratio", ">=", 0.7), ours["peak_rss_mib"],
                paired_ratio=ctx.paired("sequential", "refmount", "curl", "mbps"))]
    if ctx.baseline:
        rows.append(Row("throughput", name, "seq. cold\nvs baseline", "MB/s", ours["mbps"], "baseline code",
                        med["baseline"]["mbps"], None, ours["peak_rss_mib"],
                        compared_peak_rss_mib=med["baseline"]["peak_rss_mib"],
                        paired_ratio=ctx.paired("sequential", "refmount", "baseline", "mbps")))
    return rows


def measure_chunks(ctx: Context) -> list[Row]:
    refs = json.loads(ctx.refs["chunks"].read_text())
    chunks = chunk_keys(refs)
    nbytes = sum(chunks.values())

    def refmount_run(code: Path | None = None) -> dict:
        with ctx.mount("chunks", "--view", "raw", code=code) as m:
            drop_caches()
            each = max(1, len(chunks) // 10)  # (four readers at a time whatever the set's size: 50 of 500
            # files each as before; --quick's 100 files in batches of 50 made two)
            _, seconds = timed_run(f"find {shlex.quote(str(m.path))} -type f ! -name '.*' -print0 "
                                   f"| xargs -0 -P4 -n {each} cat > /dev/null")
            return {"mbps": nbytes / seconds / MB, "peak_rss_mib": m.peak_rss_mib()}

    def fsspec_run() -> dict:
        drop_caches()
        result = fsspec_cat(ctx.refs["chunks"])
        if result["bytes"] != nbytes:
            raise RuntimeError(f"fsspec read {result['bytes']} bytes, expected {nbytes}")
        return {"mbps": nbytes / result["seconds"] / MB, "peak_rss_mib": result["peak_rss_mib"]}

    def one_run() -> dict:
        return ctx.in_turn({"refmount": refmount_run, "fsspec": fsspec_run,
                            **({"baseline": lambda: refmount_run(ctx.baseline)} if ctx.baseline else {})})

    med = ctx.repeat("chunks", one_run)
    name = f"all {len(chunks)} chunk files ({nbytes / MB:.0f} MB), 4 parallel cat"
    rows = [Row("throughput", name, f"{len(chunks)} chunks\nvs fsspec", "MB/s", med["refmount"]["mbps"],
                "fsspec cat", med["fsspec"]["mbps"], Target("ratio", ">=", 3), med["refmount"]["peak_rss_mib"],
                compared_peak_rss_mib=med["fsspec"]["peak_rss_mib"],
                paired_ratio=ctx.paired("chunks", "refmount", "fsspec", "mbps"))]
    if ctx.baseline:
        rows.append(Row("throughput", name, f"{len(chunks)} chunks\nvs baseline", "MB/s", med["refmount"]["mbps"],
                        "baseline code", med["baseline"]["mbps"], None, med["refmount"]["peak_rss_mib"],
                        compared_peak_rss_mib=med["baseline"]["peak_rss_mib"],
                        paired_ratio=ctx.paired("chunks", "refmount", "baseline", "mbps")))
    return rows


def measure_memory(ctx: Context) -> list[Row]:
    big = ctx.inputs.big
    size = big.stat().st_size
    plan = random_plan(size, ctx.sizes["hit_reads"], seed=3, slotted=False)
    disk_dir = ctx.run_dir / "disk-cache"

    def baseline_reread() -> dict:
        with ctx.mount("big", "--view", "raw", "--cache-size", "1G", code=ctx.baseline) as m:
            cold_dd(m.path / "big", size)
            return {"reread_mbps": cold_dd(m.path / "big", size)}

    def one_run() -> dict:
        shutil.rmtree(disk_dir, ignore_errors=True)
        cached = ["--view", "raw", "--cache-size", "1G", "--cache-dir", str(disk_dir)]
        out = {}
        if ctx.baseline:  # the same re-read from memory, without a disk cache behind it, in turn with the baseline's

            def memory_only() -> dict:
                with ctx.mount("big", "--view", "raw", "--cache-size", "1G") as m:
                    cold_dd(m.path / "big", size)
                    return {"reread_mbps": cold_dd(m.path / "big", size)}

            out = ctx.in_turn({"memory_only": memory_only, "baseline": baseline_reread})
        with ctx.mount("big", *cached) as m:
            first = cold_dd(m.path / "big", size)
            requests_before = m.remote_requests()
            again = cold_dd(m.path / "big", size)
            latencies = pread_latencies_ms(m.path / "big", plan)
            hits = {"first_read_mbps": first, "reread_mbps": again, **latency_summary(latencies, "hit"),
                    "remote_requests_during_hits": m.remote_requests() - requests_before,
                    "peak_rss_mib": m.peak_rss_mib()}
            wait_for(lambda: m.stats()["disk"]["bytes"] >= size, "the disk cache to be written", 120)
        wait_cache_dir_free(disk_dir)
        with ctx.mount("big", *cached) as m:  # a fresh daemon: empty memory, full disk cache
            stat_after_remount_ms(m.path / "big")  # (the remount's HEAD: not the re-read's; see measure_disk)
            from_disk = cold_dd(m.path / "big", size)
            hits["disk_reread_mbps"] = from_disk
            hits["remote_gets_from_disk"] = m.stats()["fetch"]["requests"] - 1  # minus the validator HEAD
        return {"refmount": hits, **out}

    med = ctx.repeat("memory", one_run)
    ours = med["refmount"]
    rss = ours["peak_rss_mib"]
    extra = ours["remote_requests_during_hits"]
    note = f"{extra:.0f} remote requests: not all hits" if extra else ""
    disk_note = (f"{ours['remote_gets_from_disk']:.0f} remote requests: not all from disk"
                 if ours["remote_gets_from_disk"] else "remount, --cache-dir")
    reads = f"{len(plan)} random preads 4 KiB–1 MiB, refmount cache hits"
    return [Row("throughput", f"re-read {size / MB:.0f} MB after drop_caches: from memory (--cache-size 1G)",
                "re-read\nfrom memory", "MB/s", ours["reread_mbps"], target=Target("refmount", ">=", 1200),
                peak_rss_mib=rss, note=note),
            Row("throughput", f"re-read {size / MB:.0f} MB after remount + drop_caches: from disk cache",
                "re-read\nfrom disk\nvs memory", "MB/s", ours["disk_reread_mbps"], "memory cache",
                ours["reread_mbps"], Target("ratio", ">=", 0.8), note=disk_note),
            Row("latency", f"{reads}: p50", "hit p50", "ms", ours["hit_p50_ms"], peak_rss_mib=rss, note=note),
            Row("latency", f"{reads}: p99", "hit p99", "ms", ours["hit_p99_ms"], target=Target("refmount", "<=", 2),
                peak_rss_mib=rss, note=note)] + ([
            Row("throughput", f"re-read {size / MB:.0f} MB after drop_caches from memory (--cache-size 1G, no "
                "--cache-dir) against the baseline code", "re-read\nvs baseline", "MB/s",
                med["memory_only"]["reread_mbps"], "baseline code", med["baseline"]["reread_mbps"],
                paired_ratio=ctx.paired("memory", "memory_only", "baseline", "reread_mbps"))] if ctx.baseline else [])


def measure_disk(ctx: Context) -> list[Row]:
    """The re-read from the disk cache after a remount against `cat` of the cache's block files, both
    cold, in turn (the order rotating from run to run), over one cache filled once: the ratio is the
    median of the runs' own ratios. The remount's first stat (the object's size and validator: a HEAD)
    is waited for before the page cache is dropped and the re-read timed, and reported apart."""
    big = ctx.inputs.big
    size = big.stat().st_size
    disk_dir = ctx.run_dir / "disk-cache-reread"
    cached = ["--view", "raw", "--cache-dir", str(disk_dir)]
    shutil.rmtree(disk_dir, ignore_errors=True)
    with ctx.mount("big", *cached) as m:
        dd_mbps(m.path / "big", size)
        wait_for(lambda: m.stats()["disk"]["bytes"] >= size, "the disk cache to be written", 120)
    blocks = disk_cache_blocks(disk_dir)

    def reread(code: Path | None) -> dict:
        wait_cache_dir_free(disk_dir)
        with ctx.mount("big", *cached, code=code) as m:  # a fresh daemon: empty memory, full disk cache
            first_stat_ms = stat_after_remount_ms(m.path / "big")
            mbps = cold_dd(m.path / "big", size)
            return {"mbps": mbps, "first_stat_ms": first_stat_ms, "load": os.getloadavg()[0],
                    "remote_gets": m.stats()["fetch"]["requests"] - 1}  # minus the validator HEAD

    def one_run() -> dict:
        return ctx.in_turn({"refmount": lambda: reread(None), "cat": lambda: {"mbps": cat_cold_mbps(blocks, size)},
                            **({"baseline": lambda: reread(ctx.baseline)} if ctx.baseline else {})})

    med = ctx.repeat("disk", one_run)
    ours = med["refmount"]
    runs = ctx.raw["disk"]
    log("disk-cache re-read / cat per run: " + " ".join(f"{r['refmount']['mbps'] / r['cat']['mbps']:.2f} "
                                                       f"(load {r['refmount']['load']:.1f})" for r in runs))
    note = (f"{ours['remote_gets']:.0f} remote requests: not all from disk" if ours["remote_gets"] else
            f"after the remount's first stat, {ours['first_stat_ms']:.0f} ms, not counted")
    return [Row("throughput", f"re-read {size / MB:.0f} MB after remount + drop_caches from --cache-dir",
                "re-read\nfrom disk\nvs cat", "MB/s", ours["mbps"], "cat of the block files, cold",
                med["cat"]["mbps"], Target("ratio", ">=", 0.9), note=note,
                paired_ratio=ctx.paired("disk", "refmount", "cat", "mbps"))] + ([
            Row("throughput", f"re-read {size / MB:.0f} MB from --cache-dir against the baseline code",
                "re-read from disk\nvs baseline", "MB/s", ours["mbps"], "baseline code", med["baseline"]["mbps"],
                paired_ratio=ctx.paired("disk", "refmount", "baseline", "mbps"),
                note=f"first stat after the remount {ours['first_stat_ms']:.0f} ms, baseline's "
                     f"{med['baseline']['first_stat_ms']:.0f} ms")] if ctx.baseline else [])


def measure_cold_random(ctx: Context) -> list[Row]:
    size = ctx.inputs.big.stat().st_size
    plan = random_plan(size, ctx.sizes["cold_reads"], seed=4, slotted=True)

    def one_run() -> dict:
        with ctx.mount("big", "--view", "raw") as m:
            os.stat(m.path / "big")  # the size lookup (HEAD) is not part of a read
            drop_caches()
            latencies = pread_latencies_ms(m.path / "big", plan)
            return {"refmount": {**latency_summary(latencies, "cold"), "peak_rss_mib": m.peak_rss_mib()}}

    ours = ctx.repeat("cold_random", one_run)["refmount"]
    reads = f"{len(plan)} random preads 4 KiB–1 MiB, fresh mount"
    return [Row("latency", f"{reads}: p50", "cold p50", "ms", ours["cold_p50_ms"], peak_rss_mib=ours["peak_rss_mib"]),
            Row("latency", f"{reads}: p99", "cold p99", "ms", ours["cold_p99_ms"], peak_rss_mib=ours["peak_rss_mib"])]


def ncdump_seconds(directory: Path) -> float:
    _, seconds = timed_run(f"ncdump {shlex.quote(f'file://{directory}#mode=zarr,file')} > /dev/null",
                           timeout=NCDUMP_TIMEOUT_S)
    return seconds


def measure_ncdump(ctx: Context) -> list[Row]:
    local = ctx.run_dir / "zlib-decoded-copy"
    with ctx.mount("zlib") as m:
        shutil.rmtree(local, ignore_errors=True)
        run(["cp", "-r", str(m.path), str(local)])

    def refmount_run() -> dict:
        with ctx.mount("zlib") as m:
            drop_caches()
            return {"seconds": ncdump_seconds(m.path), "peak_rss_mib": m.peak_rss_mib()}

    def local_run() -> dict:
        drop_caches()
        return {"seconds": ncdump_seconds(local)}

    med = ctx.repeat("ncdump", lambda: {"refmount": refmount_run(), "local": local_run()})
    nc = ctx.inputs.zlib_nc
    data_mb = ctx.sizes["ncdump_steps"] * 500 * 500 * 4 / MB
    name = f"ncdump of zlib netCDF-4 ({data_mb:.0f} MB data, {nc.stat().st_size / MB:.0f} MB compressed), decoded view"
    return [Row("time", name, "ncdump\nvs local copy", "s", med["refmount"]["seconds"], "local Zarr copy",
                med["local"]["seconds"], Target("ratio", "<=", 1.5), med["refmount"]["peak_rss_mib"])]


MEASUREMENTS = {"sequential": measure_sequential, "chunks": measure_chunks, "memory": measure_memory,
                "disk": measure_disk, "cold_random": measure_cold_random, "ncdump": measure_ncdump}


# ---------------------------------------------------------------------------------------------------
# Output: one markdown table, JSON, PNG chart
# ---------------------------------------------------------------------------------------------------

def markdown(rows: list[Row], m: dict, runs: int) -> str:
    header = ["measurement", "refmount", "compared with", "ratio", "target", "result", "refmount peak RSS"]
    lines = [f"{machine_line(m)}; medians of {runs} run(s)", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


PANELS = {"throughput": ("MB/s (higher is better)", False), "latency": ("ms (lower is better, log scale)", True),
          "time": ("seconds (lower is better)", False)}


def chart(rows: list[Row], m: dict, runs: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(g, [r for r in rows if r.group == g and r.refmount is not None]) for g in PANELS]
    panels = [(g, rs) for g, rs in panels if rs]
    widths = [len(rs) + 0.6 for _, rs in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.15 * sum(widths) + 2, 6.2),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, (group, rs) in zip(axes[0], panels, strict=True):
        draw_panel(ax, group, rs)
    handles = [plt.Rectangle((0, 0), 1, 1, color="tab:blue"), plt.Rectangle((0, 0), 1, 1, color="tab:orange"),
               plt.Rectangle((0, 0), 1, 1, color="tab:gray"),
               plt.Line2D([], [], color="tab:red", linestyle="--", linewidth=2)]
    fig.legend(handles, ["refmount", "refmount, target missed", "compared with (named above the bar)",
                         "value refmount needs to meet its target"], loc="lower center", ncol=4, frameon=False)
    fig.suptitle(f"refmount speed — medians of {runs} run(s)\n{machine_line(m)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_panel(ax, group: str, rows: list[Row]) -> None:
    ylabel, log_scale = PANELS[group]
    width = 0.38
    if log_scale:
        ax.set_yscale("log")
    for x, row in enumerate(rows):
        passed = row.target.passed(row) if row.target else None
        colour = "tab:blue" if passed is not False else "tab:orange"
        bar_label(ax, ax.bar(x - width / 2 if row.compared else x, row.refmount, width, color=colour)[0],
                  row.refmount)
        if row.compared:
            bar_label(ax, ax.bar(x + width / 2, row.compared, width, color="tab:gray")[0], row.compared,
                      row.compared_with.split()[0])
        level = row.target.level(row) if row.target else None
        if level:
            centre = x - width / 2 if row.compared else x
            ax.hlines(level, centre - width / 2 - 0.05, centre + width / 2 + 0.05, colors="tab:red",
                      linestyles="--", linewidth=2)
    ax.set_xticks(range(len(rows)), [r.short for r in rows], fontsize=9)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.18)
    ax.set_title(group)
    ax.grid(axis="y", alpha=0.3)


def bar_label(ax, bar, value: float, who: str = "") -> None:
    """The value above the bar, and (for the compared tool) its name above that."""
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    ax.annotate(f"{who}\n{text}" if who else text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center", va="bottom", fontsize=9, xytext=(0, 2), textcoords="offset points")


# ---------------------------------------------------------------------------------------------------
# Main: inputs, tmpfs copy, nginx, measurements, outputs; everything undone on exit
# ---------------------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 run, smaller files (< 3 min)")
    p.add_argument("--only", help="comma-separated measurements: " + ", ".join(MEASUREMENTS))
    p.add_argument("--runs", type=int, help="runs per measurement (default 3, or 1 with --quick)")
    p.add_argument("--refmount-options", default="", metavar="'OPTS'",
                   help="extra options for every refmount mount; write --refmount-options='--no-prefetch'")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/refmount-speed"), help="generated inputs (kept)")
    p.add_argument("--run-dir", type=Path, help="scratch dir for this run (default: a new temp dir; removed)")
    p.add_argument("--serve-dir", type=Path, help="tmpfs dir for the served copies (default: new under /dev/shm)")
    p.add_argument("--out", type=Path, default=OUT, help="output prefix: PREFIX.json and PREFIX.png")
    p.add_argument("--replot", action="store_true", help="only redraw PREFIX.png from an existing PREFIX.json")
    p.add_argument("--baseline", type=Path, metavar="TREE",
                   help="also mount refmount's code from TREE (another commit's checkout), alternating, and compare")
    args = p.parse_args(argv)
    args.names = args.only.split(",") if args.only else list(MEASUREMENTS)
    unknown = [n for n in args.names if n not in MEASUREMENTS]
    if unknown:
        p.error(f"unknown measurement(s) {', '.join(unknown)}; choose from {', '.join(MEASUREMENTS)}")
    return args


def serve_copies(inputs: Inputs, serve: Path) -> None:
    for src, name in ((inputs.big, "big.bin"), (inputs.chunks_nc, "chunks.nc"), (inputs.zlib_nc, "zlib.nc")):
        shutil.copyfile(src, serve / name)
    serve.chmod(0o755)


def write_refs(inputs: Inputs, base_url: str, run_dir: Path) -> dict[str, Path]:
    refs = {"big": {"big": [base_url + "big.bin"]},
            "chunks": kerchunk_refs(inputs.chunks_nc, base_url + "chunks.nc"),
            "zlib": kerchunk_refs(inputs.zlib_nc, base_url + "zlib.nc")}
    paths = {}
    for name, content in refs.items():
        paths[name] = run_dir / f"{name}.json"
        paths[name].write_text(json.dumps(content))
    return paths


def replot(prefix: Path) -> None:
    saved = json.loads(prefix.with_suffix(".json").read_text())
    rows = []
    for r in saved["rows"]:
        fields = {k: v for k, v in r.items() if k not in ("ratio", "passed")}
        fields.setdefault("paired_ratio", None)
        fields["target"] = Target(**fields["target"]) if fields["target"] else None
        rows.append(Row(**fields))
    chart(rows, saved["machine"], saved["runs"], prefix.with_suffix(".png"))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.replot:
        replot(args.out)
        return 0
    if os.geteuid() != 0:
        sys.exit("bench_speed.py needs root (FUSE mounts and drop_caches)")
    exit_on_signals()
    started = time.perf_counter()
    sizes = QUICK if args.quick else FULL
    runs = args.runs or (1 if args.quick else 3)
    record = Record("speed", args.quick)
    info = record.machine
    inputs = ensure_inputs(args.workdir, sizes)
    rows: list[Row] = []
    with ExitStack() as stack:
        run_dir = scratch_dir(stack, args.run_dir, "/tmp", "refmount-speed-run.")
        serve = scratch_dir(stack, args.serve_dir, "/dev/shm", "refmount-speed-data.")
        serve_copies(inputs, serve)
        base_url = stack.enter_context(nginx_serving(serve, run_dir))
        log(f"nginx serving {serve} at {base_url}")
        ctx = Context(runs, sizes, inputs, run_dir, base_url, write_refs(inputs, base_url, run_dir),
                      shlex.split(args.refmount_options), baseline=args.baseline)
        for name in args.names:
            rows += MEASUREMENTS[name](ctx)
        raw = ctx.raw
    info["loadavg_end"] = os.getloadavg()[0]
    runtime = time.perf_counter() - started
    table = markdown(rows, info, runs)
    print(table)
    options = f", refmount options {args.refmount_options!r}" if args.refmount_options else ""
    print(f"\n{'quick' if args.quick else 'full'} run{options}: {runtime:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record.write(args.out.with_suffix(".json"), table, runs=runs, sizes=sizes,
                 refmount_options=args.refmount_options, runtime_s=runtime, table_markdown=table,
                 rows=[r.to_json() for r in rows], raw=raw)
    chart(rows, info, runs, args.out.with_suffix(".png"))
    log(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
