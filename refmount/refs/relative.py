"""Relative target paths (`"x/0": ["0.bin", 0, 1]`, as GDAL's own kerchunk tests write them) resolve
against where the reference set lives, as GDAL's /vsikerchunk does (VSIKerchunkMorphURIToVSIPath):

- a target is relative when it has no scheme (`://`), is no fsspec url chain (`::`) and does not
  start with `/` (GDAL's CPLIsFilenameRelative, less Windows drive letters);
- a JSON set's relative targets resolve against the directory (or url) of the reference file:
  `/data/refs.json` -> `/data/0.bin`, `https://host/dir/refs.json?sig` -> `https://host/dir/0.bin`;
- a Parquet set's resolve against the directory of the record file that holds them
  (`<root>/<array>/refs.0.parq`), as GDAL resolves them;
- a set read from a pipe or stdin (and a dict given to the Python API, which travels on stdin) has
  no directory of its own: its relative targets resolve against the working directory, as fsspec
  resolves every relative target.

Before this they resolved against the daemon's working directory, so such a set read right only when
`refmount mount` ran from that directory, never under systemd or fstab.

A relative target stays on the reference set's own scheme and host: `..` segments stop at the url's
root (RFC 3986), and a target starting with `/` is absolute, never relative. So a relative target of
a remote set is a url of the same remote (subject to --allow-protocols like any other), never a
local file.
"""

from __future__ import annotations

import logging
import os

from refmount.fetch.protocols import is_remote, local_path

log = logging.getLogger("refmount")


def is_relative(url: str) -> bool:
    return bool(url) and "://" not in url and "::" not in url and not url.startswith("/")


def base_of(location: str) -> str:
    """What relative targets of the reference file at `location` resolve against: a directory path
    or url prefix ending in '/'."""
    location = location.rpartition("::")[2]  # a chain (simplecache::https://...): the last url is the file's
    if is_remote(location):
        scheme, _, rest = location.partition("://")
        rest = rest.split("?", 1)[0].split("#", 1)[0]
        host, _, path = rest.partition("/")
        directory = path.rpartition("/")[0]
        return f"{scheme}://{host}/{directory}/" if directory else f"{scheme}://{host}/"
    path = os.path.abspath(local_path(location))
    if path.startswith(("/dev/", "/proc/")):
        return os.getcwd().rstrip("/") + "/"  # stdin, a pipe (<(...)): no directory of its own
    return os.path.dirname(path).rstrip("/") + "/"


def resolve(url: str, base: str) -> str:
    """`url` made absolute against `base` (from `base_of`); absolute urls are returned unchanged."""
    if not is_relative(url):
        return url
    if not is_remote(base):
        return os.path.normpath(base + url)
    scheme, _, rest = base.partition("://")
    host, _, base_path = rest.partition("/")
    path, sep, tail = url.partition("?")
    return f"{scheme}://{host}{_remove_dot_segments('/' + base_path + path)}{sep}{tail}"


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4 for a path starting with '/': '.' and '..' segments go, '..' never
    above the root; empty segments (meaningful in object keys: 'a//b') stay."""
    out: list[str] = []
    for segment in path.split("/")[1:]:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    return "/" + "/".join(out)


class RelativeTargets:
    """Resolves the relative targets of one reference set against one base, logging once."""

    def __init__(self, location: str) -> None:
        self.location = location
        self._logged = False

    def resolve_all(self, urls: list, base: str) -> list:
        """`urls` (None entries: no url) with the relative ones resolved against `base`."""
        example = next((url for url in urls if url is not None and is_relative(url)), None)
        if example is None:
            return urls
        if not self._logged:
            self._logged = True
            log.info("reference set %s uses relative target paths (e.g. %r -> %r): they resolve against %s, as "
                     "GDAL resolves them", self.location, example, resolve(example, base), base)
        return [url if url is None else resolve(url, base) for url in urls]


def resolve_builder_urls(builder, location: str) -> None:
    """Resolve the relative targets of a loaded JSON set (a `RefSetBuilder`) against its file."""
    if any(map(is_relative, builder.urls)):
        builder.remap_urls(RelativeTargets(location).resolve_all(builder.urls, base_of(location)))

