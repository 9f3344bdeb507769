"""Sweep: every GRIB file of a directory mounted by refmount (a glob on a loopback nginx) and compared
with cfgrib on the file (issue 40, "files we do not see"). Per file and per cfgrib variable: identical,
hidden (the mount's log names it), MISSING (neither read nor named), WRONG (values, coords or dims differ)
or error; a markdown table on stdout and every difference in --out.

    python -m tests.sweeps.grib_sweep --files DIR --out /tmp/x/sweep.md [--idx]

--idx writes each file's wgrib2-style .idx beside it (tests/support/gribfiles.py write_idx) and its next
cycle (another_cycle; names c00.X and c06.X: one kind), so that the second is served from its .idx
alone where the first's scan maps to its idx; both are compared with cfgrib on their own bytes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.conftest import Mount  # noqa: E402
from tests.support.gribcompare import sweep_file  # noqa: E402
from tests.support.nginx import Nginx  # noqa: E402

def xarray_check(mnt: Path, name: str) -> str | None:
    """xarray (engine zarr) opens the mounted file's root and every group: None, or the error."""
    import xarray as xr
    import zarr

    try:
        root = zarr.open_group(str(mnt / name), mode="r")
        paths = [""] + [p for p, _ in root.groups()]
        todo = list(paths)
        while todo:
            p = todo.pop()
            for sub, _ in zarr.open_group(str(mnt / name / p) if p else str(mnt / name), mode="r").groups():
                full = f"{p}/{sub}" if p else sub
                if full not in paths:
                    paths.append(full)
                    todo.append(full)
        for p in paths:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = xr.open_zarr(str(mnt / name), group=p or None, consolidated=False, decode_timedelta=True)
                ds.load()
    except Exception as e:
        return f"xarray: {type(e).__name__}: {str(e)[:200]}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--idx", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="gribsweep-"))
    www = root / "www" / "data"
    www.mkdir(parents=True)
    for p in sorted(Path(args.files).iterdir()):
        if p.is_file() and not p.name.endswith((".idx", ".md")):
            shutil.copy(p, www / p.name)
    if args.idx:
        from tests.support.gribfiles import another_cycle, write_idx

        for p in sorted(www.iterdir()):  # (names that differ in their digits only: one kind)
            try:
                p = p.rename(www / f"c00.{p.name}")
                write_idx(p)
                another_cycle(p, www / f"c06.{p.name[4:]}", 6)
            except Exception as e:
                print(f"{p.name}: no idx/cycle ({e})", file=sys.stderr)
    files = sorted(p for p in www.iterdir() if not p.name.endswith(".idx"))
    rows, details = [], []
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg-cache"))
    with Nginx(root / "nginx", f"root {www.parent}; location /data/ {{ autoindex on; }}") as nginx:
        m = Mount(f"{nginx.url}/data/*", root / "mnt", ["--load-timeout", "600"], env=env).start(timeout=900)
        try:
            log = m.log()
            listed = set(os.listdir(m.path))
            for p in files:
                log = m.log()
                if p.name not in listed:
                    named = [n for n in log.splitlines() if p.name in n]
                    result, lines = ("not listed", named[:2] or ["(not a file refmount mounts)"])
                else:
                    result, lines = sweep_file(p, m)
                    if result not in ("hidden", "error", "both fail"):
                        x = xarray_check(m.path, p.name)
                        if x:
                            result, lines = f"{result}; xarray error", lines + [x]
                rows.append((p.name, p.stat().st_size, result, lines))
                print(f"{p.name}: {result}", flush=True)
            details.append(m.log())
        finally:
            m.stop()
    with open(out, "w") as f:
        f.write("| file | bytes | result | detail |\n|---|---|---|---|\n")
        for name, size, result, lines in rows:
            short = "; ".join(line for line in lines if "identical" not in line)[:240].replace("|", "/")
            f.write(f"| {name} | {size} | {result} | {short} |\n")
        f.write("\n\n")
        for name, size, result, lines in rows:
            f.write(f"## {name}: {result}\n" + "".join(f"- {line}\n" for line in lines) + "\n")
        f.write("## mount log\n```\n" + "".join(details)[-20000:] + "\n```\n")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
