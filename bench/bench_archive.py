"""Archive benchmark (issue 34): mounting N daily netCDF-4 files straight from an HTTP autoindex with
`--concat time`, against kerchunk + fsspec scanning the same files with 1 and 8 threads.

    sudo bench/bench_archive.py [--files 56] [--rtt 80] [--link nfqueue|proxy|none] [--grid 181x360] [--requests]

Files: hourly `tas` on a lat/lon grid, one a day, each with its own time units (tests/support/daily.py;
about 2 MB each at 181 x 360). Served by nginx (autoindex) inside a network namespace behind bench/harness's
kernel-TCP delay line (--link nfqueue: RTT/2 per direction, 1 Gbit/s), behind bench/delayproxy.py in the
namespace (--link proxy: the same RTT, a 4 MiB window per connection; needs no iptables), or on loopback
(--link none).
Measured, in one run:

- refmount cold: `refmount mount --concat time URL/*.nc MNT` (empty scan store) + `ncdump -h`, wall time;
- refmount warm: the same again (the scan store only revalidated: the files' dates and sizes on the index
  page; they are made more than a day old, as an archive's are, see refs/scan/sources.py SETTLED);
- with --requests (--link none), the server's requests of each refmount step by kind (index pages, HEADs,
  header GETs, DMR++ files, other ranges: --concat's coordinates), from nginx's access log;
- with --lazy, also without --concat, cold and warm: the mount (the files listed, none read) and
  `ncdump -h` of one file (that file scanned, or revalidated, at its first lookup);
- kerchunk x1 / x8: SingleHdf5ToZarr over fsspec's HTTP filesystem for every file, 1 or 8 threads
  (scanning only: kerchunk's combine over HTTP fails with fsspec 2026.9, see NOTES.md §6);
- the daemon's peak RSS (VmHWM) and its scanners' (each), against the memory target.

With --grib N (issue 40): N GRIB2 files of one product (successive 6-hourly cycles of one forecast hour,
tests/support/gribfiles.py, --grid points each) with their wgrib2-style `.idx`, mounted with `--concat
time` cold and warm (the first file scanned, the others from their .idx), beside kerchunk's scan_grib of
every file over fsspec's HTTP (8 threads) and kerchunk's idx path (build_idx_grib_mapping on the first
file, then parse_grib_idx + map_from_index for each).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from harness.links import Link, NfqLink, build_nfqdelay, connect_ms, delay_proxy, need_nfqueue, nfq_line
from harness.mounts import refmount, remove_scratch, unmount_if_mounted
from harness.peers import kerchunk_grib, kerchunk_scan
from harness.record import Record
from harness.servers import nginx_in, nginx_serving
from harness.system import ensure_installed, exit_on_signals, log

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # (tests/support's file makers)

def mount_and_dump(url: str, mnt: Path, env: dict, lazy: bool = False, expect: str = "tas(time, lat, lon)",
                   cpu: dict | None = None) -> tuple[float, float, str]:
    """(seconds to mount, seconds to mount + ncdump -h, the daemon's VmHWM line). `lazy`: mounted
    without --concat (each file scanned at its first lookup), and ncdump -h of the first file only.
    `cpu`: filled with the CPU seconds of the CLI (to its exit) and of the daemon (after ncdump -h):
    on a loaded machine the robust figure."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = refmount("mount", *(() if lazy else ("--concat", "time")), url, str(mnt), env=env)
    mounted = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu["cli"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode != 0:
        raise RuntimeError(f"mount failed: {done.stderr.strip()}")
    try:
        dataset = mnt / sorted(os.listdir(mnt))[0] if lazy else mnt
        header = subprocess.run(["ncdump", "-h", f"file://{dataset}#mode=zarr,file"], capture_output=True, text=True)
        total = time.monotonic() - t0
        if header.returncode != 0 or expect not in header.stdout:
            raise RuntimeError(f"ncdump -h failed: {header.stderr.strip()} {header.stdout[:300]}")
        if cpu is not None:
            fields = Path(f"/proc/{int(os.getxattr(mnt, 'user.refmount.pid'))}/stat").read_text().rsplit(")", 1)[1]
            cpu["daemon"] = sum(map(int, fields.split()[11:13])) / os.sysconf("SC_CLK_TCK")
        hwm = ""
        for line in subprocess.run(["pgrep", "-f", f"refmount mount .*{mnt}"], capture_output=True,
                                   text=True).stdout.split():
            try:
                hwm = next(x for x in Path(f"/proc/{line}/status").read_text().splitlines() if x.startswith("VmHWM"))
            except (OSError, StopIteration):
                pass
    finally:
        if refmount("umount", str(mnt), env=env).returncode != 0:
            unmount_if_mounted(mnt)
    return mounted, total, hwm


def request_kinds(lines: list[str]) -> dict:
    """Requests of an nginx access log ("METHOD URI RANGE STATUS" a line) by kind: index pages, HEADs,
    header GETs (a range from byte 0), DMR++ files, GRIB .idx files, other ranges (coordinates: --concat reads each file's
    time values) and whole-file GETs."""
    kinds = dict.fromkeys(("index", "HEAD", "header GET", "DMR++", ".idx GET", "range GET", "whole GET"), 0)
    for line in lines:
        method, uri, *rest = line.split()
        range_ = rest[0] if len(rest) > 1 else "-"
        if method == "HEAD":
            kinds["HEAD"] += 1
        elif uri.endswith("/"):
            kinds["index"] += 1
        elif uri.endswith(".dmrpp"):
            kinds["DMR++"] += 1
        elif uri.endswith(".idx"):
            kinds[".idx GET"] += 1
        elif range_.startswith("bytes=0-"):
            kinds["header GET"] += 1
        elif range_.startswith("bytes="):
            kinds["range GET"] += 1
        else:
            kinds["whole GET"] += 1
    return kinds


def counted(access_log: Path | None, step):
    """step()'s result and the requests it made (by kind), when the server logs them."""
    before = access_log.read_text().splitlines() if access_log and access_log.exists() else []
    result = step()
    if access_log is None:
        return result, None
    time.sleep(0.2)  # (nginx writes its log line after the answer)
    lines = access_log.read_text().splitlines()[len(before):]
    if os.environ.get("BENCH_KEEP_LOG"):
        Path(os.environ["BENCH_KEEP_LOG"] + f".{len(before)}").write_text("\n".join(lines))
    return result, request_kinds(lines)


def make_grib(directory: Path, n: int, nlat: int, nlon: int) -> list[Path]:
    """n successive 6-hourly cycles of forecast hour 6, named gfs.YYYYMMDDHH.pgrb2.f006, with their .idx."""
    import datetime as dt

    from tests.support.gribfiles import write

    directory.mkdir(parents=True)
    start = dt.datetime(2023, 1, 1)
    runs = [start + dt.timedelta(hours=6 * k) for k in range(n)]
    return [write(directory, f"gfs.{run:%Y%m%d%H}.pgrb2.f006", run, 6, seed=k, ni=nlon, nj=nlat)
            for k, run in enumerate(runs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=56)
    parser.add_argument("--rtt", type=float, default=80)
    parser.add_argument("--link", choices=("nfqueue", "proxy", "none"), default="nfqueue",
                        help="nfqueue: kernel TCP through bench/nfqdelay (needs iptables-legacy, "
                             "libnetfilter-queue-dev); proxy: bench/delayproxy.py in a namespace (needs nothing)")
    parser.add_argument("--grid", default="181x360")
    parser.add_argument("--no-kerchunk", action="store_true", help="skip the kerchunk contenders")
    parser.add_argument("--requests", action="store_true",
                        help="count the server's requests by kind for each refmount step (--link none only)")
    parser.add_argument("--grib", type=int, metavar="N", default=0,
                        help="instead: N GRIB2 files with .idx (issue 40; --grid as their grid)")
    parser.add_argument("--lazy", action="store_true",
                        help="also mount without --concat (lazy: each file scanned at its first lookup), cold "
                             "and warm, and ncdump -h one file")
    parser.add_argument("--warm", type=int, default=1, metavar="N",
                        help="warm mounts after the cold one (each row then the median; CPU seconds said per run)")
    parser.add_argument("--quick", action="store_true", help="8 files of 91 x 180 (as --files 8 --grid 91x180)")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "archive.json", help="the run's JSON")
    args = parser.parse_args()
    if args.quick:
        args.files, args.grid = min(args.files, 8), "91x180"
    exit_on_signals()  # so that everything made is removed
    ensure_installed({"nginx": "nginx-light", "curl": "curl", "ncdump": "netcdf-bin", "fusermount3": "fuse3"})
    record = Record("archive", args.quick)
    nlat, nlon = map(int, args.grid.split("x"))
    from tests.support.daily import make_daily

    with ExitStack() as stack:
        run = Path(tempfile.mkdtemp(prefix="bench-archive-"))
        stack.callback(remove_scratch, run)  # unmounts run/mnt first, should a step have failed
        os.chmod(run, 0o755)  # (nginx's workers run as another user)
        data = run / "data"
        if args.grib:
            log(f"making {args.grib} GRIB2 files (+ .idx) of {nlat} x {nlon} ...")
            files = make_grib(data / "tas", args.grib, nlat, nlon)
            args.files = args.grib
        else:
            log(f"making {args.files} daily files of {nlat} x {nlon} ...")
            files = make_daily(data / "tas", args.files, nlat, nlon)
        settled = time.time() - 3 * 86400  # an archive's files are older than a day (sources.SETTLED): the
        for f in files:                     # listing's dates and sizes name their versions (and the .idx's)
            for made in (f, Path(f"{f}.idx")) if args.grib else (f,):
                os.utime(made, (settled, settled))
        (data / "big.bin").write_bytes(b"x" * 4096)  # (what bench_wan probes nginx with)
        log(f"{sum(f.stat().st_size for f in files) / args.files / 1e6:.1f} MB a file")
        if args.link == "nfqueue":
            need_nfqueue()
            link = NfqLink("A", os.getpid() % 250)
            stack.callback(link.down)
            link.up()
            binary = build_nfqdelay(run)
            base = stack.enter_context(nginx_in(link, data, run, proxied=False))
            stack.enter_context(nfq_line(link, run, binary, args.rtt))
            log(f"TCP connect through the line: {connect_ms(base):.0f} ms")
        elif args.link == "proxy":  # (no iptables here: the userspace delay line in the namespace)
            link = Link("A", os.getpid() % 250)
            stack.callback(link.down)
            link.up()
            base = stack.enter_context(nginx_in(link, data, run, proxied=True))
            stack.enter_context(delay_proxy(link, run, args.rtt, 4 << 20))
            log(f"TCP connect through the proxy: {connect_ms(base):.0f} ms")
        else:
            access_log = run / "access.log" if args.requests else None
            base = stack.enter_context(nginx_serving(data, run, access_log))
        url = base + ("tas/*.f006" if args.grib else "tas/*.nc")
        expect = {"expect": "t2m(time, step, latitude, longitude)"} if args.grib else {}
        urls = [base + "tas/" + f.name for f in files]
        env = dict(os.environ, XDG_CACHE_HOME=str(run / "xdg"), PYTHONPATH=str(ROOT))
        mnt = run / "mnt"
        mnt.mkdir()
        if args.link != "none":
            access_log = None
        rows, runs = {}, {}
        for state in ("cold", *["warm"] * args.warm):
            cpu: dict = {}
            (mounted, total, hwm), kinds = counted(access_log, lambda: mount_and_dump(url, mnt, env, **expect, cpu=cpu))
            for name, value in ((f"refmount {state} (mount)", mounted), (f"refmount {state} (mount + ncdump -h)", total),
                                (f"refmount {state} CPU (CLI)", cpu["cli"]), (f"refmount {state} CPU (daemon)", cpu["daemon"])):
                runs.setdefault(name, []).append(value)
            log(f"{state}: mount + ncdump -h {total:.2f} s, CPU CLI {cpu['cli']:.2f} s + daemon {cpu['daemon']:.2f} s "
                f"(load {os.getloadavg()[0]:.1f}); daemon {hwm}")
            if kinds is not None:
                log(f"{state} requests: {sum(kinds.values())}, {args.files} files: "
                    + ", ".join(f"{k} {v}" for k, v in kinds.items()))
        rows.update({name: statistics.median(values) for name, values in runs.items()})
        if args.lazy:
            env["XDG_CACHE_HOME"] = str(run / "xdg-lazy")  # (cold again: an empty scan store)
            for state in ("cold", "warm"):
                rows[f"lazy {state} (mount)"], rows[f"lazy {state} (mount + ncdump -h one)"], hwm = \
                    mount_and_dump(url, mnt, env, lazy=True, **expect)
                log(f"lazy {state} daemon {hwm}")
        if args.grib and not args.no_kerchunk:
            rows["kerchunk scan_grib, 8 threads"] = kerchunk_grib(urls, 8, idx=False)
            rows["kerchunk idx path, 8 threads"] = kerchunk_grib(urls, 8, idx=True, first=str(files[0]))
        elif not args.no_kerchunk:
            for threads in (1, 8):
                rows[f"kerchunk + fsspec scan, {threads} thread(s)"] = kerchunk_scan(urls, threads)
        print(f"{args.files} files, RTT {args.rtt:g} ms ({args.link}):")
        for name, seconds in rows.items():
            print(f"  {name:<40} {seconds:7.2f} s")
    lines = ["| step | seconds |", "|---|---|"] + [f"| {name} | {seconds:.2f} |" for name, seconds in rows.items()]
    record.write(args.out, {f"{args.files} files of {args.grid}, RTT {args.rtt:g} ms ({args.link})": "\n".join(lines)},
                 files=args.files, grid=args.grid, rtt_ms=args.rtt, link=args.link, grib=args.grib, steps_s=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
