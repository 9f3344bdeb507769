"""Which codecs the daemon decodes with: the ones refmount/refs/codecs.py names, and no other.

A reference set is someone else's file and the daemon may run as root: a chunk "compressed" with
``pickle`` ran code on decode (held back only by numcodecs' own guard, which an environment variable
lifts and Debian 12's numcodecs 0.10 lacks), and any id an installed package registers loaded that
package. Real mounts: such an array is hidden in one line naming its codec, nothing runs (a marker
file stays absent), the raw view serves its bytes verbatim; an image chunk whose header declares a
huge image is an EIO before its C decoder allocates; allowed codecs read as numcodecs/imagecodecs do."""

from __future__ import annotations

import base64
import json
import os
import pickle
import struct
import zlib

import numcodecs
import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.test_hostile_sources import _peak_kb


class _Touch:
    """Unpickled, it creates a file: what a hostile chunk's pickle would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _zarray(shape, chunks, dtype, compressor=None, filters=None) -> str:
    return json.dumps({"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "compressor": compressor,
                       "filters": filters, "fill_value": 0, "order": "C"})


def _inline(data: bytes) -> str:
    return "base64:" + base64.b64encode(data).decode()


def _array(refs: dict, name: str, shape, dtype, chunk: bytes, compressor=None, filters=None) -> None:
    refs[f"{name}/.zarray"] = _zarray(shape, shape, dtype, compressor, filters)
    refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": [f"{name}{n}" for n in range(len(shape))]})
    refs[f"{name}/" + ".".join("0" * len(shape))] = _inline(chunk)


def _names(m) -> list[str]:
    return sorted(p.name for p in m.path.iterdir() if not p.name.startswith("."))


def test_pickle_is_hidden_and_never_runs_even_with_numcodecs_guard_lifted(mount, tmp_path):
    marker = tmp_path / "PWNED"
    payload = pickle.dumps(_Touch(str(marker)))
    values = np.arange(6, dtype="<i4")
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    _array(refs, "x", [4], "<i4", payload, compressor={"id": "pickle"})
    _array(refs, "s", [2], "|O", payload, filters=[{"id": "pickle"}])  # (the vlen-string scan makes codecs too)
    _array(refs, "fine", [6], "<i4", numcodecs.Zlib(5).encode(numcodecs.Delta("<i4").encode(values)),
           compressor={"id": "zlib", "level": 5}, filters=[{"id": "delta", "dtype": "<i4"}])
    env = {**os.environ, "NUMCODECS_ALLOW_UNSAFE_PICKLE_DECODE": "1"}
    m = mount(refs, env=env)
    assert _names(m) == ["fine"]
    assert np.array_equal(np.frombuffer((m / "fine/0").read_bytes(), "<i4"), values)
    with pytest.raises(FileNotFoundError):
        (m / "x/0").read_bytes()
    log = m.log()
    assert "hiding array x: codec 'pickle' is not one refmount decodes" in log, log
    assert "hiding array s: " in log and "codec 'pickle' is not one refmount decodes" in log, log
    raw = mount(refs, "--view", "raw", env=env)  # (raw never decodes: the stored bytes, verbatim)
    assert (raw / "x/0").read_bytes() == payload
    assert not marker.exists()
    path = tmp_path / "evil.json"
    path.write_text(json.dumps(refs))
    result = run_refmount("inspect", "--json", path, env=env)
    assert result.returncode == 0, result.stderr
    assert "codec 'pickle' is not one refmount decodes" in result.stdout
    assert not marker.exists()


def test_a_zarr3_numcodecs_pickle_codec_is_hidden_too(mount, tmp_path):
    """Zarr v3's ``numcodecs.<id>`` codec names reach the same list."""
    marker = tmp_path / "PWNED"
    payload = pickle.dumps(_Touch(str(marker)))
    array = {"zarr_format": 3, "node_type": "array", "shape": [4], "data_type": "int32",
             "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
             "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 0,
             "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "numcodecs.pickle"}],
             "attributes": {}, "dimension_names": ["n"]}
    fine = {**array, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip"}]}
    refs = {"zarr.json": json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}),
            "x/zarr.json": json.dumps(array), "x/c/0": _inline(payload),
            "y/zarr.json": json.dumps(fine), "y/c/0": _inline(numcodecs.GZip(5).encode(np.arange(4, dtype="<i4")))}
    m = mount(refs, env={**os.environ, "NUMCODECS_ALLOW_UNSAFE_PICKLE_DECODE": "1"})
    assert _names(m) == ["y"]
    assert (m / "y/0").read_bytes() == np.arange(4, dtype="<i4").tobytes()
    assert "hiding array x: codec 'pickle' is not one refmount decodes" in m.log(), m.log()
    assert not marker.exists()


def test_an_entry_point_codec_of_an_installed_package_is_never_imported(mount, tmp_path):
    """A package registering a numcodecs codec by entry point: numcodecs' registry would import it at
    the first chunk decoded. refmount hides the array and imports nothing."""
    site = tmp_path / "site"
    (site / "evilcodec-1.0.dist-info").mkdir(parents=True)
    (site / "evilcodec-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: evilcodec\nVersion: 1.0\n")
    (site / "evilcodec-1.0.dist-info" / "entry_points.txt").write_text("[numcodecs.codecs]\nevil = evilcodec:Evil\n")
    marker = tmp_path / "IMPORTED"
    (site / "evilcodec.py").write_text(f"open({str(marker)!r}, 'w').close()\nfrom numcodecs import Zlib as Evil\n")
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    _array(refs, "e", [4], "<i4", zlib.compress(bytes(16)), compressor={"id": "evil"})
    _array(refs, "z", [4], "<i4", zlib.compress(bytes(16)), compressor={"id": "zlib"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    m = mount(refs, env=env)
    assert _names(m) == ["z"]
    assert (m / "z/0").read_bytes() == bytes(16)
    assert "hiding array e: codec 'evil' is not one refmount decodes" in m.log()
    assert not marker.exists()


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", zlib.crc32(chunk[4:]))


def _jpeg_header(width: int, height: int) -> bytes:
    return b"\xff\xd8" + b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9) + b"\xff\xda"


def test_image_chunks_declaring_a_huge_image_are_refused_before_decoding(mount):
    imagecodecs = pytest.importorskip("imagecodecs")
    image = (np.arange(16 * 16 * 3) % 251).astype("u1").reshape(16, 16, 3)
    png = imagecodecs.png_encode(image)
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    huge_png = _png_header(60000, 60000) + png[33:]  # (its own IDAT, under a header of 10.8 GB)
    _array(refs, "png_huge", [16, 16, 3], "|u1", huge_png, compressor={"id": "imagecodecs_png"})
    _array(refs, "jpeg_huge", [16, 16, 3], "|u1", _jpeg_header(65000, 65000), compressor={"id": "imagecodecs_jpeg"})
    _array(refs, "png", [16, 16, 3], "|u1", png, compressor={"id": "imagecodecs_png"})
    jpeg = imagecodecs.jpeg8_encode(image, level=95)
    _array(refs, "jpeg", [16, 16, 3], "|u1", jpeg, compressor={"id": "imagecodecs_jpeg"})
    _array(refs, "lerc", [4], "<f4", bytes(16), compressor={"id": "imagecodecs_lerc"})  # (no header check: not listed)
    m = mount(refs)
    assert _names(m) == ["jpeg", "jpeg_huge", "png", "png_huge"]
    assert (m / "png/0.0.0").read_bytes() == image.tobytes()
    assert (m / "jpeg/0.0.0").read_bytes() == imagecodecs.jpeg8_decode(jpeg).tobytes()  # (lossy: the oracle's decode)
    for name in ("png_huge", "jpeg_huge"):
        with pytest.raises(OSError) as e:
            (m / f"{name}/0.0.0").read_bytes()
        assert e.value.errno == 5
    log = m.log()
    assert "declares 10800000000 decoded bytes, more than the expected 768" in log, log
    assert "declares 12675000000 decoded bytes, more than the expected 768" in log, log
    assert "hiding array lerc: codec 'imagecodecs_lerc' is not one refmount decodes" in log, log
    assert _peak_kb(m.proc.pid) < 600 << 10, log
