"""SOURCE -> the data files it names: one file, a glob (local, s3://, or http(s):// through the server's
HTML index, nginx's or Apache's autoindex), a directory or s3:// prefix (every file below it), @FILE
(a text file of paths or urls, one a line), or a catalog (STAC, THREDDS, CMR: catalogs.py).

An http(s) listing follows only links on the same origin and under the listed directory's path, and
reads at most MAX_INDEX_BYTES of each index page and MAX_ENTRIES entries in all.
"""

from __future__ import annotations

import datetime
import functools
import glob
import logging
import os
import re
import time
from html.parser import HTMLParser
from urllib.parse import unquote, urljoin, urlsplit

from refmount.errors import RefmountError, quote
from refmount.fetch.protocols import is_remote, local_path, protocol_of
from refmount.fetch.stats import redact
from refmount.refs.scan.entry import Entry  # noqa: F401 (the listings' unit, imported from here too)

log = logging.getLogger("refmount")

MAX_INDEX_BYTES = 16 << 20
MAX_ENTRIES = 1_000_000
MAX_DEPTH = 16
REFERENCE_SUFFIXES = (".dmrpp", ".json", ".json.gz", ".json.bz2", ".json.xz", ".json.zst", ".json.zstd", ".parq", ".parquet",
                      ".gz", ".bz2", ".xz", ".zst", ".zstd")


DMRPP_SUFFIX = ".dmrpp"
IDX_SUFFIX = ".idx"
SIDECAR_SUFFIXES = (DMRPP_SUFFIX, IDX_SUFFIX)


def pair_sidecars(found: list[tuple[Entry, str]]) -> list[tuple[Entry, str]]:
    """Sidecars, read instead of their data file's header: OPeNDAP's DMR++ (`X.dmrpp` describes X) and
    NOAA's GRIB2 inventories (`X.idx` gives the messages of X; refs/scan/gribidx.py). Listed beside `X`,
    a sidecar becomes X's `sidecar`; a lone DMR++ stands for its data file (its dmrpp:href names it), a
    lone idx is left out (it indexes nothing that is listed). On (entry, path below the listed root)
    pairs, before naming: a lone DMR++ is named as its data file."""
    by_url = {e.url: e for e, _ in found}
    out = []
    for entry, rel in found:
        suffix = next((s for s in SIDECAR_SUFFIXES if entry.url.endswith(s)), None)
        data = by_url.get(entry.url[: -len(suffix)]) if suffix else None
        if suffix is None or data is not None and data.url.endswith(SIDECAR_SUFFIXES):
            out.append((entry, rel))  # (a data file, or `X.dmrpp.idx`: no sidecar of a sidecar)
        elif data is not None:
            data.sidecar = entry.url
            data.sidecar_listed = (entry.size, entry.version) if entry.size is not None and entry.version else ()
        elif suffix == DMRPP_SUFFIX:
            entry.sidecar = entry.url
            entry.name = entry.name.removesuffix(suffix)
            out.append((entry, rel.removesuffix(suffix)))
    return out


def has_glob(location: str) -> bool:
    path = urlsplit(location).path if protocol_of(location) in ("http", "https") else location
    chars = "*[" if protocol_of(location) in ("http", "https") else "*?["
    return any(c in path for c in chars)


def looks_like_many(location: str, remote_options: dict | None = None) -> bool:
    """A source that names several files by its form alone: @FILE, a glob, an s3:// prefix, a local
    directory that is no reference set, Zarr store or Icechunk repository, an http(s) directory
    (`http://host/dir/`) that is neither a Parquet set (its `.zmetadata`, asked once: refs/source.py)
    nor an Icechunk repository (refs/icechunk.py asks), a catalog (refs/scan/catalogs.py: STAC, THREDDS, CMR)."""
    if location.startswith("@"):
        return True
    if has_glob(location):
        return True
    from refmount.refs.scan.catalogs import catalog_kind

    if catalog_kind(location) is not None:  # a STAC, THREDDS or CMR catalog, told by its url alone
        return True
    if protocol_of(location) in ("s3", "s3a") and location.endswith("/"):
        return True
    if protocol_of(location) in ("http", "https") and location.endswith("/"):
        from refmount.refs.icechunk import is_icechunk_location
        from refmount.refs.source import is_parquet_location

        return not is_parquet_location(location, remote_options) and not is_icechunk_location(location, remote_options)
    if not is_remote(location):
        root = local_path(location)
        if not os.path.isdir(root):
            return False
        markers = (".zmetadata", "zarr.json", ".zgroup", ".zarray", "repo", "refs", "snapshots")
        return not any(os.path.exists(os.path.join(root, m)) for m in markers)
    return False


def may_be_data_file(location: str) -> bool:
    """A single location worth sniffing: not a directory form, not named like a reference file."""
    if location.startswith("@") or has_glob(location) or location == "/dev/stdin":
        return False
    name = location.rstrip("/").lower()
    if location.endswith("/") or name.endswith(REFERENCE_SUFFIXES):
        return False
    if not is_remote(location):
        return os.path.isfile(local_path(location))
    return protocol_of(location) in ("http", "https", "s3", "s3a")


def _named(found: list[tuple[Entry, str]], source: str, sidecars: bool) -> list[Entry]:
    """The one end of every listing: (entry, path below the listed root) pairs paired with their DMR++
    sidecars (`sidecars`), then named. Each file is named after itself; files of the same name (in
    different directories) by their path below the listed root, '/' shown as '~'. Every name comes from
    outside (a server, a bucket, a list, a file system): one that name_problem refuses, or that another
    file has already, is left out with one log line naming `source`; the listing goes on."""
    from refmount.refs.model import name_problem  # (numpy: not for a listing begun early, ask_first_page)

    if sidecars:
        found = pair_sidecars(found)
    seen: dict[str, int] = {}
    for entry, _ in found:
        seen[entry.name] = seen.get(entry.name, 0) + 1
    out, taken = [], set()
    for entry, rel in found:
        if seen[entry.name] > 1 and name_problem(entry.name) is None:
            entry.name = rel.strip("/").replace("/", "~")
        problem = name_problem(entry.name) or ("is another file's name too" if entry.name in taken else None)
        if problem is not None:
            left_out(source, entry.name, problem)
            continue
        taken.add(entry.name)
        out.append(entry)
    return out


def left_out(source: str, name: str, problem: str) -> None:
    log.warning("%s: a file name %s %s; left out of the mount", redact(source), quote(name), problem)


def _basename(url: str) -> str:
    path = urlsplit(url).path if is_remote(url) else url
    return unquote(path.rstrip("/").rsplit("/", 1)[-1])


def _too_many(location: str) -> RefmountError:
    return RefmountError(f"{quote(location)} names more than {MAX_ENTRIES:,} files")


def list_sources(location: str, remote_options: dict | None = None, headers: dict | None = None,
                 sidecars: bool = False, strict: bool = False) -> list[Entry]:
    """The data files `location` names, in a stable (sorted) order, each under a name checked by
    name_problem. `sidecars`: a glob also lists the DMR++ `X.dmrpp` of each `X` it matches (`*.nc` names
    the data files; their sidecars sit beside them), and each is paired with its file (pair_sidecars).
    `strict` (--strict): a catalog's item that is gone or not valid STAC fails the listing."""
    from refmount.refs.scan.catalogs import catalog_kind, list_catalog

    if location.startswith("@"):
        found = _list_file_of_paths(location[1:])
    elif catalog_kind(location) is not None:
        found = list_catalog(location, headers or {}, strict)
    elif protocol_of(location) in ("http", "https"):
        found = _list_http(location, headers or {}, sidecars)
    elif protocol_of(location) in ("s3", "s3a"):
        found = _list_s3(location, remote_options or {}, sidecars)
    elif is_remote(location):
        raise RefmountError(f"cannot list {quote(redact(location))}: globs and directories work for local paths, "
                            "s3:// and http(s):// only")
    else:
        found = _list_local(local_path(location), sidecars)
    return _named(found, location, sidecars)


def _list_file_of_paths(path: str) -> list[tuple[Entry, str]]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f]
    except OSError as e:
        raise RefmountError(f"cannot read the list of files {quote('@' + path)}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise RefmountError(f"the list of files {quote('@' + path)} is not UTF-8 text") from None
    urls = [line for line in lines if line and not line.startswith("#")]
    if len(urls) > MAX_ENTRIES:
        raise _too_many("@" + path)
    base = os.path.dirname(os.path.abspath(path))
    urls = [u if is_remote(u) or os.path.isabs(local_path(u)) else os.path.join(base, u) for u in urls]
    urls = list(dict.fromkeys(urls))
    return [(Entry(_basename(u), u), urlsplit(u).path if is_remote(u) else u) for u in urls]


def _list_local(path: str, sidecars: bool = False) -> list[tuple[Entry, str]]:
    if has_glob(path):
        base = _glob_base(path)
        patterns = [path, *(path + s for s in SIDECAR_SUFFIXES)] if sidecars else [path]
        found = sorted({p for pattern in patterns for p in glob.iglob(pattern, recursive=True) if os.path.isfile(p)})
    elif os.path.isdir(path):
        base = path
        found = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            found += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
            if len(found) > MAX_ENTRIES:
                raise _too_many(path)
    else:
        raise RefmountError(f"{quote(path)} does not exist")
    if len(found) > MAX_ENTRIES:
        raise _too_many(path)
    paths = [os.path.abspath(p) for p in found]
    return [(Entry(os.path.basename(p), p), os.path.relpath(q, base)) for p, q in zip(paths, found)]


def _glob_base(pattern: str) -> str:
    """The directory part of a pattern before its first glob character."""
    first = min(i for i, c in enumerate(pattern) if c in "*?[")
    return pattern[:first].rpartition("/")[0] or "/"


# -- patterns over listings (http, s3): '*', '?', '[...]' within a segment, '**' across segments ------

@functools.lru_cache(maxsize=64)
def _segment_regex(segment: str) -> re.Pattern:
    """(kept: a listing of 400 names translated its pattern 600 times, 6 ms of a warm mount)"""
    import fnmatch

    return re.compile(fnmatch.translate(segment))


def matches(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(matches(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and bool(_segment_regex(pattern[0]).match(parts[0])) and matches(pattern[1:], parts[1:])


# -- http(s): the server's HTML index -----------------------------------------------------------------

class _Links(HTMLParser):
    """The links of an index page, each with the text that follows it up to the next link (where
    nginx and Apache write the file's date and size)."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.after: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            for name, value in attrs:
                if name == "href" and value:
                    self.hrefs.append(value)
                    self.after.append("")

    def handle_endtag(self, tag):
        if tag == "a" and self.after:
            self.after[-1] = " "  # (from here on: the text after the link, not its name)

    def handle_data(self, data):
        if self.after and self.after[-1] and len(self.after[-1]) < 200:
            self.after[-1] += data


# nginx's autoindex (html): "29-Nov-2026 07:18   324130"; Apache's: "2026-11-29 07:18  317K" (in a table).
_NGINX_DATE = re.compile(r"^\s*(\d{2})-([A-Z][a-z]{2})-(\d{4}) (\d{2}):(\d{2})\s+(\S+)")
_APACHE_DATE = re.compile(r"^\s*(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2})(?::\d{2})?\s+(\S+)")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), 1)}
SETTLED = 86400  # seconds: a file listed as modified more recently (or in the future) is identified by a HEAD


def listed_version(text: str, now: float | None = None) -> tuple[int | None, str | None]:
    """(size, version) of a file from the text after its link on an nginx or Apache index page:
    its size in bytes and 'listed DATE' when the page gives both, exactly, else (None, None).

    The date is to the minute and in the server's time zone (unknown), so it names a version only
    for a file that has settled: one modified more than a day ago (SETTLED, by our clock). A file
    changed in place later gets another date; one modified within the last day may still change
    within its minute, and is identified by a HEAD (its ETag or Last-Modified, to the second) as
    before. What is left: a file rewritten to the same size with its old date set back (rsync -t
    of another file of the same size does so) is not seen, as rsync's own quick check does not."""
    m = _NGINX_DATE.match(text)
    if m:
        day, month, year, hour, minute, size = m.groups()
        month = _MONTHS.get(month)
    else:
        m = _APACHE_DATE.match(text)
        if not m:
            return None, None
        year, month, day, hour, minute, size = m.groups()
    if not size.isdigit() or not month:  # ('-' for a directory; '317K' or '1.2M' is no size to read by)
        return None, None
    try:
        when = datetime.datetime(int(year), int(month), int(day), int(hour), int(minute),
                                 tzinfo=datetime.timezone.utc).timestamp()
    except (ValueError, OverflowError):
        return None, None
    if (now or time.time()) - when <= SETTLED:
        return None, None
    return int(size), f"listed {int(year):04d}-{int(month):02d}-{int(day):02d} {hour}:{minute}"


def _fetch_index(url: str, headers: dict) -> tuple[str, str]:
    """(final url, text) of an index page, through the mount's HTTP engine and logins (its bearer
    tokens, cookies, netrc; the user's headers to the listed origin only); redirects as auth.py's
    `Trail` decides, and only within the same origin (or through a login host and back)."""
    from refmount.errors import FetchError, LoginFailed, Unavailable
    from refmount.fetch.pages import fetch_page
    from refmount.fetch.retry import passing

    try:
        final, kind, body = fetch_page(url, MAX_INDEX_BYTES, {"headers": headers}, same_origin=True)
    except FetchError as e:
        why = str(e).removeprefix(f"{redact(url)}: ")
        if isinstance(e, LoginFailed) or getattr(e, "status", None) in (401, 403):
            raise RefmountError(f"cannot list {quote(redact(url))}: access refused: {why}") from None
        # (a server down that may come back: asked again; a 404 or 410, a certificate, is an answer)
        kind = Unavailable if passing(e) is not None else RefmountError
        raise kind(f"cannot list {quote(redact(url))}: {why}") from None
    if _origin(final) != _origin(url):  # (after a login host, the chain must come back home)
        raise RefmountError(f"listing {quote(redact(url))}: redirected to another host ({redact(final)}), "
                            "which is not followed")
    if "html" not in kind.lower() and not body.lstrip()[:1] == b"<":
        raise RefmountError(f"{quote(redact(url))} is not an HTML index of files (Content-Type {kind!r})")
    return final, body.decode("utf-8", "replace")


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


def index_links(page_url: str, html: str) -> tuple[list[str], list[str]]:
    """(files, directories) linked from an index page, as absolute urls on the same origin and under
    the page's path; sorting links (Apache's ?C=N;O=D), the parent and anything else are left out. A
    link whose name, once decoded, name_problem refuses ('..%2fx', '%2e%2e/', 'a%00') is left out with a
    log line: the server would resolve it elsewhere, and no directory of the mount can be named so."""
    files, dirs, _ = index_entries(page_url, html)
    return files, dirs


def index_entries(page_url: str, html: str) -> tuple[list[str], list[str], dict]:
    """index_links's (files, directories), and {file url: (size, version)} for the files whose date and
    size the page gives (listed_version)."""
    from refmount.refs.model import name_problem

    parser = _Links()
    parser.feed(html)
    base = page_url if page_url.endswith("/") else page_url + "/"
    base_path = urlsplit(base).path
    files, dirs, listed = [], [], {}
    now = time.time()
    for href, after in zip(parser.hrefs, parser.after):
        if "?" in href or "#" in href:
            continue
        url = urljoin(base, href)
        parts = urlsplit(url)
        if _origin(url) != _origin(base) or not parts.path.startswith(base_path) or parts.path == base_path:
            continue
        rest = parts.path[len(base_path):]
        if "/" in rest.rstrip("/"):
            continue  # not a direct child
        problem = name_problem(unquote(rest.rstrip("/")))
        if problem is not None:
            left_out(page_url, unquote(rest.rstrip("/")), problem)
            continue
        (dirs if rest.endswith("/") else files).append(url)
        if not rest.endswith("/") and url not in listed:
            size, version = listed_version(after, now)
            if version:
                listed[url] = (size, version)
    return list(dict.fromkeys(files)), list(dict.fromkeys(dirs)), listed


def _index_root(location: str) -> tuple[str, str, list[str]]:
    """(the url of the first index page an http(s) listing of `location` asks, its path, the pattern of
    names under it)."""
    parts = urlsplit(location)
    if has_glob(location):
        first = min(i for i, c in enumerate(parts.path) if c in "*[")
        base_path = parts.path[:first].rpartition("/")[0] + "/"
        pattern = [unquote(p) for p in parts.path[len(base_path):].split("/")]
    else:
        base_path = parts.path if parts.path.endswith("/") else parts.path + "/"
        pattern = ["**", "*"]
    return f"{parts.scheme}://{parts.netloc}{base_path}", base_path, pattern


def ask_first_page(location: str, headers: dict | None) -> None:
    """A mount of an http(s) glob asks its first index page, in a thread, as its daemon starts
    (fuse/early.py): the page's round trips (2, or 3 past TCP's first window) pass while the daemon
    imports its code, and the listing (`_fetch_index`, the same request) takes that answer."""
    from refmount.fetch.pages import fetch_page_ahead
    from refmount.refs.scan.catalogs import catalog_kind

    if protocol_of(location) not in ("http", "https") or not has_glob(location) or catalog_kind(location):
        return  # (listed otherwise, or not at all: load_refs decides)
    fetch_page_ahead(_index_root(location)[0], MAX_INDEX_BYTES, {"headers": headers or {}}, same_origin=True)


def _list_http(location: str, headers: dict, sidecars: bool = False) -> list[tuple[Entry, str]]:
    base, base_path, pattern = _index_root(location)
    deep = "**" in pattern
    depth = MAX_DEPTH if deep else len(pattern) - 1
    found: list[str] = []
    listed: dict = {}
    todo = [(base, 0)]
    while todo:
        url, level = todo.pop(0)
        final, html = _fetch_index(url, headers)
        if level == 0 and final != url:  # the listed directory answers elsewhere on its origin (/d -> /d/,
            base_path = urlsplit(final).path.rstrip("/") + "/"  # /old/ -> /new/): its files are named from there
        files, dirs, versions = index_entries(final, html)
        found += files
        listed.update(versions)
        if len(found) > MAX_ENTRIES:
            raise _too_many(location)
        if level < depth:
            todo += [(d, level + 1) for d in dirs]
    chosen = []
    for url in found:
        rel = unquote(urlsplit(url).path[len(base_path):])
        if matches(pattern, rel.split("/")) or sidecars and any(
                rel.endswith(s) and matches(pattern, rel[: -len(s)].split("/")) for s in SIDECAR_SUFFIXES):
            chosen.append((url, rel))
    chosen.sort(key=lambda item: item[1])
    return [(Entry(_basename(u), u, *listed.get(u, ())), rel) for u, rel in chosen]


# -- s3: the bucket's listing (its ETags and sizes: no HEAD per object) -------------------------------

def _list_s3(location: str, remote_options: dict, sidecars: bool = False) -> list[tuple[Entry, str]]:
    import s3fs

    from refmount.errors import Unavailable
    from refmount.fetch.fsspec_backend import under_policy
    from refmount.fetch.retry import passing

    proto, _, rest = location.partition("://")
    options = under_policy(proto, {k: v for k, v in remote_options.items() if k not in ("headers",)})
    try:
        fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        if has_glob(rest):
            listed = fs.glob(rest, detail=True)
            if sidecars:  # (from the listings the first glob cached)
                for suffix in SIDECAR_SUFFIXES:
                    listed.update(fs.glob(rest + suffix, detail=True))
            base = _glob_base(rest)
        else:
            listed = fs.find(rest.rstrip("/"), detail=True)
            base = rest.rstrip("/")
    except FileNotFoundError:
        raise RefmountError(f"{quote(redact(location))} lists nothing (no such bucket or prefix)") from None
    except Exception as e:  # noqa: BLE001 - botocore's errors of every kind
        kind = Unavailable if passing(e) is not None else RefmountError  # (a refresh or lookup asks again)
        raise kind(f"cannot list {quote(redact(location))}: {type(e).__name__}: {e}") from None
    found = []
    for path in sorted(listed):
        info = listed[path]
        if info.get("type") != "file" or path.endswith("/"):
            continue
        etag = info.get("ETag") or info.get("etag")
        size = info.get("size")
        version = f"etag {etag}" if etag else None
        found.append((Entry(_basename(path), f"{proto}://{path}", size, version),
                      path[len(base):] if path.startswith(base) else path))
    if len(found) > MAX_ENTRIES:
        raise _too_many(location)
    return found
