"""S3 over loopback: refmount's S3 path (s3fs), s3fs in-process, obstore's S3Store and parallel curl.

    python bench/bench_s3.py [--mb 256] [--range-mib 8] [--parallel 8] [--rounds 3] [--no-mount]
        [--baseline TREE]

moto is far too slow to be the limit; here a loopback nginx serves a bucket's objects under
/bucket/key, which answers the calls a reader makes (HeadObject, GetObject with Range; path-style
urls, the SigV4 signature ignored). Every client signs with fake keys as it would against S3.
All of the object is fetched as ranges of --range-mib, --parallel at once, into 1 MiB blocks that
are kept (a cold cache fill), and compared with the object afterwards. Contenders, each in a fresh
process, alternating within a round (the order rotates); medians and medians of paired ratios:
- curl            the same ranges from a --parallel config file to /dev/null (the wire)
- s3fs            s3fs in-process, pure asyncio (`_cat_file` per range, a semaphore of --parallel)
- refmount-fetch  refmount.fetch.Fetcher with an s3:// url, as the daemon fetches (since issue 26:
                  urls presigned by obstore on refmount's HTTP engine; before: s3fs on fsspec's loop)
- obstore         obstore S3Store, get_range_async resolved on the trio loop (bench_engines.trio_shim)
- mount           `refmount mount` of a whole-object s3:// reference, cold `dd bs=1M` (daemon CPU
                  from /proc; FUSE included; needs root). --no-mount skips it.
- mount-baseline  the same with refmount's code from --baseline TREE (another commit's checkout)
"""

from __future__ import annotations

import argparse
import collections
import json
import mmap
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness import engines as be
from harness.inputs import write_big
from harness.mounts import cold_read, refmount_mounted, remove_scratch
from harness.record import Record
from harness.servers import nginx_serving

KEY, SECRET = "AKIAFAKEFAKEFAKE0000", "fake/secret/fake/secret/fake/secret/0000"
CONTENDERS = ["curl", "s3fs", "refmount-fetch", "obstore", "mount"]


def s3_options(endpoint: str) -> dict:
    return {"key": KEY, "secret": SECRET, "endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}


def child(args) -> dict:
    endpoint, size, par = args.endpoint, args.size, args.par
    span = args.range_mib << 20
    ranges = [(s, min(s + span, size)) for s in range(0, size, span)]
    sink = be.Sink(0)
    result: dict = {}

    def begin():
        return resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), be.thread_cpu()

    def end(r0, t0, c0):
        t1, r1, c1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF), be.thread_cpu()
        result.update(seconds=t1 - t0, cpu=(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                      minflt=r1.ru_minflt - r0.ru_minflt, threads={k: c1[k] - c0[k] for k in c1})

    if args.child == "s3fs":
        import asyncio

        import s3fs

        async def main():
            fs = s3fs.S3FileSystem(asynchronous=True, **s3_options(endpoint))
            await fs.set_session()
            await fs._info("bucket/big.bin")
            await fs._cat_file("bucket/big.bin", start=0, end=1 << 20)
            sem = asyncio.Semaphore(par)

            async def one(start, stop):
                async with sem:
                    data = await fs._cat_file("bucket/big.bin", start=start, end=stop)
                if len(data) != stop - start:
                    raise RuntimeError(f"{len(data)} bytes for {start}-{stop}")
                sink.put(start, be.pieces_of(data, start))

            marks = begin()
            await asyncio.gather(*(one(s, e) for s, e in ranges))
            end(*marks)

        asyncio.run(main())
    else:
        import trio

        if args.child == "refmount-fetch":
            from refmount.fetch import Fetcher

            url = "s3://bucket/big.bin"
            fetcher = Fetcher(remote_options=s3_options(endpoint))

            async def warm():
                await fetcher.warm_up([url])
                await fetcher.read(url, 0, 1 << 20, be.BLOCK)

            async def fetch(start, stop):
                return await fetcher.read(url, start, stop, be.BLOCK)
        elif args.child == "obstore":
            import obstore
            from obstore.store import S3Store

            store = S3Store("bucket", endpoint=endpoint, access_key_id=KEY, secret_access_key=SECRET,
                            region="us-east-1", virtual_hosted_style_request=False,
                            client_options={"allow_http": True, "timeout": "120s"}, retry_config={"max_retries": 0})

            async def warm():
                obstore.head(store, "big.bin")
                await fetch(0, 1 << 20)

            async def fetch(start, stop):
                data = await be.trio_shim.awaiting(lambda: obstore.get_range_async(store, "big.bin", start=start, end=stop))
                if len(data) != stop - start:
                    raise RuntimeError(f"{len(data)} bytes for {start}-{stop}")
                return be.pieces_of(data, start)
        else:
            raise SystemExit(f"unknown contender {args.child}")

        async def main():
            await warm()
            todo = iter(ranges)

            async def worker():
                for start, stop in todo:
                    sink.put(start, await fetch(start, stop))

            marks = begin()
            async with trio.open_nursery() as nursery:
                for _ in range(par):
                    nursery.start_soon(worker)
            end(*marks)

        trio.run(main)
    if sink.bytes != size:
        raise SystemExit(f"{args.child}: fetched {sink.bytes} of {size} bytes")
    with open(args.file, "rb") as f:
        source = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        wrong = sum(1 for start, block in sink.blocks.items() if source[start:start + len(block)] != block)
    if wrong:
        raise SystemExit(f"{args.child}: {wrong} blocks differ from the object")
    return result


def mount_run(endpoint: str, size: int, run_dir: Path, par: int, code: Path | None = None) -> dict:
    """A cold `dd` through `refmount mount` of the s3:// object: daemon CPU, dd's MB/s."""
    refs = run_dir / "s3.json"
    refs.write_text(json.dumps({"big": ["s3://bucket/big.bin"]}))
    with refmount_mounted(refs, run_dir / "mnt-s3", ["--view", "raw", "--connections", str(par),
                                                      "--remote-options", json.dumps(s3_options(endpoint))],
                          code) as m:
        return {**cold_read(m, "big", size), "threads": {}}


def run_child(name: str, endpoint: str, size: int, range_mib: int, par: int, file: Path) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", name, "--endpoint", endpoint, "--size", str(size),
                           "--range-mib", str(range_mib), "--par", str(par), "--file", str(file)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr.strip()[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256, help="MiB in the object")
    p.add_argument("--range-mib", type=int, default=8)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--contenders", default=",".join(CONTENDERS))
    p.add_argument("--no-mount", action="store_true")
    p.add_argument("--json", type=Path)
    p.add_argument("--baseline", type=Path, metavar="TREE", help="also mount with refmount's code from TREE")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--par", type=int, help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    names = [c for c in args.contenders.split(",") if not (args.no_mount and c == "mount")]
    if args.baseline and not args.no_mount:
        names.append("mount-baseline")
    size = args.mb << 20
    results = collections.defaultdict(list)
    record = Record("s3")
    load = [os.getloadavg()[0]]
    with ExitStack() as stack:
        run_dir = Path(tempfile.mkdtemp(prefix="refmount-s3-run."))
        serve = Path(tempfile.mkdtemp(prefix="refmount-s3-data.", dir="/dev/shm"))
        stack.callback(remove_scratch, serve)
        stack.callback(remove_scratch, run_dir)
        (serve / "bucket").mkdir()
        obj = serve / "bucket" / "big.bin"
        write_big(obj, size)
        for path in (serve, serve / "bucket"):
            path.chmod(0o755)
        endpoint = stack.enter_context(nginx_serving(serve, run_dir)).rstrip("/")
        for rnd in range(args.rounds):
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for name in order:
                if name == "curl":
                    r = be.curl_run(f"{endpoint}/bucket/big.bin", size, args.range_mib, args.parallel, run_dir)
                elif name in ("mount", "mount-baseline"):
                    r = mount_run(endpoint, size, run_dir, args.parallel, args.baseline if name != "mount" else None)
                else:
                    r = run_child(name, endpoint, size, args.range_mib, args.parallel, obj)
                r.update(contender=name, round=rnd)
                results[name].append(r)
                print(f"# round {rnd + 1} {name}: {size / r['seconds'] / 1e6:.0f} MB/s "
                      f"{r['cpu'] / (size / 1e9):.2f} CPU-s/GB", file=sys.stderr, flush=True)
            load.append(os.getloadavg()[0])
    gb = size / 1e9
    title = (f"S3 over loopback nginx: {args.mb} MiB object, {args.range_mib} MiB ranges, {args.parallel} at once; "
             f"{args.rounds} rounds (medians; ratios are medians of paired runs); load average "
             f"{', '.join(f'{x:.1f}' for x in load)}")
    print(f"\n{title}\n")
    lines = ["| contender | MB/s | CPU-s/GB | faults/GB | MB/s ÷ curl | MB/s ÷ s3fs | CPU ÷ curl |", "|---|---|---|---|---|---|---|"]
    for name in names:
        runs = results[name]

        def paired(other, f):
            if other not in results:
                return "—"
            return f"{statistics.median(f(r, o) for r, o in zip(runs, results[other])):.2f}"

        lines.append(f"| {name} | {statistics.median(size / r['seconds'] / 1e6 for r in runs):.0f} "
                     f"| {statistics.median(r['cpu'] / gb for r in runs):.2f} "
                     f"| {statistics.median(r['minflt'] / gb for r in runs):.0f} "
                     f"| {paired('curl', lambda r, o: o['seconds'] / r['seconds'])} "
                     f"| {paired('s3fs', lambda r, o: o['seconds'] / r['seconds'])} "
                     f"| {paired('curl', lambda r, o: r['cpu'] / o['cpu'])} |")
    print("\n".join(lines))
    if args.json:
        record.write(args.json, {title: "\n".join(lines)}, runs=[r for runs in results.values() for r in runs])
    return 0


if __name__ == "__main__":
    sys.exit(main())
