"""`refmount mount --dry-run` summaries and `refmount stats` output."""

from __future__ import annotations

import errno
import json
import os
from collections import Counter

from refmount.errors import RefmountError, quote
from refmount.refs import INLINE, WHOLE_FILE
from refmount.fetch.protocols import protocol_of
from refmount.fetch.stats import redact


def summarize(refset) -> dict:
    if getattr(refset, "lazy", False):  # Parquet, a native store: summarise without loading or listing chunks
        meta = summarize(refset.meta)
        return {**meta, "keys": f"{len(refset):,} at most (chunk references load lazily)",
                "arrays": len(refset.arrays), **refset.statistics()}
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
    """`--dry-run`: everything a mount would check, then a summary. Never a traceback: anything
    unexpected is one line too."""
    try:
        s = _dry_run(opts)
    except RefmountError:
        raise
    except RecursionError:
        raise RefmountError(f"{quote(redact(opts.refs))}: too deeply nested to load (keys with very many path segments, or nested JSON)") from None
    except Exception as e:
        raise RefmountError(f"cannot check {quote(redact(opts.refs))}: {type(e).__name__}: {e}") from None
    print(f"{redact(opts.refs)}: valid reference set")
    keys = f"{s['keys']:,}" if isinstance(s["keys"], int) else s["keys"]
    print(f"  keys:             {keys} ({s['range_keys']:,} byte ranges, {s['whole_file_keys']:,} whole "
          f"files, {s['inline_keys']:,} inline{' in the metadata' if 'record_size' in s else ''})")
    print(f"  arrays:           {s['arrays']:,} in {s['directories']:,} directories")
    print(f"  bytes referenced: {s['bytes_referenced']:,} (whole-file targets not counted)")
    print(f"  distinct urls:    {s['distinct_urls']:,}")
    print("  protocols:        " + (", ".join(f"{k} ({v:,} urls)" for k, v in s["protocols"].items()) or "none"))
    return 0


def _dry_run(opts) -> dict:
    from refmount.fuse.assemble import load_reference_set
    from refmount.fuse.daemon import check_remote_options

    refset = load_reference_set(opts)
    check_remote_options(refset.urls, opts.remote_options)
    return summarize(refset)


def read_stats(mountpoint: str) -> dict:
    from refmount.fuse.table import mount_entry

    entry = mount_entry(mountpoint)
    if entry is None or entry["fstype"] != "fuse.refmount":
        raise RefmountError(f"{quote(mountpoint)} is not a refmount mount (see 'refmount list')")
    try:
        raw = os.getxattr(mountpoint, "user.refmount.stats")
    except OSError as e:
        raise RefmountError(f"{quote(mountpoint)} is a refmount mount that does not answer ({e.strerror}); "
                            "its daemon may have died: refmount umount it") from None
    return json.loads(raw)


def live_mounts(timeout: float = 2.0) -> list[dict]:
    """Every refmount mount in this mount namespace, with what its daemon says about itself. A daemon
    that does not answer within `timeout` (stopped, or hung) is shown as such instead of hanging us."""
    import threading
    import time

    from refmount.fuse.table import refmount_mounts

    entries = refmount_mounts()
    answers: dict[int, dict] = {}

    def ask(n: int, entry: dict) -> None:
        answers[n] = _ask_mount(entry)

    # daemon threads: a getxattr stuck in a hung FUSE daemon must not keep this process alive
    threads = [threading.Thread(target=ask, args=(n, e), daemon=True) for n, e in enumerate(entries)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [answers.get(n) or {**_unknown(e), "state": "not answering"} for n, e in enumerate(entries)]


def _unknown(entry: dict) -> dict:
    return {"mountpoint": entry["point"], "refs": entry["source"], "view": "?", "pid": None, "log": "?",
            "owner": entry.get("owner"), "state": "live"}


def _ask_mount(entry: dict) -> dict:
    info = _unknown(entry)
    point = entry["point"]
    try:
        info["pid"] = int(os.getxattr(point, "user.refmount.pid"))
        info["view"] = os.getxattr(point, "user.refmount.view").decode()
        info["refs"] = os.getxattr(point, "user.refmount.refs").decode()
        info["log"] = os.getxattr(point, "user.refmount.log").decode()
    except OSError as e:
        if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):
            info["state"] = "dead"
        elif e.errno == errno.EACCES:
            info["state"] = "not yours"  # another user's mount without --allow-other
    except ValueError:
        pass
    return info


def print_list(as_json: bool = False) -> int:
    mounts = live_mounts()
    if as_json:
        print(json.dumps(mounts, indent=2))
        return 0
    if not mounts:
        print("no refmount mounts")
        return 0
    notes = {"dead": "  (dead: refmount umount it)", "not answering": "  (its daemon does not answer)",
             "not yours": "  (another user's)"}
    for m in mounts:
        state = notes.get(m["state"], "")
        print(f"{m['mountpoint']}{state}\n  refs: {m['refs']}\n  view: {m['view']}\n  pid:  {m['pid']}\n"
              f"  log:  {m['log']}")
    return 0


def print_stats(mountpoint: str, as_json: bool = False) -> int:
    """The mount's metrics as the registry has them (the families --metrics exports, fetch/registry.py),
    or with `as_json` every figure the daemon keeps (its stats dict)."""
    from refmount.fetch.registry import text

    stats = read_stats(mountpoint)
    if as_json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return 0
    print(text(stats) + "(every figure, metrics or not: refmount stats --json)")
    return 0


__all__ = ["summarize", "print_summary", "print_stats", "read_stats", "live_mounts", "print_list"]
