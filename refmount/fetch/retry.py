"""The retry policy, as an immutable value (in the style of urllib3's Retry)."""

from __future__ import annotations

import random
from dataclasses import dataclass

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    read_timeout: float = 30.0  # total seconds one read may spend, retries included
    stall_timeout: float = 10.0  # seconds without a byte before a connection is abandoned
    connect_timeout: float = 10.0
    backoff_base: float = 0.05
    backoff_max: float = 2.0
    max_attempts: int = 20
    failure_memory: float = 5.0  # seconds a url that just gave up fails at once (the kernel retries reads)

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before attempt `attempt` (1-based count of failures so far):
        exponential with full jitter, or the server's Retry-After when it gave one."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.backoff_max * 4)
        cap = min(self.backoff_max, self.backoff_base * (2 ** (attempt - 1)))
        return random.uniform(cap / 2, cap)

    def retryable_status(self, status: int) -> bool:
        return status in RETRY_STATUSES
