"""Wire the parts together from `MountOptions`: reference set -> fetcher -> cache -> view -> fs."""

from __future__ import annotations

import logging
import os
import sys

import trio

from refmount.cache.blocks import BlockCache
from refmount.cache.budget import MemoryBudget, ScratchLimiter
from refmount.cache.buffers import BufferPool
from refmount.cache.governor import MemoryGovernor
from refmount.cache.malloc import give_back_freed_memory, malloc_statistics
from refmount.cache.passing import PassingBlocks
from refmount.cache.target import later_imports, plan_memory, resident_bytes
from refmount.view.consolidated import with_consolidated_metadata
from refmount.errors import FetchError, RefmountError, quote
from refmount.fetch import Fetcher, RetryPolicy, redact, roundtrip
from refmount.fetch.stats import host_of
from refmount.fuse.early import prepare
from refmount.fuse.fs import Filesystem
from refmount.fuse.pyfuse3_build import describe as pyfuse3_build
from refmount.cache.pacer import HostPacer
from refmount.refs import WHOLE_FILE, load_refs
from refmount.refs.icechunk import version_from_options
from refmount.fetch.trust import Location
from refmount.fuse.fs import ROOT_INODE
from refmount.refs.urltable import UrlTable
from refmount.view.raw import RawView

log = logging.getLogger("refmount")


def mount_location(opts):
    """The mount's argument as the trust boundary's first Location (fetch/trust.py): every location
    that enters the mount derives from it, and carries the mount's policy, logins and limits."""
    from refmount.fetch.auth import active

    limits = {name: getattr(opts, name, None) for name in ("max_keys", "max_refs_size", "memory_target")}
    return Location.argument(opts.refs, opts.allow_protocols, logins=active(), limits=limits)


def check_targets(refset, opts, root=None) -> None:
    """Every target url of a loaded set may be used by the document that named it: now for eager
    sets, and for lazy (Parquet) sets also to each url as its record file loads. A glob's scanned
    files were checked each against its own document (its DMR++, its data file) as it was scanned
    (refs/scan/archive.py), so a lazily listed one gets no check here."""
    root = root or mount_location(opts)
    for url in refset.urls:
        root.check(url)
    if getattr(refset, "lazy", False):
        refset.url_check = root.check


def warn_raw_view(refset) -> None:
    """The raw view shows compressed chunks as they are: say so, since netCDF-C without filter
    plugins (Debian's ncdump) would print garbage for them without any error."""
    from refmount.view.arrays import compressed_arrays

    compressed = compressed_arrays(refset)  # (one line, whatever their number: issue 38 row 5)
    if compressed:
        shown = str(compressed)
        log.warning("raw view: arrays %s are compressed or filtered; netCDF-C without filter plugins (e.g. "
                    "Debian's ncdump) reads garbage from them - mount with --view decoded for ncdump", shown)


def v2_view(raw: RawView) -> RawView:
    """The raw view the decoded view builds on: a Zarr v3 set (Icechunk, VirtualiZarr) is first given
    its Zarr v2 form (refmount.view.zarr3), with the same bytes behind its chunks."""
    from refmount.view.zarr3 import is_v3, v2_refset

    if not is_v3(raw.refset):
        return raw
    return RawView(v2_refset(raw.refset), raw.fetcher, raw.cache, prefetch=raw.prefetch,
                   exact_small_reads=raw.small_chunk > 0)


def load_progress():
    """A progress callback for long loads on a terminal (None elsewhere)."""
    if not sys.stderr.isatty():
        return None
    from refmount.fuse.progress import LoadProgress

    return LoadProgress()


def disk_backed(fetch, fetcher, urls, opts):
    """Put the persistent disk cache (--cache-dir) between the block cache and the remote."""
    from refmount.cache.disk import DiskBackedFetch, DiskCache
    from refmount.cache.lru import SingleFlightLRU

    disk = DiskCache(opts.cache_dir, opts.disk_cache_size, opts.block_size)
    objects = SingleFlightLRU(1 << 62)  # url id -> (object id, size), or () when not cacheable

    async def identify(url_id):
        async def lookup():
            url = urls[url_id]
            try:
                validator = await fetcher.identity(url)
            except FetchError as e:  # e.g. a signed url that refuses HEAD: reads may still work
                log.warning("disk cache: not caching %s on disk, its version cannot be checked: %s", redact(url), e)
                return ()
            if validator is None:
                log.info("disk cache: not caching %s on disk, the server gives no ETag or Last-Modified", redact(url))
                return ()
            return disk.object_id(url, validator), await fetcher.size(url)  # the size came with the validator

        return await objects.get(url_id, lookup) or None

    return DiskBackedFetch(disk, fetch, identify), disk


def archive_options(opts, progress=None, lazy=False, trust=None):
    """How data files and archives of them are scanned (refmount.refs.scan), from the mount's options.
    `lazy`: a glob without --concat is only listed (a mount scans each file when it is looked up)."""
    from refmount.refs.scan.archive import ArchiveOptions
    from refmount.view.bounded import decode_bounded

    return ArchiveOptions(decode=decode_bounded, concat=opts.concat, identical=tuple(opts.identical), skip_mismatched=opts.skip_mismatched,
                          strict=opts.strict, cache_dir=opts.cache_dir, block_size=opts.block_size,
                          connections=opts.connections, read_timeout=opts.read_timeout,
                          stall_timeout=opts.stall_timeout, http_client=opts.http_client,
                          allow_cross_host_redirects=opts.allow_cross_host_redirects, progress=progress,
                          remote_options=opts.remote_options, memory_target=opts.memory_target,
                          max_full_download=opts.max_full_download, lazy=lazy, trust=trust,
                          s3_credentials_url=opts.s3_credentials_url, growing=bool(getattr(opts, "refresh", None)),
                          load_store=load_refs)


def load_reference_set(opts, lazy=False, early=None):
    """The reference set of `opts.refs`, loaded within the options' limits and checked against the
    protocol policy (a mount and --dry-run alike). `lazy` (a mount): a glob of data files without
    --concat comes back only listed, a `refs.scan.archive.LazyArchive`. `early`: the mount's
    fuse.early.BeginLoading, which prepares (CA bundle, logins) in its thread."""
    if early is None:
        prepare(opts)
    else:
        early.prepared()
    progress = load_progress()
    root = mount_location(opts)
    scan_progress = None
    if sys.stderr.isatty():
        from refmount.fuse.progress import ScanProgress

        scan_progress = ScanProgress()
    try:
        refset = load_refs(opts.refs, remote_options=opts.remote_options, max_keys=opts.max_keys,
                           max_refs_size=opts.max_refs_size, max_value_size=opts.max_value_size,
                           load_timeout=opts.load_timeout, progress=progress,
                           version=version_from_options(opts), containers=opts.containers,
                           data_url=opts.data_url, archive=archive_options(opts, scan_progress, lazy, root))
    finally:
        if progress:
            progress.close()
        if scan_progress:
            scan_progress.close()
    check_targets(refset, opts, root)
    used = getattr(refset, "icechunk_containers", None)
    if used:
        from refmount.refs.icechunk_containers import check_authorized

        check_authorized(used, opts.authorized_containers, opts.remote_options, refset.icechunk_location)
    return refset


def build_filesystem(opts, early=None):
    from refmount.fetch.auth import active

    if opts.refresh:
        check_refreshable(opts)
    refset = load_reference_set(opts, lazy=True, early=early)
    policy = RetryPolicy(read_timeout=opts.read_timeout, stall_timeout=opts.stall_timeout)
    fetcher = Fetcher(policy=policy, remote_options=opts.remote_options, connections_per_host=opts.connections,
                      allow_cross_host_redirects=opts.allow_cross_host_redirects, verify_remote=opts.verify_remote,
                      http_client=opts.http_client, logins=active(), s3_credentials_url=opts.s3_credentials_url)
    urls = refset.urls

    passing = None

    table = getattr(refset, "table", None) or UrlTable(urls)  # (ids a --refresh retired: refs/urltable.py)

    async def fetch(url_id, start, end):
        if passing.token is None:  # (the trio run is on now: a pass hands its blocks over to it)
            passing.bind(trio.lowlevel.current_trio_token())
        if table.retired:
            table.check(url_id)
        data = await fetcher.read(urls[url_id], start, end, opts.block_size)
        if table.retired:  # (retired while it was fetched: those may be the new version's bytes)
            table.check(url_id)
        return data

    disk = disk_fetch = None
    if opts.cache_dir:
        disk_fetch, disk = disk_backed(fetch, fetcher, urls, opts)
        fetch = disk_fetch
    checksums = getattr(refset, "checksums", None)
    if checksums is not None:  # Icechunk virtual chunks: is each object the committed version?
        from refmount.cache.checksums import verified_fetch

        fetch = verified_fetch(fetch, fetcher, urls, checksums)
    # One memory budget (the block cache's share of --memory-target, or --cache-size) for cached
    # blocks, fetches in flight and read-ahead; read-ahead parts paced per host up to --connections
    # at once. The caches are sized once the views are built (see below).
    budget = MemoryBudget(0)
    pacer = HostPacer(lambda url_id: host_of(urls[url_id]), opts.connections, opts.block_size,
                      round_trip=lambda url_id: roundtrip.of(urls[url_id]))
    pool = BufferPool()  # what both caches keep lives in its slots, outside malloc's heaps
    fetcher.pool = pool  # (http bodies are received straight into them)
    if disk:
        disk_fetch.pool = pool  # (and blocks read from the disk cache)
    cache = BlockCache(fetch, block_size=opts.block_size, max_request=16 << 20, budget=budget, pacer=pacer,
                       pool=pool)
    # a server that ignores Range: one pass over an object serves its reads and keeps what the set
    # refers to (fetch/http.py, cache/passing.py), never further into it than --max-full-download
    passing = fetcher.passing = PassingBlocks(cache, refset, WHOLE_FILE, disk_fetch)
    fetcher.max_full_download = opts.max_full_download or (max(1 << 30, opts.disk_cache_size) if disk else 1 << 30)
    if getattr(refset, "scanned", None) == "lazy":
        return lazy_filesystem(opts, refset, fetcher, cache, budget, pacer, pool, passing, disk), fetcher
    readers = None  # who reads which metadata form (the decoded view's)
    scratch = None
    decoded = opts.view == "decoded"
    if decoded:
        from refmount.view.decoded import check_decoded_view_fits

        scratch = ScratchLimiter(0, os.cpu_count() or 2)
        if opts.form is None:
            from refmount.fuse.readers import ReaderIdentifier

            readers = ReaderIdentifier(fallback=opts.fallback_form)

    def views_of(refset, first=False):
        """(raw view, the view served) of a reference set, over the mount's one fetcher and block cache."""
        view = raw = RawView(refset, fetcher, cache, prefetch=opts.prefetch, exact_small_reads=disk is None)
        if decoded:
            from refmount.view.decoded import DecodedView

            view = raw = v2_view(raw)  # (a Zarr v3 set is shown through its v2 form)
            if first and (opts.memory_target is not None or (opts.cache_size is None and opts.decoded_cache_size is None)):
                check_decoded_view_fits(raw.refset, opts.refs, opts.memory_target)  # (before it is built, not after)
            view = DecodedView(raw, cache_size=0, chars=opts.chars, form=opts.form, scratch=scratch, pool=pool)
        else:
            warn_raw_view(refset)
            view = with_consolidated_metadata(view)
        return raw, view

    raw, view = views_of(refset, first=True)
    refset = view.refset
    governor = plan_caches(opts, urls, budget, cache, view, scratch, pool)
    served = {"bytes": 0, "reads": 0, "reader_bytes": 0, "reader_reads": 0}  # of the trees a --refresh replaced

    def stats() -> dict:
        """Every counter of the mount: `refmount stats` shows it, and --metrics exports it
        (fuse/metrics.py). On the trio thread."""
        out = {"mountpoint": opts.mountpoint, "fetch": fetcher.stats.as_dict(), "cache": cache.statistics(),
               "view": view.name, "keys": len(refset), "pyfuse3": pyfuse3_build(),
               "memory": {**governor.statistics(), **budget.statistics(), **pool.statistics(),
                          "malloc": malloc_statistics()},
               "hosts": host_statistics(pacer, fetcher), "passes": passing.statistics(),
               "logins": fetcher.logins.statistics(),
               # (every number of "readahead" and "grid_readahead" is exported by fuse/metrics.py: as a
               # counter, or a gauge if named as what is there now, 'pending'...)
               "readahead": raw.streams.statistics(),
               "served": {"bytes": served["bytes"] + raw.bytes_served, "reads": served["reads"] + raw.reads_served,
                          "amplification": round(fetcher.stats.bytes / max(served["bytes"] + raw.bytes_served, 1), 3),
                          "reader_bytes": served["reader_bytes"] + tree.bytes_read,
                          "reader_reads": served["reader_reads"] + tree.reads}}
        if raw.grid is not None:
            out["grid_readahead"] = raw.grid.statistics()
        if hasattr(view, "statistics"):
            out["decoded"] = view.statistics()
        if readers is not None:
            out["forms_served"] = readers.statistics()
        if hasattr(refset, "statistics"):
            out["parquet"] = refset.statistics()
        if disk is not None:
            out["disk"] = disk.statistics()
        if refresher is not None:
            out["refresh"] = refresher.statistics()
        return out

    tree = Filesystem(view.refset, view, stats=stats, readers=readers, attr_timeout=attr_timeout(opts))
    fs = tree
    refresher = None
    if opts.refresh:
        from refmount.fuse.generations import Generations
        from refmount.fuse.refresh import quietly

        fs = Generations(tree)

        async def rebuild(changes, entries) -> set | None:
            """A new tree of the source as it is listed now, made as at mount (listed, checked, scanned
            or taken from the scan store, combined) in a thread; then the one swap. The names of the files
            it left out for a fetch error (the next refresh asks again)."""
            nonlocal raw, view, refset, tree
            new = await trio.to_thread.run_sync(quietly, load_reference_set, opts, abandon_on_cancel=True)
            by_name = {e.name: e for e in entries}
            for name in changes.changed:  # (another version: new ids, and the fetcher pins the new one)
                if name in by_name:
                    table.renew(by_name[name].url)
                    fetcher.forget(by_name[name].url)
            local_ids = new.urls
            table.share(new)
            for uid, value in (getattr(new, "checksums", None) or {}).items():  # (Icechunk's, by the table's ids)
                checksums[table.id_of(local_ids[uid])] = value
            new_raw, new_view = quietly(views_of, new)
            if decoded:
                view.resize_decoded(0)  # (the old tree's readers read on without a cache of decoded chunks)
                new_view.resize_decoded(governor.plan.decoded)
                governor.caches = [(size, new_view.resize_decoded if resize == view.resize_decoded else resize)
                                   for size, resize in governor.caches]
            names = await fs.root_names()
            for key in served:
                served[key] += {"bytes": raw.bytes_served, "reads": raw.reads_served,
                                "reader_bytes": tree.bytes_read, "reader_reads": tree.reads}[key]
            raw, view, refset = new_raw, new_view, new_view.refset
            tree = Filesystem(refset, view, stats=stats, readers=readers, attr_timeout=attr_timeout(opts))
            fs.swap(tree)
            if fs.forget_entries is not None:
                fs.forget_entries(ROOT_INODE, names)
            return getattr(new, "unavailable", None)

        if getattr(tree.refset, "snapshot_id", None):  # an Icechunk branch: its newest snapshot
            refresher = snapshot_refresher(opts, rebuild, tree.refset.snapshot_id)
        else:
            refresher = source_refresher(opts, rebuild, shown=set(getattr(tree.refset, "formats", None) or ()))
        fs.refresher = refresher
    fs.governor = governor  # (the daemon runs it while serving)
    return fs, fetcher


def check_refreshable(opts) -> None:
    """--refresh lists a source again: one that lists files (a glob, directory, prefix, index page,
    @FILE or catalog), or an Icechunk branch (its newest snapshot)."""
    from refmount.refs.icechunk import is_icechunk_location
    from refmount.refs.scan.sources import looks_like_many

    if opts.tag or opts.snapshot:
        raise RefmountError("--refresh follows a branch; --tag and --snapshot name one snapshot for good")
    if looks_like_many(opts.refs, opts.remote_options) or is_icechunk_location(opts.refs, opts.remote_options):
        return
    raise RefmountError(f"--refresh: {quote(redact(opts.refs))} is no glob, directory, s3:// prefix, index page, "
                        "@FILE, catalog or Icechunk repository; only a source that lists files, or a branch, can "
                        "be followed")


def snapshot_refresher(opts, apply, snapshot_id: str):
    """The --refresh loop of an Icechunk branch: a commit to it is a new tree (its newest snapshot)."""
    from refmount.fuse.refresh import Refresher
    from refmount.refs.icechunk import current_snapshot, version_from_options

    def listing():
        return [], {"snapshot": current_snapshot(opts.refs, opts.remote_options, version_from_options(opts))}

    return Refresher(opts.refs, None, opts.refresh, apply, shown={"snapshot"}, listing=listing,
                     known={"snapshot": snapshot_id}, connections=opts.connections)


def attr_timeout(opts) -> float:
    """How long the kernel may keep entries and attributes: an hour (the tree does not change), or with
    --refresh one interval (a refresh also tells the kernel what changed: this is the net below that)."""
    return min(3600.0, opts.refresh) if opts.refresh else 3600.0


def source_refresher(opts, apply, shown: set, entries=None):
    """The --refresh loop of the mount's source (fuse/refresh.py), listing it as the mount did. `shown`:
    the files the tree holds now (a file listed but not shown is taken as new at the first refresh);
    `entries`: the mount's own listing, when kept (a lazily mounted glob's)."""
    from refmount.fuse.refresh import Refresher
    from refmount.refs.scan.archive import with_trust

    options = with_trust(archive_options(opts, trust=mount_location(opts)), opts.refs)
    return Refresher(opts.refs, options, opts.refresh, apply, shown=shown, entries=entries,
                     connections=opts.connections)


def host_statistics(pacer, fetcher) -> dict:
    """Per host: how its read-ahead is paced, and what was fetched from it (requests, bytes, retries,
    errors by kind, latency histogram)."""
    paced, fetched = pacer.statistics(), fetcher.stats.hosts()
    return {host: {**paced.get(host, {}), **fetched.get(host, {})} for host in sorted(paced.keys() | fetched.keys())}


def plan_caches(opts, urls, budget, cache, view, scratch, pool, beside: int = 0) -> MemoryGovernor:
    """Size the caches from the memory target now that the daemon holds everything it needs to
    serve (the reference set's tables, the views' plans), measured (cache/target.py). `beside`: what
    else runs against the target (a lazy mount's scanners)."""
    give_back_freed_memory()  # what loading left behind is no part of the daemon's own size
    decoded = scratch is not None
    plan = plan_memory(opts.memory_target, opts.cache_size, opts.decoded_cache_size if decoded else None, decoded,
                       resident_bytes() + later_imports(urls) + beside)
    cache.resize(plan.blocks)
    caches = [(plan.blocks, cache.resize)]
    if decoded:
        view.resize_decoded(plan.decoded)
        scratch.limit = plan.scratch
        caches.append((plan.decoded, view.resize_decoded))
    pool.keep_free = plan.reserve // 4  # free slots kept for reuse count against the reserve
    log.info("%s", plan.describe())
    return MemoryGovernor(plan, budget, caches, pool)


def lazy_filesystem(opts, archive, fetcher, cache, budget, pacer, pool, passing, disk):
    """A glob's mount that scans each file when its directory is first looked up (fuse/datasets.py):
    every file's dataset is a Filesystem of its own, with views over the mount's one fetcher, block
    cache and read-ahead; the files' url ids are the mount's (`archive.urls`: file k's is k)."""
    from refmount.fuse.datasets import DatasetRoot
    from refmount.refs.scan.archive import SCANNER_RSS, ArchiveScanner
    from refmount.view.raw import ReadStreams

    decoded = opts.view == "decoded"
    streams = ReadStreams(cache)
    scratch = ScratchLimiter(0, os.cpu_count() or 2) if decoded else None
    readers = None
    shared = None
    if decoded:
        from refmount.view.decoded import shared_decoded_cache

        shared = shared_decoded_cache(0, pool)
        if opts.form is None:
            from refmount.fuse.readers import ReaderIdentifier

            readers = ReaderIdentifier(fallback=opts.fallback_form)
    views: list = []  # (raw, view) of each file scanned

    def view_of(refset):
        view = raw = RawView(refset, fetcher, cache, prefetch=opts.prefetch, exact_small_reads=disk is None,
                             streams=streams)
        if decoded:
            from refmount.view.decoded import DecodedView

            view = raw = v2_view(raw)
            view = DecodedView(raw, cache_size=0, chars=opts.chars, form=opts.form, scratch=scratch, pool=pool,
                               decoded=shared)
        else:
            view = with_consolidated_metadata(view)
        return raw, view

    async def read(url: str, start: int, end: int):  # (a file, or its DMR++ sidecar: an id of its own)
        return await cache.read(archive.global_url_id(url), start, end)

    workers = archive.scanner_workers()
    scanner = ArchiveScanner(archive, fetcher, read, workers)

    async def open_dataset(k: int) -> Filesystem:
        refset = await scanner.refset(k)
        raw, view = view_of(refset)
        views.append((raw, view))
        return Filesystem(view.refset, view, readers=readers)

    class SharedDecoded:  # what plan_caches resizes: the one cache of decoded chunks
        @staticmethod
        def resize_decoded(capacity: int) -> None:
            shared.resize(capacity)

    governor = plan_caches(opts, archive.urls, budget, cache, SharedDecoded, scratch, pool,
                           beside=workers * SCANNER_RSS)

    def stats() -> dict:
        served_bytes = sum(raw.bytes_served for raw, _ in views)
        out = {"mountpoint": opts.mountpoint, "fetch": fetcher.stats.as_dict(), "cache": cache.statistics(),
               "view": opts.view, "keys": sum(len(view.refset) for _, view in views),
               "pyfuse3": pyfuse3_build(),
               "memory": {**governor.statistics(), **budget.statistics(), **pool.statistics(),
                          "malloc": malloc_statistics()},
               "hosts": host_statistics(pacer, fetcher), "passes": passing.statistics(),
               "logins": fetcher.logins.statistics(), "readahead": streams.statistics(),
               "served": {"bytes": served_bytes, "reads": sum(raw.reads_served for raw, _ in views),
                          "amplification": round(fetcher.stats.bytes / max(served_bytes, 1), 3),
                          "reader_bytes": fs.bytes_read, "reader_reads": fs.reads},
               "scan": scanner.statistics()}
        if decoded:
            out["decoded"] = {"decodes": shared.computed, "decoded_cached": len(shared),
                              "decoded_bytes": shared.weight, "decoded_capacity": shared.capacity,
                              **scratch.statistics()}
        if readers is not None:
            out["forms_served"] = readers.statistics()
        if disk is not None:
            out["disk"] = disk.statistics()
        if fs.refresher is not None:
            out["refresh"] = fs.refresher.statistics()
        return out

    fs = DatasetRoot(archive.names, open_dataset, view_name=opts.view, stats=stats, attr_timeout=attr_timeout(opts))
    fs.refset = archive  # (the daemon warms up and checks its urls)
    fs.governor = governor
    fs.scanner = scanner
    fs.refresher = None
    if opts.refresh:
        async def follow(changes, entries) -> None:
            """New files get directories of their own; a file of another version a new directory under
            its name (scanned at its next lookup); a file gone leaves the root: the one swap."""
            by_name = {e.name: e for e in entries}
            added = [by_name[name] for name in (*changes.added, *changes.changed)]
            indexes = archive.extend(added, set(changes.changed))
            for name in changes.changed:  # (its url has a new id now: the fetcher pins the new version)
                fetcher.forget(by_name[name].url)
            index = fs.shown()
            for name in changes.removed:
                index.pop(name, None)
            index.update((entry.name, k) for entry, k in zip(added, indexes))
            moved = fs.show(index)
            if fs.forget_entries is not None:
                fs.forget_entries(ROOT_INODE, [name.encode("utf-8", "surrogateescape") for name in moved])

        fs.refresher = source_refresher(opts, follow, shown=set(archive.names), entries=list(archive.entries))
    return fs
