"""The scanners' CPU on a cold `--concat` mount (issue 39: "1,000 files cold <= 30 s"), paired with another
tree's code:

    bench/bench_scan_cpu.py [--files 200] [--grid 181x360] [--runs 3] [--baseline TREE]

N daily netCDF-4 files (tests/support/daily.py, 0.3 MB each at 181 x 360) served by a loopback nginx
(autoindex); each run a cold `refmount mount --concat time URL/*.nc` (an empty scan store) and `ncdump -h`
of the mount, then the CPU seconds of the daemon and of everything below it (the fork server and the
scanners it forked: their children's times once they are reaped, with the live ones' own), before the
unmount. With --baseline, runs of TREE's code alternate with this checkout's (`git archive main | tar -x
-C TREE` makes one). The scanners' CPU per file is the figure: the machine's load moves the walls.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness.mounts import refmount, remove_scratch
from harness.servers import nginx_serving
from harness.system import TICKS, descendants, ensure_installed, exit_on_signals, log

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # (tests/support's file makers)


def _times(pid: int) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) of a process, in seconds (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS, (int(fields[13]) + int(fields[14])) / TICKS


def cold_mount(url: str, run: Path, code: Path) -> dict:
    """One cold mount + ncdump -h with `code`'s refmount: wall, the daemon's scan seconds and CPU."""
    mnt, log_file = run / "mnt", run / "daemon.log"
    mnt.mkdir()
    env = dict(os.environ, XDG_CACHE_HOME=str(run / "xdg"), PYTHONPATH=str(code))
    t0 = time.monotonic()
    done = refmount("mount", "--log-file", str(log_file), "--concat", "time", url, str(mnt), env=env)
    if done.returncode != 0:
        raise RuntimeError(f"mount failed: {done.stderr.strip()}")
    try:
        header = subprocess.run(["ncdump", "-h", f"file://{mnt}#mode=zarr,file"], capture_output=True, text=True)
        wall = time.monotonic() - t0
        if "tas(time, lat, lon)" not in header.stdout:
            raise RuntimeError(f"ncdump -h failed: {header.stderr.strip()}")
        daemon = int(os.getxattr(mnt, "user.refmount.pid"))
        below = descendants(daemon)
        own, children = _times(daemon)
        scanners = children + sum(sum(_times(pid)) for pid in below)
    finally:
        refmount("umount", str(mnt), env=env)
    scanned = re.search(r"scanned (\d+) file\(s\) of .* in ([\d.]+) s", log_file.read_text())
    return dict(wall=wall, scan=float(scanned.group(2)) if scanned else float("nan"), daemon=own,
                scanners=scanners, load=os.getloadavg()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--grid", default="181x360")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="TREE", help="a checkout whose code alternates with ours")
    args = parser.parse_args()
    exit_on_signals()
    ensure_installed({"nginx": "nginx-light", "ncdump": "netcdf-bin", "fusermount3": "fuse3"})
    from tests.support.daily import make_daily

    trees = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
    rows: dict[str, list[dict]] = {name: [] for name in trees}
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="bench-scancpu-"))
        stack.callback(remove_scratch, work)
        os.chmod(work, 0o755)  # (nginx's workers run as another user)
        nlat, nlon = map(int, args.grid.split("x"))
        log(f"making {args.files} daily files of {nlat} x {nlon} ...")
        settled = time.time() - 3 * 86400  # (an archive's files: older than a day, see bench_archive.py)
        for path in make_daily(work / "data" / "tas", args.files, nlat, nlon):
            os.utime(path, (settled, settled))
        base = stack.enter_context(nginx_serving(work / "data", work))
        for index in range(args.runs):
            order = list(trees) if index % 2 == 0 else list(trees)[::-1]
            for name in order:
                run = Path(tempfile.mkdtemp(prefix="run-", dir=work))
                row = cold_mount(base + "tas/*.nc", run, trees[name])
                rows[name].append(row)
                log(f"{name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()))
                remove_scratch(run)
    print(f"{args.files} files of {args.grid}, cold --concat mount + ncdump -h, medians of {args.runs}:")
    for name, found in rows.items():
        median = {k: statistics.median(r[k] for r in found) for k in found[0]}
        print(f"  {name:<9} scanners {median['scanners']:6.2f} CPU-s ({median['scanners'] / args.files * 1000:5.1f} ms a "
              f"file), daemon {median['daemon']:5.2f} CPU-s, scan {median['scan']:6.2f} s, wall {median['wall']:6.2f} s, "
              f"load {median['load']:.1f}")


if __name__ == "__main__":
    main()
