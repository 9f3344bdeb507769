"""fetch/bridge.py's worker threads (`Workers`, behind `run_in_worker`): each call's outcome delivered
once, idle threads reused and let go, and the caller never waits for a thread to start."""
from __future__ import annotations

import threading
import time

import pytest
import trio

from refmount.fetch.bridge import Workers, run_in_worker


def test_calls_run_in_worker_threads_and_their_outcomes_come_back():
    async def main():
        ident = await run_in_worker(threading.get_ident, lambda: None)
        assert ident != threading.get_ident()
        assert await run_in_worker(lambda: 41 + 1, lambda: None) == 42
        with pytest.raises(ZeroDivisionError):
            await run_in_worker(lambda: 1 / 0, lambda: None)
        async with trio.open_nursery() as nursery:  # many at once: each gets its own result
            results = {}

            async def one(i):
                results[i] = await run_in_worker(lambda: i * i, lambda: None)

            for i in range(20):
                nursery.start_soon(one, i)
        assert results == {i: i * i for i in range(20)}

    trio.run(main)


def test_an_idle_thread_takes_the_next_job_and_exits_after_its_idle_timeout():
    workers = Workers(idle_timeout=0.2)
    done = []
    delivered = threading.Event()

    def deliver(result):
        done.append(result.unwrap())
        delivered.set()

    for _ in range(3):  # one after another: the same thread each time
        delivered.clear()
        workers.start_soon(threading.get_ident, deliver)
        assert delivered.wait(10)
    assert len(set(done)) == 1
    assert len(workers._idle) == 1
    for _ in range(200):  # (bounded: idle_timeout is 0.2 s)
        if not workers._idle:
            break
        time.sleep(0.05)
    assert not workers._idle  # let go: the next job starts a new thread
    delivered.clear()
    workers.start_soon(threading.get_ident, deliver)
    assert delivered.wait(10)
