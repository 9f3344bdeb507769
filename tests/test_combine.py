"""--concat DIM's combination (refmount.refs.combine): daily netCDF-4 and netCDF-3 files, each with its time
in "hours since <its day>", scanned by kerchunk, combined, and read back through fsspec's
ReferenceFileSystem with xarray must equal xarray.open_mfdataset of the files in values, decoded times
and attributes; mismatched variables are refused in one line naming the file and the variable, or taken
unchecked (--identical), or dropped (--skip-mismatched). A mount of the combined set answers `ncdump -v
time` as NCO's ncrcat of the same files does."""

from __future__ import annotations

import json
import logging
import random
import subprocess

import numpy as np
import pytest

from refmount.errors import RefsError
from refmount.refs import combine
from refmount.refs.combine import combine_datasets
from refmount.view.bounded import decode_bounded

DAYS = 6


def make_day(path, day: int, *, fmt="NETCDF4", calendar="standard", units="hours", lat_shift=0.0, extra=None,
             steps=24, contiguous=False):
    """One day of hourly `tas` on a small grid, its time in "<units> since <its day>"; time_bnds as CF bounds.
    `contiguous`: time a fixed dimension of `steps`, tas stored in one piece (kerchunk: one chunk)."""
    import netCDF4

    with netCDF4.Dataset(path, "w", format=fmt) as ds:
        ds.title = "daily test"
        ds.source = "refmount tests"
        ds.createDimension("time", steps if contiguous else None)
        ds.createDimension("lat", 5)
        ds.createDimension("lon", 4)
        ds.createDimension("nv", 2)
        time = ds.createVariable("time", "i4" if units == "hours" else "f8", ("time",))
        first = f"2020-01-{day + 1:02d}" if calendar != "360_day" else f"2020-02-{day + 1:02d}"
        time.units = f"{units} since {first}"
        time.calendar = calendar
        time.bounds = "time_bnds"
        step = 1 if units == "hours" else 1 / 32  # (exact in binary: decoded the same way either side)
        time[:] = np.arange(steps) * step
        bounds = ds.createVariable("time_bnds", time.dtype, ("time", "nv"))
        bounds[:] = np.stack([np.arange(steps), np.arange(steps) + 1], axis=1) * step
        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat[:] = np.linspace(-60, 60, 5) + lat_shift
        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon[:] = np.arange(4) * 90.0
        tas = ds.createVariable("tas", "f4", ("time", "lat", "lon"), zlib=fmt == "NETCDF4" and not contiguous,
                                fill_value=-999.0, contiguous=contiguous)
        tas.units = "K"
        tas.long_name = "air temperature"
        values = 250 + day * 24 + np.arange(steps * 20, dtype="f4").reshape(steps, 5, 4) * 0.1
        values[min(3, steps - 1), 1, 1] = -999.0  # a missing value
        tas[:] = values
        if extra:
            extra(ds)


def scan(path, fmt="NETCDF4", inline=0):
    if fmt == "NETCDF4":
        from kerchunk.hdf import SingleHdf5ToZarr

        return SingleHdf5ToZarr(str(path), inline_threshold=inline).translate()
    from kerchunk.netCDF3 import NetCDF3ToZarr

    return NetCDF3ToZarr(str(path), inline_threshold=inline).translate()


class LocalReader:
    """read(url, offset, length) over local files, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, url, offset, length):
        self.calls += 1
        with open(url, "rb") as f:
            f.seek(offset)
            return f.read() if length is None else f.read(length)


def daily_files(root, fmt="NETCDF4", days=DAYS, **kw):
    files = []
    for day in range(days):
        path = root / f"day{day}.nc"
        make_day(path, day, fmt=fmt, **kw)
        files.append(path)
    shuffled = files[:]
    random.Random(7).shuffle(shuffled)
    if shuffled[0] == files[0]:  # (the earliest file never first)
        shuffled.append(shuffled.pop(0))
    return files, shuffled


def open_refs(refs):
    import xarray as xr

    return xr.open_dataset("reference://", engine="zarr",
                           backend_kwargs={"consolidated": False, "storage_options": {"fo": refs}})


def assert_same_as_mfdataset(refs, files, **kw):
    import xarray as xr

    got = open_refs(refs).load()
    with xr.open_mfdataset([str(f) for f in files], combine="by_coords", **kw) as expected:
        expected = expected.load()
        xr.testing.assert_identical(got, expected)  # values, decoded times, attributes (global and per variable)
        assert got["time"].size == DAYS * 24
        assert np.all(np.diff(got["time"].values).astype("timedelta64[s]").astype(int) > 0)
    return got


@pytest.mark.parametrize("fmt", ["NETCDF4", "NETCDF3_64BIT_OFFSET"])
def test_daily_files_equal_open_mfdataset(tmp_path, fmt, caplog):
    files, shuffled = daily_files(tmp_path, fmt)
    read = LocalReader()
    caplog.set_level(logging.INFO, logger="refmount")
    refs = combine_datasets([(str(f), scan(f, fmt)) for f in shuffled], "time", read=read, decode=decode_bounded)
    assert read.calls > 0  # the coordinate's values came through the caller's reader
    got = assert_same_as_mfdataset(refs, files)
    # one unit (the earliest file's), written inline; tas's chunks are the files' own references
    assert json.loads(refs["time/.zattrs"])["units"] == "hours since 2020-01-01"
    assert refs["time/0"].startswith("base64:")
    assert json.loads(refs["time/.zarray"])["compressor"] is None
    assert isinstance(refs["tas/143.0.0"], list) and refs["tas/143.0.0"][0] == str(files[-1])
    assert np.isnan(got["tas"].values[3, 1, 1])  # the fill value still reads as missing
    assert "re-encoded as 'hours since 2020-01-01'" in caplog.text


def test_inline_coordinates_and_days_units(tmp_path):
    """kerchunk's default inlining (no read at all for the small coordinates), times in float days."""
    files, shuffled = daily_files(tmp_path, units="days")
    refs = combine_datasets([(str(f), scan(f, inline=500)) for f in shuffled], "time", read=LocalReader())
    assert_same_as_mfdataset(refs, files)
    assert json.loads(refs["time/.zattrs"])["units"] == "days since 2020-01-01"


def test_noleap_and_360_day_calendars(tmp_path):
    for calendar in ("noleap", "360_day"):
        root = tmp_path / calendar
        root.mkdir()
        files, shuffled = daily_files(root, calendar=calendar)
        refs = combine_datasets([(str(f), scan(f)) for f in shuffled], "time", read=LocalReader())
        got = assert_same_as_mfdataset(refs, files)  # (cftime dates: xarray's choice for these calendars)
        assert got["time"].values[0].calendar == calendar


def test_mismatch_is_refused_in_one_line(tmp_path):
    files, shuffled = daily_files(tmp_path)
    make_day(files[3], 3, lat_shift=0.5)  # another grid in one file
    sets = [(str(f), scan(f)) for f in shuffled]
    with pytest.raises(RefsError) as e:
        combine_datasets(sets, "time", read=LocalReader())
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"file '{files[3]}': variable 'lat' has other values than in file '{files[0]}'")
    assert "--identical lat" in message and "--skip-mismatched" in message

    # --identical: the earliest file's lat, unchecked
    refs = combine_datasets(sets, "time", identical=["lat"], read=LocalReader())
    assert np.array_equal(open_refs(refs)["lat"].values, np.linspace(-60, 60, 5).astype("f4"))


def test_skip_mismatched_drops_with_a_log_line(tmp_path, caplog):
    def other_mask(value):
        def add(ds):
            mask = ds.createVariable("mask", "i1", ("lat", "lon"))
            mask[:] = value
        return add

    files = []
    for day in range(3):
        path = tmp_path / f"day{day}.nc"
        make_day(path, day, extra=other_mask(1 if day != 2 else 0))
        files.append(path)
    sets = [(str(f), scan(f)) for f in files]
    with pytest.raises(RefsError, match=f"^file '{files[2]}': variable 'mask' has other values"):
        combine_datasets(sets, "time", read=LocalReader())
    caplog.set_level(logging.WARNING, logger="refmount")
    refs = combine_datasets(sets, "time", skip_mismatched=True, read=LocalReader())
    assert not any(k.startswith("mask/") for k in refs)
    assert f"file '{files[2]}': variable 'mask' has other values than in file '{files[0]}': dropped " \
           "(--skip-mismatched)" in caplog.text
    assert "tas/.zarray" in refs


def test_metadata_mismatch_and_missing_variable(tmp_path):
    files, _ = daily_files(tmp_path, days=3)

    def with_extra(ds):
        ds.createVariable("orog", "f4", ("lat", "lon"))[:] = 1.0
    make_day(files[1], 1, extra=with_extra)
    sets = [(str(f), scan(f)) for f in files]
    with pytest.raises(RefsError, match=f"^file '{files[0]}': variable 'orog' is missing: cannot combine"):
        combine_datasets(sets, "time", read=LocalReader())
    refs = combine_datasets(sets, "time", skip_mismatched=True, read=LocalReader())
    assert "orog/.zarray" not in refs

    # tas compressed differently in one file: its chunks cannot be mixed under one .zarray
    make_day(files[1], 1, fmt="NETCDF4_CLASSIC")
    refs1 = scan(files[1])
    zarray = json.loads(refs1["refs"]["tas/.zarray"])
    zarray["filters"] = None
    refs1["refs"]["tas/.zarray"] = json.dumps(zarray)
    with pytest.raises(RefsError, match=f"^file '{files[1]}': variable 'tas' has filters None"):
        combine_datasets([(str(files[0]), scan(files[0])), (str(files[1]), refs1)], "time", read=LocalReader())


def test_overlap_and_uneven_chunks(tmp_path, monkeypatch):
    files, _ = daily_files(tmp_path, days=2)
    twice = [(str(files[0]), scan(files[0])), (str(files[0]) + "-copy", scan(files[0]))]
    with pytest.raises(RefsError, match="overlap along 'time'"):
        combine_datasets(twice, "time", read=LocalReader())

    # a variable whose chunks along time are longer than a day (as netCDF-C's default for 1-D record
    # variables, 1024): it is read and written inline while small, refused (or dropped) when not
    def counts(ds):
        ds.createVariable("count", "i4", ("time",), chunksizes=(64,))[:] = np.arange(24)
    for day, path in enumerate(files):
        make_day(path, day, extra=counts)
    sets = [(str(f), scan(f)) for f in files]
    assert json.loads(sets[0][1]["refs"]["count/.zarray"])["chunks"][0] > 24
    refs = combine_datasets(sets, "time", read=LocalReader())
    assert refs["count/0"].startswith("base64:")
    assert np.array_equal(open_refs(refs)["count"].values, np.tile(np.arange(24), 2))
    monkeypatch.setattr(combine, "INLINE_LIMIT", 16)
    with pytest.raises(RefsError, match=f"^file '{files[0]}': variable 'count' has 24 values along 'time' in "
                                        "chunks of [0-9]+: the combined chunks would be uneven"):
        combine_datasets(sets, "time", read=LocalReader())


def test_files_of_different_lengths_stored_in_one_piece(tmp_path, monkeypatch):
    """Contiguous variables (kerchunk: one chunk a file) of files of 24 and 23 steps: the combined chunks
    would differ, so the variable is written inline while small, and refused when not."""
    import xarray as xr

    files = [tmp_path / "a.nc", tmp_path / "b.nc"]
    make_day(files[0], 0, steps=24, contiguous=True)
    make_day(files[1], 1, steps=23, contiguous=True)
    sets = [(str(f), scan(f)) for f in files[::-1]]
    assert json.loads(sets[0][1]["refs"]["tas/.zarray"])["chunks"][0] == 23
    refs = combine_datasets(sets, "time", read=LocalReader())
    assert refs["tas/0.0.0"].startswith("base64:")
    with xr.open_mfdataset([str(f) for f in files], combine="by_coords") as expected:
        xr.testing.assert_identical(open_refs(refs).load(), expected.load())
    monkeypatch.setattr(combine, "INLINE_LIMIT", 1024)
    with pytest.raises(RefsError, match=f"^file '{files[1]}': variable 'tas' has 23 values along 'time' in "
                                        r"chunks of 23 \(the earliest file's: 24\): the combined chunks would be uneven"):
        combine_datasets(sets, "time", read=LocalReader())


def test_no_such_dimension_or_identical_over_it(tmp_path):
    files, _ = daily_files(tmp_path, days=2)
    sets = [(str(f), scan(f)) for f in files]
    with pytest.raises(RefsError, match=f"^file '{files[0]}' has no dimension 'level' to concatenate along$"):
        combine_datasets(sets, "level", read=LocalReader())
    with pytest.raises(RefsError, match="^--identical tas: the variable is over the --concat dimension 'time'$"):
        combine_datasets(sets, "time", identical=["tas"], read=LocalReader())
    with pytest.raises(RefsError, match="^--identical nothere: file .* has no such variable$"):
        combine_datasets(sets, "time", identical=["nothere"], read=LocalReader())


def test_mount_answers_ncdump_as_ncrcat(tmp_path, mount):
    """The issue's Done-when: xarray.open_zarr of the mounted combination equals open_mfdataset of the
    files, and `ncdump -v time` of it equals that of NCO's ncrcat of the same files (given in time
    order: ncrcat concatenates in argument order, and re-bases each file's time to the first file's
    units)."""
    from tests.support.clients import NCDUMP, nczarr_url, tool

    files, shuffled = daily_files(tmp_path)
    refs = combine_datasets([(str(f), scan(f)) for f in shuffled], "time", read=LocalReader())
    joined = tmp_path / "ncrcat.nc"
    subprocess.run([*tool("ncrcat"), "-h", *map(str, files), str(joined)], check=True, capture_output=True, timeout=60)
    m = mount(refs)

    def time_data(target):
        text = subprocess.run([*NCDUMP, "-v", "time", target], check=True, capture_output=True, text=True,
                              timeout=60).stdout
        # (the headers differ in what is not data: the order of declarations, ncrcat's UNLIMITED
        # and the cell_methods it adds)
        units = sorted(line.strip() for line in text.splitlines() if line.strip().startswith(("time:units",
                                                                                             "time:calendar")))
        return units, text[text.index("data:"):]

    got, expected = time_data(nczarr_url(m.path)), time_data(str(joined))
    assert got == expected
    assert got[0] == ['time:calendar = "standard" ;', 'time:units = "hours since 2020-01-01" ;']
    assert "142, 143 ;" in got[1]
    import xarray as xr

    with xr.open_mfdataset([str(f) for f in files], combine="by_coords") as expected:
        xr.testing.assert_identical(xr.open_zarr(m.path, consolidated=False).load(), expected.load())



def test_groups(tmp_path):
    """Variables in a group over the root's time are concatenated too; the group's attributes kept."""
    def group(ds):
        g = ds.createGroup("surface")
        g.comment = "a group"
        g.createVariable("ts", "f4", ("time", "lat", "lon"))[:] = ds["tas"][:] + 1
        g.createVariable("orog", "f4", ("lat", "lon"))[:] = 2.0

    files, shuffled = daily_files(tmp_path, days=3, extra=group)
    refs = combine_datasets([(str(f), scan(f)) for f in shuffled], "time", read=LocalReader())
    assert json.loads(refs["surface/.zattrs"]) == {"comment": "a group"}
    assert json.loads(refs["surface/ts/.zarray"])["shape"] == [72, 5, 4]
    import fsspec
    import zarr

    # (xarray lists no variables in a group of a ReferenceFileSystem, kerchunk's own refs included: zarr directly)
    group = zarr.open_group(fsspec.filesystem("reference", fo=refs).get_mapper(""), mode="r", zarr_format=2)
    got = {"ts": group["surface/ts"][...], "orog": group["surface/orog"][...]}
    import netCDF4

    def raw(path):
        with netCDF4.Dataset(path) as ds:
            ds.set_auto_mask(False)
            return ds["surface/ts"][:]

    assert np.array_equal(got["ts"], np.concatenate([raw(f) for f in files]))
    assert np.array_equal(got["orog"], np.full((5, 4), 2.0, "f4"))


def test_times_that_outgrow_their_integer_dtype_become_float64(tmp_path):
    """int16 seconds since 1900 and since 2020: in the earliest file's units the later ones do not fit."""
    import netCDF4
    import xarray as xr

    files = []
    for n, first in enumerate(["1900-01-01", "2020-01-01"]):
        path = tmp_path / f"{n}.nc"
        with netCDF4.Dataset(path, "w") as ds:
            ds.createDimension("time", None)
            time = ds.createVariable("time", "i2", ("time",))
            time.units = f"seconds since {first}"
            time[:] = np.arange(3)
            ds.createVariable("x", "f4", ("time",))[:] = np.arange(3)
        files.append(path)
    refs = combine_datasets([(str(f), scan(f)) for f in files[::-1]], "time", read=LocalReader())
    assert json.loads(refs["time/.zarray"])["dtype"] == "<f8"
    with xr.open_mfdataset([str(f) for f in files], combine="by_coords") as expected:
        xr.testing.assert_identical(open_refs(refs).load(), expected.load())


def test_synthetic_sets_with_slash_separated_chunk_keys():
    """References as a Zarr v2 store with dimension_separator "/" (no file at all: inline chunks)."""
    import base64

    def one(first: int) -> dict:
        def inline(values, dtype):
            return "base64:" + base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode()

        array = {"shape": [2, 3], "chunks": [1, 3], "dtype": "<i4", "fill_value": None, "order": "C",
                 "filters": None, "compressor": None, "zarr_format": 2, "dimension_separator": "/"}
        return {".zgroup": '{"zarr_format": 2}',
                "t/.zarray": json.dumps(dict(array, shape=[2], chunks=[2], dimension_separator=".")),
                "t/.zattrs": '{"_ARRAY_DIMENSIONS": ["t"]}', "t/0": inline([first, first + 1], "<i4"),
                "v/.zarray": json.dumps(array), "v/.zattrs": '{"_ARRAY_DIMENSIONS": ["t", "x"]}',
                "v/0/0": inline([first] * 3, "<i4"), "v/1/0": inline([first + 1] * 3, "<i4")}

    refs = combine_datasets([("b", one(2)), ("a", one(0))], "t", read=LocalReader())
    assert sorted(k for k in refs if k.startswith("v/") and "/." not in k) == ["v/0/0", "v/1/0", "v/2/0", "v/3/0"]
    got = open_refs(refs)
    assert got["t"].values.tolist() == [0, 1, 2, 3]
    assert got["v"].values.tolist() == [[n] * 3 for n in range(4)]


def test_a_chunk_that_inflates_past_its_size_is_refused(tmp_path):
    """A zlib bomb in a chunk the combination decodes (64 MiB of zeros for 24 times) stops at the bound."""
    import base64
    import zlib

    files, _ = daily_files(tmp_path, days=2)
    sets = [(str(f), scan(f)) for f in files]
    refs = sets[1][1]["refs"]
    refs["time/.zarray"] = json.dumps(dict(json.loads(refs["time/.zarray"]), compressor={"id": "zlib", "level": 1}))
    refs["time/0"] = "base64:" + base64.b64encode(zlib.compress(bytes(64 << 20))).decode()
    with pytest.raises(RefsError, match=f"^file '{files[1]}': chunk \\(0,\\) of variable 'time' cannot be decoded: "
                                        "decodes to more than the expected"):
        combine_datasets(sets, "time", read=LocalReader(), decode=decode_bounded)


def test_files_deflated_at_other_levels_combine(tmp_path):
    """A zlib level is the writer's choice: chunks of any level decode the same, so files whose tas differ
    only in it combine (a DMR++ sidecar that says level 6 beside a scan of a file written at 1). What
    decodes otherwise (another codec) still stops the combination."""
    files, _ = daily_files(tmp_path, days=2)
    sets = [(str(f), scan(f)) for f in files]
    (zlib,) = [f for f in json.loads(sets[0][1]["refs"]["tas/.zarray"])["filters"] if f["id"] == "zlib"]
    other = sets[1][1]["refs"]

    def with_filter(config):
        meta = json.loads(other["tas/.zarray"])
        meta["filters"] = [config if f["id"] in ("zlib", "gzip") else f for f in meta["filters"]]
        other["tas/.zarray"] = json.dumps(meta)

    with_filter({"id": "zlib", "level": 9 if zlib.get("level") != 9 else 1})
    refs = combine_datasets(sets, "time", read=LocalReader())
    assert open_refs(refs)["tas"].shape == (48, 5, 4)
    with_filter({"id": "gzip", "level": 1})
    with pytest.raises(RefsError, match="has filters .*gzip.*cannot combine along 'time'"):
        combine_datasets(sets, "time", read=LocalReader())
