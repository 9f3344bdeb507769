"""Kernel-side tuning that pyfuse3 cannot negotiate (NOTES §3): raise the mount's readahead and the
FUSE connection's max_background through sysfs after mounting, as gcsfuse does. Root only;
failures are logged at debug level and otherwise ignored."""

from __future__ import annotations

import logging
import os

from refmount.fuse.table import mount_entry

log = logging.getLogger("refmount")


def _write(path: str, value: int) -> bool:
    try:
        with open(path, "w") as f:
            f.write(str(value))
        return True
    except OSError as e:
        log.debug("could not write %s: %s", path, e)
        return False


def tune_kernel(mountpoint: str, read_ahead_kb: int, max_background: int) -> None:
    if os.geteuid() != 0:
        return
    entry = mount_entry(mountpoint)
    if entry is None:
        return
    major_minor = entry["major_minor"]
    minor = major_minor.split(":")[1]
    if read_ahead_kb > 0:
        _write(f"/sys/class/bdi/{major_minor}/read_ahead_kb", read_ahead_kb)
    if max_background > 0:
        connection = f"/sys/fs/fuse/connections/{minor}"
        if _write(f"{connection}/max_background", max_background):
            _write(f"{connection}/congestion_threshold", max(1, max_background * 3 // 4))
