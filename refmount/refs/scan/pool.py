"""Worker processes that scan data files, fed with bytes by the parent (a trio task per scan).

The parent answers each worker's ["read", start, end] with `read(url, start, end)`, which goes through
refmount's own fetcher and block cache; workers are forked off a fork server that has kerchunk and h5py
imported already (a new worker costs a fork, not a second of imports). A worker that dies, runs out of
its memory or overruns --load-timeout fails only its file, and is replaced.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal

import orjson
import trio

from refmount.fetch.retry import Passing
from refmount.refs.limits import deadline_held

_context = None
MAX_QUESTIONS = 4  # "exists" questions one scan may ask (a DMR++'s href and its sibling: 2)


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["refmount.refs.scan.preload"])
        # The fork server and multiprocessing's resource tracker keep the standard streams they start
        # with. Before the mount is ready those are the terminal or the pipe of whoever ran `refmount
        # mount`, which would then wait for EOF until the unmount (the scanners report through pipes).
        with _streams_to_devnull():
            multiprocessing.forkserver.ensure_running()
    return _context


def start_fork_server() -> None:
    """Start the fork server now (it imports kerchunk and h5py: a second or more), so that this overlaps
    other work, such as a cold mount's listing, rather than waiting for the first scan."""
    _forkserver()


@contextlib.contextmanager
def _streams_to_devnull():
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        yield
    finally:
        for fd, copy in zip((0, 1, 2), saved):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


class ScanFailed(Exception):
    """One file could not be scanned; the message says why (one line)."""


class ScanKilled(ScanFailed, Passing):
    """The scanner was killed from outside (SIGKILL: the system's out-of-memory killer, most likely): not
    the file's doing, so it may be scanned later (fetch/retry.py `passing` says so)."""


class _Worker:
    def __init__(self, memory: int, max_result: int) -> None:
        context = _forkserver()
        self.memory = memory
        self.conn, child = context.Pipe()
        with deadline_held():
            self.process = context.Process(target=_run_worker, args=(child, memory, max_result), daemon=True,
                                           name="refmount-scan")
            self.process.start()
        child.close()

    async def message(self, max_bytes: int) -> list:
        await trio.lowlevel.wait_readable(self.conn.fileno())
        try:
            return orjson.loads(self.conn.recv_bytes(max_bytes))
        except (EOFError, ConnectionError):
            raise await trio.to_thread.run_sync(self.death) from None
        except OSError:
            raise ScanFailed("the scanner sent more than --max-refs-size") from None
        except orjson.JSONDecodeError:
            raise ScanFailed("the scanner sent a malformed message") from None

    async def send(self, data: bytes | tuple) -> None:
        """A message to the worker (bytes as they are, else pickled: only the scan's own tuple)."""
        try:
            if isinstance(data, tuple):
                self.conn.send(data)
            else:
                await trio.to_thread.run_sync(self.conn.send_bytes, data)
        except (BrokenPipeError, ConnectionError):  # (it died, or was killed, while idle or scanning)
            raise await trio.to_thread.run_sync(self.death) from None

    def death(self) -> ScanFailed:
        """How the worker ended, which closed its pipe with no answer (a parser's error is an answer)."""
        self.process.join(5)
        code = self.process.exitcode
        if code is None:
            return ScanFailed("the scanner process closed its pipe with no answer")
        if code >= 0:
            return ScanFailed(f"the scanner process exited (status {code}) with no answer")
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        if -code == signal.SIGKILL:
            return ScanKilled(f"the scanner process was killed ({name}: the system's out-of-memory killer, or "
                              "another process)")
        return ScanFailed(f"the scanner process died on it ({name}: a crash in the parser, or an allocation past "
                          f"its {self.memory >> 20} MiB memory cap)")

    def stop(self, kill: bool = False) -> None:
        with deadline_held():
            if not kill:
                try:
                    self.conn.send(None)
                except OSError:
                    kill = True
            if kill and self.process.is_alive():
                self.process.kill()
            self.process.join(2 if not kill else 5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
            self.conn.close()


def _run_worker(conn, memory: int, max_result: int) -> None:
    from refmount.refs.scan.worker import worker_main

    worker_main(conn, memory, max_result)


class ScanPool:
    """Up to `workers` processes; `scan` borrows one per file."""

    def __init__(self, read, *, workers: int, memory: int, max_result: int, timeout: float | None,
                 exists=None) -> None:
        self._read = read  # async (url, start, end) -> bytes
        self._exists = exists  # async url -> True, False or None (cannot tell); None: never known
        self._max = max(1, workers)
        self._memory = memory
        self._max_result = max_result
        self._timeout = timeout
        self._idle: list[_Worker] = []
        self._all: list[_Worker] = []
        self.slots = trio.Semaphore(self._max)  # held by the caller around a file's sniff and scan

    async def scan(self, fmt: str, url: str, size: int, job: dict | None = None) -> dict:
        """Scan one file (`job`: what its format needs, worker.scan_file); the caller holds one of `slots`.
        A DMR++'s "refs" come back as JSON bytes."""
        worker = self._idle.pop() if self._idle else await trio.to_thread.run_sync(self._new_worker)
        try:
            with trio.fail_after(self._timeout or float("inf")):
                result = await self._drive(worker, fmt, url, size, job or {})
        except trio.TooSlowError:
            self._discard(worker)
            raise ScanFailed(f"scanning took longer than --load-timeout ({self._timeout:g} s)") from None
        except BaseException:
            self._discard(worker)
            raise
        self._idle.append(worker)
        return result

    def _new_worker(self) -> _Worker:
        worker = _Worker(self._memory, self._max_result)
        self._all.append(worker)
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.stop(kill=True)
        self._all.remove(worker)

    async def _drive(self, worker: _Worker, fmt: str, url: str, size: int, job: dict) -> dict:
        await worker.send(("scan", fmt, url, size, job))
        raw, questions = None, 0
        while True:
            message = await worker.message(self._max_result + (1 << 20))
            kind = message[0] if isinstance(message, list) and message else None
            if kind == "read":
                start, end = int(message[1]), int(message[2])
                if not 0 <= start <= end or end - start > 64 << 20:
                    raise ScanFailed("the scanner asked for a malformed range")
                await worker.send(await self._read(url, start, end))
            elif kind == "exists" and isinstance(message[1], str) and questions < MAX_QUESTIONS:
                questions += 1
                answer = await self._exists(message[1]) if self._exists is not None else None
                await worker.send(orjson.dumps(answer))
            elif kind == "refs" and raw is None:
                raw = await trio.to_thread.run_sync(self._receive_raw, worker)
            elif kind == "done" and isinstance(message[1], dict):
                if raw is not None:
                    message[1]["refs"] = raw
                return message[1]
            elif kind == "error":
                raise ScanFailed(str(message[1]))
            else:
                raise ScanFailed("the scanner sent an unknown message")

    def _receive_raw(self, worker: _Worker) -> bytes:
        """The references as JSON bytes, bounded as every message is (in a thread: they may be large)."""
        try:
            return worker.conn.recv_bytes(self._max_result + 1)
        except (EOFError, ConnectionError):
            raise worker.death() from None
        except OSError:
            raise ScanFailed("the scanner sent more than --max-refs-size") from None

    def close(self) -> None:
        for worker in self._all:
            worker.stop()
        self._all.clear()
        self._idle.clear()


def default_workers() -> int:
    """Scanners mostly wait for bytes over a WAN (a round trip per header read that misses): more of
    them than cores."""
    return max(4, min(16, 8 * (os.cpu_count() or 2)))
