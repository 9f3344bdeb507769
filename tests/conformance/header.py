"""The header of an ncdump output (CDL): groups, variables (type, dimensions) and attributes (type, values).

The data sections are parsed by tests.support.clients.parse_ncdump; this module reads what comes before
them, so that attribute names, types and values and variable types can be compared as ncdump prints them.
Attribute types follow CDL: an explicit type word (``string :a = ...``, ``int64 v:a = ...``) wins, else the
number suffix (``b`` byte, ``ub`` ubyte, ``s`` short, ``us`` ushort, ``u`` uint, ``ll`` int64, ``ull``
uint64, ``f`` float; none: int or double), and a string literal is ``char``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<comment>//[^\n]*)
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<char>'(?:[^'\\]|\\.)*')
    | (?P<punct>[{}(),;=:])
    | (?P<word>(?:[^\s{}(),;=:"'\\]|\\.)+)
    """,
    re.VERBOSE | re.DOTALL,
)

SECTIONS = ("types", "dimensions", "variables", "data")


@dataclass
class Tok:
    kind: str
    text: str
    start: int
    end: int


@dataclass
class HeaderVar:
    path: str
    type: str
    dims: Tuple[str, ...]
    attrs: Dict[str, Tuple[str, Tuple[str, ...]]] = field(default_factory=dict)


@dataclass
class Header:
    variables: Dict[str, HeaderVar] = field(default_factory=dict)
    group_attrs: Dict[str, Dict[str, Tuple[str, Tuple[str, ...]]]] = field(default_factory=dict)  # "" = root


def unescape_name(word: str) -> str:
    return re.sub(r"\\(.)", r"\1", word)


def tokens(text: str) -> List[Tok]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"ncdump header: cannot tokenise at {text[pos:pos + 40]!r}")
        if m.lastgroup not in ("ws", "comment"):
            out.append(Tok(m.lastgroup, m.group(), m.start(), m.end()))
        pos = m.end()
    return out


_SUFFIX_TYPES = [("ull", "uint64"), ("ll", "int64"), ("ub", "ubyte"), ("us", "ushort"), ("b", "byte"),
                 ("s", "short"), ("u", "uint"), ("f", "float")]


def infer_type(values: List[Tok]) -> str:
    if not values:
        return "char"
    first = values[0]
    if first.kind in ("string", "char"):
        return "char"
    w = first.text.lower()
    if w in ("nanf", "infinityf", "-infinityf", "+infinityf"):
        return "float"
    if w in ("nan", "infinity", "-infinity", "+infinity"):
        return "double"
    if w.startswith(("0x", "-0x")):  # hex integer (opaque data)
        return "int"
    for suffix, name in _SUFFIX_TYPES:
        if w.endswith(suffix) and re.fullmatch(r"[+-]?[0-9.e+-]+", w[: -len(suffix)] or "x"):
            return name
    if re.fullmatch(r"[+-]?\d+", w):
        return "int"
    return "double"


def _statements(toks: List[Tok], i: int) -> Tuple[List[Tok], int]:
    """Tokens of one statement from ``i`` up to its ``;`` (braces nested inside are kept)."""
    depth = 0
    out = []
    while i < len(toks):
        t = toks[i]
        if t.kind == "punct" and t.text == "{":
            depth += 1
        elif t.kind == "punct" and t.text == "}":
            depth -= 1
        elif t.kind == "punct" and t.text == ";" and depth <= 0:
            return out, i + 1
        out.append(t)
        i += 1
    return out, i


def parse_header(text: str) -> Header:
    toks = tokens(text)
    head = Header()
    groups: List[str] = []  # open group names (root excluded)
    section: Optional[str] = None
    i = 0
    n = len(toks)
    depth = 0

    def gpath() -> str:
        return "/".join(groups)

    while i < n:
        t = toks[i]
        nxt = toks[i + 1] if i + 1 < n else None
        if t.kind == "word" and t.text == "netcdf" and depth == 0:
            # netcdf NAME {
            while i < n and not (toks[i].kind == "punct" and toks[i].text == "{"):
                i += 1
            depth = 1
            head.group_attrs.setdefault("", {})
            i += 1
            section = None
            continue
        if t.kind == "word" and t.text == "group" and nxt is not None and nxt.text == ":":
            groups.append(unescape_name(toks[i + 2].text))
            head.group_attrs.setdefault(gpath(), {})
            i += 4  # group : NAME {
            section = None
            continue
        if t.kind == "word" and t.text in SECTIONS and nxt is not None and nxt.text == ":" \
                and nxt.start == t.end:
            section = t.text
            i += 2
            continue
        if t.kind == "punct" and t.text == "}":
            if groups:
                groups.pop()
            i += 1
            section = None
            continue
        stmt, i = _statements(toks, i)
        if section not in (None, "variables") or not stmt:  # a group with no variables: attributes only
            continue
        eq = next((k for k, s in enumerate(stmt) if s.kind == "punct" and s.text == "="), None)
        if eq is None:  # a variable declaration: TYPE NAME [( d1, d2 )]
            vtype = stmt[0].text
            name = unescape_name(stmt[1].text)
            dims = tuple(unescape_name(s.text) for s in stmt[2:] if s.kind == "word")
            path = f"{gpath()}/{name}" if groups else name
            head.variables[path] = HeaderVar(path, vtype, dims)
            continue
        colon = next(k for k, s in enumerate(stmt) if s.kind == "punct" and s.text == ":")
        before = stmt[:colon]
        atype = None
        var = None
        if len(before) == 2:
            atype, var = before[0].text, unescape_name(before[1].text)
        elif len(before) == 1:
            if before[0].end == stmt[colon].start:
                var = unescape_name(before[0].text)
            else:
                atype = before[0].text
        aname = unescape_name(stmt[colon + 1].text)
        values = [s for s in stmt[eq + 1:] if not (s.kind == "punct" and s.text == ",")]
        value = (atype or infer_type(values), tuple(s.text for s in values))
        if var is None:
            head.group_attrs.setdefault(gpath(), {})[aname] = value
        else:
            path = f"{gpath()}/{var}" if groups else var
            if path in head.variables:
                head.variables[path].attrs[aname] = value
    return head
