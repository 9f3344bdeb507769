"""Load a JSON reference set (Version 0 or 1) into a `RefSetBuilder`, piece by piece."""

from __future__ import annotations

import base64
import binascii
import io
import logging
import os
import stat
from itertools import compress
from operator import itemgetter

import numpy as np
import orjson

from refmount.errors import RefsError, quote
from refmount.refs.jsonstream import PIECE_BYTES, Converted, TrailingComma, iter_pieces, without_trailing_commas
from refmount.refs.limits import RefsTooBig, deadline_held
from refmount.refs.model import INLINE, MAX_LENGTH, WHOLE_FILE, RefSetBuilder
from refmount.refs.rangescan import Ranges, scan_ranges
from refmount.refs.templates import TemplateSet, expand_gen

log = logging.getLogger("refmount")

V1_SECTIONS = ("version", "templates", "gen", "refs")
PARALLEL_AFTER_BYTES = 8 << 20  # smaller refs objects are not worth starting worker processes


class _Restart(Exception):
    """The version became known too late for the streaming pass; parse again knowing it."""

    def __init__(self, version: int):
        self.version = version


def inline_bytes(key: str, value) -> bytes:
    """A string or JSON-object value as the bytes of the file it stands for."""
    if isinstance(value, str):
        if value.startswith("base64:"):
            try:
                return base64.b64decode("".join(value[7:].split()), validate=True)
            except (binascii.Error, ValueError):
                raise RefsError(f"key {quote(key)}: invalid base64 data") from None
        return value.encode("utf-8", "surrogatepass")
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as e:  # nested deeper than orjson writes (255 levels)
        raise RefsError(f"key {quote(key)}: its JSON value cannot be stored: {e}") from None


def _bad_int(value) -> bool:
    return type(value) is not int or not 0 <= value < MAX_LENGTH


def _classify(key: str, value):
    """(url or None, offset, length, inline bytes or None) for one reference value."""
    if isinstance(value, (str, dict)):
        return None, 0, 0, inline_bytes(key, value)
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], str) and value[0]:
            return value[0], 0, WHOLE_FILE, None
        if len(value) == 3:
            url, offset, length = value
            if not isinstance(url, str) or not url:
                raise RefsError(f"key {quote(key)}: reference has no url (a [url, offset, length] needs one)")
            for name, number in (("offset", offset), ("length", length)):
                if _bad_int(number):
                    raise RefsError(
                        f"key {quote(key)}: {name} must be an integer from 0 to 2**53, got {quote(number, 40)}")
            return url, offset, length, None
        raise RefsError(f"key {quote(key)}: a reference list must be [url] or [url, offset, length]")
    raise RefsError(f"key {quote(key)}: value must be a string, an object or a list, not {type(value).__name__}")


def add_mapping(builder: RefSetBuilder, mapping: dict) -> None:
    """Add one piece of a refs object. [url, offset, length] values take a vectorised path; the
    rest (inline data, whole files, anything odd) a per-value one."""
    keys = list(mapping)
    values = list(mapping.values())
    if set(map(type, values)) == {list} and set(map(len, values)) == {3}:
        if _add_ranges_fast(builder, keys, values):
            return
    else:
        ranges = [type(v) is list and len(v) == 3 for v in values]
        if sum(ranges) > 64:
            range_keys = list(compress(keys, ranges))
            if _add_ranges_fast(builder, range_keys, list(compress(values, ranges))):
                others = [not r for r in ranges]
                keys, values = list(compress(keys, others)), list(compress(values, others))
    url_ids, offsets, lengths, inline = [], [], [], {}
    for pos, (key, value) in enumerate(zip(keys, values)):
        url, offset, length, data = _classify(key, value)
        if data is not None:
            inline[pos] = data
            url_ids.append(INLINE)
            offsets.append(0)
            lengths.append(len(data))
        else:
            url_ids.append(builder.url_id(url))
            offsets.append(offset)
            lengths.append(length)
    builder.add_batch(keys, url_ids, offsets, lengths, inline)


def _add_ranges_fast(builder: RefSetBuilder, keys: list[str], values: list) -> bool:
    """Add [url, offset, length] values at C speed; False (nothing added) if any needs a closer look."""
    urls, offsets, lengths = (list(map(itemgetter(i), values)) for i in range(3))
    if set(map(type, urls)) != {str} or set(map(type, offsets)) != {int} or set(map(type, lengths)) != {int}:
        return False
    try:
        offsets = np.fromiter(offsets, dtype=np.int64, count=len(offsets))
        lengths = np.fromiter(lengths, dtype=np.int64, count=len(lengths))
    except OverflowError:
        return False
    if offsets.min() < 0 or lengths.min() < 0 or offsets.max() >= MAX_LENGTH or lengths.max() >= MAX_LENGTH:
        return False
    if "" in urls:
        return False
    builder.add_batch(keys, builder.url_ids(urls), offsets, lengths)
    return True


def convert_piece(text: bytes, max_bytes: int | None = None) -> tuple[str, object]:
    """Worker-process side of parallel loading: parse one piece of a refs object and convert it.
    ("ok", builder export) | ("bad", reason) for a piece that is not a run of whole members |
    ("error", one-line message) for members that are malformed. `max_bytes`: --max-refs-size."""
    builder = RefSetBuilder(None, max_bytes)
    ranges = scan_ranges(text)  # most pieces of a big set: no Python object per reference
    try:
        if ranges is not None:
            add_ranges(builder, ranges)
            return "ok", builder.export()
        try:
            mapping = orjson.loads(b"{" + text + b"}")
        except orjson.JSONDecodeError as e:
            return "bad", str(e)
        add_mapping(builder, mapping)
    except RefsError as e:
        return "error", str(e)
    return "ok", builder.export()


def add_ranges(builder: RefSetBuilder, ranges: Ranges) -> None:
    url_ids = builder.url_ids(ranges.urls)[ranges.url_index]
    builder.add_encoded(ranges.keys[:-1], ranges.count, url_ids, ranges.offsets, ranges.lengths)


def convert_file_range(path: str, start: int, end: int, max_bytes: int | None = None) -> tuple[str, object]:
    """`convert_piece` of bytes [start, end) of a plain local file, read by the worker itself."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        text = os.pread(fd, end - start, start)
    finally:
        os.close(fd)
    if len(text) != end - start:
        return "bad", "the file changed while loading"
    return convert_piece(text, max_bytes)


class Workers:
    """Forked processes that convert refs pieces in parallel, started only once an object has
    proved big (`after_bytes` parsed serially) on a machine with spare cores."""

    piece_bytes = 1 << 20  # small pieces keep each worker's transient Python objects small

    def __init__(self, stream, max_bytes: int | None = None) -> None:
        self._pool = None
        self._max_bytes = max_bytes
        self.depth = 0
        size = _regular_file_size(stream)
        # a big local file goes parallel at once; otherwise only after the object proves big
        self.after_bytes = 0 if (size or 0) >= 4 * PARALLEL_AFTER_BYTES else PARALLEL_AFTER_BYTES
        # A regular local file (stream positions are file offsets): workers read their pieces
        # themselves rather than receive them through a pipe.
        raw = getattr(stream, "raw", None)
        plain = size is not None and isinstance(raw, io.FileIO) and isinstance(stream.name, str)
        self._path = os.path.abspath(stream.name) if plain else None

    @property
    def reads_itself(self) -> bool:
        """Whether workers read their pieces from the file (else they are sent the bytes)."""
        return self._path is not None

    def pool(self) -> "Workers | None":
        import multiprocessing

        cores = len(os.sched_getaffinity(0))
        if cores < 2:
            return None
        processes = min(cores, 4)
        with deadline_held():
            self._pool = multiprocessing.get_context("fork").Pool(processes)
        self.depth = processes * 4  # pieces in flight
        return self

    def submit(self, window, start: int, end: int):
        """Convert bytes [start, end) of the stream that `window` reads."""
        if self._path is not None:
            return self._pool.apply_async(convert_file_range, (self._path, start, end, self._max_bytes))
        return self._pool.apply_async(convert_piece, (window.get(start, end), self._max_bytes))

    def close(self) -> None:
        if self._pool is not None:
            with deadline_held():
                self._pool.terminate()
                self._pool.join()


def _regular_file_size(stream) -> int | None:
    """The size of the regular file under `stream`; None in memory, for remote streams and for
    pipes such as bash's <(...), which cannot be read at an offset."""
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _version_of(value) -> int:
    if type(value) is int and value == 1:
        return 1
    raise RefsError(f"unsupported reference set 'version' {quote(value, 40)}: expected 1 (or no 'version' for v0)")


def load_json(open_stream, builder: RefSetBuilder, *, piece_bytes: int = PIECE_BYTES, progress=None,
              parallel: bool = True, max_value: int | None = None) -> int:
    """Fill `builder` from the JSON text that `open_stream()` yields; returns the spec version.
    `max_value`: --max-value-size, the most text one member may have.

    A comma before a closing '}' or ']' is not JSON, but GDAL reads such sets (its own kerchunk test
    set has one), and a reader of the set cannot tell what else it could mean: the text is read
    again without those commas (once, in memory, within --max-refs-size), with a warning."""
    try:
        return _load_versions(open_stream, builder, piece_bytes, progress, parallel, max_value)
    except TrailingComma as e:
        first_error = e
    with open_stream() as stream:
        text = stream.read() if builder.max_bytes is None else stream.read(builder.max_bytes + 1)
    if builder.max_bytes is not None and len(text) > builder.max_bytes:
        raise RefsTooBig(builder.max_bytes)
    text, commas = without_trailing_commas(text)
    if not commas:  # a pipe (stdin) cannot be read twice
        raise RefsError(f"{first_error} (accepted as GDAL accepts it only from a file, which can be read twice, "
                        "not from a pipe)") from None
    log.warning("the reference file is not valid JSON: %d trailing comma%s (before a closing '}' or ']') "
                "accepted, as GDAL accepts them", commas, "" if commas == 1 else "s")
    builder.__init__(builder.max_keys, builder.max_bytes)
    return _load_versions(lambda: io.BytesIO(text), builder, piece_bytes, progress, parallel, max_value)


def _load_versions(open_stream, builder, piece_bytes, progress, parallel, max_value) -> int:
    try:
        return _load(open_stream, builder, None, piece_bytes, progress, parallel, max_value)
    except _Restart as restart:
        builder.__init__(builder.max_keys, builder.max_bytes)
        return _load(open_stream, builder, restart.version, piece_bytes, progress, parallel, max_value)


def _load(open_stream, builder, version, piece_bytes, progress, parallel, max_value=None) -> int:
    sections: dict = {}
    skipped_refs = False
    tentative_v0 = 0  # top-level members added as v0 refs before the version was known
    deferred_error = None
    with open_stream() as stream:
        workers = Workers(stream, builder.max_bytes) if parallel else None
        try:
            pieces = iter_pieces(stream, piece_bytes, progress, descend=version != 0, workers=workers,
                                 max_bytes=builder.max_bytes, max_value=max_value)
            for section, piece in pieces:
                if section == "refs":
                    if version is None:
                        # whether "refs" holds references (v1) or is an ordinary key (v0) is only
                        # known once "version" shows up later; skip it now and parse again then
                        skipped_refs = True
                    elif isinstance(piece, Converted):
                        builder.merge(piece.state)
                    else:
                        add_mapping(builder, piece)
                    continue
                if version is None and "version" in piece:
                    version = _version_of(piece["version"])
                    if (tentative_v0 or deferred_error) and not skipped_refs:
                        raise _Restart(version)
                if version == 1:
                    sections.update((k, v) for k, v in piece.items() if k in V1_SECTIONS)
                    continue
                if version is None:  # v0 so far; v1's section names wait until the version is known
                    held = {k: piece.pop(k) for k in V1_SECTIONS if k in piece}
                    sections.update(held)
                    tentative_v0 += len(piece)
                    try:
                        add_mapping(builder, piece)
                    except RefsError as e:  # only an error if this does turn out to be v0
                        deferred_error = deferred_error or e
                    continue
                add_mapping(builder, piece)
        finally:
            if workers is not None:
                workers.close()
    if skipped_refs:
        raise _Restart(version or 0)
    if version is None:
        version = 0
        if deferred_error:
            raise deferred_error
        held = {k: v for k, v in sections.items() if k != "version"}
        if held:
            add_mapping(builder, held)
    if version == 1:
        refs = sections.get("refs")
        if refs is not None:
            if not isinstance(refs, dict):
                raise RefsError("'refs' must be a JSON object")
            add_mapping(builder, refs)
        templates = TemplateSet(sections.get("templates"))
        _render_urls(builder, templates)
        if sections.get("gen") is not None:
            expand_gen(sections["gen"], templates, builder)
    return version


def _render_urls(builder: RefSetBuilder, templates: TemplateSet) -> None:
    """Render templated urls of v1 refs: once per distinct url, not once per key."""
    from refmount.refs.templates import Template

    if not any("{{" in url for url in builder.urls):
        return
    rendered = [
        Template(url, f"url {quote(url)}", templates).render() if "{{" in url else url for url in builder.urls
    ]
    builder.remap_urls(rendered)
