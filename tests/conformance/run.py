"""The conformance run: netCDF-C's own CDL corpus through refmount's decoded view, three clients.

    python -m tests.conformance.run [--slice] [--jobs N] [--out report.json] [CDL ... | FILE.nc ...]

For each CDL (tests/conformance/cdl/, see its README): ``ncgen -k nc4`` -> source.nc, ``nccopy -d4 -s`` ->
deflated.nc; each is translated by kerchunk (``inline_threshold=0``), mounted with ``--view decoded`` and
every variable and attribute (all groups) is compared with the file itself through Debian's ncdump,
netCDF4-python (masked and raw) and xarray (see compare.py for the classes). A wrong result or an error
is re-checked on a ``cp -r`` copy of the mount: the same outcome there means it comes from what is
served (a netCDF-C limitation when it is an error), a different one would be a FUSE-layer bug.

Each CDL runs in its own child process (``--one``), so a client that crashes or hangs costs that CDL only;
the parent unmounts and stops (by PID) whatever a child left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

from tests.support.clients import tool

HERE = Path(__file__).resolve().parent
CDL_DIR = HERE / "cdl"
SLICE_FILE = HERE / "slice.txt"
NCGEN, NCCOPY = tool("ncgen"), tool("nccopy")
TOOL_TIMEOUT = 60  # ncgen, nccopy, cp, each ncdump
CDL_TIMEOUT = 900  # one CDL, both variants, all clients
VARIANTS = ("source", "deflated")


def corpus() -> List[str]:
    return sorted(str(p.relative_to(CDL_DIR)) for p in CDL_DIR.rglob("*.cdl"))


def slice_list() -> List[str]:
    return [line.split("#")[0].strip() for line in SLICE_FILE.read_text().splitlines()
            if line.split("#")[0].strip()]


# ----------------------------------------------------------------------------- one CDL (child process)


def kerchunk_translate(nc: Path):
    """(refs dict or None, failure message or None), with the garbage collector off: a collection run by
    zarr's I/O thread while kerchunk holds h5py's lock and waits for that thread deadlocks (h5py frees
    objects under its lock; seen on ref_tst_compounds3.cdl)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        return _kerchunk_translate(nc)
    finally:
        gc.enable()


def _kerchunk_translate(nc: Path):
    """A failure is retried with kerchunk's error="warn", which drops what it cannot translate, so the
    rest of the file is still measured."""
    from kerchunk.hdf import SingleHdf5ToZarr

    from tests.conformance.snapshot import first_line
    from tests.support.datasets import kerchunk_refs

    try:
        return kerchunk_refs(nc, inline_threshold=0), None
    except Exception as e:  # noqa: BLE001 - kerchunk's failure is the result
        reason = f"kerchunk: {first_line(e)}"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h5 = SingleHdf5ToZarr(str(nc), inline_threshold=0, error="warn")
            try:
                refs = h5.translate()
            finally:
                h5.close()
        for v in refs["refs"].values():
            if isinstance(v, list) and v and isinstance(v[0], str):
                v[0] = str(nc.resolve())
        # kerchunk's warning: "The following exception was caught and quashed ...\n<message>\n<traceback>"
        messages = [str(w.message).splitlines() for w in caught]
        refs["_kerchunk_failures"] = [m[1][:300] for m in messages if len(m) > 1 and "quashed" in m[0]]
        return refs, reason
    except Exception as e:  # noqa: BLE001
        return None, f"{reason} (and with error='warn': {first_line(e)})"


def nofill_variables(nc: Path) -> set:
    """Variables of the source whose values are partly undefined: declared _NoFill (``ncdump -hs``; nccopy
    declares it for every variable it writes) and not fully allocated in the HDF5 file (a chunk or the
    contiguous block was never written, so HDF5 returns whatever memory held)."""
    import h5py

    from tests.conformance.header import parse_header

    proc = subprocess.run([*tool("ncdump"), "-hs", str(nc)], capture_output=True, text=True,
                          errors="surrogateescape", timeout=TOOL_TIMEOUT)
    if proc.returncode != 0:
        return set()
    head = parse_header(proc.stdout)
    declared = {p for p, v in head.variables.items() if v.attrs.get("_NoFill", ("", ()))[1] == ('"true"',)}
    undefined = set()
    with h5py.File(nc, "r") as f:
        for vpath in declared:
            try:
                ds = f[vpath]
                if ds.size == 0:
                    continue
                if ds.chunks is None:
                    complete = ds.id.get_storage_size() > 0 or ds.id.get_create_plist().get_layout() == 0
                else:
                    grid = 1
                    for s, c in zip(ds.shape, ds.chunks):
                        grid *= -(-s // c)
                    complete = ds.id.get_num_chunks() >= grid
            except (KeyError, TypeError, ValueError, OSError):
                complete = False
            if not complete:
                undefined.add(vpath)
    return undefined


NO_LOG_LINE = "no log line names it"


def hidden_reason(log: str, vpath: str) -> str:
    name = vpath.rpartition("/")[2]
    for line in log.splitlines():
        if "hid" in line and (vpath in line or f" {name}:" in line or f" {name} " in line):
            return line.split("decoded view:", 1)[-1].strip()[:300]
    return NO_LOG_LINE


def isolated_snapshot(client: str, path: Path, zarr: bool, groups: List[str], work: Path) -> dict:
    """The snapshot taken in a child process: a client that crashes (netCDF-C aborts on some inputs)
    becomes an error of the whole dataset for that client, named by its signal."""
    import pickle

    from tests.conformance.snapshot import without_paths

    out = work / f"snap_{client}_{os.getpid()}_{time.monotonic_ns()}.pkl"
    cmd = [sys.executable, "-m", "tests.conformance.run", "--snapshot", client, str(path),
           "zarr" if zarr else "file", json.dumps(groups), str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CDL_TIMEOUT / 3)
    except subprocess.TimeoutExpired:
        return {"vars": {}, "groups": {}, "error": f"{client} timed out"}
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        return without_paths({"vars": {}, "groups": {}, "error": f"{client} crashed ({name})"}, path)
    if proc.returncode != 0 or not out.exists():
        return {"vars": {}, "groups": {}, "error": f"{client} exited {proc.returncode}: "
                + (proc.stderr.strip().splitlines() or [""])[-1][:200]}
    with open(out, "rb") as f:
        return pickle.load(f)


def run_variant(cdl: str, variant: str, nc: Path, work: Path, mount_args: List[str],
                isolate: bool = False, direct: bool = False) -> List[dict]:
    from tests.conformance.compare import (ERROR, HIDDEN, UNTRANSLATABLE, WRONG, Refs,
                                           compare_snapshots)
    from tests.conformance.snapshot import CLIENTS, OWN_PROCESS
    from tests.conformance.snapshot import snapshot as in_process
    from tests.conftest import Mount

    def snapshot(client, path, zarr, groups):
        if isolate or zarr and client in OWN_PROCESS:
            return isolated_snapshot(client, path, zarr, groups, work)
        return in_process(client, path, zarr, groups)

    rows: List[dict] = []

    def add(client, r, **extra):
        rows.append(dict(cdl=cdl, variant=variant, client=client, var=r["var"], cls=r["cls"],
                         reason=r["reason"], notes=r.get("notes", []), **extra))

    nc4_source = snapshot("netcdf4", nc, False, [])
    groups = list(nc4_source["groups"]) or [""]
    sources = {c: (nc4_source if c == "netcdf4" else snapshot(c, nc, False, groups)) for c in CLIENTS}
    nofill = nofill_variables(nc)
    refs, kerchunk_failure = kerchunk_translate(nc)
    if refs is None:
        for client, src in sources.items():
            for vpath in src["vars"]:
                add(client, dict(var=vpath, cls=UNTRANSLATABLE, reason=kerchunk_failure))
        return rows
    failures = refs.pop("_kerchunk_failures", [])

    def untranslatable_reason(vpath: str) -> str:
        named = [f for f in failures if f"/{vpath} " in f or f"/{vpath}:" in f or f"'/{vpath}'" in f]
        return f"kerchunk: {named[0]}" if named else (kerchunk_failure or "kerchunk wrote no array for it")

    refs_path = work / f"{variant}.json"
    refs_path.write_text(json.dumps(refs))
    ref_index = Refs(refs)
    mnt = work / f"mnt_{variant}"
    # --direct: the file itself is mounted (scanned by refmount, docs/archives.md); kerchunk's refs stay the
    # oracle of what kerchunk loses, so a difference they do not explain is refmount's scanning path
    m = Mount(nc if direct else refs_path, mnt, ["--view", "decoded", *mount_args], log_path=work / f"mnt_{variant}.log")
    copies: dict = {}  # form -> a cp -r copy of the mount made in that form
    own_results: dict = {}  # client -> its results on a Zarr store its own library wrote

    def own_result(client: str) -> dict:
        if client not in own_results:
            own_results[client] = own_store_result(client, nc, work, variant, sources[client], ref_index, nofill,
                                                   snapshot, groups)
        return own_results[client]
    try:
        m.start()
        with open(work / "pids", "a") as f:
            f.write(f"{m.proc.pid} {mnt}\n")
        for client in CLIENTS:
            got = snapshot(client, mnt, True, groups)
            result = compare_snapshots(client, sources[client], got, ref_index, nofill)
            form = served_form(mnt, client)
            copy_result = None
            for r in result:
                extra = {}
                if r["cls"] == HIDDEN and not r["var"].startswith("(") and not ref_index.has_array(r["var"]):
                    r["cls"] = UNTRANSLATABLE
                    r["reason"] = untranslatable_reason(r["var"])
                elif r["cls"] == HIDDEN and r.pop("limitation", False):
                    extra["limitation"] = True  # (the client itself says why it left the variable out)
                elif r["cls"] == HIDDEN:
                    r["reason"] = hidden_reason(m.log(), r["var"])
                    if r["reason"] == NO_LOG_LINE and client in OWN_STORE_CLIENTS:  # (the client did not show it)
                        o = own_result(client).get(r["var"])
                        extra["same_on_own_store"] = o is not None and o["cls"] == HIDDEN
                elif r["cls"] in (WRONG, ERROR):
                    if copy_result is None:
                        copy = copies.get(form)
                        if copy is None:  # (in the form the client was served: REFMOUNT_FORM, docs/views-and-clients.md)
                            copy = copies[form] = work / f"copy_{variant}_{form or 'plain'}"
                            env = {**os.environ, "REFMOUNT_FORM": form} if form else None
                            subprocess.run(["cp", "-r", str(mnt), str(copy)], capture_output=True,
                                           timeout=TOOL_TIMEOUT, env=env)
                        copy_got = snapshot(client, copy, True, groups)
                        copy_result = {x["var"]: x for x in
                                       compare_snapshots(client, sources[client], copy_got, ref_index, nofill)}
                    c = copy_result.get(r["var"])
                    same = c is not None and c["cls"] == r["cls"] and c["reason"] == r["reason"]
                    extra["same_on_copy"] = same
                    if not same:
                        extra["copy"] = f"{c['cls']}: {c['reason']}" if c else "absent on the copy"
                    if client in OWN_STORE_CLIENTS:
                        o = own_result(client).get(r["var"])
                        extra["same_on_own_store"] = o is not None and o["cls"] == r["cls"] and o["reason"] == r["reason"]
                if form:
                    extra["form"] = form
                add(client, r, **extra)
    except Exception as e:  # noqa: BLE001 - the mount (or this harness) failing is an error of every variable
        from tests.conformance.snapshot import first_line

        what = "mount failed" if m.proc is None or m.proc.poll() is not None else "harness failed"
        for client, src in sources.items():
            for vpath in src["vars"]:
                add(client, dict(var=vpath, cls=ERROR, reason=f"{what}: {first_line(e)}"))
    finally:
        m.stop()
        for copy in copies.values():
            shutil.rmtree(copy, ignore_errors=True)
    return rows


# Clients whose library writes Zarr: a difference that a store their own library wrote from the source
# shows too is a limitation of that library (Debian's netCDF-C 4.9.0; GDAL 3.6; the netCDF4 wheel's 4.10.1).
OWN_STORE_CLIENTS = ("ncdump", "nco", "cdo", "gdal", "netcdf4")


def own_store(client: str, nc: Path, work: Path, variant: str):
    """A Zarr store of the source written by the client's own library: Debian's nccopy (netCDF-C
    4.9.0, NCZarr) for ncdump, NCO and CDO; gdalmdimtranslate (GDAL 3.6) for GDAL. None if it fails."""
    if client == "netcdf4":
        store = work / f"own_{variant}_netcdf410"
        if not store.exists():
            try:
                copy_with_netcdf4(nc, f"file://{store}#mode=nczarr,file")
            except Exception:  # noqa: BLE001 - no store, no proof
                return None
        return store
    if client == "gdal":
        store = work / f"own_{variant}_gdal.zarr"
        cmd = [*tool("gdalmdimtranslate"), "-q", "-of", "ZARR", str(nc), str(store)]
    else:  # (-u: netCDF-C 4.9.0 writes no unlimited dimension to Zarr, it fails unless they are made fixed)
        store = work / f"own_{variant}_netcdf49"
        cmd = [*NCCOPY, "-u", str(nc), f"file://{store}#mode=nczarr,file"]
    if store.exists():
        return store
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=TOOL_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
    return store if proc.returncode == 0 and store.exists() else None


def copy_with_netcdf4(nc: Path, url: str) -> None:
    """The source copied by netCDF4-python (its wheel's netCDF-C writes the NCZarr store): groups,
    dimensions, variables with their fill, attributes and raw values."""
    import netCDF4

    def copy(src, dst) -> None:
        for name, dim in src.dimensions.items():
            dst.createDimension(name, None if dim.isunlimited() else len(dim))
        for name, v in src.variables.items():
            fill = v.getncattr("_FillValue") if "_FillValue" in v.ncattrs() else None
            w = dst.createVariable(name, v.datatype, v.dimensions, fill_value=fill)
            w.setncatts({a: v.getncattr(a) for a in v.ncattrs() if a != "_FillValue"})
            v.set_auto_maskandscale(False)
            w.set_auto_maskandscale(False)
            if v.size:
                w[...] = v[...]
        dst.setncatts({a: src.getncattr(a) for a in src.ncattrs()})
        for name, g in src.groups.items():
            copy(g, dst.createGroup(name))

    with netCDF4.Dataset(nc) as src, netCDF4.Dataset(url, "w") as dst:
        copy(src, dst)


def own_store_result(client, nc, work, variant, source, ref_index, nofill, snapshot, groups) -> dict:
    from tests.conformance.compare import compare_snapshots

    store = own_store(client, nc, work, variant)
    if store is None:
        return {}
    return {x["var"]: x for x in compare_snapshots(client, source, snapshot(client, store, True, groups),
                                                   ref_index, nofill)}


# how each client's program shows in the mount's forms_served (refmount.fuse.readers labels)
_PROGRAMS = {"ncdump": ("ncdump",), "nco": ("ncks",), "cdo": ("cdo",), "gdal": ("gdalmdiminfo",),
             "netcdf4": ("python",), "xarray": ("python",)}


def served_form(mnt: Path, client: str):
    """The metadata form the mount served to the client's program (None: one form for all, --form)."""
    try:
        served = json.loads(os.getxattr(mnt, "user.refmount.stats")).get("forms_served") or {}
    except OSError:
        return None
    wants_netcdf = client != "xarray"
    for form, readers in served.items():
        for label in readers:
            program, _, library = label.partition(" (")
            if program.startswith(_PROGRAMS[client]) and (client not in ("netcdf4", "xarray")
                                                          or ("netCDF-C" in library) == wants_netcdf):
                return form
    return None


def run_one(cdl: str, work: Path, mount_args: List[str], isolate: bool = False, direct: bool = False) -> List[dict]:
    work.mkdir(parents=True, exist_ok=True)
    source = work / "source.nc"
    if _is_data_file(cdl):  # a netCDF-4/HDF5 file of the user's: measured as it is
        shutil.copyfile(cdl, source)
    else:
        subprocess.run([*NCGEN, "-k", "nc4", "-o", str(source), str(CDL_DIR / cdl)], check=True,
                       capture_output=True, timeout=TOOL_TIMEOUT)
    rows = run_variant(cdl, "source", source, work, mount_args, isolate, direct)
    deflated = work / "deflated.nc"
    proc = subprocess.run([*NCCOPY, "-d4", "-s", str(source), str(deflated)], capture_output=True,
                          text=True, timeout=TOOL_TIMEOUT)
    if proc.returncode == 0:
        rows += run_variant(cdl, "deflated", deflated, work, mount_args, isolate, direct)
    else:
        rows.append(dict(cdl=cdl, variant="deflated", client="nccopy", var="*", cls="skipped",
                         reason=f"nccopy -d4 -s failed: {proc.stderr.strip()[:200]}", notes=[]))
    return rows


def _is_data_file(name: str) -> bool:
    """A netCDF-4 (HDF5) file given by path instead of a CDL of the corpus."""
    return not name.endswith(".cdl") and Path(name).is_file()


# ----------------------------------------------------------------------------- the parent


def _cleanup(work: Path) -> None:
    """Stop daemons and unmount what a crashed child left (its own PIDs, recorded in work/pids)."""
    from tests.conftest import force_unmount

    pids = work / "pids"
    if pids.exists():
        for line in pids.read_text().splitlines():
            pid, _, mnt = line.partition(" ")
            try:
                os.kill(int(pid), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
            force_unmount(mnt)
    for mnt in work.glob("mnt_*"):
        if mnt.is_dir():
            force_unmount(mnt)


def run_cdl_child(cdl: str, work: Path, mount_args: str = "", isolate: bool = False,
                  direct: bool = False) -> List[dict]:
    """One CDL in a child process; if a client crashes it, again with every client in its own process."""
    out = work / "rows.json"
    cmd = [sys.executable, "-m", "tests.conformance.run", "--one", cdl, "--work", str(work),
           f"--mount-args={mount_args}"] + (["--isolate"] if isolate else []) + (["--direct"] if direct else [])
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CDL_TIMEOUT,
                              cwd=Path(__file__).resolve().parents[2])
        failure = None if proc.returncode == 0 else (
            f"harness child exit {proc.returncode}: " + (proc.stderr.strip().splitlines() or [""])[-1][:300])
    except subprocess.TimeoutExpired:
        failure = f"harness child timed out after {CDL_TIMEOUT} s"
    finally:
        _cleanup(work)
    if failure and not isolate and proc_crashed(failure):
        shutil.rmtree(work, ignore_errors=True)
        return run_cdl_child(cdl, work, mount_args, isolate=True, direct=direct)
    if failure or not out.exists():
        return [dict(cdl=cdl, variant="*", client="*", var="*", cls="error", reason=failure or "no rows",
                     notes=[], seconds=round(time.monotonic() - t0, 1))]
    rows = json.loads(out.read_text())
    for r in rows:
        r["seconds"] = round(time.monotonic() - t0, 1)
    return rows


def proc_crashed(failure: str) -> bool:
    return failure.startswith("harness child exit -")


def row_class(r: dict) -> str:
    if r["cls"] in ("error", "wrong", "hidden") and (r.get("same_on_own_store") or r.get("limitation")):
        return f"{r['cls']} (reader's limitation)"  # its own library's Zarr store shows it too
    if r["cls"] == "error" and r.get("same_on_copy"):
        return "error (limitation)"
    if r["cls"] == "wrong" and r.get("same_on_copy") is False:
        return "wrong (FUSE: copy differs)"
    return r["cls"]


def summarise(rows: List[dict]) -> str:
    counted = [r for r in rows if r["cls"] not in ("source unreadable", "skipped")]
    variables = {(r["cdl"], r["variant"], r["var"]) for r in counted if not r["var"].startswith("(")}
    groups = {(r["cdl"], r["variant"], r["var"]) for r in counted if r["var"].startswith("(")}
    c = Counter(row_class(r) for r in counted)
    limitation = c["error (limitation)"]
    errors = c["error"] + limitation
    readers = sum(c[f"{cls} (reader's limitation)"] for cls in ("error", "wrong", "hidden"))
    parts = [f"{c['identical']} identical", f"{c['wrong'] + c['wrong (FUSE: copy differs)']} wrong",
             f"{errors} error ({limitation} limitation)",
             f"{readers} reader's limitation (its own library's Zarr shows it too)", f"{c['hidden']} hidden",
             f"{c['untranslatable']} untranslatable", f"{c['lost by kerchunk']} lost by kerchunk"]
    unread = sum(1 for r in rows if r["cls"] == "source unreadable")
    clients = len({r["client"] for r in counted}) or 1
    return (f"conformance: {len(variables)} variables + {len(groups)} groups x {clients} clients "
            f"({len(counted)} results): " + ", ".join(parts) + f"; {unread} not readable in the source")


def cause(reason: str) -> str:
    """A reason with its numbers and values taken out, so that results with one cause group together."""
    first = reason.split("; ")[0]
    first = re.sub(r"mount .*?, source .*", "mount X, source Y", first)
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", first)
    return re.sub(r"\d+", "N", first)[:150]


def table(rows: List[dict]) -> str:
    """Every result that is not identical, grouped by class, client and cause (with examples)."""
    by = defaultdict(list)
    for r in rows:
        if r["cls"] == "identical":
            continue
        by[(row_class(r), r["client"], cause(r["reason"]))].append(r)
    lines = []
    for (cls, client, why), group in sorted(by.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
        where = sorted({f"{r['cdl']}:{r['var']}" + ("" if r["variant"] == "source" else " (deflated)")
                        for r in group})
        more = "" if len(where) <= 4 else f" (+{len(where) - 4} more)"
        lines.append(f"{cls:<20} {client:<8} {len(group):>4}  {why}\n{'':<35}e.g. {group[0]['reason'][:200]}"
                     f"\n{'':<35}{', '.join(where[:4])}{more}")
    return "\n".join(lines)


def markdown(rows: List[dict], summary: str, mount_args: str) -> str:
    """Every result that is not identical, one line each, grouped by class, client and cause."""
    by = defaultdict(list)
    for r in rows:
        if r["cls"] != "identical":
            by[(row_class(r), r["client"], cause(r["reason"]))].append(r)
    out = ["# Conformance run: every result that is not identical", "",
           f"`python -m tests.conformance.run{' --mount-args=' + repr(mount_args) if mount_args else ''}`", "",
           f"    {summary}", ""]
    for (cls, client, why), group in sorted(by.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
        out += [f"## {cls} · {client} · {len(group)} · {why}", "", "| file | variant | variable | reason |",
                "|---|---|---|---|"]
        for r in sorted(group, key=lambda r: (r["cdl"], r["var"], r["variant"])):
            reason = r["reason"].replace("|", "\\|").replace("\n", " ")[:400]
            out.append(f"| {r['cdl']} | {r['variant']} | {r['var']} | {reason} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("cdl", nargs="*", help="CDL files relative to tests/conformance/cdl (default: all), or paths "
                    "of netCDF-4/HDF5 files to measure as they are")
    ap.add_argument("--slice", action="store_true", help="only the CI slice (tests/conformance/slice.txt)")
    ap.add_argument("--jobs", type=int, default=2, help="CDLs run in parallel (default 2)")
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    ap.add_argument("--markdown", type=Path, help="write every non-identical result as a Markdown table here")
    ap.add_argument("--mount-args", default="",
                    help='extra options for refmount mount, e.g. --mount-args="--chars string"')
    ap.add_argument("--direct", action="store_true",
                    help="mount each .nc itself (refmount mount FILE MNT, scanned by refmount) instead of kerchunk's "
                    "references of it; kerchunk's references still tell what kerchunk loses")
    ap.add_argument("--from-report", type=Path, help="print (and --markdown) an earlier --out report instead of running")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--isolate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--snapshot", nargs=5, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.from_report:
        report = json.loads(args.from_report.read_text())
        rows = report["rows"]
        print(table(rows))
        print(summarise(rows))
        if args.markdown:
            args.markdown.write_text(markdown(rows, summarise(rows), report.get("mount_args", "")))
        return 0
    if args.snapshot:
        import pickle

        from tests.conformance.snapshot import snapshot

        client, path, zarr, groups, out = args.snapshot
        shot = snapshot(client, Path(path), zarr == "zarr", json.loads(groups))
        with open(out, "wb") as f:
            pickle.dump(shot, f)
        return 0
    if args.one:
        rows = run_one(args.one, args.work, shlex.split(args.mount_args), args.isolate, args.direct)
        (args.work / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
        return 0

    names = args.cdl or (slice_list() if args.slice else corpus())
    names = [str(Path(n).resolve()) if _is_data_file(n) else n for n in names]
    for n in names:
        if not (_is_data_file(n) or (CDL_DIR / n).is_file()):
            print(f"conformance: no such CDL or netCDF-4 file: {n}", file=sys.stderr)
            return 2
    t0 = time.monotonic()
    rows: List[dict] = []
    with tempfile.TemporaryDirectory(prefix="refmount-conformance-") as tmp:
        def one(n):
            return run_cdl_child(n, Path(tmp) / n.strip("/").replace("/", "__"), args.mount_args, direct=args.direct)

        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for n, result in zip(names, pool.map(one, names)):
                rows += result
                bad = sum(1 for r in result if r["cls"] not in ("identical", "source unreadable"))
                print(f"  {n}: {len(result)} results, {bad} not identical "
                      f"({result[0].get('seconds', 0) if result else 0} s)", file=sys.stderr, flush=True)
    print(table(rows))
    summary = summarise(rows)
    print(summary)
    if args.markdown:
        args.markdown.write_text(markdown(rows, summary, args.mount_args))
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "cdls": names, "mount_args": args.mount_args,
                                        "seconds": round(time.monotonic() - t0, 1), "rows": rows},
                                       indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
