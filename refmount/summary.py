"""`refmount mount --dry-run` summaries and `refmount stats` output."""

from __future__ import annotations

import json
import os
from collections import Counter

from refmount.errors import RefmountError, quote
from refmount.refs import INLINE, WHOLE_FILE
from refmount.refs.source import protocol_of


def summarize(refset) -> dict:
    if getattr(refset, "lazy", False):  # Parquet: summarise without loading every record file
        meta = summarize(refset.meta)
        return {**meta, "keys": f"{len(refset):,} at most (chunk references load lazily)",
                "arrays": len(refset.arrays), "record_size": refset.record_size}
    live = refset.dir_of >= 0
    remote = live & (refset.url_id != INLINE)
    ranged = remote & (refset.length != WHOLE_FILE)
    protocols = Counter(protocol_of(u) for u in refset.urls)
    arrays = sum(1 for path in refset.dirs.paths if refset.find(f"{path}/.zarray" if path else ".zarray") >= 0)
    return {
        "keys": int(live.sum()),
        "arrays": arrays,
        "directories": len(refset.dirs),
        "inline_keys": int((live & (refset.url_id == INLINE)).sum()),
        "range_keys": int(ranged.sum()),
        "whole_file_keys": int((remote & (refset.length == WHOLE_FILE)).sum()),
        "bytes_referenced": int(refset.length[ranged].sum()) + sum(len(v) for v in refset.inline.values()),
        "distinct_urls": len(refset.urls),
        "protocols": dict(sorted(protocols.items())),
    }


def print_summary(opts) -> int:
    from refmount.assemble import check_targets, load_progress
    from refmount.refs import load_refs
    from refmount.refs.icechunk import version_from_options

    progress = load_progress()
    try:
        refset = load_refs(opts.refs, remote_options=opts.remote_options, max_keys=opts.max_keys, progress=progress,
                           version=version_from_options(opts))
    finally:
        if progress:
            progress.close()
    check_targets(refset, opts)
    s = summarize(refset)
    print(f"{opts.refs}: valid reference set")
    keys = f"{s['keys']:,}" if isinstance(s["keys"], int) else s["keys"]
    print(f"  keys:             {keys} ({s['range_keys']:,} byte ranges, {s['whole_file_keys']:,} whole "
          f"files, {s['inline_keys']:,} inline{' in the metadata' if 'record_size' in s else ''})")
    print(f"  arrays:           {s['arrays']:,} in {s['directories']:,} directories")
    print(f"  bytes referenced: {s['bytes_referenced']:,} (whole-file targets not counted)")
    print(f"  distinct urls:    {s['distinct_urls']:,}")
    print("  protocols:        " + (", ".join(f"{k} ({v:,} urls)" for k, v in s["protocols"].items()) or "none"))
    return 0


def read_stats(mountpoint: str) -> dict:
    try:
        raw = os.getxattr(mountpoint, "user.refmount.stats")
    except OSError as e:
        raise RefmountError(f"{quote(mountpoint)} is not a live refmount mount ({e.strerror})") from None
    return json.loads(raw)


def print_stats(mountpoint: str, as_json: bool = False) -> int:
    stats = read_stats(mountpoint)
    if as_json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    _print_tree(stats, 0)
    return 0


def _print_tree(value: dict, depth: int) -> None:
    for key, item in value.items():
        if isinstance(item, dict):
            print("  " * depth + f"{key}:")
            _print_tree(item, depth + 1)
        else:
            shown = f"{item:,}" if isinstance(item, int) and not isinstance(item, bool) else item
            print("  " * depth + f"{key}: {shown}")


__all__ = ["summarize", "print_summary", "print_stats", "read_stats"]
