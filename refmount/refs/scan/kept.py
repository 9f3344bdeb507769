"""A --concat combination kept in the scan store, found by the listing alone.

A warm mount whose listing names the same files at the same versions (the listing's dates, sizes or
ETags; a local file's stat) with the same combining options loads the combined references in one
read: no file's scan is read from the store, no coordinate read, nothing combined. A file the listing
gives no settled version of (one a HEAD or a scan would identify) leaves the mount on the per-file way,
where the combination is keyed by the versions its files were scanned at.

What is kept is checked as a fresh combination is: each file's targets against the document that
named them (fetch/trust.py, as check_scanned does), and the loaded set names no url beyond them. A
stored combination that is damaged, cut short or of another key is a miss (its digest), never data.
"""

from __future__ import annotations

import logging
import os
import time

import orjson

from refmount.fetch.stats import redact

log = logging.getLogger("refmount")


def listed_identity(entry) -> list | None:
    """What names `entry`'s version before anything is read of it: the listing's size and version (a
    local file: its stat), and its sidecar's (DMR++, .idx) alike; None when the listing leaves one open."""
    from refmount.fetch.protocols import is_remote, local_path

    def one(url: str, size, version) -> list | None:
        if not is_remote(url):
            try:
                st = os.stat(local_path(url))
            except OSError:
                return None
            return [url, st.st_size, st.st_mtime_ns]
        return [url, size, version] if size is not None and version else None

    if entry.store:
        return None
    found = [entry.name, one(entry.url, entry.size, entry.version)]
    if entry.sidecar and entry.sidecar != entry.url:
        found.append(one(entry.sidecar, *(entry.sidecar_listed or (None, None))))
    return None if None in found else found


class KeptCombination:
    """The `then` of `scan_source` for a mount's --concat combination (`combined_refs`, as JSON bytes),
    kept in the scan store by the listing (`lookup`, before any file is scanned) or, when the listing
    leaves a version open, by the versions the files were scanned at."""

    def __init__(self, location: str, options, max_refs_size: int, *, combine, targets, scanned_as) -> None:
        """`combine` (archive's combined_refs), `targets` (scanned_targets) and `scanned_as` (Scanned) are
        the archive's, handed down (refs/scan/archive.py calls this module: no import back)."""
        self.combine, self.targets_of, self.scanned_as = combine, targets, scanned_as
        self.location = location
        self.options = options
        self.max_refs_size = max_refs_size
        self.key: str | None = None  # the listing's key, once `lookup` found one
        self.entries: list = []
        self.targets: set | None = None  # a hit: the urls its files may name

    def _store(self):
        from refmount.refs.scan.store import ScanStore, default_scan_dir

        return ScanStore(self.options.scan_dir or default_scan_dir(self.options.cache_dir))

    def _combining(self) -> list:
        # (the view, the decoder and the limits make no other combination: --max-keys, whose default
        # follows the memory free at start, bounds the loaded set as it bounds a fresh one)
        o = self.options
        return [o.concat, sorted(o.identical), o.skip_mismatched, bool(o.growing)]

    def lookup(self, entries: list, store=None):
        """([Scanned] standing for the files, the combined references as JSON bytes) kept for this
        listing, or None (a miss: the files are then scanned, and `then` keeps what they combine to)."""
        if not self.options.concat:
            return None
        identities = [listed_identity(e) for e in entries]
        if None in identities:
            return None
        self.entries = entries
        self.key = "listing:" + orjson.dumps([self.location, self._combining(), identities]).decode()
        started = time.monotonic()
        kept = (store or self._store()).get_combination(self.key, self.max_refs_size)
        if kept is None:
            return None
        header, refs = kept
        scanned = self._scanned(entries, header.get("files"))
        if scanned is None:
            return None
        log.info("combination of %d file(s) of %s from the scan store (their listing is unchanged) in %.2f s",
                 len(scanned), redact(self.location), time.monotonic() - started)
        return scanned, refs

    def _scanned(self, entries: list, records) -> list | None:
        """A Scanned per file (its name, format and what its scan left out; no references: they are the
        combination's), each file's targets checked against the document that named them. None when the
        records do not match the listing or a target is refused now (the per-file way then says which)."""
        from refmount.fetch.trust import TargetRefused
        from refmount.refs.origins import files

        if not isinstance(records, list) or len(records) != len(entries):
            return None
        out, every = [], set()
        try:
            for entry, record in zip(entries, records):
                name, fmt, refused, targets = record
                if name != entry.name:
                    return None
                document = self.options.trust.names(entry.sidecar or entry.url)
                for url in targets:
                    document.check(url)
                every.update(targets)
                out.append(self.scanned_as(name, entry.url, fmt, b"", [str(r) for r in refused],
                                   files=files(entry.url, entry.sidecar)))
        except TargetRefused:
            return None
        except (TypeError, ValueError):  # (a record of another shape)
            return None
        self.targets = every
        return out

    def names_no_other(self, refset) -> bool:
        """A hit's loaded set names no url its files' targets do not (a fresh combination cannot)."""
        return self.targets is not None and set(refset.urls) <= self.targets

    def then(self, kind: str, scanned: list, read) -> bytes | dict:
        """The combination of `scanned`: kept by the listing when every listed file is in it (a file left
        out may be back next time), else by the versions the files were scanned at."""
        if kind == "file" or not self.options.concat or any(s.version is None for s in scanned):
            return self.combine(kind, scanned, self.options, read)
        store = self._store()
        if self.key is None or len(scanned) != len(self.entries):
            key = "combined:" + orjson.dumps([*self._combining(),
                                               [(s.name, s.url, s.version) for s in scanned]]).decode()
            kept = store.get_combination(key, self.max_refs_size)
            if kept is not None:
                return kept[1]
        else:
            key = self.key
        refs = orjson.dumps(self.combine(kind, scanned, self.options, read))
        files = [[s.name, s.format, list(s.refused), sorted(self.targets_of(s))] for s in scanned]
        store.put_combination(key, {"files": files}, refs)
        return refs
