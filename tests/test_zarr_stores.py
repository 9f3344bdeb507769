"""Native Zarr stores mounted where they are (issue 40): v2 and v3 stores written by zarr-python (with and
without consolidated metadata, sharded, with missing chunks) served by nginx (with and without an index
page) and by moto's S3, and zipped stores (zarr's ZipStore) local, over http and on S3.

Oracles: xarray and zarr-python on the store itself; for the decoded view, Debian's ncdump on the same
store where netCDF-C reads it (an uncompressed Zarr v2 store: 4.9.0 has no filters), else the values
zarr-python reads; nginx's access log for the requests a mount makes."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.support.clients import NCDUMP, compare_dumped, ncdump, nczarr_url, parse_ncdump
from tests.support.moto import bucket_of
from tests.support.nginx import Nginx
from tests.support.refusals import refusal_line

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

STORES = ("v2c", "v2u", "v2plain", "v3c", "v3u")


def _dims(fmt: int, names: list[str]) -> dict:
    return {"dimension_names": names} if fmt == 3 else {"attributes": {"_ARRAY_DIMENSIONS": names}}


def write_store(store, fmt: int, compressed: bool = True, consolidated: bool = True) -> None:
    """A group with missing chunks (the bottom half of temp, the tail of count), a subgroup, and for v3
    a sharded array (zstd) with missing shards and a blosc array."""
    rng = np.random.default_rng(fmt)
    g = zarr.open_group(store, mode="w", zarr_format=fmt, attributes={"title": f"zarr v{fmt}"})
    plain = {} if compressed else {"compressors": None}
    temp = g.create_array("temp", shape=(6, 8), chunks=(3, 4), dtype="f4", fill_value=-9.0, **plain,
                          **_dims(fmt, ["y", "x"]))
    temp[:3, :] = rng.random((3, 8)).astype("f4")
    count = g.create_array("count", shape=(6,), chunks=(4,), dtype="i4", fill_value=7, **plain, **_dims(fmt, ["y"]))
    count[:4] = np.arange(4)
    sub = g.create_group("sub")
    z = sub.create_array("z", shape=(4,), chunks=(2,), dtype="i2", fill_value=0, **plain, **_dims(fmt, ["w"]))
    z[...] = [1, 2, 3, 4]
    if fmt == 3:
        sharded = g.create_array("sharded", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="i4", fill_value=3,
                                 compressors=[zarr.codecs.ZstdCodec()], dimension_names=["a", "b"])
        sharded[:4, :4] = np.arange(16).reshape(4, 4)
        blosc = g.create_array("blosc", shape=(5, 4), chunks=(2, 4), dtype="<f8", fill_value=np.nan,
                               compressors=[zarr.codecs.BloscCodec(cname="zstd", shuffle="bitshuffle")],
                               dimension_names=["v", "u"])
        blosc[:4] = rng.random((4, 4))
    if consolidated:
        zarr.consolidate_metadata(store)


HUGE_SHAPE, HUGE_CHUNKS, HUGE_WRITTEN = (10_000_000, 1000, 1000), (1, 1000, 1000), (5, 9_999_999)


def write_huge_store(path: Path) -> None:
    """A Zarr v2 store whose grid has ten million chunks of which two are written (ARCO-ERA5's shape:
    one chunk per time step), and a small array beside it."""
    g = zarr.open_group(str(path), mode="w", zarr_format=2)
    tas = g.create_array("tas", shape=HUGE_SHAPE, chunks=HUGE_CHUNKS, dtype="f4", fill_value=-1.0,
                         attributes={"_ARRAY_DIMENSIONS": ["time", "lat", "lon"]})
    for t in HUGE_WRITTEN:
        tas[t] = np.full(HUGE_CHUNKS[1:], t % 1000, "f4")
    lat = g.create_array("lat", shape=(1000,), chunks=(1000,), dtype="f8", attributes={"_ARRAY_DIMENSIONS": ["lat"]})
    lat[:] = np.linspace(-90, 90, 1000)
    zarr.consolidate_metadata(str(path))


HUGE3_SHAPE, HUGE3_CHUNKS, HUGE3_WRITTEN = (1_000_000, 100, 100), (1, 100, 100), (5, 999_999)
HUGE3_SHARDED = {"shape": (1_000_000, 10), "shards": (10, 10), "chunks": (1, 10), "written": (3, 999_995)}


def write_huge_v3_store(path: Path) -> None:
    """A Zarr v3 store whose grid has a million chunks ("c/t/0/0", nested) of which two are written,
    and a sharded array of a million inner chunks in 100,000 shards, two of them written."""
    g = zarr.open_group(str(path), mode="w", zarr_format=3)
    tas = g.create_array("tas", shape=HUGE3_SHAPE, chunks=HUGE3_CHUNKS, dtype="f4", fill_value=-1.0,
                         dimension_names=["time", "lat", "lon"])
    for t in HUGE3_WRITTEN:
        tas[t] = np.full(HUGE3_CHUNKS[1:], t % 1000, "f4")
    sharded = g.create_array("sharded", shape=HUGE3_SHARDED["shape"], chunks=HUGE3_SHARDED["chunks"],
                             shards=HUGE3_SHARDED["shards"], dtype="i2", fill_value=-5,
                             dimension_names=["time", "band"])
    for t in HUGE3_SHARDED["written"]:
        sharded[t] = np.arange(10, dtype="i2") + t % 100
    zarr.consolidate_metadata(str(path))


def write_key_encodings(store) -> None:
    """A v3 store with every chunk key encoding: v2's "0.1" and "0/1/0", default "c.0.1", a scalar's
    "c"; each with chunks the store lacks."""
    g = zarr.open_group(store, mode="w", zarr_format=3)
    a = g.create_array("v2dot", shape=(5, 6), chunks=(2, 4), dtype="i4", fill_value=-1,
                       chunk_key_encoding={"name": "v2", "separator": "."}, dimension_names=["p", "q"])
    a[:2] = np.arange(12).reshape(2, 6)
    b = g.create_array("v2slash", shape=(4, 3, 2), chunks=(2, 2, 1), dtype="f8", fill_value=np.nan,
                       chunk_key_encoding={"name": "v2", "separator": "/"}, dimension_names=["r", "s", "t"])
    b[:2] = np.arange(12).reshape(2, 3, 2)
    c = g.create_array("cdot", shape=(3, 4), chunks=(2, 2), dtype="u2", fill_value=9,
                       chunk_key_encoding={"name": "default", "separator": "."}, dimension_names=["u", "v"])
    c[:2, :2] = 5
    scalar = g.create_array("scalar", shape=(), dtype="f4", fill_value=0)
    scalar[...] = 2.5
    zarr.consolidate_metadata(store)


def write_shapes(store) -> None:
    """Grids whose nested key directories are odd: four dimensions, an empty axis, a 1-D array with v2's
    "/" encoding (no directory of its own), a 2-D one with v2's "/" (level 0 is the array's directory)."""
    g = zarr.open_group(store, mode="w", zarr_format=3)
    four = g.create_array("four", shape=(3, 2, 2, 5), chunks=(2, 1, 2, 2), dtype="i2", fill_value=-2)
    four[:2] = np.arange(40, dtype="i2").reshape(2, 2, 2, 5)
    g.create_array("empty", shape=(3, 0), chunks=(2, 2), dtype="i1", fill_value=1)
    one = g.create_array("one", shape=(5,), chunks=(2,), dtype="u1", fill_value=4,
                         chunk_key_encoding={"name": "v2", "separator": "/"})
    one[:2] = [8, 9]
    two = g.create_array("two", shape=(3, 3), chunks=(2, 2), dtype="u1", fill_value=4,
                         chunk_key_encoding={"name": "v2", "separator": "/"})
    two[2:, 2:] = 6
    zarr.consolidate_metadata(store)


@pytest.fixture(scope="module")
def www(tmp_path_factory) -> Path:
    import warnings

    root = tmp_path_factory.mktemp("www")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (consolidated v3 metadata, and ZipStore's rewritten members)
        for name in STORES:
            write_store(str(root / f"{name}.zarr"), int(name[1]), compressed=name != "v2plain",
                        consolidated=name[2:] in ("c", "plain"))
        for fmt in (2, 3):
            store = zarr.storage.ZipStore(str(root / f"z{fmt}.zarr.zip"), mode="w")
            write_store(store, fmt)
            store.close()
    for fmt in (2, 3):  # a store whose root is an array: no listing needed, even unconsolidated
        array = zarr.create_array(str(root / f"array{fmt}.zarr"), shape=(5, 3), chunks=(2, 3), dtype="i8",
                                  fill_value=-1, zarr_format=fmt, **_dims(fmt, ["p", "q"]))
        array[:2] = np.arange(6).reshape(2, 3)
    write_huge_store(root / "huge.zarr")
    write_huge_v3_store(root / "huge3.zarr")
    write_key_encodings(str(root / "v3keys.zarr"))
    write_shapes(str(root / "v3shapes.zarr"))
    # a zip whose chunks are DEFLATED (zip -r without -0)
    with zipfile.ZipFile(root / "z2.zarr.zip") as src, zipfile.ZipFile(root / "deflated.zarr.zip", "w",
                                                                        zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
    # a store whose consolidated metadata names keys outside itself, and a file it must never reach
    evil = root / "evil.zarr"
    shutil.copytree(root / "v2c.zarr", evil)
    meta = json.loads((evil / ".zmetadata").read_text())
    array = meta["metadata"]["count/.zarray"]
    for bad in ("../secret/.zarray", "sub/../../secret/.zarray", "/abs/.zarray", "a//b/.zarray"):
        meta["metadata"][bad] = array
    (evil / ".zmetadata").write_text(json.dumps(meta))
    (root / "secret").mkdir()
    (root / "secret" / "0").write_bytes(b"secret")
    evil3 = root / "evil3.zarr"
    shutil.copytree(root / "v3c.zarr", evil3)
    top = json.loads((evil3 / "zarr.json").read_text())
    nodes = top["consolidated_metadata"]["metadata"]
    nodes["../secret"] = nodes["count"]
    nodes["sub/../../secret"] = nodes["count"]
    nodes["/secret"] = nodes["count"]
    (evil3 / "zarr.json").write_text(json.dumps(top))
    return root


LOG_FORMAT = "$request_method $uri $status"


@pytest.fixture(scope="module")
def nginx(www, tmp_path_factory):
    """/idx/: the stores with nginx's autoindex; /: without index pages; /bad/: a missing chunk answered
    403 and another 500."""
    block = (f"root {www}; location /idx/ {{ alias {www}/; autoindex on; }} "
             f"location /bad/ {{ alias {www}/; }} "
             "location = /bad/v2c.zarr/temp/1.0 { return 403; } location = /bad/v2c.zarr/temp/1.1 { return 500; }")
    with Nginx(tmp_path_factory.mktemp("nginx"), block, LOG_FORMAT) as server:
        yield server


@pytest.fixture(scope="module")
def s3(www):
    with bucket_of(www) as options:
        yield options


def access_log(nginx) -> list[str]:
    return (nginx.root / "logs" / "access.log").read_text().splitlines()


def source_url(where: str, name: str, nginx, s3, www: Path | None = None) -> tuple[str, list[str]]:
    """(url, mount options) of a store served from `where` (or the local directory)."""
    if where == "local":
        return str(www / name), []
    if where == "s3":
        return f"s3://stores/{name}", ["--remote-options", json.dumps(s3)]

    return f"{nginx.url}/{'idx/' if where == 'index' else ''}{name}", []


def assert_same_datasets(mounted: Path, store, group: str | None = None) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (xarray's note on unconsolidated stores)
        with xr.open_zarr(str(mounted), group=group, consolidated=None) as got, \
                xr.open_zarr(store, group=group, consolidated=None) as want:
            assert sorted(got.variables) == sorted(want.variables)
            xr.testing.assert_identical(got.load(), want.load())


CASES = [("http", "v2c"), ("http", "v3c"), ("index", "v2u"), ("index", "v3u"),
         ("s3", "v2c"), ("s3", "v2u"), ("s3", "v3c"), ("s3", "v3u"), ("local", "v2c"), ("local", "v2u")]


@pytest.mark.parametrize("where,name", CASES, ids=[f"{w}-{n}" for w, n in CASES])
def test_xarray_on_the_mount_equals_xarray_on_the_store(mount, www, nginx, s3, where, name):
    url, args = source_url(where, f"{name}.zarr", nginx, s3, www)
    m = mount(url, "--view", "raw", *args)
    assert_same_datasets(m.path, str(www / f"{name}.zarr"))
    assert_same_datasets(m.path, str(www / f"{name}.zarr"), "sub")
    # the chunks the store lacks are not there (one request each, then remembered)
    assert not os.path.exists(m.path / "temp" / ("c/1/0" if name.startswith("v3") else "1.0"))


def store_values(store) -> dict[str, np.ndarray]:
    group = zarr.open_group(store, mode="r")
    return {path: np.asarray(array[...]) for path, array in group.arrays()} | \
        {f"sub/{path}": np.asarray(array[...]) for path, array in group["sub"].arrays()}


@pytest.mark.parametrize("where,name", [("http", "v3c"), ("index", "v3u"), ("s3", "v3c"), ("s3", "v2c")])
def test_ncdump_of_the_decoded_view_reads_what_zarr_reads(mount, www, nginx, s3, where, name):
    """Debian's ncdump has no filters and reads no Zarr v3: the decoded view's values (zstd, blosc,
    shards, missing chunks and shards) against zarr-python's."""
    url, args = source_url(where, f"{name}.zarr", nginx, s3)
    m = mount(url, *args)
    dumped = parse_ncdump(ncdump(nczarr_url(m.path)))
    for path, values in store_values(str(www / f"{name}.zarr")).items():
        fill = zarr.open_array(str(www / f"{name}.zarr"), path=path, mode="r").fill_value
        compare_dumped(dumped[path], values.astype(values.dtype.newbyteorder("<")), [fill], f"ncdump {name} {path}")


def _declarations(dump: str) -> list[str]:
    """The dump's lines but its first (the dataset's name, from its path), its values, and _FillValue
    attributes (the decoded view declares the Zarr fill_value as the netCDF _FillValue, which netCDF-C
    reading a Zarr store itself does not: docs/views-and-clients.md)."""
    lines, data = [], False
    for line in dump.splitlines()[1:]:
        data = data or line.strip() == "data:"
        if data and not line.strip().startswith(("group:", "variables:", "}", "data:")) and "(" not in line:
            continue
        if ":_FillValue" not in line:
            lines.append(line)
    return lines


@pytest.mark.parametrize("where", ["http", "s3", "local"])
def test_ncdump_of_the_decoded_view_equals_ncdump_of_the_store(mount, www, nginx, s3, where):
    """An uncompressed Zarr v2 store, which Debian's netCDF-C reads itself: the same dimensions, variables,
    groups and values, missing chunks included (which the decoded view marks as its declared fill)."""
    url, args = source_url(where, "v2plain.zarr", nginx, s3, www)
    m = mount(url, *args)
    own = ncdump(f"file://{www / 'v2plain.zarr'}#mode=zarr,file")
    mine = ncdump(nczarr_url(m.path))
    assert _declarations(mine) == _declarations(own)
    own_values, mine_values = parse_ncdump(own), parse_ncdump(mine)
    assert sorted(own_values) == sorted(mine_values) == ["count", "sub/z", "temp"]
    for path, values in store_values(str(www / "v2plain.zarr")).items():
        fill = zarr.open_array(str(www / "v2plain.zarr"), path=path, mode="r").fill_value
        expected = own_values[path].array(values.shape, values.dtype, None)
        np.testing.assert_array_equal(expected, values)
        compare_dumped(mine_values[path], expected, [fill], f"ncdump {path}")


@pytest.mark.parametrize("name", ["v2c", "v3c", "v3u"])
def test_ncdump_header_makes_no_request_after_the_mount(mount, nginx, name):
    start = len(access_log(nginx))
    m = mount(f"{nginx.url}/idx/{name}.zarr").wait_announced()
    time.sleep(0.3)
    before = access_log(nginx)
    at_mount = [line.split()[1].rpartition("/")[2] for line in before[start:]]
    if name.endswith("c"):  # consolidated: the metadata in one document, after a probe for v3's
        assert at_mount == (["zarr.json", ".zmetadata"] if name == "v2c" else ["zarr.json"]), at_mount
    else:  # node by node: metadata documents and index pages, never a chunk
        assert all(n in ("zarr.json", "") for n in at_mount), at_mount
    header = subprocess.run([*NCDUMP, "-h", nczarr_url(m.path)], capture_output=True, text=True, timeout=60)
    assert header.returncode == 0, header.stderr
    assert "temp(y, x)" in header.stdout and "group: sub" in header.stdout
    time.sleep(0.3)
    assert access_log(nginx)[len(before):] == []


def test_a_missing_chunk_is_asked_for_once(mount, nginx):
    m = mount(f"{nginx.url}/v2c.zarr", "--view", "raw")
    before = len(access_log(nginx))
    for _ in range(3):
        with pytest.raises(FileNotFoundError):
            open(m.path / "temp" / "1.1", "rb")
    asked = [line for line in access_log(nginx)[before:] if "/v2c.zarr/temp/1.1" in line]
    assert len(asked) == 1 and asked[0].endswith(" 404"), asked


def test_a_refused_chunk_is_an_error_never_the_fill_value(mount, nginx):
    """403 and 500 for chunks the store lacks: EIO in both views, never fill."""
    raw = mount(f"{nginx.url}/bad/v2c.zarr", "--view", "raw", "--read-timeout", "2")
    for key in ("temp/1.0", "temp/1.1"):
        with pytest.raises(OSError) as e:
            os.stat(raw.path / key)
        assert e.value.errno == errno.EIO, key
    assert "HTTP 403" in raw.log()
    decoded = mount(f"{nginx.url}/bad/v2c.zarr", "--read-timeout", "2")
    proc = subprocess.run([*NCDUMP, "-v", "temp", nczarr_url(decoded.path)], capture_output=True, text=True,
                          timeout=120)
    # (the rows that are there, then the error: no fill where the server refused)
    assert proc.returncode != 0 and "Input/output error" in proc.stderr, proc.stderr
    assert "_" not in proc.stdout.partition("temp =")[2], proc.stdout
    with pytest.raises(OSError) as e:
        (decoded.path / "temp" / "1.0").read_bytes()
    assert e.value.errno == errno.EIO


@pytest.mark.parametrize("fmt", [2, 3])
def test_an_unconsolidated_root_array_needs_no_listing(mount, www, nginx, fmt):
    m = mount(f"{nginx.url}/array{fmt}.zarr", "--view", "raw")
    got = zarr.open_array(str(m.path), mode="r")
    want = zarr.open_array(str(www / f"array{fmt}.zarr"), mode="r")
    np.testing.assert_array_equal(got[...], want[...])
    assert (got[...][2:] == -1).all()  # (chunks the store lacks)


def test_an_unconsolidated_group_without_index_pages_is_refused_in_one_line(tmp_path, nginx):
    line = refusal_line(f"{nginx.url}/v3u.zarr", tmp_path / "mnt")
    assert "no consolidated metadata" in line and "index" in line and "/v3u.zarr" in line


@pytest.mark.parametrize("name", ["evil.zarr", "evil3.zarr"])
@pytest.mark.parametrize("where", ["http", "s3"])
def test_keys_from_the_metadata_stay_inside_the_store(mount, nginx, s3, where, name):
    """Keys with '..', a leading '/' or an empty segment are left out (one log line each); every request
    the mount makes is for a url under the store's own."""
    url, args = source_url(where, name, nginx, s3)
    before = len(access_log(nginx))
    m = mount(url, "--view", "raw", *args)
    for dirpath, _, files in os.walk(m.path):
        for file in files:
            try:
                (Path(dirpath) / file).read_bytes()
            except FileNotFoundError:
                pass  # (a chunk the store lacks)
    assert "secret" not in {p.name for p in m.path.rglob("*")}
    assert m.log().count("left out") >= 3
    if where == "http":
        paths = [line.split()[1] for line in access_log(nginx)[before:]]
        assert paths and all(p.startswith(f"/{name}/") or p == f"/{name}" for p in paths), paths


ZIP_CASES = [("local", 2), ("local", 3), ("http", 2), ("http", 3), ("s3", 2), ("s3", 3)]


@pytest.mark.parametrize("where,fmt", ZIP_CASES, ids=[f"{w}-v{f}" for w, f in ZIP_CASES])
def test_a_zipped_store_equals_zarr_on_the_store(mount, www, nginx, s3, where, fmt):
    name = f"z{fmt}.zarr.zip"
    url, args = source_url(where, name, nginx, s3, www)
    m = mount(url, "--view", "raw", *args)
    store = zarr.storage.ZipStore(str(www / name), mode="r")
    try:
        want = store_values(store)
        got = store_values(str(m.path))
        assert sorted(got) == sorted(want)
        for path in want:
            np.testing.assert_array_equal(got[path], want[path], err_msg=path)
        with xr.open_zarr(store, consolidated=True) as a, xr.open_zarr(str(m.path), consolidated=True) as b:
            xr.testing.assert_identical(b.load(), a.load())
    finally:
        store.close()
    # the decoded view: netCDF-C reads the same values
    d = mount(url, *args)
    dumped = parse_ncdump(ncdump(nczarr_url(d.path)))
    store = zarr.storage.ZipStore(str(www / name), mode="r")
    try:
        group = zarr.open_group(store, mode="r")
        for path, values in store_values(store).items():
            compare_dumped(dumped[path], values.astype(values.dtype.newbyteorder("<")), [group[path].fill_value],
                           f"ncdump {name} {path}")
    finally:
        store.close()


def test_a_deflated_chunk_refuses_the_mount_in_one_line(tmp_path, www):
    line = refusal_line(www / "deflated.zarr.zip", tmp_path / "mnt")
    # (the first chunk in the zip: zarr writes chunks concurrently, in no fixed order)
    assert "deflated.zarr.zip" in line and "DEFLATED" in line
    assert re.search(r"member '(temp/\d\.\d|count/\d|sub/z/\d)' is DEFLATED", line), line


def test_inspect_names_the_format(www, nginx):
    result = run_refmount("inspect", f"{nginx.url}/idx/v3u.zarr", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "format: Zarr v3 store over http (metadata walked node by node, HTML index pages" in result.stdout
    assert "chunks not listed" in result.stdout
    zipped = run_refmount("inspect", "--json", www / "z2.zarr.zip", timeout=120)
    rows = json.loads(zipped.stdout)
    assert rows and all(row["format"].startswith("zipped Zarr v2 store") for row in rows)


def test_zip_member_names_outside_the_store_are_left_out(mount, tmp_path, www):
    """Members named '../x', '/x' or 'a//b' never become keys (one log line each); the rest mounts."""
    hostile = tmp_path / "hostile.zarr.zip"
    with zipfile.ZipFile(www / "z2.zarr.zip") as src, zipfile.ZipFile(hostile, "w") as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
        for name in ("../../escape", "temp/../../escape", "a//b"):
            out.writestr(zipfile.ZipInfo(name), b"x")
    m = mount(hostile, "--view", "raw")
    names = {str(p.relative_to(m.path)) for p in m.path.rglob("*")}
    assert "temp/0.0" in names and not any("escape" in n or n.startswith("a") for n in names), names
    assert m.log().count("left out") == 3


def test_an_oversized_metadata_document_is_refused_in_one_line(tmp_path, www, nginx):
    """A .zmetadata past 64 MiB: read no further than that, and refused naming its url."""
    big = www / "big.zarr"
    big.mkdir(exist_ok=True)
    with open(big / ".zmetadata", "wb") as f:
        f.write(b'{"metadata": {}, "padding": "')
        f.truncate((64 << 20) + 100)
    line = refusal_line(f"{nginx.url}/big.zarr", tmp_path / "mnt")
    assert "big.zarr/.zmetadata" in line and "larger than 64 MiB" in line, line


def _rss(pid: int) -> int:
    """A process's resident memory in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_store_of_ten_million_chunks_mounts_without_listing_them(mount, www, nginx):
    """Chunk keys come from the grid and are not stored: the load takes well under 2 s and the daemon
    no more memory than a small store's; written chunks read right, the others as fill; a listing of
    the array's directory ends (bounded)."""
    from refmount.refs.zarrremote import ZarrStoreRefSet, load_remote_store

    started = time.monotonic()
    refset = load_remote_store(f"{nginx.url}/huge.zarr")
    assert time.monotonic() - started < 2
    assert isinstance(refset, ZarrStoreRefSet) and refset.capacity > HUGE_SHAPE[0] and not refset.urls
    small = mount(f"{nginx.url}/v2c.zarr", "--view", "raw").wait_announced()
    m = mount(f"{nginx.url}/huge.zarr", "--view", "raw").wait_announced()
    assert _rss(m.proc.pid) - _rss(small.proc.pid) < 100 << 20
    tas = zarr.open_group(str(m.path), mode="r")["tas"]
    for t in HUGE_WRITTEN:
        np.testing.assert_array_equal(tas[t], np.full(HUGE_CHUNKS[1:], t % 1000, "f4"))
    np.testing.assert_array_equal(tas[6, :2, :3], np.full((2, 3), -1.0, "f4"))
    assert os.stat(m.path / "tas" / "5.0.0").st_size > 0
    with pytest.raises(FileNotFoundError):
        os.stat(m.path / "tas" / "7.0.0")  # (a chunk the store lacks: one 404)
    with pytest.raises(FileNotFoundError):
        os.stat(m.path / "tas" / f"{HUGE_SHAPE[0]}.0.0")  # (outside the grid: no request)
    started = time.monotonic()
    names = os.listdir(m.path / "tas")
    assert time.monotonic() - started < 60
    assert ".zarray" in names and "0.0.0" in names and len(names) <= ZarrStoreRefSet.MAX_LISTED + 2
    assert "listing the first" in m.log()
    # the decoded view: netCDF-C's header, with no request for a chunk
    decoded_header_asks_nothing(mount, nginx, "huge.zarr", "float tas(time, lat, lon)", "time = 10000000")


def decoded_header_asks_nothing(mount, nginx, name: str, *expected: str):
    """A decoded mount of nginx's `name` whose `ncdump -h` says each of `expected` and makes no
    request (nginx's log); the mount."""
    d = mount(f"{nginx.url}/{name}").wait_announced()
    before = len(access_log(nginx))
    header = subprocess.run([*NCDUMP, "-h", nczarr_url(d.path)], capture_output=True, text=True, timeout=60)
    assert header.returncode == 0, header.stderr
    assert all(text in header.stdout for text in expected), header.stdout
    time.sleep(0.3)
    assert access_log(nginx)[before:] == []
    return d


@pytest.mark.parametrize("where", ["http", "s3"])
def test_a_lazy_store_reads_alike_in_both_views(mount, www, nginx, s3, where):
    """A store whose chunk keys are computed (v2, chunks in the array's directory), over nginx and moto's
    S3: xarray reads the same values in the decoded view as in the store (missing chunks as fill), and
    the huge store's written and missing chunks read right."""
    url, args = source_url(where, "v2c.zarr", nginx, s3)
    decoded = mount(url, *args)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for group in (None, "sub"):
            with xr.open_zarr(str(decoded.path), group=group) as got, \
                    xr.open_zarr(str(www / "v2c.zarr"), group=group) as want:
                xr.testing.assert_equal(got.load(), want.load())
    url, args = source_url(where, "huge.zarr", nginx, s3)
    raw = mount(url, "--view", "raw", *args)
    tas = zarr.open_group(str(raw.path), mode="r")["tas"]
    np.testing.assert_array_equal(tas[HUGE_WRITTEN[1], :2, :2], np.full((2, 2), HUGE_WRITTEN[1] % 1000, "f4"))
    np.testing.assert_array_equal(tas[3, :2, :2], np.full((2, 2), -1.0, "f4"))


# -- Zarr v3 stores: chunk keys and their directories computed from the grids ---------------------------------

def _walk_files(root: Path) -> set[str]:
    return {str((Path(d) / f).relative_to(root)) for d, _, files in os.walk(root) for f in files}


@pytest.mark.parametrize("where", ["http", "s3"])
def test_v3_chunk_key_encodings_read_alike_in_both_views(mount, www, nginx, s3, where):
    """v2's "0.1" and "0/1/0", default "c.0.1" and "c/0/1", a scalar's "c": zarr-python and xarray read
    the raw view as the store, netCDF-C the decoded view; a listing shows every chunk of the grid,
    written or not, in the directories the keys imply (a missing one: not found when opened)."""
    store = str(www / "v3keys.zarr")
    url, args = source_url(where, "v3keys.zarr", nginx, s3)
    raw = mount(url, "--view", "raw", *args)
    assert_same_datasets(raw.path, store)
    got, want = store_values_flat(str(raw.path)), store_values_flat(store)
    assert sorted(got) == sorted(want) == ["cdot", "scalar", "v2dot", "v2slash"]
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg=path)
    listed = _walk_files(raw.path)
    grid = {f"v2dot/{i}.{j}" for i in range(3) for j in range(2)} | \
        {f"v2slash/{i}/{j}/{k}" for i in range(2) for j in range(2) for k in range(2)} | \
        {f"cdot/c.{i}.{j}" for i in range(2) for j in range(2)} | {"scalar/c"}
    assert listed == grid | {"zarr.json", *(f"{a}/zarr.json" for a in want)}, listed ^ grid
    assert os.path.isdir(raw.path / "v2slash" / "1" / "1") and not os.path.exists(raw.path / "v2slash" / "2")
    with pytest.raises(FileNotFoundError):
        (raw.path / "v2slash" / "1" / "0" / "0").read_bytes()  # (listed, but the store lacks it)
    decoded = mount(url, *args)
    dumped = parse_ncdump(ncdump(nczarr_url(decoded.path)))
    for path, values in want.items():
        fill = zarr.open_array(store, path=path, mode="r").fill_value
        compare_dumped(dumped[path], values.astype(values.dtype.newbyteorder("<")), [fill], f"ncdump {path}")


def store_values_flat(store) -> dict[str, np.ndarray]:
    return {path: np.asarray(array[...]) for path, array in zarr.open_group(store, mode="r").arrays()}


def test_v3_nested_chunk_directories_list_as_the_store_does(mount, www, nginx):
    """The raw view of a v3 store lists "c/0/1" as directories "c", "c/0" holding "1", as the store's
    own tree, plus the chunks it lacks; a directory's ".." is its parent."""
    m = mount(f"{nginx.url}/v3c.zarr", "--view", "raw")
    assert sorted(os.listdir(m.path / "temp")) == ["c", "zarr.json"]
    assert sorted(os.listdir(m.path / "temp" / "c")) == ["0", "1"]
    assert sorted(os.listdir(m.path / "temp" / "c" / "1")) == ["0", "1"]
    assert os.stat(m.path / "temp" / "c" / "1" / "..").st_ino == os.stat(m.path / "temp" / "c").st_ino
    assert os.stat(m.path / "temp" / "c" / "..").st_ino == os.stat(m.path / "temp").st_ino
    own = _walk_files(www / "v3c.zarr")
    assert own <= _walk_files(m.path), own - _walk_files(m.path)
    for key in sorted(own):
        assert (m.path / key).read_bytes() == (www / "v3c.zarr" / key).read_bytes() or key.endswith("zarr.json"), key
    for bad in ("temp/c/2", "temp/c/x", "temp/c/0/0/0", "temp/c/0/2", "temp/d"):
        assert not os.path.exists(m.path / bad), bad


def test_a_v3_store_of_a_million_chunks_mounts_without_listing_them(mount, www, nginx):
    """A million chunks in nested "c/t/0/0" keys, and a sharded array of a million inner chunks: the
    load computes neither keys nor directories (no url interned, memory as a small store's); written
    chunks read right in both views, the others as the fill value (one 404 each); a listing ends
    (the directories of the first 10,000 chunks); ncdump -h makes no request."""
    from refmount.refs.zarrremote import ZarrStoreRefSet, load_remote_store

    refset = load_remote_store(f"{nginx.url}/huge3.zarr")
    assert isinstance(refset, ZarrStoreRefSet) and refset.chunk_end > HUGE3_SHAPE[0] and not refset.urls
    assert refset.find("tas/c/5/0/0") >= 0 and refset.find(f"tas/c/{HUGE3_SHAPE[0]}/0/0") < 0
    small = mount(f"{nginx.url}/v3c.zarr", "--view", "raw").wait_announced()
    m = mount(f"{nginx.url}/huge3.zarr", "--view", "raw").wait_announced()
    assert _rss(m.proc.pid) - _rss(small.proc.pid) < 100 << 20
    group = zarr.open_group(str(m.path), mode="r")
    for t in HUGE3_WRITTEN:
        np.testing.assert_array_equal(group["tas"][t], np.full(HUGE3_CHUNKS[1:], t % 1000, "f4"))
    np.testing.assert_array_equal(group["tas"][6, :2, :3], np.full((2, 3), -1.0, "f4"))
    for t in HUGE3_SHARDED["written"]:
        np.testing.assert_array_equal(group["sharded"][t], np.arange(10, dtype="i2") + t % 100)
    np.testing.assert_array_equal(group["sharded"][HUGE3_SHARDED["written"][0] + 1], np.full(10, -5, "i2"))
    np.testing.assert_array_equal(group["sharded"][500_000], np.full(10, -5, "i2"))  # (a shard the store lacks)
    assert os.stat(m.path / "tas" / "c" / "5" / "0" / "0").st_size > 0
    before = len(access_log(nginx))
    for _ in range(2):
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "tas" / "c" / "7" / "0" / "0")  # (a chunk the store lacks: one 404)
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "tas" / "c" / str(HUGE3_SHAPE[0]) / "0" / "0")  # (outside the grid: no request)
    asked = [line for line in access_log(nginx)[before:] if "/huge3.zarr/tas/c/" in line]
    assert [line.partition(" ")[2] for line in asked] == ["/huge3.zarr/tas/c/7/0/0 404"], asked
    listed = os.listdir(m.path / "tas" / "c")
    assert len(listed) == ZarrStoreRefSet.MAX_LISTED and "0" in listed and "9999" in listed and "10000" not in listed
    assert os.listdir(m.path / "tas" / "c" / "999999") == ["0"]  # (unlisted, found by its name: its own entries)
    assert os.listdir(m.path / "tas" / "c" / "999999" / "0") == ["0"]
    assert "listing the first" in m.log()
    # the decoded view: netCDF-C's header with no request, and xarray's values
    d = decoded_header_asks_nothing(mount, nginx, "huge3.zarr", "float tas(time, lat, lon)", "time = 1000000 ;")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_zarr(str(d.path), consolidated=True, mask_and_scale=False) as ds:
            np.testing.assert_array_equal(ds["tas"][HUGE3_WRITTEN[1], :2, :2].values,
                                          np.full((2, 2), HUGE3_WRITTEN[1] % 1000, "f4"))
            np.testing.assert_array_equal(ds["tas"][6, :2, :2].values, np.full((2, 2), -1.0, "f4"))
            np.testing.assert_array_equal(ds["sharded"][HUGE3_SHARDED["written"][1]].values,
                                          np.arange(10, dtype="i2") + HUGE3_SHARDED["written"][1] % 100)
            np.testing.assert_array_equal(ds["sharded"][500_000].values, np.full(10, -5, "i2"))


def test_v3_grid_directories_hold_every_chunk_of_the_grid(mount, www, nginx):
    """A walk of the raw view finds every chunk key of each grid (ArrayMeta.chunk_keys: the keys zarr
    writes) in the directories they imply, and nothing else; zarr-python reads the same values."""
    from refmount.refs.arraymeta import ArrayMeta

    store = www / "v3shapes.zarr"
    m = mount(f"{nginx.url}/v3shapes.zarr", "--view", "raw")
    want = {"zarr.json"}
    for name in ("four", "empty", "one", "two"):
        meta = ArrayMeta.from_zarr_json(json.loads((store / name / "zarr.json").read_text()))
        want |= {f"{name}/zarr.json", *meta.chunk_keys(f"{name}/")}
    assert _walk_files(m.path) == want, _walk_files(m.path) ^ want
    got, expected = store_values_flat(str(m.path)), store_values_flat(str(store))
    assert sorted(got) == sorted(expected)
    for path in expected:
        np.testing.assert_array_equal(got[path], expected[path], err_msg=path)


V3_DECODED = [("http", "v3c"), ("index", "v3u"), ("s3", "v3u")]


@pytest.mark.parametrize("where,name", V3_DECODED, ids=[f"{w}-{n}" for w, n in V3_DECODED])
def test_xarray_on_the_decoded_view_of_a_v3_store_equals_the_store(mount, www, nginx, s3, where, name):
    """The decoded view's Zarr v2 form of a v3 store, computed from the grids (sharded, zstd, blosc,
    missing chunks and shards): xarray reads the values xarray reads from the store."""
    import warnings

    url, args = source_url(where, f"{name}.zarr", nginx, s3)
    decoded = mount(url, *args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for group in (None, "sub"):
            with xr.open_zarr(str(decoded.path), group=group, consolidated=None) as got, \
                    xr.open_zarr(str(www / f"{name}.zarr"), group=group, consolidated=None) as want:
                assert sorted(got.variables) == sorted(want.variables)
                xr.testing.assert_equal(got.load(), want.load())

def test_an_unconsolidated_store_whose_index_page_answers_503_is_unavailable_not_unlistable(tmp_path):
    """A Zarr v2 store without consolidated metadata is walked through its server's index pages. One that
    answers 503 is a server down for now (a FetchError: a catalog's store item is asked again later), not a
    server without index pages (a refusal for good), which a 404 is."""
    import contextvars

    import zarr

    from refmount.errors import FetchError, RefsError
    from refmount.fetch.retry import RetryPolicy, retry_under
    from refmount.refs import load_refs
    from tests.support.rangeserver import RangeServer

    group = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    group.create_array("a", shape=(4,), chunks=(4,), dtype="i2")[...] = np.arange(4)

    def load():
        retry_under(RetryPolicy(read_timeout=2.0, max_attempts=2))  # (in this context only: no 20 s of retries)
        return load_refs(server.url_for("v2.zarr"), store="zarr", serving=True, load_timeout=None)

    with RangeServer(tmp_path) as server:
        server.fail_paths = {"v2.zarr/": 503}
        with pytest.raises(FetchError, match="cannot list .*503"):
            contextvars.copy_context().run(load)
        server.fail_paths = {}
        with pytest.raises(RefsError, match="gives no index page"):
            contextvars.copy_context().run(load)
