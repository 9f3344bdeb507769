"""HDF4 (MODIS) and FITS files mounted directly (issue 40): real files of other projects' test suites
(kerchunk's MOD14.hdf4, astropy's FITS test files; tests/data/hdf4/ and tests/data/fits/ say where each
comes from), one file, a glob, over HTTP. Oracles: GDAL (gdal_translate, Debian's gdal-bin, its own
HDF4 library) on the HDF4 file, astropy on the FITS file. What cannot be virtualised (compression no
codec maps, tables, tile-compressed images) is one log line per variable and the rest mounts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump

HDF4 = Path(__file__).parent / "data" / "hdf4"
FITS = Path(__file__).parent / "data" / "fits"
MOD14 = HDF4 / "MOD14.hdf4"
FLOATS = ["gdal_float3d.hdf", "float_chunked.hdf", "float_gzip_chunked.hdf", "float_gzip.hdf"]
FLOAT_SDS = "3-dimensional Scientific Dataset"
FITS_IMAGES = ["arange.fits", "blank.fits", "scale.fits", "test0.fits", "o4sp040b0_raw.fits", "fixed-1890.fits"]

needs_gdal = pytest.mark.skipif(shutil.which("gdal_translate") is None, reason="needs GDAL's gdal_translate")


@pytest.fixture(autouse=True)
def scans(tmp_path, monkeypatch):
    """Each test keeps its scans in a directory of its own (a second test must scan again)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _envi_dtype(code: int, big: bool) -> np.dtype:
    kinds = {1: "u1", 2: "i2", 3: "i4", 4: "f4", 5: "f8", 12: "u2", 13: "u4", 14: "i8", 15: "u8"}
    return np.dtype(kinds[code]).newbyteorder(">" if big else "<")


def gdal_sds(path: Path, tmp_path: Path) -> dict[str, np.ndarray]:
    """{SDS name: values as GDAL reads it} of an HDF4 file (gdal_translate to ENVI, read back raw).
    A 3-D SDS comes out as bands: moved back to the SDS's order (bands are its last axis)."""
    info = subprocess.run(["gdalinfo", str(path)], capture_output=True, text=True, check=True).stdout
    names = re.findall(r"SUBDATASET_\d+_NAME=(.*)", info)
    descs = re.findall(r"SUBDATASET_\d+_DESC=\[[^\]]*\] (.*) \(", info)
    pairs = list(zip(names, descs)) or [(str(path), None)]
    out = {}
    for i, (sub, desc) in enumerate(pairs):
        raw = tmp_path / f"gdal{i}.raw"
        subprocess.run(["gdal_translate", "-q", "-of", "ENVI", sub, str(raw)], check=True)
        hdr = dict(re.findall(r"^([a-z ]+?)\s*=\s*(.*)$", raw.with_suffix(".hdr").read_text(), re.MULTILINE))
        shape = (int(hdr["bands"]), int(hdr["lines"]), int(hdr["samples"]))
        values = np.fromfile(raw, _envi_dtype(int(hdr["data type"]), hdr.get("byte order") == "1"))
        values = values.reshape(shape)
        out[desc or FLOAT_SDS] = values[0] if shape[0] == 1 else np.moveaxis(values, 0, -1)
    return out


def open_raw(path):
    import xarray as xr

    return xr.open_zarr(path, mask_and_scale=False, decode_times=False, consolidated=True)


# ----------------------------------------------------------------------------- sniffing


def test_hdf4_and_fits_are_told_by_their_first_bytes():
    from refmount.refs.scan.formats import sniff

    assert sniff(MOD14.read_bytes()[:64]) == "hdf4"
    assert sniff((FITS / "arange.fits").read_bytes()[:64]) == "fits"
    assert sniff(b"\x0e\x03\x13") is None  # (cut short)
    assert sniff(b"SIMPLE =" + b" " * 80) is None  # a card must say `SIMPLE  =` exactly


# ----------------------------------------------------------------------------- HDF4


@needs_gdal
def test_modis_fire_product_reads_as_gdal_reads_it(mount, tmp_path):
    """kerchunk's MOD14.hdf4 (a MODIS granule: deflate chunks, empty fire-pixel lists, ODL metadata)."""
    expected = gdal_sds(MOD14, tmp_path)
    assert set(expected) == {"fire mask", "algorithm QA", "CMG_night"}
    m = mount(str(MOD14), "--view", "raw")
    with open_raw(m.path) as ds:
        for name, values in expected.items():
            got = ds[name].values
            assert got.dtype == values.dtype.newbyteorder("=") and np.array_equal(got, values), name
        assert ds["fire mask"].dims == ("number_of_scan_lines", "pixels_per_scan_line")  # the file's dimensions
        assert list(ds["fire mask"].attrs["valid_range"]) == [0, 9]  # (gdalinfo: valid_range=0, 9)
        assert ds["FP_latitude"].shape == (0,) and ds["FP_latitude"].attrs["units"] == "degrees"
        assert ds.attrs["SHORTNAME"] == "MOD14"
    assert "left out" not in m.log(), m.log()


@needs_gdal
def test_modis_decoded_view_in_ncdump_equals_gdal(mount, tmp_path):
    expected = gdal_sds(MOD14, tmp_path)["CMG_night"]
    m = mount(str(MOD14))
    dumped = parse_ncdump(ncdump(nczarr_url(m.path), variables=["CMG_night"]))
    compare_dumped(dumped["CMG_night"], expected, [], "ncdump CMG_night")


@needs_gdal
@pytest.mark.parametrize("name", FLOATS)
def test_float_sds_in_every_layout_reads_as_gdal_reads_it(mount, tmp_path, name):
    """Big-endian floats (kerchunk's own reader takes them for little-endian), contiguous or chunked
    (edge chunks), plain or deflated: the same values as GDAL's."""
    expected = gdal_sds(HDF4 / name, tmp_path)[FLOAT_SDS]
    m = mount(str(HDF4 / name), "--view", "raw")
    with open_raw(m.path) as ds:
        got = ds[FLOAT_SDS].values
    assert got.shape == (37, 53, 3) and np.isnan(got).sum() == 1
    np.testing.assert_array_equal(got, expected)
    assert 273 < np.nanmax(got[..., 0]) < 274  # (sin * cos * 273.15: a byte-order mistake is not near)


@pytest.mark.parametrize("name, kind", [("float_huff.hdf", "SKPHUFF"), ("float_rle.hdf", "RLE")])
def test_compression_no_codec_maps_is_one_line_and_no_array(mount, name, kind):
    m = mount(str(HDF4 / name), "--view", "raw")
    assert FLOAT_SDS not in os.listdir(m.path)
    lines = [line for line in m.log().splitlines() if FLOAT_SDS in line]
    assert len(lines) == 1 and f"{kind} compression" in lines[0], m.log()


def _mark_chunks(data: bytearray, variable: str, ctype: int) -> bytearray:
    """`data` (MOD14) with the compression type in `variable`'s chunk headers changed to `ctype`: a
    variable compressed in a way no codec maps, beside variables that are not."""
    import kerchunk.hdf4

    walker = kerchunk.hdf4.HDF4ToZarr(str(MOD14))
    walker.translate()
    var = next(i for (t, _), i in walker.tags.items() if t == "VG" and i.get("name") == variable)
    rows = walker.tags[("SD", dict(zip(var["tag"], var["refs"]))["SD"])]["data"][:-1]
    offsets = {row[1] for row in rows}  # (kerchunk's rows: key, offset of the compressed block, ...)
    changed = 0
    for (tag, _), info in walker.tags.items():
        if tag == "CHUNK" and info["extended"]:
            start = info["offset"]  # special code 2, version 2, length 4, data ref 2, model 2, type 2
            data_ref = int.from_bytes(data[start + 8:start + 10], "big")
            if walker.tags[("COMPRESSED", data_ref)]["offset"] in offsets:
                data[start + 12:start + 14] = ctype.to_bytes(2, "big")
                changed += 1
    assert changed == len(rows) > 1
    return data


@needs_gdal
def test_one_variable_refused_the_rest_mounts(mount, tmp_path):
    """MOD14 with CMG_night's chunks marked skipping-Huffman: one log line for CMG_night, the fire mask
    still reads as GDAL reads the original; `refmount inspect` lists what was not referenced."""
    path = tmp_path / "MOD14_marked.hdf4"
    path.write_bytes(_mark_chunks(bytearray(MOD14.read_bytes()), "CMG_night", 3))
    expected = gdal_sds(MOD14, tmp_path)
    m = mount(str(path), "--view", "raw")
    lines = [line for line in m.log().splitlines() if "CMG_night" in line]
    assert len(lines) == 1 and "SKPHUFF compression" in lines[0] and "left out" in lines[0], m.log()
    with open_raw(m.path) as ds:
        assert "CMG_night" not in ds
        assert np.array_equal(ds["fire mask"].values, expected["fire mask"])
    out = run_refmount("inspect", str(path))
    assert out.returncode == 0, out.stderr
    assert "CMG_night: not referenced (SKPHUFF compression" in out.stdout, out.stdout
    assert "1 HDF4 file: arrays: every SD-interface SDS" in out.stdout and "not virtualised: SZIP" in out.stdout


def test_hdf4_whose_descriptor_list_loops_is_one_line_not_a_hang(tmp_path):
    """A hostile file: the first block of data descriptors names itself as the next. kerchunk's walk
    would follow it until --load-timeout; the scan says what is wrong at once."""
    data = bytearray(MOD14.read_bytes())
    data[6:10] = (4).to_bytes(4, "big")  # (after the signature: ndd 2 bytes, next 4 bytes)
    path = tmp_path / "loop.hdf"
    path.write_bytes(data)
    out = run_refmount("scan", str(path), "-o", str(tmp_path / "out.json"), timeout=60)
    assert out.returncode != 0 and "loops back on itself" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


@needs_gdal
def test_glob_of_hdf4_files_and_one_over_http(mount, tmp_path, server):
    expected = gdal_sds(HDF4 / "float_gzip_chunked.hdf", tmp_path)[FLOAT_SDS]
    data = tmp_path / "granules"
    data.mkdir()
    for name in FLOATS:
        shutil.copy(HDF4 / name, data / name)
    m = mount(str(data / "*.hdf"), "--view", "raw")
    assert sorted(n for n in os.listdir(m.path) if not n.startswith(".")) == sorted(FLOATS)
    for name in FLOATS:
        with open_raw(m.path / name) as ds:
            np.testing.assert_array_equal(ds[FLOAT_SDS].values, expected, err_msg=name)
    shutil.copy(MOD14, server.root / "MOD14.hdf4")
    http = mount(server.url_for("MOD14.hdf4"), "--view", "raw")
    with open_raw(http.path) as ds:
        assert np.array_equal(ds["CMG_night"].values, gdal_sds(MOD14, tmp_path)["CMG_night"])


# ----------------------------------------------------------------------------- FITS


def astropy_images(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{name refmount gives the HDU: (stored values, physical values)} of a FITS file's images."""
    from astropy.io import fits

    out, taken = {}, set()
    with fits.open(path, do_not_scale_image_data=True) as raw, fits.open(path) as scaled:
        for index, (r, s) in enumerate(zip(raw, scaled)):
            if not r.is_image or r.header.get("NAXIS", 0) == 0 or isinstance(r, fits.CompImageHDU):
                continue
            name = r.name or f"HDU{index}"
            if name in taken:
                name = f"{name}_{r.header.get('EXTVER', index)}"
            taken.add(name)
            out[name] = (np.array(r.data), np.array(s.data))
    return out


@pytest.mark.parametrize("name", FITS_IMAGES)
def test_fits_images_read_as_astropy_reads_them(mount, name):
    """Stored values in the raw view; BSCALE/BZERO/BLANK applied by xarray as astropy applies them."""
    pytest.importorskip("astropy")
    import xarray as xr

    expected = astropy_images(FITS / name)
    assert expected
    m = mount(str(FITS / name), "--view", "raw")
    with open_raw(m.path) as ds:
        assert sorted(ds.data_vars) == sorted(expected)
        for var, (stored, _) in expected.items():
            got = ds[var].values
            assert got.dtype == stored.dtype.newbyteorder("=") and np.array_equal(got, stored), var
    with xr.open_zarr(m.path, consolidated=True) as ds:
        for var, (_, physical) in expected.items():
            got = ds[var].values
            np.testing.assert_allclose(got, physical, rtol=1e-6, err_msg=var)


def test_fits_scaled_image_is_not_divided_by_bscale(mount):
    """scale.fits has BSCALE != 1: the physical values are BZERO + BSCALE * stored, not stored / BSCALE."""
    pytest.importorskip("astropy")
    from astropy.io import fits

    with fits.open(FITS / "scale.fits") as hdus:
        assert hdus[0].header["BSCALE"] != 1
        physical = np.array(hdus[0].data)
    import xarray as xr

    m = mount(str(FITS / "scale.fits"), "--view", "raw")

    with xr.open_zarr(m.path, consolidated=True) as ds:
        np.testing.assert_allclose(ds["PRIMARY"].values, physical, rtol=1e-6)


# (comp.fits's RICE_1 tiles are read where imagecodecs is installed: tests/test_unseen_files.py)
@pytest.mark.parametrize("name, hdu, what", [("made/tiled.fits", "HCOMPRESS_1", "HCOMPRESS_1 tile compression"),
                                             ("tb.fits", "HDU1", "binary table"),
                                             ("group.fits", "PRIMARY", "random groups")])
def test_fits_hdus_not_virtualised_are_one_line_each(mount, name, hdu, what):
    pytest.importorskip("astropy")
    m = mount(str(FITS / name), "--view", "raw")
    lines = [line for line in m.log().splitlines() if f"{hdu}: " in line]
    assert len(lines) == 1 and what in lines[0], m.log()
    assert not [n for n in os.listdir(m.path) if not n.startswith(".")]
    out = run_refmount("inspect", str(FITS / name))
    assert out.returncode == 0 and f"{hdu}: not referenced (" in out.stdout, out.stdout + out.stderr
    assert "1 FITS file: arrays: every image HDU" in out.stdout


def test_fits_decoded_view_in_ncdump_and_over_http(mount, server):
    """The decoded view of an HST file (four SCI images) read by ncdump, the file served over HTTP."""
    pytest.importorskip("astropy")
    shutil.copy(FITS / "test0.fits", server.root / "test0.fits")
    expected = astropy_images(FITS / "test0.fits")
    m = mount(server.url_for("test0.fits"))
    dumped = parse_ncdump(ncdump(nczarr_url(m.path), variables=["SCI_3"]))
    compare_dumped(dumped["SCI_3"], expected["SCI_3"][0], [], "ncdump SCI_3")


def test_glob_of_fits_files_one_directory_each(mount, tmp_path):
    pytest.importorskip("astropy")
    data = tmp_path / "frames"
    data.mkdir()
    for name in ("test0.fits", "o4sp040b0_raw.fits", "comp.fits"):
        shutil.copy(FITS / name, data / name)
    m = mount(str(data / "*.fits"), "--view", "raw")
    assert sorted(n for n in os.listdir(m.path) if not n.startswith(".")) == ["comp.fits", "o4sp040b0_raw.fits",
                                                                                "test0.fits"]
    for name in ("test0.fits", "o4sp040b0_raw.fits"):
        with open_raw(m.path / name) as ds:
            for var, (stored, _) in astropy_images(FITS / name).items():
                assert np.array_equal(ds[var].values, stored), (name, var)


@needs_gdal
def test_concat_of_modis_granules_along_scan_lines(mount, tmp_path):
    """--concat along a dimension of the file's own (MODIS granules have no coordinate variable)."""
    expected = gdal_sds(MOD14, tmp_path)["fire mask"]
    data = tmp_path / "granules"
    data.mkdir()
    for name in ("a.hdf", "b.hdf"):
        shutil.copy(MOD14, data / name)
    m = mount(str(data / "*.hdf"), "--concat", "number_of_scan_lines", "--view", "raw")
    with open_raw(m.path) as ds:
        assert ds.sizes["number_of_scan_lines"] == 2 * 2030
        assert np.array_equal(ds["fire mask"].values, np.concatenate([expected, expected]))


def test_concat_of_fits_cubes_along_their_slowest_axis(mount, tmp_path):
    pytest.importorskip("astropy")
    stored = astropy_images(FITS / "arange.fits")["PRIMARY"][0]
    data = tmp_path / "cubes"
    data.mkdir()
    for name in ("a.fits", "b.fits"):
        shutil.copy(FITS / "arange.fits", data / name)
    m = mount(str(data / "*.fits"), "--concat", "PRIMARY_naxis3", "--view", "raw")
    with open_raw(m.path) as ds:
        assert np.array_equal(ds["PRIMARY"].values, np.concatenate([stored, stored]))


# ----------------------------------------------------------------------------- DMR++ of HDF4


def _hdf4_dmrpp(blocks: list[tuple[int, int]]) -> bytes:
    """A DMR++ of gdal_float3d.hdf's one SDS as Hyrax writes HDF4's (big-endian, one chunk given as
    dmrpp:block elements)."""
    inner = "".join(f'<dmrpp:block offset="{o}" nBytes="{n}"/>' for o, n in blocks)
    return ('<?xml version="1.0" encoding="UTF-8"?><Dataset xmlns="http://xml.opendap.org/ns/DAP/4.0#" '
            'xmlns:dmrpp="http://xml.opendap.org/dap/dmrpp/1.0.0#" dapVersion="4.0" name="gdal_float3d.hdf" '
            'dmrpp:href="OPeNDAP_DMRpp_DATA_ACCESS_URL"><Dimension name="y" size="37"/><Dimension name="x" size="53"/>'
            '<Dimension name="band" size="3"/><Float32 name="sds"><Dim name="/y"/><Dim name="/x"/><Dim name="/band"/>'
            f'<dmrpp:chunks byteOrder="BE"><dmrpp:chunk chunkPositionInArray="[0,0,0]">{inner}</dmrpp:chunk>'
            '</dmrpp:chunks></Float32></Dataset>').encode()


@needs_gdal
def test_dmrpp_of_hdf4_whose_blocks_follow_each_other_is_one_range(tmp_path):
    """HDF4's DMR++ gives a chunk as dmrpp:block elements (linked blocks): where each block starts
    where the last ends, they are one plain range and read as GDAL reads the file; otherwise refused."""
    import zarr
    from kerchunk.utils import refs_as_store

    from refmount.refs.dmrpp import dmrpp_to_refs
    from refmount.refs.scan.hdf4 import scan_hdf4

    path = HDF4 / "gdal_float3d.hdf"
    _, offset, length = scan_hdf4(str(path))[0][f"{FLOAT_SDS}/0.0.0"]
    third = length // 3
    pieces = [(offset, third), (offset + third, third), (offset + 2 * third, length - 2 * third)]
    refs, refused = dmrpp_to_refs(_hdf4_dmrpp(pieces), str(tmp_path / "f.hdf.dmrpp"), str(path))
    assert refused == [] and refs["sds/0.0.0"] == [str(path), offset, length]
    group = zarr.open_group(refs_as_store(refs), zarr_format=2, mode="r")
    np.testing.assert_array_equal(group["sds"][:], gdal_sds(path, tmp_path)[FLOAT_SDS])

    gap = [(offset, third), (offset + third + 8, length - third)]
    refs, refused = dmrpp_to_refs(_hdf4_dmrpp(gap), str(tmp_path / "f.hdf.dmrpp"), str(path))
    assert "sds/0.0.0" not in refs and len(refused) == 1 and "do not follow each other" in refused[0], refused
