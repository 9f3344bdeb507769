"""Scale benchmarks: refmount against fsspec's ReferenceFileSystem on large reference sets.

    /tmp/v/bin/python bench/bench_scale.py [--quick] [--only NAME[,NAME]] [--runs N] [--workdir DIR]

NAME is one of: json_load, json_mount, gen, big_dir, parquet. Needs root (FUSE mounts, and
`echo 3 > /proc/sys/vm/drop_caches` before cold-cache timings). Inputs are generated once under --workdir
(default /tmp/refmount-bench) and reused. Every probe runs in a fresh child process (`--child PROBE ARGS`)
so its peak memory is its own: VmHWM of /proc/self/status, or the sampled PSS of it plus the worker
processes it forks, whichever is larger; for mounts the same over `refmount mount` and the daemon tree
while mounting, then the daemon's VmHWM/VmRSS from /proc/PID/status. Each probe runs 3 times (median; fewer if its runs exceed PROBE_BUDGET_S); --quick runs
once on smaller inputs. Input file names carry only their size: delete the work dir after changing a
generator. Prints one markdown table and writes it with the raw numbers to bench/out/scale.json.
MB here means 2**20 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.mounts import refmount_mounted as harness_mounted
from harness.record import Record
from harness.system import TreePeak, drop_caches, exit_on_signals, vmhwm_mib

PYTHON = sys.executable
HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "scale.json"
CHILD_TIMEOUT = 900
PROBE_BUDGET_S = 120  # stop repeating a probe once its runs so far took longer (keeps the full run < 10 min)

FULL = dict(json_arrays=10, json_chunks=100_000, gen_rows=1000, fsspec_gen_rows=2, dir_keys=1_000_000,
            pq_arrays=1000, pq_chunks=10_000, pq_reads=1000, pq_latency_arrays=20)
QUICK = dict(json_arrays=10, json_chunks=10_000, gen_rows=100, fsspec_gen_rows=2, dir_keys=100_000,
             pq_arrays=100, pq_chunks=10_000, pq_reads=300, pq_latency_arrays=20)
GEN_COLS = 1000  # the gen's fast dimension; fsspec's sample is fsspec_gen_rows x GEN_COLS keys


def human(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


# ---------------------------------------------------------------------------------------------------
# Input generators (run in the parent, once; each writes atomically and is skipped if present)
# ---------------------------------------------------------------------------------------------------

def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def dump_json(path: Path, obj) -> None:
    import orjson

    atomic_write(path, orjson.dumps(obj))


def zarray(shape, chunks, dtype="<f4") -> dict:
    return {"chunks": list(chunks), "compressor": {"id": "zlib", "level": 4}, "dtype": dtype,
            "fill_value": "NaN", "filters": None, "order": "C", "shape": list(shape), "zarr_format": 2}


def kerchunk_like_refs(arrays: int, chunks: int) -> dict:
    """A v1 set shaped like kerchunk's output for a netCDF archive with one file per time step:
    `arrays` 3-d arrays of `chunks` chunk keys each (grid chunks/100 x 10 x 10, so keys like
    `var3/123.4.5`); file t holds every array's chunks of time step t, laid out one after another."""
    import itertools

    rng = random.Random(1)
    grid, chunk_shape = (chunks // 100, 10, 10), (1, 72, 144)
    next_offset = [rng.randrange(20_000, 60_000) for _ in range(grid[0])]  # past the HDF5 metadata
    urls = [f"https://data.example.org/archive/v2/files/file_{t:05d}.nc" for t in range(grid[0])]
    refs = {".zgroup": json.dumps({"zarr_format": 2}),
            ".zattrs": json.dumps({"title": "Synthetic reanalysis", "Conventions": "CF-1.8",
                                   "history": "kerchunk-like benchmark input"})}
    for a in range(arrays):
        name = f"var{a}"
        refs[f"{name}/.zarray"] = json.dumps(zarray([g * c for g, c in zip(grid, chunk_shape)], chunk_shape))
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": ["time", "lat", "lon"], "units": "K",
                                              "long_name": f"variable number {a}", "scale_factor": 0.01})
        for idx in itertools.product(*map(range, grid)):
            t, length = idx[0], rng.randrange(200_000, 4_000_000)
            refs[f"{name}/{'.'.join(map(str, idx))}"] = [urls[t], next_offset[t], length]
            next_offset[t] += length + rng.randrange(0, 4096)
    return {"version": 1, "refs": refs}


def write_kerchunk_json(path: Path, refs: dict) -> None:
    """As kerchunk writes it (ujson): ", " and ": " separators, "/" escaped as "\\/" (NOTES §1)."""
    atomic_write(path, json.dumps(refs).replace("/", "\\/").encode())


def gen_refs(rows: int) -> dict:
    dims = {"i": {"start": 0, "stop": rows, "step": 1}, "j": {"start": 0, "stop": GEN_COLS, "step": 1}}
    return {"version": 1, "refs": {}, "gen": [{
        "key": "data/{{i}}.{{j}}", "url": "https://h/f_{{i}}.nc",
        "offset": "{{(i*%d+j)*4096}}" % GEN_COLS, "length": "4096", "dimensions": dims}]}


def big_dir_refs(n: int, blob: Path) -> dict:
    url = f"file://{blob}"
    return {"version": 1, "refs": {f"big/{i}": [url, i * 4096, 4096] for i in range(n)}}


def write_parquet_refs(root: Path, arrays: int, chunks: int, blobs: list[Path], blob_size: int) -> None:
    """fsspec LazyReferenceMapper layout: .zmetadata + <array>/refs.0.parq (record_size = chunks)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = root.with_name(root.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    grid, chunk_shape = (chunks // 100, 100), (50, 50)
    meta = {".zgroup": {"zarr_format": 2}, ".zattrs": {"title": "parquet benchmark"}}
    rng = np.random.default_rng(2)
    dictionary = pa.array([str(b) for b in blobs])
    for a in range(arrays):
        name = f"var{a:04d}"
        meta[f"{name}/.zarray"] = zarray([g * c for g, c in zip(grid, chunk_shape)], chunk_shape)
        meta[f"{name}/.zattrs"] = {"_ARRAY_DIMENSIONS": ["y", "x"], "units": "m"}
        size = rng.integers(2_000, 10_000, chunks)
        table = pa.table({
            "path": pa.DictionaryArray.from_arrays(pa.array(rng.integers(0, len(blobs), chunks, dtype="int32")),
                                                   dictionary),
            "offset": pa.array(rng.integers(0, blob_size - 10_000, chunks)),
            "size": pa.array(size),
            "raw": pa.nulls(chunks, pa.binary()),
        })
        (tmp / name).mkdir(exist_ok=True)
        pq.write_table(table, tmp / name / "refs.0.parq", compression="zstd")
    dump_json(tmp / ".zmetadata", {"metadata": meta, "record_size": chunks})
    tmp.rename(root)


@dataclass
class Inputs:
    json_path: Path
    json_keys: int
    json_check_key: str
    gen_path: Path
    gen_keys: int
    fsspec_gen_path: Path
    fsspec_gen_keys: int
    dir_path: Path
    dir_keys: int
    pq_root: Path
    pq_keys: int


def ensure_inputs(work: Path, sizes: dict, wanted: set[str]) -> Inputs:
    work.mkdir(parents=True, exist_ok=True)
    arrays, chunks = sizes["json_arrays"], sizes["json_chunks"]
    rows, frows, dirn = sizes["gen_rows"], sizes["fsspec_gen_rows"], sizes["dir_keys"]
    pq_arrays, pq_chunks = sizes["pq_arrays"], sizes["pq_chunks"]
    inputs = Inputs(
        json_path=work / f"kerchunk_{human(arrays * chunks)}.json", json_keys=arrays * chunks + 2 * arrays + 2,
        json_check_key=f"var{arrays - 1}/{chunks // 100 - 1}.9.9",
        gen_path=work / f"gen_{human(rows * GEN_COLS)}.json", gen_keys=rows * GEN_COLS,
        fsspec_gen_path=work / f"gen_{human(frows * GEN_COLS)}.json", fsspec_gen_keys=frows * GEN_COLS,
        dir_path=work / f"bigdir_{human(dirn)}.json", dir_keys=dirn,
        pq_root=work / f"parquet_{human(pq_arrays * pq_chunks)}", pq_keys=pq_arrays * pq_chunks)
    blob = work / "bigdir_blob.bin"
    jobs = {
        "json": (inputs.json_path, lambda p: write_kerchunk_json(p, kerchunk_like_refs(arrays, chunks))),
        "gen": (inputs.gen_path, lambda p: dump_json(p, gen_refs(rows))),
        "fsspec_gen": (inputs.fsspec_gen_path, lambda p: dump_json(p, gen_refs(frows))),
        "dir": (inputs.dir_path, lambda p: dump_json(p, big_dir_refs(dirn, blob))),
        "parquet": (inputs.pq_root, lambda p: write_parquet_refs(p, pq_arrays, pq_chunks, *parquet_blobs(work))),
    }
    needs = {"json_load": ["json"], "json_mount": ["json"], "gen": ["gen", "fsspec_gen"], "big_dir": ["dir"],
             "parquet": ["parquet"]}
    for job in sorted({j for name in wanted for j in needs[name]}):
        path, make = jobs[job]
        if not path.exists():
            t0 = time.perf_counter()
            make(path)
            print(f"# generated {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if "big_dir" in wanted and (not blob.exists() or blob.stat().st_size < dirn * 4096):
        with open(blob, "wb") as f:  # sparse: only sizes matter for listing
            f.truncate(dirn * 4096)
    return inputs


def parquet_blobs(work: Path, count: int = 4, size: int = 32 << 20) -> tuple[list[Path], int]:
    """Local data files the Parquet references point into (random bytes, so reads are real)."""
    blobs = [work / f"pq_blob_{i}.bin" for i in range(count)]
    for b in blobs:
        if not b.exists() or b.stat().st_size != size:
            atomic_write(b, os.urandom(size))
    return blobs, size


def parquet_sample(arrays: int, chunks: int, reads: int, latency_arrays: int) -> tuple[list[str], list[str]]:
    """(keys of `reads` random chunks, one key in each of `latency_arrays` distinct arrays)."""
    rng = random.Random(7)
    cols = 100

    def key(a: int, n: int) -> str:
        return f"var{a:04d}/{n // cols}.{n % cols}"

    reads_keys = [key(rng.randrange(arrays), rng.randrange(chunks)) for _ in range(reads)]
    latency_keys = [key(a, rng.randrange(chunks)) for a in rng.sample(range(arrays), min(latency_arrays, arrays))]
    return reads_keys, latency_keys


# ---------------------------------------------------------------------------------------------------
# Child probes: each runs in its own process and returns a dict of numbers
# ---------------------------------------------------------------------------------------------------

def peak_rss_mb() -> float:
    """This process's peak RSS. VmHWM rather than ru_maxrss: Linux carries ru_maxrss across fork+exec, so a
    child's ru_maxrss starts at the parent's RSS (the parent holds the generated inputs)."""
    return vmhwm_mib(os.getpid())


def daemon_mb(m) -> dict:
    hwm = m.peak_rss_mib()
    return {"daemon_vmhwm_mb": hwm, "daemon_vmrss_mb": m.rss_mib(), "mount_tree_peak_mb": m.mount_tree_peak_mib,
            "daemon_peak_mb": max(hwm, m.mount_tree_peak_mib)}


def refmount_mounted(refs: str, mnt: str, *options: str):
    """A raw-view mount, the PSS of the mount's process tree sampled while it mounts."""
    return harness_mounted(refs, Path(mnt), ["--view", "raw", *options], tree_peak=True)


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - t0


def shell_timed(command: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    out = subprocess.run(["bash", "-c", command], check=True, capture_output=True, text=True).stdout
    return out.strip(), time.perf_counter() - t0


def probe_refmount_load(path: str, expect_keys: int, check_key: str) -> dict:
    from refmount.refs import load_refs

    baseline = peak_rss_mb()
    with TreePeak(include_self=True) as tree:
        refset, seconds = timed(load_refs, path)
    assert len(refset) == expect_keys, (len(refset), expect_keys)
    assert refset.find(check_key) >= 0, check_key
    return {"seconds": seconds, **peaks(tree), "baseline_rss_mb": baseline, "keys": len(refset)}


def probe_fsspec_load(path: str, expect_keys: int, check_key: str, simple_templates: bool = True) -> dict:
    from fsspec.implementations.reference import ReferenceFileSystem

    baseline = peak_rss_mb()
    with TreePeak(include_self=True) as tree:
        fs, seconds = timed(ReferenceFileSystem, fo=path, simple_templates=simple_templates)
    refs = fs.references
    assert len(refs) == expect_keys, (len(refs), expect_keys)
    assert isinstance(refs[check_key], list) and refs[check_key][0].startswith("http"), refs[check_key]
    return {"seconds": seconds, **peaks(tree), "baseline_rss_mb": baseline, "keys": len(refs)}


def peaks(tree: TreePeak) -> dict:
    """peak_mb: the larger of this process's VmHWM and the sampled PSS of it plus its workers."""
    self_hwm = peak_rss_mb()
    return {"peak_mb": max(self_hwm, tree.peak_mb), "peak_rss_mb": self_hwm, "tree_peak_pss_mb": tree.peak_mb}


def probe_refmount_mount(path: str, mnt: str) -> dict:
    with refmount_mounted(path, mnt) as m:
        return {"mount_s": m.seconds, **daemon_mb(m)}


def probe_refmount_big_dir(path: str, mnt: str) -> dict:
    with refmount_mounted(path, mnt) as m:
        big = shlex.quote(f"{mnt}/big")
        drop_caches()
        _, ls_l = shell_timed(f"ls -l {big} > /dev/null")
        count_f, ls_f = shell_timed(f"ls -f {big} | wc -l")
        count_find, find = shell_timed(f"find {shlex.quote(mnt)} -type f | wc -l")
        return {"mount_s": m.seconds, "ls_l_s": ls_l, "ls_f_s": ls_f, "ls_f_count": int(count_f),
                "find_s": find, "find_count": int(count_find), **daemon_mb(m)}


def read_file(path: str) -> int:
    with open(path, "rb") as f:
        return len(f.read())


def probe_refmount_parquet(root: str, mnt: str, reads: list[str], latency: list[str], options=()) -> dict:
    """Mount (warm), then with a cold page cache: one first read in each of `latency` arrays, then `reads`."""
    with refmount_mounted(root, mnt, *options) as m:
        after_mount = daemon_mb(m)
        drop_caches()
        latencies = [timed(read_file, f"{mnt}/{k}")[1] for k in latency]
        nbytes, reads_s = timed(lambda: sum(read_file(f"{mnt}/{k}") for k in reads))
        assert nbytes >= 2_000 * len(reads), nbytes
        after = daemon_mb(m)
        return {"mount_s": m.seconds, "rss_after_mount_mb": after_mount["daemon_vmrss_mb"],
                "rss_after_reads_mb": after["daemon_vmrss_mb"], "hwm_after_reads_mb": after["daemon_vmhwm_mb"],
                "first_read_ms": statistics.median(latencies) * 1000, "first_read_max_ms": max(latencies) * 1000,
                "first_read_first_ms": latencies[0] * 1000, "reads_s": reads_s,
                "open_and_reads_s": m.seconds + reads_s, "bytes": nbytes}


def probe_fsspec_parquet(root: str, reads: list[str]) -> dict:
    """Open (imports included, as refmount's mount time includes its start-up), then cat with a cold cache."""
    t0 = time.perf_counter()
    from fsspec.implementations.reference import ReferenceFileSystem

    fs = ReferenceFileSystem(fo=root, remote_protocol="file")
    open_s = time.perf_counter() - t0
    drop_caches()
    nbytes, cat_s = timed(lambda: sum(len(fs.cat_file(k)) for k in reads))
    assert nbytes >= 2_000 * len(reads), nbytes
    return {"open_s": open_s, "cat_s": cat_s, "open_and_reads_s": open_s + cat_s, "bytes": nbytes,
            "peak_rss_mb": peak_rss_mb()}


PROBES = {f.__name__.removeprefix("probe_"): f for f in (
    probe_refmount_load, probe_fsspec_load, probe_refmount_mount, probe_refmount_big_dir,
    probe_refmount_parquet, probe_fsspec_parquet)}


def child_main(name: str, kwargs_json: str) -> None:
    result = PROBES[name](**json.loads(kwargs_json))
    print(json.dumps(result))


# ---------------------------------------------------------------------------------------------------
# Parent: run probes in children, take medians, build table rows
# ---------------------------------------------------------------------------------------------------

class ProbeError(RuntimeError):
    pass


@dataclass
class Result:
    median: dict
    runs: list[dict]


class Runner:
    def __init__(self, runs: int) -> None:
        self.runs = runs
        self.cache: dict[str, Result] = {}

    def run_once(self, name: str, kwargs: dict) -> dict:
        cmd = [PYTHON, __file__, "--child", name, json.dumps(kwargs)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ProbeError(f"{name} timed out after {CHILD_TIMEOUT} s") from None
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise ProbeError(f"{name}: {tail[0]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def probes(self, *probes: tuple[str, dict]) -> list[Result]:
        """Run each probe `runs` times, interleaved (a, b, a, b, ...) so that drift on a shared machine
        weighs on every contender alike; a probe run before is not run again."""
        keys = [json.dumps([name, kwargs], sort_keys=True) for name, kwargs in probes]
        todo = [(key, name, kwargs) for key, (name, kwargs) in zip(keys, probes) if key not in self.cache]
        runs: dict[str, list] = {key: [] for key, _, _ in todo}
        started = time.perf_counter()
        for i in range(self.runs if todo else 0):
            for key, name, kwargs in todo:
                t0 = time.perf_counter()
                runs[key].append(self.run_once(name, kwargs))
                print(f"# {name} run {i + 1}/{self.runs}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            if time.perf_counter() - started > PROBE_BUDGET_S * len(todo):
                break
        for key, _, _ in todo:
            done = runs[key]
            self.cache[key] = Result({k: statistics.median(r[k] for r in done) for k in done[0]}, done)
        return [self.cache[key] for key in keys]

    def probe(self, name: str, **kwargs) -> Result:
        return self.probes((name, kwargs))[0]

    def raw(self) -> list[dict]:
        def brief(value):
            return f"<{len(value)} keys>" if isinstance(value, list) else value

        out = []
        for key, result in self.cache.items():
            name, kwargs = json.loads(key)
            out.append({"probe": name, "args": {k: brief(v) for k, v in kwargs.items()}, **asdict(result)})
        return out


OPS = {"<=": (lambda v, lim: v <= lim, "≤"), ">=": (lambda v, lim: v >= lim, "≥"), "==": (lambda v, lim: v == lim, "=")}


@dataclass
class Check:
    label: str  # which issue the target comes from, e.g. "#2"
    subject: str  # "ratio" (refmount/fsspec) or "refmount"
    op: str
    limit: float

    def text(self, unit: str) -> str:
        limit = f"{self.limit:,.0f}" if unit == "files" else f"{self.limit:g}"
        tail = "" if self.subject == "ratio" else f" {unit}"
        label = f" ({self.label})" if self.label else ""
        return f"{self.subject} {OPS[self.op][1]} {limit}{tail}{label}"

    def passed(self, row: Row) -> bool | None:
        value = row.ratio if self.subject == "ratio" else row.refmount
        return None if value is None else OPS[self.op][0](value, self.limit)


@dataclass
class Row:
    name: str
    unit: str
    refmount: float | None
    fsspec: float | None = None
    checks: list[Check] = field(default_factory=list)
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.refmount is None or not self.fsspec:
            return None
        return self.refmount / self.fsspec

    def cells(self) -> list[str]:
        def fmt(v):
            if v is None:
                return "—"
            if self.unit == "files":
                return f"{v:,.0f}"
            digits = 0 if self.unit == "MB" else 2 if v >= 10 else 3
            return f"{v:.{digits}f} {self.unit}"

        ref = self.note if self.refmount is None and self.note else fmt(self.refmount)
        if self.refmount is not None and self.note:
            ref += f" ({self.note})"
        ratio = "—" if self.ratio is None else f"{self.ratio:.4f}" if self.ratio < 0.01 else f"{self.ratio:.3f}"
        target = "; ".join(c.text(self.unit) for c in self.checks) or "—"
        verdicts = [(c.label, c.passed(self)) for c in self.checks]
        verdict = ", ".join(f"{lab} {'n/a' if ok is None else 'pass' if ok else 'FAIL'}".strip()
                            for lab, ok in verdicts)
        cells = [self.name, ref, fmt(self.fsspec), ratio, target, verdict or "—"]
        return [c.replace("|", "\\|") for c in cells]

    def to_json(self) -> dict:
        return {"measurement": self.name, "unit": self.unit, "refmount": self.refmount, "fsspec": self.fsspec,
                "ratio": self.ratio, "note": self.note, "targets": [
                    {**asdict(c), "passed": c.passed(self)} for c in self.checks]}


def half_and_third(subject: str = "ratio") -> list[Check]:
    return [Check("#2", subject, "<=", 0.5), Check("#4", subject, "<=", 0.35)]


# --- measurements: each returns table rows ------------------------------------------------------------

@dataclass
class Context:
    runner: Runner
    inputs: Inputs
    sizes: dict
    mnt: str


def fsspec_json_load(ctx: Context) -> Result:
    i = ctx.inputs
    return ctx.runner.probe("fsspec_load", path=str(i.json_path), expect_keys=i.json_keys,
                            check_key=i.json_check_key)


def measure_json_load(ctx: Context) -> list[Row]:
    i = ctx.inputs
    size = f"{human(i.json_keys - 2 - 2 * ctx.sizes['json_arrays'])} refs, {i.json_path.stat().st_size / 1e6:.0f} MB"
    args = dict(path=str(i.json_path), expect_keys=i.json_keys, check_key=i.json_check_key)
    ours, theirs = (r.median for r in ctx.runner.probes(("refmount_load", args), ("fsspec_load", args)))
    return [Row(f"JSON load ({size}): time", "s", ours["seconds"], theirs["seconds"], half_and_third()),
            Row(f"JSON load ({size}): peak memory", "MB", ours["peak_mb"], theirs["peak_mb"], half_and_third())]


def measure_json_mount(ctx: Context) -> list[Row]:
    i = ctx.inputs
    ours = ctx.runner.probe("refmount_mount", path=str(i.json_path), mnt=ctx.mnt).median
    theirs = fsspec_json_load(ctx).median
    n = human(i.json_keys - 2 - 2 * ctx.sizes["json_arrays"])
    return [Row(f"mount {n} JSON until ready (fsspec: load)", "s", ours["mount_s"], theirs["seconds"]),
            Row(f"mount {n} JSON: peak memory, daemon + workers (fsspec: load peak)", "MB", ours["daemon_peak_mb"],
                theirs["peak_mb"], note=f"VmRSS after mount {ours['daemon_vmrss_mb']:.0f} MB")]


def measure_gen(ctx: Context) -> list[Row]:
    i = ctx.inputs
    check = "data/1.999"
    ours = ctx.runner.probe("refmount_load", path=str(i.gen_path), expect_keys=i.gen_keys, check_key=check).median
    theirs = ctx.runner.probe("fsspec_load", path=str(i.fsspec_gen_path), expect_keys=i.fsspec_gen_keys,
                              check_key=check, simple_templates=False).median
    ours_per_key, theirs_per_key = ours["seconds"] / i.gen_keys, theirs["seconds"] / i.fsspec_gen_keys
    note = "" if i.gen_keys == 1_000_000 else f"extrapolated from {human(i.gen_keys)}"
    return [Row(f"gen: per-key time (refmount {human(i.gen_keys)} keys, fsspec {human(i.fsspec_gen_keys)})", "µs",
                ours_per_key * 1e6, theirs_per_key * 1e6, [Check("#2", "ratio", "<=", 0.01)]),
            Row("gen: time to expand 1M keys (fsspec extrapolated)", "s", ours_per_key * 1e6,
                theirs_per_key * 1e6, [Check("#4", "refmount", "<=", 3)], note),
            Row(f"gen: peak memory (refmount {human(i.gen_keys)} keys)", "MB", ours["peak_mb"])]


def measure_big_dir(ctx: Context) -> list[Row]:
    i = ctx.inputs
    r = ctx.runner.probe("refmount_big_dir", path=str(i.dir_path), mnt=ctx.mnt).median
    n = human(i.dir_keys)
    return [Row(f"ls -l of a {n}-entry directory (cold cache)", "s", r["ls_l_s"],
                checks=[Check("#4", "refmount", "<=", 3)]),
            Row(f"ls -f {n} dir | wc -l", "files", r["ls_f_count"], checks=[Check("", "refmount", "==", i.dir_keys)],
                note=f"{r['ls_f_s']:.2f} s"),
            Row(f"find -type f | wc -l ({n} files)", "files", r["find_count"],
                checks=[Check("", "refmount", "==", i.dir_keys)], note=f"{r['find_s']:.2f} s"),
            Row(f"mount {n}-entry directory set: mount time, peak memory", "s", r["mount_s"],
                note=f"peak {r['daemon_peak_mb']:.0f} MB")]


def parquet_available() -> str | None:
    """None if refmount can load Parquet reference sets, else why not."""
    import importlib.util

    try:
        if importlib.util.find_spec("refmount.refs.parquet") is None:
            return "refmount/refs/parquet.py does not exist yet"
    except ImportError as e:
        return f"cannot import refmount.refs.parquet: {e}"
    return None


SMALL_CACHE = ("--cache-size", "8M")  # isolates the reference layer's memory from the block cache


def measure_parquet(ctx: Context) -> list[Row]:
    i, s = ctx.inputs, ctx.sizes
    n = human(i.pq_keys)
    reads, latency = parquet_sample(s["pq_arrays"], s["pq_chunks"], s["pq_reads"], s["pq_latency_arrays"])
    theirs = ctx.runner.probe("fsspec_parquet", root=str(i.pq_root), reads=reads).median
    fsspec_row = Row(f"Parquet {n}: open + read {len(reads):,} random chunks (cold cache)", "s", None,
                     theirs["open_and_reads_s"])
    why = parquet_available()
    if why is None:
        try:
            ours, small = (ctx.runner.probe("refmount_parquet", root=str(i.pq_root), mnt=ctx.mnt, reads=reads,
                                            latency=latency, options=list(options)).median
                           for options in ((), SMALL_CACHE))
        except ProbeError as e:
            why = str(e)
    if why is not None:
        fsspec_row.note = f"not available: {why}"
        return [fsspec_row]
    fsspec_row.refmount = ours["open_and_reads_s"]
    fsspec_row.note = f"mount {ours['mount_s']:.2f} s + reads {ours['reads_s']:.2f} s"
    limit_mb = [Check("#4", "refmount", "<=", 200)]
    after = f"after {len(reads):,} random reads"
    return [Row(f"Parquet {n}: mount until ready", "s", ours["mount_s"], checks=[Check("#4", "refmount", "<=", 1)]),
            Row(f"Parquet {n}: daemon VmRSS after mount", "MB", ours["rss_after_mount_mb"], checks=limit_mb),
            Row(f"Parquet {n}: daemon VmRSS {after} (fsspec: peak RSS)", "MB", ours["rss_after_reads_mb"],
                theirs["peak_rss_mb"], limit_mb, f"VmHWM {ours['hwm_after_reads_mb']:.0f} MB"),
            Row(f"Parquet {n}: daemon VmRSS {after}, {' '.join(SMALL_CACHE)}", "MB", small["rss_after_reads_mb"],
                theirs["peak_rss_mb"], limit_mb),
            Row(f"Parquet {n}: first read in an unloaded record file (median of {len(latency)} arrays)", "ms",
                ours["first_read_ms"], checks=[Check("#4", "refmount", "<=", 100)],
                note=f"very first {ours['first_read_first_ms']:.0f} ms"),
            fsspec_row]


MEASUREMENTS = {"json_load": measure_json_load, "json_mount": measure_json_mount, "gen": measure_gen,
                "big_dir": measure_big_dir, "parquet": measure_parquet}


def markdown(rows: list[Row]) -> str:
    header = ["measurement", "refmount", "fsspec", "ratio (refmount/fsspec)", "target", "pass/fail"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 run, smaller inputs (< 2 min)")
    p.add_argument("--only", help="comma-separated measurements: " + ", ".join(MEASUREMENTS))
    p.add_argument("--runs", type=int, help="runs per probe (default 3, or 1 with --quick)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/refmount-bench"))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else list(MEASUREMENTS)
    unknown = [n for n in names if n not in MEASUREMENTS]
    if unknown:
        p.error(f"unknown measurement(s) {', '.join(unknown)}; choose from {', '.join(MEASUREMENTS)}")
    args.names = names
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("bench_scale.py needs root (FUSE mounts and drop_caches)")
    started = time.perf_counter()
    exit_on_signals()  # (the probes' mounts are unmounted on SIGTERM too)
    record = Record("scale", args.quick)
    sizes = QUICK if args.quick else FULL
    inputs = ensure_inputs(args.workdir, sizes, set(args.names))
    ctx = Context(Runner(args.runs or (1 if args.quick else 3)), inputs, sizes, str(args.workdir / "mnt"))
    rows: list[Row] = []
    for name in args.names:
        try:
            rows += MEASUREMENTS[name](ctx)
        except ProbeError as e:
            rows.append(Row(name, "s", None, note=f"error: {e}"))
    table = markdown(rows)
    runtime = time.perf_counter() - started
    print(table)
    print(f"\n{'quick' if args.quick else 'full'} run, {ctx.runner.runs} run(s) per probe, {runtime:.0f} s")
    record.write(args.out, table, runs=ctx.runner.runs, sizes=sizes, runtime_s=runtime, table_markdown=table,
                 rows=[r.to_json() for r in rows], raw=ctx.runner.raw())
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
