"""Which addresses a redirect may lead to: the guard against a remote server steering the daemon into
the machine's own network (loopback, link-local such as the cloud metadata service 169.254.169.254,
private ranges).

auth.py decides which hops are guarded (a redirect to another host, from a chain that began on a
public address). A guarded hop to an address literal is judged there; a host name is judged here,
when the connection is made: every http client of the mount resolves names through `GuardedResolver`,
which resolves the name, checks every address it gets against the guard of the request in hand (a
context variable set around that hop) and hands aiohttp exactly the addresses it checked, so the
address connected to is one that was checked (a DNS answer that changes between a check and the
connection, "DNS rebinding", finds no gap). Answers are kept for DNS_TTL seconds here rather than in
aiohttp's own cache, which would skip this check. The stdlib engine (direct.py) connects through
`connection`, which does the same for its own sockets.

The same guard holds every request of a url that a document from a public address named (a catalog's
items and stores, a remote reference set's targets, a DMR++'s data file: fetch/trust.py records them
in the mount's Logins, auth.py's `Trail.guards` names them), for the mount's whole life: a name that
answered a public address when it was listed and answers 127.0.0.1 when its bytes are read is refused
as it connects.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import socket
import time

DNS_TTL = 300.0
_MAX_KEPT = 4096

# (the host a request in hand must reach on a public address only, why), or None: no guard
_GUARDED: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("refmount_public_only",
                                                                                   default=None)
REDIRECTED = "which a redirect from a public host may not lead to (--allow-cross-host-redirects allows it)"
_resolved: dict[str, tuple[float, tuple[str, ...]]] = {}  # host -> (when, the addresses last handed out)


class InternalAddress(OSError):
    """A guarded hop whose host resolves to an address of this machine's own network."""


def is_internal(address: str) -> bool:
    """Loopback, link-local, private, unspecified, multicast or reserved: anything not on the public
    internet (an IPv4-mapped IPv6 address is judged by its IPv4 address)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0].strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0].strip("[]"))
    except ValueError:
        return False
    return True


def began_internal(host: str, resolve: bool = False) -> bool:
    """Whether a chain whose first request went to `host` began inside the machine's network: an
    address literal that is internal, or a name every address of which (as last resolved for a
    connection; with `resolve`, else resolved now: not from the asyncio loop) is. Unknown: no (the
    guard applies)."""
    if not host:
        return False
    if is_literal(host):
        return is_internal(host)
    kept = _resolved.get(host.lower())
    if kept is None and resolve:  # (fetched on the stdlib engine, which keeps no answers: asked now)
        kept = (0.0, _addresses_of(host))
    return bool(kept and kept[1]) and all(is_internal(a) for a in kept[1])


@contextlib.contextmanager
def guarded(host: str | None, why: str = REDIRECTED):
    """While this block sends its request, a connection to `host` may reach public addresses only
    (`why`: what the refusal says)."""
    token = _GUARDED.set((host.lower(), why) if host else None)
    try:
        yield
    finally:
        _GUARDED.reset(token)


def check(host: str, addresses) -> None:
    """Refuse, if the request in hand is guarded for `host`, when any of its addresses is internal."""
    guard = _GUARDED.get()
    if guard is None or guard[0] != host.lower():
        return
    inside = [a for a in addresses if is_internal(a)]
    if inside:
        raise InternalAddress(f"{host} resolves to {inside[0]}, {INTERNAL}, {guard[1]}")


INTERNAL = "an address of this machine's own network (loopback, link-local or private)"


def connection(address: tuple, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None, **kwargs):
    """socket.create_connection for the stdlib engine (http.client's `_create_connection`): the name
    resolved once, every address checked against the guard of the request in hand, and only those
    addresses tried (no second lookup that could answer otherwise)."""
    host, port = address
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except UnicodeError as e:
        raise OSError(f"{host}: {e}") from None
    check(host, [info[4][0] for info in infos])
    error = None
    for family, kind, proto, _, where in infos:
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(where)
            return sock
        except OSError as e:
            sock.close()
            error = e
    raise error or OSError(f"{host}: no address to connect to")


def resolver():
    """An aiohttp resolver that checks each answer against the guard (use with use_dns_cache=False)."""
    from aiohttp.abc import AbstractResolver
    from aiohttp.resolver import DefaultResolver

    class GuardedResolver(AbstractResolver):
        def __init__(self) -> None:
            self._inner = DefaultResolver()

        async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET):
            key = host.lower()
            kept = _answers.get((key, port, family))
            if kept is not None and time.monotonic() - kept[0] < DNS_TTL:
                answer = kept[1]
            else:
                answer = await self._inner.resolve(host, port, family)
                if len(_answers) >= _MAX_KEPT:
                    _answers.clear()
                _answers[(key, port, family)] = (time.monotonic(), answer)
            addresses = tuple(a["host"] for a in answer)
            if len(_resolved) >= _MAX_KEPT:
                _resolved.clear()
            _resolved[key] = (time.monotonic(), addresses)
            check(host, addresses)
            return answer

        async def close(self) -> None:
            await self._inner.close()

    return GuardedResolver()


_answers: dict[tuple, tuple[float, list]] = {}  # (host, port, family) -> (when, aiohttp's resolve result)


def inside_from_outside(origin_host: str, target_host: str) -> str | None:
    """The internal address `target_host` is at, when a document from `origin_host` may not send the
    mount there: the document began outside this machine's network (began_internal) and the target
    is inside it (a literal, or a name resolved now). None otherwise (a name that does not resolve:
    its read fails on its own)."""
    if not target_host or target_host.lower() == origin_host.lower() or began_internal(origin_host):
        return None  # (its own host: where the document itself was fetched from)
    if is_literal(target_host):
        return target_host if is_internal(target_host) else None
    return next((a for a in sorted(_addresses_of(target_host)) if is_internal(a)), None)


def _addresses_of(host: str) -> tuple[str, ...]:
    """The addresses `host` resolves to now (none when it does not)."""
    try:
        return tuple({a[4][0] for a in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except (OSError, UnicodeError):
        return ()
