"""The decoded view, read end to end by real clients, against netCDF4-python reading the source.

Every dataset kind of tests.support.datasets (plus the public air.nc) is kerchunked, mounted once
per module with ``--view decoded`` (and ``--view raw``), and every variable of every group is read
by each client and compared with the oracle: netCDF4-python on the SOURCE .nc file with
``set_auto_maskandscale(False)`` (raw stored values; NaN == NaN). Some kinds are mounted a second
time from references to the loopback HTTP server (``<kind>@http``) or with small chunks inlined
(``<kind>@inline``). A hand-made set (``synthetic``) covers what kerchunk never emits for netCDF
files; its oracle is the numpy data it was made from.

Clients:
- ``ncdump``: Debian's /usr/bin/ncdump (netCDF-C 4.9.0, no filter plugins), ``-v`` with every
  variable path, its CDL data section parsed (tests.support.clients.parse_ncdump);
- ``netcdf4``: netCDF4-python, whose wheel bundles netCDF-C 4.10.1, on ``file://MNT#mode=nczarr,file``
  (its form, nc410, has NCZarr's own keys: scalars are scalars there);
- ``xarray``: ``xarray.open_zarr`` (zarr-python 3) per group;
- ``gdal``: rasterio (GDAL 3.10 in its wheel) on ``ZARR:"MNT":/path`` for 2-D and 3-D numeric
  variables. GDAL neither flips nor squeezes: a 2-D (y, x) array is one band of shape (y, x), a
  3-D (t, y, x) array is t bands, band i+1 = oracle[i], rows in storage order (even where the
  latitude is increasing: the geotransform gets a positive y step instead).
The raw view is read by xarray only (it decodes the codecs itself; ncdump 4.9.0 cannot).

What the decoded view changes, and so how values are compared (tests.support.clients.served):
char/byte strings (``|S1``, ``|Sn``) are served as ``u1`` (``|Sn`` with a trailing strlen
dimension), so the oracle's chars are compared as byte values; scalars are shape [1];
big-endian values come back little-endian (equal values); chunks larger than the shape are
cropped (invisible to values).

Expected failures (EXPECTED_FAILURES) are client limitations, not refmount's: each such test
proves it by showing that a plain local copy of the mounted tree (``cp -r``) fails the same way,
and fails itself if the client starts to succeed (so the entry gets removed).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import netCDF4
import numpy as np
import pytest

from tests.conftest import Mount
from tests.support import clients as C
from tests.support import datasets as D

KINDS = (*D.KINDS, "air")  # netCDF files, kerchunked; the oracle reads the file itself
# A hand-made reference set of Zarr features kerchunk never emits for netCDF files (|S5, bool,
# Fortran order, a dimension name with two lengths, "/" separator, ...); its oracle is the numpy
# data it was made from (tests.support.clients.synthetic_refs).
SYNTHETIC = "synthetic"
ALL_KINDS = (*KINDS, SYNTHETIC)
HTTP_KINDS = ("missing", "air")  # also mounted from references to the loopback HTTP server
INLINE_KINDS = ("shuffle_zlib", "chars", "scalar")  # also with chunks < 300 bytes inlined
INLINE_THRESHOLD = 300
CASES = (*ALL_KINDS, *(f"{k}@http" for k in HTTP_KINDS), *(f"{k}@inline" for k in INLINE_KINDS))

# Kinds without any 2-D or 3-D numeric variable: nothing for GDAL to read.
NO_RASTER = ("chars", "scalar")
GDAL_CASES = tuple(c for c in CASES if c.split("@")[0] not in NO_RASTER)

# (kind, client) -> (exception type, regex its message matches): clients that cannot read that
# kind at all, even from a plain Zarr copy. Why, for each:
EXPECTED_FAILURES = {
    # The synthetic set uses dimension "d" with lengths 4 and 6 (legal in Zarr v2, which has no
    # shared dimensions). xarray refuses such a group; the same on `cp -r`. The decoded view
    # renames the second one to "d_6", so only the raw view is affected.
    ("synthetic", "raw-xarray"): (ValueError, r"conflicting sizes for dimension 'd'"),
}


# Variables the decoded view hides on purpose (logged at mount); their absence is checked.
HIDDEN_IN_DECODED: dict = {}


def kind_of(case: str) -> str:
    return case.split("@")[0]


def decoded_expected(case: str, oracle) -> dict:
    hidden = HIDDEN_IN_DECODED.get(kind_of(case), set())
    return {path: ov for path, ov in oracle[kind_of(case)].items() if path not in hidden}


# ----------------------------------------------------------------------------- module fixtures


@pytest.fixture(scope="module")
def oracle(datasets):
    """{kind: {variable path: OracleVar}} read from the source files (synthetic: its numpy data)."""
    out = {kind: C.oracle_variables(datasets[kind]) for kind in KINDS}
    out[SYNTHETIC] = C.synthetic_refs()[1]
    return out


@pytest.fixture(scope="module")
def groups(datasets):
    """{kind: [group path, ...]} ("" = root), empty groups included."""
    out = {kind: C.oracle_groups(datasets[kind]) for kind in KINDS}
    out[SYNTHETIC] = [""]
    return out


def _refs_for(case: str, datasets, http_data) -> dict:
    kind, _, variant = case.partition("@")
    if kind == SYNTHETIC:
        return C.synthetic_refs()[0]
    url = http_data.url_for(datasets[kind].name) if variant == "http" else None
    threshold = INLINE_THRESHOLD if variant == "inline" else 0
    return D.kerchunk_refs(datasets[kind], url=url, inline_threshold=threshold,
                           **D.KERCHUNK_KWARGS.get(kind, {}))


@pytest.fixture(scope="module")
def mounts(datasets, http_data, tmp_path_factory):
    """{(case, view): Mount}: every case with --view decoded, every plain kind with --view raw.

    All daemons are started (and stopped) concurrently: one mount takes ~0.7 s to come up."""
    root = tmp_path_factory.mktemp("decoded")
    todo = {}
    for case in CASES:
        ref_path = root / f"{case.replace('@', '_')}.json"
        ref_path.write_text(json.dumps(_refs_for(case, datasets, http_data)))
        views = ("decoded", "raw") if "@" not in case else ("decoded",)
        for view in views:
            # characters as numbers: the one form every client here reads (test_nctruth checks the others)
            todo[case, view] = Mount(ref_path, root / f"mnt_{case.replace('@', '_')}_{view}",
                                     ["--view", view, "--chars", "ubyte"])
    try:
        # a few at a time: each start waits (60 s at most) for its own daemon, and ~36 Python
        # daemons importing numpy at once on 2 cores would eat into that for nothing
        with ThreadPoolExecutor(max_workers=8) as pool:
            futures = {key: pool.submit(m.start) for key, m in todo.items()}
            errors = []
            for key, f in futures.items():
                try:
                    f.result()
                except Exception as e:  # noqa: BLE001 - reported below, after every start ended
                    errors.append(f"{key}: {e}")
        if errors:
            pytest.fail("mounts failed to start:\n" + "\n".join(errors), pytrace=False)
        yield todo
    finally:
        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            list(pool.map(lambda m: m.stop(), todo.values()))


# ----------------------------------------------------------------------------- helpers


def expected_failure(case: str, client: str, open_fn, mnt: Path, tmp_path: Path) -> bool:
    """For an EXPECTED_FAILURES entry: check that ``open_fn`` fails on the mount and on a plain
    local copy of it (``cp -r``) with the listed error, and return True; False for any other
    (kind, client). Fails if the client has started to succeed (remove the entry then)."""
    entry = EXPECTED_FAILURES.get((kind_of(case), client))
    if entry is None:
        return False
    error, pattern = entry
    try:
        open_fn(mnt)
    except error as e:
        assert re.search(pattern, str(e)), f"{client} on {case}: unexpected error {e!r}"
    else:
        pytest.fail(f"{client} now reads {case}: remove it from EXPECTED_FAILURES")
    copy = shutil.copytree(mnt, tmp_path / "local_copy")
    with pytest.raises(error, match=pattern):
        open_fn(copy)
    return True


def _json_fill(value):
    if isinstance(value, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}.get(value)
    return value


def fill_candidates(ov: C.OracleVar, served_dtype: np.dtype, mnt: Path) -> list:
    """Values netCDF-C may print as '_' for this variable: the source's _FillValue (or netCDF's
    default for its type), the served .zarray fill_value, the default for the served type."""
    fills = [ov.fill[0] if isinstance(ov.fill, bytes) and ov.fill else ov.fill]
    zarray = json.loads((mnt / ov.path / ".zarray").read_text())
    fills.append(_json_fill(zarray.get("fill_value")))
    fills.append(netCDF4.default_fillvals.get(served_dtype.str[1:]))
    return [f for f in fills if f is not None]


def walk_netcdf4(ds, prefix=""):
    for name, v in ds.variables.items():
        yield (f"{prefix}/{name}" if prefix else name), v
    for name, g in ds.groups.items():
        yield from walk_netcdf4(g, f"{prefix}/{name}" if prefix else name)


def read_xarray(root: Path, groups) -> dict:
    import xarray as xr

    out = {}
    for group in groups:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = xr.open_zarr(root, group=group or None, consolidated=False,
                              mask_and_scale=False, decode_times=False)
        with ds:
            for name, var in ds.variables.items():
                out[f"{group}/{name}" if group else name] = np.asarray(var.values)
    return out


class Mismatches:
    """Collects per-variable assertion failures so one test reports every bad variable."""

    def __init__(self, what: str):
        self.what = what
        self.failures: list[str] = []

    def check(self, fn, *args) -> None:
        try:
            fn(*args)
        except AssertionError as e:
            self.failures.append(str(e))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None and self.failures:
            pytest.fail(f"{self.what}: {len(self.failures)} variable(s) differ:\n" + "\n".join(self.failures))


def compare_all(got: dict, oracle: dict, view: str, what: str) -> None:
    assert sorted(got) == sorted(oracle), f"{what}: variables differ"
    with Mismatches(what) as m:
        for path, ov in oracle.items():
            m.check(C.assert_same, got[path], C.served(ov.values, view), f"{what} {path}")


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", CASES)
def test_decoded_ncdump(case, mounts, oracle, datasets, http_data):
    """Debian's ncdump 4.9.0, `-v` with every variable (group variables as `group/var`)."""
    mnt = mounts[case, "decoded"].path
    expected = decoded_expected(case, oracle)
    dumped = C.parse_ncdump(C.ncdump(C.nczarr_url(mnt), variables=list(expected)))
    if case.endswith("@http"):  # the bytes really came through the loopback server
        name = "/" + datasets[kind_of(case)].name
        assert any(method == "GET" and path == name for method, path, _ in http_data.stats["log"])
    # a bare name such as "t2" also selects t2 in every group: those are real variables too
    assert sorted(dumped) == sorted(expected)
    with Mismatches(f"ncdump {case}") as m:
        for path, ov in expected.items():
            want = C.served(ov.values)
            m.check(C.compare_dumped, dumped[path], want, fill_candidates(ov, want.dtype, mnt),
                    f"ncdump {case} {path}")


def _open_netcdf4(root: Path):
    return netCDF4.Dataset(C.nczarr_url(root))


@pytest.mark.parametrize("case", CASES)
def test_decoded_netcdf4(case, mounts, oracle, tmp_path):
    """netCDF4-python (netCDF-C 4.10.1) on file://MNT#mode=nczarr,file: its form has NCZarr's keys, so
    scalars read as scalars."""
    mnt = mounts[case, "decoded"].path
    if expected_failure(case, "netcdf4", lambda p: _open_netcdf4(p).close(), mnt, tmp_path):
        return
    got = {}
    with _open_netcdf4(mnt) as ds:
        for path, v in walk_netcdf4(ds):
            v.set_auto_maskandscale(False)
            v.set_auto_chartostring(False)
            got[path] = np.array(v[...])
    compare_all(got, decoded_expected(case, oracle), "nczarr", f"netcdf4 {case}")


@pytest.mark.parametrize("case", CASES)
def test_decoded_xarray(case, mounts, oracle, groups):
    """xarray.open_zarr(MNT, group=...) over every group: the zarr form, here through zarr.json (this
    process has netCDF-C loaded: tests/test_two_libraries.py), where scalars are scalars."""
    mnt = mounts[case, "decoded"].path
    got = read_xarray(mnt, groups[kind_of(case)])
    compare_all(got, decoded_expected(case, oracle), "zarr", f"xarray {case}")


@pytest.mark.parametrize("case", GDAL_CASES)
def test_decoded_gdal(case, mounts, oracle):
    """rasterio/GDAL's Zarr driver on ZARR:"MNT":/path for every 2-D and 3-D numeric variable."""
    import rasterio
    from rasterio.errors import NotGeoreferencedWarning

    mnt = mounts[case, "decoded"].path

    def check(path, want):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NotGeoreferencedWarning)
            with rasterio.open(f'ZARR:"{mnt}":/{path}') as r:
                assert (r.count, r.height, r.width) == want.shape, f"gdal {case} {path}: bands, rows, columns"
                got = r.read()
        C.assert_same(got, want, f"gdal {case} {path}")

    checked = []
    with Mismatches(f"gdal {case}") as m:
        for path, ov in oracle[kind_of(case)].items():
            if ov.values.ndim not in (2, 3) or ov.values.dtype.kind not in "fiu":
                continue
            want = C.served(ov.values)
            m.check(check, path, want[None] if want.ndim == 2 else want)  # 2-D: one band
            checked.append(path)
    assert checked, f"{case}: no 2-D/3-D numeric variable (add the kind to NO_RASTER)"


@pytest.mark.parametrize("case", ALL_KINDS)
def test_raw_xarray(case, mounts, oracle, groups, tmp_path):
    """The same references with --view raw: zarr decodes the codecs itself."""
    mnt = mounts[case, "raw"].path
    if expected_failure(case, "raw-xarray", lambda p: read_xarray(p, groups[case]), mnt, tmp_path):
        return
    got = read_xarray(mnt, groups[case])
    compare_all(got, oracle[case], "raw", f"raw xarray {case}")


# ----------------------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize("kind", KINDS)
def test_ncdump_parser_on_source(kind, datasets, oracle):
    """The ncdump parser and comparison, on ncdump 4.9.0 reading the SOURCE .nc file (HDF5, no
    refmount): real CDL with char strings ("alpha", a 1-D char array as one string "ynyn"),
    `_` for every _FillValue, NaN, groups and scalars must agree with netCDF4-python."""
    expected = oracle[kind]
    dumped = C.parse_ncdump(C.ncdump(str(datasets[kind])))
    assert sorted(dumped) == sorted(expected)
    with Mismatches(f"ncdump source {kind}") as m:
        for path, ov in expected.items():
            m.check(C.compare_dumped, dumped[path], C.bytes_form(ov.values), [ov.fill],
                    f"ncdump source {kind} {path}")


def test_ncdump_check_is_not_vacuous(mounts, oracle):
    """ncdump 4.9.0 has no filters: on the raw view of the zlib set it prints garbage for the
    compressed t3 with no error (NOTES.md §2), and the comparison used above must say so."""
    mnt = mounts["zlib", "raw"].path
    dumped = C.parse_ncdump(C.ncdump(C.nczarr_url(mnt), variables=["t3"]))
    ov = oracle["zlib"]["t3"]
    with pytest.raises(AssertionError, match="values differ"):
        C.compare_dumped(dumped["t3"], C.served(ov.values), [ov.fill], "ncdump raw zlib t3")
