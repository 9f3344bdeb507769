"""The root of a lazily mounted glob: one directory per file, each file's dataset a `Filesystem` of its
own, made (its file scanned) when the directory is first looked up.

Inodes: 1 is the root; file k's subtree holds its own Filesystem's inodes with k + 1 in bits 32-55
(its dataset directory is (k + 1) << 32 | 1), so that every inode is known before any file is scanned
and none moves when one is. A file handle keeps the per-reader form bits above (fs.FORM_SHIFT).

Requests for a directory that is being scanned wait for the same scan. A file that cannot be scanned
makes its directory EIO, with one log line naming the file and why (the FUSE glue says it once). A file
whose bytes cannot be had now (a fetch error that may pass, as fetch/retry.py's `passing` decides: a
server down, a 503) makes its directory EIO for a while (RETRY_AFTER, doubling while it keeps failing),
said in one line; lookups meanwhile get EIO at once, without asking the server, and the first lookup
after that tries again ("works again" when it does). One that will not pass by waiting (a 404, a 403)
fails that lookup at once, and the next lookup asks again.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import time
import types

import trio

from refmount.errors import RefmountError, quote, same_failure
from refmount.fetch.retry import passing
from refmount.fuse.fs import (DIR_MODE, FORM_SHIFT, ROOT_INODE, XATTR_PREFIX, FileEntries, Filesystem, FsError,
                              ForwardsInvalidate)
from refmount.refs.model import name_problem

log = logging.getLogger("refmount")

FILE_SHIFT = 32  # a file's own inodes stay below 2**32
_LOCAL_BITS = (1 << FILE_SHIFT) - 1
_FILE_BITS = (1 << (FORM_SHIFT - FILE_SHIFT)) - 1
MAX_FILES = _FILE_BITS - 1
RETRY_AFTER = (5.0, 60.0)  # seconds a file that could not be had now stays EIO: first, and at most


class DatasetRoot(ForwardsInvalidate):
    def __init__(self, names: list[str], open_dataset, *, view_name: str, attr_timeout: float = 3600.0,
                 stats=None) -> None:
        """`open_dataset(k)`: async, file k's `Filesystem` (scanning the file); RefmountError when it
        cannot be made."""
        if len(names) > MAX_FILES:
            raise RefmountError(f"a lazy mount holds at most {MAX_FILES:,} files")
        self.names = names
        self._index: dict[str, int] = {}
        for k, name in enumerate(names):  # (the listing checked them: a name that slipped by is not served)
            problem = name_problem(name) or ("is another file's name too" if name in self._index else None)
            if problem is None:
                self._index[name] = k
            else:
                log.warning("dataset directory %s %s; not shown", quote(name), problem)
        self._hidden = set(range(len(names))) - set(self._index.values())
        self._open = open_dataset
        self.children: dict[int, Filesystem] = {}
        self._pending: dict[int, trio.Event] = {}
        self._refused: dict[int, RefmountError] = {}  # files that cannot be scanned (for the mount's life)
        self._errors: dict[int, Exception] = {}  # the last attempt's error, for its waiters
        self._unavailable: dict[int, tuple[float, float, str]] = {}  # k: (tried again after, backoff, why)
        self.view = types.SimpleNamespace(name=view_name)  # (the daemon and root xattrs ask its name)
        self.attr_timeout = attr_timeout
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.mtime_ns = time.time_ns()
        self.stats = stats or (lambda: {})
        self.mount_info: dict[str, str] = {}
        self.local_access = None
        self.forget_entries = None  # the FUSE glue's: (parent inode, names) the kernel must look up again

    def shown(self) -> dict[str, int]:
        """{name: file index} of the directories the root shows now."""
        return dict(self._index)

    def show(self, index: dict[str, int]) -> list[str]:
        """The one place a --refresh changes the tree: from now on the root shows file `index[name]`
        under each name (`names` has grown by the files added). A file no longer shown keeps its
        dataset for the readers that have it open (its inodes stay its own: an index is never
        reused). The names whose directory changed or left: what the kernel must forget."""
        moved = [name for name, k in self._index.items() if index.get(name) != k]
        self._index = dict(index)
        self._hidden = set(range(len(self.names))) - set(index.values())
        self.mtime_ns = time.time_ns()
        return moved

    # -- the glue's attributes, handed to each file's Filesystem ----------------------------------------

    def _subtrees(self):
        return self.children.items()

    def _outer(self, k: int, ino: int) -> int:
        return self._join(k, ino)

    @property
    def bytes_read(self) -> int:
        return sum(child.bytes_read for child in self.children.values())

    @property
    def reads(self) -> int:
        return sum(child.reads for child in self.children.values())

    # -- inode numbering --------------------------------------------------------------------------

    @staticmethod
    def _split(ino: int) -> tuple[int, int]:
        """(file index, its Filesystem's inode or handle) of a mount inode or handle; (-1, ino) for the root."""
        k = ((ino >> FILE_SHIFT) & _FILE_BITS) - 1
        return k, ino & ~(_FILE_BITS << FILE_SHIFT)

    @staticmethod
    def _join(k: int, local: int) -> int:
        return local | (k + 1) << FILE_SHIFT

    def _shifted(self, k: int, a):
        return dataclasses.replace(a, ino=self._join(k, a.ino))

    def _root_attributes(self):
        from refmount.fuse.fs import Attributes

        return Attributes(ROOT_INODE, DIR_MODE, 0, 2 + len(self._index), self.attr_timeout)

    # -- the files' datasets, made on first use ---------------------------------------------------------

    async def _child(self, k: int) -> Filesystem:
        if not 0 <= k < len(self.names):
            raise FsError(errno.ENOENT)
        child = self.children.get(k)
        if child is not None:
            return child
        refused = self._refused.get(k)
        if refused is not None:
            raise refused
        unavailable = self._unavailable.get(k)
        if unavailable is not None and time.monotonic() < unavailable[0]:
            raise FsError(errno.EIO)  # (said when it failed; the server is not asked again yet)
        event = self._pending.get(k)
        if event is None:  # the first request: the scan runs on its own, so that no waiter's interrupt ends it
            event = self._pending[k] = trio.Event()
            trio.lowlevel.spawn_system_task(self._make, k, event)
        await event.wait()
        child = self.children.get(k)
        if child is not None:
            return child
        raise self._refused.get(k) or self._errors.get(k) or FsError(errno.EIO)

    async def _make(self, k: int, event: trio.Event) -> None:
        try:
            child = await self._open(k)
            child.invalidate = self._child_invalidate(k)
            child.local_access = self.local_access
            self.children[k] = child
            self._errors.pop(k, None)
            if self._unavailable.pop(k, None) is not None:
                log.info("dataset %s works again", quote(self.names[k]))
        except RefmountError as e:
            if getattr(e, "once", None) is not None:
                self._refused[k] = e  # cannot be scanned: it will not be tried again
                self._errors[k] = e
            elif passing(e) is not None:  # (a server down, a 503: asked again after a while)
                self._postpone(k, str(e))
            else:  # an answer (a 404, a 403, a login refused: EACCES): failed now, said by the glue; the
                self._errors[k] = e  # next lookup asks again (it may have changed), not a backoff later
        except Exception as e:  # noqa: BLE001 - a system task must not raise (trio would end the mount)
            log.exception("internal error making the dataset of %s", self.names[k])
            self._errors[k] = e
        finally:
            del self._pending[k]
            event.set()

    def _postpone(self, k: int, why: str) -> None:
        """File k could not be had now: EIO until its backoff has passed (doubling while it keeps failing),
        said once while it fails for the same reason."""
        _, backoff, said = self._unavailable.get(k, (0.0, RETRY_AFTER[0] / 2, None))
        backoff = min(backoff * 2, RETRY_AFTER[1])
        self._unavailable[k] = (time.monotonic() + backoff, backoff, why)
        self._errors[k] = FsError(errno.EIO)
        (log.debug if same_failure(why, said) else log.warning)(
            "dataset %s cannot be had now: %s; its directory is EIO, and a lookup after %g s tries again",
            quote(self.names[k]), why, backoff)

    # -- Filesystem's interface -------------------------------------------------------------------

    async def getattr(self, ino: int):
        if ino == ROOT_INODE:
            return self._root_attributes()
        k, local = self._split(ino)
        return self._shifted(k, await (await self._child(k)).getattr(local))

    async def lookup(self, parent_ino: int, name: bytes, caller=None):
        if parent_ino == ROOT_INODE:
            if name in (b".", b".."):
                return self._root_attributes()
            k = self._index.get(name.decode("utf-8", "surrogateescape"))
            if k is None:
                raise FsError(errno.ENOENT)
            return self._shifted(k, await (await self._child(k)).getattr(ROOT_INODE))
        k, local = self._split(parent_ino)
        if local == ROOT_INODE and name == b"..":
            return self._root_attributes()
        return self._shifted(k, await (await self._child(k)).lookup(local, name, caller))

    async def opendir(self, ino: int) -> int:
        if ino != ROOT_INODE:
            k, local = self._split(ino)
            await (await self._child(k)).opendir(local)
        return ino

    def subdir_entries(self, ino: int, start: int):
        """The root's: every file's directory, none scanned (its attributes come with its lookup)."""
        if ino == ROOT_INODE:
            for pos in range(start, len(self.names)):
                if pos in self._hidden:
                    continue
                attributes = dataclasses.replace(self._root_attributes(), ino=self._join(pos, ROOT_INODE), nlink=2)
                yield self.names[pos].encode("utf-8", "surrogateescape"), attributes, pos + 1
            return
        k, local = self._split(ino)
        child = self.children.get(k)  # (opendir made it)
        if child is None:
            raise FsError(errno.EIO)
        for name, attributes, next_id in child.subdir_entries(local, start):
            yield name, self._shifted(k, attributes), next_id

    async def file_entries(self, ino: int, start: int, count: int) -> FileEntries:
        if ino == ROOT_INODE:
            return FileEntries([], [], [], [])
        k, local = self._split(ino)
        files = await (await self._child(k)).file_entries(local, start, count)
        base = (k + 1) << FILE_SHIFT
        return dataclasses.replace(files, inodes=[base | ino for ino in files.inodes])

    async def open(self, ino: int, flags: int, caller=None) -> tuple[int, bool]:
        if ino == ROOT_INODE:
            raise FsError(errno.EISDIR)
        k, local = self._split(ino)
        fh, direct = await (await self._child(k)).open(local, flags, caller)
        return self._join(k, fh), direct

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        k, local = self._split(fh)
        return await (await self._child(k)).read(local, offset, size)

    def key_of(self, ino: int) -> str:
        if ino == ROOT_INODE:
            return "/"
        k, local = self._split(ino)
        if not 0 <= k < len(self.names):
            return f"inode {ino}"
        child = self.children.get(k)
        inner = child.key_of(local) if child is not None and local != ROOT_INODE else ""
        return f"{self.names[k]}/{inner}"

    async def xattrs(self, ino: int, caller=None) -> dict[str, str]:
        if ino == ROOT_INODE:
            return {XATTR_PREFIX + "stats": json.dumps(self.stats(), sort_keys=True),
                    XATTR_PREFIX + "pid": str(os.getpid()), XATTR_PREFIX + "view": self.view.name,
                    **{XATTR_PREFIX + name: value for name, value in self.mount_info.items()}}
        k, local = self._split(ino)
        child = await self._child(k)
        return {} if local == ROOT_INODE else await child.xattrs(local, caller)

    getxattr = Filesystem.getxattr
    listxattr = Filesystem.listxattr

    def statfs(self) -> dict:
        files = 1 + len(self.names) + sum(child.statfs()["f_files"] for child in self.children.values())
        return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_blocks": 0, "f_bfree": 0, "f_bavail": 0,
                "f_files": files, "f_ffree": 0, "f_favail": 0, "f_namemax": 255}
