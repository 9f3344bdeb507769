"""Catalogs as listings: the data files a STAC catalog or search, a THREDDS catalog.xml tree or a CMR
granule search names, as (Entry, path) pairs for sources.py's one naming (`_named`).

What a catalog is, is told by its url alone (`catalog_kind`), in one place. Every document is fetched
through the mount's HTTP engine and logins (fetch/pages.py), never a client of its own, without
redirects to another origin; every link that leads to another document of the catalog (a STAC
child/item/next link, a THREDDS catalogRef) stays on the catalog's origin. The data urls it names
may be on other hosts (archives keep their files on a CDN or a bucket) but only http(s):// or s3://:
a catalog cannot send the mount to local files or another scheme (each such link is left out with
one line, and fetch/trust.py checks them all again); from a catalog on a public address, none at an
address of this machine's own network (fetch/trust.py decides; each one it keeps is then reached on
public addresses only, at every request). Documents, pages, items, depth and each document's bytes
are bounded.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from urllib.parse import parse_qsl, unquote, urlencode, urljoin, urlsplit

from refmount.errors import RefmountError, quote
from refmount.fetch.stats import redact
from refmount.fetch.trust import Location, TargetRefused

log = logging.getLogger("refmount")

MAX_DOCUMENT_BYTES = 16 << 20  # one catalog document or search page
MAX_DOCUMENTS = 10_000  # documents (catalogs, items, pages) fetched for one listing
MAX_ITEMS = 100_000  # items or granules listed (narrow a search by datetime/bbox/temporal for more)
MAX_DEPTH = 16  # nested STAC children / THREDDS catalogRefs
DATA_SCHEMES = ("http", "https", "s3")

# STAC asset media types (and file name endings when an asset gives none): what the mount reads as a
# data file, the reference assets read instead of their files (kerchunk JSON, DMR++), and the stores
# loaded as a direct mount of their url is (Zarr, Icechunk, kerchunk Parquet: Entry.store)
_MEDIA = {
    "application/netcdf": "netcdf", "application/x-netcdf": "netcdf", "application/x-netcdf4": "netcdf",
    "application/x-hdf5": "hdf5", "application/x-hdf": "hdf5", "application/x-hdf4": "hdf5",
    "application/wmo-grib": "grib", "application/x-grib": "grib", "application/x-grib2": "grib",
    "image/tiff": "tiff", "image/geotiff": "tiff",
    "application/vnd.opendap.dap4.dmrpp+xml": "dmrpp", "application/vnd.zarr": "zarr", "application/vnd+zarr": "zarr",
    "application/x-zarr": "zarr", "application/vnd.apache.parquet": "parquet", "application/x-parquet": "parquet",
}
_ENDINGS = {".nc": "netcdf", ".nc4": "netcdf", ".h5": "hdf5", ".hdf5": "hdf5", ".he5": "hdf5", ".hdf": "hdf5",
            ".grib": "grib", ".grib2": "grib", ".grb": "grib", ".grb2": "grib", ".tif": "tiff", ".tiff": "tiff",
            ".dmrpp": "dmrpp", ".zarr": "zarr", ".parquet": "parquet", ".parq": "parquet"}
_NO_TYPE = ("", "application/octet-stream", "binary/octet-stream")  # (the name's ending tells then)
_REFERENCE_ROLES = {"references", "reference", "kerchunk", "index", "virtual"}
STORES = {"zarr": "a Zarr store", "icechunk": "an Icechunk repository", "parquet": "kerchunk Parquet references"}

GONE = (404, 410)  # what a STAC item link may answer to be left out: never retried, the item is no more
GONE_SAID = 5  # gone items named in a line each; the rest in one line (a catalog may name 10^5 of them)


class CatalogError(RefmountError):
    """A catalog that cannot be listed (one line naming its url); `status`: the HTTP status of the
    document that could not be fetched, if that was it."""

    status: int | None = None


def catalog_kind(location: str) -> str | None:
    """'stac', 'stac-search', 'thredds' or 'cmr' for an http(s) url of that form, else None (the url
    alone decides: no request)."""
    parts = urlsplit(location)
    if parts.scheme.lower() not in ("http", "https"):
        return None
    path = parts.path.rstrip("/")
    last = path.rsplit("/", 1)[-1]
    if last in ("catalog.json", "collection.json"):
        return "stac"
    if last == "catalog.xml":
        return "thredds"
    if last.startswith("granules.umm_json") and "/search/" in path:
        return "cmr"
    if last == "search" or last == "items" and "/collections/" in path:
        return "stac-search"
    return None


def list_catalog(location: str, headers: dict, strict: bool = False) -> list:
    """[(Entry, path for a duplicate's name)] of the data files the catalog at `location` names.
    `strict` (--strict): an item that is gone or not valid STAC fails the listing, as a file that
    cannot be scanned fails a --strict mount, instead of being left out with a warning."""
    kind = catalog_kind(location)
    lister = {"stac": _Stac, "stac-search": _Stac, "thredds": _Thredds, "cmr": _Cmr}[kind]
    found = lister(location, headers, strict).list()
    if not found:
        raise CatalogError(f"the catalog {quote(redact(location))} names no data files the mount can read")
    return found


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


class _Walk:
    """What every catalog kind shares: the fetches (bounded), the origin its documents stay on, the
    data urls it may name."""

    def __init__(self, location: str, headers: dict, strict: bool = False) -> None:
        self.location = location
        self.strict = strict  # --strict: no item is left out
        self.headers = headers
        self.home = _origin(location)
        self.fetched = 0
        self.seen: set[str] = set()
        self.items = 0
        self.trust = Location.argument(location)  # what the catalog may name (fetch/trust.py)
        self.skipped: list[str] = []  # assets of kinds the mount does not read (said once, at the end)

    def fetch(self, url: str, send: dict | None = None, post: bytes | None = None) -> tuple[str, dict, bytes]:
        from refmount.errors import FetchError, LoginFailed
        from refmount.fetch.pages import fetch_answer

        self.fetched += 1
        if self.fetched > MAX_DOCUMENTS:
            raise CatalogError(f"the catalog {quote(redact(self.location))} takes more than {MAX_DOCUMENTS:,} "
                               "documents to list; not followed further")
        try:
            final, answered, body = fetch_answer(url, MAX_DOCUMENT_BYTES, {"headers": self.headers},
                                                 same_origin=True, send=send, post=post)
        except FetchError as e:
            why = str(e).removeprefix(f"{redact(url)}: ")
            status = getattr(e, "status", None)
            if isinstance(e, LoginFailed) or status in (401, 403):
                why = f"access refused: {why}"
            error = CatalogError(f"cannot read the catalog {quote(redact(url))}: {why}")
            error.status = status
            raise error from None
        if _origin(final) != self.home:
            raise CatalogError(f"the catalog {quote(redact(url))} was redirected to another host "
                               f"({redact(final)}), which is not followed")
        return final, answered, body

    def fetch_json(self, url: str, send: dict | None = None, post: bytes | None = None) -> tuple[str, dict, object]:
        final, answered, body = self.fetch(url, send, post)
        try:
            return final, answered, json.loads(body)
        except (ValueError, RecursionError):
            raise CatalogError(f"the catalog {quote(redact(url))} is not JSON") from None

    def follow(self, base: str, href, why: str, body: dict | None = None) -> str | None:
        """The absolute url of a link to another document of the catalog, or None (said once) when it
        leaves the catalog's origin, was seen already (a loop: the same url, and the same `body` for a
        POST) or is no string."""
        if not isinstance(href, str) or not href:
            return None
        url = urljoin(base, href).partition("#")[0]
        if _origin(url) != self.home:
            log.warning("%s: %s %s leaves the catalog's origin; not followed", redact(base), why, quote(redact(url)))
            return None
        seen = url if body is None else url + " " + json.dumps(body, sort_keys=True)
        if seen in self.seen:
            log.warning("%s: %s %s was listed already (a loop); not followed again", redact(base), why,
                        quote(redact(url)))
            return None
        self.seen.add(seen)
        return url

    def data_url(self, base: str, href) -> str | None:
        """The absolute url of a data file the catalog names, or None (said once) when it is of a scheme
        the mount does not take from a catalog (a local file, anything but http(s):// and s3://)."""
        if not isinstance(href, str) or not href:
            return None
        url = urljoin(base, href)
        scheme = urlsplit(url).scheme.lower() if "://" in url else ""
        if scheme not in DATA_SCHEMES or "::" in url:
            log.warning("%s: a data url %s is not http(s):// or s3://, which a catalog may name; left out",
                        redact(base), quote(redact(url)))
            return None
        try:
            self.trust.check(url)
        except TargetRefused as e:
            log.warning("%s: %s; left out", redact(base), e)
            return None
        return url

    def counted(self, n: int = 1) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise CatalogError(f"the catalog {quote(redact(self.location))} names more than {MAX_ITEMS:,} items: "
                               "narrow the search (datetime, bbox, temporal, bounding_box)")

    def said_skipped(self) -> None:
        if self.skipped:
            log.info("%s: %d asset(s) of other kinds left out (%s%s)", redact(self.location), len(self.skipped),
                     ", ".join(self.skipped[:3]), ", ..." if len(self.skipped) > 3 else "")


# -- STAC: static catalogs and collections, item searches (read by pystac from the bytes fetched here) ----

def _pystac():
    try:
        import pystac
    except ImportError:
        raise CatalogError("reading a STAC catalog needs pystac: pip install 'refmount[archives]'") from None
    return pystac


def asset_kind(key: str, asset) -> str | None:
    """What a STAC asset (a pystac Asset) is to the mount: 'reference' (kerchunk JSON), 'dmrpp', the
    format of a data file it reads ('netcdf', 'hdf5', 'grib', 'tiff'), a store that mounts by itself
    ('zarr', 'icechunk', 'parquet' references), or None (a thumbnail, metadata, a format it does not read)."""
    href = asset.href if isinstance(asset.href, str) else ""
    media = asset.media_type if isinstance(asset.media_type, str) else ""
    roles = {r.lower() for r in asset.roles if isinstance(r, str)} if isinstance(asset.roles, list) else set()
    base = media.split(";")[0].strip().lower()
    last = href.split("?")[0].rstrip("/").rsplit("/", 1)[-1].lower()
    ending = "." + last.rsplit(".", 1)[-1] if "." in last else ""
    key = key.lower()
    refs = bool(roles & _REFERENCE_ROLES) or "kerchunk" in key or "reference" in key
    if "icechunk" in base or "icechunk" in roles or "icechunk" in key:
        return "icechunk"
    if (base == "application/json" or not base and ending == ".json") and refs:
        return "reference"
    kind = _MEDIA.get(base) or (_ENDINGS.get(ending) if base in _NO_TYPE else None)
    if kind == "parquet" and not refs:
        return None  # (a table: GeoParquet, not references)
    if kind is None or roles & {"thumbnail", "overview"}:
        return None
    return kind


def _with_query(href, search: str):
    """A GET next link with the search's own query parameters it leaves out (as pystac-client sends
    them again with every page: some servers' next links carry only a paging token)."""
    if not isinstance(href, str):
        return href
    parts = urlsplit(href)
    have = {k for k, _ in parse_qsl(parts.query, keep_blank_values=True)}
    missing = [(k, v) for k, v in parse_qsl(urlsplit(search).query, keep_blank_values=True) if k not in have]
    return parts._replace(query=urlencode([*parse_qsl(parts.query, keep_blank_values=True), *missing],
                                          safe="/:,")).geturl() if missing else href


class _Stac(_Walk):
    def list(self) -> list:
        self.pystac = _pystac()
        self.entries: list = []
        self.invalid: list[str] = []
        self.gone: list[str] = []  # item links that answered 404 or 410 (each said once, left out)
        self.seen.add(self.location)
        self._walk()
        if self.gone and not self.entries:
            raise CatalogError(f"every item of the catalog {quote(redact(self.location))} is gone "
                               f"({len(self.gone)}, the first {self.gone[0]})")
        if len(self.gone) > GONE_SAID:
            log.warning("%s: %d more item(s) answered HTTP 404 or 410: gone, left out (the last %s)",
                        redact(self.location), len(self.gone) - GONE_SAID, self.gone[-1])
        if self.invalid:
            log.warning("%s: %d item(s) that are not valid STAC left out (%s)", redact(self.location),
                        len(self.invalid), self.invalid[0])
        self.said_skipped()
        return self.entries

    def _walk(self) -> None:
        # (url, depth, the body of a POST for a next page, the rel of the link that named it)
        todo = deque([(self.location, 0, None, None)])
        while todo:
            url, depth, body, rel = todo.popleft()
            post = json.dumps(body).encode() if body is not None else None
            try:
                final, _, doc = self.fetch_json(url, {"Content-Type": "application/json"} if post else None, post)
            except CatalogError as e:
                # An item the server says is no more (404/410 are never retried) is left out; any other
                # failure (403, a 5xx after the retries, a timeout, no JSON) fails the listing: a mount
                # must not come up partial over a passing outage. A child catalog gone is not an item.
                if rel != "item" or e.status not in GONE:
                    raise
                if self.strict:
                    raise CatalogError(f"the catalog's item {quote(redact(url))} answered HTTP {e.status}: gone "
                                       "(--strict leaves no item out)") from None
                self.gone.append(f"{redact(url)} (HTTP {e.status})")
                self.counted()  # (a gone item's GET counts as a listed one's: 10^6 gone links are refused)
                if len(self.gone) <= GONE_SAID:
                    log.warning("the catalog's item %s answered HTTP %d: gone, left out", quote(redact(url)), e.status)
                continue
            if not isinstance(doc, dict):
                raise CatalogError(f"{quote(redact(url))} is not a STAC document")
            kind = doc.get("type")
            if kind == "FeatureCollection":
                self._page(final, doc, body, todo, depth)
            elif kind in ("Feature", "Catalog", "Collection"):
                obj = self._read(final, doc)
                if isinstance(obj, self.pystac.Item):
                    self._item(final, obj)
                    continue
                for link in obj.links:
                    if link.rel not in ("child", "item"):
                        continue
                    if depth >= MAX_DEPTH:
                        log.warning("%s: nested deeper than %d catalogs; not followed further", redact(final),
                                    MAX_DEPTH)
                        break
                    nxt = self.follow(final, link.href, f"a {link.rel} link")
                    if nxt:
                        todo.append((nxt, depth + 1, None, link.rel))
            else:
                raise CatalogError(f"{quote(redact(url))} is not a STAC catalog, collection, item or item search "
                                   f"(type {str(kind)[:40]!r})")

    def _read(self, url: str, doc: dict):
        """The pystac Catalog, Collection or Item of a document (its self href: where it was found)."""
        try:
            return self.pystac.read_dict(doc, href=url)
        except Exception as e:  # (pystac's own errors, and a KeyError/TypeError for a field it lacks)
            raise CatalogError(f"{quote(redact(url))} is not a valid STAC {doc.get('type')}: "
                               f"{type(e).__name__} {str(e)[:80]}") from None

    def _page(self, final: str, doc: dict, body: dict | None, todo: deque, depth: int) -> None:
        """One page of an item search: its items, and its `next` link (GET, or POST with a body that
        may be merged into this page's, as the STAC API spec has it)."""
        features = doc.get("features")
        if not isinstance(features, list):
            raise CatalogError(f"{quote(redact(final))} is not a STAC item search answer (no features)")
        for feature in features:
            self.counted()
            try:
                item = self.pystac.Item.from_dict(feature, preserve_dict=False)
            except Exception as e:
                if self.strict:
                    raise CatalogError(f"{quote(redact(final))} holds an item that is not valid STAC: "
                                       f"{type(e).__name__} {str(e)[:60]} (--strict leaves no item out)") from None
                self.invalid.append(f"{type(e).__name__} {str(e)[:60]}")
                continue
            self._item(final, item)
        links = doc.get("links") if isinstance(doc.get("links"), list) else []
        for raw in links:
            if not features or not isinstance(raw, dict) or raw.get("rel") != "next" or not isinstance(raw.get("href"), str):
                continue
            link = self.pystac.Link.from_dict(raw)
            method = str(link.extra_fields.get("method", "GET")).upper()
            asked = link.extra_fields.get("body")
            href = link.href
            if method == "POST" and isinstance(asked, dict):
                after = {**(body or {}), **asked} if link.extra_fields.get("merge") is True else asked
            elif method == "GET":
                after, href = None, _with_query(href, self.location)
            else:
                log.warning("%s: a next page asked by %s (with a body %s) is not followed", redact(final),
                            quote(method[:10]), type(asked).__name__)
                continue
            nxt = self.follow(final, href, "the next page", after)
            if nxt:
                todo.append((nxt, depth, after, None))
            break

    def _item(self, base: str, item) -> None:
        """One item: one dataset directory named by its id, from (in this order) its kerchunk JSON, its
        kerchunk Parquet references, its Icechunk repository, its DMR++ (with its netCDF/HDF5 data asset),
        its Zarr store, or each data file it has (`id~key` when several)."""
        from refmount.refs.scan.entry import Entry

        ident = item.id
        if not isinstance(ident, str):
            if self.strict:
                raise CatalogError(f"{quote(redact(base))} holds an item whose id is no string (--strict leaves no "
                                   "item out)")
            self.invalid.append("an item whose id is no string")
            return
        at = item.get_self_href() or base
        chosen: dict[str, list] = {}
        for key, asset in item.assets.items():
            kind = asset_kind(str(key), asset)
            if kind is None:
                self.skipped.append(f"{ident}/{key}")
                continue
            url = self.data_url(at, asset.href)
            if url:
                chosen.setdefault(kind, []).append((str(key), url))
        data = [c for kind in ("netcdf", "hdf5", "grib", "tiff") for c in chosen.get(kind, ())]
        store = next((kind for kind in ("parquet", "icechunk") if kind in chosen), None)
        if "reference" in chosen:  # an item's references stand for its files (read instead of their headers)
            key, url = chosen["reference"][0]
            self.entries.append((Entry(ident, url, sidecar=url), f"{ident}/{key}"))
        elif store:
            key, url = chosen[store][0]
            self.entries.append((Entry(ident, url, store=store), f"{ident}/{key}"))
        elif "dmrpp" in chosen:
            key, url = chosen["dmrpp"][0]
            target = next((u for k, u in data if urlsplit(u).path == urlsplit(url).path.removesuffix(".dmrpp")),
                          data[0][1] if len(data) == 1 else url)
            self.entries.append((Entry(ident, target, sidecar=url), f"{ident}/{key}"))
        elif "zarr" in chosen:
            key, url = chosen["zarr"][0]
            self.entries.append((Entry(ident, url, store="zarr"), f"{ident}/{key}"))
        elif data:
            for key, url in data:
                self.entries.append((Entry(ident if len(data) == 1 else f"{ident}~{key}", url), f"{ident}/{key}"))


# -- THREDDS: catalog.xml trees -------------------------------------------------------------------------

_TDS = "{http://www.unidata.ucar.edu/namespaces/thredds/InvCatalog/v1.0}"
_XLINK = "{http://www.w3.org/1999/xlink}href"


def parse_xml(url: str, body: bytes):
    """An XML document with no DTD (no entities: no billion laughs, no external files), or CatalogError."""
    import xml.etree.ElementTree as ET

    if _declares_a_dtd(body):  # (asked of the parser, not of the bytes: UTF-16 spells '<!DOCTYPE' otherwise)
        raise CatalogError(f"the catalog {quote(redact(url))} declares a DTD or entities, which are not read")
    try:
        return ET.fromstring(body)
    except ET.ParseError as e:
        raise CatalogError(f"the catalog {quote(redact(url))} is not XML: {e}") from None


class _Dtd(Exception):
    pass


def _declares_a_dtd(body: bytes) -> bool:
    """Whether the XML declares a DTD, the only place entities can come from: expat stops at the
    declaration's start, before any entity is read or expanded, in whatever encoding the document is."""
    from xml.parsers import expat

    def refuse(*_):
        raise _Dtd

    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = refuse
    try:
        parser.Parse(body, True)
    except _Dtd:
        return True
    except expat.ExpatError:
        pass  # (not XML: ElementTree says so next)
    return False


class _Thredds(_Walk):
    def list(self) -> list:
        from refmount.refs.scan.entry import Entry

        found = []
        self.seen.add(self.location)
        todo = [(self.location, 0)]
        while todo:
            url, depth = todo.pop(0)
            final, _, body = self.fetch(url)
            root = parse_xml(url, body)
            if root.tag != f"{_TDS}catalog":
                raise CatalogError(f"{quote(redact(url))} is not a THREDDS catalog")
            bases = {s.get("name"): (s.get("serviceType") or "", s.get("base") or "")
                     for s in root.iter(f"{_TDS}service")}
            http_bases = [b for t, b in bases.values() if t.lower() == "httpserver"]
            for ref in root.iter(f"{_TDS}catalogRef"):
                if depth >= MAX_DEPTH:
                    log.warning("%s: nested deeper than %d catalogs; not followed further", redact(final), MAX_DEPTH)
                    break
                nxt = self.follow(final, ref.get(_XLINK), "a catalogRef")
                if nxt:
                    todo.append((nxt, depth + 1))
            for ds in root.iter(f"{_TDS}dataset"):
                path = ds.get("urlPath")
                for access in ds.findall(f"{_TDS}access"):
                    service = bases.get(access.get("serviceName"))
                    if service and service[0].lower() == "httpserver" and access.get("urlPath"):
                        path, http_bases = access.get("urlPath"), [service[1]]
                if not path:
                    continue
                if ".." in unquote(path).split("/"):  # (a TDS urlPath never climbs out of its service)
                    log.warning("%s: dataset urlPath %s climbs out of the service with '..'; left out", redact(final),
                                quote(path))
                    continue
                if not http_bases:
                    log.warning("%s: dataset %s has no HTTPServer service; left out", redact(final), quote(path))
                    continue
                self.counted()
                url_of = self.data_url(final, http_bases[0].rstrip("/") + "/" + path.lstrip("/")
                                       if not http_bases[0].endswith("/") else http_bases[0] + path.lstrip("/"))
                if url_of is None:
                    continue
                name = unquote(path.rstrip("/").rsplit("/", 1)[-1])
                found.append((Entry(name, url_of), path))
        return found


# -- CMR: granule searches (UMM-JSON), paged by CMR-Search-After ---------------------------------------

class _Cmr(_Walk):
    def list(self) -> list:
        from refmount.fetch.pages import which_exist
        from refmount.refs.scan.entry import Entry

        found, after, unlisted = [], None, set()
        while True:
            final, answered, doc = self.fetch_json(self.location, {"CMR-Search-After": after} if after else None)
            items = doc.get("items") if isinstance(doc, dict) else None
            if not isinstance(items, list):
                raise CatalogError(f"{quote(redact(self.location))} is not a CMR UMM-JSON granule search answer")
            for item in items:
                self.counted()
                umm = item.get("umm") if isinstance(item, dict) else None
                urls = umm.get("RelatedUrls") if isinstance(umm, dict) else None
                if not isinstance(urls, list):
                    continue
                links = [u.get("URL") for u in urls if isinstance(u, dict) and isinstance(u.get("URL"), str)]
                data = [u.get("URL") for u in urls if isinstance(u, dict) and u.get("Type") == "GET DATA"
                        and isinstance(u.get("URL"), str)]
                data.sort(key=lambda u: not u.startswith(("https://", "http://")))  # https first, as earthaccess
                url = self.data_url(final, data[0]) if data else None
                if url is None:
                    continue
                sidecar = url + ".dmrpp"
                if sidecar not in links:
                    unlisted.add(sidecar)
                name = unquote(urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])
                found.append((Entry(name, url, sidecar=sidecar), urlsplit(url).path))
            after = answered.get("CMR-Search-After")
            if not items or not after:
                break
        # a DMR++ the granule does not list is used where it is there (one HEAD each, 8 at a time)
        probed = [u for u in unlisted if u.startswith(("http://", "https://"))]
        there = which_exist(probed, {"headers": self.headers})
        for entry, _ in found:
            if entry.sidecar in unlisted and entry.sidecar not in there:
                entry.sidecar = None
        return found
