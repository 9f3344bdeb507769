"""The daemon's CPU per GB on a cold sequential read from a loopback nginx, optionally profiled.

    python bench/cpu_per_gb.py [--mb 256] [--runs 3] [--profile OUT.txt] [--refmount-options='...']
        [--baseline TREE] [--gil-share] [--disk] [--quick] [--out JSON]

Needs root (FUSE mounts, drop_caches). Starts its own nginx (bench/harness), mounts a whole-file
reference with --view raw, reads it with `dd bs=1M` after dropping the page cache, and prints MB/s
and the daemon's CPU seconds per GB (utime + stime from /proc/PID/stat), beside curl's for the same file in
the same run; writes the medians to --out (bench/out/cpu_per_gb.json). With --profile, py-spy
(`pip install py-spy`) samples the daemon during the last run and the top functions by own time and
by total time are printed (the collapsed stacks are kept in OUT.txt). With --baseline TREE each run
also mounts refmount's code from TREE (another commit's checkout, first on the daemon's PYTHONPATH),
the two alternating (the order swaps every run), and the medians of the paired ratios are printed.
With --gil-share two py-spys sample the daemon in every run (`--idle`: every thread at every sample;
`--gil`: only the thread holding the GIL), and the share of samples in which the FUSE thread (the
trio thread) holds the GIL during the read is printed per run and as a median; a tree whose `pyfuse3` is refmount's
build (.ci/pyfuse3/build-nogil) as --baseline compares it with the plain one.
With --disk the read is the disk cache's re-read instead: the file is read once through a mount with
`--cache-dir` (filling it), then each run remounts (empty memory, full disk cache), waits for the
remount's first stat (the object's size and validator, a HEAD: printed, not timed), drops the page cache
and reads it again; after each run's reads `cat` of the cache's block files (listed once, in block
order), cold, gives the disk's own limit, and the ratio to it is printed.
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness.inputs import big_file
from harness.mounts import (cat_cold_mbps, disk_cache_blocks, refmount_mounted, remove_scratch, stat_after_remount_ms,
                            wait_cache_dir_free)
from harness.peers import curl_whole
from harness.record import Record
from harness.servers import nginx_serving
from harness.system import (
    TICKS,
    dd_bytes,
    drop_caches,
    exit_on_signals,
    proc_minflt,
    timed,
    wait_for,
)

HERE = Path(__file__).resolve().parent


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds of the daemon's main thread: the trio thread, which serves FUSE."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def top(collapsed: Path, n: int = 25) -> str:
    own, total = collections.Counter(), collections.Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        count = int(count)
        samples += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    out = [f"{samples} samples; own time:"]
    out += [f"  {c / samples:6.1%}  {f}" for f, c in own.most_common(n)]
    out += ["total time (function and what it calls):"]
    out += [f"  {c / samples:6.1%}  {f}" for f, c in total.most_common(n)]
    return "\n".join(out)


def _spy(pid: int, out: Path, *flags: str) -> subprocess.Popen:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "250",
                             "--nonblocking", "--threads", *flags, "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def thread_samples(collapsed: Path) -> collections.Counter:
    """Samples per thread of py-spy's raw output (--threads: each stack starts with its thread)."""
    counts = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            counts[_thread_of(stack)] += int(count)
    return counts


def _thread_of(stack: str) -> str:
    frames = stack.split(";")
    return next((f for f in frames if f.startswith("thread (")), frames[0])


def fuse_thread(collapsed: Path) -> str | None:
    """The thread that runs trio's loop (and with it pyfuse3's request loop and every reply)."""
    counts = collections.Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit() and "trio/_core/_run.py" in stack:
            counts[_thread_of(stack)] += int(count)
    return counts.most_common(1)[0][0] if counts else None


def gil_share(idle: Path, gil: Path, read_s: float, recorded_s: float) -> tuple[float, float, float]:
    """The FUSE thread's share of the read's time holding the GIL, any thread's share, and the FUSE
    thread's share in pyfuse3's Cython code (the Python frame that runs its request loop and handlers:
    reading a request, the writev of a reply, and with refmount's build the waits to retake the GIL).

    The spies record from before the read starts to after it ends (recorded_s), and an idle daemon
    neither holds the GIL nor replies: so those samples all fall in the read, and the read's share of
    the samples taken (--idle: the FUSE thread is in every one) is read_s / recorded_s."""
    everyone, holding = thread_samples(idle), thread_samples(gil)
    fuse = fuse_thread(idle)
    instants = (everyone[fuse] if fuse else 0) * read_s / recorded_s
    if not instants:
        return float("nan"), float("nan"), float("nan")
    replying = 0
    for line in idle.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit() and _thread_of(stack) == fuse and stack.rsplit(";", 1)[-1].endswith("(_pyfuse3.py:58)"):
            replying += int(count)
    return holding[fuse] / instants, sum(holding.values()) / instants, replying / instants


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--profile", type=Path, help="py-spy collapsed stacks of the last run to this file")
    p.add_argument("--refmount-options", default="")
    p.add_argument("--baseline", type=Path, metavar="TREE", help="also run refmount's code from TREE, alternating")
    p.add_argument("--gil-share", action="store_true", help="py-spy --idle and --gil in every run: the FUSE "
                   "thread's share of samples holding the GIL")
    p.add_argument("--disk", action="store_true", help="the re-read from a full disk cache after a remount, "
                   "beside `cat` of its block files")
    p.add_argument("--quick", action="store_true", help="a 64 MB file, 1 run (as --mb 64 --runs 1)")
    p.add_argument("--out", type=Path, default=HERE / "out" / "cpu_per_gb.json", help="the run's JSON")
    args = p.parse_args()
    if args.quick:
        args.mb, args.runs = 64, 1
    exit_on_signals()
    record = Record("cpu_per_gb", args.quick)
    big = big_file(Path("/tmp/refmount-speed"), args.mb)
    size = big.stat().st_size
    with ExitStack() as stack:
        run_dir = Path(tempfile.mkdtemp(prefix="refmount-cpu-run."))
        serve = Path(tempfile.mkdtemp(prefix="refmount-cpu-data.", dir="/dev/shm"))
        stack.callback(remove_scratch, serve)
        stack.callback(remove_scratch, run_dir)
        shutil.copyfile(big, serve / "big.bin")
        serve.chmod(0o755)
        url = stack.enter_context(nginx_serving(serve, run_dir))
        refs = run_dir / "big.json"
        refs.write_text('{"big": ["%sbig.bin"]}' % url)
        codes = {"this": None, **({"baseline": args.baseline} if args.baseline else {})}
        options = ["--view", "raw", *shlex.split(args.refmount_options)]
        cats = []
        if args.disk:
            disk_dir = run_dir / "disk-cache"
            options += ["--cache-dir", str(disk_dir)]
            fill_disk_cache(refs, run_dir / "mnt-refmount", options, size)
        rates, cpus, trio_cpus = {who: [] for who in codes}, {who: [] for who in codes}, {who: [] for who in codes}
        gils, replies = {who: [] for who in codes}, {who: [] for who in codes}
        for n, who in ((n, who) for n in range(args.runs) for who in (list(codes) if n % 2 == 0 else list(codes)[::-1])):
            if args.disk:
                wait_cache_dir_free(disk_dir)
            with refmount_mounted(refs, run_dir / "mnt-refmount", options, codes[who]) as m:
                if args.disk:  # the remount's HEAD (and the import of its client) is not the re-read's
                    print(f"  first stat after the remount: {stat_after_remount_ms(m.path / 'big'):.0f} ms")
                drop_caches()
                spy = None
                if args.profile and n == args.runs - 1 and who == "this":
                    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
                    spy = subprocess.Popen([py_spy, "record", "--pid", str(m.pid), "--format", "raw", "--rate", "250",
                                            "--nonblocking", "--threads", "-o", str(args.profile)],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                spies = []
                if args.gil_share:
                    spies = [(_spy(m.pid, run_dir / f"idle-{n}-{who}.txt", "--idle"), run_dir / f"idle-{n}-{who}.txt"),
                             (_spy(m.pid, run_dir / f"gil-{n}-{who}.txt", "--gil"), run_dir / f"gil-{n}-{who}.txt")]
                if spy is not None or spies:
                    time.sleep(1.0)
                recording = time.monotonic()
                faults = proc_minflt(m.pid)
                trio_cpu = main_thread_cpu_s(m.pid)
                seconds, cpu, out = timed(f"dd if={m.path / 'big'} of=/dev/null bs=1M", lambda: m.pid)
                faults = proc_minflt(m.pid) - faults
                trio_cpu = main_thread_cpu_s(m.pid) - trio_cpu
                if dd_bytes(out) != size:
                    raise RuntimeError(f"dd read {dd_bytes(out)} of {size} bytes")
                recorded = time.monotonic() - recording + (1.0 if spy is not None or spies else 0.0)
                for running in [spy, *(s for s, _ in spies)]:
                    if running is not None:
                        running.send_signal(2)
                        running.wait(30)
                if spies:
                    fuse_share, any_share, replying = gil_share(spies[0][1], spies[1][1], seconds, recorded)
                    gils[who].append(fuse_share)
                    replies[who].append(replying)
                    keep = args.profile.with_name(f"{args.profile.stem}-{{}}-{n}-{who}.txt") if args.profile else None
                    if keep is not None:
                        shutil.copyfile(spies[0][1], str(keep).format("idle"))
                        shutil.copyfile(spies[1][1], str(keep).format("gil"))
                    print(f"  GIL held by the FUSE thread {fuse_share:.1%} of the read's time (by any thread {any_share:.1%}); "
                          f"in pyfuse3's Cython code {replying:.1%}")
                stats = m.stats()
                if args.disk and stats["disk"]["hits"] * (2 << 20) < size:  # (blocks of 1 MiB or more)
                    raise RuntimeError(f"only {stats['disk']['hits']} blocks came from the disk cache")
                if args.disk:
                    print(f"  disk cache: {stats['disk']['hits']} blocks read, "
                          f"{stats['disk'].get('direct_reads', '-')} of them with O_DIRECT")
                fetch = stats["fetch"]
                served = stats.get("served", {})
                if served.get("reads"):
                    print(f"  {served['reads']} reads of {served['bytes'] / served['reads'] / 1024:.0f} KiB on average")
                memory, cache = stats.get("memory", {}), stats.get("cache", {})
                print(f"  {fetch['requests']} requests, {fetch['bytes'] / max(fetch['requests'], 1) / 2**20:.1f} MiB "
                      f"on average; pool slots made {memory.get('pool_slots_made')}, reused {memory.get('pool_reused')} "
                      f"(released but viewed {memory.get('pool_dropped_viewed', '-')}, unmapped {memory.get('pool_unmapped', '-')}); "
                      f"cache {cache.get('bytes', 0) >> 20} MiB, blocks let go of once read {cache.get('dropped_read', '-')}")
                rates[who].append(size / seconds / 1e6)
                cpus[who].append(cpu / (size / 1e9))
                trio_cpus[who].append(trio_cpu / (size / 1e9))
                print(f"run {n + 1} ({who}): {rates[who][-1]:.0f} MB/s, daemon {cpus[who][-1]:.2f} CPU-s/GB "
                      f"(trio thread {trio_cpus[who][-1]:.2f}), "
                      f"{faults / (size / 1e9):.0f} minor page faults/GB, load average {os.getloadavg()[0]:.1f}",
                      flush=True)
            if args.disk and who == list(codes)[-1 if n % 2 == 0 else 0]:
                cats.append(cat_cold_mbps(disk_cache_blocks(disk_dir), size))
                print(f"  cat of the block files, cold: {cats[-1]:.0f} MB/s", flush=True)
        curl = curl_cpu(url + "big.bin", size, args.runs)  # the wire's own cost, in the same run
    for who in codes:
        print(f"median ({who}): {statistics.median(rates[who]):.0f} MB/s, {statistics.median(cpus[who]):.2f} CPU-s/GB "
              f"(trio thread {statistics.median(trio_cpus[who]):.2f})")
    for who in codes:
        if gils[who]:
            print(f"median ({who}): the FUSE thread holds the GIL {statistics.median(gils[who]):.1%} of the read's time, "
                  f"is in pyfuse3's Cython code {statistics.median(replies[who]):.1%}")
    for who in codes if cats else ():
        ratios = [r / c for r, c in zip(rates[who], cats)]
        print(f"disk-cache re-read ({who}) / cat of the block files, per run: {' '.join(f'{r:.2f}' for r in ratios)} "
              f"-> median {statistics.median(ratios):.2f} (cat median {statistics.median(cats):.0f} MB/s)")
    if args.baseline:
        speed = statistics.median(a / b for a, b in zip(rates["this"], rates["baseline"]))
        cpu = statistics.median(a / b for a, b in zip(cpus["this"], cpus["baseline"]))
        trio = statistics.median(a / b for a, b in zip(trio_cpus["this"], trio_cpus["baseline"]))
        print(f"paired ratios this / baseline: speed {speed:.2f}, CPU per GB {cpu:.2f} (trio thread {trio:.2f})")
    if args.profile and args.profile.exists():
        print(top(args.profile))
    print(f"median (curl): {statistics.median(curl['mbps']):.0f} MB/s, {statistics.median(curl['cpu']):.2f} CPU-s/GB")
    lines = ["| reader | MB/s | CPU-s/GB | trio thread CPU-s/GB | FUSE thread holds the GIL |", "|---|---|---|---|---|"]
    for who in codes:
        gil = f"{statistics.median(gils[who]):.1%}" if gils[who] else "—"
        lines.append(f"| refmount ({who}) | {statistics.median(rates[who]):.0f} | {statistics.median(cpus[who]):.2f} "
                     f"| {statistics.median(trio_cpus[who]):.2f} | {gil} |")
    lines.append(f"| curl | {statistics.median(curl['mbps']):.0f} | {statistics.median(curl['cpu']):.2f} | — | — |")
    record.write(args.out, {f"cold `dd bs=1M` of {args.mb} MB, medians of {args.runs}": "\n".join(lines)},
                 mb=args.mb, runs=args.runs, rates=rates, cpus=cpus, trio_cpus=trio_cpus, gil_shares=gils,
                 curl=curl, disk=args.disk, cat_mbps=cats)
    return 0


def fill_disk_cache(refs: Path, mnt: Path, options: list[str], size: int) -> None:
    """Read the file once through a mount with --cache-dir and wait until its blocks are on disk."""
    with refmount_mounted(refs, mnt, options) as m:
        timed(f"dd if={m.path / 'big'} of=/dev/null bs=1M")
        wait_for(lambda: m.stats()["disk"]["bytes"] >= size, "the disk cache to be written", 300)


def curl_cpu(url: str, size: int, runs: int) -> dict:
    """curl's MB/s and CPU-s per GB (its own process) for the same file, `runs` times."""
    out = {"mbps": [], "cpu": []}
    for _ in range(runs):
        drop_caches()
        seconds, cpu, got = timed(curl_whole(url))
        if int(got) != size:
            raise RuntimeError(f"curl got {got} of {size} bytes")
        out["mbps"].append(size / seconds / 1e6)
        out["cpu"].append(cpu / (size / 1e9))
    return out


if __name__ == "__main__":
    sys.exit(main())
