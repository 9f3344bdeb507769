"""Replay bench_sparse's selections through the grid planner offline: no mount, no network (issue 39).

    PYTHONPATH=$PWD python bench/replay_sparse.py [--rtt-ms 80,20] [--cpu-ms 1.1] [--orders 8]

A reader like zarr's: THREADS threads take the selection's chunks in C order (each thread the next
chunk when it is free; `--orders` thread orders, a few neighbours swapped at random), one CPU decodes
each chunk in `--cpu-ms`, and a chunk nobody fetched ahead costs its reader one round trip. Every
read goes to refmount.readahead.planner.GridPlanner; each chunk it predicts arrives one round trip
after the read that predicted it. Prints, per selection and round trip, the replay's time (median,
min-max over the orders) and the chunks fetched over the chunks needed (bytes, for equal chunks):
what a change to the planner costs or gains, in seconds, before a run over the delay line.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics

from refmount.cache.budget import MemoryBudget
from refmount.readahead.planner import GridPlanner

THREADS = 6  # zarr's reads at once through a local store (asyncio's default executor on 2 cores)
GRID = (365, 8, 8)  # bench_sparse.py's tas.nc, in chunks
CHUNK_BYTES = 5600
SELECTIONS = {  # in chunks, as bench_sparse.py's (and a shorter cube: the floor's cost)
    "point series": [(0, 365), (4, 5), (3, 4)],
    "tile 5x5": [(100, 101), (1, 6), (2, 7)],
    "cube 3x3x24": [(100, 124), (3, 6), (3, 6)],
    "cube 3x3x8": [(100, 108), (3, 6), (3, 6)],
    "cube 3x3x4": [(100, 104), (3, 6), (3, 6)],
}


def replay(sel, rtt: float, cpu: float, order: int) -> tuple[float, float]:
    """(seconds, chunks fetched / chunks needed) of one thread order (0: in C order)."""
    planner = GridPlanner(MemoryBudget(1 << 62).reservations)
    chunks = list(itertools.product(*[range(a, b) for a, b in sel]))
    if order:
        rnd = random.Random(order)
        for i in range(len(chunks) - 1):  # threads begin a few reads out of order
            if rnd.random() < 0.3:
                chunks[i], chunks[i + 1] = chunks[i + 1], chunks[i]
    here: dict[tuple, float] = {}  # chunk -> when its bytes arrive
    free = [(0.0, k) for k in range(THREADS)]  # (when a thread is free, thread)
    cpu_free = 0.0
    for index in chunks:
        t, k = heapq.heappop(free)
        here.setdefault(index, t + rtt)  # (not predicted: its reader fetches it)
        plan = planner.on_read("a", GRID, index, CHUNK_BYTES, lambda _: (1, 0, CHUNK_BYTES), reader=1)
        for fetch in plan.fetches:
            here.setdefault(fetch.index, t + rtt)
        cpu_free = max(cpu_free, here[index]) + cpu
        heapq.heappush(free, (cpu_free, k))
    return cpu_free, len(here) / len(chunks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rtt-ms", default="80,20", help="round trips to replay, comma-separated (default 80,20)")
    p.add_argument("--cpu-ms", type=float, default=1.1, help="the reader's CPU per chunk (default 1.1: a 1 ms link)")
    p.add_argument("--orders", type=int, default=8, help="thread orders per selection (default 8)")
    args = p.parse_args()
    for name, sel in SELECTIONS.items():
        for rtt in (float(v) / 1000 for v in args.rtt_ms.split(",")):
            runs = [replay(sel, rtt, args.cpu_ms / 1000, order) for order in range(args.orders)]
            times, fetched = [r[0] for r in runs], [r[1] for r in runs]
            print(f"{name:13} {rtt * 1000:4.0f} ms: {statistics.median(times):.3f} s "
                  f"({min(times):.3f}-{max(times):.3f}), fetched {min(fetched):.3f}-{max(fetched):.3f}x")


if __name__ == "__main__":
    main()
