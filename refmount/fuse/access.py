"""Who may open a key whose bytes come from this machine's files (no FUSE types; see fs.open).

A mount with --allow-other lets every user open its keys, and the daemon reads their targets with
its own rights: root's, under the systemd unit. A reference set from a data provider that points a
key at /etc/shadow would hand it to anyone. So a key whose bytes come from local files opens only
for a user who may read every one of those files now: checked at each open, with the caller's uid,
gid and groups, the way the kernel would (search permission on each directory of the path and of
the path the links lead to, read permission on the file; a file with an access control list only
for its owner, since the lists are not read here). Checked at open rather than shown as the
files' owner and mode: a key may be made of several files, a file may not exist yet when the set
is mounted (or change mode later), and a mount by an ordinary user must not be a way into that
user's files either.

"Whose bytes come from local files" covers more than references (view `sources`, refs/origins.py):
a data file's attributes and small variables, inlined by its scan, and the metadata made of them
(.zattrs, .zarray, zarr.json, .zmetadata, every reader's form) are that file's; a reference file's
inline values are its own; a DMR++ sidecar's values are the sidecar's and its data file's; a key
combined from several files (--concat, a glob's root) is all of theirs. The same answer covers the
key's extended attributes (its url and offset). A directory (a reference set that is one) stands
for the files in it: read and search permission on it.

Keys whose bytes are remote, or inline from a remote source, open as before, and so does everything
for root and for the mount's own user (who could read the files without it). A location that
reaches local files through an fsspec chain (`simplecache::file://...`, `memory://`) cannot be
checked: only those two may open it.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from dataclasses import dataclass

import trio

from refmount.fetch.protocols import local_path, protocol_chain, reaches_local

log = logging.getLogger("refmount")
_REMEMBER = 1.0  # seconds an answer is kept (netCDF-C opens every key twice in a row)


@dataclass(frozen=True)
class Caller:
    """Who asks: the FUSE request's uid, gid and pid."""

    uid: int
    gid: int
    pid: int


class LocalAccess:
    def __init__(self, owner_uid: int | None = None) -> None:
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self._answers: dict[tuple, tuple[float, bool]] = {}
        self._logged: set[tuple] = set()
        self.refused = 0

    def exempt(self, caller: Caller) -> bool:
        return caller.uid == 0 or caller.uid == self.owner_uid

    async def allows(self, caller: Caller, urls: list[str], key: str) -> bool:
        """Whether `caller` may open a key whose bytes come from `urls` (`key` names it in the log)."""
        local = [url for url in urls if reaches_local(url)]
        if not local or self.exempt(caller):
            return True
        now = time.monotonic()
        memo = (caller.uid, caller.gid, caller.pid, tuple(local))
        known = self._answers.get(memo)
        if known is not None and now - known[0] < _REMEMBER:
            allowed = known[1]
        else:
            allowed = await trio.to_thread.run_sync(self._may_read_all, caller, local)
            if len(self._answers) > 4096:
                self._answers.clear()
            self._answers[memo] = (now, allowed)
        if not allowed:
            self.refused += 1
            if (caller.uid, key) not in self._logged and len(self._logged) < 1024:
                self._logged.add((caller.uid, key))
                log.info("uid %d may not read the local file(s) behind key %r: open refused", caller.uid, key)
        return allowed

    def _may_read_all(self, caller: Caller, urls: list[str]) -> bool:
        groups = caller_groups(caller)
        return all(protocol_chain(url) == ["file"] and may_read(local_path(url), caller.uid, groups)
                   for url in urls)


def caller_groups(caller: Caller) -> set[int]:
    """The caller's gid and supplementary groups (from /proc; just the gid if the process is gone)."""
    groups = {caller.gid}
    try:
        with open(f"/proc/{caller.pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    groups.update(int(g) for g in line.split()[1:])
                    break
    except (OSError, ValueError):
        pass
    return groups


def may_read(path: str, uid: int, groups: set[int]) -> bool:
    """Whether user `uid` in `groups` may read the file at `path` now (False if it is missing)."""
    try:
        path = os.path.abspath(path)
        real = os.path.realpath(path)
        for directory in _ancestors(path) | _ancestors(real):
            if not _allowed(os.stat(directory), uid, groups, 1):
                return False
        st = os.stat(real)
        if _has_acl(real):
            return st.st_uid == uid
        # (a directory stands for the files in it, a reference set that is one: listing and entering it)
        return _allowed(st, uid, groups, 5 if stat.S_ISDIR(st.st_mode) else 4)
    except OSError:
        return False


def _ancestors(path: str) -> set[str]:
    out = set()
    parent = os.path.dirname(path)
    while True:
        out.add(parent)
        up = os.path.dirname(parent)
        if up == parent:
            return out
        parent = up


def _allowed(st: os.stat_result, uid: int, groups: set[int], want: int) -> bool:
    """The kernel's rule: the owner's bits for the owner, else the group's for a member, else the
    others' (`want`: 4 read, 1 search)."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == uid:
        bits = mode >> 6
    elif st.st_gid in groups:
        bits = mode >> 3
    else:
        bits = mode
    return bool(bits & want)


def _has_acl(path: str) -> bool:
    try:
        os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return False
    return True
