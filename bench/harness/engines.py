"""Pieces of the FUSE-free HTTP engine benches (bench_engines.py, bench_s3.py): the block cache the
engines fill, per-thread CPU, the trio shim for obstore's awaitables, and curl as the wire's limit."""

from __future__ import annotations

import collections
import resource
import subprocess
import threading
import time
from pathlib import Path

BLOCK = 1 << 20


class Sink:
    """Keeps every block (capacity 0) or the last `capacity` bytes of them (oldest evicted first);
    evicted buffers go back to `recycle` when the engine has a pool."""

    def __init__(self, capacity: int, recycle=None) -> None:
        self.capacity, self.recycle = capacity, recycle
        self.blocks: collections.OrderedDict = collections.OrderedDict()
        self.size = 0
        self.bytes = 0

    def put(self, start: int, pieces) -> None:
        for piece in pieces:
            n = len(piece) if not isinstance(piece, memoryview) else piece.nbytes
            self.blocks[start] = piece
            self.size += n
            self.bytes += n
            start += n
            while self.capacity and self.size > self.capacity:
                _, old = self.blocks.popitem(last=False)
                self.size -= len(old) if not isinstance(old, memoryview) else old.nbytes
                if self.recycle is not None:
                    self.recycle(old)


def pieces_of(buffer, start: int, length: int | None = None):
    """Zero-copy 1 MiB views of `buffer` holding the bytes from `start`."""
    view = memoryview(buffer)
    n = view.nbytes if length is None else length
    out, pos = [], 0
    while pos < n:
        step = min(BLOCK - (start + pos) % BLOCK, n - pos)
        out.append(view[pos:pos + step])
        pos += step
    return out


class trio_shim:
    """Resolve a pyo3-async-runtimes awaitable (obstore's *_async) on the trio loop, with no asyncio
    loop thread: pyo3 asks `asyncio.get_running_loop()` for `create_future()` and completes the
    future with `loop.call_soon_threadsafe(...)` from a tokio thread. This loop stand-in makes a
    future whose completion is a trio `run_sync_soon`: one wake-up of the trio thread per request."""

    class Future:
        def __init__(self) -> None:
            import trio

            self.event = trio.Event()
            self._result = self._exception = None
            self._callbacks = []
            self._done = self._cancelled = False

        def set_result(self, value) -> None:
            self._result, self._done = value, True
            self.event.set()

        def set_exception(self, error) -> None:
            self._exception, self._done = error, True
            self.event.set()

        def done(self) -> bool:
            return self._done

        def cancelled(self) -> bool:
            return self._cancelled

        def cancel(self, *args) -> bool:
            if self._done:
                return False
            self._cancelled = self._done = True
            for callback in self._callbacks:
                callback(self)
            self.event.set()
            return True

        def add_done_callback(self, callback, *, context=None) -> None:
            self._callbacks.append(callback)

        def get_loop(self):
            return trio_shim.loop

        def __await__(self):  # pyo3 awaits nothing; present for asyncio.isfuture-like checks
            raise RuntimeError("not awaitable")

        _asyncio_future_blocking = False

    class Loop:
        def __init__(self, token) -> None:
            self.token = token

        def create_future(self):
            return trio_shim.Future()

        def call_soon_threadsafe(self, callback, *args, context=None):
            if context is not None:
                self.token.run_sync_soon(lambda: context.run(callback, *args))
            else:
                self.token.run_sync_soon(callback, *args)

        def is_closed(self) -> bool:
            return False

        def is_running(self) -> bool:
            return True

    loop = None

    @classmethod
    async def awaiting(cls, make):
        """`make()` builds the pyo3 awaitable (under the stand-in loop); wait for its result."""
        import asyncio.events
        import trio

        if cls.loop is None:
            cls.loop = cls.Loop(trio.lowlevel.current_trio_token())
        asyncio.events._set_running_loop(cls.loop)
        try:
            future = make()
        finally:
            asyncio.events._set_running_loop(None)
        try:
            await future.event.wait()
        except BaseException:
            future.cancel()
            raise
        if future._exception is not None:
            raise future._exception
        return future._result


def thread_cpu() -> dict:
    """CPU seconds of this process's threads, by role: tokio workers by name, the rest by native id."""
    out = collections.Counter()
    main = threading.main_thread().native_id
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            cpu = int((task / "schedstat").read_text().split()[0]) / 1e9  # ns on a CPU (finer than stat's ticks)
        except OSError:
            continue
        role = "trio" if int(task.name) == main else "tokio" if comm.startswith("tokio") else "other"
        out[role] += cpu
    return out


def curl_run(url: str, size: int, range_mib: int, par: int, run_dir: Path) -> dict:
    span = range_mib << 20
    config = run_dir / f"curl-{range_mib}-{par}.conf"
    config.write_text("".join(f'url = "{url}"\nrange = "{s}-{min(s + span, size) - 1}"\noutput = "/dev/null"\n'
                              for s in range(0, size, span)))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    cmd = ["curl", "-s", "--no-progress-meter", "-f", "-K", str(config)] + (["--parallel", "--parallel-max", str(par)] if par > 1 else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": seconds, "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
            "minflt": after.ru_minflt - before.ru_minflt, "threads": {}}
