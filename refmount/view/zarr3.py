"""Zarr v3 seen as Zarr v2, for the decoded view (netCDF-C through 4.10 reads Zarr v2 only).

`v2_refset(refset)` builds, at mount time, a second reference set from a v3 one:
- each group's ``zarr.json`` -> ``.zgroup`` (+ ``.zattrs`` with its attributes);
- each array's ``zarr.json`` -> ``.zarray`` (dtype with the ``bytes`` codec's byte order, the
  v3 codecs as numcodecs filters, fill_value in v2 form) + ``.zattrs`` (attributes, and
  ``_ARRAY_DIMENSIONS`` from ``dimension_names``);
- each chunk key (``c/0/0``, ``c.0.0`` or v2 ``0.0``) -> the v2 name ``0.0``, pointing at the same
  bytes (same url, offset and length, or the same inline data); a shard -> its inner chunks (below).
The decoded view then treats it like any kerchunk set: it decodes chunks with the filters below,
swaps byte order, and applies the netCDF rules for fills, chars and strings.

Codecs: ``bytes`` (endianness), ``transpose``, ``gzip``, ``zstd``, ``blosc``, ``crc32c``,
``vlen-utf8``/``vlen-bytes``, ``numcodecs.*`` (as the numcodecs codec of that id, if refs/codecs.py
allows it). Any other codec becomes the id ``zarr3.<name>``, which refs/codecs.py does not allow, so the
decoded view hides that array with one log line naming it.

Sharding (``sharding_indexed``): the v2 array has the *inner* chunk shape and the inner codecs; every
inner chunk of every shard present is its own v2 key (``var/i.j``), pointing at the whole shard's
reference. `RefSet.shards` maps each sharded array to its `ShardLayout`, with which the decoded view
reads an inner chunk (the shard's index, then only that chunk's bytes: refmount.view.shards). Missing
shards are missing chunks (the fill rule in `_fill_chunks`). Nested sharding, codecs around the sharding codec,
and sharded variable-length strings hide the array.
"""

from __future__ import annotations

import base64
import json
import logging
import math

import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from refmount.refs.arraymeta import ArrayMeta
from refmount.refs.codecs import TRANSPOSE_ID, make_codec
from refmount.refs.model import INLINE, RefSet, RefSetBuilder
from refmount.view.ncattrs import base64_fill
from refmount.view.shards import MAX_INDEX_BYTES, ShardLayout, UnsupportedSharding

log = logging.getLogger("refmount")

_NUMERIC = {
    "bool": "b1", "int8": "i1", "uint8": "u1", "int16": "i2", "uint16": "u2", "int32": "i4", "uint32": "u4",
    "int64": "i8", "uint64": "u8", "float16": "f2", "float32": "f4", "float64": "f8",
    "complex64": "c8", "complex128": "c16",
}
_BLOSC_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}
_DEFAULT_INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]  # zarr-python's
MAX_INNER_CHUNKS = 50_000_000  # inner chunk keys one sharded array may list (about 3 GB of memory)


def is_v3(refset) -> bool:
    """A reference set whose metadata is Zarr v3 (a zarr.json at the root or in a top-level directory)."""
    if getattr(refset, "lazy", False):  # (a native store's: refs/zarrremote.py; Parquet's are v2)
        return getattr(refset, "zarr_format", 2) == 3
    if refset.find("zarr.json") >= 0:
        return True
    return any(refset.find(f"{name}/zarr.json") >= 0 for name in refset.dirs.children[0])


# -- metadata --------------------------------------------------------------------------------------

class Unsupported(ValueError):
    """This array cannot be shown in v2 form (the reason is logged; the array is hidden)."""


def numpy_dtype(data_type, endian: str = "little") -> np.dtype:
    order = ">" if endian == "big" else "<"
    if isinstance(data_type, str):
        if data_type in _NUMERIC:
            code = _NUMERIC[data_type]
            return np.dtype(("|" if code[1:] == "1" else order) + code)
        if data_type.startswith("r") and data_type[1:].isdigit():
            return np.dtype(f"|V{int(data_type[1:]) // 8}")
        if data_type in ("string", "variable_length_utf8", "bytes", "variable_length_bytes"):
            return np.dtype("|O")
        raise Unsupported(f"data type {data_type!r}")
    if not isinstance(data_type, dict):
        raise Unsupported(f"data type {data_type!r}")
    name = data_type.get("name")
    config = data_type.get("configuration") or {}
    if name in ("null_terminated_bytes", "fixed_length_bytes"):
        return np.dtype(f"|S{int(config['length_bytes'])}")
    if name == "fixed_length_utf32":
        return np.dtype(f"{order}U{int(config['length_bytes']) // 4}")
    if name == "raw_bytes":
        return np.dtype(f"|V{int(config['length_bytes'])}")
    if name in ("numpy.datetime64", "numpy.timedelta64"):
        scale = int(config.get("scale_factor", 1))
        return np.dtype(f"{order}{'M' if 'datetime' in name else 'm'}8[{scale if scale != 1 else ''}{config['unit']}]")
    raise Unsupported(f"data type {name!r}")


def v2_fill(fill, dtype: np.dtype):
    """A v3 fill_value in v2's JSON form."""
    if fill is None:
        return None
    if dtype.kind == "f" and isinstance(fill, str) and fill.startswith("0x"):
        raw = int(fill, 16).to_bytes(dtype.itemsize, "big")
        value = float(np.frombuffer(raw, dtype.newbyteorder(">"))[0])
        return "NaN" if math.isnan(value) else value
    if dtype.kind == "S" and isinstance(fill, list):  # raw bytes as a list of ints
        return base64.b64encode(bytes(fill)).decode()
    return fill


def decoded_attribute_fill(attrs: dict, dtype: np.dtype) -> dict:
    """xarray writes a float `_FillValue` into v3 attributes as base64 of its float64 bytes; netCDF-C
    needs a number."""
    number = base64_fill(attrs.get("_FillValue"), dtype)
    return attrs if number is None else {**attrs, "_FillValue": number}


def _bytes_codec(config: dict) -> dict:
    """A v3 bytes-to-bytes codec as a numcodecs config."""
    name, c = config.get("name"), config.get("configuration") or {}
    if name == "gzip":
        return {"id": "gzip", "level": c.get("level", 5)}
    if name == "zstd":
        return {"id": "zstd", "level": c.get("level", 0), "checksum": bool(c.get("checksum", False))}
    if name == "blosc":
        return {"id": "blosc", "cname": c.get("cname", "lz4"), "clevel": c.get("clevel", 5),
                "shuffle": _BLOSC_SHUFFLE.get(c.get("shuffle", "noshuffle"), 0), "blocksize": c.get("blocksize", 0)}
    if name == "crc32c":
        return {"id": "crc32c"}
    if name and name.startswith("numcodecs."):
        return {**c, "id": name[len("numcodecs."):]}
    return {"id": f"zarr3.{name}"}


def codec_chain(codecs: list[dict], data_type, chunk_shape: list[int], fill) -> tuple[np.dtype, list[dict], str]:
    """(dtype with byte order, numcodecs filters in encode order, order) for a v3 codec list."""
    array_to_array, array_to_bytes, bytes_to_bytes = [], None, []
    for codec in codecs:
        name = codec.get("name")
        if array_to_bytes is None and name in ("transpose",):
            array_to_array.append(codec)
        elif array_to_bytes is None:
            array_to_bytes = codec
        else:
            bytes_to_bytes.append(codec)
    if array_to_bytes is None:
        raise Unsupported("no array-to-bytes codec")
    kind = array_to_bytes.get("name")
    config = array_to_bytes.get("configuration") or {}
    filters: list[dict] = []
    order = "C"
    if kind == "bytes":
        dtype = numpy_dtype(data_type, config.get("endian", "little"))
        shape = list(chunk_shape)
        for codec in array_to_array:
            permutation = list((codec.get("configuration") or {}).get("order", []))
            if permutation == list(range(len(shape))):
                continue
            if permutation == list(range(len(shape)))[::-1] and not filters and order == "C":
                order = "F"  # the decoded view turns Fortran-order chunks into C order itself
                continue
            filters.append({"id": TRANSPOSE_ID, "order": permutation, "shape": shape,
                            "dtype": dtype.str})
            shape = [shape[k] for k in permutation]
    elif kind == "sharding_indexed":  # (`sharding` unwraps the outer one: this is a shard in a shard)
        raise Unsupported("nested sharding")
    elif kind in ("vlen-utf8", "vlen-bytes"):  # the same layout as numcodecs' codecs of those ids
        dtype = np.dtype("|O")
        filters.append({"id": kind})
    else:
        return numpy_dtype(data_type), [{"id": f"zarr3.{kind}"}], order
    filters += [_bytes_codec(c) for c in bytes_to_bytes]
    return dtype, filters, order


def sharding(codecs: list[dict]) -> dict | None:
    """The configuration of the array's `sharding_indexed` codec, or None if it is not sharded.
    Only a shard that is the whole codec chain can be read an inner chunk at a time."""
    names = [c.get("name") for c in codecs]
    if "sharding_indexed" not in names:
        return None
    k = names.index("sharding_indexed")
    if k > 0:
        raise Unsupported(f"codecs {names[:k]} before sharding_indexed")
    if k < len(names) - 1:
        raise Unsupported(f"codecs {names[k + 1:]} after sharding_indexed (whole shards encoded)")
    return codecs[k].get("configuration") or {}


def v2_metadata(array: ArrayMeta) -> tuple[dict, dict]:
    """(.zarray, .zattrs) of one v3 array's zarr.json; a sharded array has the inner chunks as its
    chunks and the inner codecs as its filters."""
    if array.grid_name != "regular":
        raise Unsupported(f"chunk grid {array.grid_name!r}")
    array.grid()  # (raises what hides the array)
    chunks, shape, codecs = list(array.chunks), list(array.shape), array.codecs
    shard = sharding(codecs)
    if shard is not None:
        chunks, codecs = list(array.inner_chunks), shard.get("codecs") or []
    dtype, filters, order = codec_chain(codecs, array.dtype, chunks, array.fill_value)
    zarray = {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype.str, "order": order,
              "compressor": None, "filters": filters or None, "fill_value": v2_fill(array.fill_value, dtype)}
    if array.encoding == "v2" and array.separator == "/":  # (else the v2 keys are 0.0: `_array_chunks`)
        zarray["dimension_separator"] = "/"
    meta = array.document
    attrs = decoded_attribute_fill(dict(meta.get("attributes") or {}), dtype)
    # v3 keeps apart the bytes of a missing chunk (fill_value) and the CF marker of a missing value
    # (the _FillValue attribute); v2 clients (xarray, netCDF-C) take fill_value as both. So the v2
    # fill_value is the CF one when the array declares one, and missing chunks whose v3 fill differs
    # are served as explicit chunks of it (`_fill_chunks`). Without that attribute a number's v3 fill
    # is its v2 fill, as a v2 store's is: netCDF-C's forms declare it as a v2 store's (view/arrays.py's
    # rules: a NaN or -1 fill is a _FillValue, 0 is data unless nothing was written); the zarr form does
    # not, as xarray masks no v3 fill_value (view/forms.py: ArrayInfo.zarr_fill).
    fill = attrs.get("_FillValue")
    if isinstance(fill, (int, float)) and not isinstance(fill, bool) and dtype.kind in "iuf":
        zarray["fill_value"] = "NaN" if fill != fill else fill
    elif dtype.kind in "bc" or dtype.kind in "iuf" and "_FillValue" in attrs:
        zarray["fill_value"] = None
    names = meta.get("dimension_names")
    if names and len(names) == len(shape) and all(isinstance(n, str) and n for n in names):
        attrs["_ARRAY_DIMENSIONS"] = list(names)
    return zarray, attrs


# -- keys ------------------------------------------------------------------------------------------

def _leading_coordinates(rel_dir: str, head: str, sep: str) -> list[str] | None:
    """The chunk coordinates a subdirectory of an array stands for ("c/3/1" -> ["3", "1"]), or None."""
    if sep != "/":
        return None
    parts = rel_dir.split("/")
    if head:
        if parts[0] != head:
            return None
        parts = parts[1:]
    return parts if all(p.isdigit() for p in parts) else None


def _array_chunks(refset: RefSet, path: str, array: ArrayMeta, ndim: int, v2_separator: str):
    """(NUL-joined UTF-8 v2 keys, key indexes) batches of every chunk of one array. The keys of a chunk
    subdirectory ("c/3/1/<last>") are renamed in one step per directory; the array's own directory
    (the scalar "c", or "c.0.1"/v2 "0.1" names) key by key."""
    base = f"{path}/" if path else ""
    head, sep, start = array.key_prefix, array.separator, array.key_lead
    array_dir = refset.dirs.ids.get(path)
    for d, dir_path in enumerate(refset.dirs.paths):
        if d != array_dir and not dir_path.startswith(base):  # (a root array: every directory)
            continue
        files = refset.files_in(d)
        if not len(files):
            continue
        names = refset.names(files, d)
        leading = _leading_coordinates(dir_path[len(base):], head, sep) if d != array_dir else None
        if leading is not None and len(leading) + 1 == ndim:
            joined = b"\x00".join(names)
            if joined.replace(b"\x00", b"").isdigit() and b"\x00\x00" not in joined and all(names[:1]):
                prefix = (base + "".join(p + v2_separator for p in leading)).encode()
                yield prefix + (b"\x00" + prefix).join(names), files
                continue
        keys, found = [], []
        for i, name in zip(files.tolist(), names):
            rel = dir_path[len(base):] + "/" + name.decode("utf-8", "replace") if d != array_dir \
                else name.decode("utf-8", "replace")
            if ndim == 0:
                if rel == (head or "0"):
                    keys.append(base + "0")
                    found.append(i)
                continue
            if not rel.startswith(start):
                continue
            parts = rel[len(start):].split(sep)
            if len(parts) == ndim and all(p.isdigit() for p in parts):
                keys.append(base + v2_separator.join(parts))
                found.append(i)
        if keys:
            yield "\x00".join(keys).encode(), np.array(found, np.int64)


def v2_refset(refset: RefSet) -> RefSet:
    """The v2 form of a v3 reference set (see the module docstring); unsupported arrays keep their
    .zarray with a codec id nobody knows, so that the decoded view hides them with one log line. A lazy
    set (a native store's, refs/zarrremote.py) gets a lazy v2 form: its chunk keys computed from the
    grids, its shards' presence learnt by reading them (a missing one reads as the fill)."""
    lazy = getattr(refset, "lazy", False)
    builder = None if lazy else RefSetBuilder(None)
    if builder is not None:
        builder.url_ids(refset.urls)  # the same url ids as the v3 set
    metadata: dict[str, bytes] = {}
    layouts: dict[str, ShardLayout] = {}  # sharded arrays
    absent_fills: dict[str, object] = {}  # array path -> its v3 fill_value in v2 form
    zarr_fills: set[str] = set()  # arrays whose v2 fill_value is their v3 fill, no CF _FillValue declared
    lazy_arrays: list[tuple[str, ArrayMeta, ArrayMeta]] = []  # (path, v2 form, v3) of a lazy set's arrays
    for d, path in enumerate(refset.dirs.paths):
        base = f"{path}/" if path else ""
        i = refset.find(base + "zarr.json")
        if i < 0:
            continue
        raw = refset.inline_data(i)
        try:
            meta = json.loads(raw) if raw is not None else None
        except ValueError:
            meta = None
        if not isinstance(meta, dict):
            log.warning("decoded view: hiding %s: its zarr.json is %s", path or "/",
                        "stored remotely" if raw is None else "not a JSON object")
            continue
        if meta.get("node_type") == "group":
            metadata[base + ".zgroup"] = json.dumps({"zarr_format": 2}).encode()
            if meta.get("attributes"):
                metadata[base + ".zattrs"] = json.dumps(meta["attributes"], allow_nan=True).encode()
            continue
        try:
            array = ArrayMeta.from_zarr_json(meta)
            zarray, zattrs = v2_metadata(array)
            if lazy:
                zarray.pop("dimension_separator", None)  # (its keys are computed: "0.1" in the array's directory)
            out = ArrayMeta.from_zarray(zarray)
            layout = shard_layout(path, array, out, listed=not lazy)
        except (Unsupported, UnsupportedSharding, KeyError, TypeError, ValueError) as e:
            log.warning("decoded view: hiding array %s: %s", path or "/", f"unsupported Zarr v3 {e}"
                        if isinstance(e, (Unsupported, UnsupportedSharding)) else
                        f"malformed zarr.json ({type(e).__name__}: {e})")
            continue
        # (a chunk a native store lacks reads as the v3 fill: refmount.view.decoded._absent_chunk)
        absent_fills[path] = v2_fill(array.fill_value, np.dtype(out.dtype))
        if "_FillValue" not in zattrs and zarray["fill_value"] is not None and np.dtype(out.dtype).kind in "iuf":
            zarr_fills.add(path)
        metadata[base + ".zarray"] = json.dumps(zarray, allow_nan=True).encode()
        metadata[base + ".zattrs"] = json.dumps(zattrs, allow_nan=True).encode()
        if layout is not None:
            layouts[path] = layout
        if lazy:
            if layout is not None:
                layout.present = None  # (not listed: a shard is found, or not, when read)
            lazy_arrays.append((path, out, array))
            continue
        batches = list(_array_chunks(refset, path, array, out.ndim, out.separator))
        if layout is not None:
            batches = list(_inner_chunks(batches, layout, base, out))
        for encoded, indexes in batches:
            inline = {int(k): refset.inline_data(int(indexes[k]))
                      for k in np.flatnonzero(refset.url_id[indexes] == INLINE)}
            builder.add_encoded(encoded, len(indexes), refset.url_id[indexes], refset.offset[indexes],
                                refset.length[indexes], inline)
        _fill_chunks(builder, base, array, out, sum(len(ix) for _, ix in batches),
                     lambda: {key[len(base):] for encoded, _ in batches for key in encoded.decode().split("\x00")})
    if lazy:
        out = refset.v2_form(metadata, lazy_arrays)
    else:
        keys = list(metadata)
        builder.add_batch(keys, np.full(len(keys), INLINE, np.int32), np.zeros(len(keys), np.int64),
                          np.array([len(metadata[k]) for k in keys], np.int64), dict(enumerate(metadata.values())))
        out = builder.build()
    for name in ("checksums", "snapshot_id", "origins", "may_lack", "format"):  # (origins: what its inline keys were read from)
        if hasattr(refset, name):
            setattr(out, name, getattr(refset, name))
    out.shards = layouts
    out.absent_fills = absent_fills
    out.zarr_fills = zarr_fills
    return out


# -- sharding: inner chunks as v2 chunks ---------------------------------------------------------------

def shard_layout(path: str, array: ArrayMeta, out: ArrayMeta, listed: bool = True) -> ShardLayout | None:
    """The layout of a sharded array (`array` its v3 metadata, `out` its v2 form), None if it is not
    sharded; raises what hides the array (`listed`: its inner chunk keys are to be made, at most
    MAX_INNER_CHUNKS of them; a lazy set's are computed)."""
    config = sharding(array.codecs)
    if config is None:
        return None
    dtype = np.dtype(out.dtype)
    if dtype.kind == "O":
        raise Unsupported("sharded variable-length strings")
    layout = ShardLayout(path, out.shape, array.chunks, array.inner_chunks,
                         config.get("index_codecs", _DEFAULT_INDEX_CODECS), config.get("index_location", "end"))
    inner = out.nchunks()
    if layout.count > MAX_INNER_CHUNKS or (listed and inner > MAX_INNER_CHUNKS):
        raise Unsupported(f"sharding into {max(inner, layout.count):,} inner chunks, more than the decoded view "
                          f"lists ({MAX_INNER_CHUNKS:,})")
    if layout.index_bytes > MAX_INDEX_BYTES:  # (read whole at every inner chunk's read that the LRU misses)
        raise Unsupported(f"sharding into {layout.count:,} inner chunks a shard, whose index ({layout.index_bytes:,} "
                          f"bytes) is larger than the decoded view reads ({MAX_INDEX_BYTES:,})")
    layout.fill_chunk = fill_bytes(array.fill_value, dtype, out.chunks)
    return layout


def fill_bytes(fill, dtype: np.dtype, shape) -> bytes:
    """An inner chunk of the v3 fill_value, as the inner codecs decode it (dtype in stored byte order)."""
    value = v2_fill(fill, dtype)
    if value is None:
        value = b"" if dtype.kind in "SV" else 0
    elif dtype.kind in "fc" and value in ("NaN", "Infinity", "-Infinity"):
        value = float(value.replace("Infinity", "inf"))
    elif dtype.kind == "c" and isinstance(value, list) and len(value) == 2:
        value = complex(*(float(str(v).replace("Infinity", "inf")) for v in value))
    elif dtype.kind in "SV" and isinstance(value, str):
        value = base64.b64decode(value)
    try:
        return np.full(shape, value, dtype).tobytes()
    except (TypeError, ValueError, OverflowError) as e:
        raise Unsupported(f"fill_value {fill!r} for {dtype.str} ({e})") from None


def _inner_chunks(batches, layout: ShardLayout, base: str, out: ArrayMeta):
    """Shard-key batches -> inner-chunk-key batches: each inner chunk of each shard within the array's
    chunk grid (`out`, its v2 form), pointing at its shard's reference. Records which shards exist in
    `layout.present`."""
    sep, shape, inner_grid = out.separator, out.shape, out.grid()
    present = []
    for encoded, indexes in batches:
        keys: list[str] = []
        counts = []
        for key in encoded.decode().split("\x00"):
            if not shape:  # a scalar: one shard of one inner chunk
                keys.append(key)
                counts.append(1)
                present.append(0)
                continue
            coords = [int(c) for c in key[len(base):].split(sep)]
            if any(c >= g for c, g in zip(coords, layout.shard_grid)):
                counts.append(0)  # a shard outside the grid: no inner chunk of it is in the array
                continue
            present.append(layout.number(coords))
            # the shard's inner chunk names in C order, built a dimension at a time (no join per key)
            names = [base]
            for d, (c, p, g) in enumerate(zip(coords, layout.per_shard, inner_grid)):
                part = [str(k) for k in range(c * p, min((c + 1) * p, g))]
                glue = sep if d else ""
                names = [n + glue + q for n in names for q in part]
            keys += names
            counts.append(len(names))
        if keys:
            yield "\x00".join(keys).encode(), np.repeat(indexes, counts)
    layout.present = np.unique(np.array(present, np.int64))


def _is_nan(value) -> bool:
    return value == "NaN" or (isinstance(value, float) and value != value)


def _same_fill(a, b) -> bool:
    return a == b or (_is_nan(a) and _is_nan(b))


def _fill_chunks(builder: RefSetBuilder, base: str, array: ArrayMeta, out: ArrayMeta, present: int,
                 present_names) -> None:
    """Missing chunks read as the v3 fill_value (`array`'s); when the v2 fill_value (`out`'s) differs,
    serve them as inline chunks of the v3 fill, encoded once with the array's codecs."""
    v3_fill = v2_fill(array.fill_value, np.dtype(out.dtype))
    total = out.nchunks()
    if _same_fill(out.fill_value, v3_fill) or present >= total or v3_fill is None:
        return
    name = base.rstrip("/") or "/"
    if total > 10_000_000:
        log.warning("decoded view: array %s: its missing chunks read as %r, not the Zarr fill value %r",
                    name, out.fill_value, v3_fill)
        return
    dtype = np.dtype(out.dtype)
    try:
        data = np.full(out.chunks, float("nan") if v3_fill == "NaN" else v3_fill, dtype).tobytes()
        for config in out.filters or []:
            data = make_codec(config).encode(data)
        data = bytes(ensure_contiguous_ndarray(data).view(np.uint8).reshape(-1))
    except Exception:  # a codec that is not available here hides the array anyway
        return
    have = present_names()
    keys = [base + key for key in out.chunk_keys() if key not in have]
    n = len(keys)
    builder.add_batch(keys, np.full(n, INLINE, np.int32), np.zeros(n, np.int64), np.full(n, len(data), np.int64),
                      dict.fromkeys(range(n), data))
    log.info("decoded view: array %s: %d missing chunks served as chunks of the Zarr fill value %r", name, n, v3_fill)
