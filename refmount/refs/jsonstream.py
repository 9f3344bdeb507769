"""Parse a huge JSON object in pieces, so a 1 GB reference file never becomes 1 GB of Python objects.

orjson parses a whole document only. We cut the text of an object into pieces of a few MB at a
candidate boundary (a comma followed by a quote) and let orjson parse ``{`` + piece + ``}``. A cut
in the wrong place (inside a string or a nested value) cannot parse, because each piece starts at a
true entry boundary and orjson's state at the cut is then the real one; on failure we cut further
on. When the object ends inside a piece, orjson reports "unexpected content after document" at
the position just past it, which tells us exactly where the object closed.

`iter_pieces` walks the top-level object and descends into a top-level ``"refs"`` object, yielding
``(section, dict)`` with section ``"top"`` or ``"refs"``.
"""

from __future__ import annotations

import re

import orjson

from refmount.errors import RefsError, quote
from refmount.refs.limits import RefsTooBig, ValueTooBig

PIECE_BYTES = 4 << 20
READ_BYTES = 1 << 20  # small reads: growing the window by big chunks costs fresh pages every time
SKIM_BYTES = 16 << 10  # enough to find the next cut
_WS = re.compile(rb"[ \t\r\n]*")
_CANDIDATE = re.compile(rb',[ \t\r\n]*"')
_REFS_KEY = re.compile(rb'"refs"[ \t\r\n]*:[ \t\r\n]*\{')


class _Window:
    """A sliding window over a byte stream, addressed by absolute positions.

    Over a plain file (`seekable`: stream positions are file offsets) the window can jump: while
    worker processes read their own pieces, the parent only looks at the bytes around each cut."""

    def __init__(self, stream, read_bytes: int = READ_BYTES, seekable: bool = False,
                 max_bytes: int | None = None, max_value: int | None = None) -> None:
        self._stream = stream
        self._max_bytes = max_bytes
        # --max-value-size: the most text one member may have. The window holds the piece being
        # parsed, and one member can make it grow (a string with no place to cut; a value a cut
        # fell into, doubling the piece each time): `search` and `member_boundary` stop that at
        # the first member found bigger than this.
        self.max_value = max_value
        self._read_bytes = read_bytes
        self._seekable = seekable
        self._step = read_bytes
        self.data = bytearray()  # appends and front trims without copying the whole window
        self.base = 0
        self.eof = False
        self.consumed = 0  # how far into the stream we have got, for progress reports

    @property
    def end(self) -> int:
        return self.base + len(self.data)

    def _read_more(self) -> bool:
        if self.eof:
            return False
        chunk = self._stream.read(self._step)
        if not chunk:
            self.eof = True
            return False
        self.data += chunk
        self.consumed = max(self.consumed, self.end)
        if self._max_bytes is not None and self.consumed > self._max_bytes:
            raise RefsTooBig(self._max_bytes)
        return True

    def skim_to(self, pos: int) -> None:
        """Start the window at `pos` without reading what lies before it, and read in small steps
        from there: only the bytes around a cut are wanted (a seekable file only; else a no-op)."""
        if self._seekable and not self.base <= pos <= self.end:
            self._restart_at(pos)
        self._step = SKIM_BYTES if self._seekable else self._read_bytes

    def resume_at(self, pos: int) -> None:
        """Read in full steps again from `pos` on, going back to it if skimming passed it."""
        if self._seekable and pos < self.base:
            self._restart_at(pos)
        self._step = self._read_bytes

    def _restart_at(self, pos: int) -> None:
        self._stream.seek(pos)
        self.data = bytearray()
        self.base = pos
        self.eof = False

    def need(self, pos: int) -> bool:
        """Make sure bytes up to `pos` (exclusive) are loaded; False if the stream ends first."""
        while self.end < pos:
            if not self._read_more():
                return False
        return True

    def forget_before(self, pos: int) -> None:
        cut = pos - self.base
        if cut > self._read_bytes:
            del self.data[:cut]
            self.base = pos

    def get(self, a: int, b: int) -> bytes:
        with memoryview(self.data) as view:  # one copy, not slice-then-bytes
            return bytes(view[a - self.base : b - self.base])

    def char(self, pos: int) -> bytes:
        self.need(pos + 1)
        return bytes(self.data[pos - self.base : pos - self.base + 1])

    def skip_ws(self, pos: int) -> int:
        while True:
            m = _WS.match(self.data, pos - self.base)
            if m.end() < len(self.data) or not self._read_more():
                return self.base + m.end()
            pos = self.base + m.end()  # go on from there: a gigabyte of spaces is read once

    def search(self, pattern: re.Pattern, pos: int) -> int | None:
        """Absolute start of the first match at or after `pos`, loading data as needed. (Every
        member ends where a candidate cut begins: more than --max-value-size bytes without one is a
        member bigger than that, and ValueTooBig.)"""
        began = pos
        while True:
            self.need(pos)
            m = pattern.search(self.data, max(pos - self.base, 0))
            # a match ending at the buffer's end might be cut short: only trust it with more data
            if m and (m.end() < len(self.data) or self.eof):
                if self.max_value is not None and self.base + m.start() - began > self.max_value:
                    raise self.too_big(self._member_before(began))
                return self.base + m.start()
            # search again only where a match could still start: at this match, or at the last
            # ',' (each pattern starts with one), so that a gigabyte-long string is scanned once
            if m:
                pos = self.base + m.start()
            else:
                last = self.data.rfind(b",", max(pos - self.base, 0))
                pos = self.base + (last if last >= 0 else len(self.data))
            if self.max_value is not None and pos - began > self.max_value:
                raise self.too_big(self._member_before(began))
            if not self._read_more():
                return None

    def _member_before(self, pos: int) -> int:
        """Where the member holding `pos` starts, as far as the window tells (the last candidate cut
        before it, else the window's start)."""
        last = None
        for last in _CANDIDATE.finditer(self.data, 0, max(pos - self.base, 0)):
            pass
        return self.base + (last.start() + 1 if last is not None else 0)

    def too_big(self, member: int) -> ValueTooBig:
        """ValueTooBig for the member starting at `member`, naming its key if it has a plain one."""
        at = _WS.match(self.data, max(member - self.base, 0)).end()
        key = None
        if self.data[at:at + 1] == b'"':
            end = _string_end(self.data, at + 1, 258)
            if end > 0:
                try:
                    key = orjson.loads(bytes(self.data[at:end]))
                except orjson.JSONDecodeError:
                    key = None
        return ValueTooBig(self.max_value, self.base + at, key if isinstance(key, str) else None)

    def member_boundary(self, s: int) -> int | None:
        """A cut that cannot fall inside a value: the comma after the last member starting at or after
        `s` that ends in the window (members skipped token by token, reading more as needed), or the
        object's closing brace; ValueTooBig for a member bigger than --max-value-size; None when the
        text is not well formed there (the parser then reports it)."""
        pos, boundary, scan = s, None, None
        while True:
            member = self.skip_ws(pos)
            scan = scan or _MemberScan(member - self.base)
            end = scan.end(self.data)
            if end == -2:
                return boundary
            if end == -1:  # runs past the window
                if self.end - member > self.max_value:
                    raise self.too_big(member)
                if boundary is not None:
                    return boundary
                if not self._read_more():
                    return None
                continue
            if self.base + end - member > self.max_value:
                raise self.too_big(member)
            scan = None
            after = self.skip_ws(self.base + end)
            c = self.char(after)
            if c == b"}":
                return after
            if c != b",":
                return boundary
            boundary, pos = after, after + 1


def _string_end(data, pos: int, within: int | None = None) -> int:
    """Just past the closing quote of the JSON string whose text starts at `pos` (after its opening
    quote), or -1 if it does not end in `data` (within `within` bytes). A scan, not a regex: Python's
    regex engine needs memory per character repeated in a group."""
    limit = len(data) if within is None else min(len(data), pos + within)
    while True:
        quote_at = data.find(b'"', pos, limit)
        if quote_at < 0:
            return -1
        backslashes = 0
        while quote_at - backslashes - 1 >= pos and data[quote_at - backslashes - 1] == 0x5C:
            backslashes += 1
        if backslashes % 2 == 0:
            return quote_at + 1
        pos = quote_at + 1


_KEY_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")
_STRUCTURE = re.compile(rb'["\[\]{}]')
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # (unrolled: no regex memory per character)
_SCALAR = re.compile(rb"[^,\]}\s]*")


class _MemberScan:
    """Where a member ("key": value) that starts at `start` in a window's data ends, found token by
    token (strings skipped whole, brackets counted), resumed where it stopped as the data grows."""

    def __init__(self, start: int) -> None:
        self.j = start
        self.depth = 0
        self.stage = "key"

    def end(self, data) -> int:
        """Just past the member; -1 if it runs past the data (call again with more), -2 if the text
        is not a well-formed member."""
        j = self.j
        if self.stage == "key":
            m = _STRING.match(data, j) if data[j:j + 1] == b'"' else None
            if m is None:
                return -1 if data[j:j + 1] == b'"' else -2
            j = _KEY_COLON.match(data, m.end()).end()
            if j >= len(data):
                return -1
            self.j, self.stage = j, "value"
        if self.stage == "value":
            c = data[j:j + 1]
            if c == b'"':
                m = _STRING.match(data, j)
                return m.end() if m is not None else -1
            if c not in (b"[", b"{"):
                k = _SCALAR.match(data, j).end()
                return k if k < len(data) else -1
            self.stage = "nested"
        while True:
            m = _STRUCTURE.search(data, j)
            if m is None:
                self.j = len(data)
                return -1
            k = m.start()
            if data[k] == 0x22:  # a string: skipped whole (brackets inside it are text)
                string = _STRING.match(data, k)
                if string is None:
                    self.j = k
                    return -1
                j = string.end()
                continue
            self.depth += 1 if data[k] in (0x5B, 0x7B) else -1
            j = k + 1
            if self.depth == 0:
                return j


def _byte_pos(text: bytes, char_pos: int) -> int:
    """orjson reports positions in characters; turn one into a byte offset into `text`."""
    return len(text.decode("utf-8", "surrogateescape")[:char_pos].encode("utf-8", "surrogateescape"))


class TrailingComma(RefsError):
    """The text has a comma just before a closing '}' or ']': not JSON, but GDAL (json-c, and its
    own streaming parser) reads it, and GDAL's own kerchunk test set has one."""


def _malformed(window: _Window, pos: int, detail: str = "") -> RefsError:
    where = f" near byte {pos}"
    if window.eof and pos >= window.end - 1:
        return RefsError(f"reference file is not valid JSON: it ends early (truncated?){where}")
    kind = TrailingComma if "trailing comma" in detail else RefsError
    return kind(f"reference file is not valid JSON{where}{': ' + detail if detail else ''}")


_STRING_OR_TRAILING_COMMA = re.compile(rb'"(?:[^"\\]|\\.)*"|(,)[ \t\r\n]*[}\]]')


def without_trailing_commas(text: bytes) -> tuple[bytes, int]:
    """`text` less every comma that stands just before a closing '}' or ']' outside strings, and
    how many there were."""
    commas = [m.start(1) for m in _STRING_OR_TRAILING_COMMA.finditer(text) if m.start(1) >= 0]
    if not commas:
        return text, 0
    parts = []
    last = 0
    for at in commas:
        parts.append(text[last:at])
        last = at + 1
    parts.append(text[last:])
    return b"".join(parts), len(commas)


_MEMBER_KEY = re.compile(rb'[ \t\r\n]*("(?:[^"\\]|\\.)*")')
_MAX_TRIES = 64


def _too_deep(text: bytes, start: int) -> RefsError:
    """orjson's depth limit (1024) was hit in `text`, a run of members starting at absolute position
    `start`: name the member, found as the last candidate cut before which the text parses."""
    key_at = 0
    limit = len(text)
    for _ in range(_MAX_TRIES):
        cut = text.rfind(b",", 0, limit)
        if cut <= 0:
            break
        try:
            orjson.loads(b"{" + text[:cut] + b"}")
        except orjson.JSONDecodeError:
            limit = cut
            continue
        key_at = cut + 1
        break
    m = _MEMBER_KEY.match(text, key_at)
    try:
        key = orjson.loads(m.group(1)) if m else None
    except orjson.JSONDecodeError:
        key = None
    where = f"key {quote(key)}" if isinstance(key, str) else f"a member near byte {start}"
    return RefsError(f"reference file nests JSON deeper than 1024 levels in {where}")


class Converted:
    """A piece parsed and converted by a worker process: the export of a RefSetBuilder."""

    __slots__ = ("state",)

    def __init__(self, state) -> None:
        self.state = state


def _speculate(window: _Window, s: int, piece_bytes: int, workers):
    """Parse and convert pieces in worker processes, cutting ahead at candidate boundaries.

    A worker's piece is only trusted once every piece before it parsed, so a wrong cut (or the
    object's end) makes us drop the speculation and go on serially from that piece's start.
    Yields `Converted` items; returns the position where serial parsing must continue."""
    ahead = []
    start = s
    while True:
        while len(ahead) < workers.depth:
            if workers.reads_itself:  # the worker reads the piece: skip to where the next cut may be
                window.skim_to(start + workers.piece_bytes)
            cut = window.search(_CANDIDATE, start + workers.piece_bytes)
            if cut is None:
                break
            ahead.append((start, cut, workers.submit(window, start, cut)))
            start = window.skip_ws(cut + 1)
        if not ahead:
            return start
        first, cut, result = ahead.pop(0)
        status, payload = result.get()
        if status == "ok":
            yield Converted(payload)
            window.forget_before(ahead[0][0] if ahead else start)
            continue
        if status == "error":
            raise RefsError(payload)
        return first  # a wrong cut or the end of the object: the serial parser takes over here


def iter_object(window: _Window, pos: int, piece_bytes: int, on_piece=None, workers=None):
    """Yield dicts covering the members of the object whose ``{`` is just before `pos`.

    Returns (as the generator's value) the position just after the object's closing ``}``.
    `on_piece(start, stop)` may intercept a member range before it is parsed (used for descending).
    With `workers`, whole pieces may come back already converted (`Converted`) from other processes.
    """
    s = window.skip_ws(pos)
    if window.char(s) == b"}":
        return s + 1
    first = s
    step = piece_bytes
    while True:
        if workers is not None and s - first >= workers.after_bytes:
            # a big object: go parallel (once; after a fallback the rest stays serial)
            pool, workers = workers.pool(), None
            if pool is not None:
                s = yield from _speculate(window, s, piece_bytes, pool)
                window.resume_at(s)  # where the speculation stopped, maybe behind what was skimmed
                if window.char(s) == b"}":
                    return s + 1
        cut = window.search(_CANDIDATE, s + step)
        stop = cut if cut is not None else window.end
        window.need(stop)
        if on_piece is not None:
            intercepted = yield from on_piece(s, stop)
            if intercepted is not None:  # the hook consumed members up to a new start
                s, step = intercepted, piece_bytes
                if window.char(s) == b"}":
                    return s + 1
                continue
        if not window.char(s):
            raise _malformed(window, s)
        # With no cut left, the object's own "}" must be in the data (else the text is truncated).
        text = b"{" + window.get(s, stop) + (b"}" if cut is not None else b"")
        try:
            piece = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            if str(e).startswith("unexpected content after document"):
                # The object closed inside this piece: e.pos is just past it (after whitespace).
                text = b"{" + window.get(s, stop)
                # text[0] is our added "{", so text index j is absolute position s + j - 1
                end = _byte_pos(text, e.pos)
                close = s + len(text[:end].rstrip(b" \t\r\n")) - 2  # absolute position of "}"
                try:
                    yield orjson.loads(b"{" + window.get(s, close) + b"}")
                except orjson.JSONDecodeError as e2:
                    raise _malformed(window, s + e2.pos, str(e2)) from None  # pragma: no cover
                window.forget_before(close)
                return close + 1
            if e.msg.startswith("depth limit"):  # more data cannot help; say which member
                raise _too_deep(window.get(s, stop), s) from None
            if cut is None:  # no further place to cut: the text itself is broken
                raise _malformed(window, s + max(e.pos - 1, 0), str(e).split(":")[0]) from None
            if window.max_value is not None and (stop - s) * 2 > window.max_value + 2 * piece_bytes:
                # doubling again could hold more than the biggest value allowed: find a true boundary
                boundary = window.member_boundary(s)
                if boundary is not None and boundary > s:
                    step = boundary - s
                    continue
            step = (stop - s) * 2  # cut fell inside a value: try a cut twice as far on
            continue
        if cut is None:  # the object closed exactly at the end of the data
            yield piece
            return stop
        yield piece
        s = window.skip_ws(stop + 1)
        step = piece_bytes
        window.forget_before(s)


def iter_pieces(stream, piece_bytes: int = PIECE_BYTES, progress=None, descend: bool = True, workers=None,
                max_bytes: int | None = None, max_value: int | None = None):
    """Yield ("top", dict) for top-level members and ("refs", dict) for members of a top-level
    "refs" object, without holding the whole text or its Python form in memory. More than
    `max_bytes` of text (whitespace too) raises RefsTooBig as soon as it has been read; one member
    of more than `max_value` bytes raises ValueTooBig, the window then holding at most about twice
    that."""
    window = _Window(stream, read_bytes=max(READ_BYTES, piece_bytes),
                     seekable=workers is not None and workers.reads_itself, max_bytes=max_bytes,
                     max_value=max_value)
    start = window.skip_ws(0)
    first = window.char(start)
    if first != b"{":
        if not first:
            raise RefsError("reference file is empty")
        raise RefsError("reference file is not a JSON object (it should start with '{')")

    def descend_capture(s: int, stop: int):
        """If a top-level "refs": { starts in [s, stop), stream its members as ("refs", dict) and
        return where the top level goes on; else None."""
        m = _REFS_KEY.search(window.data, s - window.base, stop - window.base)
        if m is None:
            return None
        key_at = window.base + m.start()
        if key_at != s:
            before = window.get(s, key_at).rstrip(b" \t\r\n")
            if not before.endswith(b","):
                return None
            try:  # parses only if the comma is a true top-level boundary
                prefix = orjson.loads(b"{" + before[:-1] + b"}")
            except orjson.JSONDecodeError:
                return None
            yield ("top", prefix)
        yield ("refs", {})  # even an empty "refs" object is seen (v0 without "version" must keep it as a key)
        end = yield from _tagged(iter_object(window, window.base + m.end(), piece_bytes, workers=workers), "refs",
                                 window, progress)
        nxt = window.skip_ws(end)
        c = window.char(nxt)
        if c == b",":
            after = window.skip_ws(nxt + 1)
            if window.char(after) == b"}":
                raise _malformed(window, nxt, "trailing comma is not allowed")
            return after
        if c == b"}":
            return nxt
        raise _malformed(window, nxt, "expected ',' or '}' after \"refs\"")

    end = yield from _tagged(iter_object(window, start + 1, piece_bytes, descend_capture if descend else None), "top", window, progress)
    rest = window.skip_ws(end)
    if window.char(rest):
        raise _malformed(window, rest, "unexpected content after the top-level object")


def _tagged(gen, tag, window, progress):
    """Re-yield a piece generator's dicts as (tag, dict), passing through already-tagged tuples,
    and return the generator's return value."""
    try:
        item = next(gen)
        while True:
            if isinstance(item, tuple):
                yield item
            else:
                yield (tag, item)
                if progress:
                    progress(window.consumed)
            item = next(gen)
    except StopIteration as stop:
        return stop.value
