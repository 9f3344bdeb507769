"""The one array model (refmount.refs.arraymeta): chunk grids and keys of Zarr v2 and v3 metadata, checked
against the keys zarr-python itself writes."""

from __future__ import annotations

import pytest

from refmount.refs.arraymeta import ArrayMeta, ArrayMetaError


def test_v2_grid_and_keys():
    meta = ArrayMeta.from_zarray({"shape": [365, 512, 512], "chunks": [1, 64, 64], "dtype": "<f4"})
    assert meta.grid() == (365, 8, 8) and meta.nchunks() == 365 * 64
    assert meta.chunk_key((3, 0, 7)) == "3.0.7"
    assert meta.parse_chunk_key("3.0.7") == (3, 0, 7)
    for bad in ("3.0", "3.0.7.1", "3/0/7", "a.0.7", "c/3/0/7", "3.0.-1"):
        assert meta.parse_chunk_key(bad) is None
    slash = ArrayMeta.from_zarray({"shape": [10], "chunks": [3], "dimension_separator": "/"})
    assert slash.grid() == (4,) and list(slash.chunk_keys()) == ["0", "1", "2", "3"]
    nested = ArrayMeta.from_zarray({"shape": [4, 4], "chunks": [2, 2], "dimension_separator": "/"})
    assert nested.chunk_key((1, 0)) == "1/0" and nested.parse_chunk_key("1/0") == (1, 0)


def test_scalars_and_empty_axes():
    scalar = ArrayMeta.from_zarray({"shape": [], "chunks": []})
    assert scalar.scalar and scalar.grid() == () and scalar.nchunks() == 1
    assert list(scalar.chunk_keys()) == ["0"] and scalar.parse_chunk_key("0") == ()
    v3 = ArrayMeta.from_zarr_json({"shape": [], "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": []}}})
    assert list(v3.chunk_keys()) == ["c"] and v3.parse_chunk_key("c") == ()
    empty = ArrayMeta.from_zarray({"shape": [0, 5], "chunks": [2, 5]})
    assert empty.grid() == (0, 1) and list(empty.chunk_keys()) == []


@pytest.mark.parametrize("doc, why", [
    ({"shape": [4], "chunks": [0]}, "do not make a chunk grid"),
    ({"shape": [4], "chunks": [2, 2]}, "do not make a chunk grid"),
    ({"shape": [True], "chunks": [1]}, "do not make a chunk grid"),
    ({"shape": [-1], "chunks": [1]}, "do not make a chunk grid"),
    ({"chunks": [1]}, "do not make a chunk grid"),
])
def test_bad_grids_say_why(doc, why):
    with pytest.raises(ArrayMetaError, match=why):
        ArrayMeta.from_zarray(doc).grid()


def test_not_an_object():
    with pytest.raises(ArrayMetaError, match="not an object"):
        ArrayMeta.from_zarray([1, 2])
    with pytest.raises(ArrayMetaError, match="not an object"):
        ArrayMeta.from_zarr_json("x")


def _v3(**fields):
    return {"zarr_format": 3, "node_type": "array", "shape": [5, 4], "data_type": "int16",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 4]}}, **fields}


def test_v3_encodings_and_checks():
    default = ArrayMeta.from_zarr_json(_v3())
    assert default.check() == (3, 1) and default.chunk_key((2, 0)) == "c/2/0"
    assert default.parse_chunk_key("c/2/0") == (2, 0) and default.parse_chunk_key("2.0") is None
    dotted = ArrayMeta.from_zarr_json(_v3(chunk_key_encoding={"name": "default", "configuration": {"separator": "."}}))
    assert dotted.chunk_key((2, 0)) == "c.2.0" and dotted.parse_chunk_key("c.2.0") == (2, 0)
    v2 = ArrayMeta.from_zarr_json(_v3(chunk_key_encoding={"name": "v2", "configuration": {"separator": "."}}))
    assert v2.chunk_key((2, 0)) == "2.0" and list(v2.chunk_keys()) == ["0.0", "1.0", "2.0"]
    with pytest.raises(ArrayMetaError, match="chunk key encoding 'other' is not known"):
        ArrayMeta.from_zarr_json(_v3(chunk_key_encoding={"name": "other"})).check()
    with pytest.raises(ArrayMetaError, match="neither"):
        ArrayMeta.from_zarr_json(_v3(chunk_key_encoding={"name": "v2", "configuration": {"separator": "-"}})).check()
    with pytest.raises(ArrayMetaError, match="chunk grid 'rectilinear' is not 'regular'"):
        ArrayMeta.from_zarr_json(_v3(chunk_grid={"name": "rectilinear"})).grid()


def test_v3_sharding_has_inner_chunks():
    shard = {"name": "sharding_indexed", "configuration": {"chunk_shape": [1, 2], "codecs": [{"name": "bytes"}]}}
    meta = ArrayMeta.from_zarr_json(_v3(codecs=[shard]))
    assert meta.chunks == [2, 4] and meta.inner_chunks == [1, 2] and meta.sharding["chunk_shape"] == [1, 2]
    assert ArrayMeta.from_zarr_json(_v3(codecs=[{"name": "bytes"}])).inner_chunks == [2, 4]


def test_keys_as_zarr_python_writes_them(tmp_path):
    """Every chunk key the model derives is a file zarr-python wrote, and no written chunk is missed."""
    zarr = pytest.importorskip("zarr")
    import json
    import os

    import numpy as np

    for fmt, kwargs in ((2, {}), (2, {"chunk_key_encoding": {"name": "v2", "separator": "/"}}),
                        (3, {}), (3, {"chunk_key_encoding": {"name": "default", "separator": "."}}),
                        (3, {"chunk_key_encoding": {"name": "v2", "separator": "."}})):
        path = tmp_path / f"s{fmt}{len(os.listdir(tmp_path))}.zarr"
        a = zarr.create_array(str(path), shape=(5, 3), chunks=(2, 2), dtype="i2", zarr_format=fmt,
                              fill_value=-1, **kwargs)
        a[...] = np.arange(15, dtype="i2").reshape(5, 3)
        if fmt == 2:
            meta = ArrayMeta.from_zarray(json.loads((path / ".zarray").read_text()))
        else:
            meta = ArrayMeta.from_zarr_json(json.loads((path / "zarr.json").read_text()))
        written = {os.path.relpath(os.path.join(d, f), path).replace(os.sep, "/")
                   for d, _, files in os.walk(path) for f in files if f not in (".zarray", ".zattrs", "zarr.json")}
        assert set(meta.chunk_keys()) == written, (fmt, kwargs)
        assert all(meta.chunk_key(meta.parse_chunk_key(k)) == k for k in written)
        assert meta.fill_value == -1 and meta.nchunks() == 6
