"""The read-ahead package (refmount.readahead) without a mount: the budget's reservations, the grid
planner's plans per reader, and predictions from the selection; then four reader processes through a
real mount (a loopback server that honours Range and logs each request).
"""

from __future__ import annotations

import gc
import random
import subprocess
import sys

import pytest

from refmount.cache.budget import MemoryBudget
from refmount.cache.reservations import AheadBudget
from refmount.readahead.planner import GridPlanner

GRID = (365, 8, 8)
CHUNK = 100  # bytes per chunk in these plans


def locate(index):
    """Chunks of GRID laid out in C order, CHUNK bytes each, in remote file 0."""
    t, y, x = index
    return 0, ((t * 8 + y) * 8 + x) * CHUNK, ((t * 8 + y) * 8 + x + 1) * CHUNK


class Reader:
    """One reader's chunk reads through a planner: what it read, and what plans fetched for it."""

    def __init__(self, planner: GridPlanner, pid: int) -> None:
        self.planner = planner
        self.pid = pid
        self.read: list[tuple] = []
        self.fetched: list[tuple] = []
        self.plans = []

    def reads(self, index) -> str:
        plan = self.planner.on_read("tas/", GRID, index, CHUNK, locate, reader=self.pid)
        assert plan.reader == self.pid
        self.read.append(index)
        self.fetched += [f.index for f in plan.fetches]
        self.plans.append(plan)
        return plan.verdict


# -- the budget's reservations ----------------------------------------------------------------------

def test_reservations_are_released_exactly_once():
    budget = AheadBudget(lambda: 1000)
    token = budget.reserve(300, "a")
    assert budget.held == 300 and budget.room() == 700
    token.resize(500)
    token.resize(-7)  # (never negative)
    assert budget.held == 0
    token.resize(200)
    assert token.release() == 200 and budget.held == 0 and budget.live == 0
    with pytest.raises(RuntimeError, match="released twice"):
        token.release()
    with pytest.raises(RuntimeError, match="after its release"):
        token.resize(10)
    assert budget.held == 0
    with budget.reserve(400) as held:
        assert budget.held == 400 and budget.room() == 600
        held.release()  # (released inside the block: leaving it does not release again)
    assert budget.held == 0
    with budget.reserve(1200):  # more than the limit: the room is 0, never negative
        assert budget.room() == 0
    assert budget.held == 0 and budget.dropped == 0


def test_a_dropped_reservation_gives_its_bytes_back_and_is_counted():
    budget = AheadBudget(lambda: 1000)
    budget.reserve(250)  # (dropped at once: a bug elsewhere)
    gc.collect()
    assert budget.held == 0 and budget.live == 0 and budget.dropped == 1


def test_the_memory_budget_sees_read_ahead_through_reservations_only():
    budget = MemoryBudget(1000, prefetch_share=0.5)
    token = budget.reservations.reserve(200)
    assert budget.ahead == 200 and budget.prefetch_room() == 300
    assert budget.statistics()["prefetch_ahead"] == 200
    with pytest.raises(AttributeError):
        budget.ahead += 100  # (no arithmetic on a public int: only reservations move it)
    budget.pressure = 0.5  # the memory target nears: the read-ahead share shrinks, the room with it
    assert budget.prefetch_room() == 50
    budget.pressure = 1.0
    assert budget.prefetch_room() == 0
    token.release()
    assert budget.ahead == 0


def test_an_exhausted_budget_shrinks_the_plan():
    budget = AheadBudget(lambda: 3 * CHUNK)
    reader = Reader(GridPlanner(budget), 1)
    for t in range(3):
        reader.reads((t, 4, 3))
    # the second read showed the walk: 8 wanted, 3 fit; the third read one of them, giving room for one
    assert reader.fetched == [(t, 4, 3) for t in range(2, 6)] and budget.held == 3 * CHUNK
    reader.reads((3, 4, 3))  # a prediction read gives its bytes back, and the plan takes them again
    assert reader.fetched[-1] == (6, 4, 3) and budget.held == 3 * CHUNK
    reader.planner.sweep(1e12)  # the reader went idle: every reservation is given back
    assert budget.held == 0 and budget.live == 0 and budget.dropped == 0


# -- walks per reader -------------------------------------------------------------------------------

def test_interleaved_readers_are_each_recognised():
    """Four readers each reading their own quarter of a point series (bench/NOTES.md "Issue 33":
    keyed by array only, their first reads look like one stride-25 walk)."""
    budget = AheadBudget(lambda: 1 << 30)
    planner = GridPlanner(budget)
    readers = [Reader(planner, 1000 + k) for k in range(4)]
    for step in range(25):
        for k, reader in enumerate(readers):
            reader.reads((25 * k + step, 4, 3))
    for k, reader in enumerate(readers):
        mine = {(t, 4, 3) for t in range(25 * k, 25 * k + 25)}
        assert reader.plans[-1].verdict == "walk"
        assert set(reader.fetched) <= mine | {(t, 4, 3) for t in range(25 * k + 25, 25 * k + 35)}, k
        assert mine - set(reader.read[:2]) <= set(reader.fetched), k  # all its chunks came ahead of it
    assert planner.stats["used"] >= 4 * 22
    planner.sweep(1e12)
    assert budget.held == 0


def test_random_readers_get_no_predictions():
    """32 readers reading whole chunks at random: no reader walks, nothing is fetched for them (issue 39:
    fetched / read rose to 1.50 with predictions for readers that do not walk)."""
    rng = random.Random(39)
    planner = GridPlanner(AheadBudget(lambda: 1 << 30))
    readers = [Reader(planner, 2000 + k) for k in range(32)]
    for _ in range(40):
        for reader in readers:
            reader.reads((rng.randrange(GRID[0]), rng.randrange(8), rng.randrange(8)))
    assert sum(len(r.fetched) for r in readers) == 0
    # arrays of one chunk per step (bench_memory.py's): any read fits a walk along the steps, and a
    # process's eight threads reading at random are one reader (of one process) that fills the axis
    for steps in (64, 256, 1024):
        planner = GridPlanner(AheadBudget(lambda: 1 << 30))
        reader = Reader(planner, 3000)
        for _ in range(400):
            plan = planner.on_read("t/", (steps, 1, 1), (rng.randrange(steps), 0, 0), CHUNK, locate, reader=3000)
            assert plan.fetches == [] and plan.verdict == "new", steps


def test_readers_out_of_order_still_walk():
    """What tells random readers apart must not stop walks read out of order: dask reads a point
    series in the string order of its keys (99, 98, ..., 90, 9, 89, ...), zarr from a few threads."""
    planner = GridPlanner(AheadBudget(lambda: 1 << 30))
    dask = Reader(planner, 5)
    for t in sorted(range(100), key=str, reverse=True):
        dask.reads((t, 4, 3))
    assert planner.stats["used"] >= 80
    rng = random.Random(33)
    threads = Reader(planner, 6)
    for start in range(0, 360, 10):
        batch = list(range(start, start + 10))
        rng.shuffle(batch)
        for t in batch:
            threads.reads((t, 2, 2))
    assert len(set(threads.fetched) & set(threads.read)) >= 340


# -- predictions from the selection ----------------------------------------------------------------

def test_a_cube_is_predicted_exactly_within_its_box():
    """A 3 x 3 x 24 cube read in C order: once the first plane showed the box, the rest of each plane it
    enters is predicted at once; what runs past its end stays within a quarter of what it needs."""
    budget = AheadBudget(lambda: 1 << 30)
    reader = Reader(GridPlanner(budget), 7)
    cube = [(t, y, x) for t in range(100, 124) for y in range(2, 5) for x in range(3, 6)]
    for n, index in enumerate(cube):
        reader.reads(index)
        if n == 9:  # the first chunk of the second plane: the plane's other eight are certain
            assert set(cube[10:18]) <= set(reader.fetched)
    assert set(cube) - set(reader.fetched) <= set(cube[:10])  # every chunk after the first plane came ahead
    extra = [index for index in reader.fetched if index not in set(cube)]
    assert len(extra) <= 0.25 * len(cube), len(extra)
    # after the first plane showed the box, nothing off it (only further steps of it)
    off_box = [i for i in reader.fetched[reader.fetched.index(cube[10]):]
               if not (2 <= i[1] <= 4 and 3 <= i[2] <= 5)]
    assert off_box == []
    assert len(set(reader.fetched)) == len(reader.fetched)  # each chunk asked for once


def test_a_cubes_first_plane_guesses_a_row_past_it_at_most_and_the_next_plane_comes_whole():
    """Read row by row, a cube's first plane is a walk over rows that may be a step of a bigger walk: it
    guesses one row past its frontier at most (the rows past the cube are wasted when the next plane begins,
    and count against the lead). From the second plane on, the next plane is fetched whole when a plane
    begins (the floor of a walk over planes: a step and a third)."""
    reader = Reader(GridPlanner(AheadBudget(lambda: 1 << 30)), 9)
    cube = [(t, y, x) for t in range(100, 124) for y in range(2, 5) for x in range(3, 6)]
    for index in cube[:9]:
        reader.reads(index)
    past = [index for index in reader.fetched if index not in set(cube)]
    assert len(past) <= 5, past  # the first row's to the grid's edge (a line then), a row past the plane
    reader.reads(cube[9])
    assert set(cube[18:27]) <= set(reader.fetched)


def test_a_point_series_at_one_level_of_a_4d_array_runs_ahead_from_its_second_read():
    """A line with an axis outside it is no young walk over rows: a point's series at one level, read a chunk
    at a time, has its next eight chunks on their way from its second read."""
    planner = GridPlanner(AheadBudget(lambda: 1 << 30))
    grid = (10, 365, 8, 8)
    fetched = []

    def locate_4d(index):
        return 0, index[1] * CHUNK, (index[1] + 1) * CHUNK

    for t in range(2):
        plan = planner.on_read("ta/", grid, (3, t, 4, 3), CHUNK, locate_4d, reader=5)
        fetched += [f.index for f in plan.fetches]
    assert fetched == [(3, t, 4, 3) for t in range(2, 10)]


def test_a_point_series_is_predicted_exactly_to_its_end():
    budget = AheadBudget(lambda: 1 << 30)
    reader = Reader(GridPlanner(budget), 8)
    series = [(t, 4, 3) for t in range(GRID[0])]
    for index in series:
        reader.reads(index)
    assert set(reader.fetched) == set(series[2:])  # nothing past its end (the grid's), nothing twice
    assert len(reader.fetched) == len(series) - 2
    assert budget.held == 0  # everything predicted was read


# -- byte streams per reader ------------------------------------------------------------------------

def test_byte_streams_go_on_only_with_their_own_reader():
    """Two readers of one remote file, the second starting where the first got to: each has a stream
    of its own (before, the second's reads went on with the first's stream: one scan of the file), and
    every stream's lead is held by a reservation, given back when the stream is replaced."""
    import trio

    from refmount.readahead import READER
    from refmount.readahead.streams import ReadStreams
    from tests.test_cache import PrefetchLog

    streams = ReadStreams(PrefetchLog(), gap=1000, streams=2)
    budget = streams.budget

    def read(pid, start, end):
        token = READER.set(pid)
        try:
            return streams.on_read(1, start, end, 1 << 20, None)
        finally:
            READER.reset(token)

    async def main():
        assert not read(11, 0, 1000)
        assert not read(22, 1000, 2000)  # where reader 11 got to: not its scan
        assert read(11, 1000, 2000) and read(11, 2000, 3000)  # reader 11 goes on with its own
        assert read(22, 2000, 3000)  # and so does 22
        assert budget.ahead == sum(s.lead(1000) for s in streams._files[1]) > 0
        read(33, 500_000, 501_000)  # a third reader: the oldest stream goes, its reservation with it
        assert budget.ahead == sum(s.lead(1000) for s in streams._files[1])
        assert budget.reservations.live == len(streams._files[1]) == 2
        await trio.testing.wait_all_tasks_blocked()

    trio.run(main)
    assert budget.reservations.dropped == 0


def test_a_reader_at_random_gets_no_run_openings():
    """A read from the start of a chunk that begins a run of chunks reads ahead to the next chunk's
    end (a scan's likely start), and a read of a block or more right after another opens a scan's
    window, but not for a reader whose reads keep opening new streams (32 random readers of whole
    chunks, 8 threads a process, fetched ahead for such chances) until its reads go on twice in a
    row. A reader that walks, or a new one, still gets its opening."""
    import trio

    from refmount.readahead import READER
    from refmount.readahead.streams import ReadStreams
    from tests.test_cache import PrefetchLog

    log = PrefetchLog()
    streams = ReadStreams(log, gap=1000, streams=8)
    key = 4000  # chunks of 4 blocks; each read of one is a run's opening (its successor follows it)

    def read_chunk(pid, n):
        token = READER.set(pid)
        try:
            start = n * key
            return streams.on_read(1, start, start + key, start + key, None, opening=True,
                                   next_key_end=start + 2 * key)
        finally:
            READER.reset(token)

    async def main():
        rng = random.Random(5)
        for n in rng.sample(range(2, 1000, 3), 12):  # one reader at random
            read_chunk(7, n)
            await trio.testing.wait_all_tasks_blocked()
        opened = [c for c in log.calls if c[2] >= 0]
        assert streams.openings_skipped == 10  # its first two reads might be a scan's start; then none
        assert len(opened) <= 2 * 2 * 4  # (two openings' blocks ahead, at most)
        log.calls.clear()
        assert read_chunk(8, 5) and read_chunk(8, 6)  # a new reader: its opening, and it walks on
        await trio.testing.wait_all_tasks_blocked()
        assert any(first * 1000 >= 6 * key for _, first, _ in log.calls)  # ahead into its next chunk
        log.calls.clear()
        assert not read_chunk(7, 500)  # (still at random: no opening)
        assert not read_chunk(7, 501)  # one read right after another is chance: no window opens
        await trio.testing.wait_all_tasks_blocked()
        assert log.calls == []
        assert read_chunk(7, 502)  # twice in a row: it walks now
        assert read_chunk(7, 700)  # a jump after a walk: a new stream, its opening granted
        assert streams.openings_skipped == 11

    trio.run(main)
    assert streams.budget.reservations.dropped == 0


# -- through a mount: four reader processes ---------------------------------------------------------

from tests.test_gridahead import STEPS, _fetched, sparse_file  # noqa: E402,F401  (its file and fixture)

READ_FILES = "import sys\nfor line in sys.stdin:\n    print(len(open(line.strip(), 'rb').read()), flush=True)\n"


def test_four_reader_processes_walk_each_their_own_quarter(sparse_file, mount):  # noqa: F811 (the fixture)
    """Four processes each read their own quarter of a point series' chunk files, in turn (one chunk
    each, then the next): each is a walk of its own, predicted along its own quarter, every chunk
    fetched once (keyed by array only, their reads made one walk with a stride of a quarter)."""
    from tests.support.datasets import kerchunk_refs
    from tests.support.rangeserver import RangeServer

    quarter = STEPS // 4
    with RangeServer(sparse_file.parent) as srv:
        refs = kerchunk_refs(sparse_file, url=srv.url_for("tas.nc"))
        lengths = {k: v[2] for k, v in refs["refs"].items() if k.startswith("tas/") and isinstance(v, list)}
        m = mount(refs, "--view", "raw")
        readers = [subprocess.Popen([sys.executable, "-c", READ_FILES], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True) for _ in range(4)]
        try:
            since = len(srv.stats["log"])
            for step in range(quarter):
                for k, proc in enumerate(readers):
                    proc.stdin.write(f"{m / 'tas' / f'{k * quarter + step}.6.2'}\n")
                    proc.stdin.flush()
                for k, proc in enumerate(readers):
                    assert int(proc.stdout.readline()) == lengths[f"tas/{k * quarter + step}.6.2"]
        finally:
            for proc in readers:
                proc.stdin.close()
                proc.wait(timeout=30)
        gets, nbytes = _fetched(srv.stats["log"], since)
        needed = sum(lengths[f"tas/{t}.6.2"] for t in range(STEPS))
        stats = m.stats()["grid_readahead"]
        assert gets <= STEPS and nbytes <= 1.25 * needed, (gets, nbytes, needed, stats)
        # every reader's chunks after its first two came ahead of it
        assert stats["used"] >= 4 * (quarter - 2), stats
        assert stats["wasted"] == 0, stats  # (what each predicted past its quarter, the next one read)
