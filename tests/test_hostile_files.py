"""Hostile data files (not reference sets): a netCDF/HDF5/TIFF/... file mounted directly is someone
else's, and its scan, perhaps by root's daemon, must never read a local file, wait on one, or allocate
or loop without bound. Each file is served by a loopback Range server (and, where it matters, mounted by
an ordinary local path) and mounted for real; the oracle is what the mount serves and says, and whether
the scanner opened a FIFO the file names (a blocking open for writing returns only when it does)."""

from __future__ import annotations

import os
import struct
import threading

import h5py
import numpy as np
import pytest



class _Fifo:
    """A FIFO at `path`; `opened` is set if anyone opens it for reading (our writer's open returns)."""

    def __init__(self, path) -> None:
        self.path = str(path)
        os.mkfifo(self.path)
        self.opened = threading.Event()
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        fd = os.open(self.path, os.O_WRONLY)  # (blocks until a reader comes)
        self.opened.set()
        try:
            os.write(fd, b"FIFO-SECRET".ljust(64, b"!"))
        except BrokenPipeError:
            pass  # (the reader went away)
        finally:
            os.close(fd)

    def close(self) -> None:
        if not self.opened.is_set():  # (let our own writer through, to end its thread)
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            self._thread.join(5)
            os.close(fd)
        self._thread.join(5)


def _listing(root) -> dict[str, bytes]:
    """Every file of the mount and its bytes (or the error reading it)."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            try:
                out[str(path.relative_to(root))] = path.read_bytes()
            except OSError as e:
                out[str(path.relative_to(root))] = repr(e).encode()
    return out


@pytest.mark.parametrize("where", ["remote", "local"])
def test_hdf5_external_storage_and_virtual_datasets_are_left_out_never_read(mount, server, tmp_path, where):
    """HDF5 external storage (EFL) names any path: `external=[('/etc/shadow', 0, N)]`. kerchunk reads a
    compound or variable-length dataset whole while it scans, so HDF5 opened the named file in the scan
    worker (root's, for a remote file too): a FIFO there hung the scan, a device file was opened. Other
    EFL and virtual datasets were mounted as arrays of their fill value (zeros, -1): wrong values. Each
    is now left out with one line before anything reads it; the rest of the file mounts."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"SECRETDATA-local-file-contents-1234567890\n")
    secret.chmod(0o600)
    private = tmp_path / "private.h5"
    with h5py.File(private, "w") as f:
        f["priv"] = np.arange(10, dtype="i4") * 7
    fifo = _Fifo(tmp_path / "fifo")
    try:
        name = server.root / "hostile.h5"
        with h5py.File(name, "w") as f:
            f["ok"] = np.arange(4, dtype="f4")
            f.create_dataset("efl", shape=(42,), dtype="u1", external=[(str(secret), 0, 42)])
            f.create_dataset("efl_rel", shape=(42,), dtype="u1", external=[("../../../../../../../" + str(secret), 0, 42)])
            f.create_dataset("efl_fifo", shape=(1,), dtype=[("a", "S42")], external=[(fifo.path, 0, 42)])
            f.create_dataset("efl_vlen", shape=(2,), dtype=h5py.string_dtype(), external=[(str(secret), 0, 32)])
            layout = h5py.VirtualLayout(shape=(10,), dtype="i4")
            layout[:] = h5py.VirtualSource(str(private), "priv", shape=(10,))
            f.create_virtual_dataset("vds", layout, fillvalue=-1)
        m = mount(server.url_for("hostile.h5") if where == "remote" else name)
        files = _listing(m.path)
        assert files["ok/0"] == np.arange(4, dtype="f4").tobytes()
        assert not fifo.opened.is_set(), "the scan opened a FIFO the remote file named"
        assert sorted(p.name for p in m.path.iterdir() if not p.name.startswith(".")) == ["ok"], files.keys()
        assert not any(b"SECRET" in data for data in files.values())
        log = m.log()
        for variable in ("efl", "efl_rel", "efl_fifo", "efl_vlen"):
            assert f"variable {variable}: its values are in external files (HDF5 external storage: not " \
                   "virtualised)" in log, log
        assert "variable vds: a virtual dataset: its values are in other files (not virtualised)" in log, log
        assert "Traceback" not in log, log
    finally:
        fifo.close()


def test_hdf5_external_and_soft_links_reach_no_local_file(mount, server, tmp_path):
    """An external link to a local HDF5 file (and one to /etc/passwd) and soft links, a loop among
    them: the scan opens the remote file through the pipe alone, and follows no link out of it."""
    private = tmp_path / "private.h5"
    with h5py.File(private, "w") as f:
        f["priv"] = np.arange(10, dtype="i4") * 7
    fifo = _Fifo(tmp_path / "fifo.h5")
    try:
        with h5py.File(server.root / "links.h5", "w") as f:
            f["ok"] = np.arange(4, dtype="f4")
            f["ext"] = h5py.ExternalLink(str(private), "/priv")
            f["ext_fifo"] = h5py.ExternalLink(fifo.path, "/x")
            f["ext_passwd"] = h5py.ExternalLink("/etc/passwd", "/x")
            f["soft"] = h5py.SoftLink("/ok")
            f["loop_a"] = h5py.SoftLink("/loop_b")
            f["loop_b"] = h5py.SoftLink("/loop_a")
        m = mount(server.url_for("links.h5"))
        files = _listing(m.path)
        assert not fifo.opened.is_set()
        assert files["ok/0"] == np.arange(4, dtype="f4").tobytes()
        assert not any(key.startswith(("ext", "loop")) for key in files), files.keys()
        assert not any(np.arange(10, dtype="i4").__mul__(7).tobytes() in data for data in files.values())
        assert "Traceback" not in m.log()
    finally:
        fifo.close()


def _tiff(entries: list[tuple[int, int, int]], tail: bytes = b"", next_ifd_is_itself: bool = False) -> bytes:
    """A classic little-endian TIFF of one IFD at offset 8: (tag, LONG value) entries, `tail` after it."""
    ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", tag, 4, 1, value)
                                                     for tag, value in sorted(entries))
    return b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", 8 if next_ifd_is_itself else 0) + tail


_GRAY = [(256, 16), (257, 16), (258, 8), (259, 1), (262, 1), (277, 1)]  # 16 x 16, 8 bits, no compression


@pytest.mark.parametrize("layout", ["tiles", "strips"])
def test_a_tiff_declaring_millions_of_tiles_in_a_few_bytes_is_refused_at_once(mount, server, layout):
    """ImageWidth and ImageLength of 65,536 over 16 x 16 tiles (or one-row strips of a 2**24-row image)
    with one offset, in a 434-byte file: kerchunk listed 16.7 million chunks, the scanner busy until
    --load-timeout (300 s; again at each lookup of a lazily mounted file). Refused in one line at once:
    each tile or strip needs an offset in the file."""
    size = {256: 65536, 257: 65536} if layout == "tiles" else {257: 1 << 24}
    tags = [(tag, size.get(tag, value)) for tag, value in _GRAY]
    tags += [(322, 16), (323, 16), (324, 200), (325, 256)] if layout == "tiles" else [(278, 1), (273, 200), (279, 16)]
    (server.root / "many.tif").write_bytes(_tiff(tags, bytes(300)))
    (server.root / "loop.tif").write_bytes(_tiff(_GRAY + [(278, 16), (273, 200), (279, 256)], bytes(600), True))
    with pytest.raises(RuntimeError) as refused:
        mount(server.url_for("many.tif"), "--load-timeout", "20")
    said = [line for line in str(refused.value).splitlines() if line.strip()]
    assert said[-1].endswith(f"refmount: '{server.url_for('many.tif')}': TIFF file that cannot be scanned: its images "
                             f"declare 16,777,216 tiles or strips, more than its {len(_tiff(tags, bytes(300))):,} "
                             "bytes can hold offsets for"), said
    m = mount(server.url_for("loop.tif"))  # (an IFD that names itself as the next: tifffile stops there)
    assert (m / "0" / "0.0").read_bytes() == bytes(256)


def _netcdf3(numrecs: int, record_begin: int) -> bytes:
    """A CDF-1 header of one float record variable v(t), its records from `record_begin`."""
    name = lambda text: struct.pack(">I", len(text)) + text.encode().ljust(4, b"\0")  # noqa: E731
    return (b"CDF\x01" + struct.pack(">I", numrecs) + struct.pack(">II", 0x0A, 1) + name("t") + struct.pack(">I", 0)
            + struct.pack(">II", 0, 0) + struct.pack(">II", 0x0B, 1) + name("v") + struct.pack(">II", 1, 0)
            + struct.pack(">II", 0, 0) + struct.pack(">III", 5, 4, record_begin))


def test_a_netcdf3_header_declaring_billions_of_records_is_refused_at_once(mount, server):
    """numrecs 2**31-1 in a 264-byte file: kerchunk wrote a reference per record until the scanner hit
    its memory cap (37 s under a 3 GiB cap, or --load-timeout). Refused at once, in one line; the same
    file holding the records it declares mounts and reads."""
    (server.root / "lies.nc").write_bytes(_netcdf3(2**31 - 1, 200).ljust(200, b"\0") + bytes(64))
    with pytest.raises(RuntimeError) as refused:
        mount(server.url_for("lies.nc"), "--load-timeout", "20")
    assert str(refused.value).strip().endswith(
        f"refmount: '{server.url_for('lies.nc')}': netCDF-3 file that cannot be scanned: it is truncated (its header "
        "declares 2,147,483,647 records of 4 bytes from byte 200, past its 264 bytes)"), refused.value
    values = np.arange(16, dtype=">f4")
    (server.root / "honest.nc").write_bytes(_netcdf3(16, 200).ljust(200, b"\0") + values.tobytes())
    m = mount(server.url_for("honest.nc"))
    chunks = sorted((p for p in (m / "v").iterdir() if not p.name.startswith(".")), key=lambda p: int(p.name))
    assert b"".join(p.read_bytes() for p in chunks) == values.astype("<f4").tobytes()


def test_a_grib_file_of_thousands_of_bogus_messages_says_so_in_a_bounded_number_of_lines(mount, server):
    """20,000 16-byte 'GRIB' headers before a real message, in a 335 kB file: one log line each (a
    100 MB file would write 6 million). The first 1,000 are named, the rest counted in one line; the
    real message still mounts."""
    import datetime as dt

    from tests.support.gribfiles import grib2

    real = grib2(dt.datetime(2024, 1, 1), 3)[0]
    bogus = b"GRIB\0\0\0\x02" + struct.pack(">Q", 16)
    (server.root / "many.grib2").write_bytes(bogus * 20000 + real)
    m = mount(server.url_for("many.grib2"))
    assert (m / "t2m").is_dir()
    said = [line for line in m.log().splitlines() if "left out" in line]
    assert len(said) == 1001, len(said)
    assert said[-1].endswith("variable 19,000 more of them, not named one by one (cannot be referenced; left out)"), said[-1]


def test_a_grib_message_declaring_a_terabyte_is_left_out_and_the_rest_of_the_file_mounts(mount, server):
    """A first message whose length says 2**40 bytes in an 18 kB file: its read stopped at the file's
    last end marker, and eccodes failed the whole file ('MemoryAllocationError'). That message is left
    out in one line; the file's six real messages mount."""
    import datetime as dt

    from tests.support.gribfiles import grib2

    real = grib2(dt.datetime(2024, 1, 1), 3)[0]
    first = bytearray(real[:real.index(b"7777") + 4])
    first[8:16] = struct.pack(">Q", 2**40)
    (server.root / "liar.grib2").write_bytes(bytes(first) + real)
    m = mount(server.url_for("liar.grib2"))
    assert (m / "t2m").is_dir() and (m / "prmsl").is_dir()
    said = [line for line in m.log().splitlines() if "left out" in line]
    assert said == [f"refmount: WARNING: {server.url_for('liar.grib2')}: variable a GRIB message at byte 0 whose length "
                    "(1099511627776) does not end at its end marker (cannot be referenced; left out)"], said
