"""Relative target paths resolve against where the reference set lives, as GDAL's /vsikerchunk does
(refmount.refs.relative): GDAL's own test sets (one with a trailing comma, which GDAL accepts) mount
and read right from any working directory, and a remote set's relative targets stay on its server."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from refmount.refs.relative import base_of, is_relative, resolve
from tests.support.clients import ncdump, nczarr_url, parse_ncdump

GDAL_SETS = Path(__file__).parent / "data" / "gdal"
RAW = ("--view", "raw")


def gdal_set(tmp_path, name: str) -> Path:
    """A copy of one of GDAL's sets, in a directory of its own (its 0.bin beside it)."""
    copy = tmp_path / "sets" / name
    shutil.copytree(GDAL_SETS / name, copy)
    return copy / "ref.json"


def elsewhere(tmp_path) -> Path:
    """A working directory that holds no 0.bin."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir(exist_ok=True)
    return cwd


# -- the rule ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, relative", [
    ("0.bin", True), ("sub/0.bin", True), ("../0.bin", True), ("./0.bin", True), ("~/0.bin", True),
    ("/abs/0.bin", False), ("file:///abs/0.bin", False), ("https://h/0.bin", False), ("s3://b/k", False),
    ("simplecache::0.bin", False), ("", False),
])
def test_what_counts_as_relative(url, relative):
    assert is_relative(url) == relative


@pytest.mark.parametrize("location, url, expected", [
    ("/data/set/refs.json", "0.bin", "/data/set/0.bin"),
    ("/data/set/refs.json", "../other/0.bin", "/data/other/0.bin"),
    ("file:///data/set/refs.json", "0.bin", "/data/set/0.bin"),
    ("https://host/dir/refs.json", "0.bin", "https://host/dir/0.bin"),
    ("https://host:8443/dir/refs.json?X-Amz-Signature=abc", "0.bin", "https://host:8443/dir/0.bin"),
    ("https://host/dir/refs.json", "sub/./0.bin", "https://host/dir/sub/0.bin"),
    # ".." stops at the url's root: a relative target never leaves the set's own host
    ("https://host/dir/refs.json", "../../../../etc/passwd", "https://host/etc/passwd"),
    ("https://host/refs.json", "a//b.bin", "https://host/a//b.bin"),  # empty segments are part of object keys
    ("s3://bucket/dir/refs.json", "0.bin", "s3://bucket/dir/0.bin"),
    ("s3://bucket/refs.json", "../0.bin", "s3://bucket/0.bin"),
    ("simplecache::https://host/d/refs.json", "0.bin", "https://host/d/0.bin"),
    ("https://host/dir/refs.json", "http://other/0.bin", "http://other/0.bin"),  # absolute: unchanged
    ("https://host/dir/refs.json", "/etc/passwd", "/etc/passwd"),  # absolute local: the policy decides
])
def test_resolution(location, url, expected):
    assert resolve(url, base_of(location)) == expected


def test_a_set_read_from_stdin_resolves_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert base_of("/dev/stdin") == f"{tmp_path}/"
    assert base_of("/dev/fd/63") == f"{tmp_path}/"


# -- GDAL's sets, mounted from elsewhere ---------------------------------------------------------

@pytest.mark.parametrize("name", ["json_ref_v1_min", "json_ref_v0_min"])
def test_gdal_sets_read_right_from_any_working_directory(mount, tmp_path, name):
    refs = gdal_set(tmp_path, name)
    for cwd in (elsewhere(tmp_path), Path("/")):
        m = mount(refs, *RAW, cwd=cwd)
        assert (m / "x" / "0").read_bytes() == b"\x01"
        assert os.stat(m / "x" / "0").st_size == 1
        assert os.getxattr(m / "x" / "0", "user.refmount.url").decode() == str(refs.parent / "0.bin")
        assert m.log().count("relative target paths") == 1, m.log()
        if name == "json_ref_v1_min":
            assert "1 trailing comma" in m.log()


def test_gdal_set_through_the_decoded_view_zarr_and_ncdump(mount, tmp_path):
    """(zarr-python 3 refuses the set's own dtype '>u1' in the raw view; the decoded view serves '|u1'.)"""
    zarr = pytest.importorskip("zarr")
    m = mount(gdal_set(tmp_path, "json_ref_v1_min"), cwd="/")
    assert zarr.open_array(str(m / "x"), mode="r", zarr_format=2)[...].tolist() == [1]
    dumped = parse_ncdump(ncdump(nczarr_url(m.path)))
    assert dumped["x"].items == [1]


def test_a_relative_target_that_does_not_exist_names_the_resolved_path(mount, tmp_path):
    refs = gdal_set(tmp_path, "json_ref_v1_min")
    (refs.parent / "0.bin").unlink()
    (elsewhere(tmp_path) / "0.bin").write_bytes(b"\x02")  # the working directory's is never read
    m = mount(refs, *RAW, cwd=elsewhere(tmp_path))
    with pytest.raises(OSError) as e:
        (m / "x" / "0").read_bytes()
    assert e.value.errno == errno.EIO
    assert f"{refs.parent}/0.bin: No such file or directory" in m.log()


# -- remote sets -----------------------------------------------------------------------------------

def test_relative_targets_of_a_remote_set_are_urls_of_its_server(mount, server, tmp_path):
    site = server.root / "dir"
    site.mkdir()
    (site / "0.bin").write_bytes(b"\x07")
    (server.root / "up.bin").write_bytes(b"\x09")
    refs = json.loads((GDAL_SETS / "json_ref_v1_min" / "ref.json").read_text().replace("},\n}", "}\n}"))
    refs["refs"]["x/0"] = ["0.bin", 0, 1]
    refs["refs"]["up"] = ["../up.bin"]
    refs["refs"]["escape"] = ["../../../../etc/passwd", 0, 10]
    (site / "refs.json").write_text(json.dumps(refs))
    local = elsewhere(tmp_path)
    (local / "0.bin").write_bytes(b"\x01")  # a local 0.bin must never be read for a remote set
    m = mount(server.url_for("dir/refs.json"), *RAW, cwd=local)
    assert (m / "x" / "0").read_bytes() == b"\x07"
    assert os.getxattr(m / "x" / "0", "user.refmount.url").decode() == server.url_for("dir/0.bin")
    assert (m / "up").read_bytes() == b"\x09"
    # "../" stops at the server's root: this is the server's /etc/passwd (404), never the local one
    assert os.getxattr(m / "escape", "user.refmount.url").decode() == server.url_for("etc/passwd")
    with pytest.raises(OSError) as e:
        (m / "escape").read_bytes()
    assert e.value.errno == errno.EIO
    assert "relative target paths" in m.log()
    assert f"{server.url_for('etc/passwd')}: HTTP 404" in m.log(), m.log()


def test_relative_targets_of_a_remote_set_obey_allow_protocols(server, tmp_path):
    from tests.support.refusals import refused_mount

    (server.root / "refs.json").write_text(json.dumps({".zgroup": '{"zarr_format":2}', "a": ["0.bin", 0, 1]}))
    (tmp_path / "mnt").mkdir()
    result = refused_mount("--allow-protocols", "file", server.url_for("refs.json"), str(tmp_path / "mnt"))
    assert result.returncode != 0
    assert "uses protocol 'http', which --allow-protocols does not include" in result.stderr
    assert server.url_for("0.bin") in result.stderr


# -- Parquet sets ----------------------------------------------------------------------------------

def test_parquet_relative_targets_resolve_against_their_record_file(mount, tmp_path):
    """As GDAL (osParquetFileDirectory): the directory of refs.<n>.parq, that is <root>/<array>/."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "refs.parq"
    (root / "x").mkdir(parents=True)
    zarray = {"zarr_format": 2, "shape": [2], "chunks": [1], "compressor": None, "dtype": "|u1", "order": "C",
              "filters": None, "fill_value": None}
    meta = {"metadata": {".zgroup": {"zarr_format": 2}, "x/.zarray": zarray, "x/.zattrs": {}}, "record_size": 10}
    (root / ".zmetadata").write_text(json.dumps(meta))
    (root / "x" / "0.bin").write_bytes(b"\x05\x06")
    table = pa.table({"path": ["0.bin", "0.bin"] + [None] * 8, "offset": [0, 1] + [0] * 8,
                      "size": [1, 1] + [0] * 8, "raw": pa.nulls(10, pa.binary())})
    pq.write_table(table, root / "x" / "refs.0.parq")
    m = mount(root, *RAW, cwd=elsewhere(tmp_path))
    assert (m / "x" / "1").read_bytes() == b"\x06"
    assert os.getxattr(m / "x" / "0", "user.refmount.url").decode() == str(root / "x" / "0.bin")
    zarr = pytest.importorskip("zarr")
    assert np.array_equal(zarr.open_array(str(m / "x"), mode="r", zarr_format=2)[...], [5, 6])
    assert m.log().count("relative target paths") == 1
