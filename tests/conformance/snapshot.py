"""What one client shows of one dataset (a netCDF file, a mount, or a copy of it), in a comparable form.

A snapshot is ``{"vars": {path: VarShot}, "groups": {group path: attrs}, "error": str | None}``; a
variable that fails to read has ``error`` set. Paths have no leading slash ("t", "g1/g2/t"); group
paths are "" for the root. Three clients:
- ``ncdump``: Debian's ncdump; types and attributes from the header as printed, values as the printed
  items (numbers, the ``_`` fill marker, strings), so source and mount are compared as a user sees them;
- ``netcdf4``: netCDF4-python (its bundled libnetcdf), masked/scaled and raw;
- ``xarray``: ``open_dataset`` (source) or ``open_zarr(consolidated=False)`` (Zarr), default decoding.
"""

from __future__ import annotations

import re
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from tests.conformance.header import parse_header
from tests.support.clients import NCDUMP, nczarr_url, parse_ncdump, tool, tool_name, tool_url

NCDUMP_TIMEOUT = 60


@dataclass
class VarShot:
    type: str = ""
    shape: tuple = ()
    dims: tuple = ()
    attrs: dict = field(default_factory=dict)  # name -> (type string, value)
    values: object = None  # ncdump: list of items; netcdf4: masked array; xarray: ndarray
    raw: object = None  # netcdf4 only: values with set_auto_maskandscale(False)
    error: Optional[str] = None


def first_line(e: BaseException | str) -> str:
    text = str(e).strip() or type(e).__name__
    line = text.splitlines()[0]
    if isinstance(e, BaseException) and type(e).__name__ not in line:
        line = f"{type(e).__name__}: {line}"
    return line[:300]


def target_of(path: Path, client: str, zarr: bool) -> str:
    """ncdump, NCO and CDO: the mode their netCDF-C reads the mount by (tests.support.clients.tool_url)."""
    if client == "ncdump" and zarr:
        return tool_url(path)
    return str(path)


# ----------------------------------------------------------------------------- ncdump


def ncdump_snapshot(path: Path, zarr: bool) -> dict:
    """The header comes from ``ncdump -h`` (cheap to parse), the values from the full dump; if the full
    dump fails, each variable is dumped alone (``-v``) to find which ones fail."""
    target = target_of(path, "ncdump", zarr)

    def fail(proc) -> str:
        return ("ncdump timed out" if proc is None else _ncdump_failure(proc)).replace(target, "TARGET")

    hproc = _run(target, ["-h"])
    if hproc is None or hproc.returncode != 0:
        return {"vars": {}, "groups": {}, "error": f"ncdump -h: {fail(hproc)}"}
    head = parse_header(hproc.stdout)
    out = {vpath: VarShot(type=hv.type, dims=hv.dims, attrs=dict(hv.attrs)) for vpath, hv in head.variables.items()}
    shot = {"vars": out, "groups": head.group_attrs, "error": None}
    proc = _run(target, [])
    if proc is not None and proc.returncode == 0 and _fill_values(out, proc.stdout):
        return shot
    # The whole dump failed (or holds data the parser does not read, e.g. compound values): one by one.
    for vpath, var in out.items():
        vproc = _run(target, ["-v", vpath])
        if vproc is None or vproc.returncode != 0:
            var.error = fail(vproc)
        else:
            _fill_values({vpath: var}, vproc.stdout)
    return shot


def _run(target: str, args: List[str]) -> Optional[subprocess.CompletedProcess]:
    try:
        return subprocess.run([*NCDUMP, "-p", "9,17", *args, target], capture_output=True, text=True,
                              errors="surrogateescape", timeout=NCDUMP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None


def _ncdump_failure(proc) -> str:
    if proc.returncode < 0:
        return f"ncdump killed by signal {-proc.returncode}"
    msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
    return f"ncdump exit {proc.returncode}: {msg}"[:300]


def _fill_values(shots: Dict[str, VarShot], text: str) -> bool:
    try:
        data = parse_ncdump(text)
    except ValueError as e:
        for shot in shots.values():
            shot.error = f"ncdump output not parseable by this harness: {first_line(e)}"
        return False
    for vpath, shot in shots.items():
        shot.error = None
        if vpath in data:
            shot.values = data[vpath].items
    return True


# ----------------------------------------------------------------------------- netCDF4-python


def attr_form(value) -> tuple:
    """(type string, comparable value) of an attribute value as a Python client returns it."""
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, bytes):
        return ("bytes", value)
    if isinstance(value, (list, tuple)):
        return ("list", [attr_form(v) for v in value])
    a = np.asarray(value)
    dt = a.dtype
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    if dt.kind in "OUS":
        return (dt.kind, a.tolist())
    return (dt.str, a.astype(dt).reshape(-1).tolist())


def json_attr_form(value) -> tuple:
    """xarray's view of an attribute, compared by value only: Zarr keeps attributes as JSON, which has no
    numeric types (a Zarr store opened by xarray gives Python ints, floats and lists for every variable)."""
    if isinstance(value, (str, bytes)):
        return attr_form(value)
    a = np.asarray(value, dtype=object if isinstance(value, (list, tuple)) else None)
    if a.dtype.kind in "biuf" or a.dtype.kind == "O":
        try:
            return ("number(s)", [x.item() if hasattr(x, "item") else x for x in a.reshape(-1).tolist()])
        except (TypeError, ValueError):
            pass
    return attr_form(value)


def _walk(ds, prefix=""):
    yield prefix, ds
    for name, g in ds.groups.items():
        yield from _walk(g, f"{prefix}/{name}" if prefix else name)


def netcdf4_snapshot(path: Path, zarr: bool) -> dict:
    import netCDF4

    target = nczarr_url(path) if zarr else str(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = netCDF4.Dataset(target)
    except Exception as e:  # noqa: BLE001 - any failure of the client is a result
        return {"vars": {}, "groups": {}, "error": first_line(e)}
    out, groups = {}, {}
    try:
        for gpath, g in _walk(ds):
            groups[gpath] = {a: attr_form(g.getncattr(a)) for a in g.ncattrs()}
            for name, v in g.variables.items():
                vpath = f"{gpath}/{name}" if gpath else name
                shot = VarShot()
                out[vpath] = shot
                try:
                    shot.type = str(v.dtype)
                    shot.shape = tuple(v.shape)
                    shot.dims = tuple(v.dimensions)
                    shot.attrs = {a: attr_form(v.getncattr(a)) for a in v.ncattrs()}
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        v.set_auto_maskandscale(True)
                        shot.values = np.ma.asarray(v[...])
                        v.set_auto_maskandscale(False)
                        shot.raw = np.asarray(v[...])
                except Exception as e:  # noqa: BLE001
                    shot.error = first_line(e)
    except Exception as e:  # noqa: BLE001
        return {"vars": out, "groups": groups, "error": first_line(e)}
    finally:
        ds.close()
    return {"vars": out, "groups": groups, "error": None}


# ----------------------------------------------------------------------------- xarray


def xarray_snapshot(path: Path, zarr: bool, group_paths: List[str], engine: str = "zarr") -> dict:
    """`engine` "netcdf4": xarray's netcdf4 engine, on the mount through netCDF-C's Zarr url."""
    import xarray as xr

    out, groups, errors = {}, {}, []
    for gpath in group_paths:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if zarr and engine == "netcdf4":
                    ds = xr.open_dataset(nczarr_url(path), group=gpath or None, engine="netcdf4")
                elif zarr:
                    ds = xr.open_zarr(str(path), group=gpath or None, consolidated=False)
                else:
                    ds = xr.open_dataset(str(path), group=gpath or None)
        except Exception as e:  # noqa: BLE001
            errors.append(f"group {gpath or '/'}: {first_line(e)}")
            groups[gpath] = {"__error__": first_line(e)}
            continue
        with ds:
            groups[gpath] = {a: json_attr_form(v) for a, v in ds.attrs.items()}
            for name, v in ds.variables.items():
                vpath = f"{gpath}/{name}" if gpath else name
                shot = VarShot()
                out[vpath] = shot
                try:
                    shot.type = str(v.dtype)
                    shot.shape = tuple(v.shape)
                    shot.dims = tuple(v.dims)
                    shot.attrs = {a: json_attr_form(x) for a, x in v.attrs.items()}
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        shot.values = np.asarray(v.values)
                except Exception as e:  # noqa: BLE001
                    shot.error = first_line(e)
    return {"vars": out, "groups": groups, "error": "; ".join(errors) if errors and not out else None}


# ----------------------------------------------------------------------------- NCO, CDO and GDAL (Debian's)

NCKS, CDO, GDALMDIMINFO = tool("ncks"), tool("cdo"), tool("gdalmdiminfo")
TOOL_TIMEOUT = 60


def _tool(cmd: List[str]) -> subprocess.CompletedProcess | str:
    """The finished process, or why it did not finish (a crash is named by its signal)."""
    import signal

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="surrogateescape", timeout=TOOL_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"{tool_name(cmd)} timed out"
    if proc.returncode < 0:
        return f"{tool_name(cmd)} crashed ({signal.Signals(-proc.returncode).name})"
    return proc


def _tool_failure(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr or proc.stdout).strip().splitlines() if line.strip()]
    return f"{tool_name(proc.args)} exit {proc.returncode}: {(lines or ['(no message)'])[-1][:240]}"


def _loads(text: str):
    """JSON as NCO and GDAL print it (NaN and infinities bare, sometimes lower-case)."""
    import json
    import re

    text = re.sub(r"(?<![\w\"])(-?)\b(nan|inf|infinity)\b(?![\w\"])",
                  lambda m: m.group(1) + ("NaN" if m.group(2).lower() == "nan" else "Infinity"), text,
                  flags=re.IGNORECASE)
    return json.loads(text.replace("-NaN", "NaN"))


def nco_snapshot(path: Path, zarr: bool) -> dict:
    """``ncks --jsn_fmt=1``: every group's dimensions, variables (type, dimensions, attributes as JSON
    values, data as printed: fills are data) and attributes."""
    proc = _tool([*NCKS, "--jsn_fmt=1", target_of(path, "ncdump", zarr)])
    if isinstance(proc, str):
        return {"vars": {}, "groups": {}, "error": proc}
    if proc.returncode != 0:
        return {"vars": {}, "groups": {}, "error": _tool_failure(proc)}
    try:
        tree = _loads(proc.stdout)
    except ValueError as e:
        return {"vars": {}, "groups": {}, "error": f"ncks output not parseable by this harness: {first_line(e)}"}
    out, groups = {}, {}

    def walk(node: dict, gpath: str, dims: dict) -> None:
        dims = {**dims, **node.get("dimensions", {})}
        groups[gpath] = {a: ("json", v) for a, v in node.get("attributes", {}).items()}
        for name, v in node.get("variables", {}).items():
            vdims = tuple(v.get("shape", ()))
            out[f"{gpath}/{name}" if gpath else name] = VarShot(
                type=v.get("type", ""), dims=vdims, shape=tuple(dims.get(d, -1) for d in vdims),
                attrs={a: ("json", x) for a, x in v.get("attributes", {}).items()}, values=v.get("data"))
        for name, g in node.get("groups", {}).items():
            walk(g, f"{gpath}/{name}" if gpath else name, dims)

    walk(tree, "", {})
    return {"vars": out, "groups": groups, "error": None}


def cdo_snapshot(path: Path, zarr: bool) -> dict:
    """``cdo -s infon``: per variable (by name) its rows of date, time, level, grid size, missing
    points, minimum, mean and maximum. CDO reads gridded variables only: the others are not shown."""
    proc = _tool([*CDO, "-s", "infon", target_of(path, "ncdump", zarr)])
    if isinstance(proc, str):
        return {"vars": {}, "groups": {}, "error": proc}
    if proc.returncode != 0:
        return {"vars": {}, "groups": {}, "error": _tool_failure(proc)}
    out: Dict[str, VarShot] = {}
    # CDO takes one variable for its time axis (sinfon names it) and skips the others it would take for
    # time too (its warnings name them): none of them is shown as data
    skipped = re.findall(r"more than one time variable, skipped variable (.+?)!", proc.stderr)
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(" : ")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        head, stats, name = parts[1].split(), parts[2].split(), parts[3]
        shot = out.setdefault(name, VarShot(type="cdo", values=[]))
        shot.values.append((*head, *stats))
    time_axis = _tool([*CDO, "-s", "sinfon", target_of(path, "ncdump", zarr)])  # (its time coordinate's name)
    if not isinstance(time_axis, str):
        found = re.search(r"Time coordinate :\s*\n\s*(\S+) :", time_axis.stdout)
        skipped += [found.group(1)] if found else []
    return {"vars": out, "groups": {"": {}}, "error": None, "cdo_time_skipped": skipped}


def gdal_snapshot(path: Path, zarr: bool) -> dict:
    """``gdalmdiminfo -detailed``: GDAL's multidimensional view (the netCDF driver for the source, the
    Zarr driver for the mount): per array its data type, dimensions, values, nodata, scale, offset,
    unit and attributes (values only: the Zarr driver types attributes from JSON)."""
    proc = _tool([*GDALMDIMINFO, "-detailed", str(path)])
    if isinstance(proc, str):
        return {"vars": {}, "groups": {}, "error": proc}
    if proc.returncode != 0:
        return {"vars": {}, "groups": {}, "error": _tool_failure(proc)}
    try:
        tree = _loads(proc.stdout)
    except ValueError as e:
        return {"vars": {}, "groups": {}, "error": f"gdalmdiminfo output not parseable by this harness: {first_line(e)}"}
    out, groups = {}, {}

    def attrs_of(node: dict) -> dict:
        return {a: ("json", x.get("value") if isinstance(x, dict) and "value" in x else x)
                for a, x in (node.get("attributes") or {}).items()}

    def walk(node: dict, gpath: str) -> None:
        groups[gpath] = attrs_of(node)
        for name, a in (node.get("arrays") or {}).items():
            attrs = attrs_of(a)
            for key in ("nodata_value", "scale", "offset", "unit"):
                if key in a:
                    attrs[f"({key})"] = ("json", a[key])
            out[f"{gpath}/{name}" if gpath else name] = VarShot(
                type=str(a.get("datatype")), dims=tuple(_dimension_name(d) for d in a.get("dimensions", ())),
                shape=tuple(a.get("dimension_size", ())), attrs=attrs, values=a.get("values"))
        for name, g in (node.get("groups") or {}).items():
            walk(g, f"{gpath}/{name}" if gpath else name)

    walk(tree, "")
    return {"vars": out, "groups": groups, "error": None}


def _dimension_name(d) -> str:
    """gdalmdiminfo names a dimension by its full name, or describes one it has no name for."""
    if isinstance(d, dict):
        d = d.get("full_name") or d.get("name") or ""
    return str(d).rpartition("/")[2]


CLIENTS = ("ncdump", "netcdf4", "xarray", "nco", "cdo", "gdal")
# the clients whose snapshot of the mount runs in a process of its own: xarray's zarr engine as a
# program that has not loaded netCDF-C (the harness's own process has, for netcdf4)
OWN_PROCESS = ("xarray",)


def snapshot(client: str, path: Path, zarr: bool, group_paths: List[str]) -> dict:
    if client == "ncdump":
        shot = ncdump_snapshot(path, zarr)
    elif client == "netcdf4":
        shot = netcdf4_snapshot(path, zarr)
    elif client == "nco":
        shot = nco_snapshot(path, zarr)
    elif client == "cdo":
        shot = cdo_snapshot(path, zarr)
    elif client == "gdal":
        shot = gdal_snapshot(path, zarr)
    elif client == "xarray-netcdf4":  # (not in CLIENTS: compared as "xarray")
        shot = xarray_snapshot(path, zarr, group_paths, engine="netcdf4")
    else:
        shot = xarray_snapshot(path, zarr, group_paths)
    return without_paths(shot, path)


def without_paths(shot: dict, path: Path) -> dict:
    """Error messages with the dataset's path replaced by TARGET, so that the mount and its copy compare."""
    names = sorted({str(path), str(Path(path).resolve())}, key=len, reverse=True)

    def clean(text):
        for n in names:
            text = text.replace(n, "TARGET")
        return text

    if shot.get("error"):
        shot["error"] = clean(shot["error"])
    for attrs in shot["groups"].values():
        if "__error__" in attrs:
            attrs["__error__"] = clean(attrs["__error__"])
    for var in shot["vars"].values():
        if var.error:
            var.error = clean(var.error)
    return shot
