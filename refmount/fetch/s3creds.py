"""--s3-credentials-url: temporary S3 credentials from an endpoint behind the login, kept fresh.

NASA's DAACs hand out in-region S3 credentials at an `s3credentials` url behind Earthdata Login:
JSON with `accessKeyId`, `secretAccessKey`, `sessionToken` and `expiration` (about an hour). They
are fetched through the mount's http client (so the login, its cookie and each host's own
credentials apply, auth.py) and used to sign s3:// requests (s3.py). They are fetched again before
they expire: 5 minutes before, or at half their life when they live less than 10 minutes. One read
does the refresh while the others go on with the credentials they have (still valid); only when the
credentials have expired and no refresh succeeded does a read wait for one, and fail (EACCES) if
it cannot be had.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from refmount.errors import FetchError, LoginFailed
from refmount.fetch.stats import redact

log = logging.getLogger("refmount")

EARLY = 300.0  # seconds before expiration a refresh is due (at most half the credentials' life)
RETRY_AFTER = 5.0  # seconds between attempts when a refresh failed while the credentials still hold
MARGIN = 2.0  # credentials this close to their expiration are not used (a request takes time)
MAX_DOCUMENT = 64 << 10


def check_options(url: str, remote_options: dict) -> None:
    """At mount time: --s3-credentials-url needs refmount's S3 engine, and no other credentials."""
    from refmount.errors import RefmountError
    from refmount.fetch.s3 import engine_config

    if not url.startswith(("http://", "https://")):
        raise RefmountError(f"--s3-credentials-url {url!r} is not an http(s) url")
    config, refused = engine_config(remote_options)
    if config is None:
        raise RefmountError(f"--s3-credentials-url cannot be used with --remote-options {refused} (it needs "
                            "refmount's own S3 engine)")
    if config["anon"] or "key" in config or "profile" in config:
        raise RefmountError("--s3-credentials-url cannot be used with --remote-options "
                            f"{'anon' if config['anon'] else 'key' if 'key' in config else 'profile'} (one source of "
                            "credentials)")


@dataclass(frozen=True)
class Credentials:
    key: str
    secret: str
    token: str
    expires: float  # time.time()
    generation: int


def parse_credentials(url: str, body: bytes, generation: int) -> Credentials:
    """The credentials in an s3credentials answer, or a one-line error naming what is missing."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise LoginFailed(f"--s3-credentials-url {redact(url)} did not answer JSON (a login page?)") from None
    if not isinstance(document, dict):
        raise LoginFailed(f"--s3-credentials-url {redact(url)} did not answer a JSON object")
    missing = [name for name in ("accessKeyId", "secretAccessKey", "sessionToken", "expiration")
               if not isinstance(document.get(name), str) or not document.get(name)]
    if missing:
        raise LoginFailed(f"--s3-credentials-url {redact(url)}: the answer lacks {', '.join(missing)}")
    try:
        expires = datetime.datetime.fromisoformat(document["expiration"].strip().replace("Z", "+00:00"))
    except ValueError:
        raise LoginFailed(f"--s3-credentials-url {redact(url)}: expiration {document['expiration']!r} is not a "
                          "date") from None
    if expires.tzinfo is None:
        expires = expires.replace(tzinfo=datetime.timezone.utc)
    return Credentials(document["accessKeyId"], document["secretAccessKey"], document["sessionToken"],
                       expires.timestamp(), generation)


class TemporaryCredentials:
    """The current temporary credentials of `url`; `fetch(url) -> bytes` fetches a small document
    through the mount's http client (from a trio task)."""

    def __init__(self, url: str, fetch, logins) -> None:
        self.url = url
        self.host = urlsplit(url).netloc
        self._fetch = fetch
        self.logins = logins
        self.current: Credentials | None = None
        self._refresh_at = 0.0
        self._lock: trio.Lock | None = None
        self._generation = 0

    def usable(self, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        return self.current is not None and now < self.current.expires - MARGIN

    async def ensure(self) -> Credentials:
        """Credentials good for a request now, refreshed first when due."""
        now = time.time()
        if self.current is not None and now < self._refresh_at and self.usable(now):
            return self.current
        if self._lock is None:
            self._lock = trio.Lock()
        if self._lock.locked() and self.usable(now):
            return self.current  # another read is refreshing: this one goes on
        async with self._lock:
            now = time.time()
            if self.current is not None and now < self._refresh_at and self.usable(now):
                return self.current
            try:
                await self._refresh()
            except FetchError as e:
                self.logins.count("s3_credential_failures", self.host)
                if not self.usable():
                    raise LoginFailed(f"temporary S3 credentials from {redact(self.url)} "
                                      f"{'expired' if self.current else 'could not be had'} and could not be "
                                      f"fetched: {e}") from None
                self._refresh_at = time.time() + RETRY_AFTER
                log.warning("temporary S3 credentials from %s: refresh failed (the current ones hold %.0fs "
                            "more; trying again in %.0fs): %s", redact(self.url),
                            self.current.expires - time.time(), RETRY_AFTER, e)
        return self.current

    async def _refresh(self) -> None:
        started = time.time()
        body = await self._fetch(self.url)
        self._generation += 1
        fresh = parse_credentials(self.url, body, self._generation)
        life = fresh.expires - started
        if life <= MARGIN:
            raise LoginFailed(f"--s3-credentials-url {redact(self.url)} handed out credentials that have already "
                              "expired (is this machine's clock right?)")
        self.current = fresh
        self._refresh_at = fresh.expires - min(EARLY, life / 2)
        self.logins.count("s3_credential_refreshes", self.host)
        log.info("temporary S3 credentials from %s: valid %.0fs, next refresh in %.0fs", redact(self.url), life,
                 self._refresh_at - time.time())


def listing_options(url: str, remote_options: dict) -> dict:
    """s3fs's options for listing s3:// (a glob or prefix of data files) with the temporary credentials
    of `url`, fetched now through the mount's logins as reads fetch them (synchronous: at mount time)."""
    from refmount.fetch.pages import fetch_page

    try:
        body = fetch_page(url, MAX_DOCUMENT)[2]
    except FetchError as e:
        raise LoginFailed(f"temporary S3 credentials from {redact(url)} could not be had: {e}") from None
    credentials = parse_credentials(url, body, 0)
    return {**remote_options, "key": credentials.key, "secret": credentials.secret, "token": credentials.token}
