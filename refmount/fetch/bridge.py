"""Run work off the trio thread: blocking calls in worker threads, asyncio coroutines on asyncio's loop.

The daemon runs on trio.
- `run_in_worker`: a blocking call (the stdlib HTTP engine's request, direct.py) in one of trio's
  cached worker threads; the trio task sleeps and is woken once, when the call returns.
- `run_on_asyncio`: aiohttp and fsspec need asyncio. One asyncio loop runs in a helper thread
  (fsspec's own loop, so fsspec filesystems and our aiohttp session share it). A trio task submits a
  coroutine there and sleeps on a trio Event that the asyncio side sets when done: no trio worker
  thread is tied up per request, and cancelling the trio task cancels the asyncio task.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

    trio.lowlevel.start_thread_soon(call, deliver)
    try:
        result = await trio.lowlevel.wait_task_rescheduled(on_cancel)
    except BaseException:
        if aborted:
            await trio.lowlevel.checkpoint()  # raises Cancelled rather than the aborted call's error
        raise
    if aborted:
        await trio.lowlevel.checkpoint()
    return result


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
