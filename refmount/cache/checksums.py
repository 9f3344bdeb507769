"""Icechunk's virtual chunk checksums, checked before the first bytes of an object are served.

A virtual reference may carry the ETag its object had, or the time ("last modified, in seconds") it
was known to be current. Before the first read of such an object, its validator is asked for (the
HEAD that the fetch layer makes anyway for sizes and the disk cache) and compared: a different ETag,
or a Last-Modified after the recorded time, means the object changed after the commit, and every read
of it fails (EIO) with one log line. The verdict is kept for the life of the mount; the fetch layer
itself refuses an object whose validator changes while mounted.
"""

from __future__ import annotations

import email.utils
import logging
import os
from datetime import timezone

from refmount.errors import FetchError
from refmount.fetch import redact
from refmount.cache.lru import SingleFlightLRU
from refmount.fetch.protocols import local_path, protocol_of

log = logging.getLogger("refmount")


class ChecksumMismatch(FetchError):
    """A virtual chunk's object is not the version the repository recorded."""


def _bare_etag(etag: str) -> str:
    etag = etag.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"')


async def current_validators(fetcher, url: str) -> tuple[str | None, float | None]:
    """(ETag, Last-Modified as seconds since the epoch) of the object now, either may be None."""
    if protocol_of(url) == "file":
        # (the ETag Icechunk's local store, object_store's LocalFileSystem, gives a file)
        st = os.stat(local_path(url))
        return f"{st.st_ino:x}-{st.st_mtime_ns // 1000:x}-{st.st_size:x}", st.st_mtime
    identity = await fetcher.identity(url)  # one HEAD (shared with size()); fills the backend's validators
    etag, modified = fetcher.validators(url)
    if etag is None and identity and not identity.startswith("size "):
        etag = identity.split(" ", 1)[1]  # fsspec stores: "ETag <value>"
    if modified is None and identity and " modified " in identity:
        modified = identity.rsplit(" modified ", 1)[1]
    seconds = None
    if hasattr(modified, "timestamp"):  # a datetime (s3fs)
        seconds = modified.timestamp() if modified.tzinfo else modified.replace(tzinfo=timezone.utc).timestamp()
    elif modified is not None:
        try:
            seconds = email.utils.parsedate_to_datetime(str(modified)).timestamp()
        except (TypeError, ValueError):
            try:
                seconds = float(modified)
            except ValueError:
                seconds = None
    return etag, seconds


def mismatch(expected: tuple[str, object], etag: str | None, modified: float | None) -> str | None:
    """Why the object is not the recorded version, None if it is (or cannot be told)."""
    kind, value = expected
    if kind == "etag":
        if etag is not None and _bare_etag(etag) != _bare_etag(str(value)):
            return f"its ETag is {etag}, the repository recorded {value}"
        return None
    if modified is not None and int(modified) > int(value):
        return f"it was modified at {int(modified)} (seconds since the epoch), after {value} recorded by the repository"
    return None


def verified_fetch(fetch, fetcher, urls: list[str], checksums: dict[int, tuple[str, object]]):
    """Wrap `fetch(url_id, start, end)` so that objects with a recorded checksum are checked once."""
    verdicts = SingleFlightLRU(1 << 62)  # url id -> "" (good) or the reason it is refused

    async def verdict(uid: int):
        async def check():
            url = urls[uid]
            try:
                etag, modified = await current_validators(fetcher, url)
            except OSError as e:
                return f"cannot check its version: {e}"
            if etag is None and modified is None:
                log.warning("virtual chunk object %s: no ETag or Last-Modified to check against the repository's "
                            "checksum; reading it unchecked", redact(url))
                return ""
            reason = mismatch(checksums[uid], etag, modified)
            if reason:
                log.error("virtual chunk object %s changed after the Icechunk commit: %s; its chunks read as EIO",
                          redact(url), reason)
            return reason or ""  # (the LRU keeps no None)

        return await verdicts.get(uid, check)

    async def checked(url_id, start, end):
        if url_id in checksums:
            reason = await verdict(url_id)
            if reason:
                fetcher.stats.error(urls[url_id], "checksum")
                raise ChecksumMismatch(f"{redact(urls[url_id])} changed after the Icechunk commit: {reason}")
        return await fetch(url_id, start, end)

    return checked
