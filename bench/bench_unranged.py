"""How much a server that ignores Range sends for reads near the end of a big object (issue 25).

    .venv/bin/python bench/bench_unranged.py [--mib 512] [--order forward|backward|shuffled]
        [--refmount-options '...']

Serves a seeded random object from tests.support.rangeserver on 127.0.0.1 with `ignore_range` (every
ranged GET answered 200 with the whole body), mounts eight 4 KiB references near its end (--view
raw), reads them one after the other in the given order, checks every byte, and prints the bytes
the server sent, as passes over the object (issue 25 before the fix: 7.6-8 passes; the target is
at most 1.2). Needs root (FUSE); leaves nothing mounted.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from harness.mounts import refmount_foreground
from harness.servers import range_server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=512, help="object size in MiB (default 512)")
    p.add_argument("--order", choices=("forward", "backward", "shuffled"), default="forward")
    p.add_argument("--refmount-options", default="")
    args = p.parse_args()
    size = args.mib << 20
    with tempfile.TemporaryDirectory(prefix="refmount-unranged-") as tmp:
        tmp = Path(tmp)
        www = tmp / "www"
        www.mkdir()
        rng = random.Random(1)
        with open(www / "big.bin", "wb") as f:
            for _ in range(args.mib):
                f.write(rng.randbytes(1 << 20))
        data = (www / "big.bin").read_bytes()
        with range_server(www) as server:
            server.ignore_range = True
            url = server.url_for("big.bin")
            offsets = [size - (9 - n) * (1 << 20) + 123 for n in range(8)]
            (tmp / "refs.json").write_text(json.dumps({f"k{n}": [url, o, 4096] for n, o in enumerate(offsets)}))
            with refmount_foreground(tmp / "refs.json", tmp / "mnt", ["--view", "raw", *args.refmount_options.split()],
                                     log_path=tmp / "mount.log") as m:
                keys = list(range(8))
                if args.order == "backward":
                    keys.reverse()
                elif args.order == "shuffled":
                    random.Random(5).shuffle(keys)
                wrong = 0
                t0 = time.monotonic()
                for n in keys:
                    wrong += (m.path / f"k{n}").read_bytes() != data[offsets[n]:offsets[n] + 4096]
                seconds = time.monotonic() - t0
            sent = server.stats["bytes_sent"]
            print(f"{args.mib} MiB object, 8 reads of 4 KiB near its end ({args.order}) "
                  f"{args.refmount_options}".rstrip())
            print(f"  server sent {sent / 2**20:,.0f} MiB = {sent / size:.2f} passes in {server.stats['requests']} "
                  f"requests, {seconds:.1f} s; wrong reads {wrong}")
            return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
