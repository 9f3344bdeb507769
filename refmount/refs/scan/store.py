"""What was scanned, kept on disk: one gzipped JSON file per data file, named by a hash of its url and
holding the version it was scanned at (ETag, or Last-Modified and size; a local file's size and
mtime). A later mount revalidates (a HEAD, listing metadata or a stat) and reads no header again unless
the version changed. Per source, the names last seen, so that a file gone since is said in the log.
A --concat combination: its references as JSON after a header line with their digest (refs/scan/kept.py).
A glob's first index page as last answered, the daemon's guess while it travels (fetch/pageguess.py).

Default place: $XDG_CACHE_HOME/refmount/scans (~/.cache/refmount/scans), or DIR/scans with --cache-dir.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import tempfile

import orjson

from refmount.cache import owned

log = logging.getLogger("refmount")
_refused: set[str] = set()  # directories already said to be someone else's

FORMAT_VERSION = 11  # bump when what is kept changes meaning: older entries are then scanned again
# (2: GRIB fields in a scanning order kerchunk does not undo, and DMR++ linked blocks, are now left out:
# version 1 entries kept them with wrong values; 3: a FITS header card spelling a CF name was kept as
# that attribute (xarray applied it), a truncated FITS image and an HDF4 char SDS's "S1" dtype; 4: GRIB1
# messages split by their own length, ensemble members and multi-field messages left out, grib_tree's zero
# chunks and NaN fill: version 2 and 3 entries lost or misplaced fields; 5: netCDF-3 numeric attributes
# kept as text and missing_value as the fill, HDF5 fills not marked undeclared: version 4 entries masked them;
# 6: a TIFF's GDAL nodata of 0 is declared: version 5 entries did not serve it; 7: HDF5 datasets in external
# storage or virtual are now left out: version 5 and 6 entries kept them as fill; 8: HDF5 fills beside another
# _FillValue, space-padded strings kept, bzip2 datasets: older entries masked, stripped or left them out;
# 9: a TIFF's short last strip marked (refs/scan/tiff.py), its mask and other images said left out;
# 10: a one-level TIFF is a group holding its image as `0` (refs/scan/tiff.py): version 9 kept a root array;
# 11: a TIFF without nodata says so: GDAL's form gave netCDF's default fill as its nodata)


def default_scan_dir(cache_dir: str | None = None) -> str:
    if cache_dir:
        return os.path.join(cache_dir, "scans")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "refmount", "scans")


def _refuse_once(directory: str, why: str) -> None:
    if directory not in _refused:
        _refused.add(directory)
        log.warning("scan store %s %s; nothing is kept or read there (scanned again each time)", directory, why)


def _name(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:40]


class ScanStore:
    def __init__(self, directory: str | None) -> None:
        self.directory = directory  # None: nothing is kept (the directory could not be made)
        if directory:
            try:
                os.makedirs(directory, mode=0o700, exist_ok=True)
            except OSError:
                self.directory = None
                return
            why = owned.problem(directory)  # (what is kept is taken for a file's references)
            if why is not None:
                _refuse_once(directory, why)
                self.directory = None

    def _path(self, kind: str, key: str) -> str:
        # (no directory: a path nothing is read from or written to, see _load and _save)
        return os.path.join(self.directory or "", f"{kind}-{_name(key)}.json.gz")

    def get(self, url: str, version: str, max_bytes: int) -> dict | None:
        """The scan of `url` at `version`, or None (never scanned, another version, or unreadable)."""
        entry = self._load(self._path("file", url), max_bytes)
        if not entry or entry.get("format_version") != FORMAT_VERSION or entry.get("url") != url \
                or entry.get("version") != version:
            return None
        return entry.get("scan")

    def put(self, url: str, version: str, scan: dict) -> None:
        self._save(self._path("file", url), {"format_version": FORMAT_VERSION, "url": url, "version": version,
                                             "scan": scan})

    def get_combination(self, key: str, max_bytes: int) -> tuple[dict, bytes] | None:
        """(header, references as JSON bytes) of a combination kept under `key` (refs/scan/kept.py), or
        None: never kept, another key, or damaged (its digest: a file cut short or altered is a miss)."""
        if not self.directory:
            return None
        try:
            with gzip.open(self._path("combined", key), "rb") as f:
                header = orjson.loads(f.readline(max_bytes))
                if not isinstance(header, dict) or header.get("format_version") != FORMAT_VERSION \
                        or header.get("key") != key or not isinstance(header.get("size"), int) \
                        or header["size"] > max_bytes:
                    return None
                refs = f.read(header["size"] + 1)
        except (OSError, EOFError, ValueError):
            return None
        if len(refs) != header["size"] or hashlib.sha256(refs).hexdigest() != header.get("sha256"):
            return None
        return header, refs

    def put_combination(self, key: str, header: dict, refs: bytes) -> None:
        head = orjson.dumps({**header, "format_version": FORMAT_VERSION, "key": key, "size": len(refs),
                             "sha256": hashlib.sha256(refs).hexdigest()})
        self._write(self._path("combined", key), [head, b"\n", refs])

    def get_page(self, key: str, max_bytes: int) -> tuple[str, str, bytes] | None:
        """(final url, Content-Type, body) of the index page kept under `key` (fetch/pageguess.py), or
        None: never kept, another key, longer than `max_bytes`, or damaged."""
        if not self.directory:
            return None
        try:
            with gzip.open(self._path("page", key), "rb") as f:
                header = orjson.loads(f.readline(64 << 10))
                if not isinstance(header, dict) or header.get("format_version") != FORMAT_VERSION \
                        or header.get("key") != key or not isinstance(header.get("size"), int) \
                        or not 0 <= header["size"] <= max_bytes or not isinstance(header.get("url"), str) \
                        or not isinstance(header.get("type"), str):
                    return None
                body = f.read(header["size"] + 1)
        except (OSError, EOFError, ValueError):
            return None
        return (header["url"], header["type"], body) if len(body) == header["size"] else None

    def put_page(self, key: str, answer: tuple[str, str, bytes]) -> None:
        url, kind, body = answer
        head = orjson.dumps({"format_version": FORMAT_VERSION, "key": key, "url": url, "type": kind,
                             "size": len(body)})
        self._write(self._path("page", key), [head, b"\n", body])

    def previous_names(self, source: str) -> list[str]:
        entry = self._load(self._path("source", source), 64 << 20)
        return list(entry.get("names", [])) if entry and entry.get("source") == source else []

    def put_names(self, source: str, names: list[str]) -> None:
        self._save(self._path("source", source), {"source": source, "names": names})

    def _load(self, path: str, max_bytes: int) -> dict | None:
        if not self.directory:
            return None
        try:
            with gzip.open(path, "rb") as f:
                text = f.read(max_bytes + 1)
            if len(text) > max_bytes:
                return None
            entry = orjson.loads(text)
            return entry if isinstance(entry, dict) else None
        except (OSError, EOFError, ValueError):
            return None  # absent, or damaged: scanned again

    def _save(self, path: str, entry: dict) -> None:
        self._write(path, [orjson.dumps(entry)])

    def _write(self, path: str, parts: list[bytes]) -> None:
        if not self.directory:
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-")
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3) as f:
                for part in parts:
                    f.write(part)
            os.replace(tmp, path)  # whole or not at all: a concurrent mount never reads half a file
        except OSError:
            try:
                os.unlink(tmp)
            except (OSError, UnboundLocalError):
                pass
