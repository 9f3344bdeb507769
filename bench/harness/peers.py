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

from harness.mounts import unmount_if_mounted
from harness.system import STEP_TIMEOUT_S, stop, vmhwm_mib, wait_for

BENCH = Path(__file__).resolve().parent.parent


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
    """`rclone mount :http:` without VFS cache, as a foreground child (so we know its pid); yields the
    process once `visible` (a file under the url) shows in the mount."""
    mnt.mkdir(exist_ok=True)
    unmount_if_mounted(mnt)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(["rclone", "mount", ":http:", str(mnt), "--http-url", base_url, "--read-only",
                                 "--vfs-cache-mode", "off"], stdout=logf, stderr=logf)
    try:
        wait_for(lambda: proc.poll() is not None or (mnt / visible).exists(), "rclone mount", 30)
        if proc.poll() is not None:
            raise RuntimeError(f"rclone mount exited with status {proc.returncode}; see {log_path}")
        yield proc
    finally:
        unmount_if_mounted(mnt)  # rclone exits when unmounted; stop() only if it does not
        if proc.poll() is None:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                stop(proc)
