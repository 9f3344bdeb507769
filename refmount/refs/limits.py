"""Bounds on the work and memory of loading a reference set, so that no input can exhaust the machine.

Defaults come from the memory available when refmount starts (measured on the loaders):
- a generated key costs up to ~330 bytes at its peak (gen of 2 million keys: 650 MB), a parsed JSON
  reference ~1.45 bytes per byte of JSON, and one huge JSON string ~3 times its size while parsed;
- so `--max-keys` defaults to half the available memory / 350 bytes and `--max-refs-size` to a sixth of
  it: the worst case of either stays within half of what was available.
"""

from __future__ import annotations

import contextlib
import resource
import signal
import threading

from refmount.errors import RefsError, format_size

BYTES_PER_KEY = 350
WORST_BYTES_PER_REFS_BYTE = 3
DEFAULT_LOAD_TIMEOUT = 300.0
MAX_REFUSED_LINES = 1000  # variables a source leaves out, one log line each; the rest are counted
_FALLBACK_AVAILABLE = 4 << 30  # when /proc/meminfo cannot tell (not Linux)


def available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _FALLBACK_AVAILABLE


def _round_down(n: int, unit: int) -> int:
    return max(unit, n // unit * unit)


def default_max_keys() -> int:
    return _round_down(available_memory() // 2 // BYTES_PER_KEY, 1_000_000)


def default_max_refs_size() -> int:
    return _round_down(available_memory() // 2 // WORST_BYTES_PER_REFS_BYTE, 256 << 20)


class LoadTimeout(RefsError):
    pass


class RefsTooBig(RefsError):
    """More reference text than --max-refs-size; the loader names the file."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the reference set exceeds --max-refs-size {format_size(limit)} once decompressed")
        self.limit = limit


class ValueTooBig(RefsError):
    """One JSON member (a key and its value) holds more text than --max-value-size; the loader names
    the file, the option and, when it can, the key."""

    def __init__(self, limit: int, pos: int, key: str | None = None) -> None:
        super().__init__(f"a single JSON value near byte {pos} is larger than --max-value-size {format_size(limit)}")
        self.limit, self.pos, self.key = limit, pos, key


DEFAULT_MAX_VALUE_SIZE = 64 << 20  # an inline chunk or a metadata object; kerchunk inlines values of 500 bytes


MEMORY_SLACK = 256 << 20  # the interpreter, numpy and parser buffers, beyond what the limits account for


def memory_budget(max_keys: int | None, max_refs_size: int | None) -> int | None:
    """What a load within the limits may allocate: the worst cost of the reference text plus that
    of the keys (None: unlimited)."""
    if max_keys is None or max_refs_size is None:
        return None
    return WORST_BYTES_PER_REFS_BYTE * max_refs_size + BYTES_PER_KEY * max_keys + MEMORY_SLACK


def _data_in_use() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@contextlib.contextmanager
def memory_limit(budget: int | None):
    """A net under every other check: allocations past `budget` more than the process has now fail
    with MemoryError at once (RLIMIT_DATA; forked workers inherit it), instead of the machine
    swapping. Restored afterwards, so that serving is not limited."""
    if budget is None or not hasattr(resource, "RLIMIT_DATA"):
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _data_in_use() + budget
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        yield  # already limited at least as tightly
        return
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


@contextlib.contextmanager
def deadline_held():
    """Hold the deadline's signal back while starting or stopping worker processes: interrupted
    half way, they would be left running with no one to stop them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})


@contextlib.contextmanager
def load_deadline(seconds: float | None):
    """Interrupt the load (RefsError) after `seconds`, wherever it is in Python code: parsing, a
    template render loop, waiting for worker processes. Work in C that could run long (huge powers,
    string repetition) is refused by the template sandbox before it starts. Only the main thread can
    take signals; elsewhere (library use from a thread) the load has no deadline."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum, frame):
        raise LoadTimeout(f"loading the reference set took longer than --load-timeout ({seconds:g} s)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
