"""A progress line on stderr for loads that take more than a second (terminals only)."""

from __future__ import annotations

import sys
import time


class LoadProgress:
    def __init__(self, delay: float = 1.0) -> None:
        self._start = time.monotonic()
        self._delay = delay
        self._last = 0.0
        self._shown = False

    def __call__(self, bytes_read: int) -> None:
        now = time.monotonic()
        if now - self._start < self._delay or now - self._last < 0.2:
            return
        self._last = now
        rate = bytes_read / (now - self._start) / 1e6
        sys.stderr.write(f"\rrefmount: loading references: {bytes_read / 1e6:,.0f} MB read ({rate:,.0f} MB/s)")
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


class ScanProgress:
    """Files scanned of all, files/s and the time left, on one line (a terminal only; after 1 s)."""

    def __init__(self, delay: float = 1.0) -> None:
        self._start = time.monotonic()
        self._delay = delay
        self._last = 0.0
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self._start < self._delay or (now - self._last < 0.2 and done < total):
            return
        self._last = now
        rate = done / (now - self._start)
        left = (total - done) / rate if rate > 0 else 0
        sys.stderr.write(f"\rrefmount: scanning files: {done:,}/{total:,} ({rate:,.1f} files/s, "
                         f"{left:,.0f} s left)  ")
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
