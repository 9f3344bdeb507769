"""Keeping the referenced blocks a whole-object pass streams by, for a server that ignores Range.

Such a server answers every ranged GET with the whole object from byte 0, so a read near the end
of a 512 MiB object costs 512 MiB, and eight of them read one after the other cost eight passes
(issue 25: 3,876 MiB sent). The HTTP backend makes one pass serve them all (fetch/http.py,
`_SharedDownload`); this is its other half: as the body streams by, every block that some key of
the reference set refers to is kept, in the block cache and, with --cache-dir, on disk, so that a
later read of bytes the pass went past needs no new pass (unless the cache let them go).

`blocks_of(url)` runs on the asyncio thread (numpy over the reference set's read-only arrays);
`keep(url, index, data)` may be called from any thread and hands the block to the trio thread.
"""

from __future__ import annotations

import threading

import numpy as np

_MAX_PENDING = 64 << 20  # bytes handed over and not yet kept: past this a block is let go (a busy trio thread)


class PassingBlocks:
    def __init__(self, cache, refset, whole_file: int, disk_fetch=None) -> None:
        """`whole_file`: the length that marks a whole-file reference in the set's arrays."""
        self.cache = cache
        self.whole_file = whole_file
        self.block_size = cache.block_size
        self.refset = refset
        self.disk_fetch = disk_fetch  # cache.disk.DiskBackedFetch with --cache-dir
        self.token = None  # the trio run's token, bound by the first fetch (`bind`)
        self._uids = {url: n for n, url in enumerate(refset.urls)}
        self._runs: dict[str, list[tuple[int, int]] | None] = {}
        self._lock = threading.Lock()
        self._pending = 0
        self.kept = 0

    def bind(self, token) -> None:
        self.token = token

    def blocks_of(self, url: str) -> list[tuple[int, int]]:
        """Runs (first block, last block) that keys of the reference set refer to in `url`, sorted;
        [(0, huge)] for a whole-file reference. Empty for a set that is not held in memory whole
        (Parquet: its references load as they are read)."""
        runs = self._runs.get(url)
        if runs is None:
            runs = self._runs[url] = self._compute(url)
        return runs

    def _compute(self, url: str) -> list[tuple[int, int]]:
        uid = self._uids.get(url)
        url_ids = getattr(self.refset, "url_id", None)
        if uid is None or url_ids is None or getattr(self.refset, "lazy", False):
            return []
        mine = url_ids == uid
        offsets, lengths = self.refset.offset[mine], self.refset.length[mine]
        if (lengths == self.whole_file).any():
            return [(0, 1 << 62)]
        bs = self.block_size
        keep = lengths > 0
        first = offsets[keep] // bs
        last = (offsets[keep] + lengths[keep] - 1) // bs
        order = np.argsort(first, kind="stable")
        runs: list[tuple[int, int]] = []
        for a, b in zip(first[order].tolist(), last[order].tolist()):
            if runs and a <= runs[-1][1] + 1:
                if b > runs[-1][1]:
                    runs[-1] = (runs[-1][0], b)
            else:
                runs.append((a, b))
        return runs

    def keep(self, url: str, index: int, data: bytes) -> None:
        """Keep block `index` of `url` (from any thread; done on the trio thread)."""
        uid, token = self._uids.get(url), self.token
        if uid is None or token is None:
            return
        with self._lock:
            if self._pending + len(data) > _MAX_PENDING:
                return
            self._pending += len(data)
        try:
            token.run_sync_soon(self._keep_now, uid, index, data)
        except Exception:  # noqa: BLE001 - the run is over: nothing to keep for
            with self._lock:
                self._pending -= len(data)

    def _keep_now(self, uid: int, index: int, data: bytes) -> None:
        with self._lock:
            self._pending -= len(data)
        if self.cache.put(uid, index, data):
            self.kept += 1
        if self.disk_fetch is not None:
            self.disk_fetch.keep(uid, index, data)

    def statistics(self) -> dict:
        return {"blocks_kept_from_passes": self.kept}
