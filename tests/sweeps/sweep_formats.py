"""Sweep of FITS, HDF4 and zipped-Zarr files refmount has never seen (issue 40): each file mounted (one
glob mount per format, raw view), read with xarray on the mount, compared with the format's own
library on the file (astropy, pyhdf, zarr). Each variable is classified: identical, hidden (named in
one log line), WRONG (values or dtype differ) or error (a read fails). Prints one table row a file.

    python -m tests.sweeps.sweep_formats fits|hdf4 --out /tmp/x  [--files DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.conftest import Mount  # noqa: E402

warnings.simplefilter("ignore")


def _equal(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if want.dtype.kind == "f" or got.dtype.kind == "f":
        return bool(np.array_equal(got.astype("f8"), want.astype("f8"), equal_nan=True))
    return bool(np.array_equal(got, want))


def fits_oracle(path: Path):
    """{name refmount gives the HDU: physical values astropy gives, or None for a non-image HDU}"""
    from astropy.io import fits

    from refmount.refs.scan.fits import hdu_name

    out, taken = {}, set()
    with fits.open(path) as hdus:
        for index, h in enumerate(hdus):
            image = h.is_image and not isinstance(h, fits.GroupsHDU)  # (a tile-compressed image too)
            if image and h.header.get("NAXIS", 0) == 0:
                continue
            name = hdu_name(h, index, taken)
            if image:
                taken.add(name)
            try:
                out[name] = np.array(h.data) if image else None
            except Exception as e:  # noqa: BLE001
                out[name] = e
    return out


def hdf4_oracle(path: Path):
    from pyhdf.SD import SD, SDC

    out = {}
    sd = SD(str(path), SDC.READ)
    for name in sd.datasets():
        sds = sd.select(name)
        try:
            out[name] = np.array(sds.get())
        except Exception as e:  # noqa: BLE001
            out[name] = e
        attrs = sds.attributes()
        out[name] = (out[name], attrs)
    sd.end()
    return out


def sweep(kind: str, files: list[Path], out: Path) -> list[tuple]:
    import xarray as xr

    data = out / f"{kind}-data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    suffix = ".fits" if kind == "fits" else ".hdf"
    for p in files:
        shutil.copy(p, data / (p.stem + suffix))
    env = dict(os.environ, XDG_CACHE_HOME=str(out / f"{kind}-xdg"))
    m = Mount(f"{data}/*{suffix}", out / f"{kind}-mnt", ["--view", "raw"], env=env).start(timeout=300)
    rows = []
    try:
        for p in sorted(data.iterdir()):
            try:
                listed = sorted(n for n in os.listdir(m.path / p.name) if not n.startswith("."))
            except OSError as e:
                rows.append((p.name, "-", "error", f"listing: {e}"))
                continue
            log = m.log()
            try:
                want = fits_oracle(p) if kind == "fits" else hdf4_oracle(p)
            except Exception as e:  # noqa: BLE001
                rows.append((p.name, "-", "oracle fails", repr(e)[:80]))
                want = {}
            try:
                ds = xr.open_zarr(m.path / p.name, consolidated=True, decode_times=False) if listed else None
            except Exception as e:  # noqa: BLE001
                rows.append((p.name, "*", "error", f"open: {e!r}"[:100]))
                continue
            for name, value in want.items():
                attrs = None
                if kind == "hdf4":
                    value, attrs = value
                said = [line for line in log.splitlines() if f"/{p.name}: " in line and f" {name}: " in line
                        or f"/{p.name}: {name}: " in line]
                if ds is None or name not in ds:
                    if said:
                        rows.append((p.name, name, "hidden", said[0].split(f"{name}: ", 1)[-1][:90]))
                    elif name.startswith("fakeDim") and "(the SD interface's fakeDim variables)" in log:
                        rows.append((p.name, name, "hidden", "a DFSD dataset's dimension scale (its Data-Set line)"))
                    elif isinstance(value, Exception):
                        rows.append((p.name, name, "hidden (oracle fails too)", repr(value)[:80]))
                    else:
                        rows.append((p.name, name, "MISSING", "not in the mount and not said"))
                    continue
                if value is None:
                    rows.append((p.name, name, "WRONG", "a non-image HDU given as an array"))
                    continue
                try:
                    got = ds[name].values
                except Exception as e:  # noqa: BLE001
                    rows.append((p.name, name, "error", repr(e)[:90]))
                    continue
                if isinstance(value, Exception) and got.size == 0:
                    rows.append((p.name, name, "identical", f"empty {got.shape}; the oracle fails: {value!r}"[:90]))
                elif isinstance(value, Exception):
                    rows.append((p.name, name, "mount reads, oracle fails", repr(value)[:80]))
                elif kind == "hdf4":
                    # pyhdf gives stored values; xarray decodes CF attributes: compare both ways
                    with xr.open_zarr(m.path / p.name, consolidated=True, mask_and_scale=False,
                                      decode_times=False, concat_characters=False) as raw:
                        stored = raw[name].values
                    if not _equal(stored, value) or (value.dtype.kind != "U" and stored.dtype.newbyteorder("=") != value.dtype.newbyteorder("=")):
                        rows.append((p.name, name, "WRONG", f"stored {stored.dtype}{stored.shape} vs pyhdf {value.dtype}{value.shape}: {stored.ravel()[:4]} / {value.ravel()[:4]}"))
                    else:
                        rows.append((p.name, name, "identical", f"{value.dtype}{value.shape}"))
                elif _equal(got, value):
                    rows.append((p.name, name, "identical", f"{value.dtype}{value.shape}"))
                elif got.shape == value.shape and np.allclose(got.astype("f8"), value.astype("f8"), rtol=1e-6, equal_nan=True):
                    rows.append((p.name, name, "identical(f32 rounding)", f"{value.dtype}{value.shape} vs {got.dtype}"))
                else:
                    rows.append((p.name, name, "WRONG", f"{got.dtype}{got.shape} {got.ravel()[:3]} vs astropy {value.dtype}{value.shape} {value.ravel()[:3]}"))
            if ds is not None:
                for extra in set(ds.data_vars) - set(want):
                    rows.append((p.name, extra, "extra", "an array the oracle does not list"))
                ds.close()
    finally:
        m.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["fits", "hdf4"])
    ap.add_argument("--files", action="append", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    files = [p for d in a.files for p in sorted(Path(d).rglob("*")) if p.is_file()
             and p.suffix in ((".fits",) if a.kind == "fits" else (".hdf", ".hdf4", ".h4"))]
    rows = sweep(a.kind, files, Path(a.out))
    for row in rows:
        print(" | ".join(str(c) for c in row))
    counts = {}
    for row in rows:
        counts[row[2].split(" ")[0]] = counts.get(row[2].split(" ")[0], 0) + 1
    print(f"{len(files)} files, {len(rows)} rows:", counts)


if __name__ == "__main__":
    main()
