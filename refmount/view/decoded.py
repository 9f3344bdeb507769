"""The decoded view: what netCDF-C without filter plugins (and every other client) reads correctly.

Built on `RawView`. For every array (see refmount.view.arrays for the plan):
- ``.zarray`` is rewritten (compressor and filters null, little-endian dtype, bool as u1, scalars
  as shape [1], chunks cropped to the shape), all metadata JSON is re-emitted as UTF-8;
- chunk files are decoded with numcodecs in a worker thread and kept in a bounded LRU, so the
  many small reads FUSE makes of one chunk decode it once; their size is prod(chunks) x itemsize,
  known without fetching;
- arrays that cannot be represented are hidden, with one log line each; a chunk that fails to
  decode, or decodes to the wrong length, is an EIO naming the key, never short or padded data.
Missing chunks stay absent, so clients fill them with fill_value.

A sharded Zarr v3 array (refmount.view.zarr3, refmount.view.shards) is served as its inner chunks: reading one
reads its shard's index (once per shard, kept in a small LRU), then only that inner chunk's bytes;
an inner chunk the index marks empty reads as the Zarr fill value.
"""

from __future__ import annotations

import logging
import os

import numpy as np
from numcodecs.compat import ensure_contiguous_ndarray

from refmount.view.arrays import CHAR_DTYPE_49, ArrayInfo, _codec, listed, dump_json, fixed_strings, load_json_value, scan_arrays
from refmount.view.bounded import decode_bounded, decode_into
from refmount.view.consolidated import consolidated_metadata
from refmount.errors import RefmountError
from refmount.cache.budget import ScratchLimiter
from refmount.cache.lru import SingleFlightLRU
from refmount.view.ncattrs import served_attributes
from refmount.view.overlay import OverlayRefSet
from refmount.view.shards import ShardReader

log = logging.getLogger("refmount")
DEFAULT_SCRATCH = 16 << 20  # decoders' working memory when the mount's memory plan gives none


def _nbytes(value) -> int:
    return value.nbytes if isinstance(value, memoryview) else len(value)


def decode_scratch(compressed: int, info: ArrayInfo) -> int:
    """Estimated working memory of decoding one chunk: the compressed bytes, the output of one
    stage and the next (each codec and the transform make a new buffer, the one before is freed)."""
    stored = int(np.prod(info.chunk_shape or (1,))) * info.dtype.itemsize
    return compressed + 2 * max(stored, info.out_chunk_bytes)


class DecodeError(RefmountError):
    """A chunk could not be decoded into exactly its expected bytes."""


class DecodedView:
    name = "decoded"

    def __init__(self, raw, cache_size: int = 256 << 20, chars: str = "char", scratch=None, pool=None) -> None:
        self.raw = raw
        self.refset = raw.refset
        self.arrays = scan_arrays(self.refset, chars)
        self._by_dir: dict[int, ArrayInfo] = {a.dir_id: a for a in self.arrays}
        self._hidden_dirs: set[int] = set()
        self._hidden_prefixes: list[str] = []
        self._metadata: dict[int, bytes] = {}  # key index -> rewritten metadata bytes
        self._chunks: dict[int, ArrayInfo] = {}  # array dir id -> info, for arrays whose chunks change
        # key index -> decoded chunk (in a slot of the buffer pool, if there is one)
        self._pool = pool
        self._decoded = SingleFlightLRU(cache_size, weigh=pool.footprint if pool else _nbytes,
                                        on_evict=pool.release if pool else None)
        # decodes run in worker threads, as many at once as their scratch space allows
        self._scratch = scratch or ScratchLimiter(DEFAULT_SCRATCH, os.cpu_count() or 2)
        self._codecs: dict[int, list] = {}
        self._renamed: dict[int, int] = {}  # added chunk key index -> the key it serves
        self._renamed_away: set[int] = set()  # chunk keys served under another name
        layouts = getattr(self.refset, "shards", None) or {}  # sharded Zarr v3 arrays, by path
        self._shards = {a.dir_id: layouts[a.path] for a in self.arrays if a.path in layouts}
        self._shard_reader = ShardReader(raw)
        self._plan()

    # -- set-up -----------------------------------------------------------------------------------

    def _plan(self) -> None:
        dirs = self.refset.dirs
        added: dict[str, bytes] = {}  # metadata keys the set lacks
        renames: dict[str, int] = {}  # chunk keys of arrays given a last dimension -> the key served
        for info in self.arrays:
            if info.strlen and getattr(self.refset, "lazy", False):
                info.hidden_reason = "strings served as characters need their chunk keys renamed, not done for Parquet sets"
            if info.hidden_reason:
                log.warning("decoded view: hiding array %s: %s", info.name, info.hidden_reason)
                self._hide_tree(info.dir_id)
                continue
            if info.notes:
                log.info("decoded view: array %s: %s", info.name, "; ".join(info.notes))
            prefix = f"{info.path}/" if info.path else ""
            self._set_metadata(prefix + ".zarray", info.out_zarray)
            if info.zattrs or self.refset.find(prefix + ".zattrs") >= 0:
                self._set_metadata(prefix + ".zattrs", info.zattrs, added)
            if info.strlen:
                renames.update(self._strlen_chunk_names(info))
            if info.transforms_chunks or info.dir_id in self._shards:  # (an inner chunk is never its key's bytes)
                self._chunks[info.dir_id] = info
                self._codecs[info.dir_id] = [_codec(c) for c in info.codecs]
                if info.separator == "/":  # its chunks live in subdirectories (every one, for a root array)
                    for d, path in enumerate(dirs.paths):
                        if path.startswith(prefix):
                            self._by_dir.setdefault(d, info)
        # every other JSON metadata key: re-emitted as UTF-8 without \u escapes, group attributes
        # typed as for arrays
        for d, path in enumerate(dirs.paths):
            prefix = f"{path}/" if path else ""
            for name in (".zgroup", ".zattrs"):
                i = self.refset.find(prefix + name)
                if i >= 0 and i not in self._metadata and self.refset.inline_data(i) is not None:
                    self._rewrite_plain(i, name, prefix)
        in_49_form = [a.name for a in self.arrays if not a.hidden_reason and a.out_zarray["dtype"] == CHAR_DTYPE_49]
        if in_49_form:
            log.warning("decoded view: character arrays %s are served in netCDF-C 4.9's char form (Debian 12's "
                        "ncdump prints their text); netCDF-C >= 4.10 (netCDF4-python) cannot open this mount "
                        "and zarr cannot read those arrays: mount with --chars string for them",
                        listed(in_49_form))
        added[".zmetadata"] = b""  # filled in below, once every key has its index
        new = {k: v for k, v in added.items() if self.refset.find(k) < 0}
        self.refset = OverlayRefSet(self.refset, {**new, **dict.fromkeys(renames, b"")})
        for key, data in added.items():
            self._metadata[self.refset.find(key)] = data
        for key, i in renames.items():
            self._renamed[self.refset.find(key)] = i
        self._renamed_away = set(renames.values())
        self._metadata[self.refset.find(".zmetadata")] = consolidated_metadata(self.refset, self._served_json)

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

    def _served_json(self, i: int):
        """The metadata value served for key index i (None: hidden, or not inline JSON)."""
        if self.hidden(i):
            return None
        data = self._metadata.get(i)
        if data is None:
            data = self.refset.inline_data(i)
        try:
            return load_json_value(data) if data else None
        except ValueError:
            return None

    def _hide_tree(self, dir_id: int) -> None:
        path = self.refset.dirs.paths[dir_id]
        if not path:  # a broken root array: hide only its own keys
            for name in (".zarray",):
                i = self.refset.find(name)
                if i >= 0:
                    self._metadata[i] = b""
            return
        self._hidden_dirs.add(dir_id)
        self._hidden_prefixes.append(path + "/")

    def _set_metadata(self, key: str, value, added: dict | None = None) -> None:
        i = self.refset.find(key)
        if i >= 0:
            self._metadata[i] = dump_json(value)
        elif added is not None:
            added[key] = dump_json(value)

    def _rewrite_plain(self, i: int, name: str, prefix: str) -> None:
        try:
            value = load_json_value(self.refset.inline_data(i))
        except (ValueError, RecursionError):
            return  # not JSON: serve it as it is
        if name == ".zattrs" and isinstance(value, dict):
            value, notes = served_attributes(value, None, None)
            for note in notes:
                log.info("decoded view: group %s: %s", prefix.rstrip("/") or "/", note)
        self._metadata[i] = dump_json(value)

    # -- visibility -------------------------------------------------------------------------------

    def hidden_dir(self, d: int) -> bool:
        if not self._hidden_dirs:
            return False
        path = self.refset.dirs.paths[d] + "/"
        return any(path.startswith(prefix) for prefix in self._hidden_prefixes)

    def hidden(self, i: int) -> bool:
        if self._metadata.get(i) == b"" or i in self._renamed_away:
            return True
        return bool(self._hidden_dirs) and self.hidden_dir(self.refset.dir_id(i))

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
        meta = self._metadata.get(i)
        if meta is not None:
            return len(meta)
        info = self._chunk_info(i)
        if info is not None:
            return info.out_chunk_bytes
        return self.raw.known_size(i)

    async def size(self, i: int) -> int:
        known = self.known_size(i)
        return known if known is not None else await self.raw.size(self._renamed.get(i, i))

    async def read(self, i: int, offset: int, size: int):
        """The bytes, or a memoryview of a decoded chunk (a FUSE reply needs no copy)."""
        i = self._renamed.get(i, i)
        meta = self._metadata.get(i)
        if meta is not None:
            return meta[offset : offset + size]
        info = self._chunk_info(i)
        if info is None:
            return await self.raw.read(i, offset, size)
        return (await self._decoded_chunk(i, info))[offset : offset + size]

    async def read_all(self, i: int) -> bytes:
        return await self.read(i, 0, await self.size(i))

    async def _decoded_chunk(self, i: int, info: ArrayInfo):
        async def decode():
            layout = self._shards.get(info.dir_id)
            if layout is not None:
                return await self._inner_chunk(i, info, layout)
            # (a view of the cached bytes, not a copy: the buffer pool reuses no slot still viewed)
            return await self._decode_in_thread(i, info, await self.raw.read(i, 0, await self.raw.size(i)))

        return await self._decoded.get(i, decode)

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
            raw = await self._shard_reader.inner_chunk(i, layout, shard, local, key)
            if raw is None:  # an empty inner chunk: the fill value, as the codecs would give it
                return await self._decode_in_thread(i, info, layout.fill_chunk, True)
        return await self._decode_in_thread(i, info, raw)

    def _decode(self, i: int, info: ArrayInfo, raw, decoded: bool = False):
        """Runs in a worker thread: codecs in reverse (unless `decoded`), then swap/reorder/crop.
        Exact size or error. The last step writes into a slot of the buffer pool (where the cache
        keeps it), or, without a pool, the result is the last stage's own buffer."""
        key = self.refset.key(i)
        data = raw
        expected = int(np.prod(info.chunk_shape or (1,))) * info.dtype.itemsize
        pool = self._pool
        out = pool.take(info.out_chunk_bytes) if pool is not None and info.out_chunk_bytes >= pool.min_pooled else None
        plain = not (info.swap or info.fortran or info.crop is not None or info.recode_from is not None)
        codecs = [] if decoded else self._codecs[info.dir_id][::-1]
        try:
            for n, codec in enumerate(codecs):
                # the last stage of a plain chunk may write straight into the pool's slot
                if n == len(codecs) - 1 and plain and out is not None and decode_into(codec, data, out):
                    return out.toreadonly()
                # no stage may grow past the chunk's size (filters such as fixedscaleoffset shrink
                # it at most by 8x before the compressor, so 8x leaves them room)
                data = decode_bounded(codec, data, 8 * expected)
            if info.recode_from is not None:
                data = fixed_strings(data, info.recode_from, info.dtype.itemsize)
            buffer = ensure_contiguous_ndarray(data).view(np.uint8).reshape(-1)
        except Exception as e:
            raise DecodeError(f"chunk {key!r} could not be decoded: {type(e).__name__}: {e}") from None
        if buffer.nbytes != expected:
            raise DecodeError(f"chunk {key!r} decoded to {buffer.nbytes} bytes, expected {expected}")
        if not (info.swap or info.fortran or info.crop is not None):
            if out is None:
                return data if isinstance(data, bytes) else memoryview(buffer)
            out[:] = buffer
            return out.toreadonly()
        array = buffer.view(info.dtype).reshape(info.chunk_shape or (1,), order="F" if info.fortran else "C")
        # (byte strings keep their bytes: only numeric types are swapped, in the copy below)
        if info.crop is not None:
            array = array[info.crop]
        if array.size * info.out_dtype.itemsize != info.out_chunk_bytes:
            raise DecodeError(f"chunk {key!r} transforms to {array.size * info.out_dtype.itemsize} bytes, "
                              f"expected {info.out_chunk_bytes}")
        if out is None:
            return memoryview(np.ascontiguousarray(array.astype(info.out_dtype, copy=False)).reshape(-1).view(np.uint8))
        # swapped, reordered to C order and cropped in one copy, straight into the slot
        np.copyto(np.frombuffer(out, dtype=info.out_dtype).reshape(array.shape), array, casting="unsafe")
        return out.toreadonly()

    def targets(self, i: int) -> list[str]:
        """The urls whose bytes key `i` is made of (none for metadata, rewritten from inline text)."""
        i = self._renamed.get(i, i)
        if i in self._metadata or i >= self.raw.refset.capacity:
            return []
        return self.raw.targets(i)

    # -- extended attributes ----------------------------------------------------------------------

    def xattrs(self, i: int) -> dict[str, str]:
        i = self._renamed.get(i, i)
        attrs = self.raw.xattrs(i)
        info = self._chunk_info(i)
        if info is not None and info.codecs:
            attrs["user.refmount.codecs"] = " -> ".join(str(c.get("id")) for c in reversed(info.codecs))
        if info is not None and info.dir_id in self._shards:  # (url, offset and length are its shard's)
            attrs["user.refmount.shard"] = "an inner chunk of the shard referenced here"
        if i in self._metadata:
            attrs["user.refmount.rewritten"] = "metadata rewritten for the decoded view"
        return attrs

    def resize_decoded(self, capacity: int) -> None:
        """The decoded chunks' share of the memory target (the governor shrinks it under pressure)."""
        self._decoded.resize(capacity)

    def statistics(self) -> dict:
        return {"decodes": self._decoded.computed, "decoded_cached": len(self._decoded),
                "decoded_bytes": self._decoded.weight, "decoded_capacity": self._decoded.capacity,
                **self._scratch.statistics(), **self._shard_reader.statistics()}
