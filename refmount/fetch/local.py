"""Local files (plain paths and file:// urls), read with pread in a worker thread."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

from refmount.errors import FetchError, RemoteChanged
from refmount.fetch.pieces import piece_sizes
from refmount.fetch.stats import FetchStats

_MAX_OPEN = 256


class LocalBackend:
    """Synchronous: every method runs in a worker thread (trio.to_thread), never on the trio thread."""

    def __init__(self, stats: FetchStats) -> None:
        self.stats = stats
        self._fds: OrderedDict[str, tuple[int, int, int]] = OrderedDict()  # path -> fd, size, mtime_ns
        self._first_seen: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def path_of(url: str) -> str:
        return url[len("file://"):] if url.startswith("file://") else url

    def _open(self, url: str) -> tuple[int, int]:
        path = self.path_of(url)
        with self._lock:
            entry = self._fds.get(path)
            if entry is not None:
                self._fds.move_to_end(path)
                return entry[0], entry[1]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise FetchError(f"{url}: {e.strerror}") from None
        st = os.fstat(fd)
        validator = (st.st_size, st.st_mtime_ns)
        with self._lock:
            first = self._first_seen.setdefault(path, validator)
            if first != validator:
                os.close(fd)
                raise RemoteChanged(f"{url}: the file changed while mounted (size/mtime differ)")
            self._fds[path] = (fd, st.st_size, st.st_mtime_ns)
            while len(self._fds) > _MAX_OPEN:
                _, (old_fd, _, _) = self._fds.popitem(last=False)
                os.close(old_fd)
        return fd, st.st_size

    def read(self, url: str, start: int, end: int, piece: int = 0) -> list[bytes]:
        fd, size = self._open(url)
        t0 = time.monotonic()
        pieces = []
        pos = start
        for want in piece_sizes(start, min(end, size), piece):
            pieces.append(self._pread_exactly(url, fd, want, pos))
            pos += want
        self.stats.request(url)
        self.stats.record(url, pos - start, time.monotonic() - t0)
        return pieces

    @staticmethod
    def _pread_exactly(url: str, fd: int, n: int, offset: int) -> bytes:
        parts = []
        got = 0
        while got < n:
            try:
                chunk = os.pread(fd, n - got, offset + got)
            except OSError as e:
                raise FetchError(f"{url}: {e.strerror}") from None
            if not chunk:
                raise RemoteChanged(f"{url}: the file became shorter while mounted")
            parts.append(chunk)
            got += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def known_size(self, url: str) -> int | None:
        """The size seen when the file was first opened (a later change fails its reads), or None."""
        first = self._first_seen.get(self.path_of(url))
        return first[0] if first is not None else None

    def size(self, url: str) -> int:
        return self._open(url)[1]

    def forget(self, url: str) -> None:
        path = self.path_of(url)
        with self._lock:
            self._first_seen.pop(path, None)
            entry = self._fds.pop(path, None)
        if entry is not None:
            os.close(entry[0])

    def close(self) -> None:
        with self._lock:
            for fd, _, _ in self._fds.values():
                os.close(fd)
            self._fds.clear()
