"""Native Zarr stores written by other implementations than zarr-python (issue 40), and zarr-python's
variants that are easy to get wrong, mounted from nginx and moto's S3.

The stores of tests/data/zarrimpl (its README says where each comes from): z5py's from the
zarr_implementations project (2021) and from z5py 3.0.2 (v2 "." and "/", v3 with sharding),
tensorstore 0.1.86's (v2 big-endian blosc with "/", F order; v3 sharded zstd with a NaN fill, big-endian
gzip with "c.0" keys), and zarrita's draft v3 layout (metadata only: refused in one line).

Oracles: zarr-python and xarray on the store itself; ncdump (Debian's netCDF-C 4.9.0: no filters, no
v3) on the decoded view's values against zarr-python's; netCDF-C 4.10.1 (the netCDF4 wheel) where it
reads a store itself."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.support.clients import NCDUMP, compare_dumped, ncdump, nczarr_url, parse_ncdump
from tests.support.moto import bucket_of
from tests.support.nginx import Nginx
from tests.support.refusals import refusal_line

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

DATA = Path(__file__).parent / "data" / "zarrimpl"
STORES = ("z5py_v2.zarr", "z5py_v2_nested.zarr", "z5py_v3.zarr", "tensorstore_v2.zarr",
          "tensorstore_v3.zarr")


def _dims(fmt: int, name: str, ndim: int, attributes: dict | None = None) -> dict:
    """Dimension names (xarray needs them): v2's _ARRAY_DIMENSIONS, v3's dimension_names."""
    names = [f"{name}_{n}" for n in range(ndim)]
    if fmt == 3:
        return {"dimension_names": names, "attributes": attributes or {}}
    return {"attributes": {**(attributes or {}), "_ARRAY_DIMENSIONS": names}}


def write_variants(store: str, fmt: int) -> None:
    """Every array has a missing chunk (read as the fill) unless it is one chunk; v3's NaN fills are
    spelled in hex, as other writers do."""
    g = zarr.open_group(store, mode="w", zarr_format=fmt, attributes={"title": "Température ±2 °C", "note": "日本語"})

    def arr(name, data, chunks=None, **kw):
        data = np.asarray(data)
        return g.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunks or data.shape or "auto",
                              **_dims(fmt, name, data.ndim), **kw)
    for name, fill in (("nan", np.nan), ("inf", np.inf), ("ninf", -np.inf)):
        a = arr(name, np.zeros(6, "f8"), chunks=(3,), fill_value=fill)
        a[:3] = [1.5, -2.5, 3.0]  # (the second chunk missing: the fill)
    nanf = arr("nanf", np.zeros(4, "f4"), chunks=(2,), fill_value=np.nan)
    nanf[:2] = [0.25, -0.5]
    b = arr("flag", np.zeros(5, bool), chunks=(2,), fill_value=True)
    b[:2] = [False, True]
    big = arr("big", np.zeros(5, ">f8"), chunks=(2,), fill_value=-1.0)
    big[:4] = [0.5, 1.5, 2.5, 3.5]
    if fmt == 2:
        f = g.create_array("forder", shape=(4, 3), chunks=(2, 2), dtype="i4", fill_value=0, order="F",
                           **_dims(fmt, "forder", 2))
        f[...] = np.arange(12).reshape(4, 3)
    t = arr("time", np.zeros(4, "M8[s]"), chunks=(2,), fill_value=np.datetime64("NaT"))
    t[:2] = np.array(["2020-01-01T00:00:00", "2021-06-30T12:00:00"], "M8[s]")
    d = arr("delta", np.zeros(3, "m8[s]"), chunks=(3,), fill_value=np.timedelta64(0, "s"))
    d[...] = np.array([1, 60, 3600], "m8[s]")
    s = arr("bytes8", np.zeros(3, "S8"), chunks=(2,), fill_value=b"")
    s[:2] = [b"abc", b"12345678"]
    u = arr("uni5", np.zeros(3, "U5"), chunks=(2,), fill_value="")
    u[:2] = ["héllo", "ab"]
    v = g.create_array("vlen", shape=(3,), chunks=(2,), dtype=str, **_dims(fmt, "vlen", 1))
    v[...] = ["a", "ßtring", "longer text"]
    z = arr("scalar", np.float32(0), fill_value=0)
    z[...] = 2.5
    arr("zerolen", np.zeros((0, 3), "i2"), chunks=(2, 3), fill_value=0)
    c = arr("cplx", np.zeros(3, "c8"), chunks=(2,), fill_value=1 + 2j)
    c[:2] = [1 + 1j, 2 - 3j]
    g.create_group("empty")
    deep = g.create_group("a").create_group("b")
    w = deep.create_array("w", shape=(2,), dtype="u2", fill_value=0,
                          **_dims(fmt, "w", 1, {"units": "µm"}))
    w[...] = [7, 8]
    zarr.consolidate_metadata(store)
    if fmt == 3:
        doc = json.loads(Path(store, "zarr.json").read_text())
        meta = doc["consolidated_metadata"]["metadata"]
        for name, fill in (("nan", "0x7ff8000000000000"), ("nanf", "0x7fc00000")):
            meta[name]["fill_value"] = fill
            node = json.loads(Path(store, name, "zarr.json").read_text())
            Path(store, name, "zarr.json").write_text(json.dumps({**node, "fill_value": fill}))
        Path(store, "zarr.json").write_text(json.dumps(doc))


NESTED_SHAPE, NESTED_WRITTEN = (10_000_000, 4), (3, 9_999_998)


def write_nested_v2(store: str) -> None:
    """A Zarr v2 store with "/" chunk keys ("t/0" under "tas/"), ten million chunks of which two are written."""
    g = zarr.open_group(store, mode="w", zarr_format=2)
    tas = g.create_array("tas", shape=NESTED_SHAPE, chunks=(1, 4), dtype="<i4", fill_value=-7,
                         chunk_key_encoding={"name": "v2", "separator": "/"},
                         attributes={"_ARRAY_DIMENSIONS": ["time", "band"]})
    for t in NESTED_WRITTEN:
        tas[t] = np.arange(4) + t
    zarr.consolidate_metadata(store)


FILLS = {"nanf": ("f4", float("nan"), [1.5, float("nan")]), "neg": ("i4", -1, [1, -1]), "nofill": ("i4", None, [1, 0])}

NC_COPY = """
import json, sys, netCDF4
with netCDF4.Dataset(sys.argv[1], "w") as ds:
    ds.createDimension("x", 4)
    for name, (dtype, fill, values) in json.loads(sys.argv[2]).items():
        v = ds.createVariable(name, dtype, ("x",), fill_value=False if fill is None else float(fill))
        v[:2] = values
"""


def write_fills(root: Path) -> None:
    """fills2.zarr, fills3.zarr: a float32 NaN fill, an int32 -1 fill and none (v3: zarr-python's 0),
    the first chunk written (a fill among its values), the second missing; fills.nc: netCDF-C's own
    copy (netCDF4-python, in a process of its own), the same fills declared, the same values written."""
    import sys

    for fmt in (2, 3):
        g = zarr.open_group(str(root / f"fills{fmt}.zarr"), mode="w", zarr_format=fmt)
        for name, (dtype, fill, values) in FILLS.items():
            dims = {"dimension_names": ["x"]} if fmt == 3 else {"attributes": {"_ARRAY_DIMENSIONS": ["x"]}}
            a = g.create_array(name, shape=(4,), chunks=(2,), dtype=dtype, fill_value=fill if fill is not None
                               or fmt == 2 else 0, **dims)
            a[:2] = values
        zarr.consolidate_metadata(str(root / f"fills{fmt}.zarr"))
    subprocess.run([sys.executable, "-c", NC_COPY, str(root / "fills.nc"), json.dumps(FILLS)], check=True, timeout=120)


@pytest.fixture(scope="module")
def www(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("www")
    for name in os.listdir(DATA):
        if (DATA / name).is_dir():
            shutil.copytree(DATA / name, root / name)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zarr-python's notes on v3 data types without a spec)
        for fmt in (2, 3):
            write_variants(str(root / f"variants{fmt}.zarr"), fmt)
    write_nested_v2(str(root / "nested.zarr"))
    for name, store in RENAMED.items():  # (stores by other names: known by their metadata)
        shutil.copytree(DATA / store, root / name)
    (root / "plain").mkdir()
    (root / "plain" / "notes.txt").write_text("no store here\n")
    write_fills(root)
    return root


@pytest.fixture(scope="module")
def nginx(www, tmp_path_factory):
    """/idx/: with nginx's index pages (stores without consolidated metadata are walked by them)."""
    with Nginx(tmp_path_factory.mktemp("nginx"), f"root {www}; location /idx/ {{ alias {www}/; autoindex on; }}",
               "$request_method $uri $status") as server:
        yield server


@pytest.fixture(scope="module")
def s3(www):
    with bucket_of(www) as options:
        yield options


def source(where: str, name: str, nginx, s3, www: Path | None = None) -> tuple[str, list[str]]:
    if where == "local":
        return str(www / name), []
    if where == "s3":
        return f"s3://stores/{name}", ["--remote-options", json.dumps(s3)]
    return f"{nginx.url}/idx/{name}", []


def arrays_of(store) -> dict[str, np.ndarray]:
    group = zarr.open_group(store, mode="r")
    return {path: np.asarray(array[...]) for path, array in group.arrays()}


def assert_same_arrays(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), what
    for path, values in want.items():
        assert got[path].dtype == values.dtype, f"{what} {path}"
        np.testing.assert_array_equal(got[path], values, err_msg=f"{what} {path}")


def views_read_as_the_store(mount, url: str, args: list[str], want: dict):
    """zarr-python reads the raw and the decoded view of `url` as the store (`want`); the decoded mount."""
    raw = mount(url, "--view", "raw", *args)
    assert_same_arrays(arrays_of(str(raw.path)), want, f"raw view of {url}")
    decoded = mount(url, *args)
    got = arrays_of(str(decoded.path))
    # (the decoded view is Zarr v2 in native byte order: values, not byte order, are compared)
    assert_same_arrays({k: v.astype(v.dtype.newbyteorder("=")) for k, v in got.items()},
                       {k: v.astype(v.dtype.newbyteorder("=")) for k, v in want.items()}, f"decoded view of {url}")
    return decoded


CASES = [(w, n) for n in STORES for w in ("http", "s3")]
# zarr_implementations names its stores .zr (v2) and .zr3; ARCO-ERA5's ends in .zarr-v3; many have no suffix
RENAMED = {"z5py_v2.zr": "z5py_v2.zarr", "z5py_v3.zr3": "z5py_v3.zarr", "tensorstore_v3.zarr-v3": "tensorstore_v3.zarr",
           "tensorstore_v2": "tensorstore_v2.zarr"}
NAMED = [(w, n + slash) for n in RENAMED for w in ("http", "s3") for slash in ("", "/")]


@pytest.mark.parametrize("where,name", CASES, ids=[f"{w}-{n}" for w, n in CASES])
def test_zarr_reads_the_mount_as_the_store(mount, www, nginx, s3, where, name):
    """zarr-python on the raw view and on the decoded view reads what it reads on the store itself
    (missing chunks as the fill value, shards, big-endian, F order, gzip, blosc, zlib, zstd)."""
    url, args = source(where, name, nginx, s3)
    want = arrays_of(str(www / name))
    decoded = views_read_as_the_store(mount, url, args, want)
    dumped = parse_ncdump(ncdump(nczarr_url(decoded.path)))
    for path, values in want.items():
        fill = zarr.open_array(str(www / name), path=path, mode="r").fill_value
        compare_dumped(dumped[path], values.astype(values.dtype.newbyteorder("<")), [fill], f"ncdump {name} {path}")


@pytest.mark.parametrize("where,name", NAMED, ids=[f"{w}-{n}" for w, n in NAMED])
def test_a_store_is_known_by_its_metadata_whatever_its_name(mount, www, nginx, s3, where, name):
    """A url whose name says nothing (.zr, .zr3, .zarr-v3, none, a trailing '/') is asked for a store's
    root metadata: mounted as the store, both views read as zarr-python reads the store."""
    url, args = source(where, name, nginx, s3)
    views_read_as_the_store(mount, url, args, arrays_of(str(www / name.rstrip("/"))))


@pytest.mark.parametrize("where", ["http", "s3"])
def test_a_url_that_holds_no_store_is_refused_in_one_line(tmp_path, nginx, s3, where):
    """A directory of neither a store nor data files: one line naming the url and what it was asked as;
    the store's metadata asked once each (nginx's log), nothing more of it."""
    url, args = source(where, "plain", nginx, s3)
    log = nginx.root / "logs" / "access.log"
    before = len(log.read_text().splitlines())
    line = refusal_line(url, tmp_path / "mnt", *args, timeout=180)
    assert url in line and "nor is it a Zarr store (no zarr.json, .zmetadata, .zgroup or .zarray under it)" in line, line
    if where == "http":
        asked = [e.split()[1] for e in log.read_text().splitlines()[before:]]
        assert sorted(a for a in asked if a.startswith("/idx/plain/.") or a.endswith("zarr.json")) == \
            ["/idx/plain/.zarray", "/idx/plain/.zgroup", "/idx/plain/.zmetadata", "/idx/plain/zarr.json"], asked


@pytest.mark.parametrize("where,fmt", [("http", 2), ("http", 3), ("s3", 3)])
def test_fills_are_declared_as_netcdf_c_declares_them(mount, www, nginx, s3, where, fmt):
    """A NaN fill, a -1 fill and none: ncdump of the decoded view (v2 or v3 store) prints what ncdump of
    netCDF-C's own copy prints, declarations and values ('_' where the fill is, written or missing)."""
    url, args = source(where, f"fills{fmt}.zarr", nginx, s3)
    decoded = mount(url, *args)
    mine = ncdump(nczarr_url(decoded.path)).splitlines()[1:]
    own = ncdump(str(www / "fills.nc")).splitlines()[1:]
    assert mine == own, "\n".join(mine)


def test_a_chunk_its_codec_cannot_decode_is_an_error_never_values(mount, www, nginx):
    """z5py (2021) wrote zlib streams under the id "gzip" (zarr-python fails on the store itself): the raw
    view serves the store's bytes; the decoded view answers EIO for such a chunk, with a log line naming
    it, and ncdump fails rather than print values."""
    with pytest.raises(Exception, match="gzip"):
        zarr.open_array(str(www / "z5py_2021.zarr"), path="gzip", mode="r")[:2, :2, 0]
    raw = mount(f"{nginx.url}/idx/z5py_2021.zarr", "--view", "raw")
    assert (raw.path / "gzip" / "0.0.1").read_bytes() == (www / "z5py_2021.zarr" / "gzip" / "0.0.1").read_bytes()
    decoded = mount(f"{nginx.url}/idx/z5py_2021.zarr")
    with pytest.raises(OSError) as e:
        (decoded.path / "gzip" / "0.0.1").read_bytes()
    assert e.value.errno == errno.EIO
    assert "'gzip/0.0.1' could not be decoded" in decoded.log(), decoded.log()
    proc = subprocess.run([*NCDUMP, "-v", "gzip", nczarr_url(decoded.path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "gzip =" not in proc.stdout.partition("data:")[2].replace("gzip =\n", ""), proc


def test_the_draft_v3_layout_is_refused_in_one_line(tmp_path, nginx):
    """zarrita's draft v3 store (root zarr.json with a url for zarr_format, metadata under meta/): not the
    Zarr v3 of the final spec, refused in one line that says so."""
    line = refusal_line(f"{nginx.url}/idx/zarrita_draft.zarr", tmp_path / "mnt")
    assert "zarrita_draft.zarr/zarr.json" in line and "zarr_format" in line, line


def all_arrays(store) -> dict[str, np.ndarray]:
    group = zarr.open_group(store, mode="r")
    return {path: np.asarray(array[...]) for path, array in group.arrays()} | {"a/b/w": group["a/b/w"][...]}


def served(values: np.ndarray) -> np.ndarray:
    """An array's values as the decoded view serves them: native byte order; bool as 0/1; times as
    their int64 ticks; <U as UTF-8 bytes."""
    if values.dtype.kind in "Mm":
        return values.view("i8")
    if values.dtype.kind == "b":
        return values.astype("u1")
    if values.dtype.kind == "U":
        return np.char.encode(values, "utf-8").astype(f"S{values.dtype.itemsize}")
    return values.astype(values.dtype.newbyteorder("="))


HIDDEN = {"cplx": "complex numbers", "vlen": "variable-length strings", "zerolen": "a dimension of length 0"}
VARIANTS = [("http", 2), ("http", 3), ("s3", 2), ("s3", 3), ("local", 2), ("local", 3)]


@pytest.mark.parametrize("where,fmt", VARIANTS, ids=[f"{w}-v{f}" for w, f in VARIANTS])
def test_zarr_python_variants_read_right_or_are_hidden_in_one_line(mount, www, nginx, s3, where, fmt):
    """NaN, Infinity and -Infinity fills (v3's NaN in hex, float64 and float32), bool, big-endian, F order (v2), datetime64 and
    timedelta64, |S8, <U5, vlen strings, a 0-d array, a 0-length dimension, complex, empty and nested
    groups, non-ASCII attributes, each with a missing chunk: the raw view reads as the store; the
    decoded view serves each array's values (times as int64 with CF units, strings as characters, the
    missing chunks as the fill) or hides it with one log line naming it; ncdump reads the whole of it."""
    name = f"variants{fmt}.zarr"
    want = all_arrays(str(www / name))
    url, args = source(where, name, nginx, s3, www)
    raw = mount(url, "--view", "raw", *args)
    got = all_arrays(str(raw.path))
    assert sorted(got) == sorted(want)
    for path, values in want.items():
        assert got[path].dtype == values.dtype, path
        assert got[path].tobytes() == values.tobytes() or got[path].dtype.kind == "T", path
        assert got[path].tolist() == values.tolist() or values.dtype.kind in "fcM", path
    decoded = mount(url, *args)
    log = decoded.log()
    for path, why in HIDDEN.items():
        assert sum(f"hiding array {path}:" in line and why in line for line in log.splitlines()) == 1, log
    got = all_arrays(str(decoded.path))
    assert sorted(got) == sorted(set(want) - set(HIDDEN))
    for path, values in got.items():
        expected = served(want[path])
        assert values.dtype == expected.dtype, path
        np.testing.assert_array_equal(values, expected, err_msg=path)
    # xarray: the raw view as the store; the decoded view's times decoded from their CF units (its
    # strings: above, as zarr reads them; xarray masks v2's fill "" of <U5 on the store, not there)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zarr-python's notes on v3 data types without a spec)
        with xr.open_zarr(str(raw.path)) as got_ds, xr.open_zarr(str(www / name)) as want_ds:
            xr.testing.assert_identical(got_ds.load(), want_ds.load())
            with xr.open_zarr(str(decoded.path)) as dec_ds:
                for path in ("time", "delta", "nan", "nanf", "inf", "ninf", "big"):
                    np.testing.assert_array_equal(dec_ds[path].values, want_ds[path].values, err_msg=path)
    dump = ncdump(nczarr_url(decoded.path))
    assert ':title = "Température ±2 °C"' in dump and 'w:units = "µm"' in dump and "group: empty {" in dump
    assert 'time:units = "seconds since 1970-01-01T00:00:00"' in dump and 'delta:units = "seconds"' in dump
    assert '"h\\303\\251llo",' in dump and '"12345678",' in dump, dump
    dumped = parse_ncdump(dump)
    for path, values in want.items():
        if path not in HIDDEN and values.dtype.kind not in "SU":
            fill = zarr.open_array(str(www / name), path=path, mode="r").fill_value
            compare_dumped(dumped[path], served(values).reshape(-1), [served(np.array([fill]))[0]], f"ncdump {path}")


def test_a_v2_store_of_nested_keys_is_lazy(mount, www, nginx):
    """v2 "/" keys are computed from the grid as "." ones are (they were listed at mount: ten million
    here): no chunk url at load; both views read the written chunks and the fill for the others, the
    decoded header makes no request, and the raw view lists the grid's directories."""
    from refmount.refs.zarrremote import ZarrStoreRefSet, load_remote_store

    refset = load_remote_store(f"{nginx.url}/nested.zarr")
    assert isinstance(refset, ZarrStoreRefSet) and refset.urls == []
    raw = mount(f"{nginx.url}/nested.zarr", "--view", "raw")
    tas = zarr.open_group(str(raw.path), mode="r")["tas"]
    for t in NESTED_WRITTEN:
        np.testing.assert_array_equal(tas[t], np.arange(4) + t)
    np.testing.assert_array_equal(tas[5], np.full(4, -7))
    assert (raw.path / "tas" / "3" / "0").read_bytes() == (www / "nested.zarr" / "tas" / "3" / "0").read_bytes()
    assert os.path.isdir(raw.path / "tas" / "9999999") and not os.path.exists(raw.path / "tas" / "10000000")
    assert os.listdir(raw.path / "tas" / "9999998") == ["0"]
    decoded = mount(f"{nginx.url}/nested.zarr")
    before = len((nginx.root / "logs" / "access.log").read_text().splitlines())
    header = subprocess.run([*NCDUMP, "-h", nczarr_url(decoded.path)], capture_output=True, text=True, timeout=120)
    assert header.returncode == 0 and "int tas(time, band)" in header.stdout, header
    assert (nginx.root / "logs" / "access.log").read_text().splitlines()[before:] == []
    tas = zarr.open_group(str(decoded.path), mode="r")["tas"]
    np.testing.assert_array_equal(tas[NESTED_WRITTEN[1] - 1 : NESTED_WRITTEN[1] + 1],
                                  [np.full(4, -7), np.arange(4) + NESTED_WRITTEN[1]])


def test_strings_of_a_parquet_set_are_served_as_characters(mount, tmp_path):
    """The other lazy set: a Parquet reference set (kerchunk's refs_to_dataframe) of an |S8 array with a
    missing chunk; ncdump reads it as characters (it was hidden)."""
    kerchunk_df = pytest.importorskip("kerchunk.df")
    store = tmp_path / "s.zarr"
    g = zarr.open_group(str(store), mode="w", zarr_format=2)
    s = g.create_array("names", shape=(5,), chunks=(2,), dtype="S8", fill_value=b"", compressors=None,
                       attributes={"_ARRAY_DIMENSIONS": ["site"]})
    s[:4] = [b"alpha", b"b", b"12345678", b"d"]
    refs = {key: (store / key).read_text() for key in (".zgroup", "names/.zarray", "names/.zattrs")}
    refs.update({f"names/{n}": [str(store / "names" / str(n))] for n in (0, 1)})
    kerchunk_df.refs_to_dataframe({"version": 1, "refs": refs}, str(tmp_path / "s.parq"), record_size=2)
    decoded = mount(str(tmp_path / "s.parq"))
    assert "hiding array names" not in decoded.log()
    dumped = ncdump(nczarr_url(decoded.path))
    assert 'char names(site, string8)' in dumped and '"alpha",\n  "b",\n  "12345678",\n  "d",\n  ""' in dumped, dumped


NC4_VALUES = """
import json, sys, netCDF4
with netCDF4.Dataset(sys.argv[1]) as ds:
    ds.set_auto_maskandscale(False)
    print(json.dumps({k: v[:].astype("f8").ravel().tolist() for k, v in ds.variables.items()}))
"""


def netcdf4_values(target: str) -> dict[str, list]:
    """Every variable's raw values as netCDF4-python (netCDF-C 4.10.1, with filters) reads them, in a
    process of its own (one that loads netCDF-C is served netCDF-C's form of a mount)."""
    import sys

    proc = subprocess.run([sys.executable, "-c", NC4_VALUES, target], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("name", ["z5py_v2.zarr", "z5py_v2_nested.zarr", "tensorstore_v2.zarr"])
def test_netcdf_c_410_reads_the_decoded_view_as_zarr_reads_the_store(mount, www, nginx, name):
    """netCDF-C 4.10.1 reads these v2 stores itself (zlib, blosc, "/" keys, big-endian) but not
    tensorstore's F order (it reads the chunks as C order); through the decoded view every value is
    zarr-python's."""
    pytest.importorskip("netCDF4")
    want = {path: values.astype("f8").ravel() for path, values in arrays_of(str(www / name)).items()}

    def same(got: dict) -> bool:
        return sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k], equal_nan=True) for k in want)

    decoded = mount(f"{nginx.url}/idx/{name}")
    got = netcdf4_values(f"file://{decoded.path}#mode=zarr,file")
    assert same(got), got
    own = netcdf4_values(f"file://{www / name}#mode=zarr,file")
    assert same(own) == (name != "tensorstore_v2.zarr"), own
