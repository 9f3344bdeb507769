"""Which metadata form a program gets (refmount.fuse.readers), and what each form serves
(refmount.view.forms): on real processes and on a /proc tree made here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from refmount.fuse.readers import ReaderIdentifier
from refmount.view.arrays import SCALAR_DIMENSION, ArrayInfo
from refmount.view.forms import FORMS, served_array
from tests.support.clients import netcdf_form, netcdf_version, tool, tool_exists

WHEEL_NETCDF = [p for p in Path(np.__file__).parents[1].glob("netcdf4.libs/libnetcdf*.so*")]


def fake_process(proc: Path, pid: int, exe: str, libraries: list[str], env: dict | None = None,
                 vsize: int = 1000, start: int = 7) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 18 + [str(start), str(vsize)] + ["0"] * 20  # proc(5): 22 starttime, 23 vsize
    (d / "stat").write_text(f"{pid} ({Path(exe).name}) " + " ".join(fields))
    # (each library file its own inode: versions are kept per (device, inode))
    (d / "maps").write_text("".join(f"7f00-7f10 r-xp 00000000 08:01 {abs(hash(lib)) % 10**9} {lib}\n" for lib in libraries))
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))
    if (d / "exe").is_symlink():
        (d / "exe").unlink()
    (d / "exe").symlink_to(exe)


def library(tmp: Path, name: str, version: str) -> str:
    path = tmp / name
    path.write_bytes(b"\0ELF junk\0" + f"{version} of Aug  7 2022 23:41:41 $".encode() + b"\0more")
    return str(path)


def test_forms_from_libraries(tmp_path):
    proc = tmp_path / "proc"
    nc49 = library(tmp_path, "libnetcdf.so.19", "4.9.0")
    nc410 = library(tmp_path, "libnetcdf-3622e713.so.22", "4.10.1")
    gdal = str(tmp_path / "libgdal.so.32")
    fake_process(proc, 10, "/usr/bin/ncdump", ["/usr/lib/libc.so.6", nc49])
    fake_process(proc, 11, "/usr/bin/python3.11", [nc410])
    fake_process(proc, 12, "/usr/bin/gdalinfo", [gdal, nc49])  # GDAL's tools map netCDF-C too
    fake_process(proc, 13, "/usr/bin/cp", ["/usr/lib/libc.so.6"])
    fake_process(proc, 14, "/usr/bin/cp", [], env={"REFMOUNT_FORM": "nc49", "HOME": "/root"})
    fake_process(proc, 15, "/usr/bin/python3.11", [str(tmp_path / "rasterio.libs/libgdal-c8c9c467.so.36.3.10.3")])
    fake_process(proc, 16, "/usr/bin/ncdump", [library(tmp_path, "libnetcdf.so.22", "4.9.3")])  # Debian 13
    fake_process(proc, 17, "/usr/bin/ncdump", [library(tmp_path, "libnetcdf.so.19.1", "4.9.1")])  # (neither form: portable)
    # (netCDF4 1.6.5's snapshot of 2023 reads 4.9.2's form, not 4.9.3's: measured)
    fake_process(proc, 18, "/usr/bin/python3.11", [library(tmp_path, "libnetcdf-1a2b.so.19", "4.9.3-development")])
    readers = ReaderIdentifier(proc=str(proc))
    assert [readers.identify(pid).form for pid in range(10, 19)] == [
        "nc49", "nc410", "gdal", "zarr", "nc49", "gdal", "nc493", "portable", "portable"]
    assert readers.identify(18).label == "python3.11 (netCDF-C 4.9.3-development)"
    assert readers.identify(10).label == "ncdump (netCDF-C 4.9.0)"
    assert readers.identify(11).label == "python3.11 (netCDF-C 4.10.1)"
    assert readers.identify(16).label == "ncdump (netCDF-C 4.9.3)"
    # unidentifiable: gone, another pid namespace (0), /proc not readable: the fallback form
    assert readers.identify(99).form == readers.identify(0).form == "portable"
    assert ReaderIdentifier(fallback="nc49", proc=str(proc)).identify(99).form == "nc49"


def test_library_loaded_after_the_first_look(tmp_path):
    """zarr first (no netCDF-C: zarr form), then `import netCDF4` (its virtual size grew): nc410."""
    proc = tmp_path / "proc"
    readers = ReaderIdentifier(proc=str(proc))
    fake_process(proc, 20, "/usr/bin/python3.11", [], vsize=1000)
    assert readers.identify(20).form == "zarr"
    fake_process(proc, 20, "/usr/bin/python3.11", [library(tmp_path, "libnetcdf.so.22", "4.10.1")], vsize=1000)
    assert readers.identify(20).form == "zarr"  # (same size: the cached answer)
    fake_process(proc, 20, "/usr/bin/python3.11", [library(tmp_path, "libnetcdf.so.22", "4.10.1")], vsize=5000)
    assert readers.identify(20).form == "nc410"
    fake_process(proc, 20, "/usr/bin/python3.11", [], vsize=9000)
    assert readers.identify(20).form == "nc410"  # (found: final)
    fake_process(proc, 20, "/usr/bin/cp", [], vsize=9000, start=8)  # the pid reused by another process
    assert readers.identify(20).form == "zarr"


def test_a_known_process_is_answered_without_a_worker_thread(tmp_path, monkeypatch):
    """form_of_caller: a process identified before (and not grown since, or final) is answered from its
    /proc/PID/stat on the FUSE thread; a new one, or one whose libraries may have changed, in a worker
    thread; every open counted once either way."""
    import trio

    proc = tmp_path / "proc"
    readers = ReaderIdentifier(proc=str(proc))
    fake_process(proc, 30, "/usr/bin/python3.11", [], vsize=1000)
    fake_process(proc, 31, "/usr/bin/ncdump", [library(tmp_path, "libnetcdf.so.19", "4.9.0")])
    handed = []
    to_thread = trio.to_thread.run_sync

    async def counted(fn, *args, **kw):
        handed.append(args)
        return await to_thread(fn, *args, **kw)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)

    async def main():
        forms = [await readers.form_of_caller(pid) for pid in (30, 31, 30, 31, 31)]
        fake_process(proc, 30, "/usr/bin/python3.11", [library(tmp_path, "libnetcdf.so.22", "4.10.1")], vsize=5000)
        return forms + [await readers.form_of_caller(30), await readers.form_of_caller(30, opens=False)]

    assert trio.run(main) == ["zarr", "nc49", "zarr", "nc49", "nc49", "nc410", "nc410"]
    assert handed == [(30,), (31,), (30,)]  # (the first looks, and the process that grew)
    assert readers.statistics() == {"zarr": {"python3.11": 2}, "nc49": {"ncdump (netCDF-C 4.9.0)": 3},
                                    "nc410": {"python3.11 (netCDF-C 4.10.1)": 1}}


def test_version_from_soname_when_the_file_says_nothing(tmp_path):
    proc = tmp_path / "proc"
    fake_process(proc, 30, "/usr/bin/x", ["/nonexistent/libnetcdf.so.19"])
    fake_process(proc, 31, "/usr/bin/y", ["/nonexistent/libnetcdf.so.22"])
    readers = ReaderIdentifier(proc=str(proc))
    assert (readers.identify(30).form, readers.identify(31).form) == ("nc49", "nc410")


def test_library_of_a_chrooted_process(tmp_path):
    """A program in a chroot (a Debian 13 userland on a Debian 12 host) maps its own root's library:
    its version is read through /proc/PID/root, not from the host's file of the same path."""
    proc, root = tmp_path / "proc", tmp_path / "trixie"
    (root / "usr/lib").mkdir(parents=True)
    library(root / "usr/lib", "libnetcdf.so.22", "4.9.3")
    fake_process(proc, 40, "/usr/bin/ncdump", ["/usr/lib/libnetcdf.so.22"])
    (proc / "40" / "root").symlink_to(root)
    reader = ReaderIdentifier(proc=str(proc)).identify(40)
    assert (reader.label, reader.form) == ("ncdump (netCDF-C 4.9.3)", "nc493")


@pytest.mark.parametrize("code, env, form", [
    ("import netCDF4", {}, "nc410"),  # the wheel's netCDF-C 4.10.1
    ("import zarr", {}, "zarr"),
    ("import zarr", {"REFMOUNT_FORM": "gdal"}, "gdal"),
])
def test_real_python_processes(code, env, form):
    if code == "import netCDF4" and not WHEEL_NETCDF:
        pytest.skip("no netCDF4 wheel here")
    child = subprocess.Popen([sys.executable, "-c", f"{code}; import sys; print('ready', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, **env})
    try:
        assert child.stdout.readline().strip() == b"ready"
        assert ReaderIdentifier().identify(child.pid).form == form
    finally:
        child.stdin.close()
        child.wait(10)


def test_real_debian_ncdump(tmp_path):
    """Debian's ncdump maps its libnetcdf at start (Debian 12: .so.19, 4.9.0: nc49; Debian 13: .so.22,
    4.9.3: nczarr, also run chrooted from REFMOUNT_TEST_NETCDF_ROOT): caught while it waits to open a
    FIFO (netCDF-C 4.9.3 fails at once on a pipe it cannot seek)."""
    if not tool_exists("ncdump"):
        pytest.skip("Debian's ncdump is not installed")
    version = netcdf_version()
    wanted = (f"ncdump (netCDF-C {'.'.join(map(str, version))})", netcdf_form(version))
    fifo = tmp_path / "waits"
    os.mkfifo(fifo)
    child = subprocess.Popen([*tool("ncdump"), str(fifo)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        reader = ReaderIdentifier().identify(child.pid)
        while (reader.label, reader.form) != wanted and time.monotonic() < deadline:
            time.sleep(0.01)
            reader = ReaderIdentifier().identify(child.pid)
        assert (reader.label, reader.form) == wanted
    finally:
        child.kill()  # (it would wait for the FIFO, and again at each reopen)
        child.wait(10)


# -- what each form serves ----------------------------------------------------------------------

def planned(zarray: dict, zattrs: dict) -> ArrayInfo:
    from refmount.view.arrays import _plan

    info = ArrayInfo(path="v", dir_id=1, zarray=zarray, zattrs=zattrs)
    _plan(info)
    return info


def zarray(dtype, shape, fill=None, chunks=None):
    return {"zarr_format": 2, "dtype": dtype, "shape": shape, "chunks": chunks or shape, "fill_value": fill,
            "order": "C", "compressor": None, "filters": None}


def test_characters_in_each_form():
    info = planned(zarray("|S1", [3, 4]), {"_ARRAY_DIMENSIONS": ["x", "n"]})
    served = {name: served_array(info, form) for name, form in FORMS.items()}
    assert {n: (z["dtype"], z["shape"]) for n, (z, _) in served.items()} == {
        "nc49": ("<U1", [3, 4]), "nc493": (">S1", [3, 4]), "nc410": (">S1", [3, 4]), "zarr": ("|S1", [3, 4]),
        "gdal": ("|S4", [3]), "portable": ("|u1", [3, 4])}
    assert served["gdal"][1]["_ARRAY_DIMENSIONS"] == ["x"] and served["nc410"][1]["_ARRAY_DIMENSIONS"] == ["x", "n"]
    one = planned(zarray("|S1", [5]), {"_ARRAY_DIMENSIONS": ["n"]})  # (1-D: one string in netCDF, bytes to GDAL)
    assert {n: served_array(one, f)[0]["dtype"] for n, f in FORMS.items()} == {
        "nc49": "<U1", "nc493": ">S1", "nc410": ">S1", "zarr": "|S1", "gdal": "|u1", "portable": "|u1"}
    split = planned(zarray("|S1", [3, 4], chunks=[3, 2]), {"_ARRAY_DIMENSIONS": ["x", "n"]})  # (strings across chunks)
    assert served_array(split, FORMS["gdal"])[0]["dtype"] == "|u1"


def test_fixed_strings_in_each_form():
    info = planned(zarray("|S5", [2]), {"_ARRAY_DIMENSIONS": ["x"]})
    served = {name: served_array(info, form) for name, form in FORMS.items()}
    assert served["nc49"][0]["shape"] == [2, 5] and served["nc49"][1]["_ARRAY_DIMENSIONS"] == ["x", "string5"]
    for name in ("zarr", "nc410"):
        assert (served[name][0]["dtype"], served[name][0]["shape"]) == ("|S5", [2])
    # (netCDF-C reads an empty '|S5' as a NULL string, which NCO crashes on: characters, as for 4.9.0)
    assert (served["nc493"][0]["dtype"], served["nc493"][0]["shape"]) == (">S1", [2, 5])
    assert served["nc493"][1]["_ARRAY_DIMENSIONS"] == ["x", "string5"]


def test_scalars_in_each_form():
    info = planned(zarray("<f8", []), {"units": "s"})
    served = {name: served_array(info, form) for name, form in FORMS.items()}
    for name in ("nc49", "nc493", "nc410", "portable"):  # (netCDF-C reads no Zarr scalar: docs/views-and-clients.md)
        assert served[name][0]["shape"] == [1] and served[name][1]["_ARRAY_DIMENSIONS"] == [SCALAR_DIMENSION]
    for name in ("zarr", "gdal"):
        assert served[name][0]["shape"] == [] and served[name][1]["_ARRAY_DIMENSIONS"] == []


def test_unsigned_for_gdal_and_hints_per_netcdf_version():
    info = planned(zarray("<i2", [3], fill=-1), {"_Unsigned": "true", "_FillValue": -1, "valid_range": [0, -2],
                                                 "_ARRAY_DIMENSIONS": ["x"]})
    gz, ga = served_array(info, FORMS["gdal"])
    assert (gz["dtype"], gz["fill_value"], ga["_FillValue"], ga["valid_range"]) == ("<u2", 65535, 65535, [0, 65534])
    for name in ("nc49", "nc410", "zarr"):
        z, a = served_array(info, FORMS[name])
        assert (z["dtype"], a["_Unsigned"]) == ("<i2", "true")
    a49, a410 = served_array(info, FORMS["nc49"])[1], served_array(info, FORMS["nc410"])[1]
    assert "_NCZARR_ATTR" in a49 and "_nczarr_attr" not in a49
    assert "_NCZARR_ATTR" not in a410
    assert not any(k.lower() == "_nczarr_attr" for k in ga)


def test_attributes_netcdf_49_fails_on_stay_for_json_readers():
    info = planned(zarray("<f4", [2]), {"tags": ["a", "b"], "empty": [], "_ARRAY_DIMENSIONS": ["x"]})
    for name in ("nc49", "nc493", "portable"):
        assert "tags" not in served_array(info, FORMS[name])[1]
    a410 = served_array(info, FORMS["nc410"])[1]  # (4.10 reads a list of strings typed as its own writer types it)
    assert a410["tags"] == ["a", "b"] and a410["_nczarr_attr"]["types"]["tags"] == "|S128" and "empty" not in a410
    for name in ("zarr", "gdal"):
        assert served_array(info, FORMS[name])[1]["tags"] == ["a", "b"]
