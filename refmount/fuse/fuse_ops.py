"""The only module that imports pyfuse3: a thin adapter from FUSE requests to `Filesystem`.

Every handler goes through `_reply`, the one place where errors become errno values: `FsError`
carries its own errno; a failed fetch or decode is EIO with one log line naming the key; anything
unexpected is EIO plus a traceback in the log. A refused login (`LoginFailed`) is EACCES: nothing is
wrong with the data, the credentials are. Only FUSEError may escape a pyfuse3 handler.
"""

from __future__ import annotations

import errno
import functools
import logging
import os

import pyfuse3
import trio

from refmount.errors import Absent, LoginFailed, RefmountError
from refmount.fuse.access import Caller
from refmount.fuse.fs import FILE_MODE, Attributes, Filesystem, FsError

log = logging.getLogger("refmount")


# what each handler does, as the log line names it ("stat of air/0.0.0 failed: ...")
_ACTIONS = {"read": "read", "getattr": "stat", "lookup": "stat", "open": "open", "getxattr": "getxattr",
            "readdir": "listing", "opendir": "listing", "access": "access"}


def _reply(handler):
    @functools.wraps(handler)
    async def wrapper(self, *args):
        try:
            return await handler(self, *args)
        except pyfuse3.FUSEError:
            raise
        except FsError as e:
            raise pyfuse3.FUSEError(e.errno) from None
        except Absent:  # a chunk its Zarr store does not hold: as a missing file of the store would be
            raise pyfuse3.FUSEError(errno.ENOENT) from None
        except RefmountError as e:  # fetch and decode failures: the reader gets EIO (EACCES), the log says why
            self.failed_reads += 1
            once = getattr(e, "once", None)  # a limit's refusal: said once, not at every read it refuses
            action, subject = _ACTIONS.get(handler.__name__, handler.__name__), self._subject(handler.__name__, args)
            # (a url that failed a moment ago fails again at once: at the kernel's retry of the same read
            # that is no news, said once; another file of that url is still said)
            said = (once is not None and once in self._said) or (
                getattr(e, "repeated", False) and (isinstance(e, LoginFailed) or self._failed_last == (action, subject)))
            if once is not None:
                self._said.add(once)
            self._failed_last = (action, subject)
            (log.debug if said else log.error)("%s of %s failed: %s", action, subject, e)
            raise pyfuse3.FUSEError(errno.EACCES if isinstance(e, LoginFailed) else errno.EIO) from None
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except Exception:
            log.exception("internal error in %s%r", handler.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None

    return wrapper


# st_blksize, the piece size `cat`, `cp` and stdio read a file in. A file of up to WHOLE_PIECE (a
# chunk file: raw.py fetches one of up to a block whole at its first read anyway) gets a piece that
# holds it, so the kernel asks for it in one read rather than a readahead window of 512 KiB and then
# the rest: 4 `cat`s of 640 kB chunk files sent 2 reads per file, now 1 (bench/NOTES.md, issue 39).
# Bigger files keep 128 KiB: a buffered reader at random pulls no more per read than before.
WHOLE_PIECE = 1 << 20
PIECE = 1 << 17


def io_piece(size: int) -> int:
    """st_blksize for a file of `size` bytes (a power of two)."""
    return PIECE if size <= PIECE or size > WHOLE_PIECE else 1 << (size - 1).bit_length()


def _caller(ctx) -> Caller | None:
    return Caller(ctx.uid, ctx.gid, ctx.pid) if ctx is not None else None


def _read_only(*_):
    raise pyfuse3.FUSEError(errno.EROFS)


class FuseOperations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, fs: Filesystem) -> None:
        super().__init__()
        self.fs = fs
        self.failed_reads = 0
        self._said: set[str] = set()  # limits whose refusal the log has told
        self._failed_last: tuple | None = None  # (action, subject) of the last failure said
        fs.invalidate = self._invalidate_later
        fs.forget_entries = self._forget_entries

    def _invalidate_later(self, inodes: list[int]) -> None:
        """Have the kernel forget these inodes' attributes, after the reply of the request under way
        (pyfuse3 replies as soon as the handler returns; a system task runs after that)."""
        try:
            trio.lowlevel.spawn_system_task(self._invalidate, inodes)
        except RuntimeError:
            pass  # not serving yet (sizes learnt before the mount): the kernel holds nothing

    @staticmethod
    async def _invalidate(inodes: list[int]) -> None:
        for ino in inodes:
            try:
                pyfuse3.invalidate_inode(ino, attr_only=True)  # (no page cache: no lock a read may hold)
            except OSError as e:
                log.debug("invalidating inode %d: %s", ino, e)  # ENOENT: the kernel holds nothing of it
            except Exception:  # a system task must not raise (trio would end the mount)
                log.exception("invalidating inode %d", ino)

    @staticmethod
    def _forget_entries(parent: int, names: list[bytes]) -> None:
        """Have the kernel forget these names in directory `parent` (and what it knew below them) and
        the directory's attributes: a --refresh changed them. pyfuse3 queues them to its own thread
        (a lookup under way in that directory would otherwise hold ours)."""
        for name in names:
            pyfuse3.invalidate_entry_async(parent, name, ignore_enoent=True)
        try:
            pyfuse3.invalidate_inode(parent, attr_only=True)
        except OSError as e:
            log.debug("invalidating inode %d: %s", parent, e)

    def _subject(self, handler_name: str, args) -> str:
        """The key a failed request was about, for its log line (a lookup names the child it stats)."""
        if not args:
            return "?"
        if handler_name == "lookup":
            parent = self.fs.key_of(args[0]).strip("/")
            name = args[1].decode("utf-8", "replace")
            return f"{parent}/{name}" if parent else name
        return self.fs.key_of(args[0])

    def _entry(self, a: Attributes) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = a.ino
        e.generation = 0
        e.entry_timeout = a.timeout
        e.attr_timeout = a.timeout
        e.st_mode = a.mode
        e.st_nlink = a.nlink
        e.st_uid = self.fs.uid
        e.st_gid = self.fs.gid
        e.st_size = a.size
        e.st_blksize = io_piece(a.size)
        e.st_blocks = (a.size + 511) // 512
        e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = self.fs.mtime_ns
        return e

    @_reply
    async def lookup(self, parent_inode, name, ctx=None):
        caller = Caller(ctx.uid, ctx.gid, ctx.pid) if ctx is not None else None
        return self._entry(await self.fs.lookup(parent_inode, name, caller))

    @_reply
    async def getattr(self, inode, ctx=None):
        return self._entry(await self.fs.getattr(inode))

    @_reply
    async def opendir(self, inode, ctx):
        return await self.fs.opendir(inode)

    def _set_size(self, entry: pyfuse3.EntryAttributes, size: int | None) -> None:
        """A listed file's size; an unknown one as 0 with zero timeouts, so that the kernel asks
        (getattr, where we look it up) before it shows a size."""
        known = size is not None
        entry.st_size = size if known else 0
        entry.st_blocks = (size + 511) // 512 if known else 0
        entry.st_blksize = io_piece(size if known else 0)
        entry.entry_timeout = entry.attr_timeout = self.fs.attr_timeout if known else 0.0

    @_reply
    async def readdir(self, fh, start_id, token):
        readdir_reply = pyfuse3.readdir_reply
        for name, attributes, next_id in self.fs.subdir_entries(fh, start_id):
            if not readdir_reply(token, name, self._entry(attributes), next_id):
                return
        # One EntryAttributes serves every file: readdir_reply copies it into the reply, and listed
        # files differ only in inode and size. Per entry this loop is most of a big listing's cost.
        entry = self._entry(Attributes(0, FILE_MODE, 0, 1, 0.0))
        shown = None  # the size `entry` holds
        count = 64  # a reply holds from a few dozen entries (4 KiB) to ~800 (128 KiB): ask for more and more
        while True:
            files = await self.fs.file_entries(fh, start_id, count)
            if not files.names:
                return
            for name, ino, size, next_id in zip(files.names, files.inodes, files.sizes, files.next_offsets):
                if size != shown:
                    self._set_size(entry, size)
                    shown = size
                entry.st_ino = ino
                if not readdir_reply(token, name, entry, next_id):
                    return
            start_id = files.next_offsets[-1]
            count = min(2 * count, 4096)

    @_reply
    async def open(self, inode, flags, ctx):
        fh, direct = await self.fs.open(inode, flags, _caller(ctx))
        return pyfuse3.FileInfo(fh=fh, keep_cache=not direct, direct_io=direct)

    @_reply
    async def read(self, fh, off, size):
        return await self.fs.read(fh, off, size)

    @_reply
    async def access(self, inode, mode, ctx):
        if mode & os.W_OK:
            raise FsError(errno.EROFS)
        await self.fs.getattr(inode)
        return True

    @_reply
    async def getxattr(self, inode, name, ctx):
        return await self.fs.getxattr(inode, name, _caller(ctx))

    @_reply
    async def listxattr(self, inode, ctx):
        return await self.fs.listxattr(inode, _caller(ctx))

    @_reply
    async def statfs(self, ctx):
        data = pyfuse3.StatvfsData()
        for name, value in self.fs.statfs().items():
            setattr(data, name, value)
        return data

    async def release(self, fh):
        release = getattr(self.fs, "release", None)  # (a refreshed tree keeps a version while it is open)
        if release is not None:
            release(fh)

    async def releasedir(self, fh):
        pass

    async def forget(self, inode_list):
        pass  # inodes are derived from the reference set and live as long as the mount

    # Every write path: the filesystem is read-only.
    async def setattr(self, *args):
        _read_only()

    async def mknod(self, *args):
        _read_only()

    async def mkdir(self, *args):
        _read_only()

    async def unlink(self, *args):
        _read_only()

    async def rmdir(self, *args):
        _read_only()

    async def symlink(self, *args):
        _read_only()

    async def rename(self, *args):
        _read_only()

    async def link(self, *args):
        _read_only()

    async def create(self, *args):
        _read_only()

    async def write(self, *args):
        _read_only()

    async def setxattr(self, *args):
        _read_only()

    async def removexattr(self, *args):
        _read_only()
