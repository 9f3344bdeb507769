"""Soak: many readers for minutes through a faulty loopback server, every byte verified (issue 16).

    .venv/bin/python bench/bench_soak.py [--quick] [--minutes 10] [--readers 32] [--faults 0.005]
        [--cache-size 64M] [--refmount-options '...'] [--code TREE]

Serves a seeded random file (256 MiB) from tests.support.rangeserver on
127.0.0.1 with a fault rate (503, 429, resets, stalls, truncated bodies, wrong Content-Range),
mounts a reference set of 8,192 byte ranges of it (4 KiB to 1 MiB, some overlapping) plus the
whole file, and runs `--readers` threads for `--minutes`. Each read picks a key and reads it whole
(`--pattern chunks`, as zarr and netCDF-C read chunks; 5% of reads are random slices of the
whole-file key) or a random slice of it (`--pattern slices`), drops those bytes from the page cache
(posix_fadvise) so the daemon serves them, and compares them with the source file. The daemon's RSS is sampled every second.

Prints: reads, MB verified, wrong bytes (must be 0), EIO reads (allowed under faults: the daemon
gives up within --read-timeout rather than serve a wrong byte), peak RSS against the configured
budget, and amplification = bytes fetched from the server / bytes the readers read.
Not part of the test suite. Needs root (FUSE) and leaves nothing mounted.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import tempfile
import threading
import time
from pathlib import Path

from harness.mounts import refmount_foreground
from harness.servers import range_server
from harness.system import proc_status_mib

KEYS = 8192


def make_refs(url: str, size: int, rng: random.Random) -> dict:
    refs = {"whole": [url]}
    for n in range(KEYS):
        length = int(2 ** rng.uniform(12, 20))  # 4 KiB .. 1 MiB, log-uniform
        refs[f"k/{n}"] = [url, rng.randrange(0, size - length), length]
    return refs


def rss_kib(pid: int) -> int:
    try:
        return int(proc_status_mib(pid, "VmRSS") * 1024)
    except (OSError, KeyError):  # (the daemon has exited)
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 minute instead of 10")
    p.add_argument("--minutes", type=float)
    p.add_argument("--readers", type=int, default=32)
    p.add_argument("--faults", type=float, default=0.005, help="fault rate per GET (default 0.5%%)")
    p.add_argument("--cache-size", default="64M")
    p.add_argument("--refmount-options", default="")
    p.add_argument("--code", help="run the daemon from this checkout (default: this one), e.g. main's")
    p.add_argument("--pattern", choices=("chunks", "slices"), default="chunks",
                   help="chunks (default): each read is a whole key, as zarr and netCDF-C read chunks; "
                        "slices: a random slice of a key (an adversarial pattern for any block cache)")
    args = p.parse_args()
    minutes = args.minutes or (1.0 if args.quick else 10.0)
    size = 256 << 20  # four times the default --cache-size: most random reads miss
    rng = random.Random(20261122)

    with tempfile.TemporaryDirectory(prefix="refmount-soak-") as tmp:
        tmp = Path(tmp)
        data_path = tmp / "data.bin"
        with open(data_path, "wb") as f:
            for _ in range(size >> 20):
                f.write(rng.randbytes(1 << 20))
        source = mmap.mmap(os.open(data_path, os.O_RDONLY), 0, prot=mmap.PROT_READ)
        with range_server(tmp) as server:
            server.set_faults(rate=args.faults, kinds=("503", "429", "reset", "stall", "truncate", "bad_range"),
                              seed=7)
            refs = make_refs(server.url_for("data.bin"), size, rng)
            (tmp / "refs.json").write_text(json.dumps(refs))
            options = ["--view", "raw", "--cache-size", args.cache_size, *args.refmount_options.split()]
            with refmount_foreground(tmp / "refs.json", tmp / "mnt", options, code=args.code and Path(args.code),
                                     log_path=tmp / "mount.log") as m:
                result = soak(m.path, refs, source, args.readers, minutes * 60, m.pid, args.pattern)
                stats = m.stats()
        fetched = stats["fetch"]["bytes"]
        print(f"soak: {args.readers} readers ({args.pattern}), {minutes:g} min, faults {args.faults:.3%}, "
              f"--cache-size {args.cache_size} {args.refmount_options}".rstrip())
        print(f"  reads           {result['reads']:,} ({result['bytes'] / 1e6:,.0f} MB verified, "
              f"{result['bytes'] / 1e6 / (minutes * 60):,.1f} MB/s)")
        print(f"  wrong bytes     {result['wrong']:,}")
        print(f"  EIO reads       {result['eio']:,}")
        print(f"  peak RSS        {result['peak_kib'] / 1024:,.0f} MiB (memory budget: --cache-size {args.cache_size}"
              f"{', ' + json.dumps(stats['memory']) if 'memory' in stats else ''})")
        print(f"  fetched         {fetched / 1e6:,.0f} MB in {stats['fetch']['requests']:,} requests, "
              f"{stats['fetch']['retries']:,} retries")
        print(f"  amplification   {fetched / max(result['bytes'], 1):.2f}x (fetched / read by the readers)")
        served = stats.get("served", {}).get("bytes")
        if served:  # the kernel's own readahead asks the daemon for more than the readers read
            print(f"  daemon served   {served / 1e6:,.0f} MB: fetched / served {fetched / served:.2f}x, "
                  f"served / read {served / max(result['bytes'], 1):.2f}x (kernel readahead)")
        return 1 if result["wrong"] else 0


def soak(mnt: Path, refs: dict, source, readers: int, seconds: float, pid: int, pattern: str) -> dict:
    keys = [k for k in refs if k != "whole"]
    totals = {"reads": 0, "bytes": 0, "wrong": 0, "eio": 0, "peak_kib": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        local = {"reads": 0, "bytes": 0, "wrong": 0, "eio": 0}
        while time.monotonic() < stop:
            key = rng.choice(keys) if rng.random() > 0.05 else "whole"
            if key == "whole":
                base, length = 0, len(source)
            else:
                _, base, length = refs[key]
            if pattern == "chunks" and key != "whole":
                offset, size = 0, length  # a whole chunk, as a zarr or netCDF-C reader reads it
            else:
                offset = rng.randrange(0, length)
                size = min(length - offset, int(2 ** rng.uniform(12, 20)))
            try:
                fd = os.open(mnt / key, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, offset, size, os.POSIX_FADV_DONTNEED)
                    got = os.pread(fd, size, offset)
                finally:
                    os.close(fd)
            except OSError:
                local["eio"] += 1
                continue
            want = source[base + offset : base + offset + size]
            local["reads"] += 1
            local["bytes"] += len(got)
            if got != want:
                local["wrong"] += sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))
        with lock:
            for name, value in local.items():
                totals[name] += value

    threads = [threading.Thread(target=reader, args=(n,), daemon=True) for n in range(readers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        totals["peak_kib"] = max(totals["peak_kib"], rss_kib(pid))
        time.sleep(1.0)
    for t in threads:
        t.join()
    return totals


if __name__ == "__main__":
    raise SystemExit(main())
