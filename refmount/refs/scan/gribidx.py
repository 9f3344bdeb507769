"""GRIB2 files read by their `.idx` (NOAA's wgrib2 inventories: `1:0:d=2023040812:PRMSL:mean sea level:anl:`).

NOAA's model files (HRRR, GFS, GEFS, RAP, NAM) each have a small text `.idx` beside them giving every
message's byte offset, run date, variable, level and step. Files of one product differ only in their run
date and where their messages fall, so the first file of each *kind* is scanned once (kerchunk's scan_grib
and grib_tree, as any GRIB file) and its references become a *mapping*: every chunk that refers to a
message is tied to that message's idx row, and the inline `time`/`valid_time` coordinates are tied to the
run date. Every later file of the kind is then the mapping with its own idx's offsets and date: one GET of
its `.idx`, no byte of the GRIB file. This is kerchunk's `_grib_idx` (`build_idx_grib_mapping` joins the
idx rows to the scanned messages by message number and checks offsets and lengths agree;
`map_from_index` applies a mapping to another file's idx with its run time), done on the reference dict
that refmount's own scan makes rather than through pandas and a datatree per message.

The kind of a file (what may share a mapping): the sorted set of its idx rows without their dates (the
variables, levels and steps of the product: f00 and f06 of one model are different kinds, as kerchunk's
"same horizon"), its name with the digits taken out (`gfs.t#z.pgrb#.#p#.f#`), and its size to a power of
two (GFS's 0p25 and 0p50 have the same rows and names of the same shape, and sizes 4x apart), and
its origin (scheme and host: see `origin`). A wrong split costs one scan more; a wrong merge could give
one product another's grid, hence the size.

An idx is a document of its origin: its offsets only ever point into its own GRIB file, within the size
the listing (or a HEAD) gave it. One that is not UTF-8, is larger than MAX_IDX_BYTES, has more than
MAX_ROWS rows, an offset that is not a number, goes back, or is past the end, a date that is none
(month 13), or rows of several dates, is refused in one line naming it. No name in the mount comes from an idx (they are the scanned file's).
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import re
from dataclasses import dataclass

import numpy as np
import orjson

IDX_SUFFIX = ".idx"
MAX_IDX_BYTES = 4 << 20  # GFS 0p25's idx is 60 kB, HRRR's wrfnat 100 kB
MAX_ROWS = 50_000  # (GFS 0p25: 743 rows; HRRR wrfprs: ~700)
MAPPING_VERSION = "grib-idx mapping 1"
_ROW = re.compile(r"^(\d{1,9}(?:\.\d{1,4})?):(\d{1,15}):d=(\d{10}(?:\d{2})?):(.*)$")
_TIME_UNITS = "seconds since 1970-01-01T00:00:00"


class IdxRefused(ValueError):
    """An idx that cannot be used; its message names what is wrong (the caller names the idx)."""


@dataclass(frozen=True)
class Row:
    number: str
    offset: int
    date: str  # YYYYMMDDHH[MM]
    attrs: str  # "PRMSL:mean sea level:anl:" (everything after the date)


def parse_idx(text: bytes, grib_size: int) -> list[Row]:
    """The rows of an idx, checked against the size of its GRIB file. IdxRefused otherwise."""
    if len(text) > MAX_IDX_BYTES:
        raise IdxRefused(f"it is larger than {MAX_IDX_BYTES >> 20} MiB")
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise IdxRefused("it is not UTF-8 text") from None
    rows, last = [], 0
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if len(rows) >= MAX_ROWS:
            raise IdxRefused(f"it has more than {MAX_ROWS:,} rows")
        m = _ROW.match(line.strip())
        if m is None:
            raise IdxRefused(f"line {n} is not a wgrib2 inventory row (N:offset:d=YYYYMMDDHH:...)")
        row = Row(m.group(1), int(m.group(2)), m.group(3), m.group(4))
        if row.offset < last:
            raise IdxRefused(f"line {n}: offset {row.offset:,} goes back (the row before is at {last:,})")
        if row.offset >= grib_size:
            raise IdxRefused(f"line {n}: offset {row.offset:,} is past the end of its GRIB file ({grib_size:,} bytes)")
        if not _real_date(row.date):  # (else the run time's arithmetic fails later: one line here)
            raise IdxRefused(f"line {n}: d={row.date} is not a date")
        last = row.offset
        rows.append(row)
    if not rows:
        raise IdxRefused("it has no rows")
    if len({r.date for r in rows}) > 1:
        raise IdxRefused("its rows are of several run dates")
    return rows


def messages(rows: list[Row], grib_size: int) -> dict[int, tuple[str, int]]:
    """offset -> (the message's key: its rows' attrs, its length). Submessages (`77.1`, `77.2`) share an
    offset and are one message; a message ends where the next begins, the last at the end of the file."""
    starts = sorted({r.offset for r in rows})
    ends = dict(zip(starts, starts[1:] + [grib_size]))
    keys: dict[int, list[str]] = {}
    for r in rows:
        keys.setdefault(r.offset, []).append(r.attrs)
    return {o: ("\n".join(keys[o]), ends[o] - o) for o in starts}


def kind_of(rows: list[Row], name: str, grib_size: int, url: str) -> str:
    """What files may share a mapping (the module's docstring says why these), on one origin."""
    shape = re.sub(r"\d+", "#", name)
    text = orjson.dumps([sorted({r.attrs for r in rows}), shape, max(grib_size, 1).bit_length(), origin(url)])
    return "grib-idx kind " + hashlib.sha256(text).hexdigest()[:32]


def origin(url: str) -> str:
    """scheme://host (an S3 bucket is its host); "" for a local file. A mapping carries its first file's
    coordinates and attributes: one origin's files never lend them to another's (a hostile server could
    otherwise shape its files to another product's kind and poison the scan store for it)."""
    from urllib.parse import urlsplit

    from refmount.fetch.protocols import is_remote

    if not is_remote(url):
        return ""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}"


def _real_date(date: str) -> bool:
    """YYYYMMDDHH[MM] of a time that exists (a month 13 or a year 0 would fail run_seconds later)."""
    import datetime

    try:
        datetime.datetime(int(date[:4]), int(date[4:6]), int(date[6:8]), int(date[8:10]), int(date[10:12] or 0))
    except ValueError:
        return False
    return True


def run_seconds(date: str) -> int:
    return calendar.timegm((int(date[:4]), int(date[4:6]), int(date[6:8]), int(date[8:10]),
                            int(date[10:12] or 0), 0))


def inline_candidates(refs: dict, rows: list[Row], grib_size: int) -> dict[str, list[int]]:
    """Inline values that may be whole GRIB messages (grib_tree inlines messages under 500 bytes: a
    constant field packs to ~200), each with the offsets of the messages of its length."""
    by_length: dict[int, list[int]] = {}
    for offset, (_, length) in messages(rows, grib_size).items():
        by_length.setdefault(length, []).append(offset)
    out = {}
    for key, value in refs.items():
        if isinstance(value, str) and not key.rpartition("/")[2].startswith(".z"):
            data = inline_bytes(value)
            if data[:4] == b"GRIB" and len(data) in by_length:
                out[key] = by_length[len(data)]
    return out


def learn(refs: dict, rows: list[Row], grib_url: str, grib_size: int, inline_at: dict | None = None) -> dict:
    """The mapping of a kind from its first file's references (its scan) and idx. IdxRefused when the
    two do not agree, as kerchunk's build_idx_grib_mapping checks: a reference to a place no idx row
    names, of another length than the idx gives, a message held inline that `inline_at` (key -> the
    offset of the one message with its bytes) does not place, two messages of the same rows, or run
    times not in seconds since 1970. A message held inline becomes a reference in the kind's other
    files (its bytes are this file's only)."""
    inline_at = inline_at or {}
    by_offset = messages(rows, grib_size)
    keys = [k for k, _ in by_offset.values()]
    if len(set(keys)) != len(keys):
        raise IdxRefused("two of its messages have the same rows")
    template, chunks, times = {}, {}, []
    for key, value in refs.items():
        if isinstance(value, list) and len(value) == 3 and value[0] == grib_url:
            found = by_offset.get(value[1])
            if found is None:
                raise IdxRefused(f"the scan refers to byte {value[1]:,} ({key}), where no row of it begins")
            if found[1] != value[2]:
                raise IdxRefused(f"its message at {value[1]:,} is {found[1]:,} bytes long, the scan says "
                                 f"{value[2]:,} ({key})")
            chunks[key] = found[0]
            continue
        if isinstance(value, list):
            raise IdxRefused(f"the scan refers to another file than its GRIB file ({key})")
        template[key] = value
    for key in list(template):
        array, _, base = key.rpartition("/")
        name = array.rpartition("/")[2]
        if base.startswith(".z") or not array:
            continue
        meta = orjson.loads(template.get(f"{array}/.zarray", "{}"))
        if any(isinstance(f, dict) and f.get("id") == "grib" for f in meta.get("filters") or []):
            if key not in inline_at:
                raise IdxRefused(f"the scan holds message {key} inline, and no one message of the file has its bytes")
            chunks[key] = by_offset[inline_at[key]][0]
            del template[key]
            continue
        if name in ("time", "valid_time"):
            attrs = orjson.loads(template.get(f"{array}/.zattrs", "{}"))
            if attrs.get("units") != _TIME_UNITS or np.dtype(meta.get("dtype", "|O")).kind not in "iu":
                raise IdxRefused(f"the scan's {key} is not in {_TIME_UNITS}")
            times.append(key)
    return {"template": template, "chunks": chunks, "times": times, "run": run_seconds(rows[0].date)}


def apply(mapping: dict, rows: list[Row], grib_url: str, grib_size: int) -> dict:
    """A file's references from its kind's mapping and its own idx (kerchunk's map_from_index)."""
    by_key = {k: (o, n) for o, (k, n) in messages(rows, grib_size).items()}
    refs = dict(mapping["template"])
    for key, message in mapping["chunks"].items():
        found = by_key.get(message)
        if found is None:  # (cannot be: same kind, same rows)
            raise IdxRefused(f"it has no row {message.splitlines()[0]!r}")
        refs[key] = [grib_url, found[0], found[1]]
    shift = run_seconds(rows[0].date) - int(mapping["run"])
    for key in mapping["times"]:
        meta = orjson.loads(refs[key.rpartition("/")[0] + "/.zarray"])
        values = np.frombuffer(inline_bytes(refs[key]), dtype=meta["dtype"]) + shift
        refs[key] = _inline_value(values.astype(meta["dtype"]).tobytes())
    return refs


def _inline_value(data: bytes) -> str:
    """As the scan writes an inline value (worker.to_v0): ASCII as is, else base64."""
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def inline_bytes(value) -> bytes:
    if isinstance(value, str) and value.startswith("base64:"):
        return base64.b64decode(value[7:])
    return value.encode("latin-1") if isinstance(value, str) else bytes(value)
