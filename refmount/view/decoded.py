"""The decoded view: what netCDF-C without filter plugins (and every other client) reads correctly.

Built on `RawView`. For every array (see refmount.view.arrays for the plan):
- ``.zarray`` is rewritten (compressor and filters null, little-endian dtype, bool as u1, scalars
  as shape [1], chunks cropped to the shape), all metadata JSON is re-emitted as UTF-8;
- chunk files are decoded with numcodecs in a worker thread and kept in a bounded LRU, so the
  many small reads FUSE makes of one chunk decode it once; their size is prod(chunks) x itemsize,
  known without fetching;
- arrays that cannot be represented are hidden, with one log line each; a chunk that fails to
  decode, or decodes to the wrong length, is an EIO naming the key, never short or padded data
  (but for a TIFF's last strip, whose rows past the shape the file does not store: padded with the fill).
Missing chunks stay absent, so clients fill them with fill_value.

A sharded Zarr v3 array (refmount.view.zarr3, refmount.view.shards) is served as its inner chunks: reading one
reads its shard's index (once per shard, kept in a small LRU), then only that inner chunk's bytes;
an inner chunk the index marks empty reads as the Zarr fill value.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from refmount.view.arrays import CHAR_DTYPE_49, ArrayInfo, listed, fixed_strings, load_json_value, scan_arrays
from refmount.view.metajson import dump_json
from refmount.view.forms import (FORMS, joins_last_dimension, nczarr_tree, sees_zarr_json, served_array,
                                 served_group_attributes, zarr_json_form)
from refmount.refs.codecs import make_codec
from refmount.view.bounded import decode_bounded, decode_into
from refmount.view.consolidated import consolidated_text, consolidated_value, metadata_items
from refmount.errors import Absent, RefmountError
from refmount.refs.origins import origins_of
from refmount.cache.budget import ScratchLimiter
from refmount.cache.lru import SingleFlightLRU
from refmount.view.ncattrs import fill_number, left_out_for_49, served_attributes, stored_fill
from refmount.view.overlay import OverlayRefSet
from refmount.refs.hdf5 import cut_padding
from refmount.view.shards import ShardReader
from refmount.view.zarrjson import ZARR_JSON, NotExpressible, zarr_json_documents

log = logging.getLogger("refmount")
DEFAULT_SCRATCH = 16 << 20  # decoders' working memory when the mount's memory plan gives none


def _nbytes(value) -> int:
    return value.nbytes if isinstance(value, memoryview) else len(value)


def decode_scratch(compressed: int, info: ArrayInfo) -> int:
    """Estimated working memory of decoding one chunk: the compressed bytes, the output of one
    stage and the next (each codec and the transform make a new buffer, the one before is freed)."""
    stored = int(np.prod(info.chunk_shape or (1,))) * info.dtype.itemsize
    return compressed + 2 * max(stored, info.out_chunk_bytes)


MAX_FILL_CHUNKS = 100_000  # missing chunks served as files, per mount


def _fill_bytes(fill, dtype: str) -> bytes | None:
    """One value of `fill` as bytes of `dtype` (None: no fill, or not a number)."""
    try:
        dt = np.dtype(dtype)
        number = fill_number(fill, dt)
        return None if number is None else np.array(number).astype(dt).tobytes()
    except (TypeError, ValueError, OverflowError):
        return None


def _fill_range(info: ArrayInfo, offset: int, size: int) -> bytes:
    """Bytes [offset, offset+size) of a chunk of `info` holding only its (base) fill value."""
    one = (info.missing_chunk_fill or _fill_bytes(info.out_zarray.get("fill_value"), info.out_zarray["dtype"])
           or bytes(info.out_dtype.itemsize))
    end = min(offset + size, info.out_chunk_bytes)
    if end <= offset:
        return b""
    first = offset // len(one)
    return (one * (-(-end // len(one)) - first))[offset - first * len(one): end - first * len(one)]


def _deflated_once(codecs: list, n: int, data, expected: int) -> bool:
    """HDF5 deflate listed twice, on a chunk the first inflate already gave whole: HDF5 skipped the
    second deflate of that chunk (an optional filter that did not shrink it). Hyrax (bes Chunk.cc) then
    inflates no more, by the same test of the size; a second inflate would fail on the raw bytes."""
    return (n > 0 and getattr(codecs[n], "codec_id", None) == "zlib" and getattr(codecs[n - 1], "codec_id", None) == "zlib"
            and _nbytes(data) == expected and not _is_zlib(data))


def _padded(data, short: int, expected: int):
    """A short last chunk's stored bytes (`short` of them exactly: any other size stays short, and is
    an error) made whole, for the filters and the size check; the padding is rewritten as fill after."""
    stored = ensure_contiguous_ndarray(data).view(np.uint8).reshape(-1)  # (an image codec gives rows x columns)
    if stored.nbytes != short:
        return data
    return bytes(stored) + bytes(expected - short)


def _is_zlib(data) -> bool:
    """Does `data` start as a zlib stream would (RFC 1950: deflate, and a header check multiple of 31)?"""
    head = bytes(memoryview(data)[:2]) if not isinstance(data, bytes) else data[:2]
    return len(head) == 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0


# What building the decoded view takes per array at its peak (each array's plan, its metadata in every
# reader's form, as JSON values then bytes): measured 23 KiB at 10,000 arrays and 25 KiB at 30,000.
DECODED_BYTES_PER_ARRAY = 25 << 10


def count_arrays(refset) -> int:
    """How many arrays (directories with a .zarray) the set has: a lookup per directory, no JSON read."""
    return sum(1 for path in refset.dirs.paths if refset.find(f"{path}/.zarray" if path else ".zarray") >= 0)


def check_decoded_view_fits(refset, what: str, target: int | None) -> None:
    """Refuse, before building it, a decoded view that would take the daemon past its memory target
    (`target`: --memory-target, None for the default): one line naming `what` (the reference file)
    and the target that would do. A set of 300,000 arrays would need about 7 GiB (issue 38 row 5)."""
    from refmount.cache.target import DEFAULT_TARGET, MIN_CACHE, MiB, reserve_for, resident_bytes, scratch_for

    arrays = count_arrays(refset)
    need = arrays * DECODED_BYTES_PER_ARRAY
    given = target is not None
    target = DEFAULT_TARGET if target is None else target
    held = resident_bytes()

    def room(t: int) -> int:
        return t - held - scratch_for(t, True) - reserve_for(t) - 2 * MIN_CACHE

    if need <= room(target) or need < 16 * MiB:
        return  # (a target too small for a few arrays is too small for the daemon: plan_memory's line says so)
    least = -(-(held + need) // MiB)
    while room(least * MiB) < need:
        least += 64
    name = "--memory-target" if given else "the default memory target"
    raise RefmountError(
        f"{what}: its {arrays:,} arrays would take the decoded view about {need // MiB:,} MiB to build, more than "
        f"{name} {target // MiB:,} MiB leaves ({max(room(target), 0) // MiB:,} MiB beside the {held // MiB:,} MiB "
        f"the daemon holds): mount with --view raw, or give --memory-target {least}M or more")


MAX_ARRAY_LINES = 20  # log lines of one kind about single arrays, per mount; the rest are counted


class ArrayLines:
    """Log lines about single arrays, capped per kind: a set of 300,000 arrays logged one line each
    and took minutes to mount (issue 38 row 5); past MAX_ARRAY_LINES one line says how many more."""

    def __init__(self, cap: int = MAX_ARRAY_LINES) -> None:
        self.cap = cap
        self.counts: dict[str, list] = {}  # kind -> [lines, level]

    def say(self, level: int, kind: str, message: str, *args) -> None:
        seen = self.counts.setdefault(kind, [0, level])
        seen[0] += 1
        if seen[0] <= self.cap:
            log.log(level, message, *args)

    def summarise(self) -> None:
        what = {"hidden": "arrays hidden", "notes": "arrays served changed", "fills": "fill values kept"}
        for kind, (count, level) in self.counts.items():
            if count > self.cap:
                log.log(level, "decoded view: %s more %s (not logged one by one)", f"{count - self.cap:,}",
                        what.get(kind, kind))


class DecodeError(RefmountError):
    """A chunk could not be decoded into exactly its expected bytes."""


def _zarr_json(consolidated: dict | None) -> dict[str, dict]:
    """Every zarr.json of the view (refmount.view.zarrjson), from the .zmetadata of its form; {} when
    the metadata cannot all be read at mount or has no exact v3 form (zarr-python then reads the v2
    files in its process's form)."""
    if consolidated is None:
        return {}
    try:
        return zarr_json_documents(consolidated)
    except NotExpressible as e:
        log.info("decoded view: no zarr.json (zarr-python in a process with netCDF-C or GDAL loaded reads the "
                 "v2 files, in that process's form): %s", e)
        return {}


def shared_decoded_cache(capacity: int, pool=None) -> SingleFlightLRU:
    """A cache of decoded chunks (in the buffer pool's slots, if there is one)."""
    return SingleFlightLRU(capacity, weigh=pool.footprint if pool else _nbytes, on_evict=pool.release if pool else None)


class DecodedView:
    name = "decoded"

    def __init__(self, raw, cache_size: int = 256 << 20, chars: str | None = None, form: str | None = None,
                 scratch=None, pool=None, decoded=None) -> None:
        """`form`: serve every reader this form (refmount.view.forms); None: each reader its own.
        `chars`: the characters' form in every form (an override; None: each form's own).
        `decoded`: a cache of decoded chunks shared with other views (`shared_decoded_cache`), else one
        of `cache_size` of this view's own."""
        self.raw = raw
        self.refset = raw.refset
        chosen = FORMS.values() if form is None else [FORMS[form]]
        self.forms = [f.with_chars(chars) for f in chosen]
        self.form_index = {f.name: n for n, f in enumerate(self.forms)}
        self.arrays = scan_arrays(self.refset)
        self._by_dir: dict[int, ArrayInfo] = {a.dir_id: a for a in self.arrays}
        self._hidden_dirs: set[int] = set()
        self._hidden_prefixes: list[str] = []
        self._hidden_keys: set[int] = set()  # metadata keys of broken root arrays
        # key index -> its bytes in each form (self.forms order), padded to one length; a key whose
        # forms all hold the same bytes is in _metadata but not in _varies
        self._metadata: dict[int, tuple[bytes, ...]] = {}
        self._varies: set[int] = set()
        self._zarr_json: set[int] = set()  # zarr.json keys: found by name, by the readers `sees_zarr_json`
        self._chunks: dict[int, ArrayInfo] = {}  # array dir id -> info, for arrays whose chunks change
        # key index -> decoded chunk (in a slot of the buffer pool, if there is one)
        self._pool = pool
        self._decoded = decoded if decoded is not None else shared_decoded_cache(cache_size, pool)
        self._tag = None if decoded is None else object()  # a shared cache's keys: (this view, key index)
        # decodes run in worker threads, as many at once as their scratch space allows
        self._scratch = scratch or ScratchLimiter(DEFAULT_SCRATCH, os.cpu_count() or 2)
        self._codecs: dict[int, list] = {}
        self._renamed: dict[int, int] = {}  # added chunk key index -> the key it serves
        self._renamed_away: set[int] = set()  # chunk keys no form reads by their own name
        self._fill_keys: dict[int, ArrayInfo] = {}  # missing chunks served as files of the fill value
        self._lazy_strings: dict[int, ArrayInfo] = {}  # array dir id -> strings given a last dimension, of a lazy set
        layouts = getattr(self.refset, "shards", None) or {}  # sharded Zarr v3 arrays, by path
        self._shards = {a.dir_id: layouts[a.path] for a in self.arrays if a.path in layouts}
        self._shard_reader = ShardReader(raw)
        self._plan()

    # -- set-up -----------------------------------------------------------------------------------

    def _plan(self) -> None:
        dirs = self.refset.dirs
        served: dict[str, list] = {}  # metadata key -> its JSON value in each form
        # added chunk keys -> the key they serve: of strings given a last dimension (characters),
        # and of characters whose last dimension is joined into strings (the "gdal" form)
        renames: dict[str, int] = {}
        strlen_renames: dict[str, int] = {}
        fill_keys: dict[str, ArrayInfo] = {}  # missing chunks served as files (_fill_missing_chunks)
        joined_fills: dict[str, str] = {}  # second names of those that are chunks of joined characters
        chars_with_dimension = any(f.chars in ("char", "ubyte", "nczarr") for f in self.forms)
        nczarr = [n for n, f in enumerate(self.forms) if f.nczarr]  # forms with NCZarr's own metadata
        nczarr_arrays = {n: [] for n in nczarr}  # (info, .zarray, .zattrs) of each visible array in each of them
        lines = ArrayLines()
        lazy = getattr(self.refset, "lazy", False)
        for info in self.arrays:
            if info.strlen and lazy and info.separator != ".":
                info.hidden_reason = ("strings served as characters need their chunk keys renamed, not done where "
                                      "chunk keys are computed and nest ('/')")
            if info.hidden_reason:
                lines.say(logging.WARNING, "hidden", "decoded view: hiding array %s: %s", info.name, info.hidden_reason)
                self._hide_tree(info.dir_id)
                continue
            if info.notes:
                lines.say(logging.INFO, "notes", "decoded view: array %s: %s", info.name, "; ".join(info.notes))
            prefix = f"{info.path}/" if info.path else ""
            forms = [served_array(info, form) for form in self.forms]
            filled = self._fill_missing_chunks(info, [z for z, _ in forms], fill_keys, lines)
            served[prefix + ".zarray"] = [z for z, _ in forms]
            if info.zattrs or self.refset.find(prefix + ".zattrs") >= 0 or nczarr:  # (NCZarr needs one)
                served[prefix + ".zattrs"] = [a for _, a in forms]
            for n in nczarr:
                nczarr_arrays[n].append((info, *forms[n]))
            if info.strlen and chars_with_dimension:
                if lazy:  # (its chunk keys are not listed: "1.2.0" is found as "1.2" when asked, `_strlen_alias`)
                    self._lazy_strings[info.dir_id] = info
                else:
                    strlen_renames.update(self._strlen_chunk_names(info))
            if any(joins_last_dimension(info, form) for form in self.forms):
                renames.update(self._joined_chunk_names(info))
                prefix_ = f"{info.path}/" if info.path else ""
                joined_fills.update({prefix_ + n[:-2]: prefix_ + n for n in filled if n.endswith(".0")})
            if info.transforms_chunks or info.dir_id in self._shards:  # (an inner chunk is never its key's bytes)
                self._chunks[info.dir_id] = info
                if info.separator == "/":  # its chunks live in subdirectories (every one, for a root array)
                    for d, path in enumerate(dirs.paths):
                        if path.startswith(prefix):
                            self._by_dir.setdefault(d, info)
        trees = {}  # form index -> NCZarr's own metadata of the tree (each array's dimension references, each
        # group's lists), in each form with NCZarr's keys (their arrays' dimensions differ)
        if nczarr:
            groups = [path for d, path in enumerate(dirs.paths) if d not in self._by_dir and not self.hidden_dir(d)
                      and self.refset.find(f"{path}/.zgroup" if path else ".zgroup") >= 0]
            for n in nczarr:
                trees[n] = nczarr_tree(groups, nczarr_arrays[n])
                for info, _, _ in nczarr_arrays[n]:
                    served[f"{info.path}/.zattrs" if info.path else ".zattrs"][n] = served_array(info, self.forms[n], trees[n])[1]
            for path in groups:  # (a group without attributes gets a .zattrs for its _nczarr_group)
                key = f"{path}/.zattrs" if path else ".zattrs"
                if self.refset.find(key) < 0:
                    served[key] = [served_group_attributes({}, {}, form, path, trees.get(n))
                                   for n, form in enumerate(self.forms)]
        # every other JSON metadata key: re-emitted as UTF-8 without \u escapes, group attributes
        # typed as for arrays
        for d, path in enumerate(dirs.paths):
            prefix = f"{path}/" if path else ""
            for name in (".zgroup", ".zattrs"):
                key = prefix + name
                i = self.refset.find(key)
                if i >= 0 and key not in served and i not in self._hidden_keys and self.refset.inline_data(i) is not None:
                    value = self._plain(i, name, prefix, trees)
                    if value is not None:
                        served[key] = value
        lines.summarise()
        renames.update(strlen_renames)
        chars = [a.name for a in self.arrays if not a.hidden_reason and a.out_zarray["dtype"] == CHAR_DTYPE_49]
        if chars and len(self.forms) > 1:
            log.info("decoded view: character arrays %s are served in each reader's form (netCDF-C 4.9.0: '<U1'; "
                     "netCDF-C >= 4.9.3: NCZarr's '>S1', char in #mode=nczarr,file; zarr: '|S1'; GDAL: as its netCDF "
                     "driver; unidentified readers: numbers)", listed(chars))
        served[".zmetadata"] = [None] * len(self.forms)  # filled in below, once every key has its index
        json_form = zarr_json_form(self.forms)  # (zarr.json beside the v2 files: filled in below too)
        zarr_jsons = [] if json_form is None else \
            [k[: -len(".zarray")] + ZARR_JSON for k in served if k.endswith((".zarray", ".zgroup"))]
        if any(self.refset.find(k) >= 0 for k in zarr_jsons):  # (the set has its own: v2 and v3 mixed)
            zarr_jsons = []
        served.update((k, [None] * len(self.forms)) for k in zarr_jsons)
        added = {k: b"" for k in served if self.refset.find(k) < 0}
        self.refset = OverlayRefSet(self.refset, {**added, **dict.fromkeys(renames, b""),
                                                  **dict.fromkeys(fill_keys, b""), **dict.fromkeys(joined_fills, b"")},
                                    self._strlen_alias if self._lazy_strings else None)
        for key, i in renames.items():
            self._renamed[self.refset.find(key)] = i
        self._fill_keys = {self.refset.find(key): info for key, info in fill_keys.items()}
        for key, target in joined_fills.items():
            self._renamed[self.refset.find(key)] = self.refset.find(target)
        if all(f.chars in ("char", "ubyte", "nczarr") for f in self.forms):  # (no form reads their own names)
            self._renamed_away = set(strlen_renames.values())
        by_index = {self.refset.find(k): v for k, v in served.items()}
        metadata = list(metadata_items(self.refset))  # (once, not once a form)
        for n in range(len(self.forms)):
            def served_json(i: int, n=n):
                if self.hidden(i):
                    return None
                if i in by_index:
                    return by_index[i][n]
                return self._inline_json(i)

            by_index[self.refset.find(".zmetadata")][n] = consolidated_value(self.refset, served_json, quiet=n > 0,
                                                                            keys=metadata)
        if zarr_jsons:
            documents = _zarr_json(by_index[self.refset.find(".zmetadata")][json_form])
            for key in zarr_jsons:  # (the same bytes for every reader; none: hidden)
                by_index[self.refset.find(key)] = [documents.get(key)] * len(self.forms)
            self._zarr_json = {self.refset.find(key) for key in zarr_jsons if key in documents}
        zmetadata = self.refset.find(".zmetadata")
        made: dict[int, bytes] = {}  # id of a value in by_index -> its JSON (the .zmetadata is made of them)
        for i, values in by_index.items():
            if i != zmetadata:
                self._set_versions(i, values, made)

        def entry_text(value) -> bytes:
            return made.get(id(value)) or dump_json(value)

        self._set_versions(zmetadata, by_index[zmetadata], dump=lambda value: consolidated_text(value, entry_text))

    def _set_versions(self, i: int, values: list, made: dict | None = None, dump=dump_json) -> None:
        """Key i's bytes in each form, padded with spaces (JSON allows them) to one length: a file has
        one size for every reader. None: hidden. `made`: each value's JSON is kept there by its id."""
        if all(v is None for v in values):
            self._hidden_keys.add(i)
            return
        texts: list[tuple[object, bytes]] = []  # (value, its JSON): the forms' values are mostly equal: dump
        datas = []  # each once
        for value in values:
            data = next((text for seen, text in texts if _same_json(seen, value)), None)
            if data is None:
                data = dump(value)
                texts.append((value, data))
            if made is not None:
                made[id(value)] = data
            datas.append(data)
        size = max(map(len, datas))
        padded: dict[bytes, bytes] = {}
        self._metadata[i] = tuple(padded.setdefault(d, d + b" " * (size - len(d))) for d in datas)
        if len(padded) > 1:
            self._varies.add(i)

    def _inline_json(self, i: int):
        data = self.refset.inline_data(i)
        try:
            return load_json_value(data) if data else None
        except (ValueError, RecursionError):
            return None

    def _strlen_chunk_names(self, info: ArrayInfo) -> dict[str, int]:
        """Chunk keys of an array served with an added last dimension: key "1.2" answers as "1.2.0"."""
        prefix = f"{info.path}/" if info.path else ""
        names = {}
        for d, path in enumerate(self.refset.dirs.paths):
            if d != info.dir_id and not (prefix and path.startswith(prefix)):
                continue
            for i in self.refset.files_in(d).tolist():
                name = self.refset.key(i)[len(prefix):]
                if info.chunk_index(name) is not None:
                    names[f"{prefix}{name}{info.separator}0"] = i
        return names

    def _strlen_alias(self, key: str) -> str | None:
        """The chunk key that `key` names in a lazy set's array of strings served with an added last
        dimension ("t/1.2.0" is "t/1.2", the same file: `_strlen_chunk_names` for an eager set)."""
        path, _, name = key.rpartition("/")
        d = self.raw.refset.dirs.ids.get(path)
        if d not in self._lazy_strings or not name.endswith(".0"):
            return None
        return key[:-2]

    def _fill_missing_chunks(self, info: ArrayInfo, zarrays: list[dict], fill_keys: dict,
                             lines: ArrayLines | None = None) -> list[str]:
        """A form whose fill_value is not the one the array's missing chunks read as (GDAL's nodata,
        refmount.view.forms) gets them as files of that fill instead, so that every form reads the
        same values; where that cannot be (a Parquet set, the "/" separator, more than
        MAX_FILL_CHUNKS, no base fill) every form keeps the base fill_value. So do characters that
        GDAL reads as strings (without a fill it reads a missing chunk as null strings, not the NULs
        netCDF's characters are filled with). Returns the chunk names served as files."""
        prefix = f"{info.path}/" if info.path else ""
        if info.out_zarray["dtype"] == CHAR_DTYPE_49:
            if info.strlen or not any(f.nodata_fill and z["dtype"].startswith("|S") for f, z in zip(self.forms, zarrays)):
                return []
            missing = self._missing_chunk_names(info) or []
            if len(fill_keys) + len(missing) > MAX_FILL_CHUNKS:
                return []
            fill_keys.update({prefix + name: info for name in missing})
            return missing
        if info.missing_chunk_fill is not None:  # (every form: its chunks never written are not fill_value)
            return self._fill_with_hdf5_fill(info, fill_keys, lines)
        base = info.out_zarray.get("fill_value")
        differ = [z for z in zarrays if _fill_bytes(z.get("fill_value"), z["dtype"]) != _fill_bytes(base, info.out_zarray["dtype"])]
        if not differ:
            return []
        missing = self._missing_chunk_names(info)
        if missing == [] or getattr(self.refset, "may_lack", False):
            return []  # (every chunk is there, or a native store's: its missing ones read as its fill)
        if base is None or missing is None or len(fill_keys) + len(missing) > MAX_FILL_CHUNKS:
            for z in differ:
                z["fill_value"] = base
            (lines or ArrayLines()).say(logging.INFO, "fills", "decoded view: array %s: fill_value %r kept in every "
                                        "form (its missing chunks cannot be served as files)", info.name, base)
            return []
        for name in missing:
            fill_keys[prefix + name] = info
        return missing

    def _fill_with_hdf5_fill(self, info: ArrayInfo, fill_keys: dict, lines: ArrayLines | None) -> list[str]:
        """Chunks never written of an array whose _FillValue is not HDF5's fill, served as files of HDF5's
        (ArrayInfo.missing_chunk_fill); where that cannot be, they read as fill_value, masked (logged)."""
        missing = self._missing_chunk_names(info)
        if missing is None or getattr(self.refset, "may_lack", False) or len(fill_keys) + len(missing) > MAX_FILL_CHUNKS:
            (lines or ArrayLines()).say(logging.INFO, "fills", "decoded view: array %s: chunks never written read "
                                        "as its _FillValue, not HDF5's fill (they cannot be served as files)", info.name)
            return []
        prefix = f"{info.path}/" if info.path else ""
        for name in missing:
            fill_keys[prefix + name] = info
        return missing

    def _missing_chunk_names(self, info: ArrayInfo) -> list[str] | None:
        """The chunk keys of the array's grid (as served) that the set lacks; None: not known at mount."""
        if getattr(self.refset, "lazy", False) or info.separator != "." or info.dir_id in self._shards:
            return None
        shape, chunks = info.out_zarray["shape"], info.out_zarray["chunks"]
        grid = [-(-n // c) for n, c in zip(shape, chunks)] if shape else [1]
        if math.prod(grid) > MAX_FILL_CHUNKS:
            return None
        prefix = f"{info.path}/" if info.path else ""
        names = (".".join(map(str, index)) for index in np.ndindex(*grid))
        return [name for name in names if self.refset.find(prefix + name) < 0]

    def _joined_chunk_names(self, info: ArrayInfo) -> dict[str, int]:
        """Chunk keys of a char array served as strings of its last dimension ("gdal" form):
        key "1.0" answers as "1" too."""
        prefix = f"{info.path}/" if info.path else ""
        names = {}
        for i in self.refset.files_in(info.dir_id).tolist():
            name = self.refset.key(i)[len(prefix):]
            if info.chunk_index(name) is not None and name.endswith(".0") and self.refset.find(prefix + name[:-2]) < 0:
                names[f"{prefix}{name[:-2]}"] = i
        return names

    def _hide_tree(self, dir_id: int) -> None:
        path = self.refset.dirs.paths[dir_id]
        if not path:  # a broken root array: hide only its own keys
            for name in (".zarray",):
                i = self.refset.find(name)
                if i >= 0:
                    self._hidden_keys.add(i)
            return
        self._hidden_dirs.add(dir_id)
        self._hidden_prefixes.append(path + "/")

    def _plain(self, i: int, name: str, prefix: str, trees: dict) -> list | None:
        """A group's .zgroup or .zattrs in each form (None: not JSON, served as it is)."""
        value = self._inline_json(i)
        if value is None:
            return None
        if name != ".zattrs" or not isinstance(value, dict):
            return [value] * len(self.forms)
        left_out = {k: v for k, v in value.items() if left_out_for_49(v)}
        attrs, notes = served_attributes(value, None, None)
        for note in notes:
            log.info("decoded view: group %s: %s", prefix.rstrip("/") or "/", note)
        return [served_group_attributes(attrs, left_out, form, prefix.rstrip("/"), trees.get(n))
                for n, form in enumerate(self.forms)]

    # -- visibility -------------------------------------------------------------------------------

    def hidden_dir(self, d: int) -> bool:
        if not self._hidden_dirs:
            return False
        path = self.refset.dirs.paths[d] + "/"
        return any(path.startswith(prefix) for prefix in self._hidden_prefixes)

    def hidden(self, i: int) -> bool:
        if i in self._hidden_keys or i in self._renamed_away:
            return True
        return bool(self._hidden_dirs) and self.hidden_dir(self.refset.dir_id(i))

    def unlisted(self, i: int) -> bool:
        """Is key i left out of listings, and found by name only by some readers (`shown_to`)?"""
        return i in self._zarr_json

    def shown_to(self, i: int, form: int) -> bool:
        """Does a reader served form `form` (an index into self.forms) find key i by its name?"""
        return i not in self._zarr_json or sees_zarr_json(self.forms[form])

    def varies(self, i: int) -> bool:
        """Does key i hold other bytes for other readers (then each open asks whose form it is)?"""
        return i in self._varies

    # -- sizes and bytes --------------------------------------------------------------------------

    def _chunk_info(self, i: int) -> ArrayInfo | None:
        """The array whose chunks this key holds, if those chunks are transformed."""
        info = self._by_dir.get(self.refset.dir_id(i))
        if info is None or info.dir_id not in self._chunks:
            return None
        name = self.refset.key(i)[len(info.path) + 1 if info.path else 0:]
        return info if info.chunk_index(name) is not None else None

    def known_size(self, i: int) -> int | None:
        i = self._renamed.get(i, i)
        if i in self._fill_keys:
            return self._fill_keys[i].out_chunk_bytes
        meta = self._metadata.get(i)
        if meta is not None:
            return len(meta[0])
        info = self._chunk_info(i)
        if info is not None:
            return info.out_chunk_bytes
        return self.raw.known_size(i)

    def watch_sizes(self, resized) -> None:
        """As RawView.watch_sizes, with the keys this view adds that serve a resized key."""
        def with_added(keys):
            shown = set(keys)
            resized(keys + [added for added, i in self._renamed.items() if i in shown])

        self.raw.watch_sizes(with_added)

    def known_object_sizes(self, sizes: dict[str, int]) -> None:
        self.raw.known_object_sizes(sizes)

    async def learn_sizes(self, keys) -> None:
        capacity = self.raw.refset.capacity
        await self.raw.learn_sizes([j for j in (self._renamed.get(i, i) for i in keys) if j < capacity])

    async def size(self, i: int) -> int:
        known = self.known_size(i)
        if known is not None:
            return known
        try:
            return await self.raw.size(self._renamed.get(i, i))
        except Absent:
            info = self._array_of_chunk(i)
            if info is None:
                raise
            return info.out_chunk_bytes  # (read as the fill below)

    async def read(self, i: int, offset: int, size: int, form: int = 0):
        """The bytes, or a memoryview of a decoded chunk (a FUSE reply needs no copy). `form`: an
        index into self.forms (metadata keys only)."""
        i = self._renamed.get(i, i)
        meta = self._metadata.get(i)
        if meta is not None:
            return meta[form][offset : offset + size]
        if i in self._fill_keys:
            return _fill_range(self._fill_keys[i], offset, size)
        info = self._chunk_info(i)
        if info is None:
            try:
                data = await self.raw.read(i, offset, size)
            except Absent:
                info = self._array_of_chunk(i)
                if info is None:
                    raise
                return (await self._absent_chunk(i, info))[offset : offset + size]
            if len(data) < size:
                self._check_not_cut(i, offset + len(data))
            return data
        return (await self._decoded_chunk(i, info))[offset : offset + size]

    def _check_not_cut(self, i: int, end: int) -> None:
        """A chunk served as stored (no transform) whose bytes end at `end`, before its last element
        inside the array's shape (its reference runs past its file's end: a truncated file, a FITS header
        whose NAXIS lies): an error, never short data (netCDF-C reads the rest as zeros). An edge chunk
        may end early where only elements past the shape are missing (a TIFF's last strip)."""
        info = self._array_of_chunk(i)
        if info is None or end >= info.out_chunk_bytes:
            return
        name = self.refset.key(i)[len(info.path) + 1 if info.path else 0:]
        index, shape, chunks = info.chunk_index(name), info.meta.shape, info.chunk_shape
        last = [min(c, n - x * c) - 1 for x, c, n in zip(index, chunks, shape)] if shape else []
        if any(n < 0 for n in last):
            return  # (a chunk outside the grid)
        needed = (int(np.ravel_multi_index(last, chunks)) + 1 if shape else 1) * info.dtype.itemsize
        if end < needed:
            raise DecodeError(f"chunk {self.refset.key(i)!r} ends after {end:,} bytes, short of the {needed:,} "
                              "that hold its elements (its file is cut short)")

    # A chunk of a native Zarr store's grid that its server does not hold (refmount.errors.Absent) reads
    # as the store's fill value, as zarr-python reads it: in the decoded view, a chunk of that fill,
    # through the same transforms as a stored one.

    def _array_of_chunk(self, i: int) -> ArrayInfo | None:
        info = self._by_dir.get(self.refset.dir_id(i))
        if info is None or info.hidden_reason or info.out_dtype is None:
            return None
        name = self.refset.key(i)[len(info.path) + 1 if info.path else 0:]
        return info if info.chunk_index(name) is not None else None

    async def _absent_chunk(self, i: int, info: ArrayInfo):
        fills = getattr(self.refset, "absent_fills", None) or {}
        fill = fills[info.path] if info.path in fills else info.meta.fill_value
        dtype = info.dtype if info.recode_from is None else info.recode_from  # (<U strings: recoded in _decode)
        value = stored_fill(fill, dtype) if dtype.kind != "O" else None
        if value is None:
            raise DecodeError(f"chunk {self.refset.key(i)!r} is not in its store, and its array's fill_value "
                              f"{fill!r} is not one of {dtype}")
        stored = np.full(info.chunk_shape or (1,), value, dtype).tobytes()
        return await self._decode_in_thread(i, info, stored, True)

    async def read_all(self, i: int) -> bytes:
        return await self.read(i, 0, await self.size(i))

    async def _decoded_chunk(self, i: int, info: ArrayInfo):
        async def decode():
            layout = self._shards.get(info.dir_id)
            if layout is not None:
                return await self._inner_chunk(i, info, layout)
            # (a view of the cached bytes, not a copy: the buffer pool reuses no slot still viewed)
            try:
                raw = await self.raw.read(i, 0, await self.raw.size(i))
            except Absent:
                return await self._absent_chunk(i, info)
            return await self._decode_in_thread(i, info, raw)

        return await self._decoded.get(i if self._tag is None else (self._tag, i), decode)

    async def _decode_in_thread(self, i: int, info: ArrayInfo, raw, decoded: bool = False):
        chunk = await self._scratch(decode_scratch(len(raw), info), self._decode, i, info, raw, decoded)
        return chunk if self._pool is None else self._pool.keep(chunk)

    async def _inner_chunk(self, i: int, info: ArrayInfo, layout):
        """An inner chunk of a sharded array, decoded: its bytes from its shard, or the fill."""
        key = self.refset.key(i)
        shard, local = layout.shard_of(info.chunk_index(key[len(info.path) + 1 if info.path else 0:]))
        if not layout.has_shard(shard):  # a missing shard's chunk of the fill value (zarr3._fill_chunks)
            raw = await self.raw.read_all(i)
        else:
            try:
                raw = await self._shard_reader.inner_chunk(i, layout, shard, local, key)
            except Absent:  # a shard its store does not hold
                raw = None
            if raw is None:  # an empty inner chunk: the fill value, as the codecs would give it
                return await self._decode_in_thread(i, info, layout.fill_chunk, True)
        return await self._decode_in_thread(i, info, raw)

    def _codecs_of(self, info: ArrayInfo) -> list:
        """An array's codecs, made at its first chunk decoded: a codec of another package (kerchunk's
        grib) imports it (0.3 s), which no mount answering `ncdump -h` needs."""
        codecs = self._codecs.get(info.dir_id)
        if codecs is None:
            codecs = self._codecs[info.dir_id] = [make_codec(c) for c in info.codecs]
        return codecs

    def _decode(self, i: int, info: ArrayInfo, raw, decoded: bool = False):
        """Runs in a worker thread: codecs in reverse (unless `decoded`), then swap/reorder/crop.
        Exact size or error. The last step writes into a slot of the buffer pool (where the cache
        keeps it), or, without a pool, the result is the last stage's own buffer."""
        key = self.refset.key(i)
        data = raw
        expected = int(np.prod(info.chunk_shape or (1,))) * info.dtype.itemsize
        pool = self._pool
        out = pool.take(info.out_chunk_bytes) if pool is not None and info.out_chunk_bytes >= pool.min_pooled else None
        plain = not (info.swap or info.fortran or info.crop is not None or info.recode_from is not None
                     or info.string_pad is not None)
        short = None if decoded else self._short_bytes(key, info, expected)
        try:
            codecs = [] if decoded else self._codecs_of(info)[::-1]
            if short is not None and not info.meta.compressor:
                data = _padded(data, short, expected)
            for n, codec in enumerate(codecs):
                # the last stage of a plain chunk may write straight into the pool's slot
                if n == len(codecs) - 1 and plain and out is not None and decode_into(codec, data, out):
                    return out.toreadonly()
                if _deflated_once(codecs, n, data, expected):
                    continue
                # no stage may grow past the chunk's size (filters such as fixedscaleoffset shrink
                # it at most by 8x before the compressor, so 8x leaves them room); the last stage's
                # output is the chunk itself, so a lone compressor stops one byte past it
                last = n == len(codecs) - 1 and info.recode_from is None
                data = decode_bounded(codec, data, expected if last else 8 * expected)
                if n == 0 and short is not None and info.meta.compressor:  # (the strip's own bytes)
                    data = _padded(data, short, expected)
            if info.recode_from is not None:
                data = fixed_strings(data, info.recode_from, info.dtype.itemsize)
            if info.string_pad is not None:
                data = cut_padding(data, info.dtype.itemsize, info.string_pad)
            buffer = ensure_contiguous_ndarray(data).view(np.uint8).reshape(-1)
        except Exception as e:
            raise DecodeError(f"chunk {key!r} could not be decoded: {type(e).__name__}: {e}") from None
        if buffer.nbytes != expected:
            raise DecodeError(f"chunk {key!r} decoded to {buffer.nbytes} bytes, expected {expected}"
                              + (f" (or {short} padded: its last rows past the shape)" if short is not None else ""))
        if short is not None and (fill := stored_fill(info.meta.fill_value, info.dtype)) is not None:
            # rows past the shape, padded before the filters: the array's fill, whatever they made of them
            buffer = buffer.copy()
            buffer[short:] = np.full((expected - short) // info.dtype.itemsize, fill, info.dtype).view(np.uint8)
            data = buffer
        if not (info.swap or info.fortran or info.crop is not None):
            if out is None:
                return data if isinstance(data, bytes) else memoryview(buffer)
            out[:] = buffer
            return out.toreadonly()
        array = buffer.view(info.dtype).reshape(info.chunk_shape or (1,), order="F" if info.fortran else "C")
        # (byte strings keep their bytes: only numeric types are swapped, in the copy below)
        if info.crop is not None:
            array = array[info.crop]
        # only a swap changes the type: characters served as bytes (u1 of S1, and of Sn with a last dimension) keep theirs
        served = info.out_dtype if info.swap else info.dtype
        if array.size * served.itemsize != info.out_chunk_bytes:
            raise DecodeError(f"chunk {key!r} transforms to {array.size * served.itemsize} bytes, "
                              f"expected {info.out_chunk_bytes}")
        if out is None:
            return memoryview(np.ascontiguousarray(array.astype(served, copy=False)).reshape(-1).view(np.uint8))
        # swapped, reordered to C order and cropped in one copy, straight into the slot
        np.copyto(np.frombuffer(out, dtype=served).reshape(array.shape), array, casting="unsafe")
        return out.toreadonly()

    def _short_bytes(self, key: str, info: ArrayInfo, expected: int) -> int | None:
        """The bytes a short last chunk along `info.short_axis` decodes to (its rows inside the shape,
        the leading axes of its chunks all 1: refs/scan/tiff.py), for that chunk only; else None."""
        axis = info.short_axis
        if axis is None:
            return None
        index = info.chunk_index(key[len(info.path) + 1 if info.path else 0:])
        size, chunk = info.meta.shape[axis], info.chunk_shape[axis]
        rows = size - index[axis] * chunk if index is not None else chunk
        if not 0 < rows < chunk:
            return None
        return expected // chunk * rows

    def sources(self, i: int) -> list[str]:
        """Where key `i`'s bytes come from: a chunk's, its reference's url (or for an inline one, the
        files the set read it from); metadata rewritten from inline text, a key this view adds and a
        missing chunk served as fill, the files behind their directory (refs/origins.py)."""
        i = self._renamed.get(i, i)
        if i in self._metadata or i >= self.raw.refset.capacity:
            derived = origins_of(self.refset).of(self.refset.key(i))
            read = self.raw.sources(i) if i < self.raw.refset.capacity else []  # (a .zattrs may be a reference)
            return list(dict.fromkeys([*derived, *read]))
        return self.raw.sources(i)

    # -- extended attributes ----------------------------------------------------------------------

    def xattrs(self, i: int) -> dict[str, str]:
        i = self._renamed.get(i, i)
        if i in self._fill_keys:
            return {"user.refmount.source": "a missing chunk, served as the array's fill value"}
        attrs = self.raw.xattrs(i)
        info = self._chunk_info(i)
        if info is not None and info.codecs:
            attrs["user.refmount.codecs"] = " -> ".join(str(c.get("id")) for c in reversed(info.codecs))
        if info is not None and info.dir_id in self._shards:  # (url, offset and length are its shard's)
            attrs["user.refmount.shard"] = "an inner chunk of the shard referenced here"
        if i in self._metadata:
            attrs["user.refmount.rewritten"] = ("metadata rewritten for the decoded view"
                                                + (", in each reader's form" if i in self._varies else ""))
        return attrs

    def resize_decoded(self, capacity: int) -> None:
        """The decoded chunks' share of the memory target (the governor shrinks it under pressure)."""
        self._decoded.resize(capacity)

    def statistics(self) -> dict:
        return {"decodes": self._decoded.computed, "decoded_cached": len(self._decoded),
                "decoded_bytes": self._decoded.weight, "decoded_capacity": self._decoded.capacity,
                **self._scratch.statistics(), **self._shard_reader.statistics()}


def _same_json(a, b) -> bool:
    """Do a and b dump to the same JSON? == alone is not enough: 1 == 1.0 == True, which dump as
    1, 1.0 and true (a reader types an attribute by its text)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same_json, a, b))
    if isinstance(a, float):
        return repr(a) == repr(b)  # (-0.0 == 0.0; nan != nan)
    return a == b
