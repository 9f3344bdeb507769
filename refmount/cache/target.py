"""One memory target for the whole daemon (--memory-target), and what each part of it may hold.

The target is the daemon's resident memory (RSS), everything counted: Python and its libraries, the
reference set's tables, cached blocks with the fetches in flight and read-ahead, decoded chunks,
decoders' working memory, and what glibc keeps. At mount, the daemon measures what it holds before
serving (the runtime: interpreter, libraries, tables); the rest is split so:

    target = runtime + blocks + decoded + scratch + reserve

- blocks: --cache-size, the block cache's budget (cached, in flight, read ahead: cache/budget.py);
- decoded: --decoded-cache-size, decoded chunks (decoded view only);
- scratch: decoders' working memory, shared by the decodes running at once (cache/budget.py);
- reserve: what is not counted byte by byte and grows while serving (Python objects of requests
  under way, a FUSE reply being assembled, an HTTP body being joined, thread stacks, free memory
  between glibc's pages).
Either cache size may be given: the other takes the rest. With neither target nor sizes, the target
is DEFAULT_TARGET; with cache sizes but no target, the target is what they add up to. While serving,
the governor (cache/governor.py) holds the process to the target.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from refmount.errors import RefmountError

MiB = 1 << 20
DEFAULT_TARGET = 1 << 30
MIN_CACHE = 4 * MiB  # the least a cache gets (a few blocks or chunks)
# Libraries imported after the plan is made (aiohttp and its kin for http targets: 11 MiB measured)
LATER_IMPORTS = {"http": 10 * MiB, "other": 32 * MiB}  # fsspec backends: s3fs and botocore are big


@dataclass(frozen=True)
class MemoryPlan:
    target: int  # the whole process, bytes of RSS
    runtime: int  # measured before serving (plus libraries still to come)
    blocks: int
    decoded: int
    scratch: int
    reserve: int
    derived: bool  # the target follows from explicit cache sizes

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        parts = [f"block cache {_mib(self.blocks)}"]
        if self.decoded:
            parts.append(f"decoded chunks {_mib(self.decoded)}")
        if self.scratch:
            parts.append(f"decoding {_mib(self.scratch)}")
        parts += [f"the daemon itself {_mib(self.runtime)}", f"reserve {_mib(self.reserve)}"]
        how = "from the cache sizes" if self.derived else "--memory-target"
        return f"memory target {_mib(self.target)} ({how}): " + ", ".join(parts)


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB"


def scratch_for(target: int, decoded_view: bool) -> int:
    """Decoders' working memory: a sixteenth of the target, from 4 to 64 MiB (a decode of a 1 MiB
    chunk needs about 2.5 MiB; more decodes at once than cores do not help)."""
    return min(max(target // 16, 4 * MiB), 64 * MiB) if decoded_view else 0


def reserve_for(target: int) -> int:
    """An eighth of the target, from 48 to 64 MiB. Under 32 random readers of the decoded view
    (bench/bench_memory.py) the daemon's own memory grew 35-55 MiB over what it held at mount:
    Python objects of the requests under way (pyfuse3's workers each keep a 1 MiB request buffer),
    decoders' intermediate buffers, free memory between glibc's pages."""
    return min(max(target // 8, 48 * MiB), 64 * MiB)


def plan_memory(target: int | None, cache_size: int | None, decoded_cache_size: int | None,
                decoded_view: bool, runtime: int) -> MemoryPlan:
    """Split the target (see above); RefmountError naming the option when it cannot hold the parts."""
    given_target = target is not None
    if not decoded_view:
        decoded_cache_size = 0
    if target is None and (cache_size is not None or decoded_cache_size):
        blocks = cache_size if cache_size is not None else 512 * MiB
        decoded = decoded_cache_size if decoded_cache_size is not None else (256 * MiB if decoded_view else 0)
        scratch = scratch_for(blocks + decoded, decoded_view)
        reserve = reserve_for(runtime + blocks + decoded + scratch)
        return MemoryPlan(runtime + blocks + decoded + scratch + reserve, runtime, blocks, decoded, scratch,
                          reserve, derived=True)
    target = DEFAULT_TARGET if target is None else target
    scratch = scratch_for(target, decoded_view)
    reserve = reserve_for(target)
    room = target - runtime - scratch - reserve
    needed = (MIN_CACHE * (2 if decoded_view else 1) if cache_size is None and decoded_cache_size is None
              else (cache_size or MIN_CACHE) + (decoded_cache_size or (MIN_CACHE if decoded_view else 0)))
    if room < needed:
        name = "--memory-target" if given_target else "the default memory target"
        least = -(-(target - room + needed) // MiB)
        while least * MiB - runtime - scratch_for(least * MiB, decoded_view) - reserve_for(least * MiB) < needed:
            least += 1  # (scratch and reserve grow with the target)
        raise RefmountError(
            f"{name} {_mib(target)} is too small: the daemon itself takes {_mib(runtime)} (Python, its libraries "
            f"and this reference set), decoding {_mib(scratch)} and a reserve {_mib(reserve)}, and the caches "
            f"need {_mib(needed)}: give --memory-target {least}M or more")
    if cache_size is not None and decoded_cache_size is not None:
        blocks, decoded = cache_size, decoded_cache_size
    elif cache_size is not None:
        blocks, decoded = cache_size, room - cache_size if decoded_view else 0
    elif decoded_cache_size is not None and decoded_view:
        blocks, decoded = room - decoded_cache_size, decoded_cache_size
    elif decoded_view:  # two thirds for blocks (compressed, and every other key), a third decoded
        blocks = room * 2 // 3
        blocks, decoded = blocks, room - blocks
    else:
        blocks, decoded = room, 0
    return MemoryPlan(target, runtime, blocks, decoded, scratch, reserve, derived=False)


def later_imports(urls) -> int:
    """Memory the remote backends of `urls` will add once imported (they load while the mount comes
    up, after the plan is made)."""
    import sys

    from refmount.fetch.protocols import protocol_of

    protocols = {protocol_of(url) for url in urls} - {"file"}
    extra = 0
    if protocols & {"http", "https"} and "aiohttp" not in sys.modules:
        extra += LATER_IMPORTS["http"]
    if protocols - {"http", "https"}:
        extra += LATER_IMPORTS["other"]
    return extra


def resident_bytes() -> int:
    """This process's RSS, from /proc/self/statm (0 where there is none)."""
    import os

    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
