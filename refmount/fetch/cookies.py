"""The mount's cookie jar: cookies kept as browsers keep them, optionally in a Netscape cookie file.

One jar per mount, shared by every http path (the stdlib engine, aiohttp, the reference file's
fsspec client). Scoping is http.cookiejar's (RFC 6265 as browsers do it): a cookie goes only to its
domain (a host-only cookie, one set without Domain=, only to the host that set it), under its path,
over https if Secure, and until it expires. `--cookie-jar FILE` loads FILE at start and writes it
back (atomically, mode 0600) whenever a server sets a cookie: the Netscape format of curl's `-b/-c`
and of NASA's `~/.urs_cookies`, including curl's `#HttpOnly_` lines and its session cookies
(expiry 0), which are kept while the mount lives.
"""

from __future__ import annotations

import http.cookiejar
import logging
import os
import tempfile
import threading
import time
import urllib.request

from refmount.errors import RefmountError, quote

log = logging.getLogger("refmount")

_HTTP_ONLY = "#HttpOnly_"


class CookieJar:
    def __init__(self, path: str | None = None) -> None:
        self.path = path
        # DomainStrictNonDomain: a cookie set without Domain= goes back to its own host only (the
        # default policy would send it to subdomains too, unlike browsers)
        policy = http.cookiejar.DefaultCookiePolicy(strict_ns_domain=http.cookiejar.DefaultCookiePolicy.DomainStrictNonDomain)
        self._jar = http.cookiejar.CookieJar(policy)
        self._lock = threading.Lock()  # both engines' threads and the asyncio loop use the jar
        self._version = 0  # bumped whenever the jar changes
        self._headers: dict[str, tuple] = {}  # url without query -> (version, valid until, Cookie header)
        if path is not None and os.path.exists(path):
            self._load(path)

    def __len__(self) -> int:
        return len(self._jar)

    def header(self, url: str) -> str | None:
        """The Cookie header a request of `url` carries, or None. Worked out once per url (without
        its query) until the jar changes or one of its cookies expires: http.cookiejar takes 0.2 ms."""
        if not len(self._jar):
            return None
        key = url.partition("?")[0]
        now = time.time()
        with self._lock:
            known = self._headers.get(key)
            if known is not None and known[0] == self._version and now < known[1]:
                return known[2]
            request = urllib.request.Request(url)
            self._jar.add_cookie_header(request)
            header = request.get_header("Cookie")
            if len(self._headers) > 10_000:
                self._headers.clear()
            expiries = [c.expires for c in self._jar if c.expires]
            self._headers[key] = (self._version, min(expiries, default=float("inf")), header)
        return header

    def take(self, url: str, set_cookies: list[str]) -> None:
        """Keep the cookies a response to `url` set (its Set-Cookie values), as scoping allows."""
        if not set_cookies:
            return
        with self._lock:
            before = self._snapshot()
            self._jar.extract_cookies(_Answer(set_cookies), urllib.request.Request(url))
            changed = self._snapshot() != before
            self._version += 1
        if changed and self.path is not None:
            self.save()

    def names_for(self, url: str) -> list[str]:
        """The names of the cookies a request of `url` would carry (for log lines: never values)."""
        header = self.header(url) or ""
        return [part.split("=", 1)[0].strip() for part in header.split(";") if part.strip()]

    def _snapshot(self) -> set:
        return {(c.domain, c.path, c.name, c.value, c.expires) for c in self._jar}

    # -- the Netscape cookie file -----------------------------------------------------------------

    def _load(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError as e:
            raise RefmountError(f"--cookie-jar {quote(path)}: {e.strerror}") from None
        now = time.time()
        for number, line in enumerate(lines, 1):
            http_only = line.startswith(_HTTP_ONLY)
            if http_only:
                line = line[len(_HTTP_ONLY):]
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 7:
                raise RefmountError(f"--cookie-jar {quote(path)} line {number} is not a Netscape cookie line "
                                    "(7 tab-separated fields)")
            domain, subdomains, cookie_path, secure, expires, name, value = fields
            try:
                expiry = int(float(expires)) or None  # curl writes 0 for a session cookie
            except ValueError:
                raise RefmountError(f"--cookie-jar {quote(path)} line {number}: expiry {expires!r} is not a "
                                    "number") from None
            if expiry is not None and expiry <= now:
                continue
            domain_cookie = subdomains.upper() == "TRUE"
            if domain_cookie and not domain.startswith("."):
                domain = "." + domain
            self._jar.set_cookie(http.cookiejar.Cookie(
                0, name, value, None, False, domain, domain_cookie, domain.startswith("."), cookie_path, True,
                secure.upper() == "TRUE", expiry, expiry is None, None, None,
                {"HttpOnly": None} if http_only else {}))

    def save(self) -> None:
        """Write the jar to its file (session cookies too, as curl does), atomically, mode 0600."""
        if self.path is None:
            return
        with self._lock:
            cookies = list(self._jar)
        lines = ["# Netscape HTTP Cookie File", "# Written by refmount: the cookies of a mount", ""]
        for c in cookies:
            prefix = _HTTP_ONLY if c.has_nonstandard_attr("HttpOnly") else ""
            lines.append("\t".join([prefix + c.domain, "TRUE" if c.domain.startswith(".") else "FALSE", c.path,
                                    "TRUE" if c.secure else "FALSE", str(int(c.expires or 0)), c.name,
                                    c.value or ""]))
        temporary = None
        try:
            # a new file of a name nobody can guess (O_EXCL, 0600): a name such as JAR.<pid>.tmp, in a
            # directory another user can write, could be their symlink to a file of the daemon's user
            fd, temporary = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(self.path)),
                                             prefix=os.path.basename(self.path) + ".", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write("\n".join(lines) + "\n")
            os.replace(temporary, self.path)
        except OSError as e:
            if temporary is not None:
                try:
                    os.unlink(temporary)
                except OSError:
                    pass
            log.warning("--cookie-jar %s: cannot write it: %s", self.path, e.strerror)


class _Answer:
    """What http.cookiejar needs of a response: its Set-Cookie headers."""

    def __init__(self, set_cookies: list[str]) -> None:
        self._set_cookies = set_cookies

    def info(self):
        return self

    def get_all(self, name: str, default=None):
        return list(self._set_cookies) if name.lower() == "set-cookie" else (default or [])
