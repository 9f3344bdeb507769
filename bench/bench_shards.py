"""What a sharded Zarr v3 array costs to read through the decoded view: one value, one inner chunk, the
whole array; bytes fetched and requests (the daemon's own counters), and wall time.

    python bench/bench_shards.py [--code DIR ...] [--workdir DIR] [--runs R]

Input (made once under --workdir, default /tmp/refmount-bench-shards): a float32 array of 4000 x 4000
(64 MB), shards of 1000 x 1000 (16 shards), inner chunks of 100 x 100 (100 per shard), zstd, written by
zarr-python 3; a kerchunk-style Zarr v3 reference set of it (shards as byte ranges of local files).
Each probe mounts the decoded view in a fresh `refmount mount --foreground` process, cold, with the
refmount code of one --code directory (default: this checkout; give an older checkout to compare),
reads, then reads the daemon's stats xattr and unmounts. Probes: one value with netCDF4-python, the
chunk file holding it (an inner chunk; a whole shard before inner chunks were served), all of the
array with zarr-python. Needs FUSE (root). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.mounts import refmount_foreground

PYTHON = sys.executable
HERE = Path(__file__).resolve().parent
SHAPE, SHARD, INNER = (4000, 4000), (1000, 1000), (100, 100)

PROBES = {
    "one value (netCDF4)": "import netCDF4; ds = netCDF4.Dataset(URL); ds['v'][1234, 2345]; ds.close()",
    "the chunk file holding it": "import json; c = json.load(open(MNT + '/v/.zarray'))['chunks']; "
                                 "open(f'{MNT}/v/{1234 // c[0]}.{2345 // c[1]}', 'rb').read()",
    "whole array (zarr)": "import zarr; zarr.open_array(MNT + '/v', mode='r', zarr_format=2)[...]",
}


def make_inputs(workdir: Path) -> Path:
    refs_path = workdir / "refs.json"
    if refs_path.exists():
        return refs_path
    import numpy as np
    import zarr
    from zarr.codecs import ZstdCodec

    store_root = workdir / "store"
    group = zarr.create_group(zarr.storage.LocalStore(str(store_root)), zarr_format=3)
    array = group.create_array("v", shape=SHAPE, dtype="f4", chunks=INNER, shards=SHARD,
                               compressors=[ZstdCodec(level=1)], dimension_names=["y", "x"])
    y, x = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]].astype("f4")
    array[...] = np.sin(y / 50) * np.cos(x / 70) * 100 + np.random.default_rng(0).normal(size=SHAPE).astype("f4")
    refs = {}
    for dirpath, _, files in os.walk(store_root):
        for name in files:
            path = Path(dirpath) / name
            key = str(path.relative_to(store_root))
            refs[key] = path.read_text() if name == "zarr.json" else [str(path), 0, path.stat().st_size]
    refs_path.write_text(json.dumps({"version": 1, "refs": refs}))
    return refs_path


def probe(code: Path, refs: Path, mnt: Path, snippet: str) -> dict:
    with refmount_foreground(refs, mnt, [], code=code) as m:
        url = f"file://{mnt}#mode=zarr,file"
        began = time.perf_counter()
        subprocess.run([PYTHON, "-c", f"MNT = {str(mnt)!r}; URL = {url!r}\n{snippet}"], check=True)
        seconds = time.perf_counter() - began
        stats = m.stats()
        return {"seconds": seconds, "bytes": stats["fetch"]["bytes"], "requests": stats["fetch"]["requests"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", type=Path, help="a refmount checkout (repeatable)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/refmount-bench-shards"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    codes = args.code or [HERE.parent]
    args.workdir.mkdir(parents=True, exist_ok=True)
    refs = make_inputs(args.workdir)
    print("| code | read | fetched | requests | time (median) |\n|---|---|---:|---:|---:|")
    for code in codes:
        for name, snippet in PROBES.items():
            runs = [probe(code, refs, args.workdir / "mnt", snippet) for _ in range(args.runs)]
            median = statistics.median(r["seconds"] for r in runs)
            print(f"| {code} | {name} | {runs[-1]['bytes'] / 2**20:.2f} MB | {runs[-1]['requests']} | {median:.2f} s |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
