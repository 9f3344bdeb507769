"""Filesystem semantics with no FUSE types: inodes, lookup, attributes, listing, reads, xattrs.

Inode layout (stable for the life of the mount): 1 is the root directory; directory id d has inode
1 + d; key index i has inode 1 + (number of directories) + i. Errors are raised as `FsError(errno)`;
the FUSE glue turns them (and anything unexpected, as EIO) into replies in one place.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass

from refmount.refs import RefSet

ROOT_INODE = 1
FILE_MODE = stat.S_IFREG | 0o444
DIR_MODE = stat.S_IFDIR | 0o555
XATTR_PREFIX = "user.refmount."


class FsError(Exception):
    def __init__(self, errno_: int, message: str = "") -> None:
        super().__init__(message or os.strerror(errno_))
        self.errno = errno_


@dataclass(frozen=True, slots=True)
class Attributes:
    ino: int
    mode: int
    size: int
    nlink: int
    timeout: float  # how long the kernel may cache this entry and its attributes


class Filesystem:
    def __init__(self, refset: RefSet, view, *, attr_timeout: float = 3600.0, stats=None) -> None:
        self.refset = refset
        self.view = view
        self.dirs = refset.dirs
        self.attr_timeout = attr_timeout
        self._first_file_ino = ROOT_INODE + len(self.dirs)
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.mtime_ns = time.time_ns()
        self.stats = stats or (lambda: {})
        self._subdir_names = [sorted(children) for children in self.dirs.children]

    # -- inode numbering --------------------------------------------------------------------------

    def _dir_of_ino(self, ino: int) -> int | None:
        d = ino - ROOT_INODE
        return d if 0 <= d < len(self.dirs) else None

    async def _key_of_ino(self, ino: int) -> int | None:
        i = ino - self._first_file_ino
        if not 0 <= i < self.refset.capacity:
            return None
        await self.refset.ensure(i)  # a lazy set may have to load the reference first
        if self.refset.exists(i) and not self.view.hidden(i):
            return i
        return None

    def dir_inode(self, d: int) -> int:
        return ROOT_INODE + d

    def file_inode(self, i: int) -> int:
        return self._first_file_ino + i

    # -- attributes -------------------------------------------------------------------------------

    def _dir_attributes(self, d: int) -> Attributes:
        return Attributes(self.dir_inode(d), DIR_MODE, 0, 2 + len(self.dirs.children[d]), self.attr_timeout)

    async def _file_attributes(self, i: int) -> Attributes:
        return Attributes(self.file_inode(i), FILE_MODE, await self.view.size(i), 1, self.attr_timeout)

    def _listing_attributes(self, i: int) -> Attributes:
        """Attributes for a directory listing, without I/O: an unknown size is given with a zero
        timeout so that the kernel asks again (and we look the size up) when someone stats it."""
        size = self.view.known_size(i)
        if size is None:
            return Attributes(self.file_inode(i), FILE_MODE, 0, 1, 0.0)
        return Attributes(self.file_inode(i), FILE_MODE, size, 1, self.attr_timeout)

    async def getattr(self, ino: int) -> Attributes:
        d = self._dir_of_ino(ino)
        if d is not None:
            return self._dir_attributes(d)
        i = await self._key_of_ino(ino)
        if i is None:
            raise FsError(errno.ENOENT)
        return await self._file_attributes(i)

    async def lookup(self, parent_ino: int, name: bytes) -> Attributes:
        d = self._dir_of_ino(parent_ino)
        if d is None:
            raise FsError(errno.ENOTDIR)
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            raise FsError(errno.ENOENT) from None
        if text == ".":
            return self._dir_attributes(d)
        if text == "..":
            return self._dir_attributes(self.dirs.parent[d])
        sub = self.dirs.children[d].get(text)
        if sub is not None:
            if self.view.hidden_dir(sub):
                raise FsError(errno.ENOENT)
            return self._dir_attributes(sub)
        path = f"{self.dirs.paths[d]}/{text}" if d else text
        i = await self.refset.afind(path)
        if i < 0 or self.view.hidden(i):
            raise FsError(errno.ENOENT)
        return await self._file_attributes(i)

    # -- directories ------------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        if self._dir_of_ino(ino) is None:
            raise FsError(errno.ENOTDIR if await self._key_of_ino(ino) is not None else errno.ENOENT)
        return ino

    async def readdir(self, ino: int, start: int):
        """Yield (name, attributes, next_offset) from listing position `start` on. Positions are
        stable: subdirectories by name, then files in load order (chunk order for Parquet)."""
        d = self._dir_of_ino(ino)
        if d is None:
            raise FsError(errno.ENOTDIR)
        subdirs = self._subdir_names[d]
        children = self.dirs.children[d]
        pos = start
        while pos < len(subdirs):
            sub = children[subdirs[pos]]
            pos += 1
            if not self.view.hidden_dir(sub):
                yield subdirs[pos - 1].encode("utf-8", "surrogatepass"), self._dir_attributes(sub), pos
        prefix = len(self.dirs.paths[d].encode("utf-8", "surrogatepass")) + 1 if d else 0
        refset = self.refset
        async for file_pos, i in refset.list_files(d, pos - len(subdirs)):
            if self.view.hidden(i):
                continue
            yield refset.key_bytes(i)[prefix:], self._listing_attributes(i), len(subdirs) + file_pos + 1

    # -- files ------------------------------------------------------------------------------------

    async def open(self, ino: int, flags: int) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise FsError(errno.EROFS)
        if await self._key_of_ino(ino) is None:
            raise FsError(errno.EISDIR if self._dir_of_ino(ino) is not None else errno.ENOENT)
        return ino

    async def read(self, ino: int, offset: int, size: int) -> bytes:
        i = await self._key_of_ino(ino)
        if i is None:
            raise FsError(errno.ENOENT)
        return await self.view.read(i, offset, size)

    def key_of(self, ino: int) -> str:
        """The reference key behind an inode (for log lines; no I/O)."""
        i = ino - self._first_file_ino
        if 0 <= i < self.refset.capacity:
            return self.refset.key(i)
        d = self._dir_of_ino(ino)
        return self.dirs.paths[d] + "/" if d is not None else f"inode {ino}"

    # -- extended attributes ----------------------------------------------------------------------

    async def xattrs(self, ino: int) -> dict[str, str]:
        if ino == ROOT_INODE:
            return {XATTR_PREFIX + "stats": json.dumps(self.stats(), sort_keys=True),
                    XATTR_PREFIX + "pid": str(os.getpid()), XATTR_PREFIX + "view": self.view.name}
        if self._dir_of_ino(ino) is not None:
            return {}
        i = await self._key_of_ino(ino)
        if i is None:
            raise FsError(errno.ENOENT)
        return self.view.xattrs(i)

    async def getxattr(self, ino: int, name: bytes) -> bytes:
        value = (await self.xattrs(ino)).get(name.decode("utf-8", "replace"))
        if value is None:
            raise FsError(errno.ENODATA)
        return value.encode("utf-8")

    async def listxattr(self, ino: int) -> list[bytes]:
        return [name.encode("utf-8") for name in await self.xattrs(ino)]

    def statfs(self) -> dict:
        return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_blocks": 0, "f_bfree": 0, "f_bavail": 0,
                "f_files": len(self.dirs) + len(self.refset), "f_ffree": 0, "f_favail": 0, "f_namemax": 255}
