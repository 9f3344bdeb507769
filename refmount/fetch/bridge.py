"""Run asyncio coroutines (aiohttp, fsspec's async filesystems) from the trio thread.

The daemon runs on trio; aiohttp and fsspec need asyncio. One asyncio loop runs in a helper thread
(fsspec's own loop, so fsspec filesystems and our aiohttp session share it). A trio task submits a
coroutine there and sleeps on a trio Event that the asyncio side sets when done: no trio worker
thread is tied up per request, and cancelling the trio task cancels the asyncio task.
"""

from __future__ import annotations

import asyncio

import trio


def asyncio_loop() -> asyncio.AbstractEventLoop:
    import fsspec.asyn

    return fsspec.asyn.get_loop()


async def run_on_asyncio(coro, loop: asyncio.AbstractEventLoop | None = None):
    """Await `coro` on the asyncio loop from trio; cancellation propagates both ways."""
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
