"""GRIB files of other projects that the sweep (tests/sweeps/grib_sweep.py, issue 40) found read wrong, a glob
of them on nginx mounted once, each compared with cfgrib on the file (tests/support/gribcompare.py):
GRIB1 messages (kerchunk's splitter read GRIB2's length field in them: a GRIB1 file was one message and
its other fields were lost), a file mixing editions 1 and 2, a step of 0 in a tree (grib_tree left its
chunk out: netCDF-C read its fill), ensemble members (grib_tree laid them one over another: hidden, one
log line), NOAA's NDFD file with WMO bulletin headings (not taken for GRIB), NCEP's u and v in one GRIB2
message (said per field) and a real 9999 (kerchunk's codec made it NaN), a sparse cube of members (the
times and steps no message has read NaN), levels that are not integers (GFS's soil layers, sigma 0.995). Every cfgrib variable is identical or named in the log; never
a wrong value."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import Mount

DATA = Path(__file__).parent / "data" / "gribsweep"
# file -> what each cfgrib variable must be: "identical", or "hidden" with a word of its log line
EXPECTED = {
    "cfgrib_t_on_different_level_types.grib": ("identical", None),
    "cfgrib_t_analysis_and_fc_0.grib": ("identical", None),
    "cfgrib_uv_on_different_levels.grib": ("identical", None),
    "cfgrib_forecast_monthly_ukmo.grib": ("hidden", "ensemble member"),
    "eccodes_clusters_grib1.grib": ("identical", None),
    "eccodes_GRIB1.grib": ("identical", None),
    "pygrib_dspr.temp.bin": ("hidden", "alternativeRowScanning"),
    "cfgrib_ncep-seasonal-monthly.grib": ("identical", None),  # (members never at one time and step: sparse)
    "pygrib_eta_subset.grb": ("hidden (some)", "several fields"),  # (u10 and v10 in one message; gh 9999 read)
    "pygrib_gfs_subset.grb": ("identical", None),  # (soil layers at 0, 0.1, 0.4 and 1 m; sigma 0.995)
}


@pytest.fixture(scope="module")
def sweep_mount(tmp_path_factory):
    pytest.importorskip("cfgrib")
    from tests.support.nginx import Nginx

    root = tmp_path_factory.mktemp("gribsweep")
    www = root / "www" / "data"
    shutil.copytree(DATA, www, ignore=shutil.ignore_patterns("README.md"))
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg-cache"))
    with Nginx(root / "nginx", f"root {www.parent}; location /data/ {{ autoindex on; }}") as nginx:
        m = Mount(f"{nginx.url}/data/*", root / "mnt", env=env).start(timeout=180)
        try:
            yield www, m
        finally:
            m.stop()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_grib_file_reads_as_cfgrib_reads_it_or_is_named(sweep_mount, name):
    from tests.support.gribcompare import sweep_file

    www, m = sweep_mount
    result, lines = sweep_file(www / name, m)
    want, word = EXPECTED[name]
    assert result == want, lines
    if word:
        assert any(word in line for line in lines), lines
    assert "Traceback" not in m.log()


def _grib1(length: int = 0) -> bytes:
    """eccodes' GRIB1 sample (107 bytes), its length field set to `length` when given."""
    import eccodes

    h = eccodes.codes_grib_new_from_samples("GRIB1")
    try:
        message = eccodes.codes_get_message(h)
    finally:
        eccodes.codes_release(h)
    if length:
        message = message[:4] + length.to_bytes(3, "big") + message[7:]
    return message


def test_split_reads_each_edition_length():
    """GRIB1's 3-byte length, GRIB2's 8-byte one, MARS's padding between them; a message whose length
    does not end at "7777" is said, and the search goes on after it."""
    import io

    from refmount.refs.scan.worker import _split_grib, grib_length

    one = _grib1()
    two = (Path(__file__).parent / "data" / "grib2" / "eccodes_GRIB2.grib2").read_bytes()
    assert grib_length(one[:16]) == len(one) and grib_length(two[:16]) == len(two)
    data = one + b"\0" * 13 + two + one
    parts = [(start, size) for start, size, _ in _split_grib(io.BytesIO(data))]
    assert parts == [(0, len(one)), (len(one) + 13, len(two)), (len(one) + 13 + len(two), len(one))]
    refused = []
    bad = _grib1(len(one) + 40)  # (a length past its end marker)
    parts = [(start, size) for start, size, _ in _split_grib(io.BytesIO(bad + b"\0" * 40 + two), refused=refused)]
    assert parts == [(len(bad) + 40, len(two))]
    assert len(refused) == 1 and "byte 0" in refused[0], refused


def test_zero_chunks_written_back_only_where_zarr_left_them_out():
    """grib_tree's coordinates: a chunk zarr left out (all zeros) written back where a value exists, not
    where no message is (a sparse cube); the field's own missing chunks read NaN."""
    import base64

    import numpy as np
    import orjson

    from refmount.refs.scan.worker import _zero_chunks_written

    def array(name, dims, shape, chunks=None, fill=None, filters=None):
        return {f"{name}/.zarray": orjson.dumps({"shape": shape, "chunks": chunks or shape, "dtype": "<f8" if filters else "<i8",
                                                 "fill_value": fill, "compressor": None, "filters": filters,
                                                 "order": "C", "zarr_format": 2}).decode(),
                f"{name}/.zattrs": orjson.dumps({"_ARRAY_DIMENSIONS": dims}).decode()}

    def b64(values):
        return "base64:" + base64.b64encode(np.asarray(values, "<i8").tobytes()).decode()

    refs = {**array("g/step", ["step"], [2]), **array("g/time", ["time"], [2]), "g/time/0": b64([5, 6]),
            **array("g/surface", [], []), **array("g/number", ["time", "step"], [2, 2], [1, 1]),
            "g/number/1.1": b64([3]),
            **array("g/t", ["time", "step", "y", "x"], [2, 2, 3, 4], [1, 1, 3, 4], filters=[{"id": "grib", "var": "t"}]),
            **array("g/x", ["x"], [4], fill=-1), "g/t/0.0.0.0": ["u", 0, 10], "g/t/1.1.0.0": ["u", 10, 10]}
    refs = _zero_chunks_written({"version": 1, "refs": refs})["refs"]
    assert refs["g/step/0"] == b64([0, 0]) and refs["g/surface/0"] == b64([0])
    assert refs["g/time/0"] == b64([5, 6])  # (kept)
    assert refs["g/number/0.0"] == b64([0]) and refs["g/number/1.1"] == b64([3])  # (a message at both)
    assert "g/number/0.1" not in refs and "g/number/1.0" not in refs  # (no message there)
    assert orjson.loads(refs["g/t/.zarray"])["fill_value"] == "NaN" and "g/t/0.1.0.0" not in refs
    assert "g/x/0" not in refs  # (a fill of its own)
