"""The grid read-ahead's one decision: per reader and array, which chunks to fetch ahead (a plan).

The caller (view/gridahead.py) tells the planner each chunk read, with the reader (the pid of the
process whose open it goes through) and a way to find a chunk's bytes; the planner answers with a
`GridPlan`: what the walk is ("new", "walk", "scan"), for whom, and the chunks to fetch now, each
with its byte range. The planner holds a reservation of the read-ahead budget for every chunk it
predicted until the chunk is read, or counted wasted (the walk ended or went elsewhere, its reader
went idle, or the walk is a scan); the caller only fetches.

Walks are keyed by (array, reader): four readers each reading their own chunks are four walks, not
one that jumps between them; a reader reading at random starts a new walk at almost every read and
gets no prediction.

How far ahead: the chunks of the box the walk's reads span, in the steps of its outermost axis it has
entered, are certain (a selection is a box: the first reads of a row or plane show its extent), and
are all predicted at once. The chunks past the walk's frontier are a guess at where the selection
ends: at most a window that grows by one per prediction used (so it doubles while the walk goes on),
halves when a walk wasted more than it used, and never exceeds LEAD_FRACTION of the chunks the walk
has read (or a few: MIN_WINDOW, MIN_WINDOW_PLANES), so that when the walk ends, what was fetched past
it stays within the bytes target (at most 1.25x the bytes the selection needs). A young walk that may
be one step of a bigger walk (a cube's first plane) guesses one step past its frontier at most. The
budget's room bounds them all: an exhausted budget shrinks the plan. Everything here runs on the trio thread.
"""

from __future__ import annotations

import logging
import operator
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Hashable

from refmount.cache.reservations import AheadBudget, Reservation
from refmount.readahead.walk import Walk

log = logging.getLogger("refmount")

MAX_WALKS = 128  # (array, reader) walks followed at once (the least recently read is forgotten; each remembers
# up to walk.MAX_READ chunks read, ~100 kB)
MIN_WINDOW = 8  # guesses a walk may keep ahead from the start (small chunks)...
MIN_WINDOW_PLANES = 12  # ... or, for a walk whose steps hold several chunks (a cube's planes), up to a step and
# a third (zarr's threads ask for a plane at once: less than the next plane ahead, and each plane waits)...
MIN_WINDOW_BYTES = 256 << 10  # ... or fewer, as many as hold this many bytes (at least 2), for big ones
LEAD_FRACTION = 0.2  # ... and at most this fraction of the chunks it has read, beyond that
MAX_WINDOW = 512  # chunks predicted for one walk at once
YOUNG_STEPS = 8  # steps of its outermost axis a walk enters before it is taken for the whole selection (below)
IDLE = 5.0  # seconds after its last read when a walk's unread predictions count as wasted (and free the budget)

Locate = Callable[[tuple], "tuple[int, int, int] | None"]  # chunk index -> (url id, start, end), or None


@dataclass
class Fetch:
    index: tuple
    uid: int
    start: int
    end: int


@dataclass
class GridPlan:
    """What the planner made of a read: the walk's verdict, and what to fetch for `reader`."""

    reader: int
    verdict: str | None
    fetches: list[Fetch] = field(default_factory=list)


class _WalkState:
    """One reader's walk over one array's grid, and what was predicted for it."""

    __slots__ = ("name", "walk", "window", "pending", "used", "wasted", "scanning", "verdict", "chunk_bytes",
                 "last_read", "checked_key", "unchecked")

    def __init__(self, name: str, grid: tuple[int, ...]) -> None:
        self.name = name
        self.walk = Walk(grid)
        self.window = MIN_WINDOW  # guesses it may keep ahead (before the walk's own cap)
        self.pending: OrderedDict[tuple, tuple[Fetch, Reservation]] = OrderedDict()  # predicted, unread
        self.used = 0  # of this walk's predictions
        self.wasted = 0  # of this walk's predictions, dropped unread (they count against its lead)
        self.scanning = False  # the walk is a scan (see Walk.is_scan)
        self.verdict: str | None = None  # what the last read from a chunk's start made of the walk
        self.chunk_bytes = 0  # the referenced length of its chunk read last
        self.last_read = 0.0
        self.checked_key = None  # Walk.in_walk_key of the model every pending chunk was last found on the walk of
        self.unchecked: list[tuple] = []  # chunks predicted since (not checked against a model yet)


class GridPlanner:
    """Per (array, reader), the walk of its chunk reads and the chunks predicted for it."""

    def __init__(self, budget: AheadBudget) -> None:
        self.budget = budget
        self._walks: OrderedDict[tuple[Hashable, int], _WalkState] = OrderedDict()  # least recently read first
        self._swept = 0.0
        self.stats = {"predicted": 0, "predicted_bytes": 0, "used": 0, "used_bytes": 0, "wasted": 0,
                      "wasted_bytes": 0, "walks": 0, "scans": 0}

    def on_read(self, array: Hashable, grid: tuple[int, ...], index: tuple[int, ...], chunk_bytes: int,
                locate: Locate, reader: int = 0, first: bool = True, prefetch: bool = True) -> GridPlan:
        """Chunk `index` of `array` (chunks per axis: `grid`) is read by `reader` (`first`: from its
        start, which is how a read of a chunk file begins; a later piece only asks for the verdict).
        The plan's verdict is "new" if the reader's reads show no walk yet, "scan" if its walk is a
        scan of the remote file (the byte-stream read-ahead's business), else "walk"."""
        key = (array, reader)
        state = self._walks.get(key)
        if not first:
            return GridPlan(reader, state.verdict if state is not None else None)
        if state is None or state.walk.grid != grid:
            if state is not None:
                self._end_walk(state)
            state = self._walks[key] = _WalkState(f"{array}{'' if not reader else f' (pid {reader})'}", grid)
            if len(self._walks) > MAX_WALKS:
                _, old = self._walks.popitem(last=False)
                self._end_walk(old)
        self._walks.move_to_end(key)
        state.chunk_bytes = chunk_bytes
        state.last_read = now = time.monotonic()
        if now - self._swept > IDLE:
            self.sweep(now)
        predicted = state.pending.pop(index, None)
        if predicted is not None:
            fetch, token = predicted
            token.release()
            self.stats["used"] += 1
            self.stats["used_bytes"] += fetch.end - fetch.start
            state.used += 1
            state.window = min(state.window + 1, MAX_WINDOW)
        if not state.walk.note(index):
            log.debug("grid read-ahead: %s%s starts a new walk", state.name, index)
            self._end_walk(state)
            self.stats["walks"] += 1
        plan = GridPlan(reader, None)
        plan.verdict = state.verdict = self._verdict(state, prefetch, locate, plan)
        return plan

    def _verdict(self, state: _WalkState, prefetch: bool, locate: Locate, plan: GridPlan) -> str:
        walk = state.walk
        if walk.model() is None or not walk.steady():
            return "new"  # one read, two far apart, or reads at random: no walk yet
        if walk.is_scan():
            self._drop(state, list(state.pending))
            if not state.scanning:
                state.scanning = True
                self.stats["scans"] += 1
            return "scan"
        state.scanning = False
        if prefetch:
            self._plan(state, locate, plan)
        return "walk"

    def _plan(self, state: _WalkState, locate: Locate, plan: GridPlan) -> None:
        walk = state.walk
        model = walk.model()
        # predictions the walk has left (a row's end overshot before the next row showed the box)
        key = walk.in_walk_key(model)
        # (a model with the key of the last check leaves the chunks found on the walk then on it)
        pending = state.pending
        maybe = pending if key != state.checked_key else [index for index in state.unchecked if index in pending]
        gone = [index for index in maybe if not walk.in_walk(index, model)]
        state.checked_key, state.unchecked = key, []
        if gone:
            self._drop(state, gone)
        room_in_window = MAX_WINDOW - len(state.pending)
        if room_in_window <= 0:
            return
        # certain: the box's holes in the steps of the outermost axis the walk has entered
        outer = model[0][0]
        entered = {p[outer] for p in walk.history}
        holes = walk.holes(room_in_window, state.pending)
        certain = [index for index in holes if index[outer] in entered]
        # guesses: past the frontier (or in steps not entered yet), capped (see the module)
        varying, lo, hi, strides = model[0], model[1], model[2], model[3]
        step = 1  # chunks in one step of the outermost axis (a row, a plane)
        for a in varying[1:]:
            step *= (hi[a] - lo[a]) // strides[a] + 1
        floor = min(max(MIN_WINDOW, min(step + step // 3, MIN_WINDOW_PLANES)),
                    max(2, MIN_WINDOW_BYTES // max(state.chunk_bytes, 1)))
        # (what this walk already wasted, say a first row's overshoot, counts against the lead: the bytes
        # target is for the whole selection)
        cap = min(state.window, max(floor, int(walk.count * LEAD_FRACTION) - state.wasted))
        if step > 1 and len(entered) < YOUNG_STEPS and any(walk.grid[a] > 1 for a in range(outer)):
            # a young walk over rows (or planes) with axes outside them may be a step of a bigger walk (a cube's
            # first plane, read row by row): what it guesses past that step is wasted when the next step begins,
            # and counts against the lead for good. One step past its frontier at most. (Not a line: a point's
            # series at one level of a 4D array would wait a round trip a chunk.)
            cap = min(cap, step)
        # (every pending chunk is on the walk now: in its box is within its bounds)
        guessing = sum(1 for index in state.pending
                       if index[outer] not in entered or not all(map(operator.le, lo, index))
                       or not all(map(operator.le, index, hi)))
        wanted = min(cap - guessing, room_in_window - len(certain))
        guesses: list[tuple] = []
        if wanted >= max(cap // 4, 1):  # (topped up by quarters: chunks predicted together go out in fewer requests)
            guesses = [index for index in holes if index[outer] not in entered][:wanted]
            guesses += walk.beyond(wanted - len(guesses), state.pending, holes)
        room = self.budget.room()
        for index in certain + guesses:
            where = locate(index)
            if where is None:
                continue  # a missing chunk (the fill value) or one not fetched by range: nothing to fetch
            uid, start, end = where
            if end - start > room:
                break  # the budget is exhausted: the plan shrinks
            room -= end - start
            fetch = Fetch(index, uid, start, end)
            state.pending[index] = (fetch, self.budget.reserve(end - start, state.name))
            state.unchecked.append(index)
            self.stats["predicted"] += 1
            self.stats["predicted_bytes"] += end - start
            plan.fetches.append(fetch)

    def sweep(self, now: float) -> None:
        """Walks nobody went on with for IDLE seconds: their unread predictions are wasted."""
        self._swept = now
        for state in self._walks.values():
            if state.pending and now - state.last_read > IDLE:
                self._end_walk(state)

    def _end_walk(self, state: _WalkState) -> None:
        """The walk ended: what it predicted and nobody read is wasted; a walk that wasted more than
        it used halves the window of the next."""
        wasted = len(state.pending)
        self._drop(state, list(state.pending))
        if wasted > state.used:
            state.window = max(state.window // 2, 1)
        state.used = state.wasted = 0

    def _drop(self, state: _WalkState, indexes) -> None:
        for index in indexes:
            fetch, token = state.pending.pop(index)
            token.release()
            state.wasted += 1
            self.stats["wasted"] += 1
            self.stats["wasted_bytes"] += fetch.end - fetch.start

    def pending(self) -> int:
        return sum(len(state.pending) for state in self._walks.values())
