"""A bounded LRU of computed values with single-flight: each missing key is computed by exactly one
task while the others wait for it (decoded chunks, Parquet record files)."""

from __future__ import annotations

from collections import OrderedDict

import trio


class SingleFlightLRU:
    def __init__(self, capacity: int, weigh=lambda value: 1, on_evict=None) -> None:
        self.capacity = capacity
        self._weigh = weigh
        self._on_evict = on_evict  # called with each value evicted (a buffer pool takes its memory back)
        self._values: OrderedDict = OrderedDict()
        self._weight = 0
        self._pending: dict = {}
        self.computed = 0

    def __len__(self) -> int:
        return len(self._values)

    @property
    def weight(self) -> int:
        return self._weight

    def peek(self, key):
        """The cached value (refreshing its recency) or None, without waiting or computing."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    async def get(self, key, compute):
        """The value for `key`, computing it with `await compute()` if no one has."""
        while True:
            value = self.peek(key)
            if value is not None:
                return value
            pending = self._pending.get(key)
            if pending is None:
                break
            await pending.wait()  # someone else is computing it; then look again
        done = self._pending[key] = trio.Event()
        try:
            value = await compute()
            self.computed += 1
            self._remember(key, value)
            return value
        finally:
            del self._pending[key]
            done.set()

    def resize(self, capacity: int) -> None:
        """A new capacity; the least recently used values go now if it is smaller."""
        self.capacity = capacity
        while self._weight > self.capacity and self._values:
            self._evict_oldest()

    def _remember(self, key, value) -> None:
        weight = self._weigh(value)
        if weight > self.capacity:
            return
        self._values[key] = value
        self._weight += weight
        while self._weight > self.capacity:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        _, old = self._values.popitem(last=False)
        self._weight -= self._weigh(old)
        if self._on_evict is not None:
            self._on_evict(old)
