"""Filesystem semantics with no FUSE types: inodes, lookup, attributes, listing, reads, xattrs.

Inode layout (stable for the life of the mount): 1 is the root directory; directory id d has inode
1 + d; key index i has inode 1 + (number of directories) + i. A lazy set's directories of nested chunk
keys (refs/lazygrid.ChunkDirs) are not among the stored directories: each has a key index that is no
file, and the directory id and inode that follow from it. Errors are raised as `FsError(errno)`;
the FUSE glue turns them (and anything unexpected, as EIO) into replies in one place.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import dataclass

from refmount.readahead import READER, process_of
from refmount.refs import RefSet

ROOT_INODE = 1
FILE_MODE = stat.S_IFREG | 0o444
DIR_MODE = stat.S_IFDIR | 0o555
XATTR_PREFIX = "user.refmount."
# A file handle is the file's inode; a metadata file served in its reader's form (see open) adds
# the form's index + 1 above this bit.
FORM_SHIFT = 56
_INODE_BITS = (1 << FORM_SHIFT) - 1


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


@dataclass(frozen=True, slots=True)
class FileEntries:
    """Consecutive files of a directory listing, as parallel lists. A listing of a million files
    is dominated by per-entry costs, so it is built in bulk rather than one object per file."""

    names: list[bytes]
    inodes: list[int]
    sizes: list[int | None]  # None: unknown without I/O (the kernel must ask getattr before showing one)
    next_offsets: list[int]  # where the listing resumes after each entry


class ForwardsInvalidate:
    """A tree of Filesystems (a lazily mounted glob's files; a refreshed mount's generations): the FUSE
    glue's `invalidate` is handed to each, with its inodes numbered as the whole tree numbers them.
    `_subtrees()` gives (key, Filesystem) pairs and `_outer(key, inode)` the tree's inode of one's."""

    _invalidate = None

    @property
    def invalidate(self):
        return self._invalidate

    @invalidate.setter
    def invalidate(self, invalidate) -> None:
        self._invalidate = invalidate
        for key, child in self._subtrees():
            child.invalidate = self._child_invalidate(key)

    def _child_invalidate(self, key):
        if self._invalidate is None:
            return None
        return lambda inodes: self._invalidate([self._outer(key, ino) for ino in inodes])


class Filesystem:
    def __init__(self, refset: RefSet, view, *, attr_timeout: float = 3600.0, stats=None, readers=None) -> None:
        """`readers`: a refmount.fuse.readers.ReaderIdentifier, for a view whose metadata has a form
        per reader (the decoded view); None serves every file as it is."""
        self.refset = refset
        self.view = view
        self.dirs = refset.dirs
        self.attr_timeout = attr_timeout
        self._first_file_ino = ROOT_INODE + len(self.dirs)
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.mtime_ns = time.time_ns()
        self.stats = stats or (lambda: {})
        self.mount_info: dict[str, str] = {}  # shown as root xattrs: refs, log (for `refmount list`)
        self.local_access = None  # mount.access.LocalAccess with --allow-other: who may open local files' keys
        self._subdir_names = [sorted(children) for children in self.dirs.children]
        self._chunk_dirs = getattr(refset, "chunk_dirs", None)  # directories of nested chunk keys, or None
        self._may_hide = not getattr(view, "hides_nothing", False)  # a view may promise to hide no key
        self.readers = readers if hasattr(view, "varies") else None
        # keys found by name by some readers only, never listed (the decoded view's zarr.json)
        self._unlisted = getattr(view, "unlisted", None) if self.readers is not None else None
        self.bytes_read = 0  # what readers got, of every file and view (refmount stats, --metrics)
        self.reads = 0
        # Sizes that shrink once an object's size is known (ranges past its end: view.raw.PastEnd) may
        # be cached by the kernel: `invalidate(inodes)` (the FUSE glue's; None without a mount) makes
        # it ask again. An inode being read is invalidated after its reads: the kernel shrinks a file
        # whose read came back short only if its attributes did not change meanwhile.
        self.invalidate = None
        self._reading: dict[int, int] = {}  # inode -> reads in flight
        # inode -> the process that opened it last (read-ahead follows each reader's walk: readahead/);
        # handles carry no pid (their bits are the inode's and the form's), so a file open by two
        # readers at once is read for the later one
        self._opener: dict[int, int] = {}
        self._stale: set[int] = set()  # inodes to invalidate once no read of them is in flight
        self._learn_sizes = getattr(view, "learn_sizes", None)
        watch = getattr(view, "watch_sizes", None)
        if watch is not None:
            watch(self._sizes_changed)

    # -- inode numbering --------------------------------------------------------------------------

    def _dir_of_ino(self, ino: int) -> int | None:
        d = ino - ROOT_INODE
        if 0 <= d < len(self.dirs):
            return d
        return d if self._chunk_dirs is not None and self._chunk_dirs.is_dir(d) else None

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
        return Attributes(self.dir_inode(d), DIR_MODE, 0, 2 + self._subdir_count(d), self.attr_timeout)

    # (stored directories, and those of nested chunk keys after them: in an array's stored directory,
    # its chunk keys' first directories follow the stored subdirectories)

    def _subdir_count(self, d: int) -> int:
        stored = len(self._subdir_names[d]) if d < len(self.dirs) else 0
        return stored + (self._chunk_dirs.subdir_count(d) if self._chunk_dirs is not None else 0)

    def _subdir_at(self, d: int, pos: int) -> tuple[str, int]:
        """(name, id) of the subdirectory at listing position `pos` (< `_subdir_count`)."""
        if d < len(self.dirs):
            names = self._subdir_names[d]
            if pos < len(names):
                return names[pos], self.dirs.children[d][names[pos]]
            pos -= len(names)
        return self._chunk_dirs.subdir(d, pos)

    def _child_dir(self, d: int, name: str) -> int | None:
        sub = self.dirs.children[d].get(name) if d < len(self.dirs) else None
        if sub is None and self._chunk_dirs is not None:
            sub = self._chunk_dirs.child(d, name)
        return sub

    def _parent_dir(self, d: int) -> int:
        return self.dirs.parent[d] if d < len(self.dirs) else self._chunk_dirs.parent(d)

    def _dir_path(self, d: int) -> str:
        return self.dirs.paths[d] if d < len(self.dirs) else self._chunk_dirs.path(d)

    def _hidden_dir(self, d: int) -> bool:
        return d < len(self.dirs) and self.view.hidden_dir(d)  # (chunk directories: their array's keys decide)

    async def _file_attributes(self, i: int) -> Attributes:
        # (a key that exists for some readers only is looked up again at every use: no caching)
        timeout = 0.0 if self._unlisted is not None and self._unlisted(i) else self.attr_timeout
        return Attributes(self.file_inode(i), FILE_MODE, await self.view.size(i), 1, timeout)

    async def getattr(self, ino: int) -> Attributes:
        d = self._dir_of_ino(ino)
        if d is not None:
            return self._dir_attributes(d)
        i = await self._key_of_ino(ino)
        if i is None:
            raise FsError(errno.ENOENT)
        return await self._file_attributes(i)

    async def lookup(self, parent_ino: int, name: bytes, caller=None) -> Attributes:
        """`caller` (fuse.access.Caller): who looks, for a key that exists for some readers only."""
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
            return self._dir_attributes(self._parent_dir(d))
        sub = self._child_dir(d, text)
        if sub is not None:
            if self._hidden_dir(sub):
                raise FsError(errno.ENOENT)
            return self._dir_attributes(sub)
        path = f"{self._dir_path(d)}/{text}" if d else text
        i = await self.refset.afind(path)
        if i < 0 or self.view.hidden(i):
            raise FsError(errno.ENOENT)
        if self._unlisted is not None and self._unlisted(i) and \
                not self.view.shown_to(i, await self._form_of(caller, opens=False)):
            raise FsError(errno.ENOENT)
        return await self._file_attributes(i)

    def _sizes_changed(self, keys: list[int]) -> None:
        self._stale.update(map(self.file_inode, keys))
        self._invalidate_stale()

    def _invalidate_stale(self) -> None:
        ready = [ino for ino in self._stale if ino not in self._reading]
        if not ready:
            return
        self._stale.difference_update(ready)
        if self.invalidate is not None:
            self.invalidate(sorted(ready))

    # -- directories ------------------------------------------------------------------------------

    async def opendir(self, ino: int) -> int:
        if self._dir_of_ino(ino) is None:
            raise FsError(errno.ENOTDIR if await self._key_of_ino(ino) is not None else errno.ENOENT)
        return ino

    # A listing's positions are stable: subdirectories by name, then files in load order (chunk order
    # for Parquet). An entry's next offset is its position + 1: where a later call resumes, in O(1).

    def _listed_dir(self, ino: int) -> int:
        d = self._dir_of_ino(ino)
        if d is None:
            raise FsError(errno.ENOTDIR)
        return d

    def subdir_entries(self, ino: int, start: int):
        """Yield (name, attributes, next offset) of the subdirectories from position `start` on."""
        d = self._listed_dir(ino)
        for pos in range(start, self._subdir_count(d)):
            name, sub = self._subdir_at(d, pos)
            if not self._hidden_dir(sub):
                yield name.encode("utf-8", "surrogatepass"), self._dir_attributes(sub), pos + 1

    async def file_entries(self, ino: int, start: int, count: int) -> FileEntries:
        """Up to `count` files from position `start` on; none at the end of the listing."""
        d = self._listed_dir(ino)
        before = self._subdir_count(d)  # positions of the subdirectories
        refset, view = self.refset, self.view
        pos = max(start - before, 0)
        while True:
            positions, indexes = await refset.files_from(d, pos, count)
            keys = indexes.tolist()
            if self._learn_sizes is not None and keys:
                await self._learn_sizes(keys)  # (local objects' sizes, for keys that run past their end)
            if self._may_hide:
                unlisted = self._unlisted
                hidden = [view.hidden(k) or (unlisted is not None and unlisted(k)) for k in keys]
                if any(hidden):
                    shown = [n for n, h in enumerate(hidden) if not h]
                    if not shown:
                        pos = int(positions[-1]) + 1
                        continue  # all hidden: look further
                    positions, indexes, keys = positions[shown], indexes[shown], [keys[n] for n in shown]
            return FileEntries(refset.names(indexes, d), (indexes + self._first_file_ino).tolist(),
                               list(map(view.known_size, keys)), (positions + before + 1).tolist())

    # -- files ------------------------------------------------------------------------------------

    async def open(self, ino: int, flags: int, caller=None) -> tuple[int, bool]:
        """(file handle, whether reads must bypass the page cache). `caller` (fuse.access.Caller): who
        opens. With --allow-other, a key whose bytes come from local files (its target, or the files
        its inline bytes were read from) opens only for those who may read the files. A metadata
        file whose bytes depend on who reads it is opened in the form of the caller's process (the
        same size in every form), and read around the page cache, so that no reader sees another
        one's form."""
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise FsError(errno.EROFS)
        i = await self._key_of_ino(ino)
        if i is None:
            raise FsError(errno.EISDIR if self._dir_of_ino(ino) is not None else errno.ENOENT)
        await self._check_access(i, caller)
        self._opener.pop(ino, None)
        self._opener[ino] = process_of(caller.pid) if caller is not None else 0
        if len(self._opener) > 4096:
            del self._opener[next(iter(self._opener))]
        if self.readers is not None and self.view.varies(i):
            return ino | (await self._form_of(caller) + 1) << FORM_SHIFT, True
        return ino, False

    async def _check_access(self, i: int, caller) -> None:
        """EACCES unless `caller` may have key i's bytes: with --allow-other, those that come from
        local files (a reference's target, or the files inline and derived bytes were read from:
        view.sources) are for those who may read the files (fuse/access.py decides)."""
        access = self.local_access
        if access is None or caller is None or access.exempt(caller):  # (before asking the view anything)
            return
        if not await access.allows(caller, self.view.sources(i), self.refset.key(i)):
            raise FsError(errno.EACCES)

    async def _form_of(self, caller, opens: bool = True) -> int:
        """The index of the caller's form in the view's forms (refmount.fuse.readers decides)."""
        index = self.view.form_index
        name = await self.readers.form_of_caller(caller.pid if caller is not None else 0, opens)
        return index.get(name, index.get(self.readers.fallback, 0))

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        i = await self._key_of_ino(fh & _INODE_BITS)
        if i is None:
            raise FsError(errno.ENOENT)
        form = (fh >> FORM_SHIFT) - 1
        reader = READER.set(self._opener.get(fh & _INODE_BITS, 0))
        try:
            data = await self._read(i, fh, form, offset, size)
        finally:
            READER.reset(reader)
        self.bytes_read += len(data)
        self.reads += 1
        return data

    async def _read(self, i: int, fh: int, form: int, offset: int, size: int):
        if form >= 0:
            data = await self.view.read(i, offset, size, form)
        else:
            ino = fh & _INODE_BITS
            self._reading[ino] = self._reading.get(ino, 0) + 1
            try:
                data = await self.view.read(i, offset, size)
            finally:
                left = self._reading.pop(ino) - 1
                if left:
                    self._reading[ino] = left
                elif self._stale:
                    self._invalidate_stale()
        return data

    def key_of(self, ino: int) -> str:
        """The reference key behind an inode or file handle (for log lines; no I/O)."""
        ino &= _INODE_BITS
        d = self._dir_of_ino(ino)
        i = ino - self._first_file_ino
        if d is None and 0 <= i < self.refset.capacity:
            return self.refset.key(i)
        return self._dir_path(d) + "/" if d is not None else f"inode {ino}"

    # -- extended attributes ----------------------------------------------------------------------

    async def xattrs(self, ino: int, caller=None) -> dict[str, str]:
        """A key's attributes (its url, offset, ...) are for those who may open it."""
        if ino == ROOT_INODE:
            return {XATTR_PREFIX + "stats": json.dumps(self.stats(), sort_keys=True),
                    XATTR_PREFIX + "pid": str(os.getpid()), XATTR_PREFIX + "view": self.view.name,
                    **{XATTR_PREFIX + name: value for name, value in self.mount_info.items()}}
        if self._dir_of_ino(ino) is not None:
            return {}
        i = await self._key_of_ino(ino)
        if i is None:
            raise FsError(errno.ENOENT)
        await self._check_access(i, caller)
        return self.view.xattrs(i)

    async def getxattr(self, ino: int, name: bytes, caller=None) -> bytes:
        if not name.startswith(b"user."):
            # security.selinux, system.posix_acl_access, ...: `ls -l` asks for both on every file, and
            # "not supported" (unlike "no such attribute") makes it stop asking for this mount. Never
            # ENOSYS: the kernel would stop forwarding getxattr, user.refmount.* included.
            raise FsError(errno.EOPNOTSUPP)
        value = (await self.xattrs(ino, caller)).get(name.decode("utf-8", "replace"))
        if value is None:
            raise FsError(errno.ENODATA)
        return value.encode("utf-8")

    async def listxattr(self, ino: int, caller=None) -> list[bytes]:
        return [name.encode("utf-8") for name in await self.xattrs(ino, caller)]

    def statfs(self) -> dict:
        return {"f_bsize": 1 << 20, "f_frsize": 1 << 20, "f_blocks": 0, "f_bfree": 0, "f_bavail": 0,
                "f_files": len(self.dirs) + len(self.refset), "f_ffree": 0, "f_favail": 0, "f_namemax": 255}
