"""Sparse reads over an emulated WAN: a point's time series, a map tile and a small cube (issue 33).

    PYTHONPATH=$PWD python bench/bench_sparse.py [--quick] [--runs N] [--links 80:1000,20:100] [--files ...]
                                                 [--baseline TREE] [--only zarr,fsspec,...]

Needs root. Builds bench/harness's kernel-TCP link (`--link nfqueue`: a router namespace between the
host and the server's namespace, every packet held RTT/2 per direction behind a rate limit by
bench/nfqdelay.c; needs iptables-legacy, gcc, libnetfilter-queue-dev and nco: installed if missing)
and serves, from an nginx inside the server's namespace that logs every request with its Range and
the bytes it sent:

- `tas.nc`: netCDF-4, 365 time steps of 512 x 512 float32 `tas`, chunks 1 x 64 x 64, zlib (about
  6 KB per chunk), as the issue measured;
- `big.nc` (not with --quick): the same field in chunks of 4 x 128 x 128 (about 90 KB each).

Both kerchunked (SingleHdf5ToZarr). Selections (index ranges; the tile and the cube in chunks of the
first file): the point series (lat 300, lon 200, all 365 steps), a 5 x 5-chunk tile at step 100
(lat 64-383, lon 128-447), and a 3 x 3-chunk x 24-step cube (steps 100-123, lat and lon 192-383).

Contenders, taking turns in each run (a fresh mount or process each time, so every read is cold):
- `zarr`: zarr-python 3 on the mount (--view raw); `xarray`: xarray.open_zarr on it;
- `ncks`: NCO's `ncks -d ... -v tas` on the decoded view (`file:///mnt#mode=zarr,file`), netCDF-C
  reading one chunk at a time (Debian's ncdump has no hyperslab option: ncks is its library's reader
  of a selection);
- `fsspec`: zarr over fsspec's ReferenceFileSystem in-process (`FsspecStore.from_url("reference://",
  ..., remote_options={"asynchronous": True})`);
- `virtualizarr`: VirtualiZarr 2.8's ManifestStore over obstore, in-process, on Python >= 3.12 (the
  venv /work/main/.venv-py3.13, or --vz-python); skipped with a note if there is none;
- with --baseline TREE: `baseline zarr` and `baseline ncks`, refmount's code from TREE.

Figures: time (the Python readers' open and read, inside their process; ncks as a command), GETs and
bytes sent from nginx's access log, bytes over the chunk bytes the selection needs; medians of the runs.
Every reader's values are checked against the source file (netCDF4 on it). The table ends with the
issue's targets for refmount (zarr on the mount) against fsspec. Not part of CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness.inputs import generated
from harness.links import NfqLink, build_nfqdelay, connect_ms, need_nfqueue, nfq_delay
from harness.mounts import refmount_mounted, remove_scratch
from harness.peers import kerchunk_refs
from harness.servers import BYTES_LOG, nginx_in
from harness.record import Record
from harness.system import STEP_TIMEOUT_S, ensure_installed, exit_on_signals, log

HERE = Path(__file__).resolve().parent
STEPS, SIDE = 365, 512
FILES = {"tas.nc": (1, 64, 64), "big.nc": (4, 128, 128)}  # chunk shapes
SELECTIONS = {  # name -> [(start, stop) per axis]; ncks takes the same as -d name,first,last
    "point series": [(0, STEPS), (300, 301), (200, 201)],
    "tile 5x5": [(100, 101), (64, 384), (128, 448)],
    "cube 3x3x24": [(100, 124), (192, 384), (192, 384)],
}
DIMS = ("time", "lat", "lon")
# -- the child: one reader in a fresh process (also runs on the newer Python, so stdlib imports only) --

def digest(values) -> str:
    import numpy as np

    return hashlib.sha1(np.ascontiguousarray(values, dtype="<f4").tobytes()).hexdigest()


def child(spec: dict) -> None:
    """Open and read one selection with one in-process reader; print its time and the values' digest."""
    import warnings

    warnings.simplefilter("ignore")
    sel = tuple(slice(a, b) for a, b in spec["sel"])
    kind = spec["kind"]
    import zarr

    if kind == "xarray":
        import xarray as xr
    if kind == "fsspec":
        from zarr.storage import FsspecStore
    if kind == "virtualizarr":
        from obspec_utils.registry import ObjectStoreRegistry
        from obstore.store import HTTPStore, LocalStore
        from virtualizarr.parsers import KerchunkJSONParser
    t0 = time.perf_counter()
    if kind == "zarr":
        values = zarr.open_array(spec["path"] + "/tas", mode="r", zarr_format=2)[sel]
    elif kind == "xarray":
        values = xr.open_zarr(spec["path"], consolidated=False, zarr_format=2)["tas"][sel].values
    elif kind == "fsspec":
        store = FsspecStore.from_url("reference://", read_only=True, storage_options={
            "fo": spec["refs"], "remote_protocol": "http", "remote_options": {"asynchronous": True}})
        values = zarr.open_array(store, path="tas", mode="r", zarr_format=2)[sel]
    elif kind == "virtualizarr":
        server = spec["server"].rstrip("/")
        registry = ObjectStoreRegistry({server: HTTPStore.from_url(server, client_options={"allow_http": True}),
                                        "file://": LocalStore()})
        store = KerchunkJSONParser()(url="file://" + spec["refs"], registry=registry)
        values = zarr.open_array(store, path="tas", mode="r")[sel]
    else:
        raise SystemExit(f"unknown reader {kind!r}")
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "digest": digest(values)}))


# -- inputs ------------------------------------------------------------------------------------------

def write_file(path: Path, chunks: tuple[int, int, int]) -> None:
    """`tas(time, lat, lon)`: a smooth field plus noise rounded to 0.1 K (zlib about 3:1)."""
    import netCDF4
    import numpy as np

    rng = np.random.default_rng(33)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    base = (280 + 20 * np.sin(y / 80) * np.cos(x / 60)).astype("f4")
    with netCDF4.Dataset(path, "w") as ds:
        for name, n in zip(DIMS, (STEPS, SIDE, SIDE)):
            ds.createDimension(name, n)
        var = ds.createVariable("tas", "f4", DIMS, chunksizes=chunks, zlib=True, complevel=4, shuffle=False)
        var.units = "K"
        for t0 in range(0, STEPS, chunks[0]):
            n = min(chunks[0], STEPS - t0)
            var[t0:t0 + n] = np.round(base + rng.normal(0, 1, (n, SIDE, SIDE)).astype("f4"), 1)


def oracle(path: Path, sel) -> str:
    import netCDF4

    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        return digest(ds["tas"][tuple(slice(a, b) for a, b in sel)])


def needed_bytes(refs: dict, chunks, sel) -> tuple[int, int]:
    """(chunks, their referenced bytes) that selection `sel` touches."""
    import itertools

    ranges = [range(a // c, (b - 1) // c + 1) for (a, b), c in zip(sel, chunks)]
    keys = [f"tas/{'.'.join(map(str, idx))}" for idx in itertools.product(*ranges)]
    return len(keys), sum(refs["refs"][k][2] for k in keys if k in refs["refs"])


class AccessLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def since(self, mark: int, name: str) -> tuple[int, int]:
        """(GETs of `name`, bytes sent for them) logged after `mark`."""
        time.sleep(0.05)  # (nginx writes each line as its request ends)
        with open(self.path, "rb") as f:
            f.seek(mark)
            lines = f.read().decode(errors="replace").splitlines()
        gets = nbytes = 0
        for line in lines:
            parts = line.split()
            if len(parts) >= 5 and parts[0] == "GET" and parts[1] == "/" + name:
                gets += 1
                nbytes += int(parts[-1])
        return gets, nbytes


# -- contenders ----------------------------------------------------------------------------------------

class Sparse:
    def __init__(self, run_dir: Path, url: str, refs: dict[str, Path], sources: dict[str, Path],
                 access: AccessLog, options: list[str], vz_python: str | None, baseline: Path | None) -> None:
        self.run_dir, self.url, self.refs, self.sources = run_dir, url, refs, sources
        self.access, self.options, self.vz_python, self.baseline = access, options, vz_python, baseline

    def contenders(self) -> dict:
        out = {"zarr": (self.mounted_child, "zarr", None), "xarray": (self.mounted_child, "xarray", None),
               "ncks": (self.ncks, None, None), "fsspec": (self.in_process, "fsspec", None)}
        if self.vz_python:
            out["virtualizarr"] = (self.in_process, "virtualizarr", None)
        if self.baseline:
            out["baseline zarr"] = (self.mounted_child, "zarr", self.baseline)
            out["baseline ncks"] = (self.ncks, None, self.baseline)
        return out

    def run(self, name: str, file: str, sel) -> dict:
        method, kind, code = self.contenders()[name]
        mark = self.access.mark()
        seconds, got = method(file, sel, kind, code)
        gets, nbytes = self.access.since(mark, file)
        return {"seconds": seconds, "gets": gets, "bytes": nbytes, "digest": got}

    def _child(self, python: str, spec: dict) -> tuple[float, str]:
        done = subprocess.run([python, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                              capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{spec['kind']} failed: {done.stderr.strip()[-600:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return result["seconds"], result["digest"]

    def mounted_child(self, file: str, sel, kind: str, code) -> tuple[float, str]:
        with refmount_mounted(self.refs[file], self.run_dir / "mnt", ["--view", "raw", *self.options],
                              code) as m:
            out = self._child(sys.executable, {"kind": kind, "path": str(m.path), "sel": sel})
            self.note(m)
            return out

    def in_process(self, file: str, sel, kind: str, code) -> tuple[float, str]:
        python = self.vz_python if kind == "virtualizarr" else sys.executable
        return self._child(python, {"kind": kind, "refs": str(self.refs[file]), "sel": sel, "server": self.url})

    def ncks(self, file: str, sel, kind, code) -> tuple[float, str]:
        out = self.run_dir / "ncks-out.nc"
        out.unlink(missing_ok=True)
        with refmount_mounted(self.refs[file], self.run_dir / "mnt", ["--view", "decoded", *self.options],
                              code) as m:
            cuts = [arg for d, (a, b) in zip(DIMS, sel) for arg in ("-d", f"{d},{a},{b - 1}")]
            t0 = time.perf_counter()
            done = subprocess.run(["ncks", "-O", *cuts, "-v", "tas", f"file://{m.path}#mode=zarr,file", str(out)],
                                  capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
            seconds = time.perf_counter() - t0
            if done.returncode != 0:
                raise RuntimeError(f"ncks failed: {done.stderr.strip()[-600:]}")
            self.note(m)
        import netCDF4

        with netCDF4.Dataset(out) as ds:
            ds.set_auto_maskandscale(False)
            return seconds, digest(ds["tas"][:].reshape([b - a for a, b in sel]))

    def note(self, m) -> None:
        grid = m.stats().get("grid_readahead")
        if grid:
            log(f"    grid read-ahead: {grid}")


def measure(bench: Sparse, names: list[str], file: str, sel, expect: str, runs: int) -> dict[str, list[dict]]:
    results: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(runs):
        for name in names[r % len(names):] + names[: r % len(names)]:
            try:
                got = bench.run(name, file, sel)
            except Exception as e:  # noqa: BLE001 - one failed contender must not lose the table
                log(f"  {name} failed: {e}")
                continue
            if got["digest"] != expect:
                log(f"  {name}: WRONG VALUES (digest {got['digest']} != {expect})")
                continue
            log(f"  {name}: {got['seconds']:.2f} s, {got['gets']} GETs, {got['bytes']} bytes")
            results[name].append(got)
    return results


def median(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def table(all_results: list[tuple], contenders: list[str]) -> str:
    lines = ["| link | file | selection | reader | time s median (min-max) | GETs | bytes / needed | vs fsspec time |",
             "|---|---|---|---|---|---|---|---|"]
    for link, file, name, (chunks, needed), results in all_results:
        ref = results.get("fsspec") or []
        ref_time = median(ref, "seconds") if ref else None
        for reader in contenders:
            rows = results.get(reader) or []
            if not rows:
                lines.append(f"| {link} | {file} | {name} | {reader} | failed | | | |")
                continue
            t = [r["seconds"] for r in rows]
            ratio = f"{statistics.median(t) / ref_time:.2f}" if ref_time else "-"
            lines.append(f"| {link} | {file} | {name} ({chunks} chunks, {needed / 1e6:.2f} MB) | {reader} | "
                         f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f}) | {median(rows, 'gets'):.0f} | "
                         f"{median(rows, 'bytes') / needed:.2f} | {ratio} |")
    return "\n".join(lines)


def verdicts(all_results: list[tuple]) -> list[str]:
    """The issue's targets for refmount (zarr on the mount) against fsspec, and ncks at 80 ms."""
    out = []
    for link, file, name, (chunks, needed), results in all_results:
        rm, fs = results.get("zarr") or [], results.get("fsspec") or []
        if not rm or not fs:
            continue
        tile = name.startswith("tile")
        most, fastest = (1.5, 1.0) if tile else (1.25, 0.5)
        amp = median(rm, "bytes") / needed
        ratio = median(rm, "seconds") / median(fs, "seconds")
        ok = amp <= most and median(rm, "gets") <= median(fs, "gets") and ratio <= fastest
        out.append(f"{'met' if ok else 'MISSED'}: {link} {file} {name}: bytes {amp:.2f}x (<= {most}), GETs "
                   f"{median(rm, 'gets'):.0f} vs fsspec {median(fs, 'gets'):.0f}, "
                   f"time {ratio:.2f}x fsspec (<= {fastest})")
        nc = results.get("ncks") or []
        if nc and name == "point series" and link.startswith("80 ms"):
            t = median(nc, "seconds")
            out.append(f"{'met' if t <= 3 else 'MISSED'}: {link} {file} ncks point series {t:.2f} s (<= 3 s)")
    return out


def vz_python(given: str | None) -> str | None:
    candidates = [given] if given else ["/work/main/.venv-py3.13/bin/python"]
    for python in candidates:
        if python and Path(python).exists():
            ok = subprocess.run([python, "-c", "import virtualizarr, obstore, obspec_utils, zarr"],
                                capture_output=True).returncode == 0
            if ok:
                return python
    return None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the small-chunk file only")
    p.add_argument("--files", help="comma-separated: tas.nc, big.nc (default both, or tas.nc with --quick)")
    p.add_argument("--runs", type=int, default=3, help="runs per contender (default 3)")
    p.add_argument("--links", default="80:1000,20:100", help="RTT_MS:MBIT pairs (default 80:1000,20:100)")
    p.add_argument("--only", help="comma-separated readers: zarr, xarray, ncks, fsspec, virtualizarr")
    p.add_argument("--selections", help="comma-separated: point, tile, cube (default all)")
    p.add_argument("--refmount-options", default="", metavar="'OPTS'", help="extra options for every mount")
    p.add_argument("--baseline", type=Path, metavar="TREE", help="also run zarr and ncks on refmount's code from TREE")
    p.add_argument("--vz-python", help="a Python >= 3.12 with virtualizarr 2.8 and obstore")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/refmount-sparse"), help="generated inputs (kept)")
    p.add_argument("--out", type=Path, default=HERE / "out" / "sparse.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    import shlex

    if os.geteuid() != 0:
        sys.exit("bench_sparse.py needs root (network namespaces, FUSE mounts)")
    need_nfqueue()  # installs what is missing, as run-speed.sh does
    ensure_installed({"nginx": "nginx-light", "curl": "curl", "ncks": "nco", "fusermount3": "fuse3"})
    exit_on_signals()
    record = Record("sparse", args.quick)
    vz = vz_python(args.vz_python)
    if vz is None:
        log("VirtualiZarr 2.8 needs Python >= 3.12 with virtualizarr, obstore: none found (--vz-python), skipped")
    links = [tuple(float(v) for v in pair.split(":")) for pair in args.links.split(",")]
    files = args.files.split(",") if args.files else ["tas.nc"] if args.quick else list(FILES)
    wanted = args.selections.split(",") if args.selections else None
    selections = {k: v for k, v in SELECTIONS.items() if not wanted or k.split()[0] in wanted}
    args.workdir.mkdir(parents=True, exist_ok=True)
    sources = {}
    for name in files:
        c = FILES[name]
        sources[name] = generated(args.workdir / f"{name[:-3]}_{STEPS}x{SIDE}_{'x'.join(map(str, c))}.nc",
                                        lambda p, c=c: write_file(p, c))
    tag = str(os.getpid() % 100000)
    link = NfqLink(tag, os.getpid() % 250)
    all_results: list[tuple] = []
    with ExitStack() as stack:
        run_dir = Path(tempfile.mkdtemp(prefix="refmount-sparse-run."))
        serve = Path(tempfile.mkdtemp(prefix="refmount-sparse-data.", dir="/dev/shm"))
        stack.callback(shutil.rmtree, serve, ignore_errors=True)
        stack.callback(remove_scratch, run_dir)
        stack.callback(link.down)
        link.up()
        for name, path in sources.items():
            shutil.copyfile(path, serve / name)
        (serve / "big.bin").write_bytes(bytes(4096))  # (nginx's readiness probe, the connect-time check)
        serve.chmod(0o755)
        binary = build_nfqdelay(run_dir)
        url = stack.enter_context(nginx_in(link, serve, run_dir, access_log=run_dir / "access.log",
                                           log_format=BYTES_LOG))
        refs, kerchunked = {}, {}
        for name in files:
            kerchunked[name] = kerchunk_refs(sources[name], url + name)
            refs[name] = run_dir / f"{name}.json"
            refs[name].write_text(json.dumps(kerchunked[name]))
        bench = Sparse(run_dir, url, refs, sources, AccessLog(run_dir / "access.log"),
                       shlex.split(args.refmount_options), vz, args.baseline)
        names = [n for n in bench.contenders() if not args.only or n.split()[-1] in args.only.split(",")]
        for rtt, mbit in links:
            label = f"{rtt:g} ms / {mbit:g} Mbit/s"
            with ExitStack() as shaping:
                shaping.enter_context(nfq_delay(link, run_dir, binary, rtt, rate_mbit=mbit))
                link.queue(True)
                shaping.callback(link.queue, False)
                log(f"{label}: TCP connect p50 {connect_ms(url):.1f} ms")
                for file in files:
                    for sel_name, sel in selections.items():
                        need = needed_bytes(kerchunked[file], FILES[file], sel)
                        log(f"{label} {file} {sel_name}: {need[0]} chunks, {need[1]} bytes")
                        results = measure(bench, names, file, sel, oracle(sources[file], sel), args.runs)
                        all_results.append((label, file, sel_name, need, results))
    out = table(all_results, names)
    checks = verdicts(all_results)
    load = os.getloadavg()
    print(out)
    print()
    print("\n".join(checks))
    print(f"\n{args.runs} runs, contenders in turn; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} at the end "
          "(2 shared cores: noisy)")
    record.write(args.out, out, notes=checks + [f"{args.runs} runs, contenders in turn"], table=out, checks=checks,
                 runs=args.runs, results=[[a, b, c, list(d), e] for a, b, c, d, e in all_results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
