"""GRIB2 files of a NOAA-like product and their wgrib2-style `.idx` (NOAA's exact row format:
`N:offset:d=YYYYMMDDHH:VAR:level:step:`), written with eccodes' Python bindings. One message per field,
simple packing, a regular lat/lon grid big enough that its messages are referenced, not inlined."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

# (idx variable, idx level, discipline, category, number, type of first fixed surface, its value)
FIELDS = [
    ("PRMSL", "mean sea level", 0, 3, 1, 101, 0),
    ("TMP", "500 mb", 0, 0, 0, 100, 500),
    ("TMP", "850 mb", 0, 0, 0, 100, 850),
    ("TMP", "2 m above ground", 0, 0, 0, 103, 2),
    ("UGRD", "10 m above ground", 0, 2, 2, 103, 10),
    ("VGRD", "10 m above ground", 0, 2, 3, 103, 10),
]


def grib2(run: dt.datetime, step: int, seed: int = 0, ni: int = 48, nj: int = 25,
          lambert: bool = False) -> tuple[bytes, str]:
    """(the GRIB2 file's bytes, its .idx text) of one forecast hour `step` of the run at `run`.
    `lambert`: on HRRR's Lambert conformal projection (3 km, its corner and standard parallels), whose
    latitudes and longitudes kerchunk references in the messages rather than inline."""
    import eccodes

    rng = np.random.default_rng(seed)
    out, rows = b"", []
    for n, (var, level_name, discipline, category, number, surface, level) in enumerate(FIELDS, 1):
        h = eccodes.codes_grib_new_from_samples("GRIB2")
        try:
            for key, value in [
                    ("discipline", discipline), ("centre", 7), ("dataDate", int(run.strftime("%Y%m%d"))),
                    ("dataTime", run.hour * 100), ("Ni", ni), ("Nj", nj),
                    ("latitudeOfFirstGridPointInDegrees", 50.0), ("latitudeOfLastGridPointInDegrees", 50.0 - (nj - 1) * 0.5),
                    ("longitudeOfFirstGridPointInDegrees", 230.0),
                    ("longitudeOfLastGridPointInDegrees", 230.0 + (ni - 1) * 0.5),
                    ("iDirectionIncrementInDegrees", 0.5), ("jDirectionIncrementInDegrees", 0.5),
                    ("parameterCategory", category), ("parameterNumber", number),
                    ("typeOfFirstFixedSurface", surface), ("forecastTime", step),
                    ("packingType", "grid_simple"), ("bitsPerValue", 16)]:
                eccodes.codes_set(h, key, value)
            if lambert:
                eccodes.codes_set(h, "gridType", "lambert")
                for key, value in [("Nx", ni), ("Ny", nj), ("latitudeOfFirstGridPointInDegrees", 21.138),
                                   ("longitudeOfFirstGridPointInDegrees", 237.28), ("LaDInDegrees", 38.5),
                                   ("LoVInDegrees", 262.5), ("Latin1InDegrees", 38.5), ("Latin2InDegrees", 38.5),
                                   ("DxInMetres", 3000), ("DyInMetres", 3000)]:
                    eccodes.codes_set(h, key, value)
            if surface == 100:  # isobaric: in Pa
                eccodes.codes_set(h, "scaleFactorOfFirstFixedSurface", 0)
                eccodes.codes_set(h, "scaledValueOfFirstFixedSurface", level * 100)
            elif surface == 103:
                eccodes.codes_set(h, "scaleFactorOfFirstFixedSurface", 0)
                eccodes.codes_set(h, "scaledValueOfFirstFixedSurface", level)
            eccodes.codes_set_values(h, rng.random(ni * nj) * 50 + 250 + 10 * n + step)
            message = eccodes.codes_get_message(h)
        finally:
            eccodes.codes_release(h)
        when = "anl" if step == 0 else f"{step} hour fcst"
        rows.append(f"{n}:{len(out)}:d={run:%Y%m%d%H}:{var}:{level_name}:{when}:")
        out += message
    return out, "\n".join(rows) + "\n"


def write(directory: Path, name: str, run: dt.datetime, step: int, seed: int = 0, **grid) -> Path:
    """`directory/name` and `directory/name.idx` (`grid`: ni, nj as for grib2)."""
    data, idx = grib2(run, step, seed, **grid)
    path = Path(directory) / name
    path.write_bytes(data)
    Path(str(path) + ".idx").write_text(idx)
    return path


def another_cycle(src: Path, dst: Path, hours: int) -> Path:
    """`dst` (and `dst.idx`): the GRIB2 file `src` (with its `.idx`) as the run `hours` later would have
    written it: each message's reference time (and a statistic's end of interval) moved, its data
    section untouched, the idx rows' dates and offsets to match."""
    import re

    import eccodes

    out, offsets, run = bytearray(), [], None
    with open(src, "rb") as f:
        while (h := eccodes.codes_grib_new_from_file(f)) is not None:
            try:
                when = f"{eccodes.codes_get(h, 'dataDate')}{eccodes.codes_get(h, 'dataTime'):04d}"
                run = dt.datetime.strptime(when, "%Y%m%d%H%M") + dt.timedelta(hours=hours)
                eccodes.codes_set(h, "dataDate", int(run.strftime("%Y%m%d")))
                eccodes.codes_set(h, "dataTime", int(run.strftime("%H%M")))
                if eccodes.codes_is_defined(h, "yearOfEndOfOverallTimeInterval"):
                    parts = ("year", "month", "day", "hour", "minute", "second")
                    end = dt.datetime(*(eccodes.codes_get(h, f"{p}OfEndOfOverallTimeInterval") for p in parts))
                    end += dt.timedelta(hours=hours)
                    for p in parts:
                        eccodes.codes_set(h, f"{p}OfEndOfOverallTimeInterval", getattr(end, p))
                offsets.append(len(out))
                out += eccodes.codes_get_message(h)
            finally:
                eccodes.codes_release(h)
    dst.write_bytes(bytes(out))
    rows = Path(str(src) + ".idx").read_text().splitlines()
    Path(str(dst) + ".idx").write_text("".join(
        re.sub(r"^(\d+):\d+:d=\d+:", f"\\g<1>:{offset}:d={run:%Y%m%d%H}:", row) + "\n"
        for row, offset in zip(rows, offsets)))
    return dst


def write_idx(path: Path) -> Path:
    """`path.idx` for a GRIB2 file that has none: one wgrib2-style row per message (offset, run date,
    short name, level, step) read with eccodes."""
    import eccodes

    rows = []
    with open(path, "rb") as f:
        while (h := eccodes.codes_grib_new_from_file(f)) is not None:
            try:
                get = lambda key: eccodes.codes_get(h, key)  # noqa: E731
                run = f"{get('dataDate')}{get('dataTime') // 100:02d}"
                level = f"{get('level')} {get('typeOfLevel')}"  # (offset: MARS pads messages to 120 bytes)
                rows.append(f"{len(rows) + 1}:{int(get('offset'))}:d={run}:{get('shortName').upper()}:{level}:"
                            f"{get('stepRange')} fcst:")
            finally:
                eccodes.codes_release(h)
    idx = Path(str(path) + ".idx")
    idx.write_text("".join(row + "\n" for row in rows))
    return idx
