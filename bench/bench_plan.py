"""The decoded view's plan of a kerchunk JSON of many netCDF-like arrays, in process (issues 39/40).

    python bench/bench_plan.py [--arrays 10000] [--runs 3] [--profile N]

Each run builds a fresh reference set of ARRAYS arrays (deflated float32/int16/char variables with
the attributes a netCDF file's kerchunk JSON carries: _FillValue 9.969209968386869e36, NaN, units,
long names, some non-ASCII) and times `DecodedView` over it: process CPU seconds and wall. --profile N:
print the N costliest functions of one more run (cProfile, cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def netcdf_like_refs(arrays: int) -> dict:
    refs = {".zgroup": json.dumps({"zarr_format": 2}),
            ".zattrs": json.dumps({"title": "Température de surface", "history": "made by bench_plan.py\nline 2",
                                   "Conventions": "CF-1.8", "version": 1.5e-05})}
    kinds = [("<f4", 9.969209968386869e36), ("<i2", -32767), ("<f8", float("nan")), ("|S1", "")]
    for n in range(arrays):
        dtype, fill = kinds[n % len(kinds)]
        zarray = {"chunks": [1, 90, 180], "compressor": {"id": "zlib", "level": 4}, "dtype": dtype,
                  "fill_value": "NaN" if dtype == "<f8" else (fill if dtype != "|S1" else None),
                  "filters": [{"elementsize": 4, "id": "shuffle"}], "order": "C", "shape": [12, 180, 360],
                  "zarr_format": 2}
        zattrs = {"_ARRAY_DIMENSIONS": ["time", "lat", "lon"], "units": "K", "long_name": f"variable n°{n}",
                  "valid_range": [-1e16, 1e16], "scale_factor": 0.01, "add_offset": 273.15}
        if dtype != "|S1":
            zattrs["_FillValue"] = fill
        refs[f"v{n}/.zarray"] = json.dumps(zarray)
        refs[f"v{n}/.zattrs"] = json.dumps(zattrs)
        refs[f"v{n}/0.0.0"] = ["file:///nonexistent/data.nc", 4096 + n * 1000, 1000]
    return refs


class _Raw:
    name = "raw"

    def __init__(self, refset) -> None:
        self.refset = refset


def plan_once(refs: dict) -> tuple[float, float]:
    from refmount.refs import refs_from_dict
    from refmount.view.decoded import DecodedView

    refset = refs_from_dict(refs)
    cpu, wall = time.process_time(), time.perf_counter()
    DecodedView(_Raw(refset), cache_size=0)
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    refs = netcdf_like_refs(args.arrays)
    plan_once(netcdf_like_refs(4))  # (imports)
    runs = [plan_once(refs) for _ in range(args.runs)]
    cpu = statistics.median(r[0] for r in runs)
    wall = statistics.median(r[1] for r in runs)
    print(f"{args.arrays:,} arrays: decoded view planned in CPU {cpu:.2f} s, wall {wall:.2f} s "
          f"(median of {args.runs}: {', '.join(f'{r[0]:.2f}' for r in runs)})")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(plan_once, refs)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
