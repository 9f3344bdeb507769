"""What serving each reader its own metadata form costs: mount time and the time readers take to open
a dataset of many arrays, `--form auto` (each open of a metadata file asks /proc who reads it, and is
read around the page cache) against `--form nc49` (one form: no identification, page cache).

    python bench/bench_forms.py [--arrays N] [--runs R] [--workdir DIR]

Input (made once under --workdir): a reference set of N small float32 arrays with inline chunks,
each with a char array beside it (so that every array's metadata differs between forms). Probes,
alternating auto and nc49 on fresh mounts, R runs each: the mount's start-up (until it answers),
Debian's `ncdump -h` of the whole mount (netCDF-C opens each metadata file twice), and a second
`ncdump -h` (warm: the nc49 mount has the files in the page cache by then). Prints medians and the
auto/nc49 ratio of each probe's paired runs; writes bench/out/forms.json. Needs FUSE (root) and ncdump.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness.mounts import refmount_foreground
from harness.record import Record

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "forms.json"


def make_refs(workdir: Path, n: int) -> Path:
    path = workdir / f"forms-{n}.json"
    if path.exists():
        return path
    refs = {".zgroup": json.dumps({"zarr_format": 2}), ".zattrs": json.dumps({"title": "forms bench"})}
    data = "base64:" + base64.b64encode(bytes(16)).decode()
    for k in range(n):
        for name, dtype, chunk in ((f"v{k}", "<f4", data), (f"c{k}", "|S1", "base64:" + base64.b64encode(b"abcd").decode())):
            refs[f"{name}/.zarray"] = json.dumps({"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": dtype,
                                                  "compressor": None, "filters": None, "fill_value": None, "order": "C"})
            refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["x"], "units": "m"})
            refs[f"{name}/0"] = chunk
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return path


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def probe(refs: Path, mnt: Path, form: str) -> dict:
    with refmount_foreground(refs, mnt, ["--form", form], log_path=mnt.with_suffix(".log")) as m:
        url = f"file://{mnt}#mode=zarr,file"
        cold = timed(["/usr/bin/ncdump", "-h", url])
        warm = timed(["/usr/bin/ncdump", "-h", url])
    return {"mount_s": m.seconds, "ncdump_h_s": cold, "ncdump_h_warm_s": warm}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arrays", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/refmount-bench-forms"))
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    refs = make_refs(args.workdir, args.arrays)
    record = Record("forms")
    runs = {"auto": [], "nc49": []}
    for r in range(args.runs):
        for form in (("auto", "nc49") if r % 2 == 0 else ("nc49", "auto")):
            runs[form].append(probe(refs, args.workdir / f"mnt-{form}", form))
    keys = runs["auto"][0].keys()
    result = {"arrays": args.arrays, "runs": args.runs, "median": {}, "ratio_auto_to_nc49": {}}
    print(f"{args.arrays} arrays + {args.arrays} char arrays, {args.runs} alternating runs\n")
    lines = ["| probe | auto (s) | nc49 (s) | auto/nc49 (median of paired ratios) |", "|---|---|---|---|"]
    for k in keys:
        a = statistics.median(x[k] for x in runs["auto"])
        b = statistics.median(x[k] for x in runs["nc49"])
        ratio = statistics.median(x[k] / y[k] for x, y in zip(runs["auto"], runs["nc49"]))
        result["median"][k] = {"auto": a, "nc49": b}
        result["ratio_auto_to_nc49"][k] = ratio
        lines.append(f"| {k} | {a:.3f} | {b:.3f} | {ratio:.2f} |")
    print("\n".join(lines))
    record.write(OUT, "\n".join(lines), **result, runs_raw=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
