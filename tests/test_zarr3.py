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


def test_decoded_view_of_v3_codecs(mount, v3_tree):
    import netCDF4

    m = mount(v3_tree["refs"], "--chars", "ubyte")  # (the strings array: a form netCDF4-python opens too)
    assert not os.path.exists(m / "mystery")
    assert "mystery" in m.log()
    expected = v3_tree["expected"]
    for name, values in expected.items():
        array = zarr.open_array(str(m / name), mode="r", zarr_format=2)
        got = array[...]
        assert got.dtype.kind == values.dtype.kind and np.array_equal(got, values), name
        assert json.loads((m / name / ".zattrs").read_text())["_ARRAY_DIMENSIONS"]
    dumped = parse_ncdump(ncdump(nczarr_url(m.path)))
    for name, values in expected.items():
        compare_dumped(dumped[name], values.astype(values.dtype.newbyteorder("<")), [], f"ncdump {name}")
    with netCDF4.Dataset(nczarr_url(m.path)) as ds:
        assert ds.title == "codecs"
        for name, values in expected.items():
            var = ds[name]
            var.set_auto_maskandscale(False)
            assert np.array_equal(np.asarray(var[...]), values), f"netCDF4 {name}"


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


def test_missing_chunks_keep_the_v3_fill(v3_tree):
    """A v3 fill_value that is not a CF _FillValue: v2 shows no fill, and the chunk zarr-python left out
    is served as an explicit chunk of the v3 fill."""
    from refmount.refs import load_refs
    from refmount.zarr3 import v2_refset

    v2 = v2_refset(load_refs(str(v3_tree["refs"])))
    zarray = json.loads(v2.inline_data(v2.find("sparse/.zarray")))
    assert zarray["fill_value"] is None
    assert all(v2.find(f"sparse/{k}") >= 0 for k in ("0.0", "0.1", "1.0", "1.1"))
