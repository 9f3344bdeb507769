"""Data files mounted directly (issue 34): each file's own mount against the file and against kerchunk's
references of it made by hand.

    python -m tests.conformance.datafiles FILE...           # every file named (netCDF-3/4, HDF5, GRIB, TIFF)
    python -m tests.conformance.datafiles --corpus DIR      # every data file under DIR

Per file, two clients, three readings each:
  - **ncdump** (the decoded view, ``ncdump -p 9,17`` of ``file://MNT#mode=nczarr,file``): of the direct mount
    (``refmount mount FILE MNT``), of the file itself (netCDF and HDF5 only) and of a mount of kerchunk's
    references of the file, written by hand with the translator refmount's scanner uses.
  - **xarray** (the raw view, ``xr.open_datatree(MNT, engine="zarr")``, every group): of the direct mount, of
    the file (netCDF and HDF5 only) and of a raw mount of kerchunk's references (fsspec's reading of them is
    compared too, and noted where it differs).

A reading equal to the file's is **identical**; one that differs from the file's but equals the reading of
kerchunk's references is **lost by kerchunk** (kerchunk dropped or changed it, or the Zarr form cannot say
it); one that differs from kerchunk's references is **wrong**: refmount's scanning path changed something.
An **error** is a direct mount that fails while kerchunk's references mount, or a client that fails on the
direct mount but not on the references.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

from refmount.refs.scan.formats import SNIFF_BYTES, sniff

NCDUMP_TIMEOUT = 120


def kind(path: Path):
    with open(path, "rb") as f:
        return sniff(f.read(SNIFF_BYTES))


def kerchunk_refs(path: Path, fmt: str) -> dict:
    """kerchunk's references of the file, by the translator (and settings) refmount's scanner uses; with
    the garbage collector off, as run.py's kerchunk_translate says why (h5py's lock and zarr's I/O thread)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        return _kerchunk_refs(path, fmt)
    finally:
        gc.enable()


def _kerchunk_refs(path: Path, fmt: str) -> dict:
    url = str(path)
    if fmt == "hdf5":
        import warnings

        from kerchunk.hdf import SingleHdf5ToZarr
        try:
            return SingleHdf5ToZarr(url, error="raise").translate()
        except Exception:  # noqa: BLE001 - the scanner leaves out what kerchunk cannot translate
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return SingleHdf5ToZarr(url, error="warn").translate()
    if fmt == "netcdf3":
        from kerchunk.netCDF3 import NetCDF3ToZarr
        return NetCDF3ToZarr(url, inline_threshold=100).translate()
    if fmt == "grib":
        from kerchunk.grib2 import grib_tree, scan_grib
        messages = scan_grib(url)
        return messages[0] if len(messages) == 1 else grib_tree(messages)
    if fmt == "tiff":
        from kerchunk.tiff import tiff_to_zarr
        return tiff_to_zarr(url)
    raise ValueError(f"not a data file: {path}")


# ----------------------------------------------------------------------------- readings


def ncdump(target) -> str:
    """ncdump's text without its first line (the dataset's name), or 'ERROR: ...'."""
    from tests.support.clients import NCDUMP, nczarr_url

    arg = nczarr_url(target) if Path(target).is_dir() else str(target)
    try:
        proc = subprocess.run([*NCDUMP, "-p", "9,17", arg], capture_output=True, text=True,
                              timeout=NCDUMP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "ERROR: ncdump timed out"
    if proc.returncode:
        return "ERROR: " + (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
    return proc.stdout.split("\n", 1)[-1]


def _value_key(a: np.ndarray):
    a = np.asarray(a)
    if a.dtype.kind in "fc":
        return ("nan-aware", a.shape, np.where(np.isnan(a), 0, a).tobytes(), np.isnan(a).tobytes())
    if a.dtype.kind == "O":
        return ("objects", a.shape, repr(a.tolist()))
    return ("bytes", a.shape, a.tobytes())


def _attrs(attrs: dict) -> dict:
    return {k: json.dumps(v.tolist() if hasattr(v, "tolist") else v, default=str, sort_keys=True)
            for k, v in attrs.items()}


def summary(ds) -> dict:
    """name -> (dtype, shape, attributes, values) of every variable of one xarray dataset, plus its attrs."""
    out = {"(attrs)": _attrs(ds.attrs)}
    for name, var in ds.variables.items():
        values = var.values
        out[name] = (str(values.dtype), values.shape, _attrs(var.attrs), _value_key(values))
    return out


def xarray_groups(opener) -> dict:
    """group path -> summary, for a tree xarray opens; or {'ERROR': ...}."""
    try:
        tree = opener()
        return {node.path: summary(node.to_dataset()) for node in tree.subtree}
    except Exception as e:  # noqa: BLE001 - the client failing is the reading
        return {"ERROR": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}


def xarray_file(path: Path) -> dict:
    import xarray as xr
    return xarray_groups(lambda: xr.open_datatree(path, engine="netcdf4"))


def xarray_zarr(mnt: Path) -> dict:
    import xarray as xr
    return xarray_groups(lambda: xr.open_datatree(mnt, engine="zarr", consolidated=False))


def xarray_refs(refs: dict) -> dict:
    import xarray as xr

    def opener():
        return xr.open_datatree("reference://", engine="zarr", consolidated=False, zarr_format=2,
                                storage_options={"fo": refs, "asynchronous": True})
    return xarray_groups(opener)


def inline_bytes(value) -> str:
    """kerchunk's inline bytes (GRIB trees hold some) as fsspec's references write them in JSON."""
    import base64

    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} in kerchunk's references")


def text_diff(a: str, b: str, lines: int = 6) -> str:
    """The first lines where two ncdump texts differ ('-' the first, '+' the second)."""
    import difflib

    changed = [line.strip() for line in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return " | ".join(changed[:lines])[:500]


def diff(a: dict, b: dict) -> list:
    """Where two xarray readings differ (group/variable and what)."""
    out = []
    for g in sorted(set(a) | set(b)):
        if g not in a or g not in b:
            out.append(f"{g}: only in {'the first' if g in a else 'the second'}")
            continue
        if not isinstance(a[g], dict) or not isinstance(b[g], dict):
            if a[g] != b[g]:
                out.append(f"{g}: {a[g]!r} vs {b[g]!r}"[:300])
            continue
        for v in sorted(set(a[g]) | set(b[g])):
            x, y = a[g].get(v), b[g].get(v)
            if x == y:
                continue
            if x is None or y is None:
                out.append(f"{g}/{v}: only in {'the first' if y is None else 'the second'}")
            elif v == "(attrs)":
                out.append(f"{g} attrs: {sorted(set(x.items()) ^ set(y.items()))}"[:300])
            else:
                what = [n for n, i, j in zip(("dtype", "shape", "attrs", "values"), x, y) if i != j]
                out.append(f"{g}/{v}: {', '.join(what)} ({x[0]} {x[1]} vs {y[0]} {y[1]})")
    return out


def classify(direct, source, refs) -> tuple:
    """(class, reason) of the direct mount's reading against the file's (None: unreadable) and the refs'."""
    if source is not None and direct == source:
        return "identical", ""
    if direct == refs:
        if source is None:
            return "identical", "(as kerchunk's references through fsspec; the client cannot read the file)"
        return "lost by kerchunk", "differs from the file as kerchunk's references do"
    if isinstance(direct, str) and direct.startswith("ERROR"):
        return "error", direct[:300]
    return "wrong", "differs from kerchunk's references"


# ----------------------------------------------------------------------------- one file


def run_file(path: Path, work: Path) -> list:
    from tests.conftest import Mount

    fmt = kind(path)
    if fmt is None:
        return [dict(file=str(path), client="*", cls="skipped", reason="not a data file refmount scans")]
    try:
        refs = kerchunk_refs(path, fmt)
    except Exception as e:  # noqa: BLE001
        return [dict(file=str(path), client="*", cls="untranslatable", reason=f"kerchunk: {e}"[:300])]
    refs_path = work / "refs.json"
    refs_path.write_text(json.dumps(refs, default=inline_bytes))
    netcdf = fmt in ("hdf5", "netcdf3")
    rows = []
    mounts = {name: Mount(src, work / f"mnt_{name}", ["--view", view], log_path=work / f"{name}.log")
              for name, src, view in (("direct", path, "decoded"), ("refs", refs_path, "decoded"),
                                      ("raw", path, "raw"), ("refs_raw", refs_path, "raw"))}
    try:
        for name, m in mounts.items():
            try:
                m.start()
            except Exception as e:  # noqa: BLE001
                return [dict(file=str(path), client="*", cls="error" if name != "refs" else "untranslatable",
                             reason=f"{name} mount failed: {str(e).strip().splitlines()[0][:300]}")]
        d, r = ncdump(mounts["direct"].path), ncdump(mounts["refs"].path)
        f = ncdump(path) if netcdf else None
        if f is not None and f.startswith("ERROR"):
            f = None  # Debian's ncdump cannot read the file (a filter it lacks): kerchunk's references are the oracle
        cls, why = classify(d, f, r)
        if cls == "wrong":
            why += ": " + text_diff(r, d)
        elif cls == "lost by kerchunk":
            why += ": " + text_diff(f, d)
        rows.append(dict(file=str(path), client="ncdump", cls=cls, reason=why))
        # kerchunk's references read by xarray on a mount of them (fsspec's reference filesystem lists no
        # group below the second level of a GRIB tree: noted where it differs)
        d, r = xarray_zarr(mounts["raw"].path), xarray_zarr(mounts["refs_raw"].path)
        fsspec_note = "" if xarray_refs(refs) == r else " (fsspec's reading of the references differs from their mount's)"
        f = xarray_file(path) if netcdf else None
        if f is not None and "ERROR" in f:
            f = None  # xarray cannot read the file: kerchunk's references are the oracle
        cls, why = classify(d, f, r)
        if cls == "wrong":
            why += ": " + "; ".join(diff(d, r))[:500]
        elif cls == "lost by kerchunk":
            why += ": " + "; ".join(diff(d, f))[:500]
        rows.append(dict(file=str(path), client="xarray", cls=cls, reason=why + fsspec_note))
    except Exception as e:  # noqa: BLE001
        rows.append(dict(file=str(path), client="*", cls="error",
                         reason=f"harness: {traceback.format_exception_only(e)[-1].strip()}"[:300]))
    finally:
        for m in mounts.values():
            m.stop()
    return rows


def run_child(path: Path, work: Path) -> list:
    """One file in a process of its own: h5py, netCDF-C or eccodes crashing on it is that file's error."""
    try:
        proc = subprocess.run([sys.executable, "-m", "tests.conformance.datafiles", "--one", str(path), str(work)],
                              capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
        failure = None if proc.returncode == 0 else f"harness child exit {proc.returncode}: " + \
            (proc.stderr.strip().splitlines() or [""])[-1][:200]
    except subprocess.TimeoutExpired:
        failure = "harness child timed out after 600 s"
    finally:  # (what a crashed child left mounted: its daemons end once unmounted)
        from tests.conftest import force_unmount
        for mnt in work.glob("mnt_*"):
            force_unmount(mnt)
    rows = work / "rows.json"
    if failure or not rows.exists():
        return [dict(file=str(path), client="*", cls="error", reason=failure or "no rows")]
    return json.loads(rows.read_text())


DATA_SUFFIXES = (".nc", ".nc4", ".h5", ".hdf5", ".he5", ".grib", ".grib2", ".grb2", ".grb", ".tif", ".tiff")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance.datafiles", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--corpus", type=Path, action="append", default=[], help="every data file under this directory")
    ap.add_argument("--out", type=Path, help="write every result as JSON here")
    ap.add_argument("--one", nargs=2, type=Path, help=argparse.SUPPRESS)  # FILE WORK: in this process
    args = ap.parse_args(argv)
    if args.one:
        path, work = args.one
        (work / "rows.json").write_text(json.dumps(run_file(path, work)))
        return 0
    files = list(args.files)
    for d in args.corpus:
        files += sorted(p for p in d.rglob("*") if p.suffix.lower() in DATA_SUFFIXES and p.is_file())
    rows = []
    with tempfile.TemporaryDirectory(prefix="refmount-datafiles-") as tmp:
        for i, path in enumerate(files):
            work = Path(tmp) / str(i)
            work.mkdir()
            result = run_child(path.resolve(), work)
            for r in result:
                print(f"  {r['cls']:16} {r['client']:7} {path}  {r['reason']}", file=sys.stderr, flush=True)
            rows += result
    counts = {}
    for r in rows:
        counts[r["cls"]] = counts.get(r["cls"], 0) + 1
    line = (f"datafiles: {len(files)} files x 2 clients ({len(rows)} results): "
            + ", ".join(f"{counts.get(c, 0)} {c}" for c in
                        ("identical", "lost by kerchunk", "wrong", "error", "untranslatable", "skipped")))
    print(line)
    if args.out:
        args.out.write_text(json.dumps({"summary": line, "rows": rows}, indent=1))
    return 1 if counts.get("wrong") else 0


if __name__ == "__main__":
    sys.exit(main())
