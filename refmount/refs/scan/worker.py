"""The scanning side of a worker process: kerchunk's parsers over a file whose bytes come from the
parent through a pipe (the parent fetches them with refmount's fetcher and block cache).

A worker is a process of its own because h5py holds one global lock (threads would not scan in
parallel), and so that a hostile or huge header costs the worker, not the daemon: its address space is
capped (RLIMIT_AS) and everything it sends back is JSON bytes of a bounded length, never a pickle.

Messages (each one `send_bytes` of JSON, worker -> parent): ["read", start, end] asks for bytes
(the parent answers with the raw bytes); ["exists", url] asks whether a file is there (a DMR++'s
href; the parent answers JSON true, false or null); ["refs", n] says that the next message is the
references as n bytes of JSON (a DMR++'s: the parent loads them without making a dict of them);
["done", {"refs": ..., "refused": [...]}] or ["error", text] ends a scan. Parent -> worker: a pickled
("scan", format, url, size, job) tuple (`job`: a dict of what the format needs), or None to stop.
"""

from __future__ import annotations

import base64
import gc
import io
import logging
import os
import re
import resource
import threading
import warnings
from collections import OrderedDict

import orjson

PIPE_PROTOCOL = "refmountscan"
BLOCK = 256 << 10  # what one request to the parent asks for
KEEP_BLOCKS = 32  # the worker's own small cache of them (8 MiB)


_pipe_lock = threading.Lock()


class PipeReader(io.RawIOBase):
    """A seekable binary file whose reads ask the parent for aligned blocks."""

    def __init__(self, conn, size: int) -> None:
        super().__init__()
        self._conn = conn
        self._size = size
        self._pos = 0
        self._blocks: OrderedDict[int, bytes] = OrderedDict()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _block(self, index: int) -> bytes:
        block = self._blocks.get(index)
        if block is None:
            start = index * BLOCK
            with _pipe_lock:  # one question, one answer: a parser may read from threads of its own
                try:
                    self._conn.send_bytes(orjson.dumps(["read", start, min(start + BLOCK, self._size)]))
                    block = self._conn.recv_bytes()
                except (EOFError, OSError):
                    # (a parser may turn this into an error of its own: h5py's is an OSError like any other)
                    _current["parent_gone"] = True
                    raise
            self._blocks[index] = block
            if len(self._blocks) > KEEP_BLOCKS:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(index)
        return block

    def read(self, size: int = -1) -> bytes:
        """No more than what is left is ever allocated: kerchunk's GRIB splitter asks for the length a
        message header declares (1.6 GB for a 2.7 kB file of cfgrib's)."""
        left = max(self._size - self._pos, 0)
        buffer = bytearray(left if size is None or size < 0 else min(size, left))
        return bytes(buffer[:self.readinto(buffer)])

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._pos + len(view), self._size)
        done = 0
        while self._pos < end:
            index, within = divmod(self._pos, BLOCK)
            block = self._block(index)
            piece = block[within:within + (end - self._pos)]
            if not piece:
                break  # the object is shorter than its size said: a truncated file reads short
            view[done:done + len(piece)] = piece
            done += len(piece)
            self._pos += len(piece)
        return done


_current: dict = {}  # the open scan's pipe and size, for the fsspec filesystem below


def _register_pipe_filesystem() -> None:
    """kerchunk's netCDF-3, GRIB and TIFF readers open urls with fsspec: they get the pipe this way."""
    import fsspec
    from fsspec.spec import AbstractFileSystem

    class PipeFileSystem(AbstractFileSystem):
        protocol = PIPE_PROTOCOL
        cachable = False

        def _open(self, path, mode="rb", **kwargs):
            reader = PipeReader(_current["conn"], _current["size"])  # (it keeps blocks itself)
            reader.fs = self  # (kerchunk's TIFF reader asks the file for its filesystem's protocol)
            return reader

        def info(self, path, **kwargs):
            return {"name": path, "size": _current["size"], "type": "file"}

    fsspec.register_implementation(PIPE_PROTOCOL, PipeFileSystem, clobber=True)


def to_v0(refs: dict) -> dict:
    """kerchunk's output (Version 1 with templates, or Version 0) as a flat Version-0 dict whose inline
    values are str (binary ones as base64:)."""
    templates = {}
    if refs.get("version") == 1:
        templates = refs.get("templates") or {}
        refs = refs.get("refs") or {}
    out = {}
    for key, value in refs.items():
        if isinstance(value, (bytes, bytearray)):
            try:
                value = bytes(value).decode("ascii")
            except UnicodeDecodeError:
                value = "base64:" + base64.b64encode(value).decode()
        elif isinstance(value, dict):
            value = orjson.dumps(value).decode()
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], str) and "{{" in value[0]:
            url = value[0]
            for name, text in templates.items():
                url = url.replace("{{" + name + "}}", text)
            value = [url, *value[1:]]
        out[key] = value
    return out


def _repoint(refs: dict, pipe_url: str, url: str) -> dict:
    """The pipe's url in kerchunk's output replaced by the file's real one."""
    for key, value in refs.items():
        if isinstance(value, list) and value and value[0] == pipe_url:
            value[0] = url
    return refs


def _scan_hdf5(conn, url: str, size: int, refused: list) -> dict:
    from refmount.refs.scan.hdf5scan import Translator

    fileobj = PipeReader(conn, size)
    translator = Translator(fileobj, url, refused)
    # The garbage collector off while kerchunk walks the file: a collection that zarr's I/O thread runs
    # frees h5py objects, which takes h5py's lock, which kerchunk holds while it waits for that thread:
    # a deadlock (kerchunk's NEONDSTowerTemperatureData.hdf5 hung every scan). Refcounting still frees
    # what is not cyclic; RLIMIT_AS bounds the rest.
    gc.collect()
    gc.disable()
    try:
        return translator.translate()
    finally:
        gc.enable()
        translator.close()


def _scan_netcdf3(url: str, pipe_url: str) -> dict:
    from kerchunk.netCDF3 import NetCDF3ToZarr

    from refmount.refs.scan.netcdf3 import restore_attributes

    translator = NetCDF3ToZarr(pipe_url, inline_threshold=100)
    _check_records(translator)
    refs = translator.translate()
    restore_attributes(translator, refs)  # (kerchunk writes numeric attributes as text)
    return refs


def _check_records(translator) -> None:
    """Refuse a netCDF-3 header whose records start past the file's end, before kerchunk writes a
    reference for each: numrecs 2**31-1 in a 264-byte file kept the scanner busy until its memory cap
    (37 s, or --load-timeout). The references of a file cut short within its records are checked once
    scanned (archive.py `_check_complete`); this bounds only the work."""
    from refmount.errors import RefsError

    records, record_size = translator._recs, translator._recsize
    begin = min((c[0] for c in translator.chunks.get("record_array", [])), default=0)
    if records > 1 and begin + (records - 1) * max(record_size, 1) > _current["size"]:
        raise RefsError(f"it is truncated (its header declares {records:,} records of {record_size:,} bytes from "
                        f"byte {begin:,}, past its {_current['size']:,} bytes)")


# (eccodes key, why): messages whose values eccodes gives in an order kerchunk's codec and coordinates do
# not undo (cfgrib reorders them): every other row reversed, or column by column (pygrib's scanning_mode.grib2)
_GRIB_ORDERS = [("alternativeRowScanning", "every other row stored reversed (alternativeRowScanning)"),
                ("jPointsAreConsecutive", "stored column by column (jPointsAreConsecutive)")]


def _grib_refused(message: bytes) -> str | None:
    """Why a message cannot be referenced as it is stored ("name: why", by the name kerchunk gives its
    variable), or None."""
    import eccodes

    try:
        h = eccodes.codes_new_from_message(message)
    except Exception:
        return None  # (kerchunk's own parse says what is wrong with it)
    try:
        name = eccodes.codes_get(h, "cfVarName")
        if name in ("undef", "unknown"):
            name = eccodes.codes_get(h, "shortName")
        if eccodes.codes_is_defined(h, "Ni") and eccodes.codes_is_missing(h, "Ni"):
            # (kerchunk shapes its values (Nj, Ni) with Ni "missing", 2**31 - 1: a 1 TiB array refused)
            return f"{name}: a GRIB field on a reduced grid (rows of different lengths)"
        if eccodes.codes_get(h, "edition") == 2 and (eccodes.codes_get(h, "offsetSection7") + eccodes.codes_get(h, "section7Length")
                                                    + 4 != len(message)):
            # (NCEP's u and v in one message: sections 4 to 7 again after the first field's)
            return (f"{', '.join(_field_names(message))}: a GRIB2 message of several fields, of which kerchunk's "
                    "codec reads the first")
        for key, why in _GRIB_ORDERS:
            if eccodes.codes_is_defined(h, key) and eccodes.codes_get(h, key):
                return f"{name}: a GRIB field {why}, which kerchunk's codec returns unreordered"
        return None
    finally:
        eccodes.codes_release(h)


def _field_names(message: bytes) -> list[str]:
    """The variable names of every field of a GRIB2 message of several (eccodes' multi-field support
    reads them from a file only)."""
    import tempfile

    import eccodes

    names = []
    with tempfile.TemporaryFile() as f:
        f.write(message)
        f.seek(0)
        eccodes.codes_grib_multi_support_on()
        try:
            while (h := eccodes.codes_grib_new_from_file(f)) is not None:
                try:
                    name = eccodes.codes_get(h, "cfVarName")
                    names.append(eccodes.codes_get(h, "shortName") if name in ("undef", "unknown") else name)
                finally:
                    eccodes.codes_release(h)
        finally:
            eccodes.codes_grib_multi_support_off()
    return names


def grib_length(header: bytes) -> int:
    """A message's total length from its first 16 bytes (indicator section): 3 bytes at 4 in edition 1,
    8 bytes at 8 in edition 2 (kerchunk's splitter read edition 2's everywhere: a GRIB1 file's first
    message ran to the file's end and its other messages were lost), 0 for another edition."""
    edition = header[7] if len(header) > 7 else 0
    if edition == 1:
        return int.from_bytes(header[4:7], "big")
    if edition == 2 and len(header) >= 16:
        return int.from_bytes(header[8:16], "big")
    return 0


def _split_grib(f, skip=0, refused=None, levels=None):
    """kerchunk.grib2._split_file (0.2.10), ending where no message is left: kerchunk's steps back 4 bytes
    whenever 1 KiB holds no "GRIB", and at a file's end that is forever (MARS pads files to a multiple of
    120 bytes: cfgrib's alternate-scanning.grib, 83 zero bytes after its one message, spun a scan worker
    until --load-timeout). Messages kerchunk would shape or order wrongly are left out, said in `refused`."""
    size = f.size if hasattr(f, "size") else f.seek(0, 2)
    f.seek(0)
    part = 0
    while f.tell() < size:
        head = f.read(1024)
        if b"GRIB" not in head:
            if len(head) < 1024:
                break  # (the end, or the file shorter than its size said)
            f.seek(-4, 1)  # ("GRIB" may straddle two reads)
            continue
        ind = head.index(b"GRIB")
        start = f.tell() - len(head) + ind
        if len(head) < ind + 16:  # (the header itself cut by the read: read it whole)
            f.seek(start)
            head, ind = f.read(16), 0
        part_size = grib_length(head[ind:ind + 16])
        f.seek(start)
        message = f.read(part_size) if part_size else b""
        if len(message) != part_size or not message.endswith(b"7777"):
            # (a length that does not end at the end marker: a message cut short, or a GRIB1 message over
            # 8 MiB, whose length ECMWF encodes otherwise; or one past the file's end, whose read stops at
            # the file's last "7777": eccodes failed the whole file on its 1 TB length; the search goes on
            # after its "GRIB")
            if refused is not None:
                refused.append(f"a GRIB message at byte {start} whose length ({part_size}) does not end at its end marker")
            f.seek(start + 4)
            continue
        why = _grib_refused(message)
        if why is not None and refused is not None:
            refused.append(why)
        else:
            if levels is not None:
                levels.append(_level(message))
            yield start, part_size, message
        part += 1
        if skip and part >= skip:
            break


def _level(message: bytes) -> float | None:
    """A message's level as a float (cfgrib's `level:float`), or None."""
    import eccodes

    h = eccodes.codes_new_from_message(message)
    try:
        return eccodes.codes_get_double(h, "level") if eccodes.codes_is_defined(h, "level") else None
    finally:
        eccodes.codes_release(h)


def _field_of(refs: dict) -> str | None:
    """The name of a scanned message's field: its first array not among its coordinates (grib_tree's way)."""
    coordinates = orjson.loads(refs[".zattrs"]).get("coordinates", "").split(" ")
    return next((k.split("/")[0] for k in refs if k.split("/")[0] not in (".zattrs", ".zgroup", *coordinates)), None)


def _levels_as_floats(messages: list[dict], levels: list) -> None:
    """kerchunk's scan stores ecCodes' integer `level` (sigma 0.995 became 1, GFS's soil layers 0.1 and
    0.4 m became 0): each message's level coordinate becomes the float, as cfgrib's."""
    import numpy as np

    if len(messages) != len(levels):
        raise ValueError(f"kerchunk's scan gave {len(messages)} messages for {len(levels)} split")
    for message, level in zip(messages, levels):
        refs = message["refs"]
        name = _field_of(refs)
        tol = orjson.loads(refs.get(f"{name}/.zattrs", "{}")).get("GRIB_typeOfLevel") if name else None
        if level is None or not tol or f"{tol}/0" not in refs or orjson.loads(refs[f"{tol}/.zarray"])["dtype"] != "<f8":
            continue
        if _inline_scalar(refs, tol) != level:
            refs[f"{tol}/0"] = "base64:" + base64.b64encode(np.float64(level).tobytes()).decode()


def _scan_grib(url: str, pipe_url: str, refused: list) -> dict:
    import functools

    import kerchunk.grib2
    from kerchunk.grib2 import grib_tree, scan_grib

    levels = []
    kerchunk.grib2._split_file = functools.partial(_split_grib, refused=refused, levels=levels)  # (this worker's only)
    messages = scan_grib(pipe_url)
    if not messages:
        raise ValueError("; ".join(["no GRIB message kerchunk can reference", *refused]))
    _levels_as_floats(messages, levels)
    _steps_in_hours(messages)
    if len(messages) == 1:
        return messages[0]
    messages = _kept_apart(messages, refused)
    if not messages:
        raise ValueError("; ".join(["no GRIB message kerchunk can reference", *refused]))
    return _zero_chunks_written(grib_tree(messages))


def _kept_apart(messages: list[dict], refused: list) -> list[dict]:
    """The messages grib_tree can put each in its own place. It groups by variable, stepType and
    typeOfLevel and concatenates along time, step and level only: two messages equal in all of these
    (ensemble members, which differ in `number`; a field twice) land on one place and one overwrites
    the other; and it drops a message whose parameter eccodes does not know ("unknown") with no more
    than a warning. Both are said in `refused` (the first: the whole variable, for all its messages)."""
    from collections import defaultdict

    places, paths = defaultdict(list), []
    for n, message in enumerate(messages, 1):
        refs = message["refs"]
        vname = _field_of(refs)
        if vname is None or vname == "unknown":
            refused.append(f"unknown: message {n}, a parameter eccodes does not name (kerchunk's grib_tree leaves it out)")
            paths.append(None)
            continue
        attrs = orjson.loads(refs.get(f"{vname}/.zattrs", "{}"))
        path = (vname, attrs.get("GRIB_stepType"), attrs.get("GRIB_typeOfLevel"))
        level = _inline_scalar(refs, path[2]) if path[2] else None
        place = tuple(_inline_scalar(refs, c) for c in ("time", "step")) + (level,)
        places[path].append((place, _inline_scalar(refs, "number")))
        paths.append(path)
    bad = {None}
    for path, seen in places.items():
        if len({place for place, _ in seen}) < len(seen):
            numbers = {number for _, number in seen}
            why = (f"{len(numbers)} ensemble members" if len(numbers) > 1
                   else "a field twice, or layers of one top level (GFS's sigma layers)")
            refused.append(f"{path[0]}: {len(seen)} GRIB messages of {path[1]} {path[2]} at the same time, step and "
                           f"level ({why}), which kerchunk's grib_tree lays one over another")
            bad.add(path)
    return [message for message, path in zip(messages, paths) if path not in bad]


def _zero_chunks_written(tree: dict) -> dict:
    """grib_tree writes its coordinates through zarr, which leaves out a chunk that equals the default
    fill, 0, while the array's fill_value stays null: a step of 0 (an analysis) or an ensemble number of
    0 had no chunk, and netCDF-C read its own fill (step -9.2e18 hours). Such chunks are written back as
    zeros where the value exists: every chunk of a scalar or of a dimension's own coordinate, and a chunk
    of a coordinate over (time, step, ...) where its group's field has a message. A field's chunk with no
    message (a time and step of the cube no message has) reads NaN, as cfgrib's, not zarr's 0."""
    import math

    import numpy as np

    refs = tree.get("refs", tree)
    metas = {k[:-len("/.zarray")]: orjson.loads(v) for k, v in refs.items() if k.endswith("/.zarray")}
    dims = {name: orjson.loads(refs.get(f"{name}/.zattrs", "{}")).get("_ARRAY_DIMENSIONS", []) for name in metas}
    chunks_of = {}  # array -> its chunk keys' indices (one pass over the keys: trees have thousands)
    for key in refs:
        array, _, chunk = key.rpartition("/")
        if not chunk.startswith("."):
            chunks_of.setdefault(array, []).append(chunk)
    held = {}  # group -> (field's dims, the chunk indices its messages hold)
    for name, meta in metas.items():
        if any(isinstance(f, dict) and f.get("id") == "grib" for f in meta.get("filters") or []):
            if meta.get("fill_value") is None and np.dtype(meta["dtype"]).kind == "f":
                meta["fill_value"] = "NaN"
                refs[f"{name}/.zarray"] = orjson.dumps(meta).decode()
            if name.rpartition("/")[2] not in ("latitude", "longitude"):
                sep = meta.get("dimension_separator") or "."
                held[name.rpartition("/")[0]] = (dims[name], [tuple(c.split(sep)) for c in chunks_of.get(name, [])])
    for name, meta in metas.items():
        if meta.get("fill_value") is not None or meta.get("compressor") or meta.get("filters"):
            continue
        shape, chunks, adims = meta["shape"], meta["chunks"] or [1], dims[name]
        sep = meta.get("dimension_separator") or "."
        grid = [math.ceil(n / c) for n, c in zip(shape, chunks)]
        if math.prod(grid) > 1 << 16 or math.prod(chunks) > 1 << 20:
            continue
        own = not shape or (len(adims) == 1 and adims[0] == name.rpartition("/")[2])
        field_dims, field_chunks = held.get(name.rpartition("/")[0], ([], set()))
        if not own and (list(field_dims[:len(adims)]) != list(adims) or chunks != [1] * len(shape)):
            continue  # (neither: what a missing chunk stands for cannot be told)
        zeros = "base64:" + base64.b64encode(np.zeros(math.prod(chunks), meta["dtype"]).tobytes()).decode()
        with_message = {c[:len(adims)] for c in field_chunks}
        for index in np.ndindex(*grid) if shape else [()]:
            if own or tuple(map(str, index)) in with_message:
                refs.setdefault(f"{name}/{sep.join(map(str, index)) or '0'}", zeros)
    return tree


def _inline_scalar(refs: dict, name: str):
    """The one value of a message's inline scalar coordinate `name`, or None."""
    import numpy as np

    from refmount.refs.scan.gribidx import inline_bytes

    value, meta = refs.get(f"{name}/0"), refs.get(f"{name}/.zarray")
    if not isinstance(value, str) or meta is None:
        return None
    data = np.frombuffer(inline_bytes(value), orjson.loads(meta)["dtype"])
    return data[0].item() if data.size == 1 else None


def _steps_in_hours(messages: list[dict]) -> None:
    """kerchunk's scan_grib stores `step` as eccodes' integer in the message's own step unit and calls
    it hours: HRRR's sub-hourly 15-minute step became 15 hours. Where a message's step disagrees with its
    valid_time - time (cfgrib's step), every message's step becomes that in float hours, as kerchunk's
    own correct_hrrr_subhf_step does (all of them: grib_tree joins the messages' steps)."""
    import numpy as np

    spans = []
    for message in messages:
        refs = message.get("refs", {})
        step, start, end = (_inline_scalar(refs, n) for n in ("step", "time", "valid_time"))
        spans.append(None if None in (step, start, end) else (step, (end - start) / 3600))
    if all(span is None or span[0] == span[1] for span in spans):
        return
    for message, span in zip(messages, spans):
        if span is not None:
            refs = message["refs"]
            refs["step/.zarray"] = orjson.dumps({"chunks": [], "compressor": None, "dtype": "<f8", "fill_value": "NaN",
                                                 "filters": None, "order": "C", "shape": [], "zarr_format": 2}).decode()
            refs["step/0"] = "base64:" + base64.b64encode(np.float64(span[1]).tobytes()).decode()


def _scan_tiff(url: str, pipe_url: str, refused: list) -> dict:
    from refmount.refs.scan.tiff import tiff_refs

    return tiff_refs(pipe_url, _current["size"], refused)


class RefsWriter:
    """The keys a DMR++ conversion makes (`emit`: a dict at a time), written as Version-0 JSON as they
    come, within the limits: the first key over `max_keys`, or the first byte over `max_bytes`,
    refuses the file there, while it is read (`keys_limit` says which option set `max_keys`)."""

    def __init__(self, url: str, max_keys: int | None, keys_limit: str, max_bytes: int) -> None:
        self.url, self.max_keys, self.keys_limit, self.max_bytes = url, max_keys, keys_limit, max_bytes
        self.count = 0
        self.out = bytearray(b"{")
        self.targets: set[str] = set()  # the urls its references name: the daemon checks them (fetch/trust.py)

    def __call__(self, refs: dict) -> None:
        from refmount.errors import RefsError, format_size, quote

        self.count += len(refs)
        if self.max_keys is not None and self.count > self.max_keys:
            raise RefsError(too_many_keys(self.url, self.max_keys, self.keys_limit) + "; refused while it was read")
        self.targets.update(v[0] for v in refs.values() if type(v) is list and v and isinstance(v[0], str))
        piece = orjson.dumps(refs)[1:-1]
        if piece:
            if len(self.out) > 1:
                self.out += b","
            self.out += piece
        if len(self.out) + 1 > self.max_bytes:
            raise RefsError(f"DMR++ file {quote(self.url)}: its references exceed --max-refs-size "
                            f"{format_size(self.max_bytes)}; refused while it was read")

    def text(self) -> bytearray:
        self.out += b"}"
        return self.out


def too_many_keys(url: str, max_keys: int, keys_limit: str) -> str:
    from refmount.errors import quote

    return f"DMR++ file {quote(url)} makes more than {max_keys:,} keys ({keys_limit})"


class _BoundedReader:
    """A DMR++'s (decompressed) text, read no further than `limit` bytes (--max-refs-size)."""

    def __init__(self, stream, url: str, limit: int) -> None:
        self.stream, self.url, self.limit, self.done = stream, url, limit, 0

    def read(self, size: int) -> bytes:
        from refmount.errors import RefsError, format_size, quote

        try:
            data = self.stream.read(size)
        except (OSError, EOFError, ValueError) as e:  # a damaged compressed stream (a pipe gone fails the reply)
            raise RefsError(f"DMR++ file {quote(self.url)} cannot be read: {type(e).__name__}: {e}") from None
        self.done += len(data)
        if self.done > self.limit:
            raise RefsError(f"DMR++ file {quote(self.url)} exceeds --max-refs-size {format_size(self.limit)}"
                            " once decompressed")
        return data


def _ask(conn, question: list):
    with _pipe_lock:
        conn.send_bytes(orjson.dumps(question))
        return orjson.loads(conn.recv_bytes())


def _scan_dmrpp(conn, url: str, size: int, job: dict) -> dict:
    """A DMR++ converted as it is read through the pipe (refs.dmrpp.convert_dmrpp): its references as
    JSON bytes ("refs_json"), never a dict of them, within --max-keys and --max-refs-size."""
    from refmount.refs.dmrpp import convert_dmrpp
    from refmount.refs.source import decompressed

    name = job.get("name") or url  # (what the DMR++ is called and its hrefs resolved against)
    limit_memory(_current["memory"])
    stream = _BoundedReader(decompressed(io.BufferedReader(PipeReader(conn, size), BLOCK), name), name,
                            _current["max_result"])
    writer = RefsWriter(name, job.get("max_keys"), job.get("keys_limit") or "--max-keys", _current["max_result"])
    notes: list[str] = []
    refused = convert_dmrpp(stream, name, job.get("data_url"), emit=writer,
                            exists=lambda candidate: _ask(conn, ["exists", candidate]),
                            on_data_url=lambda data, how: notes.append(f"DMR++ {name}: data file {data} ({how})"))
    return {"refs_json": writer.text(), "refused": refused, "notes": notes, "keys": writer.count,
            "targets": sorted(writer.targets)}


def _scan_hdf4(url: str, pipe_url: str, refused: list) -> dict:
    from refmount.refs.scan.hdf4 import scan_hdf4

    refs, reasons = scan_hdf4(pipe_url)
    refused.extend(reasons)
    return refs


def _scan_fits(conn, url: str, size: int, refused: list) -> dict:
    from refmount.refs.scan.fits import scan_fits

    refs, reasons = scan_fits(PipeReader(conn, size), url)
    refused.extend(reasons)
    return refs


_PARSER_MODULES = {"hdf5": "kerchunk.hdf", "netcdf3": "kerchunk.netCDF3", "grib": "kerchunk.grib2",
                   "tiff": "tifffile", "hdf4": "kerchunk.hdf4", "fits": "refmount.refs.scan.fits"}


def scan_file(conn, fmt: str, url: str, size: int, job: dict | None = None) -> dict:
    """{"refs": v0 dict, "refused": [...]} of one file (a DMR++'s: "refs_json", its JSON bytes)."""
    if fmt == "dmrpp":
        return _scan_dmrpp(conn, url, size, job or {})
    refused: list[str] = []
    name = url.rstrip("/").rsplit("/", 1)[-1] or "file"
    pipe_url = f"{PIPE_PROTOCOL}://scan/{name}"
    _current.update(conn=conn, size=size)
    __import__(_PARSER_MODULES[fmt])  # (GRIB's and TIFF's libraries on first use only: eccodes takes 1 s)
    limit_memory(_current["memory"])  # set after the imports, before a byte of the file is parsed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if fmt == "hdf5":
            refs = _scan_hdf5(conn, url, size, refused)
        elif fmt == "netcdf3":
            refs = _scan_netcdf3(url, pipe_url)
        elif fmt == "grib":
            refs = _scan_grib(url, pipe_url, refused)
        elif fmt == "tiff":
            refs = _scan_tiff(url, pipe_url, refused)
        elif fmt == "hdf4":
            refs = _scan_hdf4(url, pipe_url, refused)
        elif fmt == "fits":
            refs = _scan_fits(conn, url, size, refused)
        else:
            raise ValueError(f"unknown format {fmt!r}")
    return {"refs": _repoint(to_v0(refs), pipe_url, url), "refused": _counted(refused)}


def _counted(refused: list[str]) -> list[str]:
    """The first MAX_REFUSED_LINES reasons, then how many more: each is a log line, and a 335 kB GRIB
    file of 16-byte bogus messages made 20,000 of them (a 100 MB one, 6 million)."""
    from refmount.refs.limits import MAX_REFUSED_LINES

    more = len(refused) - MAX_REFUSED_LINES
    return refused if more <= 0 else [*refused[:MAX_REFUSED_LINES], f"{more:,} more of them, not named one by one"]


_HDF5_OPEN = re.compile(r"Unable to (?:synchronously )?open file \((.*)\)$")
_HDF5_TRUNCATED = re.compile(r"truncated file: eof = (\d+), .*stored_eof = (\d+)")


def _describe(error: BaseException) -> str:
    """A parser's error as one line that says what is wrong with the file where it can tell."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    opening = _HDF5_OPEN.search(text) if isinstance(error, OSError) else None
    if opening:  # h5py's OSError of H5Fopen: the file, not the pipe (that is "parent_gone")
        reason = opening.group(1)
        truncated = _HDF5_TRUNCATED.search(reason)
        if truncated:
            return (f"it is truncated ({int(truncated.group(1)):,} bytes of the {int(truncated.group(2)):,} "
                    "its HDF5 superblock declares)")
        if "file signature not found" in reason:
            return "it is not an HDF5 file (HDF5 finds no signature in it)"
        return f"HDF5 cannot open it: {reason}"
    if "memory allocation failed" in text:  # HDF5's own, under the scanner's address-space cap
        return f"scanning it needs more than the scanner's {_current.get('memory', 0) >> 20} MiB"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def limit_memory(extra: int) -> None:
    """Cap the address space at what the worker has now plus `extra` (a huge header fails with
    MemoryError in the worker; the daemon never grows for it). The soft limit only: raised again for
    the next file once its parser's libraries are imported."""
    try:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = vm + extra if hard == resource.RLIM_INFINITY else min(vm + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def preload() -> None:
    """What every scan needs, imported once (in the fork server, before workers fork off it)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import h5py  # noqa: F401 - before netCDF4 ever could be: both bundle HDF5
    import kerchunk.hdf  # noqa: F401
    import kerchunk.netCDF3  # noqa: F401

    _register_pipe_filesystem()


def worker_main(conn, memory: int, max_result: int) -> None:
    """Scan the files the parent sends, one at a time, until told to stop."""
    logging.disable(logging.CRITICAL)  # kerchunk's and cfgrib's chatter; what matters goes back in messages
    preload()
    # What the imports made is kept for good: each scan's gc.collect() (_scan_hdf5) then walks what the
    # scans made, not the ~60,000 objects of h5py, kerchunk, zarr and numpy (17-44 ms a file, half of a
    # scanner's CPU on 0.3 MB netCDF files: bench/NOTES.md), and writes to none of the pages the fork shares.
    gc.freeze()
    _current["memory"] = memory
    _current["max_result"] = max_result
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        _, fmt, url, size, *extra = job
        _current["parent_gone"] = False
        raw = None
        try:
            scan = scan_file(conn, fmt, url, size, extra[0] if extra else None)
            raw = scan.pop("refs_json", None)
            result = orjson.dumps(["done", scan])
            if len(result) + len(raw or b"") > max_result:
                raw, result = None, orjson.dumps(["error", f"its references would exceed {max_result:,} bytes "
                                                           "(--max-refs-size)"])
        except MemoryError:
            result = orjson.dumps(["error", f"scanning it needs more than the scanner's {memory >> 20} MiB"])
        except BaseException as e:  # noqa: BLE001 - any parser failure is this file's, said in one line
            if _current["parent_gone"]:
                return  # (the pipe failed under the parser: no one to tell)
            from refmount.errors import RefmountError

            result = orjson.dumps(["error", str(e) if isinstance(e, RefmountError) else _describe(e)])
        try:
            if raw is not None:  # (the references apart: the parent reads them as bytes, not as a dict)
                conn.send_bytes(orjson.dumps(["refs", len(raw)]))
                conn.send_bytes(raw)
                raw = None
            conn.send_bytes(result)
        except (OSError, BrokenPipeError):
            return
