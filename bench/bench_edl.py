"""Earthdata Login soak (issue 35): one mount reading through every way in for minutes, 0 failed reads.

    .venv/bin/python bench/bench_edl.py [--seconds 300] [--lifetime 30] [--http-client stdlib]

Starts the loopback scene of tests/support/edl.py: a login host (127.0.0.2, HTTP Basic from a netrc),
a data host behind it (127.0.0.3: session cookie; some urls redirect on to signed urls on 127.0.0.4),
a host taking EDL bearer tokens (127.0.0.6), a credentials endpoint behind the login, and moto's S3
behind a gate (127.0.0.5) that accepts only live session tokens. The temporary S3 credentials
expire after `--lifetime` seconds, so they are refreshed (at half-life) many times. One refmount
mount (raw view, a small block cache, no read-ahead) holds keys on all of them; a loop reads random
64 KiB ranges of every key through FUSE for `--seconds`, drops them from the page cache, and checks
each against the source bytes.

Prints: reads, failed reads (must be 0), wrong reads (must be 0), the credential refreshes and
logins from `refmount stats`, requests the S3 gate refused (must be 0), and whether any credential
header reached a host it does not belong to (from every server's log). The 30-45 s version of this
loop is tests/test_edl.py. Not part of the test suite. Needs FUSE; leaves nothing mounted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.mounts import refmount_foreground  # noqa: E402
from tests.support.edl import World, read_loop  # noqa: E402
from tests.support.moto import moto_server  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--lifetime", type=float, default=30, help="seconds the temporary S3 credentials last")
    parser.add_argument("--http-client", default="stdlib", choices=("stdlib", "aiohttp"))
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="bench-edl-")
    with moto_server() as moto_url:
        world = World(directory, moto_url=moto_url, object_size=8 << 20, credentials_lifetime=args.lifetime)
        refs = Path(directory, "refs.json")
        refs.write_text(json.dumps(world.refs()))
        options = [*world.mount_args(), "--cache-size", "4M", "--block-size", "64K", "--no-prefetch",
                   "--http-client", args.http_client]
        try:
            with refmount_foreground(refs, Path(directory, "mnt"), options, env=world.env(),
                                     log_path=Path(directory, "daemon.log"), timeout=30) as m:
                started = time.monotonic()
                counts = read_loop(str(m.path), world, seconds=args.seconds)
                took = time.monotonic() - started
                stats = m.stats()["logins"]
                try:
                    world.assert_credentials_stayed_home()
                    stayed = "yes"
                except AssertionError as e:
                    stayed = f"NO: {e}"
                print(f"{took:.0f} s, credentials lasting {args.lifetime:g} s, --http-client {args.http_client}")
                print(f"reads {counts['reads']}, failed {counts['failed']}, wrong {counts['wrong']}")
                print(f"S3 credential refreshes {stats['s3_credential_refreshes']}, failures {stats['s3_credential_failures']}")
                print(f"logins {stats['logins']}, login failures {stats['login_failures']}")
                print(f"S3 gate: passed {world.gate.passed}, refused {len(world.gate.refused)} {sorted(set(world.gate.refused))}")
                print(f"every credential stayed with its own host: {stayed}")
                for error in counts["errors"][:5]:
                    print("  ", error)
                ok = counts["failed"] == 0 and counts["wrong"] == 0 and not world.gate.refused and stayed == "yes"
                return 0 if ok else 1
        finally:
            world.close()


if __name__ == "__main__":
    sys.exit(main())
