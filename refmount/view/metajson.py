"""The served metadata's JSON text: exactly ``json.dumps(value, ensure_ascii=False, indent=4,
sort_keys=True)`` in UTF-8 (UTF-8 without \\u escapes: what netCDF-C reads best, NOTES §1), made by C
encoders.

With an indent, json's encoder is pure Python (3.11): 40% of a 10,000-array decoded view's plan.
orjson writes the same layout with two-space indents, and tokens that are nearly json's: it writes
1e-05 as 0.00001 and NaN as null, and refuses what json may take (integers past 64 bits, non-str keys,
subclasses). So its text is taken only when its compact text is byte for byte json's own compact text
of the value (json's C encoder); a container whose texts differ is written from its items' texts (each
by the same rule), and anything else by json itself. Every text served (views, .zmetadata,
`StreamedConsolidated`'s pieces) is this one's, so they agree.
"""

from __future__ import annotations

import functools
import json
import re
from json.encoder import c_make_encoder, encode_basestring

import orjson

_ORJSON_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
                   | orjson.OPT_PASSTHROUGH_DATETIME)


def _refuse(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# json's C encoder, made once (json makes one a call): compact, keys sorted; no cycle check (a cycle ends in
# a RecursionError here, and json's own encoder then says what it says)
_json_compact = c_make_encoder(None, _refuse, encode_basestring, None, ":", ",", True, False, True)
_DEEPEST = 64  # (of orjson's indents made four one depth at a time; deeper, a container is written by its items)
_INDENT = b"\n    "
_SCALARS = (str, int, float, bool)
_MAX_DEPTH = 16  # (deeper, json writes the rest: no metadata nests so, and each level is encoded again)


def dump_json(value, _depth: int = 0) -> bytes:
    """json.dumps(value, ensure_ascii=False, indent=4, sort_keys=True).encode("utf-8"), faster."""
    if type(value) in (dict, list, tuple) and _depth < _MAX_DEPTH:
        try:
            compact = "".join(_json_compact(value, 0)).encode("utf-8")  # (json's own tokens)
        except (TypeError, ValueError, RecursionError, OverflowError):  # (json's own encoder says why)
            compact = None
        if compact is not None:
            try:
                same = orjson.dumps(value, option=_ORJSON_OPTIONS) == compact
            except TypeError:  # (orjson.JSONEncodeError: an integer past 64 bits, a subclass, a non-str key)
                same = False
            if same:
                text = _four_space_indents(orjson.dumps(value, option=_ORJSON_OPTIONS | orjson.OPT_INDENT_2), compact)
                if text is not None:
                    return text
            return _from_items(value, _depth + 1)  # (acyclic, json has shown: each item by the same rule)
    if value is None or type(value) in _SCALARS:  # (json's C encoder writes these as its indented one does)
        return "".join(_json_compact(value, 0)).encode("utf-8")
    return json.dumps(value, ensure_ascii=False, indent=4, sort_keys=True).encode("utf-8")


def _four_space_indents(text: bytes, compact: bytes) -> bytes | None:
    """orjson's two-space indents made four (None: nested deeper than _DEEPEST)."""
    if b"  " not in compact:  # (then every run of two spaces is an indent's)
        return text.replace(b"  ", b"    ")
    depth = 1
    while depth < _DEEPEST and b"\n" + b"  " * depth in text:
        depth += 1
    if depth == _DEEPEST:
        return None
    for d in range(depth - 1, 0, -1):
        text = _line_at_depth(d).sub(b"\n" + b"    " * d, text)
    return text


@functools.cache
def _line_at_depth(depth: int) -> re.Pattern:
    """A line break and orjson's indent of `depth` (not deeper)."""
    return re.compile(rb"\n" + b"  " * depth + rb"(?! )")


def _from_items(value, depth: int) -> bytes:
    """json's indented text of a container, from its items' texts."""
    if type(value) is dict and value and all(type(key) is str for key in value):
        items = sorted(value.items())  # (json's order: by key, each key once)
        return b"{" + _INDENT + (b"," + _INDENT).join(
            json_key(key) + b": " + dump_json(item, depth).replace(b"\n", _INDENT) for key, item in items) + b"\n}"
    if type(value) is not dict and value:
        return b"[" + _INDENT + (b"," + _INDENT).join(dump_json(item, depth).replace(b"\n", _INDENT) for item in value) + b"\n]"
    return json.dumps(value, ensure_ascii=False, indent=4, sort_keys=True).encode("utf-8")


def json_key(key: str) -> bytes:
    """A key as json writes it."""
    return encode_basestring(key).encode("utf-8")
