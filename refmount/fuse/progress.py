"""Progress lines on stderr for loads that take more than a second (terminals only)."""

from __future__ import annotations

import sys
import time


class _ProgressLine:
    """One line, rewritten at most 5 times a second once `delay` seconds have passed."""

    def __init__(self, delay: float = 1.0) -> None:
        self._start = time.monotonic()
        self._delay = delay
        self._last = 0.0
        self._shown = False

    def _due(self, final: bool = False) -> float | None:
        """Seconds since the start, if the line is to be shown now; else None."""
        now = time.monotonic()
        if now - self._start < self._delay or (now - self._last < 0.2 and not final):
            return None
        self._last = now
        return now - self._start

    def _show(self, text: str) -> None:
        sys.stderr.write(f"\rrefmount: {text}")
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


class LoadProgress(_ProgressLine):
    """Bytes of the reference file read, and how fast."""

    def __call__(self, bytes_read: int) -> None:
        elapsed = self._due()
        if elapsed is not None:
            self._show(f"loading references: {bytes_read / 1e6:,.0f} MB read ({bytes_read / elapsed / 1e6:,.0f} MB/s)")


class ScanProgress(_ProgressLine):
    """Files scanned of all, files/s and the time left."""

    def __call__(self, done: int, total: int) -> None:
        elapsed = self._due(final=done >= total)
        if elapsed is None:
            return
        rate = done / elapsed
        left = (total - done) / rate if rate > 0 else 0
        self._show(f"scanning files: {done:,}/{total:,} ({rate:,.1f} files/s, {left:,.0f} s left)  ")
