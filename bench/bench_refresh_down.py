"""How long a --refresh's listing of an index page whose server is down takes to fail: under the refresh's
own retry policy (fuse/refresh.py REFRESH_POLICY) and under a mount's default one (RetryPolicy()), which a
refresh used before. A closed loopback port (connection refused at once: the retries and their backoff are
all there is to measure). Median of --runs runs each.

    python bench/bench_refresh_down.py [--runs 3]
"""

from __future__ import annotations

import argparse
import contextvars
import socket
import statistics
import time

from refmount.fetch.retry import RetryPolicy, retry_under
from refmount.fuse.refresh import REFRESH_POLICY
from refmount.refs.scan.archive import ArchiveOptions, listed_entries, with_trust


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def seconds_to_fail(policy: RetryPolicy) -> float:
    url = f"http://127.0.0.1:{closed_port()}/data/"

    def listing() -> float:
        retry_under(policy)
        started = time.monotonic()
        try:
            listed_entries(url, with_trust(ArchiveOptions(), url))
        except Exception:  # noqa: BLE001 - the failure is what is timed
            return time.monotonic() - started
        raise AssertionError("a closed port was listed")

    return contextvars.copy_context().run(listing)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for name, policy in (("refresh policy", REFRESH_POLICY), ("mount default", RetryPolicy())):
        times = [seconds_to_fail(policy) for _ in range(args.runs)]
        print(f"{name}: median {statistics.median(times):.2f} s to fail ({', '.join(f'{t:.2f}' for t in times)})")


if __name__ == "__main__":
    main()
