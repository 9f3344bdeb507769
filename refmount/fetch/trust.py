"""The one trust boundary: what a location may reach is decided by where it came from.

Every location that enters a mount is a `Location`: the mount's argument, each line of an @FILE
list, each file a glob, directory, s3:// prefix or http index page lists, each DMR++ and the data
file and chunk hrefs it names, each target of a reference set (JSON, Parquet records loaded
lazily, Icechunk virtual refs), each file a scan adds. A location is derived from the Location of
the document that named it (`Location.names`), and `Location.check` is the one decision of whether
a target may be used:

- with --allow-protocols, every protocol of the target's url chain must be listed (any alias of
  local files counts as 'file', see protocols.py);
- without it, a document from a remote origin never reaches a local file or a local-only fsspec
  protocol (`local://`, `memory://`, `simplecache::file://`, anything unknown), however it was
  listed: in an @FILE list, a glob, a DMR++ sidecar or a reference set. A local document (a path
  the user gave, a line of the user's own @FILE list) may name local files and remote urls; what a
  remote one of those names is then judged as remote;
- a remote document that began on a public address (its http(s) host answered none of this
  machine's own network's addresses when it was named, or a public one named it) stays on public
  addresses, names no host-naming protocol refmount cannot check (ftp, sftp, smb, webhdfs...:
  protocols.py) unless --allow-protocols lists it, and names no url at an
  address of this machine's own network (loopback, link-local such as 169.254.169.254, private), as
  its name resolves now; and each http(s) url it names is recorded in the mount's Logins as reached
  on public addresses only (auth.py `reach_public_only`), so that every request of it, for the
  mount's life, is checked as it connects (addresses.py), whatever its name answers later; one on
  another origin than the document's own gets none of the user's --remote-options headers, nor
  netrc's `default` entry (a stranger chose that host: auth.py).

The value also carries the mount's logins and limits, so that whoever fetches a location it names
fetches it with the mount's credentials and within the mount's bounds. This module lives at the
bottom layer (fetch/) because redirects, decided in fetch/, are locations too.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from refmount.errors import RefmountError
from refmount.fetch.protocols import HOST_NAMING_PROTOCOLS, is_local_protocol, protocol_chain, reaches_local
from refmount.fetch.stats import redact

LIST_PREFIX = "@"  # `@FILE`: a local text file of paths or urls, one a line
# fsspec wrappers that cache another url: as a document's location, the url they wrap decides
CACHE_WRAPPERS = frozenset({"simplecache", "filecache", "blockcache", "cached"})


class TargetRefused(RefmountError):
    """A target its document may not use (the message names both)."""


@dataclass(frozen=True)
class Policy:
    """What a mount allows, the same for every location in it."""

    allowed: frozenset | None = None  # --allow-protocols (None: remote documents reach no local file)
    logins: object = field(default=None, compare=False)  # the mount's credentials (fetch/auth.Logins)
    limits: object = field(default=None, compare=False)  # the mount's limits (memory, names, counts)
    hosts: dict = field(default_factory=dict, compare=False)  # what hosts were found to be, asked once each


@dataclass(frozen=True)
class Location:
    """A location in a mount: its url (or absolute path), the origin it came from (None: this
    machine; else 'scheme://host[:port]'), the document that named it (None: the mount's argument)
    and the mount's policy."""

    url: str
    origin: str | None
    named_by: str | None = None
    policy: Policy = Policy()
    public_only: bool = False  # named by a document that began on a public address: reached on those only

    @classmethod
    def argument(cls, arg: str, allow_protocols=None, *, logins=None, limits=None) -> "Location":
        """The mount's argument: a path, a url, or '@FILE' (a local list, shown with its absolute path)."""
        policy = Policy(frozenset(allow_protocols) if allow_protocols is not None else None, logins, limits)
        return cls(shown_location(arg), origin_of(arg), None, policy)

    @property
    def remote(self) -> bool:
        return self.origin is not None

    @functools.cached_property
    def began_public(self) -> bool:
        """A remote document whose chain began on a public address: named by one, or its own http(s)
        host not inside this machine's network (as first resolved; a name that does not resolve
        counts as public). Its targets are held to public addresses."""
        if self.public_only:
            return True
        if not self.remote or protocol_chain(self.url)[-1] not in ("http", "https"):
            return False  # (s3:// and the like: the user's own endpoint, not a host the url names)
        host = _hostname(self.url)
        known = self.policy.hosts.get(("began", host))
        if known is None:
            from refmount.fetch.addresses import began_internal

            known = self.policy.hosts[("began", host)] = not began_internal(host, resolve=True)
        if known:  # (and so does the document itself: fetched again by a --refresh, it stays there)
            self.logins().reach_public_only(self.url)
        return known

    def refusal(self, target: str) -> str | None:
        """Why this document may not use `target` (None: it may). The one decision."""
        allowed = self.policy.allowed
        if allowed is not None:
            for proto in protocol_chain(target):
                if proto not in allowed and not (is_local_protocol(proto) and "file" in allowed):
                    return (f"uses protocol {proto!r}, which --allow-protocols does not include "
                            f"(allowed: {', '.join(sorted(allowed))})")
        elif self.remote and reaches_local(target):
            return ("can reach local files, and a remote document may not: refused by default (add 'file' "
                    "to --allow-protocols to allow it)")
        elif self.began_public and (unchecked := HOST_NAMING_PROTOCOLS.intersection(protocol_chain(target))):
            return (f"uses protocol {min(unchecked)!r}, whose connections refmount cannot hold to public addresses, "
                    "and a document from a public address may not: refused by default (add it to --allow-protocols "
                    "to allow it)")
        inside = self._inside(target) if _held_to_public(target) and self.began_public else None
        if inside:
            from refmount.fetch.addresses import INTERNAL

            return f"is at {inside}, {INTERNAL}, which a document from outside it may not name"
        return None

    def _inside(self, target: str) -> str | None:
        """The internal address `target`'s host is at now (asked once a host), or None."""
        from refmount.fetch.addresses import inside_from_outside

        key = (_hostname(self.url), _hostname(target))
        if key not in self.policy.hosts:
            self.policy.hosts[key] = inside_from_outside(*key)
        return self.policy.hosts[key]

    def check(self, target: str) -> None:
        """Raise TargetRefused (one line naming the target and this document) unless it may be used;
        a target of a document that began on a public address is then reached on public addresses
        only, at every request (the fetchers' Logins hold it: fetch/auth.py)."""
        why = self.refusal(target)
        if why is not None:
            raise TargetRefused(f"target {redact(target)!r} named by {self.describe()} {why}")
        if _held_to_public(target) and self.began_public:
            self.logins().reach_public_only(target, stranger=origin_of(target) != self.origin)

    def logins(self):
        """The mount's Logins (fetch/auth.py): the policy's, else the process's."""
        if self.policy.logins is not None:
            return self.policy.logins
        from refmount.fetch.auth import active

        return active()

    def names(self, target: str) -> "Location":
        """The Location of `target` as named by this document (checked first): a local document's
        remote url is judged as remote from then on, and a remote one never names a local one."""
        self.check(target)
        return Location(target, origin_of(target), self.url, self.policy, self.began_public)

    def describe(self) -> str:
        where = "remote" if self.remote else "local"
        return f"{where} {redact(self.url)!r}"


def _held_to_public(target: str) -> bool:
    """A url whose host is where its requests connect (http(s)): the address rule holds it."""
    return target[:8].lower().startswith(("http://", "https://"))


def _hostname(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def origin_of(location: str) -> str | None:
    """None for a location on this machine (a path, file://, local://, an @FILE list), else the
    'scheme://host[:port]' it comes from. A chain (simplecache::https://...) is its last url's; a
    protocol not known to be local counts as remote (its content is not the user's own file)."""
    if location.startswith(LIST_PREFIX):
        return None
    chain = protocol_chain(location)
    if all(p in ("file", "local") or p in CACHE_WRAPPERS for p in chain):
        return None
    last = location if len(chain) == 1 else location.rpartition("::")[2]  # ('::' in an IPv6 host)
    scheme = chain[-1]
    if "://" not in last:  # a chain ending in a bare path behind a protocol not known to be local
        return f"{chain[0]}://"
    try:
        netloc = urlsplit(last).netloc.lower()
    except ValueError:  # (an invalid IPv6 literal): the whole text after the scheme's '//' up to '/'
        netloc = last.partition("://")[2].split("/", 1)[0].lower()
    return f"{scheme}://{netloc.rpartition('@')[2]}"


def shown_location(arg: str) -> str:
    """The argument as `refmount list`, findmnt and the mount message show it: urls as given, paths
    absolute, an @FILE list as '@' and its absolute path."""
    if arg == "/dev/stdin":
        return "stdin"
    if arg.startswith(LIST_PREFIX):
        return LIST_PREFIX + os.path.abspath(arg[len(LIST_PREFIX):])
    if origin_of(arg) is None and "::" not in arg and (arg.startswith("file://") or "://" not in arg):
        return os.path.abspath(arg[len("file://"):] if arg.startswith("file://") else arg)
    return arg
