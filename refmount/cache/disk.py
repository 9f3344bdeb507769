"""A persistent cache of remote blocks on local disk (`--cache-dir`), kept across remounts.

Layout: DIR/refmount-cache-v2/<aa>/<object id>/<block index>, where the object id hashes the url,
the object's validator (a strong ETag, else size and Last-Modified) and the block size: a changed
remote object gets new names, so its new bytes are never mixed with cached bytes of the old version.
Objects without a validator are not cached on disk at all. Only bytes of responses that matched that
validator are stored (the HTTP backend refuses any other response). Directories of older layouts
(refmount-cache-v1) are ignored.

Each block file is a 32-byte header (magic, a checksum of the data (see `_CHECKS`), data length, and a tag that hashes
the url, validator and block index the block belongs to) and the data; a block that fails the check
(corrupt, or a file moved or copied to another block's name) is deleted and fetched again. The total is bounded by `--disk-cache-size`,
evicting the least recently used blocks; file mtimes carry that order across remounts. A disk that
fills up (or turns read-only) degrades to memory-only caching with one warning, never an error.

A block file the page cache does not hold already is read with O_DIRECT into its pool slot
(cache/direct.py says why); a filesystem without O_DIRECT is read through the page cache.

`DiskCache` is synchronous and runs in worker threads; `DiskBackedFetch` is the block cache's fetch
function (block-aligned ranges, answered as a list of blocks) that looks on disk before asking the
remote.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import mmap
import os
import struct
import threading
import weakref
import time
import zlib
from collections import OrderedDict

import trio

from refmount.cache import direct, owned
from refmount.errors import RefmountError

log = logging.getLogger("refmount")
_open: weakref.WeakSet = weakref.WeakSet()  # the caches holding their directory's lock

LAYOUT = "refmount-cache-v2"
_HEADER = struct.Struct("<4sIQ16s")  # magic, checksum, data length, tag of (object id, block index)
HEADER_SIZE = _HEADER.size
# The magic names the checksum: XXH3-64's low 32 bits where xxhash is installed (0.04 CPU-s per GB
# on this VM, on the pool's slots as they are), else zlib's CRC-32 (0.27 CPU-s per GB, an eighth of
# a re-read's CPU). A block is checked with the one its magic names, so a cache written by either
# build reads in both (an XXH3 block where xxhash is missing is dropped and fetched again).
_CHECKS = {b"RMB2": zlib.crc32}
try:
    import xxhash

    _CHECKS[b"RMB3"] = lambda data: xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF
except ImportError:
    pass
_MAGIC = b"RMB3" if b"RMB3" in _CHECKS else b"RMB2"


def _checksum(data, magic: bytes) -> int:
    return _CHECKS[magic](data)


# A block's mtime carries its recency across remounts; renewed on a read only when older than this,
# not at every read (each renewal dirties the file's inode: a write to the disk's journal per block)
_TOUCH_AFTER = 600.0
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
_MAX_PENDING_WRITES = 256 << 20  # past this, blocks are not written (a slow disk must not eat memory)


class DiskCache:
    def __init__(self, directory: str, capacity: int, block_size: int) -> None:
        self.root = os.path.join(directory, LAYOUT)
        self.capacity = capacity
        self.block_size = block_size
        self.enabled = True
        self._lock = threading.Lock()
        self._lru: OrderedDict[str, int] = OrderedDict()  # relative path -> bytes on disk
        self._bytes = 0
        self.hits = self.misses = self.corrupt = self.stores = self.evictions = self.direct_reads = 0
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            why = owned.problem(self.root)  # (before anything in it is opened, read, written or evicted)
            if why is not None:
                raise RefmountError(f"--cache-dir {directory!r}: {self.root} {why}; refused, since what is read "
                                    "back from it is served as the remote's bytes")
            self._lock_fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise RefmountError(f"--cache-dir {directory!r}: {e.strerror}") from None
        try:
            # Each daemon keeps its own LRU index, so two daemons must not share one directory.
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RefmountError(f"--cache-dir {directory!r} is in use by another refmount mount; "
                                "give each mount its own directory") from None
        _open.add(self)
        self.use_direct = direct.suits(self.root)  # (cleared if the filesystem refuses O_DIRECT after all)
        self._scan()

    def close(self) -> None:
        """Let another mount have the directory (once: a second call does nothing)."""
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)
            _open.discard(self)

    @staticmethod
    def close_all() -> None:
        """Let other mounts have this process's directories: at unmount, before the process's exit
        (which can take seconds unmapping a large heap), so that `refmount umount` then `refmount mount`
        with the same --cache-dir does not find it in use."""
        for cache in list(_open):
            cache.close()

    def statistics(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "corrupt": self.corrupt, "stores": self.stores,
                "evictions": self.evictions, "direct_reads": self.direct_reads, "bytes": self._bytes,
                "capacity": self.capacity, "blocks": len(self._lru), "enabled": self.enabled}

    def object_id(self, url: str, validator: str) -> str:
        return hashlib.sha256(f"{url}\0{validator}\0{self.block_size}".encode()).hexdigest()[:40]

    def _relative(self, obj: str, index: int) -> str:
        return f"{obj[:2]}/{obj}/{index}"

    @staticmethod
    def _tag(obj: str, index: int) -> bytes:
        """What a block file must say it holds: this object (url, validator, block size) and index."""
        return hashlib.blake2b(f"{obj}\0{index}".encode(), digest_size=16).digest()

    # -- blocks (worker threads) ------------------------------------------------------------------

    def load(self, obj: str, index: int, pool=None):
        """The verified block, or None (missing, or corrupt and now deleted). One `preadv` of header
        and data, the data into what `pool.take` gives (the caches' BufferPool decides: a slot, kept
        then without a copy, comes back as a read-only view; the heap, small or out of mappings, as
        bytes), or without a pool into bytes."""
        rel = self._relative(obj, index)
        try:
            fd = os.open(os.path.join(self.root, rel), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.misses += 1
            return None
        header, data, got, size = bytearray(_HEADER.size), None, -1, -1
        try:
            st = os.fstat(fd)
            size = st.st_size - _HEADER.size
            if 0 <= size <= self.block_size:
                data = pool.take(size) if pool is not None else bytearray(size)
                got = self._read(fd, header, data, size)
            if time.time() - st.st_mtime > _TOUCH_AFTER:
                os.utime(fd)  # recency survives a remount
        except OSError:
            pass
        finally:
            os.close(fd)
        magic, crc, length, tag = _HEADER.unpack(header)
        if data is None or magic not in _CHECKS or got != size or length != size or _checksum(data, magic) != crc:
            return self._drop(rel, "failed its checksum")
        if tag != self._tag(obj, index):
            return self._drop(rel, "belongs to another object or block")
        self.hits += 1
        with self._lock:
            if rel in self._lru:
                self._lru.move_to_end(rel)
        return data.toreadonly() if isinstance(getattr(data, "obj", None), mmap.mmap) else bytes(data)

    def _read(self, fd: int, header: bytearray, data, size: int) -> int:
        """Read the block file's header into `header` and its data into `data`; the data bytes read.
        With O_DIRECT into a pool slot (page-aligned) unless the page cache holds the file already."""
        if (not self.use_direct or size < direct.ALIGN or not isinstance(getattr(data, "obj", None), mmap.mmap)
                or direct.cached(fd, _HEADER.size + size)):
            return os.preadv(fd, [header, data], 0) - _HEADER.size
        try:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | direct.O_DIRECT)
            header[:], got = direct.read_direct(fd, _HEADER.size, data, size)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.use_direct = False
            log.debug("disk cache %s: no O_DIRECT (%s); reading through the page cache", self.root, e.strerror)
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~direct.O_DIRECT)
            return os.preadv(fd, [header, data], 0) - _HEADER.size
        self.direct_reads += 1
        return got

    def _drop(self, rel: str, why: str) -> None:
        self.corrupt += 1
        log.warning("disk cache: block %s %s; dropped and fetched again", os.path.join(self.root, rel), why)
        self._forget(rel)
        return None

    def store(self, obj: str, index: int, data: bytes) -> None:
        if not self.enabled:
            return
        rel = self._relative(obj, index)
        path = os.path.join(self.root, rel)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                header = _HEADER.pack(_MAGIC, _checksum(data, _MAGIC), len(data), self._tag(obj, index))
                if os.writev(fd, [header, data]) != len(header) + len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # a full disk writes short
            finally:
                os.close(fd)
            os.replace(temporary, path)  # readers see the whole block or none of it
        except OSError as e:
            _remove(temporary)
            if e.errno in _FULL:
                self.enabled = False
                log.warning("disk cache %s: %s; caching in memory only from now on", self.root, e.strerror)
            else:
                log.warning("disk cache: cannot write %s: %s", path, e.strerror)
            return
        self.stores += 1
        with self._lock:
            self._bytes += _HEADER.size + len(data) - self._lru.pop(rel, 0)
            self._lru[rel] = _HEADER.size + len(data)
            self._evict()

    # -- bookkeeping --------------------------------------------------------------------------------

    def _forget(self, rel: str) -> None:
        _remove(os.path.join(self.root, rel))
        with self._lock:
            self._bytes -= self._lru.pop(rel, 0)

    def _evict(self) -> None:
        """Drop least recently used blocks until the total fits (called with the lock held)."""
        while self._bytes > self.capacity and self._lru:
            rel, size = self._lru.popitem(last=False)
            self._bytes -= size
            self.evictions += 1
            path = os.path.join(self.root, rel)
            _remove(path)
            try:
                os.rmdir(os.path.dirname(path))  # only succeeds once the object has no blocks left
            except OSError:
                pass

    def _scan(self) -> None:
        """Rebuild the LRU from the files left by earlier mounts (oldest mtime first)."""
        found = []
        for top in _subdirs(self.root):
            for obj in _subdirs(top.path):
                with os.scandir(obj.path) as entries:
                    for entry in entries:
                        if entry.name.endswith(".tmp"):  # a write cut short by a crash
                            _remove(entry.path)
                            continue
                        st = entry.stat(follow_symlinks=False)
                        found.append((st.st_mtime_ns, f"{top.name}/{obj.name}/{entry.name}", st.st_size))
        found.sort()
        with self._lock:
            for _, rel, size in found:
                self._lru[rel] = size
                self._bytes += size
            self._evict()


class DiskBackedFetch:
    """The block cache's fetch function: blocks found on disk are served
    from there, the rest come from the remote in one request and are written to disk in the
    background. Objects without a validator (and local files) bypass the disk."""

    def __init__(self, disk: DiskCache, fetch_remote, identity) -> None:
        self.disk = disk
        self._fetch_remote = fetch_remote  # async (url id, start, end) -> bytes
        self._identity = identity          # async url id -> (object id, size) or None
        self._pending_writes = 0
        self.pool = None  # the caches' BufferPool once there is one: blocks are read into its slots

    async def __call__(self, uid: int, start: int, end: int) -> list[bytes]:
        identity = await self._identity(uid) if self.disk.enabled else None
        bs = self.disk.block_size
        if identity is None or start % bs or end % bs:
            return await self._fetch_remote(uid, start, end)
        obj, size = identity
        end = min(end, -(-size // bs) * bs)  # read-ahead may run past the end: no block there to look for
        if end <= start:
            return []
        first, last = start // bs, (end - 1) // bs
        blocks = await trio.to_thread.run_sync(self._load_run, obj, first, last, abandon_on_cancel=True)
        missing = [index for index, block in zip(range(first, last + 1), blocks) if block is None]
        if missing:
            lo, hi = missing[0], missing[-1]
            fetched = await self._fetch_remote(uid, lo * bs, (hi + 1) * bs)
            fetched += [b""] * (hi - lo + 1 - len(fetched))  # the object ended early
            blocks[lo - first : hi - first + 1] = fetched
            self._write_behind(obj, [(lo + k, block) for k, block in enumerate(fetched) if block])
        return list(_until_short(blocks, bs))

    def keep(self, uid: int, index: int, block) -> None:
        """Write block `index` of url `uid` that came by some other way (a whole-object pass) to
        disk, in the background, if the object can be cached on disk."""
        if not self.disk.enabled:
            return

        async def write() -> None:  # a background task: it must not raise
            try:
                identity = await self._identity(uid)
            except Exception:  # noqa: BLE001 - not kept on disk: only a later miss
                return
            if identity is not None:
                self._write_behind(identity[0], [(index, bytes(block))])

        trio.lowlevel.spawn_system_task(write)

    def _load_run(self, obj: str, first: int, last: int) -> list:
        blocks = []
        for index in range(first, last + 1):
            block = self.disk.load(obj, index, self.pool)
            blocks.append(block)
            if block is not None and len(block) < self.disk.block_size:
                blocks.extend([b""] * (last - index))  # the object ends in this block
                break
        return blocks

    def _write_behind(self, obj: str, blocks: list[tuple[int, bytes]]) -> None:
        size = sum(len(block) for _, block in blocks)
        if not blocks or self._pending_writes + size > _MAX_PENDING_WRITES:
            return
        self._pending_writes += size

        async def write() -> None:  # a background task: it must not raise
            try:
                await trio.to_thread.run_sync(self._store_all, obj, blocks)
            except Exception:  # noqa: BLE001 - a block not written is only a later miss
                log.exception("disk cache: writing blocks failed")
            finally:
                self._pending_writes -= size

        trio.lowlevel.spawn_system_task(write)

    def _store_all(self, obj: str, blocks: list[tuple[int, bytes]]) -> None:
        for index, block in blocks:
            self.disk.store(obj, index, block)


def _until_short(blocks: list, bs: int):
    """The blocks up to and including the first short one (the end of the object), without empties."""
    for block in blocks:
        if block:
            yield block
        if len(block) < bs:
            return


def _subdirs(path: str):
    try:
        with os.scandir(path) as entries:
            return [e for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
