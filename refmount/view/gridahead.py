"""Read-ahead over the chunk grid: predict the chunks an array's readers will ask for next.

Analysis reads a few chunks here and there (a point's time series, a map tile, a small cube), and
the byte-stream read-ahead of view/raw.py (ReadStreams) sees none of it as a stream: a walk along
time jumps a whole time step of the remote file per chunk (no stream forms, one round trip per
chunk), and the few chunks of one tile row sit side by side in the remote file (a stream forms and
its window runs far past the row's end). This module follows the reads of each array's chunk
files over the array's chunk grid instead:

- `Walk` (no I/O) recognises the walk the reads make: a line along any axis with any stride, or a
  box walked in C order (a row of n chunks, then the next row; a plane of rows, then the next
  plane), with its outermost moving axis open-ended. Readers need not keep order (zarr reads a
  few chunks at once from threads; dask reads a selection in the string order of its keys): the
  holes of the box the reads span come first, nearest the latest read, then the chunks after the
  walk's frontier (the furthest chunk read in walk order).
- `GridAhead` asks the walk for the next chunks and fetches their exact byte ranges (never the
  blocks around them), in the background and at once, near ranges of one remote object as one
  request (`coalesce`). How many chunks it keeps predicted ahead grows by one per prediction used,
  so it doubles while the walk goes on, and it never exceeds a fifth of the chunks the walk has
  read (or a few: MIN_WINDOW): when the walk ends, what was fetched ahead for it is at most a fifth
  more than what it read. A walk that wastes more than it uses halves it. A read that fits no walk
  starts a new one; predictions of the old one never read count as wasted.
- A walk that reads every chunk of the inner axes in C order is a scan of the remote file: the
  byte-stream read-ahead serves it (big requests, paced), and the grid predicts nothing for it.

Predicted bytes count against the block cache's memory budget, as ReadStreams' lead does.
Everything here runs on the trio thread.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import time
from collections import OrderedDict, deque

from refmount.cache.budget import MemoryBudget
from refmount.refs import INLINE, WHOLE_FILE

log = logging.getLogger("refmount")

HISTORY = 64  # chunk reads a walk remembers (its box and strides come from these)
MAX_BOX = 4096  # the largest box whose holes are looked for
MAX_READ = 1024  # chunks a walk remembers having read (to skip them)
MAX_WALKS = 64  # arrays whose walks are followed at once (the least recently read is forgotten)
SLACK = 16  # steps beyond the box along a moving axis that still go on with the walk
MIN_WINDOW = 8  # predictions a walk may keep ahead from the start (small chunks)...
MIN_WINDOW_BYTES = 256 << 10  # ... or fewer, as many as hold this many bytes (at least 2), for big ones
LEAD_FRACTION = 0.2  # ... and at most this fraction of the chunks it has read, beyond that
MAX_WINDOW = 512
MAX_GROUP = 8 << 20  # bytes one coalesced request may span
GAP_UNMEASURED = 64 << 10  # the largest gap worth fetching before the link is measured
GAP_SHARE = 0.25  # gaps may add at most this fraction of a coalesced request's wanted bytes
IDLE = 5.0  # seconds after its last read when a walk's unread predictions count as wasted (and free the budget)


class Walk:
    """The walk of one array's reads over its chunk grid (`grid`: chunks per axis)."""

    def __init__(self, grid: tuple[int, ...]) -> None:
        self.grid = grid
        self.history: deque[tuple[int, ...]] = deque(maxlen=HISTORY)
        self.read: set[tuple[int, ...]] = set()  # every chunk this walk read (bounded: see note)
        self.count = 0  # chunks this walk has read
        self._changes = 0  # history changes so far: model() is worked out once per change, not per question
        self._model: tuple | None = None  # (_changes, model)

    # -- recognising ------------------------------------------------------------------------------

    def note(self, index: tuple[int, ...]) -> bool:
        """Record a read of chunk `index`. True if it goes on with this walk (or repeats a chunk
        of it); False if it fits no walk of these reads: the walk starts over from it."""
        if index in self.read:
            return True
        fits = not self.history or self._fits(index)
        if not fits:
            self.history.clear()
            self.read.clear()
            self.count = 0
        self.history.append(index)
        self._changes += 1
        self.read.add(index)
        self.count += 1
        if len(self.read) > MAX_READ:  # (bounded memory: older reads may then be predicted again)
            self.read = set(self.history)
        return fits

    def _fits(self, index) -> bool:
        # (the model of these reads, if the last read's verdict worked it out, has their box and strides)
        known = self._model[1] if self._model is not None and self._model[0] == self._changes else None
        lo, hi = (known[1], known[2]) if known is not None else self._box()
        if len(self.history) == 1:
            # a second read: the walk's line if it moved along one axis only, or a near neighbour
            moved = [a for a in range(len(index)) if index[a] != lo[a]]
            return len(moved) <= 1 or all(abs(index[a] - lo[a]) <= 1 for a in moved)
        strides = known[3] if known is not None else self.strides(lo)
        outer = next((a for a in range(len(lo)) if lo[a] != hi[a]), None)
        for a, v in enumerate(index):
            if a == outer:
                continue  # anywhere along the walk's outermost axis (dask reads in any order)
            # (readers a few threads wide, each waiting on a chunk of its own, ask out of order)
            slack = SLACK * strides[a] if lo[a] != hi[a] else 1  # (or the next row, plane or step)
            if not lo[a] - slack <= v <= hi[a] + slack:
                return False
        return True

    def _box(self):
        columns = list(zip(*self.history))  # (per axis, in C: this runs at every chunk read)
        return list(map(min, columns)), list(map(max, columns))

    def strides(self, lo) -> list[int]:
        """Per axis, the step between the chunks read along it (1 where only one was read)."""
        return [math.gcd(*(v - low for v in column)) or 1 for column, low in zip(zip(*self.history), lo)]

    def model(self):
        """(varying axes, lo, hi, strides, direction of the outermost varying axis), or None before
        the walk shows a direction: at least three reads, or two neighbours. (Shared: not to be changed.)"""
        if self._model is None or self._model[0] != self._changes:
            self._model = (self._changes, self._work_out_model())
        return self._model[1]

    def _work_out_model(self):
        if len(self.history) < 2:
            return None
        lo, hi = self._box()
        varying = [a for a in range(len(lo)) if lo[a] != hi[a]]
        if not varying:
            return None
        strides = self.strides(lo)
        if len(self.history) == 2 and any(hi[a] - lo[a] > 1 for a in varying):
            return None  # two reads far apart may be two random reads: wait for a third
        outer = varying[0]
        first, last = self.history[0][outer], max(self.history, key=self._rank_key(varying, 1))[outer]
        direction = -1 if self.history[-1][outer] < first and last <= first else 1
        return varying, lo, hi, strides, direction

    @staticmethod
    def _rank_key(varying, direction):
        outer = varying[0]
        return lambda p: (p[outer] * direction, *(p[a] for a in varying[1:]))

    def is_scan(self) -> bool:
        """Does the walk read the array in C order over whole inner axes (a scan of its remote file)?
        Every axis inside the outermost moving one is read whole, with stride 1, and every axis
        outside it has a single chunk."""
        m = self.model()
        if m is None:
            return False
        varying, lo, hi, strides, direction = m
        outer = varying[0]
        if direction < 0 or strides[outer] != 1 or any(self.grid[a] > 1 for a in range(outer)):
            return False
        return all(lo[a] == 0 and hi[a] == self.grid[a] - 1 and strides[a] == 1 for a in range(outer + 1, len(lo)))

    # -- predicting -------------------------------------------------------------------------------

    def in_walk(self, index, m=None) -> bool:
        """Is chunk `index` on the walk (its axes that do not move at their value, its inner axes
        within the box, on its strides)? The outermost moving axis is open-ended."""
        m = m or self.model()
        if m is None:
            return False
        varying, lo, hi, strides, _ = m
        for a, v in enumerate(index):
            if a not in varying:
                if v != lo[a]:
                    return False
            elif (v - lo[a]) % strides[a] or (a != varying[0] and not lo[a] <= v <= hi[a]):
                return False
        return True

    def predict(self, count: int, skip=()) -> list[tuple[int, ...]]:
        """The next `count` chunks of the walk, within the grid, none of them read already or in
        `skip`: first the holes of the box its reads span, nearest the latest read first (a reader
        in no order, as dask, fills the box in its own order), then those after its frontier,
        nearest first."""
        m = self.model()
        if m is None or count <= 0:
            return []
        varying, lo, hi, strides, direction = m
        outer, inner = varying[0], varying[1:]
        out = self._holes(m, count, skip)
        if len(out) >= count:
            return out
        frontier = max(self.history, key=self._rank_key(varying, direction))
        pos = list(frontier)
        for _ in range(4 * count + 4 * len(self.read) + 64):  # bounded: skipped chunks cost a step each
            # the next position in C order over the inner axes, carrying into the outer axis
            for a in reversed(inner):
                pos[a] += strides[a]
                if pos[a] <= hi[a]:
                    break
                pos[a] = lo[a]
            else:
                pos[outer] += strides[outer] * direction
                if not 0 <= pos[outer] < self.grid[outer]:
                    break
            if any(not 0 <= pos[a] < self.grid[a] for a in inner):
                continue
            index = tuple(pos)
            if index in self.read or index in skip or index in out:
                continue
            out.append(index)
            if len(out) >= count:
                break
        return out


    def _holes(self, m, count: int, skip) -> list[tuple[int, ...]]:
        """Up to `count` chunks of the box the walk's reads span (on its strides) not read yet,
        nearest the latest read (in C order over the box) first; none in a box of over MAX_BOX."""
        varying, lo, hi, strides, _ = m
        extents = [(hi[a] - lo[a]) // strides[a] + 1 for a in varying]
        if math.prod(extents) > MAX_BOX:
            return []
        latest = self.history[-1]

        def rank(p) -> int:
            r = 0
            for a, n in zip(varying, extents):
                r = r * n + (p[a] - lo[a]) // strides[a]
            return r

        here = rank(latest)
        holes = []
        for steps in itertools.product(*(range(n) for n in extents)):
            pos = list(latest)
            for a, k in zip(varying, steps):
                pos[a] = lo[a] + k * strides[a]
            index = tuple(pos)
            if index not in self.read and index not in skip:
                holes.append((abs(rank(index) - here), index))
        holes.sort()
        return [index for _, index in holes[:count]]


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

    __slots__ = ("prefix", "separator", "grid", "walk", "window", "pending", "used", "scanning", "verdict",
                 "chunk_bytes", "last_read")

    def __init__(self, prefix: str, separator: str, grid: tuple[int, ...]) -> None:
        self.prefix = prefix
        self.separator = separator
        self.grid = grid
        self.walk = Walk(grid)
        self.window = MIN_WINDOW  # predictions it may keep ahead (before the walk's own cap)
        self.pending: OrderedDict[tuple, tuple] = OrderedDict()  # predicted, unread -> (uid, start, end)
        self.used = 0  # of this walk's predictions
        self.scanning = False  # the walk is a scan (see Walk.is_scan)
        self.verdict: str | None = None  # what the last read from a chunk's start made of the walk
        self.chunk_bytes = 0  # the referenced length of its chunk read last
        self.last_read = 0.0

    def key(self, index) -> str:
        return self.prefix + self.separator.join(map(str, index))


def array_grid(zarray: dict) -> tuple[tuple[int, ...], str] | None:
    """(chunks per axis, separator) of a Zarr v2 array's metadata, or None."""
    shape, chunks = zarray.get("shape"), zarray.get("chunks")
    if not isinstance(shape, list) or not isinstance(chunks, list) or len(shape) != len(chunks) or not shape:
        return None
    if not all(isinstance(n, int) and isinstance(c, int) and n >= 0 and c > 0 for n, c in zip(shape, chunks)):
        return None
    separator = zarray.get("dimension_separator") or "."
    return tuple(-(-n // c) for n, c in zip(shape, chunks)), separator


class GridAhead:
    """Per array, the walk of its chunk reads and the chunks fetched ahead for it (see the module)."""

    def __init__(self, refset, cache) -> None:
        self.refset = refset
        self.cache = cache
        self.budget = getattr(cache, "budget", None) or MemoryBudget(1 << 62)  # (as ReadStreams: a bare cache)
        self._arrays: dict[str, _Grid | None] = {}  # array path -> its grid (None: not an array we follow)
        self._by_dir: dict[int, tuple] = {}  # key's dir id -> (its array's grid,), or () for none
        self._swept = 0.0  # when idle walks were last looked for
        self._walking: OrderedDict[int, _Grid] = OrderedDict()  # grids with a walk, least recently read first
        self.stats = {"predicted": 0, "predicted_bytes": 0, "used": 0, "used_bytes": 0, "wasted": 0,
                      "wasted_bytes": 0, "gets": 0, "coalesced_gets": 0, "coalesced_ranges": 0,
                      "gap_bytes": 0, "walks": 0, "scans": 0}

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
                found = array_grid(json.loads(raw))
            except (ValueError, TypeError, AttributeError, RecursionError):
                found = None
            if found is not None:
                grid = _Grid(prefix, found[1], found[0])
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
        parts = key[len(grid.prefix):].split(grid.separator)
        if len(parts) != len(grid.grid) or not all(p.isdigit() for p in parts):
            return None
        return grid, tuple(int(p) for p in parts)

    # -- reads ----------------------------------------------------------------------------------

    def on_read(self, i: int, first: bool = True, prefetch: bool = True) -> str | None:
        """Key `i` is read (`first`: from its start, which is how a reader's read of a chunk file
        begins; a later piece only asks for the verdict). Returns None if it is no chunk of an
        array we follow, "new" if its reads show no walk yet, "scan" if its array's walk is a scan of the
        remote file (the byte-stream read-ahead's business), else "walk" (the grid's: the
        byte-stream read-ahead must not run ahead of it)."""
        found = self.chunk_of(i)
        if found is None:
            return None
        grid, index = found
        walk = grid.walk
        if not first:
            return grid.verdict
        grid.chunk_bytes = self.refset.target(i)[2]
        self._walking[id(grid)] = grid
        self._walking.move_to_end(id(grid))
        if len(self._walking) > MAX_WALKS:
            _, old = self._walking.popitem(last=False)
            self._end_walk(old)
            old.walk = Walk(old.grid)
        grid.last_read = now = time.monotonic()
        if now - self._swept > IDLE:
            self._sweep(now)
        predicted = grid.pending.pop(index, None)
        if predicted is not None:
            uid, start, end = predicted
            self.budget.ahead -= end - start
            self.stats["used"] += 1
            self.stats["used_bytes"] += end - start
            grid.used += 1
            grid.window = min(grid.window + 1, MAX_WINDOW)
        if not walk.note(index):
            log.debug("grid read-ahead: %s%s starts a new walk of %s", grid.prefix, index, grid.prefix.rstrip("/"))
            self._end_walk(grid)
            self.stats["walks"] += 1
        grid.verdict = self._verdict(grid, prefetch)
        return grid.verdict

    def _verdict(self, grid: _Grid, prefetch: bool) -> str | None:
        walk = grid.walk
        if walk.model() is None:
            return "new"  # one read, or two far apart: no walk yet
        if walk.is_scan():
            if grid.pending:
                self._drop(grid, list(grid.pending))
            if not grid.scanning:
                grid.scanning = True
                self.stats["scans"] += 1
            return "scan"
        grid.scanning = False
        if prefetch:
            self._predict(grid)
        return "walk"

    def _sweep(self, now: float) -> None:
        """Walks nobody went on with for IDLE seconds: their unread predictions are wasted."""
        self._swept = now
        for grid in self._walking.values():
            if grid.pending and now - grid.last_read > IDLE:
                self._end_walk(grid)

    def _end_walk(self, grid: _Grid) -> None:
        """The walk ended: what it predicted and nobody read is wasted; a walk that wasted more
        than it used halves the window of the next."""
        wasted = len(grid.pending)
        self._drop(grid, list(grid.pending))
        if wasted > grid.used:
            grid.window = max(grid.window // 2, 1)
        grid.used = 0

    def _drop(self, grid: _Grid, indexes) -> None:
        for index in indexes:
            uid, start, end = grid.pending.pop(index)
            self.budget.ahead -= end - start
            self.stats["wasted"] += 1
            self.stats["wasted_bytes"] += end - start

    def _predict(self, grid: _Grid) -> None:
        walk = grid.walk
        model = walk.model()
        if model is None:
            return
        # predictions the walk has left (a row's end overshot before the next row showed the box)
        gone = [index for index in grid.pending if not walk.in_walk(index, model)]
        if gone:
            self._drop(grid, gone)
        floor = min(MIN_WINDOW, max(2, MIN_WINDOW_BYTES // max(grid.chunk_bytes, 1)))
        window = min(grid.window, max(floor, int(walk.count * LEAD_FRACTION)))
        wanted = window - len(grid.pending)
        if wanted < max(window // 4, 1):
            return  # (topped up by quarters: chunks predicted together go out in fewer requests)
        room = self.budget.prefetch_room()
        by_object: dict[int, list[tuple[int, int]]] = {}
        for index in walk.predict(wanted, grid.pending):
            j = self.refset.find(grid.key(index))
            if j < 0:
                continue  # a missing chunk (the fill value): nothing to fetch
            uid, offset, length = self.refset.target(j)
            if uid == INLINE or length == WHOLE_FILE or length <= 0:
                continue
            if length > room:
                break
            room -= length
            grid.pending[index] = (uid, offset, offset + length)
            self.budget.ahead += length
            self.stats["predicted"] += 1
            self.stats["predicted_bytes"] += length
            if not self.cache.has_exact(uid, offset, offset + length):
                by_object.setdefault(uid, []).append((offset, offset + length))
        for uid, ranges in by_object.items():
            groups = coalesce(ranges, self._max_gap(uid))
            for group in groups:
                self.stats["gets"] += 1
                if len(group) > 1:
                    self.stats["coalesced_gets"] += 1
                    self.stats["coalesced_ranges"] += len(group)
                    self.stats["gap_bytes"] += (group[-1][1] - group[0][0]) - sum(e - s for s, e in group)
            self.cache.fetch_exact_ahead(uid, groups)

    def _max_gap(self, uid: int) -> int:
        """A gap is worth fetching when carrying it takes less than a round trip: the host's
        bandwidth-delay product (as measured by the pacer), or GAP_UNMEASURED before that."""
        pacer = getattr(self.cache, "pacer", None)
        bdp = pacer.bdp(uid) if pacer is not None else 0
        return bdp if bdp > 0 else GAP_UNMEASURED

    def statistics(self) -> dict:
        pending = sum(len(g.pending) for g in self._arrays.values() if g is not None)
        return {**self.stats, "pending": pending}
