"""Parquet reference sets (kerchunk refs_to_dataframe, fsspec LazyReferenceMapper, pyarrow and
fastparquet) read byte-identically to the same references in JSON form."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import run_refmount
from tests.support.datasets import kerchunk_refs, to_v0

KINDS = ["missing", "groups", "zlib", "air"]


def files_under(root) -> dict[str, bytes]:
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def same_content(key: str, a: bytes, b: bytes) -> bool:
    if key.rsplit("/", 1)[-1] in (".zarray", ".zattrs", ".zgroup"):
        return json.loads(a) == json.loads(b)
    return a == b


def write_with_kerchunk(refs: dict, out, record_size: int) -> None:
    import kerchunk.df

    kerchunk.df.refs_to_dataframe(refs, str(out), record_size=record_size)


def write_with_lazy_mapper(refs: dict, out, record_size: int, engine: str) -> None:
    from fsspec.implementations.reference import LazyReferenceMapper

    mapper = LazyReferenceMapper.create(str(out), record_size=record_size, engine=engine)
    items = to_v0(refs).items()
    # the mapper needs each array's metadata before its chunks
    for key, value in sorted(items, key=lambda kv: not kv[0].rsplit("/", 1)[-1].startswith(".z")):
        mapper[key] = value.encode() if isinstance(value, str) else value
    mapper.flush()


WRITERS = {
    "kerchunk": lambda refs, out, rs: write_with_kerchunk(refs, out, rs),
    "lazy-fastparquet": lambda refs, out, rs: write_with_lazy_mapper(refs, out, rs, "fastparquet"),
    "lazy-pyarrow": lambda refs, out, rs: write_with_lazy_mapper(refs, out, rs, "pyarrow"),
}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("kind", KINDS)
def test_parquet_equals_json(mount, datasets, tmp_path, kind, writer):
    refs = kerchunk_refs(datasets[kind], inline_threshold=100)  # some chunks inline: the raw column
    out = tmp_path / f"{kind}.parq"
    WRITERS[writer](refs, out, 3)
    from_parquet = files_under(mount(str(out), "--view", "raw").path)
    from_json = files_under(mount(refs, "--view", "raw").path)
    assert sorted(from_parquet) == sorted(from_json)
    for key, data in from_json.items():
        assert same_content(key, from_parquet[key], data), key


def test_missing_rows_are_absent(mount, datasets, tmp_path):
    refs = kerchunk_refs(datasets["missing"])
    out = tmp_path / "m.parq"
    write_with_lazy_mapper(refs, out, 4, "pyarrow")
    mnt = mount(str(out), "--view", "raw")
    present = {k for k in to_v0(refs) if k.startswith("sparse/") and not k.rsplit("/", 1)[1].startswith(".")}
    listed = {f"sparse/{n}" for n in os.listdir(mnt / "sparse") if not n.startswith(".")}
    assert listed == present
    zarray = json.loads((mnt / "sparse" / ".zarray").read_text())
    grid = [-(-s // c) for s, c in zip(zarray["shape"], zarray["chunks"])]
    absent = [".".join(map(str, idx)) for idx in np.ndindex(*grid) if f"sparse/{'.'.join(map(str, idx))}" not in present]
    assert absent, "the fixture should have missing chunks"
    for name in absent:
        with pytest.raises(FileNotFoundError):
            os.stat(mnt / "sparse" / name)
    stats = mnt.stats()["parquet"]
    assert stats["records_loaded"] >= 1


def test_decoded_view_over_parquet_reads_with_ncdump(mount, datasets, tmp_path):
    refs = kerchunk_refs(datasets["zlib"])
    out = tmp_path / "z.parq"
    write_with_kerchunk(refs, out, 2)
    mnt = mount(str(out))
    result = subprocess.run(["ncdump", "-v", "t2", f"file://{mnt.path}#mode=zarr,file"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    local = subprocess.run(["ncdump", "-v", "t2", str(datasets["zlib"])], capture_output=True, text=True)
    assert result.stdout.split("data:")[1] == local.stdout.split("data:")[1]


def test_wrong_columns_fail_the_mount_in_one_line(tmp_path):
    root = tmp_path / "bad.parq"
    (root / "a").mkdir(parents=True)
    (root / ".zmetadata").write_text(json.dumps({"record_size": 10, "metadata": {
        ".zgroup": {"zarr_format": 2},
        "a/.zarray": {"shape": [10], "chunks": [1], "dtype": "<f4", "compressor": None, "filters": None,
                      "fill_value": None, "order": "C", "zarr_format": 2}}}))
    pq.write_table(pa.table({"url": ["x"] * 10, "start": [0] * 10}), root / "a" / "refs.0.parq")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_refmount("mount", root, mnt)
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1
    assert "refs.0.parq" in result.stderr and "columns" in result.stderr


def test_unreadable_record_is_eio_not_wrong_bytes(mount, tmp_path):
    root = tmp_path / "corrupt.parq"
    (root / "a").mkdir(parents=True)
    (root / ".zmetadata").write_text(json.dumps({"record_size": 2, "metadata": {
        "a/.zarray": {"shape": [4], "chunks": [1], "dtype": "<f4", "compressor": None, "filters": None,
                      "fill_value": None, "order": "C", "zarr_format": 2}}}))
    pq.write_table(pa.table({"path": [None, None], "offset": [0, 0], "size": [0, 0], "raw": [b"abcd", b"efgh"]}),
                   root / "a" / "refs.0.parq")
    (root / "a" / "refs.1.parq").write_bytes(b"not parquet at all")
    mnt = mount(str(root), "--view", "raw")
    assert (mnt / "a" / "1").read_bytes() == b"efgh"
    with pytest.raises(OSError) as e:
        (mnt / "a" / "2").read_bytes()
    assert e.value.errno == errno.EIO
    assert "refs.1.parq" in mnt.log()
