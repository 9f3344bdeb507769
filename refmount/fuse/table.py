"""The kernel's mount table (/proc/self/mountinfo): what is mounted where, and which are refmount's."""

from __future__ import annotations

import os
import re


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_table() -> list[dict]:
    """/proc/self/mountinfo as a list of entries, in mount order."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        entries.append({"point": _unescape(fields[4]), "fstype": fields[sep + 1], "source": _unescape(fields[sep + 2]),
                        "major_minor": fields[2], "super_options": fields[sep + 3] if len(fields) > sep + 3 else ""})
    return entries


def mount_entry(mountpoint: str) -> dict | None:
    """The /proc/self/mountinfo entry for `mountpoint`, if something is mounted there."""
    target = os.path.abspath(mountpoint)
    found = None
    for entry in mount_table():
        if entry["point"] == target:
            found = entry
    return found


def refmount_mounts() -> list[dict]:
    """The entries of live refmount mounts (the last mount on each point), with the owner's uid."""
    last = {e["point"]: e for e in mount_table()}
    mounts = []
    for entry in last.values():
        if entry["fstype"] != "fuse.refmount":
            continue
        owner = re.search(r"user_id=(\d+)", entry["super_options"])
        mounts.append({**entry, "owner": int(owner.group(1)) if owner else None})
    return mounts
