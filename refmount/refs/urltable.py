"""One url table shared by the reference sets a mount serves at once (a lazily mounted glob's files;
the generations of a refreshed mount): the block cache and the fetcher know objects by their id here.

A file replaced in place while mounted (`--refresh` saw another version) is `renew`ed: its url gets a
new id, so that blocks cached under the old one stay the old version's (for readers that opened it),
and the old id is retired: a fetch of it fails (RemoteChanged: EIO) rather than hand the new bytes to
a reader of the old tree."""

from __future__ import annotations

import threading

import numpy as np

from refmount.errors import RemoteChanged
from refmount.fetch.stats import redact


class UrlTable:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls  # (the list itself is shared: the sets and the fetch closure index it)
        self.ids = {url: n for n, url in enumerate(urls)}  # url -> its newest id
        self.retired: set[int] = set()
        self.lock = threading.Lock()  # (a catalog's Parquet references intern theirs from worker threads)

    def id_of(self, url: str) -> int:
        with self.lock:
            k = self.ids.get(url)
            if k is None:
                k = self.ids[url] = len(self.urls)
                self.urls.append(url)
            return k

    def renew(self, url: str) -> int:
        """A new id for `url` (another version of its object); the old one retired."""
        with self.lock:
            old = self.ids.pop(url, None)
        if old is not None:
            self.retired.add(old)
        return self.id_of(url)

    def check(self, url_id: int) -> None:
        if url_id in self.retired:
            raise RemoteChanged(f"{redact(self.urls[url_id])}: the object changed while mounted and was "
                                "scanned again; a reader of the old version must open it again")

    def share(self, refset, fallback: tuple[int, int] | None = None) -> None:
        """Re-point `refset`'s url ids into this table (its urls given their ids here), and give it the
        span of ids it uses (view.raw sizes objects per id over that span only)."""
        ids = np.array([self.id_of(u) for u in refset.urls] or [0], dtype=np.int32)
        remote = refset.url_id >= 0
        refset.url_id[remote] = ids[refset.url_id[remote]]
        refset.urls = self.urls
        used = refset.url_id[remote]
        refset.url_span = (int(used.min()), int(used.max()) + 1) if used.size else (fallback or (0, 1))
