"""The daemon's peak memory under many readers, against its configured memory (issue 25).

    .venv/bin/python bench/bench_memory.py [--mode random|sequential|both] [--seconds 120]
        [--processes 4] [--threads 8] [--memory-target SIZE | --cache-size 64M --decoded-cache-size 32M]
        [--refmount-options '...'] [--env NAME=VALUE ...] [--data-dir DIR] [--runs 1] [--code TREE]

Builds (once, in --data-dir; 0.6 GB) a Zarr v2 dataset of three compressed arrays behind one data
file, as kerchunk references: `t` float32, 1 MiB chunks, shuffle + zlib; `u` int16, 2 MiB chunks,
blosc lz4; `v` big-endian float64, 128 KiB chunks, zstd (served swapped to little-endian). 512 MiB
decoded, 64 keys `seq/N` of 8 MiB ranges of the data file besides. nginx serves the data file on
127.0.0.1; the reference set is mounted with `--view decoded` (the default).

- random: `--processes` x `--threads` readers (default 4 x 8 = 32) read random ranges (4 KiB to
  1 MiB, log-uniform) of random chunks of the three arrays, through the decoded view;
- sequential: 64 streams (8 x 8, unless --processes/--threads say otherwise) each read `seq/N`
  keys (8 MiB each, their own in turn) from start to end in 1 MiB reads.
Every read first drops its range from the page cache (posix_fadvise), so the daemon serves it, and
every byte is compared with the decoded oracle. The daemon's RSS is sampled 4 times a second and
its VmHWM (the kernel's peak) read at the end.

Prints per run: reads, MB verified, wrong bytes (must be 0), EIO, VmHWM and the largest sampled
RSS, against the configured sizes, and the daemon's own memory counters. Not part of the test
suite. Needs root (FUSE) and nginx; leaves nothing mounted.
"""

from __future__ import annotations

import argparse
import json
import mmap
import multiprocessing
import os
import random
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from harness.mounts import refmount_foreground
from harness.servers import nginx_serving

MiB = 1 << 20
# name: (dtype, shape, chunks, filters, compressor)
ARRAYS = {
    "t": ("<f4", (256, 512, 512), (1, 512, 512), [{"id": "shuffle", "elementsize": 4}],
          {"id": "zlib", "level": 1}),
    "u": ("<i2", (64, 1024, 1024), (1, 1024, 1024), None,
          {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0}),
    "v": (">f8", (1024, 128, 128), (1, 128, 128), None, {"id": "zstd", "level": 3}),
}
SEQ_KEYS, SEQ_BYTES = 64, 8 * MiB
DATASET_VERSION = "1"


def build_dataset(directory: Path) -> dict:
    """data.bin (compressed chunks), decoded.bin (the oracle: each array's chunks in order, as the
    decoded view serves them) and layout.json (where each chunk is). Reused when present."""
    import numcodecs

    layout_path = directory / "layout.json"
    if layout_path.exists():
        layout = json.loads(layout_path.read_text())
        if layout.get("version") == DATASET_VERSION:
            return layout
    directory.mkdir(parents=True, exist_ok=True)
    layout = {"version": DATASET_VERSION, "arrays": {}}
    offset = decoded_offset = 0
    with open(directory / "data.bin", "wb") as data, open(directory / "decoded.bin", "wb") as decoded:
        for name, (dtype, shape, chunks, filters, compressor) in ARRAYS.items():
            codecs = [numcodecs.get_codec(dict(c)) for c in (filters or [])] + [numcodecs.get_codec(dict(compressor))]
            rng = np.random.default_rng(len(name) * 1000 + ord(name))
            count = shape[0] // chunks[0]
            chunk_shape = chunks
            refs = []
            for n in range(count):
                # smooth plus small noise: compresses 2-4x, like real fields
                base = rng.integers(0, 32, size=chunk_shape[1:], dtype=np.int64)
                values = (np.cumsum(base, axis=-1) % 4096).reshape(chunk_shape).astype(dtype)
                raw = values.tobytes()
                encoded = raw
                for codec in codecs:
                    encoded = codec.encode(np.frombuffer(encoded, dtype=dtype) if codec.codec_id == "shuffle"
                                           else encoded)
                encoded = bytes(encoded)
                data.write(encoded)
                refs.append([offset, len(encoded)])
                offset += len(encoded)
                decoded.write(values.astype(np.dtype(dtype).newbyteorder("<")).tobytes())
            chunk_bytes = int(np.prod(chunk_shape)) * np.dtype(dtype).itemsize
            layout["arrays"][name] = {"refs": refs, "decoded_offset": decoded_offset, "chunk_bytes": chunk_bytes}
            decoded_offset += count * chunk_bytes
    layout["data_size"] = offset
    layout_path.write_text(json.dumps(layout))
    return layout


def make_refs(layout: dict, url: str) -> dict:
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    for name, (dtype, shape, chunks, filters, compressor) in ARRAYS.items():
        refs[f"{name}/.zarray"] = json.dumps({
            "zarr_format": 2, "shape": list(shape), "chunks": list(chunks), "dtype": dtype, "order": "C",
            "fill_value": None, "filters": filters, "compressor": compressor})
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": [f"{name}_time", f"{name}_y", f"{name}_x"]})
        for n, (offset, length) in enumerate(layout["arrays"][name]["refs"]):
            refs[f"{name}/{n}.0.0"] = [url, offset, length]
    step = (layout["data_size"] - SEQ_BYTES) // SEQ_KEYS
    for n in range(SEQ_KEYS):
        refs[f"seq/{n}"] = [url, n * step, SEQ_BYTES]
    return refs


# -- readers (in forked processes) -----------------------------------------------------------------

def random_reader(mnt: str, layout: dict, decoded, seed: int, stop: float, out: dict) -> None:
    rng = random.Random(seed)
    arrays = list(layout["arrays"].items())
    weights = [len(a["refs"]) * a["chunk_bytes"] for _, a in arrays]
    while time.monotonic() < stop:
        name, a = rng.choices(arrays, weights)[0]
        n = rng.randrange(len(a["refs"]))
        size = a["chunk_bytes"]
        offset = rng.randrange(0, size)
        length = min(size - offset, int(2 ** rng.uniform(12, 20)))
        want_at = a["decoded_offset"] + n * size + offset
        read_checked(f"{mnt}/{name}/{n}.0.0", offset, length, decoded, want_at, out)


def sequential_reader(mnt: str, layout: dict, data, seed: int, stop: float, out: dict) -> None:
    step = (layout["data_size"] - SEQ_BYTES) // SEQ_KEYS
    n = seed % SEQ_KEYS
    while time.monotonic() < stop:
        path = f"{mnt}/seq/{n}"
        for offset in range(0, SEQ_BYTES, MiB):
            if time.monotonic() >= stop:
                break
            read_checked(path, offset, MiB, data, n * step + offset, out)
        n = (n + 1) % SEQ_KEYS


def read_checked(path: str, offset: int, length: int, oracle, want_at: int, out: dict) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
            got = os.pread(fd, length, offset)
        finally:
            os.close(fd)
    except OSError:
        out["eio"] += 1
        return
    want = oracle[want_at : want_at + length]
    out["reads"] += 1
    out["bytes"] += len(got)
    if got != want:
        out["wrong"] += sum(a != b for a, b in zip(got, want)) + abs(len(got) - len(want))


def worker(mode: str, mnt: str, layout: dict, oracle_path: str, threads: int, first_seed: int,
           seconds: float, results) -> None:
    oracle = mmap.mmap(os.open(oracle_path, os.O_RDONLY), 0, prot=mmap.PROT_READ)
    stop = time.monotonic() + seconds
    target = random_reader if mode == "random" else sequential_reader
    counts = [{"reads": 0, "bytes": 0, "wrong": 0, "eio": 0} for _ in range(threads)]
    pool = [threading.Thread(target=target, args=(mnt, layout, oracle, first_seed + k, stop, counts[k]))
            for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    results.put({name: sum(c[name] for c in counts) for name in counts[0]})


# -- the run ------------------------------------------------------------------------------------------

def proc_status(pid: int) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                    out[name] = int(value.split()[0])
    except OSError:
        pass
    return out


def proc_cpu_and_faults(pid: int) -> tuple[float, int]:
    """(CPU seconds, minor page faults) of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])


def memory_options(args) -> list[str]:
    out = []
    for name in ("memory_target", "cache_size", "decoded_cache_size"):
        value = getattr(args, name)
        if value:
            out += ["--" + name.replace("_", "-"), value]
    return out


def run_once(args, mode: str, layout: dict, data_dir: Path, tmp: Path, url: str) -> dict:
    refs = make_refs(layout, url)
    (tmp / "refs.json").write_text(json.dumps(refs))
    log_path = tmp / f"mount-{mode}.log"
    env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
    processes, threads = args.processes, args.threads
    if mode == "sequential" and not args.processes_given:
        processes, threads = 8, 8
    with refmount_foreground(tmp / "refs.json", tmp / "mnt", [*memory_options(args), *args.refmount_options.split()],
                             code=Path(args.code) if args.code else None, log_path=log_path, env=env,
                             launcher=[args.launcher] if args.launcher else None) as daemon:
        mnt = daemon.path
        oracle = data_dir / ("decoded.bin" if mode == "random" else "data.bin")
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        workers = [ctx.Process(target=worker, args=(mode, str(mnt), layout, str(oracle), threads,
                                                    1000 * p, args.seconds, results))
                   for p in range(processes)]
        cpu0, faults0 = proc_cpu_and_faults(daemon.pid)
        for w in workers:
            w.start()
        peak_rss = 0
        samples = []
        began = time.monotonic()
        while any(w.is_alive() for w in workers):
            status = proc_status(daemon.pid)
            peak_rss = max(peak_rss, status.get("VmRSS", 0))
            sample = [round(time.monotonic() - began, 2), status.get("VmRSS", 0)]
            if args.trace_memory:  # the daemon's own counters, beside its RSS
                try:
                    sample.append(json.loads(os.getxattr(mnt, "user.refmount.stats")))
                except OSError:
                    pass
            samples.append(sample)
            time.sleep(0.25)
        totals = {"reads": 0, "bytes": 0, "wrong": 0, "eio": 0}
        for _ in workers:
            for name, value in results.get(timeout=30).items():
                totals[name] += value
        for w in workers:
            w.join()
        cpu, faults = proc_cpu_and_faults(daemon.pid)
        cpu, faults = cpu - cpu0, faults - faults0
        status = proc_status(daemon.pid)
        stats = json.loads(os.getxattr(mnt, "user.refmount.stats"))
    if args.samples:
        Path(args.samples).write_text(json.dumps(samples))
    return {"mode": mode, "processes": processes, "threads": threads, **totals, "vmhwm_kib": status.get("VmHWM", 0),
            "peak_rss_kib": peak_rss, "cpu_s": cpu, "minor_faults": faults, "threads_in_daemon": status.get("Threads"), "stats": stats,
            "log_tail": log_path.read_text(errors="replace").splitlines()[-5:]}


def report(args, result: dict) -> None:
    s = result["stats"]
    print(f"{result['mode']}: {result['processes']} x {result['threads']} readers, {args.seconds:g} s, "
          f"{' '.join(memory_options(args))} {args.refmount_options} {' '.join(args.env)}".rstrip())
    print(f"  reads           {result['reads']:,} ({result['bytes'] / 1e6:,.0f} MB verified, "
          f"{result['bytes'] / 1e6 / args.seconds:,.1f} MB/s), wrong bytes {result['wrong']:,}, EIO {result['eio']:,}")
    print(f"  peak RSS        VmHWM {result['vmhwm_kib'] / 1024:,.0f} MiB (largest sample "
          f"{result['peak_rss_kib'] / 1024:,.0f} MiB), daemon threads {result['threads_in_daemon']}")
    gb = max(result["bytes"], 1) / 1e9
    print(f"  daemon CPU      {result['cpu_s'] / gb:.1f} CPU-s per GB read, {result['minor_faults'] / gb:,.0f} "
          f"minor page faults per GB read")
    print(f"  fetched         {s['fetch']['bytes'] / 1e6:,.0f} MB in {s['fetch']['requests']:,} requests")
    if "served" in s:  # (issue 33: amplification = bytes fetched / bytes of remote objects served)
        served = s["served"]
        print(f"  served          {served['bytes'] / 1e6:,.0f} MB of remote objects, amplification "
              f"{served['amplification']:.3f}x")
    m = s["memory"]
    if "target" in m:
        print(f"  memory target   {m['target'] / MiB:,.0f} MiB (the daemon itself {m['runtime'] / MiB:,.0f} MiB at "
              f"mount); caches now: blocks {m['cached'] / MiB:,.0f} of {m['budget'] / MiB:,.0f} MiB, decoded "
              f"{s.get('decoded', {}).get('decoded_bytes', 0) / MiB:,.0f} of "
              f"{s.get('decoded', {}).get('decoded_capacity', 0) / MiB:,.0f} MiB; squeezed "
              f"{m['squeezed'] / MiB:,.1f} MiB, malloc_trim {m['trims']}x, read-ahead wasted {m['prefetch_wasted']}")
    else:  # (a refmount before issue 25)
        print(f"  memory          blocks {m['cached'] / MiB:,.0f} of {m['budget'] / MiB:,.0f} MiB, decoded "
              f"{s.get('decoded', {}).get('decoded_bytes', 0) / MiB:,.0f} MiB")
    if result["wrong"] or result["eio"]:
        print("  daemon log tail:\n    " + "\n    ".join(result["log_tail"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("random", "sequential", "both"), default="random")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--processes", type=int, default=None, help="reader processes (random: 4, sequential: 8)")
    p.add_argument("--threads", type=int, default=8, help="reader threads per process (default 8)")
    p.add_argument("--memory-target", help="the daemon's --memory-target (then no cache sizes unless given)")
    p.add_argument("--cache-size", help="default: 64M without --memory-target")
    p.add_argument("--decoded-cache-size", help="default: 32M without --memory-target")
    p.add_argument("--refmount-options", default="")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in the daemon's environment, e.g. MALLOC_ARENA_MAX=2 (repeatable)")
    p.add_argument("--code", help="run the daemon from this checkout (default: this one), e.g. main's")
    p.add_argument("--launcher", help="a script to run instead of `-m refmount` (diagnostic wrappers)")
    p.add_argument("--data-dir", help="keep the dataset here between runs (default: a temporary directory)")
    p.add_argument("--runs", type=int, default=1, help="runs per mode")
    p.add_argument("--samples", help="write the RSS samples of the last run to this JSON file")
    p.add_argument("--trace-memory", action="store_true",
                   help="with --samples: keep the daemon's stats beside each RSS sample")
    p.add_argument("--json", action="store_true", help="print each run's result as one JSON line too")
    args = p.parse_args()
    if not args.memory_target:
        args.cache_size = args.cache_size or "64M"
        args.decoded_cache_size = args.decoded_cache_size or "32M"
    args.processes_given = args.processes is not None
    args.processes = args.processes or 4
    modes = ("random", "sequential") if args.mode == "both" else (args.mode,)
    with tempfile.TemporaryDirectory(prefix="refmount-memory-") as tmp:
        tmp = Path(tmp)
        tmp.chmod(0o755)  # (nginx's workers run as another user)
        data_dir = Path(args.data_dir) if args.data_dir else tmp / "data"
        layout = build_dataset(data_dir)
        status = 0
        (tmp / "nginx").mkdir()
        with nginx_serving(data_dir, tmp / "nginx") as base:
            for _ in range(args.runs):
                for mode in modes:
                    result = run_once(args, mode, layout, data_dir, tmp, base + "data.bin")
                    report(args, result)
                    if args.json:
                        print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}))
                    status |= 1 if result["wrong"] else 0
        return status


if __name__ == "__main__":
    raise SystemExit(main())
