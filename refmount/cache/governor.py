"""Holding the daemon to its memory target while it serves (see cache/target.py for the plan).

The plan counts what it can (cached blocks, fetches in flight, read-ahead, decoded chunks,
decoders' scratch); the rest (libraries loaded later, a backend's own buffers, Parquet record
files, glibc's free pages) is only seen in the process's RSS. Four times a second the governor
reads it and, as it nears the target:
- over the last 24 MiB before the target, read-ahead backs off in proportion
  (`MemoryBudget.pressure`): prefetched blocks are the first bytes the daemon can do without; and
  once a second the buffer pool unmaps its free slots and glibc gives back the free memory it
  holds (malloc_trim);
- past the target less 8 MiB the caches shrink by the excess (least recently used first);
- once well below again, the caches grow back to their planned sizes.

Runs on the trio thread.
"""

from __future__ import annotations

import trio

from refmount.cache.malloc import give_back_freed_memory
from refmount.cache.target import MemoryPlan, resident_bytes

INTERVAL = 0.25  # seconds between looks
BACK_OFF = 24 << 20  # read-ahead backs off over the last this many bytes before the target
# and this far below it the caches shrink: what the governor sees 4 times a second is the RSS between
# spikes, which went 4-9 MiB higher (VmHWM against the samples, bench/bench_memory.py)
ACT = 8 << 20
_TRIM_EVERY = 1.0  # seconds at least between two malloc_trim calls (each walks the heaps)


class MemoryGovernor:
    def __init__(self, plan: MemoryPlan, budget, caches: list, pool=None) -> None:
        """`caches`: (planned size, resize(bytes)) of each cache the governor may shrink; `pool`: the
        caches' buffer pool, whose free slots go first."""
        self.plan = plan
        self.pool = pool
        self.budget = budget
        self.caches = [(size, resize) for size, resize in caches if size > 0]
        self.squeezed = 0  # bytes the caches are below their planned sizes
        self.peak = 0
        self.trims = 0
        self.squeezes = 0
        self._trimmed_at = -_TRIM_EVERY

    async def run(self) -> None:
        while True:
            self.check(trio.current_time())
            await trio.sleep(INTERVAL)

    def check(self, now: float) -> None:
        plan = self.plan
        rss = resident_bytes()
        if not rss:
            return
        self.peak = max(self.peak, rss)
        high = plan.target - ACT
        low = plan.target - BACK_OFF
        if rss > low and now - self._trimmed_at >= _TRIM_EVERY:
            self._trimmed_at = now
            self.trims += 1
            if self.pool is not None:
                self.pool.trim()
            give_back_freed_memory()
            rss = resident_bytes() or rss
        # read-ahead: its full share up to BACK_OFF below the target, none from ACT below
        self.budget.pressure = min(max((rss - low) / max(high - low, 1), 0.0), 1.0)
        if rss > high:
            self._resize(self.squeezed + rss - high)
            self.squeezes += 1
        elif rss < low - ACT and self.squeezed:  # (well below: not back and forth across `low`)
            self._resize(max(self.squeezed - (low - ACT - rss) // 2, 0))

    def _resize(self, squeezed: int) -> None:
        """Shrink (or grow back) the caches to their planned sizes less `squeezed` bytes in all,
        shared in proportion to their sizes; each keeps at least an eighth of its planned size."""
        planned = sum(size for size, _ in self.caches)
        if not planned:
            return
        self.squeezed = min(squeezed, planned * 7 // 8)
        for size, resize in self.caches:
            resize(size - self.squeezed * size // planned)

    def statistics(self) -> dict:
        return {"target": self.plan.target, "rss": resident_bytes(), "rss_peak": max(self.peak, _vm_hwm()),
                "runtime": self.plan.runtime, "squeezed": self.squeezed, "trims": self.trims,
                "read_ahead_pressure": round(self.budget.pressure, 2)}


def _vm_hwm() -> int:
    """The kernel's record of this process's peak RSS (VmHWM), bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _register_metrics() -> None:
    """The daemon's memory against its target (fetch/registry.py)."""
    from refmount.fetch.registry import at, register

    register("refmount_memory_rss_bytes", "gauge", "Resident memory of the daemon.", collect=at("memory", "rss"),
             component="cache.governor")
    register("refmount_memory_target_bytes", "gauge", "The daemon's memory target.", collect=at("memory", "target"),
             component="cache.governor")
    register("refmount_memory_trims_total", "counter", "Times the caches were trimmed to keep to the target.",
             collect=at("memory", "trims"), component="cache.governor")


_register_metrics()
