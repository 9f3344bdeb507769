"""One data file a source names: the unit of every listing (sources.py, catalogs.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Entry:
    """One data file: its name in the mount, its url (or local path), and what a listing told about it."""

    name: str
    url: str
    size: int | None = None
    version: str | None = None  # a validator from the listing (S3's ETag, an index page's date), if any
    sidecar: str | None = None  # the url of its DMR++ (X.dmrpp beside X), read instead of scanning X
    sidecar_listed: tuple = ()  # (size, version) of that DMR++ from the listing, if it gave them
    store: str | None = None  # 'zarr', 'icechunk' or 'parquet': a store a catalog names, loaded (not scanned) as
                              # a direct mount of its url is (refs.load_refs), when its directory is looked up
