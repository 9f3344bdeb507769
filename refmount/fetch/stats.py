"""Fetch counters and latency samples, plus the url redaction used by every log line."""

from __future__ import annotations

import re
from collections import deque

_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|signature|sig|"
                           r"token|access_token|key|api_key|apikey|password|code)=)[^&#\s]+")


def redact(url: str) -> str:
    """The url with credentials (user:password@, signed-query secrets) replaced by '***'."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub("***@", url))


class FetchStats:
    """Counters shared by all backends (only touched from their own event loop threads)."""

    def __init__(self, samples: int = 2048) -> None:
        self.requests = 0
        self.bytes = 0
        self.retries = 0
        self.errors = 0
        self._latencies: deque[float] = deque(maxlen=samples)

    def record(self, nbytes: int, seconds: float) -> None:
        self.bytes += nbytes
        self._latencies.append(seconds)

    def percentiles(self) -> dict[str, float]:
        samples = sorted(self._latencies)
        if not samples:
            return {}
        pick = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))] * 1000  # noqa: E731
        return {"p50_ms": round(pick(0.5), 3), "p90_ms": round(pick(0.9), 3), "p99_ms": round(pick(0.99), 3)}

    def as_dict(self) -> dict:
        return {"requests": self.requests, "bytes": self.bytes, "retries": self.retries, "errors": self.errors,
                "latency": self.percentiles()}
