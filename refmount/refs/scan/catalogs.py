"""Catalogs as listings: the data files a STAC catalog or search, a THREDDS catalog.xml tree or a CMR
granule search names, as (Entry, path) pairs for sources.py's one naming (`_named`).

What a catalog is, is told by its url alone (`catalog_kind`), in one place. Every document is fetched
through the mount's HTTP engine and logins (fetch/pages.py), never a client of its own, without
redirects to another origin; every link that leads to another document of the catalog (a STAC
child/item/next link, a THREDDS catalogRef) stays on the catalog's origin. The data urls it names
may be on other hosts (archives keep their files on a CDN or a bucket) but only http(s):// or s3://:
a catalog cannot send the mount to local files or another scheme (each such link is left out with
one line, and fetch/trust.py checks them all again). Documents, pages, items, depth and each
document's bytes are bounded.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import unquote, urljoin, urlsplit

from refmount.errors import RefmountError, quote
from refmount.fetch.stats import redact

log = logging.getLogger("refmount")

MAX_DOCUMENT_BYTES = 16 << 20  # one catalog document or search page
MAX_DOCUMENTS = 10_000  # documents (catalogs, items, pages) fetched for one listing
MAX_ITEMS = 100_000  # items or granules listed (narrow a search by datetime/bbox/temporal for more)
MAX_DEPTH = 16  # nested STAC children / THREDDS catalogRefs
DATA_SCHEMES = ("http", "https", "s3")

# STAC asset media types (and file name endings when an asset gives none) of what the mount can read
_MEDIA = {
    "application/netcdf": "netcdf", "application/x-netcdf": "netcdf", "application/x-netcdf4": "netcdf",
    "application/x-hdf5": "hdf5", "application/x-hdf": "hdf5", "application/x-hdf4": "hdf5",
    "application/wmo-grib": "grib", "application/x-grib": "grib", "application/x-grib2": "grib",
    "image/tiff": "tiff", "image/geotiff": "tiff",
}
_ENDINGS = {".nc": "netcdf", ".nc4": "netcdf", ".h5": "hdf5", ".hdf5": "hdf5", ".he5": "hdf5", ".hdf": "hdf5",
            ".grib": "grib", ".grib2": "grib", ".grb": "grib", ".grb2": "grib", ".tif": "tiff", ".tiff": "tiff"}
_REFERENCE_ROLES = {"references", "reference", "kerchunk", "index"}


class CatalogError(RefmountError):
    """A catalog that cannot be listed (one line naming its url)."""


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


def list_catalog(location: str, headers: dict) -> list:
    """[(Entry, path for a duplicate's name)] of the data files the catalog at `location` names."""
    kind = catalog_kind(location)
    lister = {"stac": _Stac, "stac-search": _Stac, "thredds": _Thredds, "cmr": _Cmr}[kind]
    found = lister(location, headers).list()
    if not found:
        raise CatalogError(f"the catalog {quote(redact(location))} names no data files the mount can read")
    return found


def _origin(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


class _Walk:
    """What every catalog kind shares: the fetches (bounded), the origin its documents stay on, the
    data urls it may name."""

    def __init__(self, location: str, headers: dict) -> None:
        self.location = location
        self.headers = headers
        self.home = _origin(location)
        self.fetched = 0
        self.seen: set[str] = set()
        self.items = 0
        self.skipped: list[str] = []  # assets of kinds the mount does not read (said once, at the end)

    def fetch(self, url: str, send: dict | None = None) -> tuple[str, dict, bytes]:
        from refmount.errors import FetchError, LoginFailed
        from refmount.fetch.pages import fetch_answer

        self.fetched += 1
        if self.fetched > MAX_DOCUMENTS:
            raise CatalogError(f"the catalog {quote(redact(self.location))} takes more than {MAX_DOCUMENTS:,} "
                               "documents to list; not followed further")
        try:
            final, answered, body = fetch_answer(url, MAX_DOCUMENT_BYTES, {"headers": self.headers},
                                                 same_origin=True, send=send)
        except FetchError as e:
            why = str(e).removeprefix(f"{redact(url)}: ")
            if isinstance(e, LoginFailed) or getattr(e, "status", None) in (401, 403):
                why = f"access refused: {why}"
            raise CatalogError(f"cannot read the catalog {quote(redact(url))}: {why}") from None
        if _origin(final) != self.home:
            raise CatalogError(f"the catalog {quote(redact(url))} was redirected to another host "
                               f"({redact(final)}), which is not followed")
        return final, answered, body

    def fetch_json(self, url: str, send: dict | None = None) -> tuple[str, dict, object]:
        final, answered, body = self.fetch(url, send)
        try:
            return final, answered, json.loads(body)
        except (ValueError, RecursionError):
            raise CatalogError(f"the catalog {quote(redact(url))} is not JSON") from None

    def follow(self, base: str, href, why: str) -> str | None:
        """The absolute url of a link to another document of the catalog, or None (said once) when it
        leaves the catalog's origin, was seen already (a loop) or is no string."""
        if not isinstance(href, str) or not href:
            return None
        url = urljoin(base, href).partition("#")[0]
        if _origin(url) != self.home:
            log.warning("%s: %s %s leaves the catalog's origin; not followed", redact(base), why, quote(redact(url)))
            return None
        if url in self.seen:
            log.warning("%s: %s %s was listed already (a loop); not followed again", redact(base), why,
                        quote(redact(url)))
            return None
        self.seen.add(url)
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


# -- STAC: static catalogs and collections, item searches ---------------------------------------------

def asset_kind(key: str, asset: dict) -> str | None:
    """'reference', or the data format of a STAC asset the mount reads, or None."""
    href = asset.get("href") if isinstance(asset.get("href"), str) else ""
    media = asset.get("type") if isinstance(asset.get("type"), str) else ""
    roles = {r for r in asset.get("roles", ()) if isinstance(r, str)} if isinstance(asset.get("roles"), list) else set()
    media_base = media.split(";")[0].strip().lower()
    ending = "." + href.split("?")[0].rsplit(".", 1)[-1].lower() if "." in href else ""
    if (media_base == "application/json" or ending == ".json") and (roles & _REFERENCE_ROLES or "kerchunk" in key.lower()):
        return "reference"
    if media_base in _MEDIA:
        return _MEDIA[media_base]
    if not media_base and ending in _ENDINGS and "thumbnail" not in roles and "overview" not in roles:
        return _ENDINGS[ending]
    return None


class _Stac(_Walk):
    def list(self) -> list:
        from refmount.refs.scan.entry import Entry

        self.entries: list = []
        self.seen.add(self.location)
        self._document(self.location, 0)
        self.said_skipped()
        return [(e, rel) for e, rel in self.entries if isinstance(e, Entry)]

    def _document(self, url: str, depth: int) -> None:
        todo = [(url, depth)]
        while todo:
            url, depth = todo.pop(0)
            final, _, doc = self.fetch_json(url)
            if not isinstance(doc, dict):
                raise CatalogError(f"{quote(redact(url))} is not a STAC document")
            kind = doc.get("type")
            links = [link for link in doc.get("links", ()) if isinstance(link, dict)] \
                if isinstance(doc.get("links"), list) else []
            if kind == "Feature":
                self._item(final, doc)
            elif kind == "FeatureCollection":
                features = doc.get("features") if isinstance(doc.get("features"), list) else []
                for feature in features:
                    if isinstance(feature, dict):
                        self._item(final, feature)
                for link in links:
                    if link.get("rel") == "next":
                        if str(link.get("method", "GET")).upper() != "GET":
                            log.warning("%s: a next page asked by %s is not followed (GET only)", redact(final),
                                        link.get("method"))
                            continue
                        nxt = self.follow(final, link.get("href"), "the next page")
                        if nxt and features:
                            todo.append((nxt, depth))
            elif kind in ("Catalog", "Collection"):
                for link in links:
                    rel = link.get("rel")
                    if rel not in ("child", "item"):
                        continue
                    if depth >= MAX_DEPTH:
                        log.warning("%s: nested deeper than %d catalogs; not followed further", redact(final),
                                    MAX_DEPTH)
                        break
                    nxt = self.follow(final, link.get("href"), f"a {rel} link")
                    if nxt:
                        todo.append((nxt, depth + 1))
            else:
                raise CatalogError(f"{quote(redact(url))} is not a STAC catalog, collection, item or item search "
                                   f"(type {str(kind)[:40]!r})")

    def _item(self, base: str, item: dict) -> None:
        from refmount.refs.scan.entry import Entry

        self.counted()
        ident = item.get("id")
        assets = item.get("assets") if isinstance(item.get("assets"), dict) else {}
        if not isinstance(ident, str):
            log.warning("%s: an item without an id; left out", redact(base))
            return
        chosen = []
        for key, asset in assets.items():
            if not isinstance(asset, dict):
                continue
            kind = asset_kind(str(key), asset)
            if kind is None:
                self.skipped.append(f"{ident}/{key}")
                continue
            url = self.data_url(base, asset.get("href"))
            if url:
                chosen.append((str(key), kind, url))
        references = [c for c in chosen if c[1] == "reference"]
        if references:  # an item's kerchunk references stand for its files (read instead of their headers)
            chosen = references[:1]
        for key, kind, url in chosen:
            name = ident if len(chosen) == 1 else f"{ident}~{key}"
            entry = Entry(name, url, sidecar=url if kind == "reference" else None)
            self.entries.append((entry, f"{ident}/{key}"))


# -- THREDDS: catalog.xml trees -------------------------------------------------------------------------

_TDS = "{http://www.unidata.ucar.edu/namespaces/thredds/InvCatalog/v1.0}"
_XLINK = "{http://www.w3.org/1999/xlink}href"


def parse_xml(url: str, body: bytes):
    """An XML document with no DTD (no entities: no billion laughs, no external files), or CatalogError."""
    import xml.etree.ElementTree as ET

    head = body[:4096].lower()
    if b"<!doctype" in head or b"<!entity" in body.lower():
        raise CatalogError(f"the catalog {quote(redact(url))} declares a DTD or entities, which are not read")
    try:
        return ET.fromstring(body)
    except ET.ParseError as e:
        raise CatalogError(f"the catalog {quote(redact(url))} is not XML: {e}") from None


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
