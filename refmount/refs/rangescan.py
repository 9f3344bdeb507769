"""Read a piece of a refs object made only of ``"key": ["url", offset, length]`` members with numpy,
without building a Python object per reference.

kerchunk writes most of a big reference set this way, in one uniform layout. A piece in that layout
is checked completely (every byte outside the strings, every number) and scanned in a few array
passes; anything else (inline data, other escapes, odd spacing, floats, ...) returns None and goes
through orjson, which also gives the error messages. So this scanner never has to be right about
text it has not fully checked.
"""

from __future__ import annotations

import re

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from refmount.refs.model import MAX_LENGTH

_QUOTE, _BACKSLASH, _SLASH = 0x22, 0x5C, 0x2F
_WS = np.zeros(256, bool)
_WS[list(b" \t\r\n")] = True
_DIGITS_ONLY = bytes(c if 0x30 <= c <= 0x39 else 0x20 for c in range(256))  # the rest become spaces
_KEY_TO_URL = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*\[[ \t\r\n]*")
_COMMA = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
_CLOSE = re.compile(rb"[ \t\r\n]*\][ \t\r\n]*,[ \t\r\n]*")
_CLOSE_LAST = re.compile(rb"[ \t\r\n]*\][ \t\r\n]*")
_MAX_DIGITS = 16  # 2**53 has 16 digits


class Ranges:
    """The references of one piece: keys NUL-terminated in one blob, and numpy columns."""

    __slots__ = ("keys", "count", "urls", "url_index", "offsets", "lengths")

    def __init__(self, keys: bytes, count: int, urls: list[str], url_index, offsets, lengths) -> None:
        self.keys = keys  # UTF-8, each key followed by a NUL
        self.count = count
        self.urls = urls  # distinct urls of the piece
        self.url_index = url_index  # per key, an index into `urls`
        self.offsets = offsets
        self.lengths = lengths


def scan_ranges(text: bytes) -> Ranges | None:
    """The members in `text` (a run of whole members of a refs object, without the braces) if
    every one is ``"key": ["url", offset, length]`` in one layout; else None."""
    raw = np.frombuffer(text, np.uint8)
    if len(raw) == 0:
        return None
    escapes = raw == _BACKSLASH
    # "\/" (kerchunk escapes every "/") is the only escape taken; then no quote is escaped either
    if escapes[-1] or (escapes[:-1] & (raw[1:] != _SLASH)).any():
        return None
    quotes = np.flatnonzero(raw == _QUOTE)
    n = len(quotes) // 4
    if n == 0 or len(quotes) != 4 * n:
        return None
    key_open, key_close, url_open, url_close = quotes.reshape(n, 4).T
    if _has_control_bytes(raw, quotes) or not _WS[raw[: key_open[0]]].all():
        return None
    if not _same_gaps(raw, key_close, url_open) or not _KEY_TO_URL.fullmatch(text, key_close[0] + 1, url_open[0]):
        return None
    if (url_close - url_open).min() < 2:
        return None  # an empty url: orjson's path names the key
    numbers = _numbers(raw, url_close, np.append(key_open[1:], len(raw)), n)
    if numbers is None:
        return None
    keys = _strings(raw, key_open, key_close)
    urls = _distinct_strings(raw, url_open, url_close)
    if keys is None or urls is None:
        return None
    return Ranges(keys, n, urls[0], urls[1], numbers[0::2], numbers[1::2])


def _has_control_bytes(raw: np.ndarray, quotes: np.ndarray) -> bool:
    """A byte below 0x20 that JSON forbids: anywhere but whitespace, and inside a string always."""
    found = np.flatnonzero(raw < 0x20)
    if len(found) == 0:
        return False
    if not _WS[raw[found]].all():
        return True
    return bool((np.searchsorted(quotes, found) % 2).any())  # odd: after an opening quote


def _rows(data: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """data[starts[i] : starts[i] + width] for every i, as an (n, width) array (rows copied whole)."""
    return sliding_window_view(data, width)[starts]


def _all_read(data: np.ndarray, starts: np.ndarray, text: bytes) -> bool:
    """Whether `text` is at every position in `starts` (short texts: one pass per byte)."""
    return all((data[starts + j] == byte).all() for j, byte in enumerate(text))


def _same_gaps(raw: np.ndarray, ends: np.ndarray, starts: np.ndarray) -> bool:
    """Whether the bytes between each ends[i] and starts[i] (exclusive) are the same for every i."""
    width = starts - ends
    return bool((width == width[0]).all()) and _all_read(raw, ends + 1, raw[ends[0] + 1 : starts[0]].tobytes())


def _between(raw: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The bytes of ranges [starts[i], ends[i]), concatenated (ranges ascending, not overlapping)."""
    bounds = np.empty(2 * len(starts) + 1, np.int64)
    bounds[0], bounds[1::2], bounds[2::2] = 0, starts, ends
    keep = np.zeros(2 * len(starts), bool)
    keep[1::2] = True
    return raw[: ends[-1]][np.repeat(keep, np.diff(bounds))]


def _numbers(raw: np.ndarray, url_close: np.ndarray, next_key: np.ndarray, n: int) -> np.ndarray | None:
    """The offset and length of each member, in order, from the text between each url and the
    next key. Every member's must read A offset B length C, with the same separators A, B, C
    (``, ``, ``, `` and ``], `` as kerchunk writes them; ``]`` and whitespace after the last)."""
    tails = _between(raw, url_close + 1, next_key)
    tail_end = np.cumsum(next_key - url_close - 1)
    digit = (tails >= ord("0")) & (tails <= ord("9"))
    edges = np.flatnonzero(np.diff(digit, prepend=False, append=False))
    if len(edges) != 4 * n:
        return None
    first_start, first_end, second_start, second_end = edges.reshape(n, 4).T
    if (first_end - first_start).max() > _MAX_DIGITS or (second_end - second_start).max() > _MAX_DIGITS:
        return None
    # The separators are taken from the first member and must fit the grammar ...
    data = tails.tobytes()
    tail_start = tail_end - (next_key - url_close - 1)
    a, b = data[: first_start[0]], data[first_end[0] : second_start[0]]
    c, last_c = data[second_end[0] : tail_end[0]], data[second_end[-1] :]
    if not (_COMMA.fullmatch(a) and _COMMA.fullmatch(b) and _CLOSE_LAST.fullmatch(last_c)
            and (n == 1 or _CLOSE.fullmatch(c))):
        return None
    # ... and every member must be laid out alike: each number exactly between its separators
    if not ((first_start - tail_start == len(a)).all() and (second_start - first_end == len(b)).all()
            and (tail_end[:-1] - second_end[:-1] == len(c)).all()):
        return None
    if not (_all_read(tails, tail_start, a) and _all_read(tails, first_end, b)
            and _all_read(tails, second_end[:-1], c)):
        return None
    leading_zero = (tails[first_start] == ord("0")) & (first_end - first_start > 1)
    leading_zero |= (tails[second_start] == ord("0")) & (second_end - second_start > 1)
    if leading_zero.any():
        return None  # not a JSON number
    values = np.fromstring(data.translate(_DIGITS_ONLY), dtype=np.int64, sep=" ")
    if len(values) != 2 * n or values.max() >= MAX_LENGTH:
        return None
    return values


def _strings(raw: np.ndarray, opens: np.ndarray, closes: np.ndarray) -> bytes | None:
    """The contents of strings, unescaped, each followed by a NUL; None unless valid UTF-8."""
    found = _between(raw, opens + 1, closes + 1)
    found[found == _QUOTE] = 0  # each closing quote becomes the NUL after its string
    if (found == _BACKSLASH).any():
        found = found[found != _BACKSLASH]  # every backslash here starts a "\/"
    joined = found.tobytes()
    if (found >= 0x80).any():
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return joined


def _distinct_strings(raw: np.ndarray, opens: np.ndarray, closes: np.ndarray):
    """(distinct strings in order of first use, per-string index into them) for strings that
    often repeat in runs (the urls of consecutive chunks of one file). None unless valid UTF-8."""
    width = closes - opens
    if (width == width[0]).all():  # one length (file names of one pattern): compare whole rows
        rows = _rows(raw, opens + 1, width[0] - 1)
        new_run = np.flatnonzero(np.append(True, (rows[1:] != rows[:-1]).any(axis=1)))
        firsts = [rows[i].tobytes() for i in new_run.tolist()]
    else:
        texts = _between(raw, opens + 1, closes + 1).tobytes().split(b'"')[:-1]
        new_run = np.flatnonzero(np.append(True, np.fromiter(map(bytes.__ne__, texts[1:], texts[:-1]), bool,
                                                             len(texts) - 1)))
        firsts = [texts[i] for i in new_run.tolist()]
    index: dict[bytes, int] = {}
    run_ids = np.fromiter((index.setdefault(t, len(index)) for t in firsts), np.int32, len(firsts))
    try:
        urls = [t.replace(b"\\/", b"/").decode("utf-8") for t in index]
    except UnicodeDecodeError:
        return None
    return urls, np.repeat(run_ids, np.diff(np.append(new_run, len(opens))))
