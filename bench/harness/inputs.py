"""Generated inputs: made once under a work dir (atomically: a killed bench leaves no half file)."""

from __future__ import annotations

import time
from pathlib import Path

from harness.system import log


def generated(path: Path, make) -> Path:
    """`path`, made by `make(tmp_path)` first if it does not exist yet."""
    if not path.exists():
        tmp = path.with_name(path.name + ".tmp")
        t0 = time.perf_counter()
        make(tmp)
        tmp.rename(path)
        log(f"generated {path} in {time.perf_counter() - t0:.1f} s")
    return path


def write_big(path: Path, size: int) -> None:
    """`size` seeded random bytes."""
    import numpy as np

    rng = np.random.default_rng(1)
    with open(path, "wb") as f:
        for start in range(0, size, 16 << 20):
            f.write(rng.bytes(min(16 << 20, size - start)))


def write_netcdf(path: Path, steps: int, side: int, zlib: bool) -> None:
    """One float32 variable `air(time, lat, lon)`, one chunk per time step. Smooth field plus noise rounded
    to 0.1 K, so zlib has something to do (about 3:1) without being trivial."""
    import netCDF4
    import numpy as np

    rng = np.random.default_rng(2)
    y, x = np.mgrid[0:side, 0:side]
    base = (280 + 20 * np.sin(y / 80) * np.cos(x / 60)).astype("f4")
    with netCDF4.Dataset(path, "w") as ds:
        for name, n in (("time", steps), ("lat", side), ("lon", side)):
            ds.createDimension(name, n)
        var = ds.createVariable("air", "f4", ("time", "lat", "lon"), chunksizes=(1, side, side),
                                zlib=zlib, complevel=4 if zlib else None, shuffle=False)
        var.units = "K"
        for t in range(steps):
            var[t] = np.round(base + rng.normal(0, 1, base.shape).astype("f4"), 1)


def big_file(workdir: Path, mb: int) -> Path:
    """The random file of `mb` MB (10**6 bytes) that the throughput benches read."""
    workdir.mkdir(parents=True, exist_ok=True)
    return generated(workdir / f"big_{mb}MB.bin", lambda p: write_big(p, mb * 1_000_000))


def chunks_file(workdir: Path, steps: int, side: int = 400, zlib: bool = False) -> Path:
    """The netCDF-4 file of `steps` chunks (uncompressed: 640 kB each at 400 x 400)."""
    workdir.mkdir(parents=True, exist_ok=True)
    stem = "zlib" if zlib else "chunks"
    return generated(workdir / f"{stem}_{steps}.nc", lambda p: write_netcdf(p, steps, side, zlib=zlib))
