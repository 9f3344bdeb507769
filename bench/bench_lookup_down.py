"""How long the first lookup of a lazily mounted file takes to fail when its server is down, paired with
another tree's code:

    bench/bench_lookup_down.py [--runs 3] [--baseline TREE] [--out FILE.json]

Three daily netCDF-4 files (tests/support/daily.py) on tests/support's RangeServer, mounted lazily as
@FILE of their urls (`refmount mount --foreground`); the first file's directory is looked up (scanned),
the server stopped, and `os.listdir` of the second file's directory timed until it fails (EIO): a closed
loopback port, so the retries and their backoff are all there is to measure. With --baseline, runs of
TREE's code alternate with this checkout's (`git archive main | tar -x -C TREE` makes one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.mounts import refmount_foreground
from harness.servers import range_server
from harness.system import exit_on_signals

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # (tests/support's file makers)


def seconds_to_fail(tree: Path, files: list[Path], scratch: Path, run: int) -> float:
    server = range_server(files[0].parent).start()
    try:
        listing = scratch / f"list-{run}.txt"
        listing.write_text("".join(server.url_for(path.name) + "\n" for path in files))
        with refmount_foreground(f"@{listing}", scratch / f"mnt-{run}", [], code=tree) as m:
            os.listdir(m.path / files[0].name)
            server.stop()
            started = time.monotonic()
            try:
                os.listdir(m.path / files[1].name)
            except OSError:
                return time.monotonic() - started
            raise AssertionError("a file on a stopped server was scanned")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="TREE", help="a checkout whose code alternates with ours")
    parser.add_argument("--out", type=Path, help="the figures as JSON")
    args = parser.parse_args()
    exit_on_signals()
    from tests.support.daily import make_daily

    trees = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    times: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="bench-lookup-down-") as scratch:
        scratch = Path(scratch)
        os.environ["XDG_CACHE_HOME"] = str(scratch / "cache")  # (an empty scan store: the daemons inherit it)
        files = make_daily(scratch / "www", 3, nlat=6, nlon=8)
        for run in range(args.runs):
            for k, (name, tree) in enumerate(trees.items()):
                times[name].append(seconds_to_fail(tree, files, scratch, len(trees) * run + k))
                print(f"{name}: {times[name][-1]:.2f} s", flush=True)
    load = os.getloadavg()[0]
    figures = {name: {"median_s": round(statistics.median(t), 3), "runs_s": [round(x, 3) for x in t]}
               for name, t in times.items()}
    for name, figure in figures.items():
        print(f"{name}: median {figure['median_s']:.2f} s to fail ({', '.join(f'{x:.2f}' for x in figure['runs_s'])}); "
              f"load {load:.1f}")
    if args.out:
        args.out.write_text(json.dumps({"load": load, **figures}, indent=1))


if __name__ == "__main__":
    main()
