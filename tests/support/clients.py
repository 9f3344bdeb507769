"""Reading a mounted (or local) Zarr tree with real clients, and an oracle to compare against.

- ``oracle_variables(nc)``: every variable of a netCDF-4 file, all groups, read by
  netCDF4-python with ``set_auto_maskandscale(False)`` (raw stored values).
- ``served(array, view)``: what an oracle array looks like once served by refmount
  (decoded view: byte strings as ``u1`` with a trailing strlen dimension for ``|Sn``,
  scalars as shape [1], bool as ``u1``, little-endian); every client result is normalised the same way
  by ``bytes_form`` so char data is compared byte for byte.
- ``ncdump(...)`` + ``parse_ncdump(text)``: a parser of ncdump's CDL ``data:`` sections.
- ``assert_same(got, expected, ...)``: dtype, shape and NaN-aware value equality.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

# The netCDF-C programs (ncdump, nccopy, ncgen, NCO, CDO, GDAL's) of another userland, such as a `debootstrap
# trixie` tree (Debian 13: netCDF-C 4.9.3): each runs chrooted there, in a mount namespace of its own with
# /dev, /proc, /sys, /tmp and this checkout bound in at their own paths (so that it sees the test's files
# and mounts). Unset: the system's own programs.
NETCDF_ROOT = os.environ.get("REFMOUNT_TEST_NETCDF_ROOT", "")
_REPO = str(Path(__file__).resolve().parents[2])
_CHROOT = ('set -e; r=$1; shift; for d in /dev /proc /sys /tmp "$REPO"; do mkdir -p "$r$d"; '
           'mount --rbind "$d" "$r$d"; done; exec chroot "$r" "$@"')


def tool(name: str) -> list[str]:
    """The command that runs netCDF-C's (or NCO's, CDO's, GDAL's) program `name`: /usr/bin/<name>, or
    that of REFMOUNT_TEST_NETCDF_ROOT's userland."""
    if not NETCDF_ROOT:
        return [f"/usr/bin/{name}"]
    return ["env", f"REPO={_REPO}", "unshare", "-m", "--propagation", "slave", "sh", "-c", _CHROOT, "sh",
            NETCDF_ROOT, f"/usr/bin/{name}"]


def tool_exists(name: str) -> bool:
    return Path(f"{NETCDF_ROOT}/usr/bin/{name}").exists()


def tool_name(args) -> str:
    """The program a `tool` command runs (for messages)."""
    return next((Path(a).name for a in args if str(a).startswith("/usr/bin/")), Path(args[0]).name)


_versions: dict = {}


def netcdf_version() -> tuple[int, int, int]:
    """The netCDF-C version the `tool` programs run with (ncdump says it; NCO and CDO use the same
    userland's library): it decides which metadata form of the decoded view they read."""
    if "ncdump" not in _versions:
        proc = subprocess.run(tool("ncdump"), capture_output=True, text=True)
        found = re.search(r"netcdf library version (\d+)\.(\d+)\.(\d+)", proc.stdout + proc.stderr)
        _versions["ncdump"] = tuple(int(x) for x in found.groups()) if found else (0, 0, 0)
    return _versions["ncdump"]


def tool_url(path) -> str:
    """The url this system's netCDF-C programs (ncdump, NCO, CDO) open a local Zarr directory by, in the
    conformance harness: ``mode=zarr,file`` for 4.9.0, which reads its form (no NCZarr keys) the same in
    both modes, and whose own NCZarr stores (the harness's proof of a reader's limitation) it reads as
    Zarr only so; ``mode=nczarr,file`` from 4.9.3 on."""
    if netcdf_form(netcdf_version()) == "nc49":
        return f"file://{Path(path).resolve()}#mode=zarr,file"
    return nczarr_url(path)


def netcdf_form(version: tuple[int, int, int]) -> str:
    """The decoded view's form for a netCDF-C version (refmount.fuse.readers)."""
    from refmount.fuse.readers import netcdf_form as form

    return form(version)


NCDUMP = tool("ncdump")


def nczarr_url(path) -> str:
    """The netCDF-C url of a local Zarr directory in the mode the docs name (docs/views-and-clients.md):
    ``mode=nczarr,file``. netCDF-C >= 4.9.3 reads the decoded view's "nczarr" form exactly only so;
    4.9.0 reads its "nc49" form (no NCZarr superblock) as in ``mode=zarr,file``. See NOTES.md §2."""
    return f"file://{Path(path).resolve()}#mode=nczarr,file"


# ----------------------------------------------------------------------------- the oracle


@dataclass
class OracleVar:
    path: str  # "t3", "forecast/surface/t2" (no leading slash)
    values: np.ndarray  # raw stored values, as netCDF4-python reads the source file
    fill: object  # _FillValue attribute, else netCDF's default fill for the type (or None)
    dimensions: Tuple[str, ...] = ()

    @property
    def group(self) -> str:
        return self.path.rpartition("/")[0]

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]


def _walk_groups(ds, prefix: str = "") -> Iterator[Tuple[str, object]]:
    yield prefix, ds
    for name, g in ds.groups.items():
        yield from _walk_groups(g, f"{prefix}/{name}" if prefix else name)


def oracle_groups(nc_path) -> List[str]:
    """Every group path of a netCDF file ("" = root), depth first."""
    import netCDF4

    with netCDF4.Dataset(nc_path) as ds:
        return [p for p, _ in _walk_groups(ds)]


def oracle_variables(nc_path) -> Dict[str, OracleVar]:
    """{path: OracleVar} for every variable of every group of ``nc_path``."""
    import netCDF4

    out = {}
    with netCDF4.Dataset(nc_path) as ds:
        for gpath, g in _walk_groups(ds):
            for name, v in g.variables.items():
                v.set_auto_maskandscale(False)
                v.set_auto_chartostring(False)
                values = np.array(v[...])
                fill = v.__dict__.get("_FillValue")
                if fill is None:
                    fill = netCDF4.default_fillvals.get(v.dtype.str[1:])
                path = f"{gpath}/{name}" if gpath else name
                out[path] = OracleVar(path, values, fill, tuple(v.dimensions))
    return out


# ----------------------------------------------------------------------------- normalisation


def bytes_form(a: np.ndarray) -> np.ndarray:
    """Byte strings as unsigned bytes: ``|Sn`` of shape s -> ``u1`` of shape s + (n,) (n > 1),
    ``|S1`` -> ``u1`` of the same shape. Other dtypes: made native-endian (values kept)."""
    a = np.asarray(a)
    if a.dtype.kind == "S":
        n = a.dtype.itemsize
        b = np.ascontiguousarray(a).view("u1").reshape(a.shape + (n,))
        return b[..., 0] if n == 1 else b
    if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and not np.little_endian):
        return a.astype(a.dtype.newbyteorder("<"))
    return a


def served(values: np.ndarray, view: str = "decoded") -> np.ndarray:
    """The oracle array as the ``view`` serves it (before any client decoding); "nczarr": the decoded
    view in an NCZarr form read in nczarr mode (netCDF-C >= 4.9.3), where a scalar is a scalar; "zarr":
    the decoded view as zarr-python reads it (its zarr form, or zarr.json: scalars are scalars)."""
    a = bytes_form(values)
    if view == "decoded" and a.ndim == 0:
        a = a.reshape(1)  # scalars are served as shape [1]
    if view in ("decoded", "nczarr", "zarr") and a.dtype.kind == "b":
        a = a.astype("u1")  # bool is served as |u1 0/1
    return a


def same_values(got: np.ndarray, expected: np.ndarray) -> bool:
    if got.shape != expected.shape:
        return False
    if expected.dtype.kind in "fc":
        return bool(np.array_equal(got, expected, equal_nan=True))
    return bool(np.array_equal(got, expected))


def describe_difference(got: np.ndarray, expected: np.ndarray, limit: int = 5) -> str:
    if got.shape != expected.shape:
        return f"shape {got.shape} != expected {expected.shape}"
    if expected.dtype.kind in "fc" and got.dtype.kind in "fc":
        bad = ~((got == expected) | (np.isnan(got) & np.isnan(expected)))
    else:
        bad = got != expected
    idx = np.argwhere(bad)
    lines = [f"{len(idx)} of {expected.size} values differ"]
    for i in idx[:limit]:
        t = tuple(int(x) for x in i)
        lines.append(f"  at {t}: got {got[t]!r}, expected {expected[t]!r}")
    return "\n".join(lines)


def assert_same(got, expected: np.ndarray, what: str, check_dtype: bool = True) -> None:
    """``got`` (normalised with bytes_form) equals ``expected``: dtype, shape, values (NaN == NaN)."""
    got = bytes_form(np.asarray(got))
    if check_dtype:
        assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != expected {expected.dtype}"
    assert same_values(got, expected), f"{what}: " + describe_difference(got, expected)


# ----------------------------------------------------------------------------- ncdump

class _Fill:
    """ncdump's "_" marker: one object, also after pickling (a snapshot taken in another process)."""

    def __repr__(self) -> str:
        return "_"

    def __reduce__(self) -> str:
        return "FILL"


FILL = _Fill()  # ncdump's "_" marker: the value equals the variable's fill value


def ncdump(target: str, variables: Optional[List[str]] = None, timeout: float = 60) -> str:
    """Run Debian's ncdump; ``variables`` are paths without a leading slash
    ("t2" matches t2 in every group, "forecast/t3" only that one; "/t2" is an error).
    ``-p 9,17`` prints floats and doubles with enough digits to round-trip exactly."""
    cmd = [*NCDUMP, "-p", "9,17"]
    if variables:
        cmd += ["-v", ",".join(variables)]
    proc = subprocess.run(cmd + [target], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} {target} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<comment>//[^\n]*)
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<punct>[{},;=:])
    | (?P<word>[^\s{},;=:"]+)
    """,
    re.VERBOSE | re.DOTALL,
)

_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92, "'": 39, '"': 34,
            "?": 63, "0": 0}


def _tokens(text: str) -> List[Tuple[str, str]]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"ncdump output: cannot tokenise at {text[pos:pos + 40]!r}")
        pos = m.end()
        kind = m.lastgroup
        if kind not in ("ws", "comment"):
            out.append((kind, m.group()))
    return out


def unescape_cdl_string(literal: str) -> bytes:
    """A CDL string literal (with quotes) as bytes: \\n, \\t, \\", \\\\, octal \\ooo, \\xhh."""
    body = literal[1:-1].encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != 0x5C or i + 1 == len(body):  # not a backslash
            out.append(c)
            i += 1
            continue
        nxt = chr(body[i + 1])
        if nxt in "01234567":
            j = i + 1
            while j < len(body) and j < i + 4 and chr(body[j]) in "01234567":
                j += 1
            out.append(int(body[i + 1:j], 8) & 0xFF)
            i = j
        elif nxt == "x":
            j = i + 2
            while j < len(body) and j < i + 4 and chr(body[j]) in "0123456789abcdefABCDEF":
                j += 1
            out.append(int(body[i + 2:j], 16))
            i = j
        else:
            out.append(_ESCAPES.get(nxt, ord(nxt)))
            i += 2
    return bytes(out)


# CDL type suffixes: b/B byte, ub ubyte, s/S short, us ushort, u/U uint, l/L (old int), ll int64,
# ull uint64, f/F float, d/D double.
_SUFFIX = re.compile(r"(?i)(ull|ll|ub|us|ul|[bsulfd])$")
_SPECIAL = {"nan": math.nan, "nanf": math.nan, "infinity": math.inf, "infinityf": math.inf,
            "inf": math.inf, "inff": math.inf}


def parse_cdl_number(word: str):
    """One CDL data value: int, float, NaN/nan, [-]Infinity, with an optional type suffix."""
    w = word.strip()
    sign = -1.0 if w.startswith("-") else 1.0
    special = _SPECIAL.get(w.lstrip("+-").lower())
    if special is not None:
        return sign * special if not math.isnan(special) else math.nan
    core = w
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", core):
        core = _SUFFIX.sub("", w)
    if re.fullmatch(r"[+-]?\d+", core):
        return int(core)
    return float(core)  # ValueError for anything that is not a number


@dataclass
class DumpedVar:
    path: str
    items: list = field(default_factory=list)  # numbers, FILL, or bytes (string literals)

    def array(self, shape: Tuple[int, ...], dtype: np.dtype, fill) -> np.ndarray:
        """The values as an array of ``shape``/``dtype``; FILL markers become ``fill``.

        String literals (char variables) are padded with NULs to the last dimension's length
        (ncdump drops trailing NULs of each row) and concatenated."""
        dtype = np.dtype(dtype)
        if any(isinstance(x, bytes) for x in self.items):
            row = shape[-1] if shape else 1
            data = b"".join(x.ljust(row, b"\0") if isinstance(x, bytes) else bytes([x]) for x in self.items)
            a = np.frombuffer(data, dtype="u1")
            return a.astype(dtype).reshape(shape) if a.size == math.prod(shape) else a
        values = [fill if x is FILL else x for x in self.items]
        if any(v is None for v in values):
            raise ValueError(f"{self.path}: '_' in the dump but no fill value is known")
        a = np.array(values, dtype=dtype)
        return a.reshape(shape) if a.size == math.prod(shape) else a

    def fill_mask(self) -> np.ndarray:
        return np.array([x is FILL for x in self.items], dtype=bool)


def parse_ncdump(text: str) -> Dict[str, DumpedVar]:
    """Every ``var = values ;`` of the ``data:`` sections of an ncdump output, all groups.

    Keys are variable paths without a leading slash ("t3", "forecast/surface/t2"). Values
    are numbers (type suffixes such as ``f``, ``b``, ``s`` are dropped; NaN, nan, Infinity
    understood), ``FILL`` for ``_`` and bytes for string literals. Group structure is
    followed through ``group: NAME {`` ... ``}``. (User-defined types are not supported.)
    """
    toks = _tokens(text)
    out: Dict[str, DumpedVar] = {}
    # one frame per open brace: [group name or None ("netcdf NAME {"), inside its data: section]
    frames: List[list] = []
    pending_group: Optional[str] = None
    i = 0
    n = len(toks)

    def at(j, kind=None, value=None):
        if j >= n:
            return False
        k, v = toks[j]
        return (kind is None or k == kind) and (value is None or v == value)

    while i < n:
        kind, value = toks[i]
        if kind == "punct" and value == "{":
            frames.append([pending_group, False])
            pending_group = None
            i += 1
            continue
        if kind == "punct" and value == "}":
            frames.pop()
            i += 1
            continue
        if kind == "word" and value == "group" and at(i + 1, "punct", ":") and at(i + 2, "word") \
                and at(i + 3, "punct", "{"):
            pending_group = toks[i + 2][1].replace("\\", "")
            i += 3  # the "{" opens the frame
            continue
        if kind == "word" and value == "data" and at(i + 1, "punct", ":") and frames:
            frames[-1][1] = True
            i += 2
            continue
        if frames and frames[-1][1] and kind in ("word", "string") and at(i + 1, "punct", "="):
            name = value.replace("\\", "")  # CDL escapes special characters in names
            groups = [f[0] for f in frames if f[0] is not None]
            path = "/".join(groups + [name])
            var = out.setdefault(path, DumpedVar(path))
            var.items.clear()
            i += 2
            while i < n and not at(i, "punct", ";"):
                k, v = toks[i]
                if k == "punct" and v == ",":
                    pass
                elif k == "string":
                    var.items.append(unescape_cdl_string(v))
                elif k == "word" and v == "_":
                    var.items.append(FILL)
                elif k == "word":
                    var.items.append(parse_cdl_number(v))
                else:
                    raise ValueError(f"ncdump output: unexpected {v!r} in the data of {path}")
                i += 1
            i += 1  # the ";"
            continue
        i += 1
    if frames:
        raise ValueError("ncdump output: unbalanced braces (truncated dump?)")
    return out


def compare_dumped(dumped: DumpedVar, expected: np.ndarray, fills, what: str) -> None:
    """Values of one ncdump variable equal ``expected`` (already in served form).

    A ``_`` marker must stand where ``expected`` holds one of ``fills`` (the values that
    netCDF-C may treat as this variable's fill value)."""
    items = dumped.items
    if any(isinstance(x, bytes) for x in items):
        got = dumped.array(expected.shape, expected.dtype, None)
        assert same_values(got, expected), f"{what}: " + describe_difference(got, expected)
        return
    assert len(items) == expected.size, f"{what}: ncdump printed {len(items)} values, expected {expected.size}"
    flat = expected.reshape(-1)
    mask = dumped.fill_mask()
    fill_values = []
    for f in fills:
        try:
            with np.errstate(all="ignore"):
                cast = np.array(f).astype(expected.dtype)
        except (TypeError, ValueError, OverflowError):
            continue
        if cast == f or (cast != cast and f != f):  # representable in the served type
            fill_values.append(cast)
    for j in np.flatnonzero(mask):
        ok = any(flat[j] == f or (f != f and flat[j] != flat[j]) for f in fill_values)
        assert ok, f"{what}: ncdump printed '_' at flat index {j} but the value is {flat[j]!r} (fills {fill_values})"
    numbers = np.array([0 if x is FILL else x for x in items], dtype=expected.dtype)
    got = np.where(mask, flat, numbers) if mask.any() else numbers
    got = got.reshape(expected.shape)
    assert same_values(got, expected), f"{what}: " + describe_difference(got, expected)


# ----------------------------------------------------------------------------- a synthetic set


def _encode_chunks(name: str, arr: np.ndarray, zarray: dict, refs: dict, skip=()) -> None:
    import base64

    import numcodecs

    dt = np.dtype(zarray["dtype"])
    chunks = zarray["chunks"]
    sep = zarray.get("dimension_separator") or "."
    codecs = [numcodecs.get_codec(c) for c in (zarray.get("filters") or [])]
    if zarray.get("compressor"):
        codecs.append(numcodecs.get_codec(zarray["compressor"]))
    fill = zarray.get("fill_value")
    grid = [-(-s // c) for s, c in zip(arr.shape, chunks)] or [1]
    for idx in np.ndindex(*grid):
        key = sep.join(map(str, idx))
        if key in skip:
            continue
        if arr.ndim:
            block = arr[tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks))]
            full = np.zeros(chunks, dtype=dt)
            if fill is not None and dt.kind in "fiu":
                full[...] = fill
            full[tuple(slice(0, b) for b in block.shape)] = block  # edge chunks are stored full size
        else:
            full = arr.astype(dt)
        data = full.tobytes(order=zarray.get("order", "C"))
        for codec in codecs:
            data = codec.encode(data)
        refs[f"{name}/{key}"] = "base64:" + base64.b64encode(bytes(data)).decode()


def synthetic_refs() -> Tuple[dict, Dict[str, OracleVar]]:
    """A hand-made v0 reference set (all chunks inline) of the Zarr features the netCDF fixtures
    never produce, and its oracle (the numpy arrays themselves): ``|S5`` byte strings, bool,
    Fortran order, one dimension name with two lengths, a compressed big-endian scalar, the "/"
    dimension separator, shuffle+zlib big-endian int64, a chunk longer than its array, and a
    missing chunk in an array with a fill value.

    ``s5`` is the one the decoded view must reshape: |S5 of shape (5,) with chunks (2,) becomes
    u1 of shape (5, 5) with chunks (2, 5), so its chunk keys "0".."2" must answer as "0.0".."2.0"."""
    refs = {".zgroup": '{"zarr_format": 2}', ".zattrs": '{"title": "refmount synthetic"}'}
    oracle: Dict[str, OracleVar] = {}
    zlib = {"id": "zlib", "level": 1}

    def add(name, values, chunks, dims, dtype=None, compressor=None, filters=None, fill=None,
            order="C", sep=None, skip=()):
        values = np.asarray(values, dtype=dtype)
        zarray = {"zarr_format": 2, "shape": list(values.shape), "chunks": list(chunks),
                  "dtype": values.dtype.str, "compressor": compressor, "filters": filters,
                  "fill_value": fill, "order": order}
        if sep:
            zarray["dimension_separator"] = sep
        refs[f"{name}/.zarray"] = json.dumps(zarray)
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": list(dims)})
        _encode_chunks(name, values, zarray, refs, skip)
        expected = values.copy()
        if skip:  # missing chunks read as the fill value
            for key in skip:
                idx = [int(p) for p in key.split(sep or ".")]
                expected[tuple(slice(i * c, (i + 1) * c) for i, c in zip(idx, chunks))] = fill
        oracle[name] = OracleVar(name, expected, fill, tuple(dims))

    add("s5", [b"ab", b"hello", b"", b"xyzzy", b"q"], [2], ["n5"], dtype="S5", compressor=zlib)
    add("flag", [True, False, True, True], [4], ["n4"], dtype="|b1")
    add("fort", np.arange(12).reshape(3, 4), [2, 3], ["r", "c"], dtype="<f4", order="F")
    add("clash_a", np.arange(4), [4], ["d"], dtype="<i2")
    add("clash_b", np.arange(6) * 10, [4], ["d"], dtype="<i2")
    add("scalar_big", 2.5, [], [], dtype=">f8", compressor=zlib)
    add("slash", np.arange(20).reshape(4, 5), [2, 2], ["sy", "sx"], dtype="<i4", sep="/",
        compressor={"id": "zstd", "level": 1})
    add("bigsh", np.arange(30).reshape(5, 6) - 7, [2, 4], ["by", "bx"], dtype=">i8",
        filters=[{"id": "shuffle", "elementsize": 8}], compressor=zlib)
    add("long_chunk", [0.5, 1.5, 2.5], [10], ["lc"], dtype="<f8", compressor=zlib)
    add("gappy", np.arange(36).reshape(6, 6) / 4, [3, 3], ["gy", "gx"], dtype="<f4", fill=-1.0,
        skip=("1.0",))
    return refs, oracle
