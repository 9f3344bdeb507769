"""Virtual chunk containers of an Icechunk repository: which urls its virtual chunks may have, how a
relative `vcc://` url resolves, and whom the user has authorised to serve them.

Icechunk's rules, followed here (icechunk/src/virtual_chunks.rs, icechunk-format/src/manifest.rs):
- The configuration lists containers by url prefix, each with a store type (http, s3, s3_compatible,
  tigris, gcs, azure, local_file_system) and, since format spec 2, an optional unique name. A prefix
  gets a trailing `/`; a container whose prefix scheme does not fit its store type (or lacks a host,
  or is a `file://` prefix with `.`/`..` segments) is ignored with a warning.
- A chunk url `vcc://NAME/path` is the named container's prefix + `path`. Any url then belongs to the
  container with the longest prefix it starts with (matching on the url with its dot segments
  resolved and percent-escapes decoded); none -> the chunk cannot be read.
- **Authorisation.** A repository's configuration is written by whoever wrote the repository, so
  Icechunk reads no virtual chunk from a container that its user did not authorise by url prefix
  (`authorize_virtual_chunk_access`), and names are never enough. refmount: `--authorize-container
  PREFIX`; a mount whose snapshot uses a container not authorised is refused, naming the prefixes.
- **Credentials.** Icechunk's s3 containers carry their endpoint, region and anonymity; the
  credentials are the user's. refmount reads every s3:// url with --remote-options, so a container on
  another S3 endpoint (s3_compatible, tigris) is refused unless --remote-options names that endpoint:
  the user's credentials never go to an endpoint that only the repository named.
- **Re-pointing.** As `RepositoryConfig.set_virtual_chunk_container` with a container of the same
  name (Icechunk's way to move data without rewriting manifests), `--container NAME=PREFIX` replaces
  the named container for this mount: its relative urls resolve under the new prefix, read with the
  backend refmount has for that prefix's protocol.

What is fetched is what was matched: `file://` paths are read as their normalised, decoded local path;
object-store keys are decoded (Icechunk fetches the decoded key); http(s) urls are sent as written.
A url with `.` or `..` segments outside `file://` is refused (an object key would not mean what its
match did).
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from refmount.errors import RefmountError, RefsError, quote

log = logging.getLogger("refmount")

VCC = "vcc://"
_HOSTED = {"s3", "gcs", "gs", "az", "azure", "abfs", "tigris", "http", "https"}
_FITS = {  # url scheme -> store types Icechunk accepts for it
    "s3": {"s3", "s3_compatible", "tigris"}, "tigris": {"tigris"}, "gcs": {"gcs"}, "gs": {"gcs"},
    "az": {"azure"}, "azure": {"azure"}, "abfs": {"azure"}, "http": {"http"}, "https": {"http"},
    "file": {"local_file_system"},
}
_FETCH_SCHEME = {"tigris": "s3", "azure": "az", "gcs": "gs"}  # as fsspec names them
_S3_STORES = {"s3", "s3_compatible", "tigris"}
TIGRIS_ENDPOINT = "https://t3.storage.dev"


@dataclass
class Container:
    prefix: str  # ends with "/"
    name: str | None
    store: str  # store type, "" for a container re-pointed by the user
    options: dict = field(default_factory=dict)

    @property
    def matchable(self) -> str:
        """The prefix as urls are matched against it (a prefix may be written percent-encoded, or not)."""
        return _matchable(self.prefix)

    def describe(self) -> str:
        return quote(self.prefix) + (f" (container {self.name!r})" if self.name else "")


def store_type(store) -> tuple[str, dict]:
    """serde's form of ObjectStoreConfig: a unit variant is its name, others {name: options}."""
    if isinstance(store, str):
        return store, {}
    if isinstance(store, dict) and len(store) == 1:
        kind, options = next(iter(store.items()))
        return str(kind), options if isinstance(options, dict) else {}
    return "", {}


def prefix_problem(prefix: str, store: str | None) -> str | None:
    """Why Icechunk would refuse this prefix for this store type (None: fine). `store` None: any."""
    parts = urlsplit(prefix)
    scheme = parts.scheme.lower()
    if scheme not in _FITS:
        return f"url scheme {scheme or '(none)'!r} is not one of a virtual chunk container"
    if store is not None and store not in _FITS[scheme]:
        return f"url scheme {scheme!r} does not fit store type {store!r}"
    if scheme in _HOSTED and not parts.netloc:
        return "the url has no host"
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or len(parts.path) < 2:
            return "a file:// prefix needs an absolute local path"
        if any(s in (".", "..") for s in parts.path.split("/")):
            return "a file:// prefix must be canonical (no . or .. segments)"
    return None


def _with_slash(prefix: str) -> str:
    return prefix if prefix.endswith("/") else prefix + "/"


def _matchable(url: str) -> str:
    """The url as Icechunk matches it against prefixes: scheme (and host of http and file) lower
    case, dot segments resolved, percent-escapes decoded."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    netloc = parts.netloc.lower() if scheme in ("http", "https", "file") else parts.netloc
    path = parts.path
    if path:
        kept = posixpath.normpath(path) if path.startswith("/") else path
        path = kept + ("/" if path.endswith("/") and not kept.endswith("/") else "")
        path = "/" + path.lstrip("/") if path.startswith("//") else path
    return unquote(f"{scheme}://{netloc}{path}")


class Containers:
    """The containers of one repository (after the user's re-pointing), and the ones its chunks use."""

    def __init__(self, config: dict, location: str, repoint: dict[str, str] | None = None) -> None:
        self.location = location
        self.used: dict[str, Container] = {}
        containers: list[Container] = []
        listed = config.get("virtual_chunk_containers") or {}
        for key, value in (listed.items() if isinstance(listed, dict) else []):
            if not isinstance(value, dict):
                continue
            kind, options = store_type(value.get("store"))
            prefix = _with_slash(str(value.get("url_prefix") or key))
            name = value.get("name") or None
            problem = prefix_problem(prefix, kind)
            if name is not None and (not isinstance(name, str) or "/" in name):
                problem = f"its name {name!r} is not a container name"
            if problem:
                log.warning("Icechunk repository %s: ignoring virtual chunk container %s: %s (as Icechunk does)",
                            location, quote(prefix), problem)
                continue
            containers.append(Container(prefix, name, kind, options))
        for name, prefix in (repoint or {}).items():
            if not any(c.name == name for c in containers):
                names = ", ".join(sorted(repr(c.name) for c in containers if c.name)) or "none"
                raise RefsError(f"--container {name}=...: Icechunk repository {quote(location)} has no virtual "
                                f"chunk container named {name!r} (named containers: {names})")
            prefix = _with_slash(prefix)
            problem = prefix_problem(prefix, None)
            if problem:
                raise RefsError(f"--container {name}={prefix}: {problem}")
            containers = [c for c in containers if c.name != name and c.prefix != prefix]
            containers.append(Container(prefix, name, ""))
            log.info("Icechunk repository %s: virtual chunk container %r re-pointed to %s", location, name, prefix)
        self.by_name = {c.name: c for c in containers if c.name}
        self.containers = sorted(containers, key=lambda c: -len(c.matchable))  # longest prefix first

    def resolve(self, location: str, array_path: str) -> str:
        """The url refmount fetches for a chunk location, or a one-line error naming it."""
        where = f"virtual chunk url {quote(location)} of array {quote(array_path or '/')}"
        absolute = location
        if location[:len(VCC)].lower() == VCC:
            name, slash, rest = location[len(VCC):].partition("/")
            named = self.by_name.get(name) if slash else None
            if named is None:
                names = ", ".join(sorted(repr(n) for n in self.by_name)) or "none"
                raise RefsError(f"{where} names no virtual chunk container of the repository's configuration "
                                f"(named containers: {names})")
            absolute = named.prefix + rest
        container = self._match(absolute)
        if container is None:
            restored = self._port_restored(absolute)
            if restored is not None:
                absolute, container = restored
        if container is None:
            raise RefsError(f"{where} is not under any virtual chunk container of the repository's configuration")
        url = fetch_url(absolute, where)
        self.used.setdefault(container.prefix, container)
        return url

    def _match(self, url: str) -> Container | None:
        try:
            matchable = _matchable(url)
        except ValueError:
            return None
        return next((c for c in self.containers if matchable.startswith(c.matchable)), None)

    def _port_restored(self, url: str) -> tuple[str, Container] | None:
        """Icechunk before 2.1 stored virtual urls without their port (http://host:8080/x.nc as
        http://host/x.nc; earth-mover/icechunk#2223): a url matching exactly one container once that
        container's port is left out gets the port back."""
        candidates = []
        for c in self.containers:
            parts = urlsplit(c.prefix)
            if parts.port is not None:
                portless = c.prefix.replace(parts.netloc, parts.netloc.rsplit(":", 1)[0], 1)
                if url.startswith(portless):
                    candidates.append((c.prefix + url[len(portless):], c))
        return candidates[0] if len(candidates) == 1 else None


def fetch_url(url: str, where: str) -> str:
    """What refmount reads for a matched url (see the module's notes)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        path = unquote(posixpath.normpath(parts.path))
        return path
    segments = parts.path.split("/")[1:]
    if any(s in (".", "..") for s in segments):
        raise RefsError(f"{where} has '.' or '..' path segments, which refmount does not read (a server and "
                        "an object store would disagree on the object they name)")
    if scheme in ("http", "https"):
        return url
    return f"{_FETCH_SCHEME.get(scheme, scheme)}://{unquote(parts.netloc)}/{unquote(parts.path.lstrip('/'))}"


def parse_repoint(values) -> dict[str, str]:
    """--container NAME=PREFIX values (each may hold several, comma-separated, or be a JSON object
    {name: prefix}, as the Python API and config files pass a dict) -> {name: prefix}."""
    import json

    out: dict[str, str] = {}
    for value in values or ():
        if str(value).lstrip().startswith("{"):
            try:
                pairs = json.loads(value)
            except ValueError:
                raise RefmountError(f"--container {value!r}: not a JSON object of name: url prefix") from None
            if not isinstance(pairs, dict):
                raise RefmountError(f"--container {value!r}: not a JSON object of name: url prefix")
            out.update({str(k): str(v) for k, v in pairs.items()})
            continue
        for item in str(value).split(","):
            item = item.strip()
            if not item:
                continue
            name, eq, prefix = item.partition("=")
            if not eq or not name or not prefix:
                raise RefmountError(f"--container {item!r}: expected NAME=URL_PREFIX")
            out[name] = prefix
    return out


def parse_authorized(values) -> set[str]:
    """--authorize-container PREFIX values (each may hold several, comma-separated)."""
    return {_with_slash(p.strip()) for value in values or () for p in str(value).split(",") if p.strip()}


def _endpoint(url: str | None) -> str | None:
    return url.rstrip("/").lower() if url else None


def check_authorized(used: dict[str, Container], authorized: set[str], remote_options: dict, location: str) -> None:
    """Refuse a mount whose virtual chunks come from containers the user has not authorised, or from
    an S3 endpoint other than the one --remote-options sends the user's credentials to."""
    missing = [c for prefix, c in sorted(used.items()) if prefix not in authorized]
    if missing:
        shown = ", ".join(c.describe() for c in missing)
        raise RefmountError(
            f"Icechunk repository {quote(location)} reads virtual chunks from {shown}, not authorised: pass "
            f"--authorize-container {','.join(c.prefix for c in missing)} to read them (Icechunk's "
            "authorize_virtual_chunk_access)")
    given = _endpoint(remote_options.get("endpoint_url")
                      or (remote_options.get("client_kwargs") or {}).get("endpoint_url"))
    for c in used.values():
        if c.store not in _S3_STORES:
            continue
        wanted = _endpoint(c.options.get("endpoint_url") or (TIGRIS_ENDPOINT if c.store == "tigris" else None))
        if wanted and wanted != given:
            raise RefmountError(
                f"virtual chunk container {c.describe()} of Icechunk repository {quote(location)} is on the S3 "
                f"endpoint {wanted}, and --remote-options sends s3 requests (and credentials) to "
                f"{given or 'AWS'}: pass --remote-options with \"endpoint_url\": \"{wanted}\" to read it")
        if not wanted and given:
            log.warning("virtual chunk container %s is on AWS S3 in the repository's configuration; reading it "
                        "from %s as --remote-options say", c.describe(), given)
