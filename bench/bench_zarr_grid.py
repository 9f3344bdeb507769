"""A remote Zarr store of many chunks, mounted: what the load and the mount cost as the grid grows.

    /work/main/.venv/bin/python bench/bench_zarr_grid.py [--chunks N] [--runs N] [--format 3] \
        [--baseline DIR [--baseline-runs N] [--baseline-load-only]] [--workdir DIR] [--no-mount]

The store is metadata written by hand (a consolidated root zarr.json and the array's zarr.json: shape
(N, 100, 100), chunks (1, 100, 100), float32, zstd; v3's default "c/t/0/0" keys, or v2's "t.0.0") with
two chunks written by zarr-python; python's http.server serves it on loopback. Per run, in a fresh child
process: VmRSS after the imports, then `load_remote_store` (what a mount loads) and the decoded view's
v2 form of it (`v2_refset`, for v3), each timed, and VmRSS after; then a real `refmount mount
--foreground` (decoded view): seconds until the mount answers and the daemon's VmRSS then. Medians of
--runs. --baseline DIR (e.g. `git archive main | tar -x -C DIR`) runs the same with that tree's code.
MB here means 2**20 bytes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import ROOT  # noqa: E402
from harness.mounts import code_env, refmount_foreground  # noqa: E402
from harness.system import exit_on_signals, free_port, port_open, proc_status_mib, stop, wait_for  # noqa: E402

PYTHON = sys.executable
WRITTEN = (5, 7)


def write_store(root: Path, chunks: int, fmt: int) -> None:
    """The store's metadata by hand (no chunk key made), then two chunks through zarr-python."""
    import numpy as np
    import zarr

    root.mkdir(parents=True, exist_ok=True)
    shape, chunk = [chunks, 100, 100], [1, 100, 100]
    if fmt == 3:
        array = {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "float32",
                 "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunk}},
                 "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                 "fill_value": -1.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                                {"name": "zstd", "configuration": {"level": 0, "checksum": False}}],
                 "attributes": {}, "dimension_names": ["time", "lat", "lon"]}
        (root / "tas").mkdir(exist_ok=True)
        (root / "tas" / "zarr.json").write_text(json.dumps(array))
        group = {"zarr_format": 3, "node_type": "group", "attributes": {},
                 "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {"tas": array}}}
        (root / "zarr.json").write_text(json.dumps(group))
    else:
        array = {"zarr_format": 2, "shape": shape, "chunks": chunk, "dtype": "<f4", "fill_value": -1.0,
                 "order": "C", "compressor": {"id": "zstd", "level": 0}, "filters": None}
        attrs = {"_ARRAY_DIMENSIONS": ["time", "lat", "lon"]}
        (root / "tas").mkdir(exist_ok=True)
        (root / "tas" / ".zarray").write_text(json.dumps(array))
        (root / "tas" / ".zattrs").write_text(json.dumps(attrs))
        (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
        (root / ".zmetadata").write_text(json.dumps({"zarr_consolidated_format": 1, "metadata": {
            ".zgroup": {"zarr_format": 2}, "tas/.zarray": array, "tas/.zattrs": attrs}}))
    tas = zarr.open_array(str(root / "tas"), mode="r+", zarr_format=fmt)
    for t in WRITTEN:
        tas[t] = np.full((100, 100), t, "f4")


CHILD = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
from refmount.refs.zarrremote import load_remote_store
from refmount.view.zarr3 import is_v3, v2_refset
before = rss()
t0 = time.perf_counter()
refset = load_remote_store(sys.argv[1])
t1 = time.perf_counter()
form = v2_refset(refset) if is_v3(refset) else refset
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "v2_form_s": t2 - t1, "rss_before_mib": before, "rss_after_mib": rss(),
                  "lazy": bool(getattr(refset, "lazy", False))}))
"""


def probe_load(url: str, code: Path) -> dict:
    done = subprocess.run([PYTHON, "-c", CHILD, url], capture_output=True, text=True, env=code_env(code),
                          cwd=code, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-2000:])
    return json.loads(done.stdout)


def probe_mount(url: str, code: Path, work: Path) -> dict:
    with refmount_foreground(url, work / "mnt", [], code=code, timeout=900) as m:
        return {"mount_s": m.seconds, "daemon_rss_mib": proc_status_mib(m.pid, "VmRSS")}


def median_of(runs: list[dict]) -> dict:
    return {k: v if isinstance(v, bool) else round(statistics.median(r[k] for r in runs), 3)
            for k, v in runs[0].items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=1_000_000)
    parser.add_argument("--format", type=int, choices=(2, 3), default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another tree's code, run alike (e.g. main's)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--no-mount", action="store_true", help="the load alone")
    parser.add_argument("--baseline-runs", type=int, help="runs of the baseline (default --runs; the first ones "
                        "are paired; an eager million-chunk v3 mount takes 10 minutes on a loaded 2-core VM)")
    parser.add_argument("--baseline-load-only", action="store_true", help="no mount of the baseline")
    args = parser.parse_args()
    exit_on_signals()  # (a mount is unmounted on SIGTERM too)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-zarr-grid-"))
    store = work / f"www/v{args.format}-{args.chunks}.zarr"
    if not (store / "tas").exists():
        write_store(store, args.chunks, args.format)
    port = free_port()
    server = subprocess.Popen([PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=work / "www",
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_open(port), "http.server")
        url = f"http://127.0.0.1:{port}/{store.name}"
        trees = [("this tree", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        loads = {name: [] for name, _ in trees}
        mounts = {name: [] for name, _ in trees}
        for run in range(args.runs):  # (paired: each run of this tree beside the baseline's)
            for name, code in trees:
                if name == "baseline" and run >= (args.baseline_runs if args.baseline_runs is not None else args.runs):
                    continue
                loads[name].append(probe_load(url, code))
                print(f"{name} load: {json.dumps(loads[name][-1])}", flush=True)
                if not args.no_mount and not (name == "baseline" and args.baseline_load_only):
                    mounts[name].append(probe_mount(url, code, work))
                    print(f"{name} mount: {json.dumps(mounts[name][-1])}", flush=True)
        results = {name: median_of(loads[name]) | (median_of(mounts[name]) if mounts[name] else {})
                   for name, _ in trees}
        for name, result in results.items():
            print(f"{name}: {json.dumps(result)}", flush=True)
        out = HERE / "out" / "zarr_grid.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({"chunks": args.chunks, "format": args.format, "runs": args.runs,
                                   "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **results}, indent=1))
    finally:
        stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
