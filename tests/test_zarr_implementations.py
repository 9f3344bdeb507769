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

from tests.conftest import run_refmount
from tests.support.clients import NCDUMP, compare_dumped, ncdump, nczarr_url, parse_ncdump
from tests.support.moto import moto_server
from tests.support.nginx import Nginx

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

DATA = Path(__file__).parent / "data" / "zarrimpl"
STORES = ("z5py_v2.zarr", "z5py_v2_nested.zarr", "z5py_v3.zarr", "tensorstore_v2.zarr",
          "tensorstore_v3.zarr")
S3 = {"key": "AKIATESTTESTTEST0000", "secret": "test/secret/0000"}


@pytest.fixture(scope="module")
def www(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("www")
    for name in os.listdir(DATA):
        if (DATA / name).is_dir():
            shutil.copytree(DATA / name, root / name)
    return root


@pytest.fixture(scope="module")
def nginx(www, tmp_path_factory):
    """/idx/: with nginx's index pages (stores without consolidated metadata are walked by them)."""
    with Nginx(tmp_path_factory.mktemp("nginx"), f"root {www}; location /idx/ {{ alias {www}/; autoindex on; }}",
               "$request_method $uri $status") as server:
        yield server


@pytest.fixture(scope="module")
def s3(www):
    import s3fs

    with moto_server() as endpoint:
        options = {**S3, "endpoint_url": endpoint}
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("stores")
        for path in sorted(www.rglob("*")):
            if path.is_file():
                fs.pipe_file(f"stores/{path.relative_to(www)}", path.read_bytes())
        yield options


def source(where: str, name: str, nginx, s3) -> tuple[str, list[str]]:
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


CASES = [(w, n) for n in STORES for w in ("http", "s3")]


@pytest.mark.parametrize("where,name", CASES, ids=[f"{w}-{n}" for w, n in CASES])
def test_zarr_reads_the_mount_as_the_store(mount, www, nginx, s3, where, name):
    """zarr-python on the raw view and on the decoded view reads what it reads on the store itself
    (missing chunks as the fill value, shards, big-endian, F order, gzip, blosc, zlib, zstd)."""
    url, args = source(where, name, nginx, s3)
    want = arrays_of(str(www / name))
    raw = mount(url, "--view", "raw", *args)
    assert_same_arrays(arrays_of(str(raw.path)), want, f"raw view of {name}")
    decoded = mount(url, *args)
    got = arrays_of(str(decoded.path))
    # (the decoded view is Zarr v2 in native byte order: values, not byte order, are compared)
    assert_same_arrays({k: v.astype(v.dtype.newbyteorder("=")) for k, v in got.items()},
                       {k: v.astype(v.dtype.newbyteorder("=")) for k, v in want.items()}, f"decoded view of {name}")
    dumped = parse_ncdump(ncdump(nczarr_url(decoded.path)))
    for path, values in want.items():
        fill = zarr.open_array(str(www / name), path=path, mode="r").fill_value
        compare_dumped(dumped[path], values.astype(values.dtype.newbyteorder("<")), [fill], f"ncdump {name} {path}")


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
    (tmp_path / "mnt").mkdir()
    result = run_refmount("mount", f"{nginx.url}/idx/zarrita_draft.zarr", tmp_path / "mnt", timeout=120)
    if result.returncode == 0:
        subprocess.run(["fusermount3", "-u", str(tmp_path / "mnt")], timeout=60)
    assert result.returncode != 0
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert "zarrita_draft.zarr/zarr.json" in line and "zarr_format" in line, line
