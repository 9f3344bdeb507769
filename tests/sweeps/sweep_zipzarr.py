"""Sweep of zipped Zarr stores (issue 40): variants written by zarr-python 3 (this venv) and 2 (a venv
given by --zarr2-python), by `zip` and by zipfile, each mounted from its path and over loopback HTTP
(RangeServer), every array read with zarr on the mount and compared with zarr on the zip.

    python -m tests.sweeps.sweep_zipzarr --out /tmp/x [--zarr2-python /path/to/python]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.conftest import Mount  # noqa: E402
from tests.support.rangeserver import RangeServer  # noqa: E402

warnings.simplefilter("ignore")

WRITE = r'''
import sys, numpy as np, zarr, zipfile, warnings
warnings.simplefilter("ignore")
path, fmt, consolidated, compression, nested = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4], sys.argv[5] == "1"
v3 = zarr.__version__.startswith("3")
comp = {"stored": zipfile.ZIP_STORED, "deflated": zipfile.ZIP_DEFLATED}[compression]
store = zarr.storage.ZipStore(path, mode="w", compression=comp) if v3 else zarr.ZipStore(path, mode="w", compression=comp)
kw = {"zarr_format": fmt} if v3 else {}
root = zarr.open_group(store, mode="w", **kw)
root.attrs["title"] = "zipped"
def arr(g, name, **k):
    if v3:
        return g.create_array(name, **k)
    return g.create_dataset(name, **k)
a = arr(root, "ints", shape=(7, 5), chunks=(3, 2), dtype="i2", fill_value=-9)
a[:3, :] = np.arange(15, dtype="i2").reshape(3, 5)
g = root.create_group("sub").create_group("deeper") if nested else root
b = arr(g, "floats", shape=(10,), chunks=(4,), dtype=">f8", fill_value=float("nan"))
b[:6] = np.linspace(0, 1, 6)
c = arr(root, "empty", shape=(4, 4), chunks=(2, 2), dtype="u4", fill_value=7)
d = arr(root, "scalar", shape=(), dtype="f4", fill_value=0)
d[...] = 2.5
if not v3:
    e = root.create_dataset("slash", shape=(6, 6), chunks=(3, 3), dtype="i4", dimension_separator="/", fill_value=0)
    e[:] = np.arange(36, dtype="i4").reshape(6, 6)
if v3 and fmt == 3:
    s = arr(root, "sharded", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="f4", fill_value=0)
    s[:4, :] = np.arange(32, dtype="f4").reshape(4, 8)
if consolidated:
    zarr.consolidate_metadata(store)
store.close()
'''


def write(python: str, path: Path, *args) -> str | None:
    script = path.parent / "write_zip.py"
    script.write_text(WRITE)
    out = subprocess.run([python, str(script), str(path), *map(str, args)], capture_output=True, text=True)
    return None if out.returncode == 0 else out.stderr.strip().splitlines()[-1]


def rezip(src: Path, dst: Path, how: str) -> None:
    """A store directory zipped by another writer: Info-ZIP's zip (-0 or deflated), or zipfile with zip64."""
    tmp = dst.parent / (dst.name + ".d")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(src) as z:
        z.extractall(tmp)
    dst.unlink(missing_ok=True)
    if how in ("zip-0", "zip-deflate"):
        subprocess.run(["zip", "-q", "-r"] + (["-0"] if how == "zip-0" else []) + [str(dst), "."], cwd=tmp, check=True)
    elif how == "zip64":
        with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
            for p in sorted(tmp.rglob("*")):
                if p.is_file():
                    with z.open(str(p.relative_to(tmp)), "w", force_zip64=True) as f:
                        f.write(p.read_bytes())
    elif how == "zip-dir-inside":  # `zip -r x.zarr.zip x.zarr`: the store under a directory of its own
        (tmp.parent / "x.zarr").unlink(missing_ok=True) if False else None
        shutil.rmtree(tmp.parent / "x.zarr", ignore_errors=True)
        tmp.rename(tmp.parent / "x.zarr")
        subprocess.run(["zip", "-q", "-r", "-0", str(dst), "x.zarr"], cwd=tmp.parent, check=True)
        shutil.rmtree(tmp.parent / "x.zarr")
        return
    shutil.rmtree(tmp)


def arrays(group, prefix=""):
    for name, arr in group.arrays():
        yield f"{prefix}{name}", arr
    for name, sub in group.groups():
        yield from arrays(sub, f"{prefix}{name}/")


def compare(zpath: Path, mounted: Path) -> tuple[str, str]:
    import zarr

    store = zarr.storage.ZipStore(str(zpath), mode="r")
    inside = "x.zarr" if "dir-inside" in zpath.name else ""  # (zarr reads it only below its directory)
    want = dict(arrays(zarr.open_group(store, mode="r", path=inside)))
    try:
        got = dict(arrays(zarr.open_group(str(mounted), mode="r")))
    except Exception as e:  # noqa: BLE001
        return "error", f"open: {e!r}"[:100]
    if set(got) != set(want):
        return "WRONG", f"arrays {sorted(got)} vs {sorted(want)}"
    for name, w in want.items():
        try:
            g = got[name][...]
        except Exception as e:  # noqa: BLE001
            return "error", f"{name}: {e!r}"[:100]
        w = w[...]
        if g.dtype != w.dtype or g.shape != w.shape or not np.array_equal(g, w, equal_nan=g.dtype.kind == "f"):
            return "WRONG", f"{name}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
    attrs = dict(zarr.open_group(str(mounted), mode="r").attrs)
    if attrs.get("title") != "zipped":
        return "WRONG", f"root attributes {attrs}"
    return "identical", f"{len(want)} arrays"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--zarr2-python")
    a = ap.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    data = out / "data"
    data.mkdir(parents=True)
    cases = []
    writers = [("zarr3", sys.executable)] + ([("zarr2", a.zarr2_python)] if a.zarr2_python else [])
    for writer, python in writers:
        for fmt in ((2, 3) if writer == "zarr3" else (2,)):
            for consolidated in (0, 1):
                for compression in ("stored", "deflated"):
                    for nested in (0, 1):
                        name = f"{writer}_v{fmt}_{'cons' if consolidated else 'plain'}_{compression}_{'nested' if nested else 'flat'}.zarr.zip"
                        err = write(python, data / name, fmt, consolidated, compression, nested)
                        cases.append((name, err))
    base = data / "zarr3_v3_cons_stored_nested.zarr.zip"
    for how in ("zip-0", "zip-deflate", "zip64", "zip-dir-inside"):
        for src in (base, data / "zarr3_v2_plain_stored_nested.zarr.zip"):
            name = f"{src.name.split('.')[0]}_{how}.zarr.zip"
            rezip(src, data / name, how)
            cases.append((name, None))
    rows = []
    env = dict(os.environ, XDG_CACHE_HOME=str(out / "xdg"))
    with RangeServer(data) as srv:
        for name, err in cases:
            if err:
                rows.append((name, "-", "not written", err))
                continue
            for where, source in (("path", str(data / name)), ("http", srv.url_for(name))):
                mnt = out / f"mnt-{where}-{name}"
                m = Mount(source, mnt, ["--view", "raw"], env=env)
                try:
                    m.start(timeout=120)
                except RuntimeError as e:
                    lines = [line for line in str(e).splitlines() if "refmount:" in line or "rror" in line]
                    rows.append((name, where, "refused", (lines[-1] if lines else str(e))[:140]))
                    continue
                try:
                    rows.append((name, where, *compare(data / name, mnt)))
                finally:
                    m.stop()
    for row in rows:
        print(" | ".join(row))
    counts = {}
    for row in rows:
        counts[row[2]] = counts.get(row[2], 0) + 1
    print(f"{len(cases)} stores, {len(rows)} rows:", counts)


if __name__ == "__main__":
    main()
