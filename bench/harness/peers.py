"""What refmount is measured against, in the same run: curl (the wire's limit), fsspec's
ReferenceFileSystem, kerchunk's scanners and rclone mount."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from harness import BENCH
from harness.mounts import Mount, unmount_if_mounted
from harness.system import STEP_TIMEOUT_S, log, stop, vmhwm_mib, wait_for



# -- kerchunk -----------------------------------------------------------------------------------------


def kerchunk_refs(local: Path, url: str) -> dict:
    """kerchunk's references of the local HDF5/netCDF-4 file `local`, pointing at `url`."""
    from kerchunk.hdf import SingleHdf5ToZarr

    with open(local, "rb") as f:
        return SingleHdf5ToZarr(f, url=url, inline_threshold=0).translate()


def chunk_keys(refs: dict) -> dict[str, int]:
    """Chunk keys (not metadata) and their lengths."""
    return {key: ref[2] for key, ref in refs["refs"].items()
            if isinstance(ref, list) and not key.rsplit("/", 1)[-1].startswith(".")}


# -- fsspec -------------------------------------------------------------------------------------------


def fsspec_cat_child(refs_path: str) -> None:
    """Runs in a fresh process: fsspec's cat of every chunk key over http; prints one JSON line."""
    from fsspec.implementations.reference import ReferenceFileSystem

    refs = json.loads(Path(refs_path).read_text())
    keys = list(chunk_keys(refs))
    fs = ReferenceFileSystem(fo=refs, remote_protocol="http")
    t0 = time.perf_counter()
    out = fs.cat(keys)
    seconds = time.perf_counter() - t0
    nbytes = sum(len(v) for v in out.values())
    print(json.dumps({"seconds": seconds, "bytes": nbytes, "peak_rss_mib": vmhwm_mib(os.getpid())}))


def fsspec_cat(refs_path: Path) -> dict:
    """fsspec's cat of every chunk key of `refs_path` in a fresh Python: {seconds, bytes, peak_rss_mib}."""
    code = f"import sys; sys.path.insert(0, {str(BENCH)!r}); from harness.peers import fsspec_cat_child; " \
           "fsspec_cat_child(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(refs_path)], capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"fsspec cat failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- curl ---------------------------------------------------------------------------------------------


def curl_whole(url: str) -> str:
    """A shell command: one GET of `url`, printing the bytes received."""
    return f"curl -s -o /dev/null -w '%{{size_download}}' {url}"


def curl_parallel(url: str, size: int, parts: int = 8) -> str:
    """A shell command: `parts` parallel ranged GETs of consecutive pieces of `url`, each printing its bytes."""
    part = -(-size // parts)
    ranges = [(k * part, min((k + 1) * part, size) - 1) for k in range(parts)]
    return " & ".join(f"curl -s -o /dev/null -w '%{{size_download}}\\n' -r {a}-{b} {url}"
                      for a, b in ranges) + " & wait"


# -- rclone -------------------------------------------------------------------------------------------


@contextmanager
def rclone_mounted(base_url: str, mnt: Path, visible: str, log_path: Path):
    """`rclone mount :http:` without VFS cache, as a foreground child (so we know its pid); yields a Mount
    (path, rclone's pid) once `visible` (a file under the url) shows in it."""
    mnt.mkdir(exist_ok=True)
    unmount_if_mounted(mnt)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(["rclone", "mount", ":http:", str(mnt), "--http-url", base_url, "--read-only",
                                 "--vfs-cache-mode", "off"], stdout=logf, stderr=logf)
    try:
        wait_for(lambda: proc.poll() is not None or (mnt / visible).exists(), "rclone mount", 30)
        if proc.poll() is not None:
            raise RuntimeError(f"rclone mount exited with status {proc.returncode}; see {log_path}")
        yield Mount(mnt, proc.pid)
    finally:
        unmount_if_mounted(mnt)  # rclone exits when unmounted; stop() only if it does not
        if proc.poll() is None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                stop(proc)


def kerchunk_scan(urls: list[str], threads: int) -> float:
    """Seconds for kerchunk's SingleHdf5ToZarr to scan every url over fsspec's HTTP, `threads` at once,
    in a fresh Python."""
    code = f"""
import time, fsspec
from concurrent.futures import ThreadPoolExecutor
from kerchunk.hdf import SingleHdf5ToZarr
urls = {urls!r}
def one(u):
    with fsspec.open(u, "rb") as f:
        return SingleHdf5ToZarr(f, u).translate()
t0 = time.monotonic()
with ThreadPoolExecutor({threads}) as pool:
    refs = list(pool.map(one, urls))
print(time.monotonic() - t0)
"""
    return float(snippet(code, f"kerchunk x{threads}", 1800)[-1])


def kerchunk_grib(urls: list[str], threads: int, idx: bool, first: str = "") -> float:
    """kerchunk on the GRIB files over fsspec's HTTP: scan_grib of every file, or its idx path (the
    mapping built from `first`, the first file's local copy: build_idx_grib_mapping over HTTP fails with
    fsspec 2026.9, "Reference-FS's target filesystem must have same value of asynchronous")."""
    code = f"""
import time, warnings, logging
warnings.simplefilter("ignore"); logging.disable(logging.CRITICAL)
import pandas as pd
from concurrent.futures import ThreadPoolExecutor
from kerchunk.grib2 import scan_grib, build_idx_grib_mapping, parse_grib_idx, map_from_index
urls = {urls!r}
t0 = time.monotonic()
if {idx!r}:
    try:
        mapping = build_idx_grib_mapping({first!r})
        print("mapping", time.monotonic() - t0)
    except ValueError as e:  # (see NOTES.md, issue 40: its datatrees come out empty here)
        print("mapping failed:", e, "- timing parse_grib_idx alone")
        mapping = None
    t0 = time.monotonic()
    def one(u):
        run = pd.to_datetime(u.rsplit("/", 1)[-1].split(".")[1], format="%Y%m%d%H")
        idx = parse_grib_idx(u)
        return idx if mapping is None else map_from_index(run, mapping, idx)
else:
    def one(u):
        return scan_grib(u)
with ThreadPoolExecutor({threads}) as pool:
    refs = list(pool.map(one, urls))
print(time.monotonic() - t0)
"""
    lines = snippet(code, "kerchunk grib", 3600)
    for line in lines[:-1]:
        log(f"kerchunk idx path: {line} s")
    return float(lines[-1])


def snippet(code: str, what: str, timeout: float) -> list[str]:
    """Run `code` in a fresh Python (a peer's imports and threads stay out of the bench); its output lines."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{what}: {done.stderr.strip()[-400:]}")
    return done.stdout.strip().splitlines()
