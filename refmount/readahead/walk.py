"""The walk of one reader's reads over an array's chunk grid (no I/O): which chunks it will read next.

`Walk` recognises the walk the reads make: a line along any axis with any stride, or a box walked
in C order (a row of n chunks, then the next row; a plane of rows, then the next plane), with its
outermost moving axis open-ended. Readers need not keep order (zarr reads a few chunks at once from
threads; dask reads a selection in the string order of its keys): the holes of the box the reads
span come first, nearest the latest read, then the chunks after the walk's frontier (the furthest
chunk read in walk order).

The holes are what the selection certainly holds (a box selection holds the box its reads span):
the planner predicts them all. The chunks past the frontier are a guess at where the selection
ends, and the planner caps them (readahead/planner.py).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import deque
from itertools import repeat

HISTORY = 64  # chunk reads a walk remembers (its box and strides come from these)
MAX_BOX = 4096  # the largest box whose holes are looked for
MAX_READ = 1024  # chunks a walk remembers having read (to skip them)
SLACK = 16  # steps beyond the box along a moving axis that still go on with the walk
STEADY_READS = 16  # the reads whose steps tell a walk from reads at random
NEAR = 8  # strides along its outermost axis a walk's read may step from the one before


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
        strides = known[3] if known is not None else self.strides(lo, hi)
        outer = next((a for a in range(len(lo)) if lo[a] != hi[a]), None)
        for a, v in enumerate(index):
            if a == outer:
                continue  # anywhere along the walk's outermost axis (dask reads in any order)
            # (readers a few threads wide, each waiting on a chunk of its own, ask out of order)
            slack = SLACK * strides[a] if lo[a] != hi[a] else 1  # (or the next row, plane or step)
            if not lo[a] - slack <= v <= hi[a] + slack:
                return False
        return True

    def _box(self, columns=None):
        columns = columns or list(zip(*self.history))  # (per axis, in C: this runs at every chunk read)
        return list(map(min, columns)), list(map(max, columns))

    def strides(self, lo, hi=None, columns=None) -> list[int]:
        """Per axis, the step between the chunks read along it (1 where only one was read). `hi`, if
        given (the box's top), spares the axes that did not move their pass over the history;
        `columns`, the history per axis if the caller has it already."""
        return [1 if hi is not None and hi[a] == low else math.gcd(*map(operator.sub, column, repeat(low))) or 1
                for a, (column, low) in enumerate(zip(columns or zip(*self.history), lo))]

    def model(self):
        """(varying axes, lo, hi, strides, direction of the outermost varying axis), or None before
        the walk shows a direction: at least three reads, or two neighbours. (Shared: not to be changed.)"""
        if self._model is None or self._model[0] != self._changes:
            self._model = (self._changes, self._work_out_model())
        return self._model[1]

    def _work_out_model(self):
        if len(self.history) < 2:
            return None
        columns = list(zip(*self.history))  # (one pass over the history for the box and the strides)
        lo, hi = self._box(columns)
        varying = [a for a in range(len(lo)) if lo[a] != hi[a]]
        if not varying:
            return None
        strides = self.strides(lo, hi, columns)
        if len(self.history) == 2 and any(hi[a] - lo[a] > 1 for a in varying):
            return None  # two reads far apart may be two random reads: wait for a third
        outer = varying[0]
        # backwards only if the walk began at its top and its latest read is at its bottom: readers a few
        # threads wide begin a row anywhere in it (7, 5, 6 is a forward walk begun out of order)
        first, latest = self.history[0][outer], self.history[-1][outer]
        direction = -1 if first == hi[outer] and latest == lo[outer] else 1
        return varying, lo, hi, strides, direction

    @staticmethod
    def _rank_key(varying, direction):
        outer = varying[0]
        if direction > 0:
            return operator.itemgetter(*varying)  # (in C: max() calls it for each of the history's reads)
        return lambda p: (-p[outer], *(p[a] for a in varying[1:]))

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

    def steady(self) -> bool:
        """Do the walk's recent reads go step by step: do all the steps between one read and the next
        move its outermost axis by a stride at most, or, over five reads or more (of the last
        STEADY_READS), two thirds of them by at most NEAR strides? Readers
        in a few threads, or in dask's key order, step a few chunks back and forth; readers reading at
        random fit a walk along an axis now and then (any read fits a grid of one axis), but jump."""
        m = self.model()
        if m is None:
            return False
        varying, _, _, strides, _ = m
        outer, stride = varying[0], strides[varying[0]]
        recent = list(itertools.islice(reversed(self.history), STEADY_READS))
        steps = [abs(a[outer] - b[outer]) for a, b in zip(recent, recent[1:])]
        if all(step <= stride for step in steps):
            return True  # (a walk's first reads: one stride at a time)
        # (over fewer reads, random ones share a stride by chance: 27, 47, 51 step 5 and 1 times 4)
        return len(recent) >= 5 and 3 * sum(step <= NEAR * stride for step in steps) >= 2 * len(steps)

    # -- predicting -------------------------------------------------------------------------------

    def in_walk(self, index, m=None) -> bool:
        """Is chunk `index` on the walk (its axes that do not move at their value, its inner axes
        within the box, on its strides)? The outermost moving axis is open-ended."""
        m = m or self.model()
        if m is None:
            return False
        varying, lo, hi, strides, _ = m
        outer = varying[0]
        for a, v in enumerate(index):  # (an axis that does not move has lo == hi: at its value)
            low = lo[a]
            if (v - low) % strides[a] or (a != outer and not low <= v <= hi[a]):
                return False
        return True

    @staticmethod
    def in_walk_key(m) -> tuple:
        """What `in_walk(index, m)` depends on: a chunk on the walk of one model is on the walk of
        every model with the same key. (A walk along its outer axis moves that axis's box every read,
        but not its place on the strides, nor the inner axes' bounds: the planner checks only the
        chunks it predicted since.)"""
        varying, lo, hi, strides, _ = m
        outer = varying[0]
        return (outer, tuple(strides), lo[outer] % strides[outer],
                tuple(v for a, v in enumerate(lo) if a != outer), tuple(v for a, v in enumerate(hi) if a != outer))

    def predict(self, count: int, skip=()) -> list[tuple[int, ...]]:
        """The next `count` chunks of the walk, within the grid, none of them read already or in
        `skip`: first the holes of the box its reads span (`holes`), then those after its frontier
        (`beyond`)."""
        out = self.holes(count, skip)
        return out + self.beyond(count - len(out), skip, out)

    def holes(self, count: int, skip=()) -> list[tuple[int, ...]]:
        """Up to `count` chunks of the box the walk's reads span, not read yet nor in `skip`, nearest
        the latest read first (a reader in no order, as dask, fills the box in its own order)."""
        m = self.model()
        if m is None or count <= 0:
            return []
        return self._holes(m, count, skip)

    def in_box(self, index, m=None) -> bool:
        """Is chunk `index` on the walk and within the box its reads span (not past its frontier)?"""
        m = m or self.model()
        if m is None or not self.in_walk(index, m):
            return False
        _, lo, hi, _, _ = m
        return all(lo[a] <= v <= hi[a] for a, v in enumerate(index))

    def beyond(self, count: int, skip=(), also=()) -> list[tuple[int, ...]]:
        """The next `count` chunks after the walk's frontier, nearest first, within the grid, none
        of them read already, in `skip` or in `also`."""
        m = self.model()
        if m is None or count <= 0:
            return []
        varying, lo, hi, strides, direction = m
        outer, inner = varying[0], varying[1:]
        out: list[tuple[int, ...]] = []
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
            if index in self.read or index in skip or index in also or index in out:
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
        # the box's chunks in C order (an axis that does not move has lo == hi: the latest read's value)
        axes = [range(lo[a], hi[a] + 1, strides[a]) if lo[a] != hi[a] else (latest[a],) for a in range(len(latest))]
        read = self.read
        holes = [(abs(rank(index) - here), index) for index in itertools.product(*axes)
                 if index not in read and index not in skip]
        holes.sort()
        return [index for _, index in holes[:count]]
