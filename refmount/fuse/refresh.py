"""`--refresh DURATION`: follow a source as it grows. At each interval the source is listed again (in a
worker thread, through the same listing and trust rules as at mount: refs/scan/archive.py
`listed_entries`), each file identified (a stat, the listing's date or ETag, else a HEAD), and what
changed since the last good listing (refs/scan/changes.py, pure) handed to `apply(changes, entries)`:
the tree's one swap (fuse/datasets.py `show` for a lazily mounted glob, fuse/generations.py `swap`
for a rebuilt set), which returns the names it left out for a fetch error: new again to the next
refresh, which asks again (a 503 of one new file is not a file left out for the mount's life). A
refresh that fails keeps the last good tree and says why once; a listing whose changes cannot be
applied is not applied again until it changes, unless what failed was a fetch (that may pass). One
log line per refresh that changed something; counters in the mount's stats ("refresh": fuse/served.py
exports them).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import time

import trio

from refmount.errors import RefmountError, same_failure
from refmount.fetch.retry import ASKED_AGAIN, passing, retry_under
from refmount.fetch.stats import redact

log = logging.getLogger("refmount")

IDENTIFY_CONNECTIONS = 16  # HEADs at once, for files a listing gives no version of
# A refresh asks once more after a hiccup, then gives up (the next interval asks again, and the tree stays
# as it was meanwhile): fetch/retry.py RetryPolicy.asked_again
REFRESH_POLICY = ASKED_AGAIN


_QUIET = contextvars.ContextVar("refmount_refresh_quiet", default=False)


class _Quiet(logging.Filter):
    """INFO lines of a rebuild (what a mount says of its scans and combination) as DEBUG: a refresh
    says what changed in one line of its own. Warnings (a file left out) pass. A context variable, so
    that the rebuild's own threads (trio.to_thread copies the context) are quiet too."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _QUIET.get() and record.levelno == logging.INFO:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return log.isEnabledFor(logging.DEBUG)
        return True


log.addFilter(_Quiet())


def quietly(function, *args):
    """`function(*args)`, its INFO log lines demoted to DEBUG."""
    token = _QUIET.set(True)
    try:
        return function(*args)
    finally:
        _QUIET.reset(token)


class Refresher:
    def __init__(self, location: str, options, interval: float, apply, *, shown: set, entries=None,
                 connections: int = 8, listing=None, known: dict | None = None) -> None:
        """`shown`: names of the files the tree holds at mount; `entries`: the mount's own listing if it
        kept it (the baseline is then that listing, identified at the start, not a listing made later).
        `listing`: another source's (entries, {name: identity}), a blocking call (an Icechunk branch's
        snapshot), with `known` its state at mount."""
        self.location = location
        self.options = options
        self.interval = interval
        self.apply = apply
        self.connections = max(connections, IDENTIFY_CONNECTIONS)
        self._shown = shown
        self._entries = entries
        self.known: dict | None = known  # {name: identity} of the last good listing
        self._listing = listing
        self._said: str | None = None  # the failure said last (said once, until a refresh works again)
        self._refused: dict | None = None  # a listing whose changes could not be applied (not tried again)
        self._probe = None
        self.refreshes = self.changes = self.failures = 0
        self.added = self.changed = self.removed = 0
        self.seconds = 0.0

    def statistics(self) -> dict:
        return {"interval": self.interval, "refreshes": self.refreshes, "changes": self.changes,
                "failures": self.failures, "files_added": self.added, "files_changed": self.changed,
                "files_removed": self.removed, "seconds": round(self.seconds, 3), "failing": self._said is not None}

    async def run(self) -> None:
        from refmount.fetch import Fetcher
        o = self.options
        policy = REFRESH_POLICY if o is None else \
            dataclasses.replace(REFRESH_POLICY, read_timeout=min(REFRESH_POLICY.read_timeout, o.read_timeout))
        retry_under(policy)  # (this task's listings, and the threads it starts: a rebuild's, S3's, Icechunk's too)
        if o is not None:  # (files to identify) its own fetcher: the mount's pins the version of each object it read
            self._probe = Fetcher(policy=policy,
                                  remote_options=o.remote_options, connections_per_host=self.connections,
                                  allow_cross_host_redirects=o.allow_cross_host_redirects,
                                  s3_credentials_url=o.s3_credentials_url)
        try:
            await self._baseline()
            while True:
                await trio.sleep(self.interval)
                await self.refresh()
        finally:
            if self._probe is not None:
                with trio.CancelScope(shield=True):
                    await self._probe.aclose()

    async def _baseline(self) -> None:
        """What the tree holds at mount: the mount's listing identified, or (a set that keeps no listing)
        a listing now, of the files the tree shows (one listed but not shown is new to the first refresh:
        if it cannot be scanned, that refresh leaves it out again, once)."""
        from refmount.refs.scan.archive import identities

        while self.known is None:
            try:
                if self._entries is not None:
                    known = await identities(self._entries, self._probe, self.connections)
                else:
                    known = (await self._list())[1]
                self.known = {name: ident for name, ident in known.items() if name in self._shown}
            except Exception as e:  # noqa: BLE001 - no refresh may end the mount
                self._failed(str(e) if isinstance(e, RefmountError) else f"internal error: {type(e).__name__}: {e}")
                await trio.sleep(self.interval)
        self._entries = self._shown = None

    async def _list(self) -> tuple[list, dict]:
        """(entries, {name: identity}) of the source now."""
        from refmount.refs.scan.archive import identities, listed_entries

        if self._listing is not None:
            return await trio.to_thread.run_sync(self._listing, abandon_on_cancel=True)
        entries = await trio.to_thread.run_sync(listed_entries, self.location, self.options, abandon_on_cancel=True)
        return entries, await identities(entries, self._probe, self.connections)

    async def refresh(self):
        """One refresh: the Changes applied (falsy when nothing changed), or None when it failed."""
        from refmount.refs.scan.changes import listing_changes

        started = time.monotonic()
        try:
            entries, now = await self._list()
            changes = listing_changes(self.known, now)
            if changes and now == self._refused:
                return None  # (the listing that failed to apply, again: still failing, said already)
            left = None
            if changes:
                try:
                    left = await self.apply(changes, entries)
                except BaseException as e:
                    if passing(e) is None:  # (bytes that could not be had now: asked again next time)
                        self._refused = now
                    raise
        except RefmountError as e:
            self._failed(str(e))
            return None
        except Exception as e:  # noqa: BLE001 - no refresh may end the mount
            if self._failed(f"internal error: {type(e).__name__}: {e}"):
                log.exception("refresh of %s", redact(self.location))
            return None
        self.seconds += time.monotonic() - started
        self.refreshes += 1
        self.known = {name: ident for name, ident in now.items() if name not in (left or ())}  # (new again next time)
        self._refused = None
        if self._said is not None:
            log.info("refresh of %s works again", redact(self.location))
            self._said = None
        if changes:
            self.changes += 1
            self.added += len(changes.added)
            self.changed += len(changes.changed)
            self.removed += len(changes.removed)
            log.info("refresh of %s: %s (%.2f s)", redact(self.location), changes.describe(),
                     time.monotonic() - started)
        return changes

    def _failed(self, why: str) -> bool:
        """Said once while it fails for the same reason (True then); the mount keeps its last good tree."""
        self.failures += 1
        if same_failure(why, self._said):
            log.debug("refresh of %s failed again: %s", redact(self.location), why)
            return False
        log.warning("refresh of %s failed; the mount keeps what it showed: %s", redact(self.location), why)
        self._said = why
        return True
