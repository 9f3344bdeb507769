"""Run work off the trio thread: blocking calls in worker threads, asyncio coroutines on asyncio's loop.

The daemon runs on trio.
- `run_in_worker`: a blocking call (the stdlib HTTP engine's request, direct.py) in one of our
  cached worker threads (`Workers`); the trio task sleeps and is woken once, when the call returns.
- `run_on_asyncio`: aiohttp and fsspec need asyncio. One asyncio loop runs in a helper thread
  (fsspec's own loop, so fsspec filesystems and our aiohttp session share it). A trio task submits a
  coroutine there and sleeps on a trio Event that the asyncio side sets when done: no trio worker
  thread is tied up per request, and cancelling the trio task cancels the asyncio task.
"""

from __future__ import annotations

import _thread
import threading
from typing import TYPE_CHECKING

import outcome
import trio

if TYPE_CHECKING:
    import asyncio  # (imported when first used: 50 ms a daemon on the stdlib engine never needs)


async def run_in_worker(call, abort):
    """`call()` in a worker thread, its result or exception here. A cancelled task calls `abort()`
    (from the trio thread; it must make `call` return at once, e.g. by shutting its socket), waits
    for `call` to return, and raises Cancelled: no thread is left working for nobody."""
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()
    aborted = False

    def deliver(outcome) -> None:  # in the worker thread
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task, outcome)
        except trio.RunFinishedError:
            pass

    def on_cancel(_raise_cancel):
        nonlocal aborted
        aborted = True
        abort()
        return trio.lowlevel.Abort.FAILED  # woken by `deliver` once `call` has returned

    WORKERS.start_soon(call, deliver)
    try:
        result = await trio.lowlevel.wait_task_rescheduled(on_cancel)
    except BaseException:
        if aborted:
            await trio.lowlevel.checkpoint()  # raises Cancelled rather than the aborted call's error
        raise
    if aborted:
        await trio.lowlevel.checkpoint()
    return result


class Workers:
    """Cached worker threads, as trio's (`trio.lowlevel.start_thread_soon`), but a new one is started
    without waiting for it to run: `threading.Thread.start` blocks its caller until the new thread
    holds the GIL, and a scan's first parts each start one from the trio thread, which then serves
    no FUSE request (six threads took 42 ms of the first 70 of a cold `dd` at load 2: bench/NOTES.md,
    "cold sequential"). The job is the new thread's own, so nothing waits for it but its task.
    Idle threads wait `idle_timeout` seconds for another job, then exit; the most recently idle one
    is handed the next job."""

    def __init__(self, idle_timeout: float = 10.0) -> None:
        self.idle_timeout = idle_timeout
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()

    def start_soon(self, call, deliver) -> None:
        """`call()` in a worker thread, then `deliver(outcome)` there. Never blocks."""
        with self._lock:
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            _thread.start_new_thread(self._work, (_Worker((call, deliver)),))
        else:
            worker.job = (call, deliver)
            worker.ready.release()

    def _work(self, worker: _Worker) -> None:
        while True:
            call, deliver = worker.job
            worker.job = None
            result = outcome.capture(call)
            del call  # (what the call refers to is not kept alive by an idle thread)
            with self._lock:  # idle before delivering: the task woken may hand it the next job
                self._idle.append(worker)
            deliver(result)
            del deliver, result
            while not worker.ready.acquire(timeout=self.idle_timeout):
                with self._lock:
                    if worker in self._idle:
                        self._idle.remove(worker)
                        return
                # (taken off the idle list meanwhile: its next job is on the way)


class _Worker:
    __slots__ = ("job", "ready")

    def __init__(self, job) -> None:
        self.job = job
        self.ready = threading.Lock()  # released when a job is handed over
        self.ready.acquire()


WORKERS = Workers()


def asyncio_loop() -> asyncio.AbstractEventLoop:
    import fsspec.asyn

    return fsspec.asyn.get_loop()


async def run_on_asyncio(coro, loop: asyncio.AbstractEventLoop | None = None):
    """Await `coro` on the asyncio loop from trio; cancellation propagates both ways."""
    import asyncio

    loop = loop or asyncio_loop()
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_):
        try:
            token.run_sync_soon(done.set)
        except trio.RunFinishedError:
            pass

    future.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        future.cancel()
        raise
    return future.result()
