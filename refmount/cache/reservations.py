"""The read-ahead share of the block cache's memory budget, handed out as reservations.

Every byte read-ahead claims (fetched or in flight, not yet read) is held by a `Reservation`: the
grid planner holds one per predicted chunk, a byte stream one for its lead. A reservation is
resized as what it holds changes and released exactly once (`release()`, or leaving its `with`
block); releasing it twice is a bug and raises. One dropped without release gives its bytes back
when it is collected and is counted in `dropped` (tests assert none is): the count of what
read-ahead holds can never drift, and never goes negative.

The budget never refuses what a reservation asks for (`reserve`, `resize`): the planner decides
within `room()`, so a plan shrinks as the room does (the memory target's pressure shrinks the
limit: cache/governor.py). Everything here runs on the trio thread.
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("refmount")


class AheadBudget:
    """Bytes read-ahead may hold: `limit()` (read each time: it moves with memory pressure)."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self.held = 0  # bytes all live reservations hold
        self.live = 0  # reservations not yet released
        self.granted = 0  # reservations made
        self.dropped = 0  # reservations collected without release (a bug: released for it)

    @property
    def limit(self) -> int:
        return self._limit()

    def room(self) -> int:
        """Bytes read-ahead may still reserve."""
        return max(self.limit - self.held, 0)

    def reserve(self, nbytes: int = 0, whom: object = None) -> "Reservation":
        """A reservation of `nbytes` (the caller planned within room())."""
        self.granted += 1
        self.live += 1
        token = Reservation(self, whom)
        token.resize(nbytes)
        return token

    def statistics(self) -> dict:
        return {"held": self.held, "live": self.live, "reservations": self.granted, "dropped": self.dropped}


class Reservation:
    """Bytes of the read-ahead budget held for one purpose (`whom`: for log lines)."""

    __slots__ = ("budget", "whom", "nbytes", "released", "__weakref__")

    def __init__(self, budget: AheadBudget, whom: object = None) -> None:
        self.budget = budget
        self.whom = whom
        self.nbytes = 0
        self.released = False

    def resize(self, nbytes: int) -> None:
        """Hold `nbytes` now (more or fewer than before)."""
        if self.released:
            raise RuntimeError(f"read-ahead reservation for {self.whom!r} resized after its release")
        nbytes = max(int(nbytes), 0)
        self.budget.held += nbytes - self.nbytes
        self.nbytes = nbytes

    def release(self) -> int:
        """Give the bytes back; returns how many. Exactly once."""
        if self.released:
            raise RuntimeError(f"read-ahead reservation for {self.whom!r} released twice")
        self.released = True
        nbytes, self.nbytes = self.nbytes, 0
        self.budget.held -= nbytes
        self.budget.live -= 1
        return nbytes

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, *exc) -> None:
        if not self.released:
            self.release()

    def __del__(self) -> None:
        if not self.released:  # (a bug elsewhere: never let it leak the budget)
            self.budget.dropped += 1
            self.release()
