"""The Python API (`refmount.mount`) and references on stdin, including from a real Jupyter kernel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import refmount
from tests.conftest import REFMOUNT, force_unmount, is_mounted
from tests.support.datasets import kerchunk_refs, oracle_bytes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(autouse=True)
def _logs_in_tmp(tmp_path, monkeypatch):
    """Daemons started here (they inherit the environment) log under tmp_path, not /var/log."""
    monkeypatch.setenv("REFMOUNT_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("REFMOUNT_SYSLOG_SOCKET", "")


def test_mount_a_dict_on_a_temporary_mountpoint(datasets):
    refs = kerchunk_refs(datasets["zlib"])
    with refmount.mount(refs, view="raw", cache_size="64M", prefetch=False) as m:
        assert is_mounted(m.path) and m.path.name.startswith("refmount-")
        assert os.getxattr(m.path, "user.refmount.refs") == b"stdin"
        assert m.pid and m.pid != os.getpid() and m.log_file.startswith(os.environ["REFMOUNT_LOG_DIR"])
        for key in refs["refs"] if "refs" in refs else refs:
            if not key.startswith("."):
                assert (m.path / key).read_bytes() == oracle_bytes(refs, key)
                break
        assert m.stats()["view"] == "raw"
    assert not m.path.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(m.pid, 0)


def test_mount_a_path_on_a_given_mountpoint(datasets, tmp_path):
    path = tmp_path / "refs.json"
    path.write_text(json.dumps(kerchunk_refs(datasets["zlib"])))
    mnt = tmp_path / "m"
    mnt.mkdir()
    m = refmount.mount(path, mnt, view="raw")
    try:
        assert m.path == mnt and (mnt / ".zgroup").exists()
        assert os.fspath(m) == str(mnt)
    finally:
        m.unmount()
        force_unmount(mnt)
    assert mnt.is_dir() and not is_mounted(mnt)  # the caller's directory stays


def test_inline_bytes_in_a_dict_are_written_as_base64(tmp_path):
    refs = {"version": 1, "refs": {".zgroup": b'{"zarr_format": 2}', "blob": b"\x00\xff\x01"}}
    with refmount.mount(refs, view="raw") as m:
        assert (m.path / "blob").read_bytes() == b"\x00\xff\x01"
        assert json.loads((m.path / ".zgroup").read_bytes()) == {"zarr_format": 2}


@pytest.mark.parametrize("options, culprit", [({"block_size": "3"}, "--block-size"),
                                              ({"cache_sise": "2G"}, "did you mean '--cache-size'")])
def test_errors_raise_refmount_error_with_one_line(options, culprit):
    with pytest.raises(refmount.RefmountError) as e:
        refmount.mount({"a": "x"}, **options)
    assert culprit in str(e.value) and "\n" not in str(e.value)
    assert not any(p.name.startswith("refmount-") and is_mounted(p) for p in Path("/tmp").iterdir())


def test_bad_references_raise(tmp_path):
    with pytest.raises(refmount.RefmountError, match="a/../b"):
        refmount.mount({"a/../b": "x"})


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_cli_reads_references_from_stdin(datasets, tmp_path, name):
    refs = kerchunk_refs(datasets["zlib"])
    mnt = tmp_path / "m"
    mnt.mkdir()
    try:
        result = subprocess.run([*REFMOUNT, "mount", "--view", "raw", "--log-file", str(tmp_path / "log"), name,
                                 str(mnt)], input=json.dumps(refs), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert f"mounted stdin on {mnt}" in result.stderr
        assert (mnt / ".zgroup").read_bytes() == oracle_bytes(refs, ".zgroup")
    finally:
        subprocess.run([*REFMOUNT, "umount", str(mnt)], capture_output=True, timeout=30)
        force_unmount(mnt)


NOTEBOOK_CELL = r'''
import json, os, refmount, xarray as xr
from kerchunk.hdf import SingleHdf5ToZarr

refs = SingleHdf5ToZarr(NC_PATH).translate()   # kerchunk's dict, never written to a file
m = refmount.mount(refs)
ds = xr.open_dataset(m.path, engine="zarr", consolidated=False)
mean = float(ds.air.mean())
with open(f"/proc/{m.pid}/stat") as f:
    daemon_ppid = int(f.read().rsplit(")", 1)[1].split()[1])
children = [int(p) for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/stat")
            and int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()]
fuse_holders = [c for c in children if any(os.path.realpath(f"/proc/{c}/fd/{fd}") == "/dev/fuse"
                                           for fd in os.listdir(f"/proc/{c}/fd"))]
ds.close()
m.unmount()
print(json.dumps({"kernel": os.getpid(), "daemon": m.pid, "daemon_ppid": daemon_ppid, "mean": mean,
                  "fuse_holders": fuse_holders, "path_left": os.path.exists(m.path)}))
'''


def test_mount_from_a_jupyter_kernel():
    """A real ipykernel runs the cell: the translate() dict mounts without a file, xarray reads the right
    values, and the daemon is not a child of the kernel (no fork of the kernel holds /dev/fuse)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import xarray as xr

    nc = EXAMPLES / "air-zlib.nc"
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(f"NC_PATH = {str(nc)!r}\n" + NOTEBOOK_CELL))
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3")
    client.execute()
    outputs = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert not [o for o in outputs if o.output_type == "error"], outputs
    report = json.loads(text.strip().splitlines()[-1])
    assert report["daemon"] != report["kernel"] and report["daemon_ppid"] != report["kernel"]
    assert report["fuse_holders"] == [] and not report["path_left"]
    with xr.open_dataset(nc) as ds:
        assert report["mean"] == pytest.approx(float(ds.air.mean()))


def test_temporary_mount_does_not_outlive_a_crashed_caller():
    """The caller exits without unmounting (os._exit skips atexit, as a crash or a killed kernel would):
    the daemon notices that its owner is gone and unmounts."""
    script = ("import os, refmount; m = refmount.mount({'a': 'x'}); print(m.path, m.pid, flush=True); os._exit(0)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    path, pid = result.stdout.split()
    try:
        deadline = time.monotonic() + 10
        while (is_mounted(path) or os.path.exists(f"/proc/{pid}")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_mounted(path) and not os.path.exists(f"/proc/{pid}")
    finally:
        force_unmount(path)
        shutil.rmtree(path, ignore_errors=True)


def test_mount_a_virtualizarr_kerchunk_export(tmp_path):
    """VirtualiZarr's kerchunk dict export mounts as it is; xarray reads the source file's values."""
    import numpy as np
    import xarray as xr
    from obspec_utils.registry import ObjectStoreRegistry
    from obstore.store import LocalStore
    from virtualizarr import open_virtual_dataset
    from virtualizarr.parsers import HDFParser

    nc = EXAMPLES / "air-zlib.nc"
    url = f"file://{nc}"
    registry = ObjectStoreRegistry({"file://": LocalStore()})
    vds = open_virtual_dataset(url, registry=registry, parser=HDFParser(), loadable_variables=["time", "lat", "lon"])
    refs = vds.vz.to_kerchunk(format="dict")
    with refmount.mount(refs) as m, xr.open_dataset(m.path, engine="zarr", consolidated=False) as ds, \
            xr.open_dataset(nc) as source:
        np.testing.assert_array_equal(ds.air.values, source.air.values)
