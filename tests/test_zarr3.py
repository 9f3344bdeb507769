"""Zarr v3 codecs through the decoded view: arrays written by zarr-python 3 with each codec, turned into a
kerchunk-style reference set (zarr.json inline, chunk files as byte ranges), mounted, and read back as
Zarr v2 by zarr-python and netCDF4-python; the values must equal what zarr-python wrote."""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pytest

from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump

zarr = pytest.importorskip("zarr")
from zarr.codecs import (  # noqa: E402
    BloscCodec,
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    TransposeCodec,
    ZstdCodec,
)


def v3_reference_set(root) -> dict:
    """Every file under `root` as a reference: zarr.json inline, chunks as [path, 0, size]."""
    refs = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            key = os.path.relpath(path, root)
            if name == "zarr.json":
                refs[key] = open(path).read()
            elif key.startswith("names/"):  # kerchunk inlines strings; the decoded view needs them inline
                refs[key] = "base64:" + base64.b64encode(open(path, "rb").read()).decode()
            else:
                refs[key] = [path, 0, os.path.getsize(path)]
    return {"version": 1, "refs": refs}


@pytest.fixture(scope="module")
def v3_tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("zarr3")
    store_root = root / "store"
    rng = np.random.default_rng(1)
    store = zarr.storage.LocalStore(str(store_root))
    group = zarr.create_group(store, zarr_format=3, attributes={"title": "codecs"})
    base = rng.integers(0, 1000, (10, 12)).astype("f4")
    cube = rng.integers(0, 100, (4, 6, 8)).astype("i2")
    sparse = np.full((8, 8), 5, "i4")
    sparse[:4, :4] = np.arange(16).reshape(4, 4)
    layouts = {
        "gzip_crc": (base, dict(chunks=(4, 5), compressors=[GzipCodec(level=3), Crc32cCodec()])),
        "blosc": (base, dict(chunks=(4, 5), compressors=[BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")])),
        "zstd_big": (base.astype(">i4"), dict(chunks=(3, 12), serializer=BytesCodec(endian="big"),
                                             compressors=[ZstdCodec(level=1, checksum=True)])),
        "fortran": (base, dict(chunks=(4, 5), filters=[TransposeCodec(order=(1, 0))])),
        "permuted": (cube, dict(chunks=(2, 3, 4), filters=[TransposeCodec(order=(1, 2, 0))])),
        "sharded": (base, dict(chunks=(2, 3), shards=(4, 6), compressors=[ZstdCodec()])),
        "sharded_cube": (cube, dict(chunks=(2, 2, 4), shards=(4, 6, 8))),
        "sparse": (sparse, dict(chunks=(4, 4), fill_value=5)),
    }
    expected = {}
    for name, (values, kw) in layouts.items():
        dims = ["y", "x"] if values.ndim == 2 else ["a", "b", "c"]
        if name in ("sparse",):
            dims = ["sy", "sx"]
        array = group.create_array(name, shape=values.shape, dtype=values.dtype, dimension_names=dims, **kw)
        array[...] = values
        expected[name] = values
    names = group.create_array("names", shape=(3,), dtype=str, chunks=(2,), dimension_names=["n"])
    names[...] = np.array(["alpha", "βeta", "g"])
    # a shard index at the start: rewrite one array's shards with zarr-python itself
    start = group.create_array("sharded_start", shape=cube.shape, dtype=cube.dtype, chunks=(2, 2, 4),
                               shards=(4, 6, 8), dimension_names=["a", "b", "c"])
    meta = json.loads((store_root / "sharded_start" / "zarr.json").read_text())
    meta["codecs"][0]["configuration"]["index_location"] = "start"
    (store_root / "sharded_start" / "zarr.json").write_text(json.dumps(meta))
    start = zarr.open_array(zarr.storage.LocalStore(str(store_root)), path="sharded_start", mode="r+")
    start[...] = cube
    expected["sharded_start"] = cube
    # an array with a codec nobody knows
    unknown = dict(json.loads((store_root / "blosc" / "zarr.json").read_text()))
    unknown["codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "mystery"}]
    (store_root / "mystery").mkdir()
    (store_root / "mystery" / "zarr.json").write_text(json.dumps(unknown))
    refs = root / "v3.json"
    refs.write_text(json.dumps(v3_reference_set(store_root)))
    return {"refs": refs, "expected": expected, "store": store_root}


def assert_netcdf_c_reads(m, expected: dict, title: str, store) -> None:
    """Debian's ncdump and netCDF4-python read every array of the decoded view as `expected` (ncdump's
    '_' where the value is the array's fill: the decoded view declares a v3 fill as it does a v2 one)."""
    import netCDF4

    dumped = parse_ncdump(ncdump(nczarr_url(m.path)))
    for name, values in expected.items():
        fill = zarr.open_array(str(store), path=name, mode="r").fill_value
        compare_dumped(dumped[name], values.astype(values.dtype.newbyteorder("<")), [fill], f"ncdump {name}")
    with netCDF4.Dataset(nczarr_url(m.path)) as ds:
        assert ds.title == title
        for name, values in expected.items():
            var = ds[name]
            var.set_auto_maskandscale(False)
            assert np.array_equal(np.asarray(var[...]), values), f"netCDF4 {name}"


def test_decoded_view_of_v3_codecs(mount, v3_tree):
    m = mount(v3_tree["refs"], "--chars", "ubyte")  # (the strings array: a form netCDF4-python opens too)
    assert not os.path.exists(m / "mystery")
    assert "mystery" in m.log()
    expected = v3_tree["expected"]
    for name, values in expected.items():
        array = zarr.open_array(str(m / name), mode="r", zarr_format=2)
        got = array[...]
        assert got.dtype.kind == values.dtype.kind and np.array_equal(got, values), name
        assert json.loads((m / name / ".zattrs").read_text())["_ARRAY_DIMENSIONS"]
    assert_netcdf_c_reads(m, expected, "codecs", v3_tree["store"])


def test_v3_strings(mount, v3_tree):
    """vlen-utf8 strings: fixed-length UTF-8 in the decoded view (--chars string), as they are in raw."""
    decoded = mount(v3_tree["refs"], "--chars", "string")
    got = zarr.open_array(str(decoded / "names"), mode="r", zarr_format=2)[...]
    assert [v.decode() for v in got] == ["alpha", "βeta", "g"]
    raw = mount(v3_tree["refs"], "--view", "raw")
    assert list(zarr.open_array(str(raw / "names"), mode="r")[...]) == ["alpha", "βeta", "g"]


def test_raw_view_of_v3_refs(mount, v3_tree):
    m = mount(v3_tree["refs"], "--view", "raw")
    for name, values in v3_tree["expected"].items():
        assert np.array_equal(zarr.open_array(str(m / name), mode="r")[...], values), name


def test_a_v3_fill_is_the_v2_fill(v3_tree):
    """A v3 fill_value without a _FillValue attribute is the v2 fill_value, as a v2 store's is (the
    decoded view declares it alike): the chunks zarr-python left out stay missing, read as that fill."""
    from refmount.refs import load_refs
    from refmount.view.zarr3 import v2_refset

    v2 = v2_refset(load_refs(str(v3_tree["refs"])))
    zarray = json.loads(v2.inline_data(v2.find("sparse/.zarray")))
    assert zarray["fill_value"] == 5
    assert v2.find("sparse/0.0") >= 0 and all(v2.find(f"sparse/{k}") < 0 for k in ("0.1", "1.0", "1.1"))


def test_a_v3_fill_other_than_its_cf_fill_is_served_as_chunks(tmp_path):
    """A _FillValue attribute that differs from the v3 fill_value (xarray writes both): v2's fill_value is
    the CF one, and the chunks the store lacks are served as explicit chunks of the v3 fill."""
    import numcodecs

    from refmount.refs import load_refs
    from refmount.view.zarr3 import v2_refset

    group = zarr.create_group(str(tmp_path / "store"), zarr_format=3)
    array = group.create_array("a", shape=(8,), chunks=(4,), dtype="i4", fill_value=5,
                               attributes={"_FillValue": -9}, dimension_names=["x"])
    array[:4] = np.arange(4)
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps(v3_reference_set(tmp_path / "store")))
    v2 = v2_refset(load_refs(str(refs)))
    zarray = json.loads(v2.inline_data(v2.find("a/.zarray")))
    assert zarray["fill_value"] == -9
    data = v2.inline_data(v2.find("a/1"))
    for config in reversed(zarray["filters"] or []):
        data = numcodecs.get_codec(dict(config)).decode(data)
    assert np.frombuffer(data, "<i4").tolist() == [5] * 4


# -- sharding: inner chunks in the decoded view ---------------------------------------------------------

SHARDED = {
    # name: (dtype, shape, inner chunks, shards, zarr-python codec arguments, fill, index_location, crc index)
    "end_crc": ("f4", (10, 13), (2, 3), (4, 6), dict(compressors=[ZstdCodec(level=1)]), -9.5, "end", True),
    "start_crc": ("i2", (7, 9, 10), (2, 3, 4), (4, 6, 8),
                  dict(filters=[TransposeCodec(order=(2, 0, 1))], compressors=[GzipCodec(level=3), Crc32cCodec()]),
                  7, "start", True),
    "end_plain_big": (">i4", (9, 11), (3, 4), (6, 8),
                      dict(serializer=BytesCodec(endian="big"),
                           compressors=[BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")]), -1, "end", False),
    "start_fortran": ("f8", (5, 6), (2, 3), (4, 6), dict(filters=[TransposeCodec(order=(1, 0))]), 2.5, "start",
                      False),
    "slash": ("u2", (5, 7), (2, 2), (4, 4), dict(chunk_key_encoding={"name": "v2", "separator": "/"}), 3, "end",
              True),
}


def sharded_values(name, dtype, shape, fill) -> np.ndarray:
    """Values with some inner chunks (and, for the 2-d arrays, a whole shard) left at the fill value."""
    values = (np.arange(int(np.prod(shape))) % 1000).reshape(shape).astype(dtype)
    values[tuple(slice(0, c) for c in SHARDED[name][2])] = fill  # the first inner chunk: empty in its shard
    if name == "end_crc":
        values[4:8, 6:12] = fill  # shard (1, 1): never written
    if name == "end_plain_big":
        values[6:9, 0:8] = fill  # shard (1, 0), at the edge: never written
    return values


def shard_index(path, name) -> np.ndarray:
    """(offset, nbytes) of each inner chunk of a shard file, read independently of refmount."""
    _, _, chunks, shards, _, _, where, crc = SHARDED[name]
    n = int(np.prod([s // c for s, c in zip(shards, chunks)]))
    data = open(path, "rb").read()
    size = 16 * n + 4 * crc
    raw = data[:size] if where == "start" else data[len(data) - size:]
    return np.frombuffer(raw[: 16 * n], "<u8").reshape(n, 2)


@pytest.fixture(scope="module")
def sharded_tree(tmp_path_factory):
    """Sharded Zarr v3 arrays written by zarr-python (index at start and end, with and without its
    crc32c, partial edge shards, empty inner chunks, missing shards, non-zero fills), served over
    loopback HTTP and referenced shard by shard; plus an array with nested sharding."""
    from tests.support.rangeserver import RangeServer

    root = tmp_path_factory.mktemp("sharded")
    store_root = root / "store"
    store = zarr.storage.LocalStore(str(store_root))
    group = zarr.create_group(store, zarr_format=3, attributes={"title": "sharded"})
    for name, (dtype, shape, chunks, shards, kw, fill, where, crc) in SHARDED.items():
        dims = [f"{name}_{k}" for k in range(len(shape))]
        group.create_array(name, shape=shape, dtype=dtype, chunks=chunks, shards=shards, fill_value=fill,
                           dimension_names=dims, **kw)
        meta_path = store_root / name / "zarr.json"
        meta = json.loads(meta_path.read_text())
        config = meta["codecs"][0]["configuration"]
        config["index_location"] = where
        if not crc:
            config["index_codecs"] = [{"name": "bytes", "configuration": {"endian": "little"}}]
        meta_path.write_text(json.dumps(meta))
        array = zarr.open_array(zarr.storage.LocalStore(str(store_root)), path=name, mode="r+")
        array[...] = sharded_values(name, dtype, shape, fill)
    nested = json.loads((store_root / "end_crc" / "zarr.json").read_text())
    outer = nested["codecs"][0]["configuration"]
    outer["codecs"] = [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 3], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
        "index_codecs": outer["index_codecs"], "index_location": "end"}}]
    (store_root / "nested").mkdir()
    (store_root / "nested" / "zarr.json").write_text(json.dumps(nested))
    source = zarr.open_group(zarr.storage.LocalStore(str(store_root)), mode="r")
    expected = {name: source[name][...] for name in SHARDED}
    # what zarr-python wrote: empty inner chunks in the indexes, missing shards
    assert (shard_index(store_root / "end_crc" / "c" / "0" / "0", "end_crc") == 2**64 - 1).any()
    assert not (store_root / "end_crc" / "c" / "1" / "1").exists()
    assert not (store_root / "end_plain_big" / "c" / "1" / "0").exists()
    with RangeServer(store_root) as server:
        refs = v3_reference_set(store_root)
        for key, ref in refs["refs"].items():
            if isinstance(ref, list):
                ref[0] = server.url_for(key)
        path = root / "sharded.json"
        path.write_text(json.dumps(refs))
        yield {"refs": path, "expected": expected, "store": store_root, "server": server, "root": root}


def inner_keys(name) -> list[str]:
    _, shape, chunks, _, kw, *_ = SHARDED[name]
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    sep = "/" if "chunk_key_encoding" in kw else "."
    return [sep.join(map(str, index)) for index in np.ndindex(*grid)]


def chunk_files(directory) -> list[str]:
    return [os.path.relpath(os.path.join(d, n), directory) for d, _, names in os.walk(directory)
            for n in names if not n.startswith(".")]


def test_sharded_decoded_view(mount, sharded_tree):
    """Inner chunks as v2 chunks: metadata, listing and sizes without network; values through zarr,
    Debian's ncdump, netCDF4-python and xarray equal what zarr-python wrote."""
    import xarray as xr

    server = sharded_tree["server"]
    m = mount(sharded_tree["refs"])
    before = server.stats["requests"]
    assert not os.path.exists(m / "nested")
    assert "hiding array nested: unsupported Zarr v3 nested sharding" in m.log()
    assert "array end_crc: Zarr v3 shards of [4, 6] served as their inner chunks (4 per shard)" in m.log()
    consolidated = json.loads((m / ".zmetadata").read_text())["metadata"]
    for name, (dtype, shape, chunks, *_rest) in SHARDED.items():
        zarray = json.loads((m / name / ".zarray").read_text())
        assert zarray["chunks"] == list(chunks) and zarray["shape"] == list(shape), name
        assert zarray["compressor"] is None and zarray["filters"] is None
        assert consolidated[f"{name}/.zarray"] == zarray
        listed = sorted(chunk_files(m / name))
        assert zarray["fill_value"] == SHARDED[name][5], name  # (missing shards' chunks: not listed, read as it)
        assert set(listed) <= set(inner_keys(name)) and len(listed) >= len(inner_keys(name)) - 4, name
        for key in listed:
            assert os.stat(m / name / key).st_size == int(np.prod(chunks)) * np.dtype(dtype).itemsize
    assert server.stats["requests"] == before  # listing and sizes came from the metadata alone
    assert os.getxattr(m / "end_crc" / "0.0", "user.refmount.url").decode().endswith("/end_crc/c/0/0")
    assert "user.refmount.shard" in os.listxattr(m / "end_crc" / "0.0")

    expected = sharded_tree["expected"]
    for name, values in expected.items():
        got = zarr.open_array(str(m / name), mode="r", zarr_format=2)[...]
        assert got.dtype == values.dtype.newbyteorder("<") and np.array_equal(got, values), f"zarr {name}"
    assert_netcdf_c_reads(m, expected, "sharded", sharded_tree["store"])
    opened = xr.open_zarr(m.path, zarr_format=2, mask_and_scale=False)
    for name, values in expected.items():
        np.testing.assert_array_equal(opened[name].values, values, err_msg=f"xarray {name}")


def test_one_inner_chunk_fetches_its_index_and_its_bytes(mount, sharded_tree):
    """Reading an inner chunk fetches the shard's index and that chunk's byte range, nothing more; the
    index is read once per shard; an empty inner chunk reads as the fill without another fetch."""
    server, store = sharded_tree["server"], sharded_tree["store"]
    for name, key, shard in (("end_crc", "1.1", "c/0/0"), ("start_crc", "0.1.1", "c/0/0/0")):
        m = mount(sharded_tree["refs"])
        _, _, chunks, shards, _, fill, where, crc = SHARDED[name]
        shard_file = store / name / shard
        index = shard_index(shard_file, name)
        per = [s // c for s, c in zip(shards, chunks)]
        local = int(np.ravel_multi_index(tuple(int(k) for k in key.split(".")), per))
        offset, nbytes = (int(v) for v in index[local])
        size = os.path.getsize(shard_file)
        index_bytes = 16 * len(index) + 4 * crc
        index_range = (0, index_bytes) if where == "start" else (size - index_bytes, size)
        server.reset_stats()
        data = (m / name / key).read_bytes()
        expected = sharded_tree["expected"][name][tuple(slice(int(k) * c, (int(k) + 1) * c)
                                                        for k, c in zip(key.split("."), chunks))]
        assert data == np.ascontiguousarray(expected).astype(expected.dtype.newbyteorder("<")).tobytes()
        log = server.stats["log"]
        ranges = [r for method, _, r in log if method == "GET"]
        assert all(path == f"/{name}/{shard}" for _, path, _ in log), log
        assert sorted(ranges) == sorted([f"bytes={index_range[0]}-{index_range[1] - 1}",
                                         f"bytes={offset}-{offset + nbytes - 1}"]), ranges
        # the empty first inner chunk of the same shard: the fill, from the cached index alone
        first = ".".join("0" * len(chunks))
        empty = (m / name / first).read_bytes()
        assert np.array_equal(np.frombuffer(empty, np.dtype(sharded_tree["expected"][name].dtype).newbyteorder("<")),
                              np.full(int(np.prod(chunks)), fill))
        assert len([1 for method, *_ in server.stats["log"] if method == "GET"]) == 2
        assert m.stats()["decoded"]["shard_index_reads"] == 1
        m.stop()


def test_raw_view_serves_shards(mount, sharded_tree):
    m = mount(sharded_tree["refs"], "--view", "raw")
    assert sorted(os.listdir(m / "end_crc" / "c" / "0")) == ["0", "1", "2"]
    shard = sharded_tree["store"] / "end_crc" / "c" / "0" / "0"
    assert (m / "end_crc" / "c" / "0" / "0").read_bytes() == shard.read_bytes()
    for name, values in sharded_tree["expected"].items():
        assert np.array_equal(zarr.open_array(str(m / name), mode="r")[...], values), name


def test_broken_shards_are_eio(mount, sharded_tree, tmp_path):
    """A shard whose index fails its crc32c, a truncated shard, and an index pointing past its shard
    read as EIO with a log line; the intact shards still read."""
    store = sharded_tree["store"]
    refs = v3_reference_set(store)["refs"]
    broken = tmp_path / "broken"
    broken.mkdir()

    def replace(key: str, data: bytes) -> None:
        path = broken / key.replace("/", "_")
        path.write_bytes(data)
        refs[key] = [str(path), 0, len(data)]

    crc_shard = bytearray((store / "end_crc/c/0/1").read_bytes())
    crc_shard[-10] ^= 0x01  # inside the index, before its checksum
    replace("end_crc/c/0/1", bytes(crc_shard))
    replace("end_crc/c/1/0", (store / "end_crc/c/1/0").read_bytes()[:-30])  # truncated: index cut
    plain = bytearray((store / "start_fortran/c/0/0").read_bytes())  # index at the start, no crc
    plain[8:16] = (len(plain) + 100).to_bytes(8, "little")  # nbytes of inner chunk 0 runs past the shard
    replace("start_fortran/c/0/0", bytes(plain))
    m = mount({"version": 1, "refs": refs})
    for name, key in (("end_crc", "0.2"), ("end_crc", "2.0"), ("start_fortran", "0.0")):
        assert os.stat(m / name / key).st_size > 0  # sizes are still known
        with pytest.raises(OSError) as e:
            (m / name / key).read_bytes()
        assert e.value.errno == 5, (name, key)
    log = m.log()
    assert "fails its CRC-32C checksum" in log and "points past the shard" in log
    got = np.frombuffer((m / "end_crc" / "0.1").read_bytes(), "<f4")
    assert np.array_equal(got, sharded_tree["expected"]["end_crc"][0:2, 3:6].ravel())


def test_shard_index_checks():
    """The index rules without a mount: both byte orders, the checksum, entries half empty or past the
    shard, and index codecs that are not a fixed-size index."""
    import numcodecs

    from refmount.view.shards import EMPTY, ShardError, ShardLayout, UnsupportedSharding
    from refmount.view.zarr3 import Unsupported, sharding

    big = ShardLayout("a", [4], [4], [2], [{"name": "bytes", "configuration": {"endian": "big"}}], "start")
    assert big.index_bytes == 32 and not big.crc
    index = big.decode_index(np.array([[32, 8], [EMPTY, EMPTY]], ">u8").tobytes(), 40, "a/0")
    assert index.tolist() == [[32, 8], [EMPTY, EMPTY]]
    for entries in ([[32, 9], [EMPTY, EMPTY]], [[EMPTY, 8], [32, 8]], [[2**63, 2**63], [32, 8]]):
        with pytest.raises(ShardError, match="points past"):
            big.decode_index(np.array(entries, ">u8").tobytes(), 40, "a/0")
    crc = ShardLayout("a", [4], [4], [2], [{"name": "bytes"}, {"name": "crc32c"}], "end")
    body = np.array([[0, 8], [8, 8]], "<u8").tobytes()
    good = bytes(numcodecs.get_codec({"id": "crc32c"}).encode(body))
    assert crc.decode_index(good, 52, "a/0").tolist() == [[0, 8], [8, 8]]
    with pytest.raises(ShardError, match="CRC-32C"):
        crc.decode_index(good[:3] + b"\x01" + good[4:], 52, "a/0")
    with pytest.raises(ShardError, match="truncated"):
        crc.index_range(20, "a/0")
    for codecs in ([{"name": "crc32c"}], [{"name": "bytes"}, {"name": "gzip"}]):
        with pytest.raises(UnsupportedSharding):
            ShardLayout("a", [4], [4], [2], codecs, "end")
    with pytest.raises(UnsupportedSharding):
        ShardLayout("a", [5], [5], [2], [{"name": "bytes"}], "end")  # not a whole number of inner chunks
    with pytest.raises(UnsupportedSharding):
        ShardLayout("a", [5], [0], [2], [{"name": "bytes"}], "end")
    with pytest.raises(Unsupported, match="after sharding"):
        sharding([{"name": "sharding_indexed", "configuration": {}}, {"name": "gzip"}])


def test_absurd_sharding_hides_the_array():
    from refmount.refs.arraymeta import ArrayMeta
    from refmount.view.zarr3 import MAX_INNER_CHUNKS, Unsupported, shard_layout

    meta = {"chunk_grid": {"configuration": {"chunk_shape": [10**6, 10**6]}},
            "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 1],
                                                                     "codecs": [{"name": "bytes"}]}}]}
    zarray = {"dtype": "<f4", "shape": [10**6, 10**6], "chunks": [1, 1]}
    with pytest.raises(Unsupported, match=f"more than the decoded view lists \\({MAX_INNER_CHUNKS:,}\\)"):
        shard_layout("a", ArrayMeta.from_zarr_json(meta), ArrayMeta.from_zarray(zarray))
