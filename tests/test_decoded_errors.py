"""Decoded view: broken chunks are EIO with a log line (never short or padded data); inspect."""

from __future__ import annotations

import base64
import errno
import json
import zlib

import pytest

from tests.conftest import run_refmount
from tests.support.datasets import kerchunk_refs, write_refs


def _array(chunks, shape, compressor=None, dtype="<i4"):
    return json.dumps({"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "compressor": compressor,
                       "filters": None, "fill_value": 0, "order": "C"})


def test_undecodable_and_wrong_length_chunks_are_eio(mount):
    good = zlib.compress(bytes(range(16)))
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "a/.zarray": _array([4], [12], {"id": "zlib", "level": 1}),
        "a/0": "base64:" + base64.b64encode(good).decode(),
        "a/1": "base64:" + base64.b64encode(b"definitely not zlib").decode(),
        "a/2": "base64:" + base64.b64encode(zlib.compress(bytes(12))).decode(),  # 12 bytes, not 16
    }
    mnt = mount(refs)
    assert (mnt / "a" / "0").read_bytes() == bytes(range(16))
    for name in ("1", "2"):
        assert (mnt / "a" / name).stat().st_size == 16  # known without fetching
        with pytest.raises(OSError) as e:
            (mnt / "a" / name).read_bytes()
        assert e.value.errno == errno.EIO
    log = mnt.log()
    assert "a/1" in log and "could not be decoded" in log
    assert "a/2" in log and "decoded to 12 bytes, expected 16" in log


def test_odd_arrays_are_hidden_not_fatal(mount):
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "ok/.zarray": _array([2], [2]),
        "ok/.zattrs": '{"_ARRAY_DIMENSIONS": ["x"]}',
        "ok/0": "base64:" + base64.b64encode(bytes(8)).decode(),
        "vlen/.zarray": _array([2], [2], dtype="|O"),
        "vlen/0": "xx",
        "weird/.zarray": _array([2], [2], {"id": "no-such-codec"}),
        "weird/0": "yy",
    }
    mnt = mount(refs)
    # (the root gets a .zattrs for NCZarr's keys, which netCDF-C >= 4.9.3 reads there: {} in other forms)
    assert sorted(p.name for p in mnt.path.iterdir()) == [".zattrs", ".zgroup", ".zmetadata", "ok"]
    consolidated = json.loads((mnt / ".zmetadata").read_text())["metadata"]
    assert sorted(consolidated) == [".zattrs", ".zgroup", "ok/.zarray", "ok/.zattrs"]  # hidden arrays left out
    assert set(consolidated[".zattrs"]) <= {"_nczarr_superblock", "_nczarr_group", "_nczarr_attr"}
    log = mnt.log()
    assert "hiding array vlen" in log and "hiding array weird" in log and "no-such-codec" in log


def test_inspect_reports_codecs_and_compatibility(tmp_path, datasets):
    refs = tmp_path / "refs.json"
    write_refs(kerchunk_refs(datasets["unlimited"]), refs)
    result = run_refmount("inspect", "--json", refs)
    assert result.returncode == 0, result.stderr
    rows = {row["array"]: row for row in json.loads(result.stdout)}
    t3 = rows["t3"]
    assert t3["codecs"] == ["shuffle", "zlib"] and t3["chunks_present"] >= 1
    assert t3["raw"]["netcdf-c 4.9.0"].startswith("no:") and t3["decoded"]["netcdf-c 4.9.0"] == "yes"
    assert "cropped" in " ".join(t3["decoded_changes"])
    human = run_refmount("inspect", refs).stdout
    assert "t3:" in human and "decoded" in human and "netcdf-c 4.9.0" in human


def test_decompression_bomb_is_eio_without_inflating(mount):
    """A chunk declared as 8,000 bytes that inflates to 256 MiB: EIO, and the daemon never holds it."""
    bomb = zlib.compress(bytes(256 << 20), 9)
    refs = {
        ".zgroup": '{"zarr_format": 2}',
        "a/.zarray": _array([2000], [2000], {"id": "zlib", "level": 1}),
        "a/0": "base64:" + base64.b64encode(bomb).decode(),
    }
    mnt = mount(refs)
    for _ in range(3):
        with pytest.raises(OSError) as e:
            (mnt / "a" / "0").read_bytes()
        assert e.value.errno == errno.EIO
    status = open(f"/proc/{mnt.proc.pid}/status").read()
    peak_kib = int(status.split("VmHWM:")[1].split()[0])
    assert peak_kib < 200 << 10, f"daemon peak RSS {peak_kib} KiB"
    assert "more than the expected" in mnt.log()


def test_root_array_chunks_in_subdirectories_are_decoded(mount):
    """A root array with the "/" separator keeps its chunks in subdirectories: they are decoded too."""
    refs = {".zarray": json.dumps({"zarr_format": 2, "shape": [4, 4], "chunks": [2, 2], "dtype": "<i4",
                                   "compressor": {"id": "zlib", "level": 1}, "filters": None, "fill_value": None,
                                   "order": "C", "dimension_separator": "/"})}
    for i in range(2):
        for j in range(2):
            refs[f"{i}/{j}"] = "base64:" + base64.b64encode(zlib.compress(bytes([i, j]) * 8)).decode()
    mnt = mount(refs)
    assert (mnt / "1" / "0").stat().st_size == 16
    assert (mnt / "1" / "0").read_bytes() == bytes([1, 0]) * 8
