"""Logins: which credentials each request carries, and what a refused login means.

Every http path (the stdlib engine, aiohttp, the reference file's fsspec client) asks the mount's
`Logins` for the credentials of each request it sends, one hop of a redirect chain at a time, and
tells it every answer. The rules:

- A host gets only its own credentials: its bearer token (`--bearer-token HOST=FILE`, read from the
  file, reread when the file changes), else its own `~/.netrc` (or $NETRC) entry as HTTP Basic, and
  the cookies of the jar scoped to it (cookies.py). A host reached by a redirect gets only an entry
  named for it (never netrc's `default`). Credentials go over plain http only when the chain began
  on http, and never to a host a public document chose (`strangers`: its `http://` would carry them
  in clear); https never turns into http (http.py refuses that redirect).
- The user's own headers (--remote-options "headers", e.g. Authorization, X-Api-Key) go only to the
  origin (scheme, host and port) the chain began at, never to a host a redirect leads to, nor to an
  origin that only a document from a public address named on another origin than its own (a
  catalog's CDN: `Logins.strangers`); nor does netrc's `default` entry.
- Redirects (`Trail.redirect_refused`, the one decision every client asks: the HTTP engine, the
  reference file's fsspec client, index pages): only to http(s), never from https down to http.
  Within the host, to a login host (one with a netrc entry or a bearer token of its own) and back
  to where the chain began, they are followed: Earthdata Login's dance, data url -> login host
  /oauth/authorize (Basic) -> data host ?code= (sets a session cookie) -> the data. A redirect to
  any other host is followed too, carrying none of the user's headers and no credential but that
  host's own (the signed-url hop of NASA's Earthdata Cloud: data host -> a presigned object-store
  url, as GDAL, curl -L and earthaccess follow it) - except into this machine's own network
  (loopback, link-local, private addresses: addresses.py) from a chain that did not begin there,
  which needs --allow-cross-host-redirects. A url that a document from a public address named (a
  catalog's item, a remote reference set's target: fetch/trust.py records its host here,
  `reach_public_only`) is reached on public addresses only, on every hop of every request, whatever
  its name answers later (DNS rebinding): no flag lifts that. A listing's index page is not followed to another
  origin at all (its links would name files there), nor is a presigned s3 request (its signature
  and session token are in its url, and a redirect may carry them along).
- A refused login (401; 403 to a request that carried credentials; the login host reached a second
  time in one chain) raises `LoginFailed` (the reader gets EACCES), with one line naming the host
  and what was tried, never a secret.

`Trail` follows one chain of requests; `Logins` holds the mount's netrc, jar, tokens and counters.
"""

from __future__ import annotations

import base64
import logging
import netrc
import os
import threading
from urllib.parse import parse_qs, urlsplit

from refmount.errors import LoginFailed, RefmountError, quote

log = logging.getLogger("refmount")

_REFUSED = (401, 403)


def _host(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def _netloc(url: str) -> str:
    return urlsplit(url).netloc.rpartition("@")[2].lower()


def _origin(url: str) -> tuple[str, str]:
    return urlsplit(url).scheme.lower(), _netloc(url)


class NetrcFile:
    """~/.netrc (or $NETRC), parsed once when first needed."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
        self._parsed = None
        self._lock = threading.Lock()

    def _hosts(self):
        with self._lock:
            if self._parsed is None:
                try:
                    self._parsed = netrc.netrc(self.path)
                except FileNotFoundError:
                    self._parsed = False
                except (netrc.NetrcParseError, OSError) as e:
                    log.warning("%s cannot be used: %s", self.path, getattr(e, "msg", None) or e)
                    self._parsed = False
            return self._parsed

    def entry(self, host: str, explicit: bool = False) -> tuple[str, str] | None:
        """(login, password) for `host`: its own machine line, or with explicit=False the default."""
        parsed = self._hosts()
        if not parsed or not host:
            return None
        found = parsed.hosts.get(host) if explicit else parsed.authenticators(host)
        if not found:
            return None
        login, _account, password = found
        return login or "", password or ""


class BearerTokens:
    """--bearer-token HOST=FILE: the token in FILE, sent as `Authorization: Bearer` to HOST only (HOST
    or HOST:PORT). The file is read when first needed and again whenever it changes (a rotated token)."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = {host.lower(): path for host, path in (files or {}).items()}
        self._read: dict[str, tuple[tuple, str]] = {}  # path -> ((mtime_ns, size, inode), token)
        self._lock = threading.Lock()

    def file_for(self, url: str) -> str | None:
        if not self.files:
            return None
        return self.files.get(_netloc(url)) or self.files.get(_host(url))

    def token(self, path: str) -> str:
        try:
            st = os.stat(path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            with self._lock:
                known = self._read.get(path)
                if known is not None and known[0] == stamp:
                    return known[1]
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise LoginFailed(f"bearer token file {quote(path)}: {e.strerror}") from None
        if not token or any(c.isspace() for c in token):
            raise LoginFailed(f"bearer token file {quote(path)} does not hold one token (empty, or more than one word)")
        with self._lock:
            self._read[path] = (stamp, token)
        return token


def check_token_files(files: dict[str, str]) -> None:
    """At mount time: each --bearer-token file exists and holds a token (a one-line error otherwise)."""
    tokens = BearerTokens(files)
    for host, path in files.items():
        try:
            tokens.token(path)
        except LoginFailed as e:
            raise RefmountError(f"--bearer-token {host}: {str(e).split(': ', 1)[-1]} ({path})") from None


class Logins:
    """The mount's credentials and login counters, shared by every http path."""

    def __init__(self, *, netrc_path: str | None = None, cookie_jar: str | None = None,
                 bearer_tokens: dict[str, str] | None = None, allow_cross_host_redirects: bool = False) -> None:
        self._lock = threading.Lock()
        self.netrc = NetrcFile(netrc_path)
        self.cookie_jar = cookie_jar
        self._cookies = None
        if cookie_jar is not None:
            self.cookies  # noqa: B018 - the file is read now: a bad one fails the mount, not a read
        self.tokens = BearerTokens(bearer_tokens)
        self.allow_cross_host_redirects = allow_cross_host_redirects
        self.public_only: set[str] = set()  # hosts a document from a public address named (fetch/trust.py)
        self.strangers: set[tuple[str, str]] = set()  # origins it named away from its own: none of the user's
        self.counters: dict[str, dict[str, int]] = {"logins": {}, "login_failures": {}, "bearer_requests": {},
                                                   "s3_credential_refreshes": {}, "s3_credential_failures": {}}

    @property
    def cookies(self):
        """The cookie jar, made when first needed (http.cookiejar takes 30 ms to import)."""
        if self._cookies is None:
            from refmount.fetch.cookies import CookieJar

            with self._lock:
                if self._cookies is None:
                    self._cookies = CookieJar(self.cookie_jar)
        return self._cookies

    def cookie_header(self, url: str) -> str | None:
        return self._cookies.header(url) if self._cookies is not None else None

    def keep_cookies(self, url: str, set_cookies: list[str]) -> None:
        if set_cookies:
            self.cookies.take(url, set_cookies)

    def count(self, what: str, host: str) -> None:
        with self._lock:
            hosts = self.counters[what]
            hosts[host] = hosts.get(host, 0) + 1

    def statistics(self) -> dict:
        with self._lock:
            out = {name: dict(hosts) for name, hosts in self.counters.items()}
        out["cookies"] = len(self._cookies) if self._cookies is not None else 0
        return out

    def trail(self, origin: str, user_headers: dict | None = None, *, same_origin: bool = False,
              signed: bool = False) -> "Trail":
        """A chain of requests from `origin`; `user_headers` go to that origin only; `same_origin`: a
        redirect to any other origin is refused (an index page); `signed`: `origin` is a presigned
        url (s3), whose signature and session token a redirect elsewhere might carry along."""
        return Trail(self, origin, user_headers, same_origin=same_origin, signed=signed)

    def reach_public_only(self, url: str, stranger: bool = False) -> None:
        """From now on, every request to `url`'s host may connect to public addresses only: a document
        from a public address named it (fetch/trust.py decides, once, as it names it); `stranger`: on
        another origin than that document's, so none of the user's headers (nor netrc's default) go there."""
        host = _host(url)
        if host in self.public_only and not (stranger and _origin(url) not in self.strangers):
            return  # (known: a reference set names its hosts again and again)
        with self._lock:  # (new sets: readers in other threads iterate none)
            if host and host not in self.public_only:
                self.public_only = self.public_only | {host}
            if stranger and _origin(url) not in self.strangers:
                self.strangers = self.strangers | {_origin(url)}

    def is_public_only(self, url: str) -> bool:
        return bool(self.public_only) and _host(url) in self.public_only

    def is_stranger(self, url: str) -> bool:
        return bool(self.strangers) and _origin(url) in self.strangers

    def is_login_host(self, url: str) -> bool:
        """A host the user gave credentials for: a redirect to it is followed."""
        return self.netrc.entry(_host(url), explicit=True) is not None or self.tokens.file_for(url) is not None


class Trail:
    """One chain of requests (a request and the redirects it follows), from `origin`."""

    def __init__(self, logins: Logins, origin: str, user_headers: dict | None = None, *,
                 same_origin: bool = False, signed: bool = False) -> None:
        self.logins = logins
        self.origin = origin
        self.origin_scheme = urlsplit(origin).scheme
        self.user_headers = dict(user_headers or {})
        self.same_origin = same_origin
        self.signed = signed
        self.sent: dict[str, str] = {}  # netloc -> what the last request to it carried (for error lines)
        self.logged_in_at: set[str] = set()  # login hosts that sent us back with a code in this chain
        self.credited: set[str] = set()  # netlocs the last request to which carried credentials
        self.basic: set[str] = set()  # netlocs the last request to which carried a netrc entry
        self.public_only = logins.is_public_only(origin)  # every hop on public addresses only (guards)
        self.stranger = logins.is_stranger(origin)  # none of the user's headers, no netrc default

    def at_origin(self, url: str) -> bool:
        """`url` is on the origin (scheme, host and port) the chain began at."""
        return _origin(url) == _origin(self.origin)

    def headers(self, url: str, *, signed: bool = False) -> dict:
        """The headers a request of `url` in this chain carries besides its own: the user's headers
        (--remote-options "headers") on the chain's origin only, and the credentials of `url`'s host.
        A presigned url (s3) carries its own; the user's own Authorization header wins over ours."""
        own = self.user_headers if self.at_origin(url) and not self.stranger else {}
        user_authorization = any(name.lower() == "authorization" for name in own)
        return {**own, **self._credentials(url, signed=signed, user_authorization=user_authorization)}

    def _credentials(self, url: str, *, signed: bool, user_authorization: bool) -> dict:
        netloc = _netloc(url)
        if netloc in self.logged_in_at:
            self._refuse(url, f"{netloc} asked for a login again right after one (the cookie "
                              f"{self._cookie_names(self.origin)} was refused by {_netloc(self.origin)}?)")
        out: dict = {}
        carried = []
        self.credited.discard(netloc)
        self.basic.discard(netloc)
        plain = urlsplit(url).scheme == "http" and (self.origin_scheme != "http" or self.stranger)
        if signed or plain:
            self.sent[netloc] = "nothing (presigned url)" if signed else "nothing (plain http)"
            return out
        first_hop = netloc == _netloc(self.origin)
        if user_authorization:
            carried.append("the Authorization header of --remote-options")
        else:
            token_file = self.logins.tokens.file_for(url)
            if token_file is not None:
                out["Authorization"] = "Bearer " + self.logins.tokens.token(token_file)
                carried.append(f"the bearer token from {token_file}")
                self.logins.count("bearer_requests", netloc)
            else:
                entry = self.logins.netrc.entry(_host(url), explicit=not first_hop or self.stranger)
                if entry is not None:
                    out["Authorization"] = "Basic " + base64.b64encode(f"{entry[0]}:{entry[1]}".encode()).decode()
                    carried.append(f"the {self.logins.netrc.path} entry for {_host(url)} (login {entry[0]!r})")
                    self.basic.add(netloc)
        cookie = self.logins.cookie_header(url)
        if cookie:
            out["Cookie"] = cookie
            carried.append(f"cookie {', '.join(self._cookie_names(url))}")
        self.sent[netloc] = " and ".join(carried) or "no credentials"
        if carried:
            self.credited.add(netloc)
        return out

    def answered(self, url: str, status: int, set_cookies: list[str], location: str | None = None) -> None:
        """Take what an answer to `url` says: its cookies, a completed login, a refused one."""
        self.logins.keep_cookies(url, set_cookies)
        netloc = _netloc(url)
        if status in _REFUSED:
            carried = self.sent.get(netloc, "no credentials")
            if status == 401 or netloc in self.credited:
                self._refuse(url, f"HTTP {status} from {netloc}; sent {carried}{self._missing(url, carried)}")
        elif location is not None and netloc in self.basic:
            there = urlsplit(location)
            if there.netloc and there.netloc.lower() != netloc and "code" in parse_qs(there.query):
                self.logged_in_at.add(netloc)  # a login host sent us back with a code: logged in
                self.logins.count("logins", netloc)
                log.info("logged in at %s for %s", netloc, there.netloc)

    def _missing(self, url: str, carried: str) -> str:
        if carried != "no credentials":
            if "bearer token" in carried:
                return " (the token was refused: expired or revoked? put a new one in the file)"
            if carried.startswith("cookie"):
                return " (the cookie was refused: an expired session? remove the --cookie-jar file)"
            return ""
        if self.logins.netrc.entry(_host(url), explicit=True) is None:
            return f" (no entry for {_host(url)} in {self.logins.netrc.path})"
        return ""

    def _cookie_names(self, url: str) -> str:
        names = self.logins.cookies.names_for(url) if self.logins._cookies is not None else []
        return ", ".join(names) if names else "(none kept)"

    def _refuse(self, url: str, why: str):
        netloc = _netloc(url)
        self.logins.count("login_failures", netloc)
        raise LoginFailed(f"login refused at {netloc} for {_netloc(self.origin)}: {why}")

    def redirect_refused(self, here: str, there: str) -> str | None:
        """Why a redirect from `here` to `there` is not followed, or None: the one decision of every
        http client of the mount (see the module's docstring). A followed hop to a host name that
        `guards` names must then reach a public address (addresses.py checks it as it connects)."""
        scheme, target = urlsplit(here).scheme, urlsplit(there)
        shown = f"{target.scheme}://{_netloc(there)}"
        if target.scheme not in ("http", "https"):
            return f"redirect to {shown} refused (not http or https)"
        if scheme == "https" and target.scheme == "http":
            return f"redirect from https down to http {shown} refused"
        if self.same_origin and not self.at_origin(there) and not self.logins.is_login_host(there):
            return f"redirect to another host {shown} refused (an index page is listed on its own origin only)"
        if self.signed and _netloc(there) != _netloc(here):
            return (f"redirect to another host {shown} refused (a signed s3 request: its signature and session "
                    "token would go along)")
        if self.unreachable(there):
            if self.public_only:
                return f"redirect to {shown} refused: {self.unreachable(there)}"
            return (f"redirect to another host {shown} refused: an address of this machine's own network "
                    "(loopback, link-local or private), from a chain that began elsewhere "
                    "(--allow-cross-host-redirects allows it)")
        return None

    def guards(self, url: str) -> str | None:
        """The host a hop to `url` may reach on public addresses only, or None: every hop of a chain
        that began at a url a document from a public address named (`Logins.reach_public_only`);
        else a hop to another host than the chain's own, not a login host, from a chain that did not
        begin inside this machine's network (unless --allow-cross-host-redirects)."""
        from refmount.fetch import addresses

        if self.public_only:
            return _host(url)
        if self.logins.allow_cross_host_redirects or _netloc(url) == _netloc(self.origin):
            return None
        if self.logins.is_login_host(url) or addresses.began_internal(_host(self.origin)):
            return None
        return _host(url)

    def why_guarded(self) -> str:
        """What a refused address says: the rule that guards this chain."""
        from refmount.fetch import addresses

        return PUBLIC_ONLY if self.public_only else addresses.REDIRECTED

    def unreachable(self, url: str) -> str | None:
        """Why a hop to `url` is refused before it is sent: an address literal inside this machine's
        network, where the chain is guarded (a name is judged as it resolves: addresses.py)."""
        from refmount.fetch import addresses

        host = urlsplit(url).hostname or ""
        if self.guards(url) and addresses.is_literal(host) and addresses.is_internal(host):
            return f"{host} is {addresses.INTERNAL}, {self.why_guarded()}"
        return None


PUBLIC_ONLY = "which a url named by a document from a public address may not reach"

_active: Logins | None = None


def install(logins: Logins) -> None:
    """Make `logins` the process's (a daemon serves one mount): the reference file's client uses it."""
    global _active
    _active = logins


def active() -> Logins:
    """The mount's Logins, or one from the environment alone (~/.netrc) when none was installed."""
    global _active
    if _active is None:
        _active = Logins()
    return _active


def _register_metrics() -> None:
    """Logins and credentials, each by host (fetch/registry.py); the cookies the jar holds."""
    from refmount.fetch.registry import at, register

    def by_host(key: str):
        def collect(stats: dict):
            for host, n in ((stats.get("logins") or {}).get(key) or {}).items():
                yield {"host": host}, n
        return collect

    for key, what in (("logins", "logins made (a login host's answer taken)"),
                      ("login_failures", "logins refused or failed"),
                      ("bearer_requests", "requests sent with a bearer token"),
                      ("s3_credential_refreshes", "temporary S3 credentials fetched"),
                      ("s3_credential_failures", "temporary S3 credentials that could not be fetched")):
        register(f"refmount_{key}_total", "counter", f"Logins and credentials: {what}, by host.", ("host",),
                 collect=by_host(key), component="fetch.auth")
    register("refmount_cookies", "gauge", "Cookies the mount's jar holds.", collect=at("logins", "cookies"),
             component="fetch.auth")


_register_metrics()
