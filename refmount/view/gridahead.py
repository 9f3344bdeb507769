"""Read-ahead over the chunk grid, on the view's side: which array and chunk a key is, and the fetches.

Analysis reads a few chunks here and there (a point's time series, a map tile, a small cube), and
the byte-stream read-ahead (refmount/readahead/streams.py) sees none of it as a stream: a walk along
time jumps a whole time step of the remote file per chunk (no stream forms, one round trip per
chunk), and the few chunks of one tile row sit side by side in the remote file (a stream forms and
its window runs far past the row's end). `GridAhead` follows the reads of each array's chunk files
over the array's chunk grid instead: it turns a key into (array, chunk index), asks the planner
(refmount/readahead/planner.py: per reader, which chunks to fetch, holding their reservations of
the read-ahead budget) for a plan, and fetches the plan's exact byte ranges (never the blocks
around them) in the background and at once, near ranges of one remote object as one request
(`coalesce`) no bigger than a cold connection carries in one round trip. The reader is the pid of
the process whose open the read goes through (refmount.readahead.READER).

A walk that reads every chunk of the inner axes in C order is a scan of the remote file: the
byte-stream read-ahead serves it (big requests, paced), and the grid predicts nothing for it.
Everything here runs on the trio thread.
"""

from __future__ import annotations

import json

from refmount.cache.budget import MemoryBudget
from refmount.readahead import READER
from refmount.readahead.planner import GridPlan, GridPlanner
from refmount.refs import INLINE, WHOLE_FILE
from refmount.refs.arraymeta import ArrayMeta

# Bytes one coalesced request may span: what a server sends in one round trip on a connection that has
# carried nothing yet (RFC 6928's initial window, 10 segments of 1448 bytes, less 1 KiB for the answer's
# headers). A bigger answer on a cold connection waits a second round trip, and servers that pace (BBR,
# fq) send it at a fraction of the link at first: at 80 ms a 3-chunk row of 17 KB took 107-165 ms against
# 85-90 for one chunk. Requests this small go out side by side on several connections instead.
MAX_GROUP = 10 * 1448 - 1024
GAP_UNMEASURED = 64 << 10  # the largest gap worth fetching before the link is measured
GAP_SHARE = 0.2  # gaps may add at most this fraction of a coalesced request's wanted bytes (the rest of
                 # the 1.25x bytes target is for predictions past a selection's end)


def coalesce(ranges: list[tuple[int, int]], max_gap: int, max_span: int = MAX_GROUP,
             gap_share: float = GAP_SHARE) -> list[list[tuple[int, int]]]:
    """Group byte ranges of one object into requests: sorted, a range joins the request before it
    when the gap between them is at most `max_gap` (what the link carries in less time than a
    round trip), the request stays within `max_span` bytes, and its gaps stay within `gap_share`
    of its wanted bytes (a metered store bills the gaps too)."""
    groups: list[list[tuple[int, int]]] = []
    wanted = gaps = 0
    for start, end in sorted(ranges):
        if groups:
            last = groups[-1]
            gap = start - last[-1][1]
            if (0 <= gap <= max_gap and end - last[0][0] <= max_span
                    and gaps + gap <= gap_share * (wanted + end - start)):
                last.append((start, end))
                wanted += end - start
                gaps += gap
                continue
        groups.append([(start, end)])
        wanted, gaps = end - start, 0
    return groups


class _Grid:
    """One array's chunk grid, as its inline .zarray gives it."""

    __slots__ = ("prefix", "meta", "grid")

    def __init__(self, prefix: str, meta: ArrayMeta, grid: tuple[int, ...]) -> None:
        self.prefix = prefix
        self.meta = meta
        self.grid = grid

    def key(self, index) -> str:
        return self.prefix + self.meta.chunk_key(index)


class GridAhead:
    """Per array, the chunks of its readers' walks fetched ahead of them (see the module)."""

    def __init__(self, refset, cache) -> None:
        self.refset = refset
        self.cache = cache
        budget = getattr(cache, "budget", None) or MemoryBudget(1 << 62)  # (as ReadStreams: a bare cache)
        self.planner = GridPlanner(budget.reservations)
        self._arrays: dict[str, _Grid | None] = {}  # array path -> its grid (None: not an array we follow)
        self._by_dir: dict[int, tuple] = {}  # key's dir id -> (its array's grid,), or () for none
        self.stats = self.planner.stats
        self.stats.update({"gets": 0, "coalesced_gets": 0, "coalesced_ranges": 0, "gap_bytes": 0})

    # -- which array a key belongs to ---------------------------------------------------------------

    def _array(self, path: str) -> _Grid | None:
        if path in self._arrays:
            return self._arrays[path]
        grid = None
        prefix = f"{path}/" if path else ""
        i = self.refset.find(prefix + ".zarray")
        raw = self.refset.inline_data(i) if i >= 0 else None
        if raw is not None:
            try:
                meta = ArrayMeta.from_zarray(json.loads(raw))
                grid = _Grid(prefix, meta, meta.grid()) if not meta.scalar else None
            except (ValueError, RecursionError):  # (no grid: not an array we follow)
                grid = None
        self._arrays[path] = grid
        return grid

    def chunk_of(self, i: int) -> tuple[_Grid, tuple[int, ...]] | None:
        """(the array's grid, the chunk's index) of key `i`, if it is a chunk of an array with an
        inline .zarray."""
        d = self.refset.dir_id(i)
        found = self._by_dir.get(d)
        key = self.refset.key(i)
        if found is None:
            found = ()
            path = self.refset.dirs.paths[d]
            for _ in range(32):  # "/"-separated chunk keys sit in directories below their array
                grid = self._array(path)
                if grid is not None:
                    found = (grid,)
                    break
                if not path:
                    break
                path = path.rpartition("/")[0]
            self._by_dir[d] = found
        if not found:
            return None
        grid = found[0]
        if not key.startswith(grid.prefix):
            return None
        index = grid.meta.parse_chunk_key(key[len(grid.prefix):])
        return (grid, index) if index is not None else None

    # -- reads ----------------------------------------------------------------------------------

    def on_read(self, i: int, first: bool = True, prefetch: bool = True) -> str | None:
        """Key `i` is read (`first`: from its start, which is how a reader's read of a chunk file
        begins; a later piece only asks for the verdict). Returns None if it is no chunk of an
        array we follow, else the planner's verdict for its reader: "new", "scan" (the byte-stream
        read-ahead's business) or "walk" (the grid's: the byte-stream read-ahead must not run ahead
        of it)."""
        found = self.chunk_of(i)
        if found is None:
            return None
        grid, index = found
        plan = self.planner.on_read(grid.prefix, grid.grid, index, self.refset.target(i)[2],
                                    lambda chunk: self._locate(grid, chunk), READER.get(), first, prefetch)
        self._fetch(plan)
        return plan.verdict

    def _locate(self, grid: _Grid, index) -> tuple[int, int, int] | None:
        j = self.refset.find(grid.key(index))
        if j < 0:
            return None  # a missing chunk (the fill value)
        uid, offset, length = self.refset.target(j)
        if uid == INLINE or length == WHOLE_FILE or length <= 0:
            return None
        return uid, offset, offset + length

    def _fetch(self, plan: GridPlan) -> None:
        by_object: dict[int, list[tuple[int, int]]] = {}
        for fetch in plan.fetches:
            if not self.cache.has_exact(fetch.uid, fetch.start, fetch.end):
                by_object.setdefault(fetch.uid, []).append((fetch.start, fetch.end))
        for uid, ranges in by_object.items():
            for group in (groups := coalesce(ranges, self._max_gap(uid))):
                self.stats["gets"] += 1
                if len(group) > 1:
                    self.stats["coalesced_gets"] += 1
                    self.stats["coalesced_ranges"] += len(group)
                    self.stats["gap_bytes"] += (group[-1][1] - group[0][0]) - sum(e - s for s, e in group)
            self.cache.fetch_exact_ahead(uid, groups)

    def _sweep(self, now: float) -> None:
        self.planner.sweep(now)

    def _max_gap(self, uid: int) -> int:
        """A gap is worth fetching when carrying it takes less than a round trip: the host's
        bandwidth-delay product (as measured by the pacer), or GAP_UNMEASURED before that."""
        pacer = getattr(self.cache, "pacer", None)
        bdp = pacer.bdp(uid) if pacer is not None else 0
        return bdp if bdp > 0 else GAP_UNMEASURED

    def statistics(self) -> dict:
        return {**self.stats, "pending": self.planner.pending()}
