"""Real netCDF-4/HDF5 test files, their kerchunk reference sets, and byte oracles.

Everything here is deterministic (seeded numpy) and small: ``build_all(tmp_path)``
writes about a dozen files of a few KB each in well under a second.

Typical use::

    files = build_all(tmp_path)                     # {kind: Path}
    refs = kerchunk_refs(files["zlib"])             # v1 dict, urls = absolute local path
    refs_http = kerchunk_refs(files["zlib"], url=srv.url_for("zlib.nc"))
    oracle_bytes(refs, "t3/0.0.0")                  # exact bytes of that key

Reference-set conventions (see NOTES.md section 1):
- ``refs`` is a v1 dict ``{"version": 1, "refs": {...}}`` or a v0 dict (no "version").
- A value is inline data (``str``; ``base64:`` prefix = binary), a JSON object
  (its JSON text), ``[url]`` (whole file) or ``[url, offset, length]``.
"""

from __future__ import annotations

import base64
import bz2
import copy
import gzip
import itertools
import json
import lzma
import os
import shutil
import warnings
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import numpy as np

PathLike = Union[str, os.PathLike]

# The public sample file used by xarray/kerchunk tests (NCEP air temperature, 75 KB), shipped with
# the tests so that a fresh checkout runs them all; copied into build_all's output.
AIR_NC = Path(__file__).resolve().parent.parent / "data" / "air.nc"

# Shape shared by most fixtures: small but with several chunks in every dimension.
NT, NY, NX = 6, 10, 12

KINDS = (
    "zlib",          # zlib only (shuffle explicitly off: netCDF4 turns it on by default)
    "shuffle_zlib",  # shuffle + zlib
    "blosc",         # blosc filter 32001 (lz4 and zstd inner codecs)
    "zstd",          # zstd filter 32015
    "fletcher32",    # checksum filter (kerchunk drops the trailing 4 bytes)
    "bigendian",     # endian='big' variables: chunked, contiguous and compressed
    "contiguous",    # contiguous (unchunked) 1-D/2-D/3-D variables + one chunked
    "unlimited",     # unlimited time dimension, chunk longer than the current length
    "groups",        # nested groups, dims inherited from parent groups
    "missing",       # chunked variables with _FillValue and unwritten chunks
    "chars",         # char (S1) arrays, as netCDF stores fixed-length strings
    "scalar",        # scalar (shape ()) variables
    "attrs",         # non-ASCII and assorted attribute types
)


# ---------------------------------------------------------------------------- files


def _rng(kind: str) -> np.random.Generator:
    # A stable per-kind seed (hash() of str is salted per process, so not that).
    return np.random.default_rng(sum(kind.encode()) * 7919)


def _field(rng, shape, dtype="f4"):
    """Smooth-ish deterministic data (compresses a bit, unlike pure noise)."""
    base = np.add.outer(np.arange(shape[-2]), np.arange(shape[-1])).astype("f8")
    if len(shape) == 3:
        base = base[None] + 10.0 * np.arange(shape[0])[:, None, None]
    # Quantised to 1/8 so values compress: netCDF-C's blosc filter *fails the write*
    # ("Buffer is uncompressible") when a chunk does not shrink.
    noise = np.round(rng.normal(0, 0.5, size=shape) * 8) / 8
    return (base + noise).astype(dtype)


def _xyz(ds, time_size=NT):
    """Create time/lat/lon dimensions with coordinate variables."""
    ds.createDimension("time", time_size)
    ds.createDimension("lat", NY)
    ds.createDimension("lon", NX)
    t = ds.createVariable("time", "f8", ("time",))
    t.units = "hours since 2000-01-01 00:00:00"
    t.calendar = "standard"
    if time_size is not None:
        t[:] = np.arange(time_size) * 6.0
    lat = ds.createVariable("lat", "f4", ("lat",))
    lat.units = "degrees_north"
    lat[:] = np.linspace(-45, 45, NY)
    lon = ds.createVariable("lon", "f4", ("lon",))
    lon.units = "degrees_east"
    lon[:] = np.linspace(0, 330, NX)


def make_netcdf(directory: PathLike, kind: str, name: Optional[str] = None) -> Path:
    """Write one fixture file of the given ``kind`` (see KINDS); returns its path."""
    import netCDF4

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {KINDS}")
    path = Path(directory) / (name or f"{kind}.nc")
    rng = _rng(kind)
    with netCDF4.Dataset(path, "w", format="NETCDF4") as ds:
        ds.title = f"refmount fixture: {kind}"
        _BUILDERS[kind](ds, rng)
    return path


def _compressed(ds, rng, **comp):
    _xyz(ds)
    v3 = ds.createVariable("t3", "f4", ("time", "lat", "lon"), chunksizes=(2, 5, 6), **comp)
    v3.units = "K"
    v3[:] = _field(rng, (NT, NY, NX))
    v2 = ds.createVariable("t2", "f8", ("lat", "lon"), chunksizes=(5, 6), **comp)
    v2[:] = _field(rng, (NY, NX), "f8")
    # Chunks that do not divide the shape: edge chunks are partial (stored full-size).
    vi = ds.createVariable("i2", "i4", ("lat", "lon"), chunksizes=(4, 5), **comp)
    vi[:] = rng.integers(-100, 100, size=(NY, NX), dtype="i4")


def _b_zlib(ds, rng):
    _compressed(ds, rng, compression="zlib", complevel=4, shuffle=False)


def _b_shuffle_zlib(ds, rng):
    _compressed(ds, rng, compression="zlib", complevel=6, shuffle=True)


def _b_blosc(ds, rng):
    # netCDF-C's blosc filter fails the whole write ("Buffer is uncompressible") when
    # a chunk does not shrink, and blosc never compresses buffers < 128 bytes: so
    # bigger chunks here than in the other codecs' files.
    _xyz(ds)
    v = ds.createVariable("t3", "f4", ("time", "lat", "lon"), chunksizes=(2, 10, 12),
                          compression="blosc_lz4", complevel=5, blosc_shuffle=1)
    v[:] = _field(rng, (NT, NY, NX))
    v = ds.createVariable("t2", "f8", ("lat", "lon"), chunksizes=(5, 12),
                          compression="blosc_zstd", complevel=3, blosc_shuffle=2)
    v[:] = _field(rng, (NY, NX), "f8")
    v = ds.createVariable("i2", "i4", ("lat", "lon"), chunksizes=(10, 12),
                          compression="blosc_lz", blosc_shuffle=1)
    v[:] = rng.integers(-100, 100, size=(NY, NX), dtype="i4")


def _b_zstd(ds, rng):
    _compressed(ds, rng, compression="zstd", complevel=4)


def _b_fletcher32(ds, rng):
    # fletcher32 alone, and combined with shuffle+zlib (checksum is the last filter).
    _xyz(ds)
    v = ds.createVariable("t3", "f4", ("time", "lat", "lon"), chunksizes=(2, 5, 6),
                          fletcher32=True)
    v[:] = _field(rng, (NT, NY, NX))
    v = ds.createVariable("t2", "f8", ("lat", "lon"), chunksizes=(5, 6),
                          fletcher32=True, compression="zlib", shuffle=True)
    v[:] = _field(rng, (NY, NX), "f8")


def _b_bigendian(ds, rng):
    _xyz(ds)
    # The dtype must say big-endian too, or netCDF4 warns about the mismatch.
    v = ds.createVariable("t3", ">f4", ("time", "lat", "lon"), chunksizes=(2, 5, 6),
                          endian="big")
    v[:] = _field(rng, (NT, NY, NX))
    v = ds.createVariable("t2", ">f8", ("lat", "lon"), contiguous=True, endian="big")
    v[:] = _field(rng, (NY, NX), "f8")
    v = ds.createVariable("iz", ">i4", ("lat", "lon"), chunksizes=(5, 6), endian="big",
                          compression="zlib", shuffle=True, fill_value=-99)
    v[:] = rng.integers(-(2**30), 2**30, size=(NY, NX), dtype="i4")


def _b_contiguous(ds, rng):
    _xyz(ds)
    v = ds.createVariable("t3", "f4", ("time", "lat", "lon"), contiguous=True)
    v.units = "K"
    v[:] = _field(rng, (NT, NY, NX))
    v = ds.createVariable("t2", "f8", ("lat", "lon"), contiguous=True)
    v[:] = _field(rng, (NY, NX), "f8")
    v = ds.createVariable("c3", "i2", ("time", "lat", "lon"), chunksizes=(1, NY, NX))
    v[:] = rng.integers(-300, 300, size=(NT, NY, NX), dtype="i2")


UNLIMITED_LEN = 5     # current length of the unlimited dimension
UNLIMITED_CHUNK = 8   # chunk length along it (> current length)


def _b_unlimited(ds, rng):
    _xyz(ds, time_size=None)  # time unlimited
    ds["time"][:] = np.arange(UNLIMITED_LEN) * 6.0
    v = ds.createVariable("t3", "f4", ("time", "lat", "lon"),
                          chunksizes=(UNLIMITED_CHUNK, 5, 6), compression="zlib")
    v[:] = _field(rng, (UNLIMITED_LEN, NY, NX))
    v = ds.createVariable("ts", "f8", ("time",), chunksizes=(UNLIMITED_CHUNK,))
    v[:] = rng.normal(size=UNLIMITED_LEN)


def _b_groups(ds, rng):
    _xyz(ds)
    v = ds.createVariable("t2", "f4", ("lat", "lon"))
    v[:] = _field(rng, (NY, NX))
    g1 = ds.createGroup("forecast")
    g1.model = "toy"
    g1.createDimension("member", 3)
    m = g1.createVariable("member", "i4", ("member",))
    m[:] = [1, 2, 3]
    v = g1.createVariable("t3", "f4", ("member", "lat", "lon"), chunksizes=(1, 5, 12),
                          compression="zlib")
    v[:] = _field(rng, (3, NY, NX))
    g2 = g1.createGroup("surface")
    g2.level = "2 m"
    v = g2.createVariable("t2", "f8", ("lat", "lon"), chunksizes=(5, 6))
    v[:] = _field(rng, (NY, NX), "f8")
    g3 = ds.createGroup("empty")  # a group with only attributes
    g3.note = "nothing here"


MISSING_FILL = -999.0


def _b_missing(ds, rng):
    ds.createDimension("y", 16)
    ds.createDimension("x", 16)
    # 4 x 4 chunk grid; only chunks (0,0), (2,1) and (3,3) are ever written, so HDF5
    # allocates just those and kerchunk emits no key for the other 13.
    v = ds.createVariable("sparse", "f4", ("y", "x"), chunksizes=(4, 4),
                          fill_value=MISSING_FILL)
    v[0:4, 0:4] = _field(rng, (4, 4))
    v[8:12, 4:8] = _field(rng, (4, 4))
    v[12:16, 12:16] = _field(rng, (4, 4))
    # NaN fill, compressed, partly written (a write that covers part of a chunk
    # allocates the whole chunk, the rest of it holding the fill value).
    v = ds.createVariable("nanfill", "f8", ("y", "x"), chunksizes=(8, 8),
                          fill_value=np.nan, compression="zlib")
    v[0:5, 0:5] = _field(rng, (5, 5), "f8")
    # Integer fill; nothing written at all: no chunk keys, only metadata.
    v = ds.createVariable("never", "i2", ("y", "x"), chunksizes=(8, 8), fill_value=-1)


CHAR_NAMES = ["alpha", "beta", "gamma", "delta-long"]
CHAR_LEN = 10


def _b_chars(ds, rng):
    import netCDF4

    ds.createDimension("station", len(CHAR_NAMES))
    ds.createDimension("strlen", CHAR_LEN)
    v = ds.createVariable("name", "S1", ("station", "strlen"))
    v.long_name = "station name"
    # stringtochar pads with NUL bytes, as netCDF does for fixed-length strings.
    v[:] = netCDF4.stringtochar(np.array(CHAR_NAMES, dtype=f"S{CHAR_LEN}"))
    v = ds.createVariable("flag", "S1", ("station",))
    v[:] = np.array([b"y", b"n", b"y", b"n"], dtype="S1")
    v = ds.createVariable("height", "f4", ("station",))
    v[:] = rng.uniform(0, 3000, size=len(CHAR_NAMES)).astype("f4")


def _b_scalar(ds, rng):
    v = ds.createVariable("pi", "f8", ())
    v.units = "1"
    v.assignValue(np.pi)
    v = ds.createVariable("count", "i4", ())
    v.assignValue(42)
    v = ds.createVariable("crs", "i4", ())  # grid-mapping style: attributes only, no data
    v.grid_mapping_name = "latitude_longitude"


ATTRS_UNITS = "°C"
ATTRS_TITLE = "Température de surface — été 2024"


def _b_attrs(ds, rng):
    ds.title = ATTRS_TITLE  # overrides the generic title
    ds.institution = "Météo-Test, Zürich"
    ds.comment = "multi-byte: 温度 and 🌡 (4-byte UTF-8)"
    ds.history = "plain ascii"
    ds.int_attr = np.int32(7)
    ds.float_list = np.array([1.5, 2.5, -3.0])
    ds.int_list = np.array([1, 2, 3], dtype="i2")
    ds.createDimension("lat", NY)
    ds.createDimension("lon", NX)
    v = ds.createVariable("temp", "f4", ("lat", "lon"), chunksizes=(5, 6))
    v.units = ATTRS_UNITS
    v.long_name = "température"
    v.valid_range = np.array([-80.0, 60.0], dtype="f4")
    v.scale_note = "µ-scale ±5"
    v[:] = _field(rng, (NY, NX))


_BUILDERS: Dict[str, Callable] = {
    "zlib": _b_zlib,
    "shuffle_zlib": _b_shuffle_zlib,
    "blosc": _b_blosc,
    "zstd": _b_zstd,
    "fletcher32": _b_fletcher32,
    "bigendian": _b_bigendian,
    "contiguous": _b_contiguous,
    "unlimited": _b_unlimited,
    "groups": _b_groups,
    "missing": _b_missing,
    "chars": _b_chars,
    "scalar": _b_scalar,
    "attrs": _b_attrs,
}


def build_all(directory: PathLike, include_air: bool = True) -> Dict[str, Path]:
    """Write every fixture kind into ``directory``; returns ``{kind: path}``.

    Also copies the public sample ``air.nc`` as key ``"air"`` when it exists.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {kind: make_netcdf(directory, kind) for kind in KINDS}
    if include_air and AIR_NC.exists():
        out["air"] = Path(shutil.copyfile(AIR_NC, directory / "air.nc"))
    return out


# ---------------------------------------------------------------------------- refs


def _is_url_ref(v) -> bool:
    return isinstance(v, list) and len(v) in (1, 3)


def kerchunk_refs(nc_path: PathLike, url: Optional[str] = None,
                  inline_threshold: int = 0,
                  unsupported_inline_threshold: Optional[int] = None,
                  error: str = "raise") -> dict:
    """kerchunk ``SingleHdf5ToZarr(nc_path).translate()`` as a v1 reference dict.

    Every ``[url, ...]`` reference gets target ``url`` (a local path, ``file://...`` or
    ``http://...``); with ``url=None`` the absolute local path of ``nc_path`` (kerchunk
    itself writes the path exactly as it was given, possibly relative, no protocol).
    ``inline_threshold``: chunks smaller than this many bytes are inlined (0 = none;
    kerchunk still inlines data it cannot reference, e.g. compact datasets). Inlined
    bytes that happen to be ASCII come out as plain strings (even NULs), others base64.
    ``unsupported_inline_threshold``: variables kerchunk cannot reference (e.g. any
    with fletcher32: kerchunk 0.2.10 rejects that filter) but smaller than this many
    bytes are read through h5py and inlined *decoded* (None = kerchunk's default,
    ``inline_threshold or 100``). ``error="raise"`` (default here) makes any other
    such variable an exception; kerchunk's own default "warn" drops it from the set.
    """
    from kerchunk.hdf import SingleHdf5ToZarr

    nc_path = Path(nc_path)
    with warnings.catch_warnings():
        # Silence kerchunk/zarr chatter (e.g. zarr v2-format warnings); with the
        # default error="raise" a variable kerchunk cannot translate still raises.
        warnings.simplefilter("ignore")
        h5 = SingleHdf5ToZarr(
            str(nc_path),
            inline_threshold=inline_threshold,
            unsupported_inline_threshold=unsupported_inline_threshold,
            error=error,
        )
        try:
            refs = h5.translate()
        finally:
            h5.close()
    target = url if url is not None else str(nc_path.resolve())
    for k, v in refs["refs"].items():
        if _is_url_ref(v):
            v[0] = target
    return refs


# Per-kind kerchunk_refs arguments needed for a usable set: kerchunk 0.2.10 cannot
# reference fletcher32 chunks at all, so those are inlined (decoded) instead.
KERCHUNK_KWARGS = {"fletcher32": {"unsupported_inline_threshold": 10**6}}


def all_refs(files: Dict[str, Path], url_for: Optional[Callable[[Path], str]] = None,
             inline_threshold: int = 0) -> Dict[str, dict]:
    """``kerchunk_refs`` for every file of ``build_all``; ``url_for(path)`` picks each target."""
    return {
        name: kerchunk_refs(path, url=url_for(path) if url_for else None,
                            inline_threshold=inline_threshold,
                            **KERCHUNK_KWARGS.get(name, {}))
        for name, path in files.items()
    }


def retarget(refs: dict, url_map: Union[str, Callable[[str], str]]) -> dict:
    """A deep copy of ``refs`` with every explicit reference url replaced (str) or
    mapped (callable). ``gen`` entries and templates are left alone (build those with
    the target you want, e.g. ``gen_refs_for_contiguous(..., url=...)``)."""
    out = copy.deepcopy(refs)
    body = out["refs"] if "version" in out else out
    for v in body.values():
        if _is_url_ref(v) and v[0] is not None:
            v[0] = url_map(v[0]) if callable(url_map) else url_map
    return out


def file_url(path: PathLike) -> str:
    """``file:///abs/path`` for a local path."""
    return Path(path).resolve().as_uri()


def _jinja_env():
    # The same sandbox fsspec uses (NOTES.md section 1: code execution otherwise).
    import jinja2.sandbox

    return jinja2.sandbox.SandboxedEnvironment()


def to_v0(refs: dict) -> dict:
    """Expand a v1 reference set (templates, gen) into a flat v0 dict.

    Independent of fsspec (jinja2 directly). A v0 input is returned as a shallow copy.
    Generated keys come after explicit refs, each gen in itertools.product order
    (last dimension fastest); later entries win on key collisions.
    """
    if "version" not in refs:
        return dict(refs)
    version = refs["version"]
    if type(version) is not int or version != 1:  # not 1.0, "1" or True either
        raise ValueError(f"unknown reference spec version {version!r}")
    env = _jinja_env()

    templates = {}
    for name, text in refs.get("templates", {}).items():
        if "{{" in text:
            # A template that itself contains {{..}} is callable: {{f(c='x')}}.
            tpl = env.from_string(text)
            templates[name] = lambda _tpl=tpl, **kw: _tpl.render(**kw)
        else:
            templates[name] = text

    def render(text, **extra):
        if "{{" not in text:
            return text
        return env.from_string(text).render(**templates, **extra)

    out = {}
    for key, v in refs.get("refs", {}).items():
        if _is_url_ref(v) and isinstance(v[0], str):
            v = [render(v[0])] + list(v[1:])
        out[key] = v
    for gen in refs.get("gen", []):
        has_off, has_len = "offset" in gen, "length" in gen
        if has_off != has_len:
            raise ValueError("gen entry needs both 'offset' and 'length', or neither")
        dims = {
            name: d if isinstance(d, list)
            else range(d.get("start", 0), d["stop"], d.get("step", 1))
            for name, d in gen["dimensions"].items()
        }
        # Compile each template once (fsspec re-creates them per key: slow).
        t_key, t_url = env.from_string(gen["key"]), env.from_string(gen["url"])
        t_off = env.from_string(str(gen["offset"])) if has_off else None
        t_len = env.from_string(str(gen["length"])) if has_len else None
        for values in itertools.product(*dims.values()):
            ctx = dict(templates, **dict(zip(dims, values)))
            url = t_url.render(**ctx)
            if has_off:
                out[t_key.render(**ctx)] = [url, int(t_off.render(**ctx)), int(t_len.render(**ctx))]
            else:
                out[t_key.render(**ctx)] = [url]
    return out


def default_url_to_path(url: str) -> Path:
    """Local path for a plain path or ``file://`` url; other protocols are an error."""
    if url.startswith("file://"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(url).path))
    if "://" in url:
        raise ValueError(f"no local path for {url!r}; pass url_to_path")
    return Path(url)


def compact_json(obj) -> str:
    """Compact UTF-8 JSON: the default text oracle_bytes gives a JSON-object value.

    The spec does not fix the text. fsspec serves ``ujson.dumps(obj)`` when ujson is
    installed (compact, but ``\\uXXXX`` and ``\\/`` escapes) and ``json.dumps(obj)``
    otherwise (``", "`` and ``": "`` separators), so compare parsed JSON with fsspec.
    """
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def oracle_bytes(refs: dict, key: str,
                 url_to_path: Callable[[str], PathLike] = default_url_to_path,
                 json_text: Callable[[object], str] = compact_json) -> bytes:
    """The exact bytes that ``key`` of ``refs`` (v0 or v1) stands for, read directly.

    str → UTF-8 bytes (``base64:`` prefix → decoded); JSON object → ``json_text(obj)``
    as UTF-8 (see compact_json); ``[url]`` → the whole file; ``[url, off, len]`` →
    exactly ``len`` bytes at ``off`` (a short file is an error). ``url_to_path`` maps a
    reference url to a local file (e.g. ``RangeServer.path_for`` for http urls).
    Raises KeyError for a key that is not in the set. A v1 set with templates or gen
    is expanded on every call: for many keys, call ``to_v0`` once and pass its result.
    """
    if "version" in refs and (refs.get("templates") or refs.get("gen")):
        value = to_v0(refs)[key]
    elif "version" in refs:
        to_v0({"version": refs["version"]})  # validates the version
        value = refs.get("refs", {})[key]
    else:
        value = refs[key]
    if isinstance(value, str):
        if value.startswith("base64:"):
            return base64.b64decode(value[7:])
        return value.encode("utf-8")
    if isinstance(value, dict):
        return json_text(value).encode("utf-8")
    if not _is_url_ref(value):
        raise ValueError(f"{key}: not a reference value: {value!r}")
    path = Path(url_to_path(value[0]))
    with open(path, "rb") as fh:
        if len(value) == 1:
            return fh.read()
        _, offset, length = value
        fh.seek(offset)
        data = fh.read(length)
    if len(data) != length:
        raise ValueError(f"{key}: {path} has only {len(data)} of {length} bytes at {offset}")
    return data


def reference_fs(refs: dict, **kw):
    """fsspec's ReferenceFileSystem over ``refs``.

    ``simple_templates=False`` is required for sets with ``gen`` (fsspec otherwise
    silently drops generated keys) or callable templates.
    """
    import fsspec

    return fsspec.filesystem("reference", fo=refs, **kw)


def oracle_fsspec(refs: dict, key: str, **kw) -> bytes:
    """``key``'s bytes as fsspec's ReferenceFileSystem serves them (``cat``).

    Trust it only where fsspec is correct: cat() is right for inline, base64 and
    local/http ranges; JSON objects come back as ujson/json text (compare parsed);
    its sizes (info/ls) are not exact (NOTES.md section 1); gen needs
    ``simple_templates=False``; one protocol per set.
    """
    return reference_fs(refs, **kw).cat_file(key)


# ---------------------------------------------------------------------------- v1 with gen


def gen_refs_for_contiguous(nc_path: PathLike, var: str = "t3", url: Optional[str] = None,
                            ysplit: int = 2) -> dict:
    """A v1 set with ``templates`` and ``gen`` over a contiguous 3-D variable of a real file.

    The variable (time, y, x) is re-chunked as ``(1, y/ysplit, x)``: every such chunk
    is a contiguous byte slice, so each chunk key is a fixed-length slice at an
    arithmetic offset. Two gen dimensions: ``i`` over time as a range, ``j`` over the
    y-split as an explicit list (the cartesian product exercises both forms).
    Metadata (.zgroup/.zarray/.zattrs) is given as JSON objects.
    """
    import h5py

    nc_path = Path(nc_path)
    with h5py.File(nc_path, "r") as h:
        d = h[var]
        if d.chunks is not None or d.compression or d.ndim != 3:
            raise ValueError(f"{var} must be a contiguous uncompressed 3-D variable")
        offset = d.id.get_offset()
        nt, ny, nx = d.shape
        dtype = d.dtype
        if ny % ysplit:
            raise ValueError("ysplit must divide the y dimension")
        # netCDF dimension names are the attached scale datasets' names.
        dims = [d.dims[n][0].name.lstrip("/") if len(d.dims[n]) else f"phony_dim_{n}"
                for n in range(3)]
    cy = ny // ysplit
    chunk_bytes = cy * nx * dtype.itemsize
    return {
        "version": 1,
        "templates": {"u": url if url is not None else str(nc_path.resolve())},
        "gen": [
            {
                "key": var + "/{{i}}.{{j}}.0",
                "url": "{{u}}",
                "offset": f"{{{{{offset} + (i * {ysplit} + j) * {chunk_bytes}}}}}",
                "length": str(chunk_bytes),
                "dimensions": {"i": {"stop": nt}, "j": list(range(ysplit))},
            }
        ],
        "refs": {
            ".zgroup": {"zarr_format": 2},
            ".zattrs": {"title": "gen over a contiguous variable"},
            f"{var}/.zarray": {
                "zarr_format": 2,
                "shape": [nt, ny, nx],
                "chunks": [1, cy, nx],
                "dtype": dtype.str,
                "compressor": None,
                "filters": None,
                "fill_value": None,
                "order": "C",
            },
            f"{var}/.zattrs": {"_ARRAY_DIMENSIONS": dims},
        },
    }


# Verbatim from /work/shared/seeds/kerchunk-reference-spec.rst ("Version 1" example).
SPEC_V1_EXAMPLE = {
    "version": 1,
    "templates": {
        "u": "server.domain/path",
        "f": "{{c}}"
    },
    "gen": [
        {
            "key": "gen_key{{i}}",
            "url": "http://{{u}}_{{i}}",
            "offset": "{{(i + 1) * 1000}}",
            "length": "1000",
            "dimensions":
              {
                "i": {"stop":  5}
              }
        }
    ],
    "refs": {
      "key0": "data",
      "key1": ["http://target_url", 10000, 100],
      "key2": ["http://{{u}}", 10000, 100],
      "key3": ["http://{{f(c='text')}}", 10000, 100]
    }
}

# Its stated Version 0 equivalent, verbatim from the same document.
SPEC_V0_EXPANSION = {
  "key0": "data",
  "key1": ["http://target_url", 10000, 100],
  "key2": ["http://server.domain/path", 10000, 100],
  "key3": ["http://text", 10000, 100],
  "gen_key0": ["http://server.domain/path_0", 1000, 1000],
  "gen_key1": ["http://server.domain/path_1", 2000, 1000],
  "gen_key2": ["http://server.domain/path_2", 3000, 1000],
  "gen_key3": ["http://server.domain/path_3", 4000, 1000],
  "gen_key4": ["http://server.domain/path_4", 5000, 1000]
}


# ---------------------------------------------------------------------------- writing


def _zstd_compress(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


def _zstd_decompress(data: bytes) -> bytes:
    import zstandard

    # stream_reader copes with frames that lack a content size.
    with zstandard.ZstdDecompressor().stream_reader(data) as r:
        return r.read()


# suffix -> (compress, decompress)
COMPRESSIONS = {
    "": (lambda b: b, lambda b: b),
    ".gz": (lambda b: gzip.compress(b, mtime=0), gzip.decompress),
    ".bz2": (bz2.compress, bz2.decompress),
    ".xz": (lambda b: lzma.compress(b, format=lzma.FORMAT_XZ), lzma.decompress),
    ".zst": (_zstd_compress, _zstd_decompress),
}


def _compression_of(path: Path, compression: Optional[str]) -> str:
    if compression is None:  # infer from the file name
        return path.suffix if path.suffix in COMPRESSIONS else ""
    comp = compression if compression.startswith(".") or not compression else "." + compression
    comp = {".gzip": ".gz", ".zstd": ".zst", ".bzip2": ".bz2"}.get(comp, comp)
    if comp not in COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r}")
    return comp


def write_refs(refs: dict, path: PathLike, compression: Optional[str] = None,
               ensure_ascii: bool = True, indent: Optional[int] = None) -> Path:
    """Write ``refs`` as JSON, compressed by suffix (.gz .bz2 .xz .zst) or ``compression``.

    ``ensure_ascii=True`` gives ``\\uXXXX`` escapes as kerchunk's own files have.
    """
    path = Path(path)
    text = json.dumps(refs, ensure_ascii=ensure_ascii, indent=indent)
    compress, _ = COMPRESSIONS[_compression_of(path, compression)]
    path.write_bytes(compress(text.encode("utf-8")))
    return path


def read_refs(path: PathLike, compression: Optional[str] = None) -> dict:
    """Inverse of write_refs."""
    path = Path(path)
    _, decompress = COMPRESSIONS[_compression_of(path, compression)]
    return json.loads(decompress(path.read_bytes()).decode("utf-8"))


def write_all_formats(refs: dict, directory: PathLike, stem: str = "refs") -> Dict[str, Path]:
    """Write ``refs`` once per compression; returns ``{suffix: path}`` (``""`` = plain)."""
    directory = Path(directory)
    return {suf: write_refs(refs, directory / f"{stem}.json{suf}") for suf in COMPRESSIONS}
