"""Scan the data files a SOURCE names and make one reference set of them.

- One data file: the mount root is its dataset.
- Several (a glob, a directory, an s3:// prefix, @FILE): one subdirectory per file, each a dataset;
  with `concat` one dataset combined along that dimension (refmount.refs.combine).

Every file is identified first (a stat, a HEAD, or the listing's ETag); one scanned before at the same
version comes from the scan store without a byte of its header read. The others are sniffed (their first
bytes, through the block cache) and scanned in worker processes. A file that cannot be scanned is one
log line and is left out (the whole source fails with `strict`, or when it is the only file).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import logging
import os
import time
from dataclasses import dataclass, field

import orjson
import trio

from refmount.errors import FetchError, RefmountError, RefsError, Unavailable, quote
from refmount.fetch.retry import passing, retrying_under
from refmount.fetch.stats import redact
from refmount.refs.arraymeta import ArrayMeta, ArrayMetaError
from refmount.refs.origins import Origins, files
from refmount.refs.scan.formats import FORMAT_NAMES, INSTALL_ARCHIVES, SNIFF_BYTES, sniff
from refmount.refs.scan.sources import IDX_SUFFIX, Entry, list_sources, looks_like_many, may_be_data_file, pair_sidecars

log = logging.getLogger("refmount")

SCANNER_MEMORY = 1 << 30  # address space a scanner may add to what it has after its imports
SCAN_CACHE_BYTES = 64 << 20  # the block cache the headers are read through
KEPT_COORDINATE_BYTES = 32 << 20  # --concat: copies of the small arrays' chunks taken from scanned headers
KEPT_CHUNK_BYTES = 64 << 10  # (each at most this: coordinates, bounds, scalars; not a data variable's chunk)
REVALIDATION_CONNECTIONS = 32  # per host, while scanning: 56 HEADs at 80 ms take 2 round trips, not 7
SCANNER_RSS = 48 << 20  # one scanner against the memory target (measured after 4 netCDF-4 files: RSS 65 MB,
                        # PSS 36 MB, 14 MB private: it shares its fork server's pages)


def scanner_count(options: "ArchiveOptions", files: int) -> int:
    """As many scanners as files, up to 8 (they mostly wait for bytes), and no more than the memory
    target leaves beside the daemon and its header cache: they count against it while they run."""
    from refmount.cache.target import DEFAULT_TARGET, resident_bytes
    from refmount.refs.scan.pool import default_workers

    wanted = options.workers or default_workers()
    target = options.memory_target or DEFAULT_TARGET
    room = target - resident_bytes() - SCAN_CACHE_BYTES
    return max(1, min(wanted, files, room // SCANNER_RSS))


@dataclass
class ArchiveOptions:
    concat: str | None = None
    identical: tuple = ()
    skip_mismatched: bool = False
    strict: bool = False
    scan_dir: str | None = None  # where scans are kept (None: the per-user default, store.py)
    cache_dir: str | None = None
    block_size: int = 1 << 20
    connections: int = 8
    workers: int | None = None
    read_timeout: float = 30.0
    stall_timeout: float = 10.0
    http_client: str = "stdlib"
    allow_cross_host_redirects: bool = False
    progress: object = None  # called with (files done, files in all), or None
    remote_options: dict = field(default_factory=dict)
    memory_target: int | None = None  # the daemon's --memory-target: the scanners' share bounds their number
    max_full_download: int | None = None  # a server ignoring Range: how far a header read may stream (None: 1G)
    decode: object = None  # combining's bounded decoder (refmount.view.bounded.decode_bounded, given from above)
    lazy: bool = False  # a glob without --concat is only listed; its files are scanned when looked up (a mount)
    trust: object = None  # the source as a fetch.trust.Location (the mount's policy); None: the source's own
    s3_credentials_url: str | None = None  # --s3-credentials-url: s3:// files signed with its credentials
    growing: bool = False  # --refresh: files will be added to a --concat set (refs.combine: its coordinate's chunks)
    load_store: object = None  # refs.load_refs, for a catalog's store items (given from above: refs imports this)


def with_trust(options: ArchiveOptions, location: str) -> ArchiveOptions:
    """`options` with the source's Location (fetch/trust.py), the mount's if given, else the source's
    own under the default policy (`refmount scan`)."""
    from dataclasses import replace

    from refmount.fetch.trust import Location

    return options if options.trust is not None else replace(options, trust=Location.argument(location))


def check_listed(root, entries: list[Entry]) -> None:
    """Each file a listing names (and its DMR++) may be used by the source that listed it."""
    for entry in entries:
        root.check(entry.url)
        if entry.sidecar and entry.sidecar != entry.url:
            root.check(entry.sidecar)


def check_scanned(root, entry: Entry, scanned: "Scanned") -> None:
    """Every target a file's references name may be used by the document that named it: the file's
    DMR++ (its dmrpp:href and chunk hrefs), else the data file itself (fetch/trust.py). ScanFailed
    naming the target and the document: an @FILE list or a glob does not lend a remote DMR++ the
    trust of a local list."""
    from refmount.fetch.trust import TargetRefused
    from refmount.refs.scan.pool import ScanFailed

    try:
        document = root.names(entry.sidecar or entry.url)
        for url in scanned_targets(scanned):
            document.check(url)
    except TargetRefused as e:
        raise ScanFailed(str(e)) from None


def scanned_targets(scanned: "Scanned"):
    """The urls a file's references name."""
    if scanned.targets is not None:
        return scanned.targets
    # (a dict of references, or bytes kept before their targets were)
    return {v[0] for v in refs_dict(scanned.refs).values() if type(v) is list and v and isinstance(v[0], str)}


@dataclass
class Scanned:
    name: str
    url: str
    format: str
    refs: dict | bytes  # (a DMR++'s: JSON bytes, as its worker made them: `refs_dict` when a dict is needed)
    refused: list
    version: str | None = None  # what the scan store keyed it by (None: not kept)
    files: tuple = ()  # the local files its inline values were read from (refs/origins.py: set by who scanned it)
    targets: tuple | None = None  # the urls its references name, when `refs` are bytes (a DMR++'s, told by its worker)


def is_archive_source(location: str, remote_options: dict | None = None, archive: "ArchiveOptions | None" = None) -> bool:
    """A data file (told by its first bytes) or a form that names several files."""
    if looks_like_many(location, remote_options):
        return True
    if not may_be_data_file(location):
        return False
    options = archive or ArchiveOptions(remote_options=remote_options or {})
    return _first_bytes_format(location, options) is not None


def scan_fetcher(options: ArchiveOptions, **settings):
    """The fetcher scans read through (sniffing, headers, DMR++ files, --concat's coordinates): the
    mount's logins (fetch/auth.py: bearer tokens, cookies, netrc, installed by the mount or by
    `refmount scan`) and temporary S3 credentials, as the mount's own reads have them."""
    from refmount.fetch import Fetcher
    from refmount.fetch.auth import active

    return Fetcher(remote_options=options.remote_options, http_client=options.http_client, logins=active(),
                   s3_credentials_url=options.s3_credentials_url, **settings)


def listing_options(location: str, options: ArchiveOptions) -> dict:
    """The options a listing of `location` takes: an s3:// glob or prefix is listed with the mount's
    temporary S3 credentials (--s3-credentials-url) when it has them, as its files are read."""
    from refmount.fetch.protocols import protocol_of

    if options.s3_credentials_url and protocol_of(location) in ("s3", "s3a"):
        from refmount.fetch.s3creds import listing_options as with_credentials

        return with_credentials(options.s3_credentials_url, options.remote_options)
    return options.remote_options


def _first_bytes_format(location: str, options: ArchiveOptions) -> str | None:
    """The format of a single location by its first bytes; None when it is no data file or cannot be
    read (the reference loaders then say why), but a refused login or a 401/403 is said here."""
    from refmount.errors import LoginFailed
    from refmount.fetch.protocols import is_remote, local_path

    if not is_remote(location):
        try:
            with open(local_path(location), "rb") as f:
                head = f.read(1 << 20)
        except OSError:
            return None
        return sniff(head)

    async def head() -> bytes:
        fetcher = scan_fetcher(options)
        try:
            return b"".join(map(bytes, await fetcher.read(location, 0, SNIFF_BYTES)))
        finally:
            await fetcher.aclose()

    try:
        return sniff(trio.run(head))
    except FetchError as e:
        if isinstance(e, LoginFailed) or getattr(e, "status", None) in (401, 403):
            why = str(e).removeprefix(f"{redact(location)}: ")
            raise type(e)(f"{redact(location)}: access refused: {why}") from None
        return None  # not reachable as a data file: the reference loaders say why
    except Exception:  # noqa: BLE001 - (the same)
        return None


def scan_source(location: str, options: ArchiveOptions, *, max_refs_size: int, timeout: float | None,
                then=None, max_keys: int | None = None, kept=None, unavailable: set | None = None) -> tuple:
    """(kind, [Scanned], then's result) of a source: kind 'file' (one data file) or 'many'. `then`
    (kind, scanned, read) runs in a thread once the files are scanned, with `read` a synchronous
    (url, offset, length) -> bytes through the same fetcher and block cache (combining reads coordinates).
    `max_keys` bounds each DMR++ conversion as it runs. `kept` (refs/scan/kept.py): asked with the listing
    first, and what it keeps for that listing is the result: ([Scanned] standing for the files, its result).
    `unavailable`: a set the names of the files left out for a fetch error are added to (_settle)."""
    _check_parsers()
    options = with_trust(options, location)
    single = not looks_like_many(location, options.remote_options)
    from refmount.refs.scan.store import ScanStore, default_scan_dir

    store = ScanStore(options.scan_dir or default_scan_dir(options.cache_dir))
    if not single and not store.previous_names(location):  # a first mount: its files will be scanned
        from refmount.refs.scan.pool import start_fork_server

        start_fork_server()  # (its imports, a second or more, while the files are listed)
    entries = _single_entry(location) if single else source_entries(location, options, store)
    found = kept.lookup(entries, store) if kept is not None and not single else None
    if found is not None:
        if store.previous_names(location) != [e.name for e in entries]:
            store.put_names(location, [e.name for e in entries])
        for s in found[0]:
            log_refused(s)
        return "many", *found
    if not single:  # (listed from a guessed page? scanned only once it is known right)
        from refmount.fetch.pages import check_guess

        check_guess()
    started = time.monotonic()
    kind = "file" if single else "many"

    async def main():
        async with _Reader(options) as reader:
            results, failures = await _scan_all(entries, reader, options, store, max_refs_size, timeout, max_keys)
            scanned = _settle(location, single, options, results, failures, unavailable)
            if not single:
                store.put_names(location, [s.name for s in scanned])
            log.info("scanned %d file(s) of %s in %.2f s", len(scanned), redact(location),
                     time.monotonic() - started)
            if then is None:
                return scanned, None
            token = trio.lowlevel.current_trio_token()

            def read(url: str, offset: int, length: int) -> bytes:
                return bytes(trio.from_thread.run(reader.read_exact, url, offset, offset + length, trio_token=token))

            return scanned, await trio.to_thread.run_sync(then, kind, scanned, read)

    scanned, result = trio.run(main)
    return kind, scanned, result


def _single_entry(location: str) -> list[Entry]:
    """One file as its own source; one X.dmrpp stands for its data file."""
    entry = Entry(location.rstrip("/").rsplit("/", 1)[-1], location)
    if dmrpp_module() is None:
        return [entry]
    return [e for e, _ in pair_sidecars([(entry, entry.name)])]


def source_entries(location: str, options: ArchiveOptions, store) -> list[Entry]:
    """The files a glob, directory, prefix or @FILE names, each with the DMR++ beside it (read instead of its
    header) where there is one: the one listing of a mount that scans them all and of one that scans lazily.
    Files `store` (the scan store) saw at the last mount of `location` and that are gone are said."""
    entries = listed_entries(location, options)
    names = {e.name for e in entries}
    for gone in sorted(set(store.previous_names(location)) - names):
        log.warning("%s: file %s is gone since the last mount; it leaves the mount", redact(location), quote(gone))
    return entries


def listed_entries(location: str, options: ArchiveOptions) -> list[Entry]:
    """The files `location` lists now, each checked against the source's trust (fetch/trust.py): at
    mount and at every --refresh alike. Blocking (a listing): in a thread when a mount serves."""
    entries = list_sources(location, listing_options(location, options), options.remote_options.get("headers"), True,
                           options.strict)
    if not entries:
        raise RefmountError(f"{quote(redact(location))} names no files")
    check_listed(options.trust, entries)
    return entries


async def identities(entries: list[Entry], fetcher, connections: int) -> dict[str, tuple]:
    """{name: identity} of listed files, for `refs.scan.changes.listing_changes`: url, sidecar and
    (size, version) as a scan identifies them (a stat, the listing's date or ETag, else one HEAD;
    `fetcher` must be one that pins no version: it forgets what it saw of each url first).
    FetchError when a file cannot be identified now."""
    out: dict[str, tuple] = {}
    failed: list[FetchError] = []
    limiter = trio.CapacityLimiter(max(1, connections))

    async def one(entry: Entry) -> None:
        async with limiter:
            fetcher.forget(entry.url)
            try:
                out[entry.name] = (entry.url, entry.sidecar, entry.sidecar_listed, *await _identify(fetcher, entry))
            except FetchError as e:  # (not out of the nursery: a group of them would be an "internal error")
                failed.append(e)

    async with trio.open_nursery() as nursery:
        for entry in entries:
            nursery.start_soon(one, entry)
    if failed:
        raise failed[0]
    return {e.name: out[e.name] for e in entries}


def _check_parsers() -> None:
    import importlib.util

    missing = [name for name in ("kerchunk", "h5py") if importlib.util.find_spec(name) is None]
    if missing:
        raise RefmountError(f"scanning data files needs {' and '.join(missing)}: pip install 'refmount[archives]'")


def _settle(location: str, single: bool, options: ArchiveOptions, results, failures,
            unavailable: set | None = None) -> list[Scanned]:
    """The files scanned; each failure a log line (or the error, for one file or with --strict). The names
    of those whose bytes could not be had now (a fetch error: the next refresh asks again) go to
    `unavailable`."""
    scanned = [r for r in results if r is not None]
    for entry, message, may_pass in failures:
        if single or options.strict:
            raise RefmountError(f"{quote(redact(entry.url))}: {message}")
        log.warning("%s: %s; left out of the mount", redact(entry.url), message)
        if may_pass and unavailable is not None:
            unavailable.add(entry.name)
    if not single and not scanned:
        raise RefmountError(f"no file of {quote(redact(location))} could be scanned")
    for s in scanned:
        log_refused(s)
    return scanned


def log_refused(s: "Scanned") -> None:
    """One log line per variable a file's scan left out (a DMR++'s conversion words its own)."""
    for reason in s.refused:
        if s.format == "dmrpp":
            log.warning("%s", reason)
        else:
            log.warning("%s: variable %s (cannot be referenced; left out)", redact(s.url), reason)


class _Reader:
    """refmount's fetcher with a block cache in front, for headers and coordinates."""

    def __init__(self, options: ArchiveOptions) -> None:
        from refmount.cache.blocks import BlockCache
        from refmount.fetch import RetryPolicy

        policy = RetryPolicy(read_timeout=options.read_timeout, stall_timeout=options.stall_timeout)
        # More connections than reads use: revalidating an archive is one HEAD per file, each a round trip
        self.fetcher = scan_fetcher(options, policy=policy,
                                    connections_per_host=max(options.connections, REVALIDATION_CONNECTIONS))
        self.fetcher.max_full_download = options.max_full_download
        bs = options.block_size

        async def fetch(url, start, end):
            return await self.fetcher.read(url, start, end, bs)

        self.cache = BlockCache(fetch, block_size=bs, capacity=SCAN_CACHE_BYTES)
        self.kept: dict[tuple[str, int, int], bytes] = {}  # (see keep_small_arrays)
        self.kept_bytes = 0

    async def read(self, url: str, start: int, end: int):
        return await self.cache.read(url, start, end)

    async def read_exact(self, url: str, start: int, end: int):
        """A coordinate's chunk: kept when its file was scanned, or from the header's blocks when they are
        cached still, else as a request of that range alone (a file a DMR++ described: none of it was
        read, and a whole block of it would be a MiB per file for a few bytes of time)."""
        kept = self.kept.get((url, start, end))
        if kept is not None:
            return kept
        return await self.cache.read_exact(url, start, end)

    def keep_small_arrays(self, url: str, refs: dict) -> None:
        """Copy, from the blocks its scan has just read (no request), the chunks of `url`'s arrays of at
        most one dimension (coordinates, bounds, scalars): --concat reads them all once every file is
        scanned, when a thousand files' headers have long left the block cache (a request per chunk: 3
        more a file, at 80 ms the most of a cold mount's time). Up to KEPT_COORDINATE_BYTES in all."""
        bs = self.cache.block_size
        for start, length in small_array_chunks(url, refs):
            end = start + length
            if length > KEPT_CHUNK_BYTES or self.kept_bytes + length > KEPT_COORDINATE_BYTES:
                continue
            blocks = [self.cache.cached(url, i) for i in range(start // bs, (end - 1) // bs + 1)]
            if length <= 0 or any(b is None for b in blocks):
                continue
            first = start // bs * bs
            self.kept[(url, start, end)] = bytes(b"".join(map(bytes, blocks))[start - first:end - first])
            self.kept_bytes += length

    async def __aenter__(self) -> "_Reader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.fetcher.aclose()


async def _scan_all(entries: list[Entry], reader: _Reader, options: ArchiveOptions, store, max_refs_size: int,
                    timeout: float | None, max_keys: int | None = None):
    from refmount.refs.scan.pool import ScanPool, ScanFailed

    read = reader.read
    pool = ScanPool(read, workers=scanner_count(options, len(entries)), memory=SCANNER_MEMORY,
                    max_result=max_refs_size, timeout=timeout, exists=exists_asker(options))
    results: list[Scanned | None] = [None] * len(entries)
    failures: list[tuple[Entry, str]] = []
    lookups = trio.CapacityLimiter(max(16, 4 * options.connections))
    done = 0

    def finished() -> None:
        nonlocal done
        done += 1
        if options.progress:
            options.progress(done, len(entries))

    async def one(i: int, entry: Entry) -> None:
        try:
            scanned = await scan_entry(entry, reader.fetcher, reader.read, pool, store, lookups, max_refs_size,
                                       dmrpp_limits=lambda: dmrpp_job(options, max_keys))
            check_scanned(options.trust, entry, scanned)
            if options.concat and scanned.format != "dmrpp":
                reader.keep_small_arrays(entry.url, scanned.refs)
            scanned.files = files(entry.url, entry.sidecar)
            results[i] = scanned
        except (ScanFailed, FetchError) as e:  # (a fetch error, a scanner killed: the next refresh asks again)
            failures.append((entry, str(e), isinstance(e, FetchError) or passing(e) is not None))
        finally:
            finished()

    try:
        async with trio.open_nursery() as nursery:
            for i, entry in enumerate(entries):
                nursery.start_soon(one, i, entry)
    finally:
        pool.close()
    order = {id(e): i for i, e in enumerate(entries)}
    failures.sort(key=lambda f: order[id(f[0])])
    return results, failures


async def scan_entry(entry: Entry, fetcher, read, pool, store, lookups, max_refs_size: int, *,
                     dmrpp_limits=dict) -> Scanned:
    """One file's references: from its DMR++, from the scan store (same version), or scanned in one of
    `pool`'s workers with its header read through `read` (url, start, end). ScanFailed or FetchError.
    `dmrpp_limits()`: a DMR++ conversion's limits, when it starts (`dmrpp_job`)."""
    from refmount.refs.scan.pool import ScanFailed

    if entry.store:  # (a lazy mount loads it as its own dataset: ArchiveScanner)
        from refmount.refs.scan.catalogs import STORES

        raise ScanFailed(f"is {STORES[entry.store]}, which mounts as its item's own directory only: it is not "
                         "combined by --concat nor scanned with --strict or by refmount scan")
    if entry.sidecar and entry.sidecar.endswith(IDX_SUFFIX) and entry.sidecar != entry.url:
        from refmount.refs.scan.idxscan import from_idx

        return await from_idx(entry, fetcher, read, pool, store, lookups, max_refs_size, scan_entry=scan_entry,
                              identify=_identify, scanned_as=Scanned)
    if entry.sidecar and entry.sidecar == entry.url and entry.url.split("?")[0].endswith(".json"):
        return await _from_reference_asset(fetcher, entry, read, lookups, max_refs_size)
    if entry.sidecar:
        return await _from_sidecar(fetcher, entry, lookups, store, max_refs_size, pool, dmrpp_limits)
    async with lookups:
        size, version = await _identify(fetcher, entry)
    kept = store.get(entry.url, version, max_refs_size) if version else None
    if kept is not None:
        return Scanned(entry.name, entry.url, kept["format"], kept["refs"], kept.get("refused", []), version)
    if size == 0:
        raise ScanFailed("is empty")
    async with pool.slots:  # sniffed and scanned in one go: its first block is still cached
        head = bytes(await read(entry.url, 0, min(size, SNIFF_BYTES)))
        fmt = sniff(head)
        if fmt is None:
            raise ScanFailed("is not a netCDF, HDF5, HDF4, GRIB, TIFF or FITS file (told by its first bytes)")
        if head[:4] == b"CDF\x05":  # (kerchunk's reader says only "Unexpected header")
            raise ScanFailed("is a netCDF-3 64-bit-data (CDF5) file: kerchunk's netCDF-3 reader reads CDF1 and "
                             "CDF2 only")
        try:
            scan = await pool.scan(fmt, entry.url, size)
        except ScanFailed as e:
            if passing(e) is not None:  # (a scanner killed: not the file's doing)
                raise
            raise ScanFailed(f"{FORMAT_NAMES[fmt]} file that cannot be scanned: {e}") from None
    refs, refused = scan.get("refs"), scan.get("refused", [])
    if not isinstance(refs, dict) or not isinstance(refused, list):
        raise ScanFailed("the scanner gave no references")
    if fmt == "netcdf3":  # (FITS images past the end are left out by their scanner, refs/scan/fits.py)
        _check_complete(entry.url, size, refs)
    if version and not any(str(r).endswith(INSTALL_ARCHIVES) for r in refused):
        store.put(entry.url, version, {"format": fmt, "refs": refs, "refused": refused})
    return Scanned(entry.name, entry.url, fmt, refs, [str(r) for r in refused], version)


async def _from_reference_asset(fetcher, entry: Entry, read, lookups, max_refs_size: int) -> Scanned:
    """A dataset's kerchunk references as a catalog lists them (a STAC item's reference asset): a JSON
    reference set of version 0 or 1, its plain templates ({{u}}) filled in and its relative urls resolved
    against the asset's own url. Its targets are checked as a scanned file's (check_scanned)."""
    import re

    from refmount.refs.relative import base_of, is_relative, resolve
    from refmount.refs.scan.pool import ScanFailed

    async with lookups:
        size, version = await _identify(fetcher, entry)
    if size > max_refs_size:
        raise ScanFailed(f"its references are larger than --max-refs-size ({max_refs_size} bytes)")
    try:
        doc = orjson.loads(bytes(await read(entry.url, 0, size)) if size else b"")
    except orjson.JSONDecodeError:
        raise ScanFailed("is a reference asset that is not JSON") from None
    refs = doc.get("refs") if isinstance(doc, dict) and doc.get("version") == 1 else doc
    templates = doc.get("templates") if isinstance(doc, dict) and doc.get("version") == 1 else None
    if not isinstance(refs, dict) or "gen" in doc and doc.get("version") == 1:
        raise ScanFailed("is not a kerchunk reference set (version 0 or 1, without 'gen')")
    templates = templates if isinstance(templates, dict) else {}

    def target(url):
        if not isinstance(url, str):
            raise ScanFailed("names a target that is not a string")
        url = re.sub(r"{{\s*(\w+)\s*}}", lambda m: str(templates.get(m.group(1), m.group(0))), url)
        return resolve(url, base_of(entry.url)) if is_relative(url) else url

    out = {}
    for key, value in refs.items():
        if isinstance(value, list) and value:
            value = [target(value[0]), *value[1:]]
        elif not isinstance(value, str):
            raise ScanFailed(f"has a value of key {key!r} that is neither a string nor a list")
        out[key] = value
    return Scanned(entry.name, entry.url, "kerchunk", out, [], version)


def small_array_chunks(url: str, refs: dict):
    """(offset, length) of the chunks in `url` of the arrays of at most one dimension in a file's
    references (by each `.zarray`'s chunk grid)."""
    for key, meta in refs.items():
        if not key.endswith(".zarray"):
            continue
        try:
            array = ArrayMeta.from_zarray(orjson.loads(meta))
            if len(array.grid()) > 1:
                continue
        except (orjson.JSONDecodeError, TypeError, ArrayMetaError):
            continue
        prefix = key[: -len(".zarray")]
        for index in itertools.islice(array.chunk_indices(), 1024):
            value = refs.get(prefix + array.chunk_key(index))
            if isinstance(value, list) and len(value) == 3 and value[0] == url and type(value[1]) is int \
                    and type(value[2]) is int:
                yield value[1], value[2]


def _check_complete(url: str, size: int, refs: dict) -> None:
    """A netCDF-3 file cut short (its header still parses) places data past its end: said now as what
    it is. (HDF5 says so itself; kerchunk's GRIB scanner writes ranges past the end of whole files.)"""
    from refmount.refs.scan.pool import ScanFailed

    end = max((v[1] + v[2] for v in refs.values() if isinstance(v, list) and len(v) == 3 and v[0] == url
               and isinstance(v[1], int) and isinstance(v[2], int)), default=0)
    if end > size:
        raise ScanFailed(f"it is truncated (its header places data up to byte {end:,} of its {size:,})")


def dmrpp_module():
    """refmount.refs.dmrpp (DMR++ sidecars), where it is installed; None otherwise."""
    import importlib

    try:  # (by name: the module is optional)
        dmrpp = importlib.import_module("refmount.refs.dmrpp")
    except ImportError:
        return None
    return dmrpp if hasattr(dmrpp, "dmrpp_to_refs") else None


async def _from_sidecar(fetcher, entry: Entry, lookups, store, max_refs_size, pool, dmrpp_limits,
                        data_url: str | None = None, called: str | None = None) -> Scanned:
    """A data file's references from its DMR++ (no byte of the data file is read), converted in one of
    `pool`'s capped workers as it streams through (never in the daemon), its keys counted as they are
    made. The DMR++'s version stands for the file's: kept in the scan store, a warm mount reads neither,
    nor (with --concat) the coordinates again. `data_url`: --data-url (a DMR++ mounted by itself);
    `called`: what the DMR++ is called, when it is read from a copy (of standard input)."""
    from refmount.refs.scan.pool import ScanFailed

    data_url = data_url or (None if entry.url == entry.sidecar else entry.url)
    async with lookups:
        listed = (entry.size, entry.version) if entry.url == entry.sidecar else entry.sidecar_listed  # (a pair's
        # size and version are the data file's)
        size, version = await _identify(fetcher, Entry(entry.name, entry.sidecar, *listed))
    if version:  # (what it was converted with is part of what it is)
        version = f"dmrpp {version}" + (f" data {data_url}" if data_url else "")
    job = {**dmrpp_limits(), "data_url": data_url, "name": called or entry.sidecar}
    kept = store.get(entry.sidecar, version, max_refs_size) if version else None
    if kept is not None and isinstance(kept.get("refs_json"), str) and isinstance(kept.get("keys"), int):
        if job.get("max_keys") is not None and kept["keys"] > job["max_keys"]:  # (the limits of this mount)
            from refmount.refs.scan.worker import too_many_keys

            raise ScanFailed(too_many_keys(job["name"], job["max_keys"], job.get("keys_limit") or "--max-keys"))
        targets = kept.get("targets")
        return Scanned(entry.name, data_url or entry.url, "dmrpp", kept["refs_json"].encode(),
                       kept.get("refused", []), version,
                       targets=tuple(targets) if isinstance(targets, list) else None)
    if size > 256 << 20:
        raise ScanFailed(f"its DMR++ {redact(entry.sidecar)} is larger than 256 MiB")
    async with pool.slots:
        scan = await pool.scan("dmrpp", entry.sidecar, size, job)
    refs, refused, keys, targets = scan.get("refs"), scan.get("refused", []), scan.get("keys"), scan.get("targets")
    if not isinstance(refs, (bytes, bytearray)) or not isinstance(refused, list) or not isinstance(keys, int) \
            or not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise ScanFailed("the scanner gave no references")
    for note in scan.get("notes", []):
        log.info("%s", note)
    refused = [str(r) for r in refused]
    if version:  # (as one JSON string: a warm mount makes no dict of them either)
        store.put(entry.sidecar, version, {"format": "dmrpp", "refs_json": refs.decode(), "refused": refused,
                                           "keys": keys, "targets": targets})
    return Scanned(entry.name, data_url or entry.url, "dmrpp", bytes(refs), refused, version, targets=tuple(targets))


def daemon_target(options: ArchiveOptions) -> int | None:
    """The memory target of the daemon the references go to (None: no daemon, as for `refmount scan`)."""
    from refmount.cache.target import DEFAULT_TARGET

    return options.memory_target or (DEFAULT_TARGET if options.lazy else None)


def dmrpp_job(options: ArchiveOptions, max_keys: int | None) -> dict:
    """How many keys a DMR++ conversion may make, and why: --max-keys, or fewer when the daemon's
    memory target leaves room for fewer (a loaded key costs up to BYTES_PER_KEY; measured beside what
    the daemon holds now, its header cache and its reserve), so that the worker refuses while reading."""
    from refmount.cache.target import reserve_for, resident_bytes
    from refmount.errors import format_size
    from refmount.refs.limits import BYTES_PER_KEY

    job = {"max_keys": max_keys, "keys_limit": f"--max-keys {max_keys:,}" if max_keys is not None else ""}
    target = daemon_target(options)
    if target:
        held = resident_bytes()
        fit = max(target - held - SCAN_CACHE_BYTES - reserve_for(target), 0) // BYTES_PER_KEY
        if max_keys is None or fit < max_keys:
            job = {"max_keys": fit, "keys_limit": f"all that --memory-target {format_size(target)} leaves beside "
                                                  f"the {held >> 20} MiB the daemon holds"}
    return job


def exists_asker(options: ArchiveOptions):
    """A DMR++ worker's question whether a file is there (its href's: refs.dmrpp.data_url_of), answered
    by the daemon, with the source's options."""
    async def exists(url: str):
        module = dmrpp_module()
        return await trio.to_thread.run_sync(module._exists, url, options.remote_options) if module else None

    return exists


async def _identify(fetcher, entry: Entry) -> tuple[int, str | None]:
    """(size, version) of a file: a local file's stat, the listing's ETag, or one HEAD."""
    from refmount.fetch.protocols import is_remote, local_path

    if not is_remote(entry.url):
        try:
            st = await trio.to_thread.run_sync(os.stat, local_path(entry.url))
        except FileNotFoundError:
            raise FetchError("does not exist") from None
        except OSError as e:
            raise FetchError(e.strerror) from None
        return st.st_size, f"size {st.st_size} mtime {st.st_mtime_ns}"
    if entry.size is not None and entry.version:
        return entry.size, f"{entry.version} size {entry.size}"
    size = await fetcher.size(entry.url)
    try:
        version = await fetcher.identity(entry.url)
    except FetchError:
        version = None
    return size, (f"{version} size {size}" if version else None)


def refs_dict(refs: dict | bytes) -> dict:
    """References as a dict (a DMR++'s come as JSON bytes)."""
    return orjson.loads(refs) if isinstance(refs, (bytes, bytearray)) else refs


def combined_refs(kind: str, scanned: list[Scanned], options: ArchiveOptions, read) -> dict | bytes:
    """The references of the mount: one file's (a DMR++'s as JSON bytes), one subdirectory per file,
    or combined."""
    if kind == "file":
        return scanned[0].refs
    if options.concat:
        from refmount.refs.combine import combine_datasets

        return combine_datasets([(s.name, refs_dict(s.refs)) for s in scanned], options.concat,
                                identical=tuple(options.identical), skip_mismatched=options.skip_mismatched,
                                read=read, decode=options.decode, growing=options.growing)
    out = {".zgroup": '{"zarr_format":2}'}
    for s in scanned:
        prefix = s.name + "/"
        for key, value in refs_dict(s.refs).items():
            out[prefix + key] = value
    return out


def combined_origins(kind: str, scanned: list[Scanned], options: ArchiveOptions) -> Origins:
    """Which files stand behind the keys `combined_refs` makes (refs/origins.py): one file's; each
    subdirectory its file's and the root every file's; or, combined, every key every file's."""
    every = files(*(f for s in scanned for f in s.files))
    if kind == "file":
        return Origins(scanned[0].files)
    if options.concat:
        return Origins(every)
    return Origins(every, {s.name: s.files for s in scanned})


def refset_of(refs: dict | bytes, location: str, *, max_keys, max_refs_size, max_value_size, serving: bool = False):
    """A `RefSet` of a reference dict (or its JSON bytes), within the loading limits. `serving`: in a mount that serves
    already (a lazily mounted glob's file), where the process-wide memory net of loading
    (limits.memory_limit) must not be set: the scan's result is bounded by --max-refs-size already."""
    import contextlib

    from refmount.refs.jsonrefs import load_json
    from refmount.refs.limits import memory_budget, memory_limit
    from refmount.refs.model import RefSetBuilder

    text = refs if isinstance(refs, (bytes, bytearray)) else orjson.dumps(refs)
    if max_refs_size is not None and len(text) > max_refs_size:
        raise RefsError(f"the references of {quote(redact(location))} exceed --max-refs-size")
    builder = RefSetBuilder(max_keys, max_refs_size)
    with contextlib.nullcontext() if serving else memory_limit(memory_budget(max_keys, max_refs_size)):
        load_json(lambda: io.BytesIO(text), builder, max_value=max_value_size)
        return builder.build()


def load_archive(location: str, options: ArchiveOptions, *, max_keys, max_refs_size, max_value_size, timeout):
    """The reference set (a `RefSet`) of a data file or archive; `refused` per file name attached. With
    `options.lazy`, a glob (not combined, not --strict) is only listed: a `LazyArchive`."""
    if options.lazy and looks_like_many(location, options.remote_options) and not options.concat and not options.strict:
        return LazyArchive.listed(location, options, max_keys=max_keys, max_refs_size=max_refs_size,
                                  max_value_size=max_value_size, timeout=timeout)
    from refmount.refs.scan.kept import KeptCombination

    options = with_trust(options, location)  # (a kept combination's targets are checked as a fresh one's)
    kept = KeptCombination(location, options, max_refs_size, combine=combined_refs, targets=scanned_targets,
                           scanned_as=Scanned)
    unavailable: set[str] = set()

    def loaded(shortcut):
        kind, scanned, refs = scan_source(location, options, max_refs_size=max_refs_size, timeout=timeout,
                                          then=kept.then, max_keys=max_keys, kept=shortcut, unavailable=unavailable)
        return kind, scanned, refset_of(refs, location, max_keys=max_keys, max_refs_size=max_refs_size,
                                        max_value_size=max_value_size)

    kind, scanned, refset = loaded(kept)
    if kept.targets is not None and not kept.names_no_other(refset):  # (a kept set naming another url)
        log.warning("%s: the combination kept in the scan store names urls its files do not; combined again",
                    redact(location))
        kind, scanned, refset = loaded(None)
    refset.refused = {s.name: list(s.refused) for s in scanned if s.refused}
    refset.formats = {s.name: s.format for s in scanned}  # (refmount inspect says what each makes arrays of)
    refset.unavailable = unavailable  # (files left out for now: a --refresh asks again, fuse/refresh.py)
    refset.scanned = kind
    refset.origins = combined_origins(kind, scanned, options)
    return refset


def load_dmrpp(location: str, stream, options: ArchiveOptions, *, data_url: str | None, max_keys, max_refs_size,
               max_value_size, timeout):
    """The reference set (a `RefSet`) of a DMR++ mounted by itself (a path or url; `stream`: it opened, as
    the loaders found it), converted in a capped scan worker as for a DMR++ in a glob. Standard input
    (or another pipe) can be read only once: a bounded copy of it is converted, under its own name."""
    from refmount.fetch.protocols import is_remote, local_path
    from refmount.refs.scan.pool import ScanFailed, ScanPool
    from refmount.refs.scan.store import ScanStore, default_scan_dir

    _check_parsers()
    url, called = location, None
    try:
        if not is_remote(location) and not os.path.isfile(local_path(location)):
            url, called = _copy_of(stream, location, max_refs_size), location
    finally:
        stream.close()
    name = location.rstrip("/").rsplit("/", 1)[-1]
    entry = Entry(name, url, sidecar=url)
    # (a copy's version is its own, not the input's: not kept)
    store = ScanStore(None if called else options.scan_dir or default_scan_dir(options.cache_dir))

    async def main() -> Scanned:
        async with _Reader(options) as reader:
            pool = ScanPool(reader.read, workers=1, memory=SCANNER_MEMORY, max_result=max_refs_size, timeout=timeout,
                            exists=exists_asker(options))
            try:
                return await _from_sidecar(reader.fetcher, entry, trio.CapacityLimiter(1), store, max_refs_size, pool,
                                           lambda: dmrpp_job(options, max_keys), data_url, called)
            finally:
                pool.close()

    started = time.monotonic()
    try:
        scanned = trio.run(main)
    except (ScanFailed, FetchError) as e:
        text = str(e)  # (the conversion's own errors name the file: the scanner's do not)
        raise RefsError(text if text.startswith(("DMR++ file", repr(location))) else
                        f"DMR++ file {quote(redact(location))}: {text}") from None
    finally:
        if called:
            os.unlink(url)
    log_refused(scanned)
    log.info("DMR++ %s: %d bytes of references in %.2f s (converted in a scan worker, or kept by the scan store)",
             redact(location), len(scanned.refs), time.monotonic() - started)
    try:
        return refset_of(scanned.refs, location, max_keys=max_keys, max_refs_size=max_refs_size,
                         max_value_size=max_value_size)
    except RefsError as e:
        raise RefsError(f"DMR++ file {quote(redact(location))}: {e}") from None


def _copy_of(stream, location: str, max_refs_size: int | None) -> str:
    """A private temporary copy of what `stream` holds (at most --max-refs-size)."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="refmount-dmrpp-", suffix=".dmrpp")
    try:
        with os.fdopen(fd, "wb") as out:
            done = 0
            while True:
                data = stream.read(1 << 20)
                if not data:
                    break
                done += len(data)
                if max_refs_size is not None and done > max_refs_size:
                    raise RefsError(f"DMR++ file {quote(location)} exceeds --max-refs-size {max_refs_size:,} bytes")
                out.write(data)
    except BaseException:
        os.unlink(path)
        raise
    return path


class ScanRefused(RefmountError):
    """A file of a lazily mounted glob that cannot be scanned: its directory is EIO, said once in the log."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{redact(url)}: {message}")
        self.once = "scan " + url


@dataclass
class LazyArchive:
    """A glob mounted lazily: its files are listed at mount, and each is scanned when its directory is
    first looked up (refmount.fuse.datasets). `urls` is the mount's url table: file k's url is urls[k]."""

    location: str
    entries: list
    options: ArchiveOptions
    max_keys: int | None
    max_refs_size: int | None
    max_value_size: int | None
    timeout: float | None
    scanned = "lazy"
    refused: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        from refmount.refs.urltable import UrlTable

        self.table = UrlTable([e.url for e in self.entries])
        self.urls = self.table.urls
        self.names = [e.name for e in self.entries]

    def extend(self, entries: list[Entry], renewed: set[str]) -> list[int]:
        """Add files a --refresh listed (new ones, and new versions of files already here: `renewed`
        names them, and their urls get new ids: refs/urltable.py); their indexes. A file's index is
        never reused: the mount's inodes derive from it."""
        first = len(self.entries)
        for entry in entries:
            if entry.name in renewed:
                self.table.renew(entry.url)
            self.entries.append(entry)
            self.names.append(entry.name)
        return list(range(first, len(self.entries)))

    @classmethod
    def listed(cls, location: str, options: ArchiveOptions, **limits) -> "LazyArchive":
        _check_parsers()
        options = with_trust(options, location)
        from refmount.refs.scan.store import ScanStore, default_scan_dir

        store = ScanStore(options.scan_dir or default_scan_dir(options.cache_dir))
        entries = source_entries(location, options, store)
        store.put_names(location, [e.name for e in entries])
        log.info("listed %d file(s) of %s; each is scanned when its directory is first looked up", len(entries),
                 redact(location))
        return cls(location, entries, options, **limits)

    def scanner_workers(self) -> int:
        """Scanners the mount keeps room for in its memory plan (they may run while it serves): fewer than
        at a mount that scans everything (files are looked up one or a few at a time), fewer still under a
        small --memory-target."""
        return min(scanner_count(self.options, len(self.entries)), 4)

    def global_url_id(self, url: str) -> int:
        return self.table.id_of(url)  # (another object than the file's own: checked by check_scanned)


class ArchiveScanner:
    """Scans a `LazyArchive`'s files one at a time as they are asked for, in the mount's trio run: the
    headers through `read` (url, start, end: the mount's block cache), in up to `workers` processes."""

    def __init__(self, archive: LazyArchive, fetcher, read, workers: int) -> None:
        from refmount.refs.scan.pool import ScanPool
        from refmount.refs.scan.store import ScanStore, default_scan_dir

        options = archive.options
        self.archive = archive
        self.fetcher = fetcher
        self.read = read
        self.store = ScanStore(options.scan_dir or default_scan_dir(options.cache_dir))
        self.pool = ScanPool(read, workers=workers, memory=SCANNER_MEMORY, max_result=archive.max_refs_size,
                             timeout=archive.timeout, exists=exists_asker(options))
        self.lookups = trio.CapacityLimiter(max(16, 4 * options.connections))
        # a DMR++'s key budget from what the daemon holds now, at mount: later its caches fill the target,
        # and they give way (the governor) to what a lookup loads
        self.dmrpp_limits = dmrpp_job(options, archive.max_keys)
        self.files_scanned = 0  # (from the store or scanned)
        self.seconds = 0.0

    async def refset(self, k: int):
        """File k's reference set, its url ids those of the mount's table. ScanRefused when the file
        cannot be scanned; FetchError when its bytes cannot be had now (a later lookup tries again)."""
        from refmount.refs.scan.pool import ScanFailed

        archive = self.archive
        entry = archive.entries[k]
        started = time.monotonic()
        if entry.store:
            refset = await self._store(k, entry)
            log.info("loaded %s %s in %.2f s", entry.store, redact(entry.url), time.monotonic() - started)
            return refset
        # A server down fails the lookup in a second, not a --read-timeout of retries: a later lookup asks
        # again. A slow one keeps --read-timeout and --stall-timeout: a scan may read a whole GRIB message.
        policy = self.fetcher.policy
        first_look = dataclasses.replace(policy.asked_again(), read_timeout=policy.read_timeout,
                                         stall_timeout=policy.stall_timeout)
        try:
            with retrying_under(first_look):
                scanned = await scan_entry(entry, self.fetcher, self.read, self.pool, self.store, self.lookups,
                                           archive.max_refs_size,
                                           dmrpp_limits=lambda: self.dmrpp_limits)
            check_scanned(archive.options.trust, entry, scanned)
        except ScanFailed as e:
            if passing(e) is not None:  # (a scanner killed: a later lookup scans it again)
                raise Unavailable(f"{redact(entry.url)}: {e}") from None
            raise ScanRefused(entry.url, str(e)) from None
        log_refused(scanned)
        try:
            refset = await trio.to_thread.run_sync(lambda: refset_of(
                scanned.refs, entry.url, max_keys=archive.max_keys, max_refs_size=archive.max_refs_size,
                max_value_size=archive.max_value_size, serving=True))
        except (RefsError, MemoryError) as e:  # (a limit: the same at every lookup)
            raise ScanRefused(entry.url, f"its references are refused: {e or 'out of memory'}") from None
        # (one table, shared: the block cache's keys are its ids)
        own = archive.table.id_of(entry.url)
        archive.table.share(refset, fallback=(own, own + 1))
        refset.refused = {scanned.name: list(scanned.refused)} if scanned.refused else {}
        refset.origins = Origins(files(entry.url, entry.sidecar))
        self.files_scanned += 1
        self.seconds += time.monotonic() - started
        log.info("scanned %s in %.2f s", redact(entry.url), time.monotonic() - started)
        return refset

    async def _store(self, k: int, entry: Entry):
        """A catalog item's Zarr store, Icechunk repository or Parquet references (`entry.store`), loaded
        by the loader of a direct mount of its url (refs.load_refs), in a thread, within the mount's
        limits; its targets checked against the store's url as the catalog named it (fetch/trust.py).
        ScanRefused (its directory EIO, one log line naming the url) when it cannot be loaded; FetchError
        when it cannot be loaded now for a reason that may pass (a 503, a connection refused: asked again
        at a lookup after a while, fuse/datasets.py)."""
        archive = self.archive
        options = archive.options
        if options.load_store is None:  # (a library's LazyArchive without the loader)
            raise ScanRefused(entry.url, f"is {entry.store}, and no loader of stores was given")
        try:
            document = options.trust.names(entry.url)

            def load():
                return options.load_store(entry.url, remote_options=options.remote_options, max_keys=archive.max_keys,
                                 max_refs_size=archive.max_refs_size, max_value_size=archive.max_value_size,
                                 load_timeout=None, store=entry.store, serving=True)

            with trio.fail_after(archive.timeout or float("inf")):
                async with self.lookups:
                    refset = await trio.to_thread.run_sync(load, abandon_on_cancel=True)
            if getattr(refset, "icechunk_containers", None):
                raise ScanRefused(entry.url, "its virtual chunks are in containers a catalog cannot authorise: mount "
                                  "the repository's url on its own, with --authorize-container")
            if getattr(refset, "lazy", False):  # (Parquet: its targets enter the mount's table as records load)
                refset.url_check = document.check
                refset.share_url_table(archive.table)
                own = archive.table.id_of(entry.url)
                refset.url_span = (own, own + 1)
            else:
                for url in refset.urls:
                    document.check(url)
                own = archive.table.id_of(entry.url)
                archive.table.share(refset, fallback=(own, own + 1))
        except trio.TooSlowError:  # (a server slow for now, or a machine busy: asked again after a while)
            raise Unavailable(f"{redact(entry.url)}: loading it took longer than --load-timeout "
                              f"({archive.timeout:g} s)") from None
        except ScanRefused:
            raise
        except FetchError as e:
            if passing(e) is not None:
                raise Unavailable(f"{redact(entry.url)}: {e}") from None  # (may pass: asked again after a while)
            raise ScanRefused(entry.url, str(e)) from None
        except (RefmountError, MemoryError) as e:  # (TargetRefused among them: it names the target and the store)
            raise ScanRefused(entry.url, str(e) or "out of memory") from None
        self.files_scanned += 1
        return refset

    def statistics(self) -> dict:
        return {"files": len(self.archive.entries), "scanned": self.files_scanned,
                "seconds": round(self.seconds, 3)}

    def close(self) -> None:
        self.pool.close()
