"""A refreshed mount's tree (`--refresh`; a lazily mounted glob keeps its files' versions itself:
fuse/datasets.py): the `Filesystem` of each version of the reference set, the newest at the root.

Inodes and handles of generation g carry g + 1 in bits 32-55 (a Filesystem's own stay below 2**32; a
handle's form bits stay above: fs.FORM_SHIFT), so an inode or an open file of an older tree keeps
reaching that tree: a reader keeps reading the version it opened, and a new lookup from the root
(inode 1, always the newest's) sees the new one. An older tree is kept while a file of it is open, and
the last KEEP of them besides; an inode of one dropped is ESTALE.
"""

from __future__ import annotations

import dataclasses
import errno
from collections import Counter

from refmount.fuse.fs import FORM_SHIFT, ROOT_INODE, Filesystem, ForwardsInvalidate, FsError

GEN_SHIFT = 32
_GEN_BITS = (1 << (FORM_SHIFT - GEN_SHIFT)) - 1
_GEN_MASK = _GEN_BITS << GEN_SHIFT
KEEP = 2  # older trees kept with no file of them open (a directory a shell stands in, a listing under way)


class Generations(ForwardsInvalidate):
    def __init__(self, first: Filesystem) -> None:
        self.trees: dict[int, Filesystem] = {0: first}
        self.current = 0
        self._open: Counter = Counter()  # generation -> files of it open
        self.mount_info: dict[str, str] = {}
        self.local_access = None
        self.forget_entries = None  # the FUSE glue's: (parent inode, names) the kernel must look up again

    # -- what the glue and the daemon set and ask, of the newest tree --------------------------------

    def __getattr__(self, name):  # (refset, view, stats, governor, uid, gid, attr_timeout, mtime_ns, ...)
        if name.startswith("_") or name == "trees":
            raise AttributeError(name)
        return getattr(self.trees[self.current], name)

    def _subtrees(self):
        return self.trees.items()

    def _outer(self, g: int, ino: int) -> int:
        return self._inode(g, ino)

    def _shared(name: str):  # noqa: N805 - (a property every tree gets a copy of: the glue sets it once)
        def get(self):
            return self.__dict__.get("_" + name)

        def put(self, value) -> None:
            self.__dict__["_" + name] = value
            for tree in self.trees.values():
                setattr(tree, name, value)

        return property(get, put)

    mount_info = _shared("mount_info")
    local_access = _shared("local_access")
    del _shared

    # -- the one swap ----------------------------------------------------------------------------

    def swap(self, tree: Filesystem) -> Filesystem:
        """Serve `tree` at the root from now on; the tree it replaces (whose root entries the kernel
        must forget: the caller has them invalidated)."""
        old = self.trees[self.current]
        g = self.current + 1
        if g > _GEN_BITS - 1:
            raise OverflowError("too many generations")
        tree.invalidate = self._child_invalidate(g)
        tree.mount_info = self.mount_info
        tree.local_access = self.local_access
        self.trees[g] = tree
        self.current = g
        self._prune()
        return old

    def _prune(self) -> None:
        for g in sorted(self.trees):
            if g < self.current - KEEP and not self._open[g]:
                del self.trees[g]

    # -- inode numbering --------------------------------------------------------------------------

    @staticmethod
    def _inode(g: int, local: int) -> int:
        return ROOT_INODE if local == ROOT_INODE else local | (g + 1) << GEN_SHIFT

    @staticmethod
    def _handle(g: int, fh: int) -> int:
        return fh | (g + 1) << GEN_SHIFT

    def _split(self, ino: int) -> tuple[int, Filesystem, int]:
        """(generation, its tree, the tree's own inode or handle); the root is the newest tree's."""
        if ino == ROOT_INODE:
            return self.current, self.trees[self.current], ino
        g = ((ino >> GEN_SHIFT) & _GEN_BITS) - 1
        tree = self.trees.get(g)
        if tree is None:
            raise FsError(errno.ESTALE)
        return g, tree, ino & ~_GEN_MASK

    def _shifted(self, g: int, a):
        return dataclasses.replace(a, ino=self._inode(g, a.ino))

    # -- Filesystem's interface -------------------------------------------------------------------

    async def getattr(self, ino: int):
        g, tree, local = self._split(ino)
        return self._shifted(g, await tree.getattr(local))

    async def lookup(self, parent_ino: int, name: bytes, caller=None):
        g, tree, local = self._split(parent_ino)
        return self._shifted(g, await tree.lookup(local, name, caller))

    async def opendir(self, ino: int) -> int:
        g, tree, local = self._split(ino)
        return self._handle(g, await tree.opendir(local))  # (a listing goes on in the tree it began in)

    def subdir_entries(self, fh: int, start: int):
        g, tree, local = self._split(fh)
        for name, attributes, next_id in tree.subdir_entries(local, start):
            yield name, self._shifted(g, attributes), next_id

    async def file_entries(self, fh: int, start: int, count: int):
        g, tree, local = self._split(fh)
        files = await tree.file_entries(local, start, count)
        return dataclasses.replace(files, inodes=[self._inode(g, ino) for ino in files.inodes])

    async def open(self, ino: int, flags: int, caller=None) -> tuple[int, bool]:
        g, tree, local = self._split(ino)
        fh, direct = await tree.open(local, flags, caller)
        self._open[g] += 1
        return self._handle(g, fh), direct

    def release(self, fh: int) -> None:
        g = ((fh >> GEN_SHIFT) & _GEN_BITS) - 1
        if self._open[g] > 0:
            self._open[g] -= 1
            if not self._open[g]:
                del self._open[g]
                self._prune()

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        _, tree, local = self._split(fh)
        return await tree.read(local, offset, size)

    def key_of(self, ino: int) -> str:
        try:
            _, tree, local = self._split(ino)
        except FsError:
            return f"inode {ino} (of a tree no longer kept)"
        return tree.key_of(local)

    async def xattrs(self, ino: int, caller=None) -> dict[str, str]:
        _, tree, local = self._split(ino)
        return await tree.xattrs(local, caller)

    getxattr = Filesystem.getxattr
    listxattr = Filesystem.listxattr

    def statfs(self) -> dict:
        return self.trees[self.current].statfs()

    async def root_names(self, g: int | None = None) -> list[bytes]:
        """The names in tree g's root directory (the newest's by default): what the kernel must forget
        when that tree is replaced."""
        tree = self.trees[self.current if g is None else g]
        names = [name for name, _, _ in tree.subdir_entries(ROOT_INODE, 0)]
        start = 0
        while True:
            files = await tree.file_entries(ROOT_INODE, start, 4096)
            if not files.names:
                return names
            names += files.names
            start = files.next_offsets[-1]
