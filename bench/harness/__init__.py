"""The bench harness: what every benchmark under bench/ shares, so that no bench imports another.

- `system`: processes and timing, CPU and memory of a pid, page-cache drops, the machine's facts;
- `inputs`: generated input files (kept under a work dir, made once, atomically);
- `servers`: nginx (loopback or inside a namespace) and the aiohttp range server of tests/support;
- `links`: the emulated WAN (tc netem, kernel TCP through bench/nfqdelay.c, or bench/delayproxy.py);
- `mounts`: refmount mounts that are always unmounted (also on Ctrl-C or SIGTERM), scratch dirs;
- `peers`: what refmount is measured against: curl, fsspec, kerchunk, rclone mount;
- `record`: the JSON every bench writes (command, date, machine, load) for bench/report.py.

A bench script runs as `python bench/NAME.py`, so `bench/` is first on sys.path and `import harness`
finds this package.
"""

from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent  # bench/
ROOT = BENCH.parent  # the checkout whose refmount the benches measure
