"""Mount time and memory: an Icechunk repository of N virtual chunk references beside the kerchunk-style
JSON (Zarr v3 keys) of the same references.

    python bench/bench_icechunk.py [--chunks N] [--runs R] [--workdir DIR]

Inputs (made once under --workdir, default /tmp/refmount-bench-icechunk, and reused): one float32 array
of N chunks (a square chunk grid, one-element chunks) whose virtual references spread over 100 urls,
committed to a local Icechunk repository with the icechunk package, and the same references written as
JSON. The repository has the format of the icechunk that this Python imports: format spec 2 with
icechunk >= 2 (Python >= 3.12; its references then carry a last-modified checksum each, as VirtualiZarr
writes them, and their locations are zstd-compressed with a dictionary, Icechunk's default from 1000
virtual chunks per manifest), spec 1 with icechunk 1.x. Each probe runs `refmount mount --foreground` in a fresh process and times it from start until the
mount answers, then reads the daemon's peak and current memory (VmHWM, VmRSS of /proc/PID/status) and
unmounts. Probes: icechunk and JSON in the raw view, and icechunk in the decoded view (which also builds
the Zarr v2 form). Needs FUSE (root). Prints a markdown table; writes bench/out/icechunk.json. MB = 2**20 bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from harness.mounts import refmount_foreground
from harness.record import Record

PYTHON = sys.executable
HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "icechunk.json"
URLS = 100
PREFIX = "http://127.0.0.1:9/"  # never read: mounting does not fetch chunks


def icechunk_spec() -> int:
    import icechunk

    return 2 if int(icechunk.__version__.split(".")[0]) >= 2 else 1


def make_inputs(workdir: Path, n: int) -> tuple[Path, Path]:
    side = math.isqrt(n)
    repo_path = workdir / f"repo-{n}-spec{icechunk_spec()}.icechunk"
    json_path = workdir / f"refs-{n}.json"
    if repo_path.exists() and json_path.exists():
        return repo_path, json_path
    import datetime

    import icechunk
    import numpy as np
    import orjson
    import zarr

    t0 = time.monotonic()
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(PREFIX, icechunk.http_store()))
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(repo_path)), config)
    session = repo.writable_session("main")
    zarr.create_group(session.store, zarr_format=3)
    array = zarr.create_array(session.store, name="data", shape=(side, side), chunks=(1, 1), dtype="f4",
                              dimension_names=["y", "x"])
    offsets = np.arange(side * side, dtype=np.int64) * 4
    locations = [f"{PREFIX}f{k % URLS}.nc" for k in range(side * side)]
    if hasattr(session.store, "set_virtual_refs_arr"):  # icechunk >= 2: no Python object per reference
        session.store.set_virtual_refs_arr("data", (side, side), locations, offsets.astype(np.uint64),
                                           np.full(side * side, 4, np.uint64), validate_containers=False,
                                           checksum=datetime.datetime.now(datetime.timezone.utc))
    else:
        specs = [icechunk.VirtualChunkSpec(index=[k // side, k % side], location=locations[k],
                                           offset=int(offsets[k]), length=4) for k in range(side * side)]
        session.store.set_virtual_refs("data", specs, validate_containers=False)
    session.commit("bench")
    refs = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}),
            "data/zarr.json": json.dumps(array.metadata.to_dict(), default=str)}
    for k in range(side * side):
        refs[f"data/c/{k // side}/{k % side}"] = [f"{PREFIX}f{k % URLS}.nc", int(offsets[k]), 4]
    json_path.write_bytes(orjson.dumps({"version": 1, "refs": refs}))
    print(f"inputs: {side * side:,} chunks in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return repo_path, json_path


def probe(source: Path, mnt: Path, args: list[str]) -> dict:
    with refmount_foreground(source, mnt, args, log_path=mnt.with_name("mount.log"), timeout=600) as m:
        time.sleep(1)  # (let the daemon finish starting up before it is stopped)
        return {"mount_s": m.seconds, "peak_mb": m.peak_rss_mib(), "rss_mb": m.rss_mib()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/refmount-bench-icechunk")
    args = parser.parse_args()
    record = Record("icechunk")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    repo, refs = make_inputs(workdir, args.chunks)
    spec = icechunk_spec()
    authorized = ["--authorize-container", PREFIX]
    probes = {f"icechunk (spec {spec}), raw view": (repo, ["--view", "raw", *authorized]),
              "kerchunk JSON (v3 keys), raw view": (refs, ["--view", "raw"]),
              f"icechunk (spec {spec}), decoded view": (repo, authorized),
              "kerchunk JSON (v3 keys), decoded view": (refs, [])}
    results = {}
    runs: dict[str, list] = {name: [] for name in probes}
    for _ in range(args.runs):  # alternating: each round probes every source once
        for name, (source, extra) in probes.items():
            runs[name].append(probe(source, workdir / "mnt", extra))
    for name, measured in runs.items():
        results[name] = {key: statistics.median(r[key] for r in measured) for key in measured[0]} | {"runs": measured}
    n = math.isqrt(args.chunks) ** 2
    print(f"\n{n:,} chunk references ({args.runs} runs, median)\n")
    lines = ["| source | mount time (s) | peak RSS (MB) | RSS when mounted (MB) |", "|---|---:|---:|---:|"]
    lines += [f"| {name} | {r['mount_s']:.2f} | {r['peak_mb']:.0f} | {r['rss_mb']:.0f} |" for name, r in results.items()]
    print("\n".join(lines))
    print("\nicechunk / JSON:")
    for view in ("raw", "decoded"):
        ice, js = results[f"icechunk (spec {spec}), {view} view"], results[f"kerchunk JSON (v3 keys), {view} view"]
        print(f"  {view} view: mount time {ice['mount_s'] / js['mount_s']:.2f}x, peak RSS "
              f"{ice['peak_mb'] / js['peak_mb']:.2f}x")
    record.write(OUT, {f"{n:,} chunk references ({args.runs} runs, median)": "\n".join(lines)}, chunks=n, spec=spec,
                 results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
