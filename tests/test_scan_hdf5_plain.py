"""The scanners' straight path for plain numeric HDF5 datasets (refmount/refs/scan/hdf5scan.py) makes the
references kerchunk's way makes, key for key, byte for byte and in the same order, on files of every
kind: compression and filters, strings, variable-length and compound types, groups, fill values,
unlimited dimensions, chunks skipping a filter, dimension scales, inline-sized chunks; netCDF-C's own CDL
slice (tests/conformance/slice.txt) as ncgen and nccopy write it, the realistic files, daily archive
files, the HDF5 files of tests/data. Both ways run on the same file through the scanner's PipeReader; the oracle is kerchunk's own
translation (the straight path off)."""

from __future__ import annotations

import gc
import subprocess
from pathlib import Path

import numpy as np
import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]


class _FileConn:
    """The parent's side of a scanner's pipe, answering reads from a local file."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "rb")
        self.answer = b""

    def send_bytes(self, message: bytes) -> None:
        _, start, end = orjson.loads(message)
        self.file.seek(start)
        self.answer = self.file.read(end - start)

    def recv_bytes(self) -> bytes:
        return self.answer


def _translate(path: Path, plain: bool) -> tuple[list, list]:
    """(the Version-0 references as (key, value) pairs in their order, the variables refused)."""
    from refmount.refs.scan.hdf5scan import Translator
    from refmount.refs.scan.worker import PipeReader, to_v0

    refused: list[str] = []
    conn = _FileConn(path)
    translator = Translator(PipeReader(conn, path.stat().st_size), "https://h/f.nc", refused, plain)
    gc.collect()
    gc.disable()  # (as the scanner does: zarr's I/O thread collecting h5py objects deadlocks, worker.py)
    try:
        return list(to_v0(translator.translate()).items()), refused
    finally:
        gc.enable()
        translator.close()
        conn.file.close()


def _h5py_files(directory: Path) -> list[Path]:
    """HDF5 files written with h5py, each dataset of a kind the straight path must take or leave."""
    import h5py

    paths = []

    def new(name):
        paths.append(directory / name)
        return h5py.File(directory / name, "w")

    data = np.arange(600, dtype="f4").reshape(20, 30)
    with new("numeric.h5") as f:
        f.attrs["title"] = "plain numbers"
        f.attrs["nan"] = np.float32(np.nan)
        f.attrs["ints"] = np.arange(3, dtype="i2")
        f.attrs["bytes"] = b"raw \xff bytes"
        f.attrs["empty"] = h5py.Empty("f4")
        f.create_dataset("contiguous", data=data)
        f.create_dataset("chunked", data=data, chunks=(7, 11))
        f.create_dataset("gzip", data=data, chunks=(10, 30), compression="gzip", compression_opts=9)
        f.create_dataset("shuffle", data=data, chunks=(10, 30), shuffle=True)
        f.create_dataset("shuffle_gzip", data=data, chunks=(10, 30), shuffle=True, compression="gzip")
        f.create_dataset("fill_int", data=np.arange(10, dtype="i4"), chunks=(3,), fillvalue=-7)
        f.create_dataset("fill_nan", shape=(10,), dtype="f8", chunks=(4,), fillvalue=np.nan)[:4] = 1.5
        f.create_dataset("fill_inf", shape=(10,), dtype="f4", chunks=(4,), fillvalue=-np.inf)[4:] = 2
        f.create_dataset("never_written_chunked", shape=(10, 10), dtype="u2", chunks=(5, 5))
        f.create_dataset("never_written_contiguous", shape=(10,), dtype="i8")
        f.create_dataset("scalar", data=np.float64(3.25))
        f.create_dataset("zero_size", shape=(0,), dtype="f4")
        f.create_dataset("zero_rows", shape=(0, 5), dtype="i4", chunks=(1, 5), maxshape=(None, 5))
        f.create_dataset("chunk_past_end", data=np.arange(5.0), chunks=(100,), maxshape=(None,))
        f.create_dataset("half", data=np.arange(50, dtype="f2"), chunks=(10,))
        f.create_dataset("u64", data=np.arange(40, dtype="u8") * (2**60), chunks=(7,))
        f.create_dataset("i1_ascii", data=np.frombuffer(b"[1, 2]  ", dtype="i1"), chunks=(8,))  # (JSON-looking bytes)
        f.create_dataset("bigendian", data=np.arange(10, dtype=">f4"), chunks=(5,))
        f.create_dataset("fletcher32", data=data, chunks=(10, 10), fletcher32=True)
        f.create_dataset("scaleoffset", data=np.arange(100, dtype="i4"), chunks=(10,), scaleoffset=0)
        f.create_dataset("lzf", data=data, chunks=(10, 10), compression="lzf")
        f.create_dataset("compact", data=np.arange(10, dtype="i4"),
                         dcpl=_compact_dcpl(h5py))
        f.create_dataset("partial", shape=(100,), dtype="f4", chunks=(10,))[25:35] = 1
        f.create_dataset("bool", data=np.array([True, False] * 5))
        f.create_dataset("enum", data=np.arange(4, dtype="u1"),
                         dtype=h5py.enum_dtype({"a": 0, "b": 1, "c": 2, "d": 3}, basetype="u1"))
        f.create_dataset("compound", data=np.array([(1, 2.0), (3, 4.0)], dtype=[("i", "i4"), ("f", "f8")]))
        f.create_dataset("vlen_str", data=["a", "bc", "def"], dtype=h5py.string_dtype())
        f.create_dataset("fixed_str", data=np.array([b"ab", b"cde"], dtype="S4"), chunks=(1,), fillvalue=b"zz")
        f.create_dataset("vlen_int", shape=(2,), dtype=h5py.vlen_dtype("i4"))[:] = [np.arange(2), np.arange(3)]
        f.create_dataset("refs", data=[f["chunked"].ref], dtype=h5py.ref_dtype)
        g = f.create_group("g/h")
        g.attrs["inner"] = 1
        f["g"].attrs["outer"] = "x"
        g.create_dataset("nested", data=data, chunks=(10, 10), compression="gzip", shuffle=True)
        g.create_dataset("ünïcode name", data=np.arange(3, dtype="i2"))
    with new("filtered_chunk.h5") as f:  # one chunk written past its filters (filter_mask 1)
        ds = f.create_dataset("x", shape=(20,), dtype="i4", chunks=(10,), compression="gzip")
        ds[:10] = np.arange(10)
        ds.id.write_direct_chunk((10,), np.arange(10, 20, dtype="i4").tobytes(), filter_mask=1)
    with new("scales.h5") as f:
        f["x"] = np.arange(5.0)
        f["y"] = np.arange(4.0)
        f["x2"] = np.arange(5.0) * 2
        for name in ("x", "y", "x2"):
            f[name].make_scale(name)
        v = f.create_dataset("v", data=np.zeros((5, 4), "f4"), chunks=(5, 2))
        v.dims[0].attach_scale(f["x"])
        v.dims[1].attach_scale(f["y"])
        w = f.create_dataset("w", data=np.zeros((5, 4), "f4"))
        w.dims[0].attach_scale(f["x"])
        w.dims[0].attach_scale(f["x2"])  # (two scales on one dimension: kerchunk refuses it)
        f.create_dataset("bare", shape=(3,), dtype="f4").make_scale("bare")  # a scale never written
    with new("deflate_then_shuffle.h5") as f:  # filters in an order kerchunk writes the other way round
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((5,))
        dcpl.set_deflate(4)
        dcpl.set_shuffle()
        space = h5py.h5s.create_simple((10,))
        h5py.h5d.create(f.id, b"x", h5py.h5t.NATIVE_INT32, space, dcpl=dcpl)
        f["x"][:] = np.arange(10)
    return paths


def _compact_dcpl(h5py):
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    return dcpl


def _netcdf_files(directory: Path) -> list[Path]:
    import netCDF4

    path = directory / "netcdf4.nc"
    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "unlimited and filled"
        ds.createDimension("time", None)
        ds.createDimension("x", 6)
        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01"
        t[:] = np.arange(3)
        v = ds.createVariable("v", "f4", ("time", "x"), zlib=True, shuffle=True, fill_value=np.float32(1e20))
        v[:] = np.arange(18, dtype="f4").reshape(3, 6)
        n = ds.createVariable("n", "f8", ("time", "x"), fill_value=np.nan)
        n[:2] = 1.0
        i = ds.createVariable("i", "i2", ("x",), fill_value=-999, contiguous=True)
        i[:] = np.arange(6)
        i.valid_range = np.array([0, 10], "i2")
        u = ds.createVariable("u", "u1", ("x",), fill_value=False)
        u[:] = np.arange(6)
        s = ds.createVariable("s", str, ("x",))
        s[:] = np.array(["a", "bb", "c", "", "e", "f"], dtype=object)
        c = ds.createVariable("c", "S1", ("x",))
        c[:] = np.array(list(b"abcdef"), dtype="S1")
        cmp_type = ds.createCompoundType(np.dtype([("a", "i4"), ("b", "f4")]), "pair_t")
        ds.createVariable("pair", cmp_type, ("x",))
        vl_type = ds.createVLType(np.int32, "ragged_t")
        ds.createVariable("ragged", vl_type, ("x",))
        g = ds.createGroup("sub")
        g.createDimension("y", 2)
        g.createVariable("y", "i4", ("y",))[:] = [1, 2]
        g.createVariable("w", "f4", ("y", "x"), zlib=True)[:] = 1.0
        g.note = "a group"
    return [path]


def _cdl_slice(directory: Path) -> list[Path]:
    """netCDF-C's CDL slice as `ncgen -k nc4` writes it, and `nccopy -d4 -s` of each."""
    from tests.support.clients import tool

    paths = []
    for line in (ROOT / "tests/conformance/slice.txt").read_text().splitlines():
        cdl = line.split("#", 1)[0].strip()
        if not cdl:
            continue
        base = directory / cdl.replace("/", "_").removesuffix(".cdl")
        source, deflated = Path(f"{base}.nc"), Path(f"{base}.deflated.nc")
        made = subprocess.run([*tool("ncgen"), "-k", "nc4", "-o", str(source), str(ROOT / "tests/conformance/cdl" / cdl)],
                              capture_output=True, timeout=120)
        assert made.returncode == 0, made.stderr
        paths.append(source)
        if subprocess.run([*tool("nccopy"), "-d4", "-s", str(source), str(deflated)], capture_output=True,
                          timeout=120).returncode == 0:
            paths.append(deflated)
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Path]:
    from tests.conformance.realistic import write_all
    from tests.support.daily import make_daily

    directory = tmp_path_factory.mktemp("plain")
    files = _h5py_files(directory) + _netcdf_files(directory) + _cdl_slice(directory)
    files += write_all(directory / "realistic") + make_daily(directory / "daily", 2, 19, 36)
    return files + _repository_files()


def _repository_files() -> list[Path]:
    """The HDF5 files of tests/data: kerchunk's and netCDF4-python's test files, air.nc, the DMR++ tests'."""
    found = []
    for path in sorted((ROOT / "tests" / "data").rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as f:
                if f.read(8) == b"\x89HDF\r\n\x1a\n":
                    found.append(path)
    assert len(found) >= 50
    return found


def test_the_straight_path_makes_kerchunks_references(corpus, monkeypatch):
    from refmount.refs.scan import hdf5scan

    taken = []

    def counted(translator, h5obj, straight=hdf5scan.plain_dataset_keys):
        keys = straight(translator, h5obj)
        taken.append(keys is not None)
        return keys

    monkeypatch.setattr(hdf5scan, "plain_dataset_keys", counted)
    for path in corpus:
        expected = _translate(path, plain=False)
        got = _translate(path, plain=True)
        assert [k for k, _ in got[0]] == [k for k, _ in expected[0]], path.name  # (the same keys, in order)
        assert dict(got[0]) == dict(expected[0]), path.name
        assert got[1] == expected[1], path.name  # (the same variables refused, for the same reasons)
    assert sum(taken) >= 60  # (the straight path did the work: the plain datasets of these files)


def test_unusual_datasets_go_kerchunks_way(tmp_path):
    """What the straight path leaves to kerchunk: each of these datasets of numeric.h5 and the others."""
    import h5py

    from refmount.refs.scan import hdf5scan

    _h5py_files(tmp_path)
    left = {"fletcher32", "scaleoffset", "lzf", "compact", "bool", "enum", "compound", "vlen_str", "fixed_str",
            "vlen_int", "refs", "bigendian"}
    with h5py.File(tmp_path / "numeric.h5", "r") as f, open(tmp_path / "numeric.h5", "rb") as raw:
        translator = hdf5scan.Translator(raw, "u", [])
        try:
            for name in left:
                assert hdf5scan.plain_dataset_keys(translator, f[name]) is None, name
            for name in ("contiguous", "gzip", "shuffle_gzip", "fill_nan", "never_written_contiguous", "half"):
                assert hdf5scan.plain_dataset_keys(translator, f[name]), name
        finally:
            translator.close()
    for name, dataset in (("filtered_chunk.h5", "x"), ("deflate_then_shuffle.h5", "x")):
        with h5py.File(tmp_path / name, "r") as f, open(tmp_path / name, "rb") as raw:
            translator = hdf5scan.Translator(raw, "u", [])
            try:
                assert hdf5scan.plain_dataset_keys(translator, f[dataset]) is None, name
            finally:
                translator.close()
