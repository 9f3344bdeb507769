"""The metric families of what the mount served: readers' reads, the raw view's remote bytes, the
decoded view's chunks, the read-ahead's sections and the reference set's keys (fetch/registry.py).
Registered here, a light module, rather than in the views (which `refmount stats` need not import)."""

from __future__ import annotations

from refmount.fetch.registry import REGISTRY, at, register

register("refmount_served_bytes_total", "counter", "Bytes readers got from the mount (every file).",
         collect=at("served", "reader_bytes"), component="fuse")
register("refmount_served_reads_total", "counter", "Reads readers made of the mount's files.",
         collect=at("served", "reader_reads"), component="fuse")
register("refmount_served_remote_bytes_total", "counter", "Bytes of remote objects the raw view served (fetched "
         "bytes divided by these is the amplification).", collect=at("served", "bytes"), component="view.raw")
register("refmount_decoded_chunks_total", "counter", "Chunks the decoded view decoded.",
         collect=at("decoded", "decodes"), component="view.decoded")
register("refmount_keys", "gauge", "Keys of the mounted reference set.", collect=at("keys"), component="refs")
register("refmount_scan_files_scanned_total", "counter", "Files of a lazily mounted glob scanned (or found in the "
         "scan store) at their first lookup.", collect=at("scan", "scanned"), component="refs.scan")
# (the read-ahead's figures are whatever view/raw.py's streams and view/gridahead.py report)
REGISTRY.register_section("readahead", "Read-ahead", ("pending", "in_flight", "window", "now"), component="view.raw")
REGISTRY.register_section("grid_readahead", "Read-ahead", ("pending", "in_flight", "window", "now"),
                          component="view.gridahead")
# --refresh (fuse/refresh.py)
register("refmount_refresh_total", "counter", "Refreshes of the mount's source (--refresh) that listed it.",
         collect=at("refresh", "refreshes"), component="fuse.refresh")
register("refmount_refresh_changes_total", "counter", "Refreshes that changed the mount's tree.",
         collect=at("refresh", "changes"), component="fuse.refresh")
register("refmount_refresh_failures_total", "counter", "Refreshes that failed (the mount kept its last tree).",
         collect=at("refresh", "failures"), component="fuse.refresh")
register("refmount_refresh_files_total", "counter", "Files a refresh found new, changed or gone.", ("change",),
         collect=lambda stats: (({"change": change}, (stats.get("refresh") or {}).get("files_" + change))
                                for change in ("added", "changed", "removed")), component="fuse.refresh")
