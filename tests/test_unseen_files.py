"""FITS, HDF4 and zipped-Zarr files of kinds the other tests do not hold (issue 40, "files of each format
that you do not see"): made by astropy, pyhdf and HDF4's hrepack (tests/data/fits/made/, tests/data/hdf4/made/;
their make.py wrote them), and zips of a store by other writers. Each variable is read with xarray on the
mount and compared with the format's own library on the file, or named in one log line; never a wrong
value. tests/sweeps/sweep_formats.py and tests/sweeps/sweep_zipzarr.py run the wider sweep (bench/NOTES.md)."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import shutil
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import Mount

DATA = Path(__file__).parent / "data"
FITS_MADE = DATA / "fits" / "made"
HDF4_MADE = DATA / "hdf4" / "made"
FITS_NAMES = sorted(p.name for p in FITS_MADE.glob("*.fits"))
HDF4_NAMES = sorted(p.name for p in HDF4_MADE.glob("*.hdf"))
# (HDU or SDS refused, with the words of its one log line)
REFUSED = {("tiled.fits", algo): "tile-compressed image" for algo in
           ("RICE_1", "GZIP_1", "GZIP_2", "HCOMPRESS_1", "PLIO_1", "NOCOMPRESS")}
REFUSED |= {("tiled_gzip.fits", f"F8Q_{algo}"): "columns beside the compressed tiles (GZIP_COMPRESSED_DATA, ZSCALE"
            for algo in ("GZIP_1", "GZIP_2", "NOCOMPRESS")}
# RICE_1 tiles are read where imagecodecs is installed (a test dependency: CI has it), else one line each
HAS_RICE = importlib.util.find_spec("imagecodecs") is not None
RICE_HDUS = ("I2", "I4", "U1", "U2", "CUBE", "SCALED", "NOBYTEPIX", "B16")
REFUSED |= {("rice.fits", "UNEVEN"): "do not divide the image"} if HAS_RICE else {
    ("tiled_gzip.fits", "RICE"): "RICE_1 tiles need imagecodecs",
    **{("rice.fits", hdu): "RICE_1 tiles need imagecodecs" for hdu in (*RICE_HDUS, "UNEVEN")}}
REFUSED |= {("tiled_gzip.fits", "UNEVEN"): "do not divide the image",
            ("rice.fits", "F4Q"): "columns beside the compressed tiles (GZIP_COMPRESSED_DATA, ZSCALE",
            ("truncated.fits", "PRIMARY"): "runs past the end of the file",
            ("unsigned.fits", "U64"): "unsigned 64-bit",
            ("features.hdf", "unlimited"): "linked blocks", ("features.hdf", "unlimited_once"): "linked blocks",
            ("vdata.hdf", "table"): "a Vdata table"}


@contextlib.contextmanager
def _glob_mount(root: Path, source_dir: Path, suffix: str):
    """A glob mount (raw view) of a copy of `source_dir`'s files, stopped on leaving."""
    data = root / "data"
    shutil.copytree(source_dir, data)
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg-cache"))
    m = Mount(f"{data}/*{suffix}", root / "mnt", ["--view", "raw"], env=env).start(timeout=180)
    try:
        yield m
    finally:
        m.stop()


def _said(m: Mount, name: str, var: str) -> list[str]:
    return [line for line in m.log().splitlines() if f"/{name}: " in line and f" {var}: " in line]


@pytest.fixture(scope="module")
def fits_mount(tmp_path_factory):
    pytest.importorskip("astropy")
    with _glob_mount(tmp_path_factory.mktemp("fitsmade"), FITS_MADE, ".fits") as m:
        yield m


@pytest.fixture(scope="module")
def hdf4_mount(tmp_path_factory):
    pytest.importorskip("pyhdf")
    with _glob_mount(tmp_path_factory.mktemp("hdf4made"), HDF4_MADE, ".hdf") as m:
        yield m


def _astropy(path: Path) -> dict:
    """{name refmount gives an image HDU: astropy's physical values}"""
    from astropy.io import fits

    from refmount.refs.scan.fits import hdu_name

    out, taken = {}, set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fits.open(path) as hdus:
            for index, h in enumerate(hdus):
                if not h.is_image or h.header.get("NAXIS", 0) == 0:
                    continue
                name = hdu_name(h, index, taken)
                taken.add(name)
                try:
                    out[name] = np.array(h.data)
                except (TypeError, ValueError):  # (astropy's own read of a truncated image fails)
                    out[name] = None
    return out


@pytest.mark.parametrize("name", FITS_NAMES)
def test_fits_made_file_reads_as_astropy_reads_it(fits_mount, name):
    """Scaled integers with BLANK, scaled floats, BLANK on floats (ignored), unsigned 16/32-bit, 5-D,
    zero-size and duplicate or unusable EXTNAMEs, tile-compressed images of GZIP_1, GZIP_2 and NOCOMPRESS
    tiles (integers of every width, lossless floats, scaled with BLANK; row and 2-D tiles): xarray's
    default decoding on the mount gives astropy's values; RICE_1, HCOMPRESS_1, PLIO_1, quantized floats,
    uneven tiles, a truncated image and a 64-bit unsigned one are one line each."""
    import xarray as xr

    expected = _astropy(FITS_MADE / name)
    listed = set(os.listdir(fits_mount.path / name))
    with xr.open_zarr(fits_mount.path / name, consolidated=True) as ds:
        for var, values in expected.items():
            if (name, var) in REFUSED:
                assert var not in listed
                lines = _said(fits_mount, name, var)
                assert len(lines) == 1 and REFUSED[name, var] in lines[0], (var, fits_mount.log())
                continue
            got = ds[var].values
            assert got.shape == values.shape, var
            rtol = 1e-7 if values.dtype.kind == "f" and values.dtype.itemsize == 4 else 0
            np.testing.assert_allclose(got.astype("f8"), values.astype("f8"), rtol=rtol, err_msg=f"{name}: {var}")
    assert {var for file, var in REFUSED if file == name} <= set(expected)


def test_fits_tiles_over_http_in_the_decoded_view_read_by_ncdump(tmp_path, server):
    """The tile table read through the scan's pipe from a loopback server; netCDF-C has no gzip-and-shuffle
    filter of its own: the decoded view serves the tiles decompressed."""
    from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump

    pytest.importorskip("astropy")
    source = FITS_MADE / "tiled_gzip.fits"
    shutil.copy(source, server.root / source.name)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    m = Mount(server.url_for(source.name), tmp_path / "mnt", [], env=env).start()
    try:
        dumped = parse_ncdump(ncdump(nczarr_url(m.path), variables=["I4_GZIP_2", "U1_NOCOMPRESS"]))
    finally:
        m.stop()
    expected = _astropy(source)
    compare_dumped(dumped["I4_GZIP_2"], expected["I4_GZIP_2"], [], "ncdump I4_GZIP_2")
    compare_dumped(dumped["U1_NOCOMPRESS"], expected["U1_NOCOMPRESS"], [], "ncdump U1_NOCOMPRESS")


def _need_imagecodecs() -> None:
    if not HAS_RICE:  # (a test dependency: never skipped under CI)
        assert os.environ.get("CI") != "true", "imagecodecs is a test dependency"
        pytest.skip("imagecodecs is not installed")


def test_fits_rice_tiles_in_both_views(mount):
    """RICE_1 tiles (imagecodecs' rcomp): the raw view names the codec a Zarr reader with imagecodecs
    resolves (imagecodecs-numcodecs' entry point) and zarr reads astropy's stored values; netCDF-C has
    no Rice filter: ncdump of the decoded view reads the tiles the daemon decodes (SCALED's BSCALE, BZERO
    and BLANK as scale_factor, add_offset and _FillValue; xarray's physical values are the made-file test's)."""
    from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump

    pytest.importorskip("astropy")
    _need_imagecodecs()  # (without it, the refusal is test_fits_made_file_reads_as_astropy_reads_it's)
    import zarr
    from astropy.io import fits

    source = FITS_MADE / "rice.fits"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fits.open(source, do_not_scale_image_data=True) as hdus:
            stored = {hdu: np.array(hdus[hdu].data) for hdu in RICE_HDUS}
    raw = mount(str(source), "--view", "raw")
    zarray = json.loads((raw.path / "I4" / ".zarray").read_text())
    assert zarray["compressor"] == {"id": "imagecodecs_rcomp", "shape": [4, 5], "dtype": "<i4", "nblock": 32}
    group = zarr.open_group(str(raw.path), mode="r")
    for hdu in RICE_HDUS:
        np.testing.assert_array_equal(group[hdu][...], stored[hdu], err_msg=hdu)
    decoded = mount(str(source))
    text = ncdump(nczarr_url(decoded.path), variables=["I4", "U1", "CUBE", "NOBYTEPIX", "SCALED", "B16"])
    dumped = parse_ncdump(text)
    for hdu in ("I4", "U1", "CUBE", "NOBYTEPIX", "SCALED", "B16"):
        compare_dumped(dumped[hdu], stored[hdu], [stored["SCALED"][0, 0]] if hdu == "SCALED" else [], f"ncdump {hdu}")
    assert "SCALED:scale_factor = 0.5" in text and "SCALED:add_offset = 7." in text


def test_fits_header_cards_of_cf_names_are_not_applied(fits_mount):
    """A HIERARCH card keeps its case: `add_offset`, `scale_factor`, `_FillValue`, `units` (a time) in a
    header are text to astropy. They are kept as the card names them, and nothing applies them."""
    import xarray as xr

    with xr.open_zarr(fits_mount.path / "hierarch.fits", consolidated=True) as ds:
        np.testing.assert_array_equal(ds["X"].values, [0, 1, 2, 3])
        assert ds["X"].dtype.kind == "i"  # (no scale applied, no fill masked)
        attrs = ds["X"].attrs
        assert attrs["HIERARCH add_offset"] == 1000 and "add_offset" not in attrs
        assert attrs["HIERARCH units"] == "days since 2000-01-01"
        assert ds["Y"].dims == ("Y_naxis1",)
    assert "Traceback" not in fits_mount.log()


def _pyhdf(path: Path) -> dict:
    from pyhdf.SD import SD, SDC

    out = {}
    sd = SD(str(path), SDC.READ)
    try:
        for name in sd.datasets():
            sds = sd.select(name)
            try:
                out[name] = np.array(sds.get())
            except Exception:  # noqa: BLE001 - pyhdf cannot read an unlimited SDS with no record
                out[name] = None
            sds.endaccess()
    finally:
        sd.end()
    return out


@pytest.mark.parametrize("name", HDF4_NAMES)
def test_hdf4_made_file_reads_as_pyhdf_reads_it(hdf4_mount, name):
    """Every number type, chars, fills set and unset, partial writes, dimension scales, SDsetcal
    attributes, unlimited dimensions (contiguous: linked blocks, refused; chunked by hrepack: read),
    a Vdata table beside an SDS. Stored values equal pyhdf's; the whole file opens in xarray (a char
    SDS once made zarr refuse the whole group: its dtype was "S1", not "|S1")."""
    import xarray as xr

    expected = _pyhdf(HDF4_MADE / name)
    listed = set(os.listdir(hdf4_mount.path / name))
    with xr.open_zarr(hdf4_mount.path / name, consolidated=True, mask_and_scale=False, decode_times=False,
                      concat_characters=False) as ds:
        for var, values in expected.items():
            if var not in listed:
                lines = _said(hdf4_mount, name, var)
                assert len(lines) == 1 and REFUSED[name, var] in lines[0], (var, hdf4_mount.log())
                continue
            got = ds[var].values
            if values is None:
                assert 0 in got.shape, var
                continue
            assert got.dtype.newbyteorder("=") == values.dtype.newbyteorder("=") and got.shape == values.shape, var
            np.testing.assert_array_equal(got, values, err_msg=f"{name}: {var}")
    if name == "vdata.hdf":
        assert len(_said(hdf4_mount, name, "table")) == 1, hdf4_mount.log()


def test_hdf4_char_sds_reads_as_text(hdf4_mount):
    import xarray as xr

    with xr.open_zarr(hdf4_mount.path / "features.hdf", consolidated=True) as ds:
        assert ds["chars"].values.tolist() == [b"hello", b"world", b"ab"]


def _rezip(src: Path, dst: Path, how: str) -> None:
    """zarr's zip of a store written again as another writer writes it: with zip64 extra fields on
    every member, or as Info-ZIP's `zip -r -0 x.zip x.zarr` does (the store under a directory of its
    own, an entry for each directory)."""
    tree = dst.parent / "x.zarr"
    with zipfile.ZipFile(src) as z:
        z.extractall(tree)
    with zipfile.ZipFile(dst, "w") as z:
        for p in sorted(tree.rglob("*")):
            name = str(p.relative_to(tree if how == "zip64" else tree.parent))
            if p.is_dir():
                if how != "zip64":
                    z.writestr(name + "/", b"")
                continue
            with z.open(name, "w", force_zip64=how == "zip64") as f:
                f.write(p.read_bytes())
    shutil.rmtree(tree)


@pytest.mark.parametrize("how", ["zip64", "zip-r"])
def test_zips_of_other_writers_equal_zarr(mount, server, tmp_path, how):
    import zarr

    src = tmp_path / "src.zarr.zip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = zarr.storage.ZipStore(str(src), mode="w")
        root = zarr.open_group(store, mode="w", zarr_format=3)
        a = root.create_group("sub").create_array("a", shape=(5, 4), chunks=(2, 3), dtype="i4", fill_value=-1)
        a[:4, :] = np.arange(16, dtype="i4").reshape(4, 4)
        store.close()
    dst = server.root / "other.zarr.zip"
    _rezip(src, dst, how)
    for source in (str(dst), server.url_for("other.zarr.zip")):
        m = mount(source, "--view", "raw")
        got = zarr.open_group(str(m.path), mode="r")["sub/a"][...]
        want = np.full((5, 4), -1, "i4")
        want[:4] = np.arange(16).reshape(4, 4)
        np.testing.assert_array_equal(got, want)


def _tile_table(path: Path, hdu: str) -> tuple[int, int, list]:
    """(table's data offset, heap offset, [(count, offset)] of each tile) of a tile-compressed image."""
    from astropy.io import fits

    with fits.open(path, disable_image_compression=True) as hdus:
        table = hdus[hdu]
        start = table.fileinfo()["datLoc"]
        rows = table.header["NAXIS2"]
        heap = start + table.header.get("THEAP", 8 * rows)
    raw = path.read_bytes()[start:start + 8 * rows]
    return start, heap, np.frombuffer(raw, ">i4").reshape(rows, 2).tolist()


def test_hostile_tiles_are_refused_or_eio_never_values(mount, tmp_path):
    """A tile said to lie past the end of the file refuses its image (one line); a tile whose gzip bytes
    are damaged is EIO for the reader (gzip's CRC), while the other images read as astropy reads them."""
    pytest.importorskip("astropy")
    import zarr

    source = FITS_MADE / "tiled_gzip.fits"
    data = bytearray(source.read_bytes())
    start, _, _ = _tile_table(source, "I2_GZIP_1")
    data[start + 4:start + 8] = (10**8).to_bytes(4, "big")  # (tile 0's heap offset)
    _, heap, tiles = _tile_table(source, "I4_GZIP_2")
    count, offset = tiles[3]
    data[heap + offset + count // 2] ^= 0xFF  # (inside tile 3's deflate stream)
    path = tmp_path / "hostile.fits"
    path.write_bytes(bytes(data))
    m = mount(str(path), "--view", "raw")
    lines = _said(m, "hostile.fits", "I2_GZIP_1") or [line for line in m.log().splitlines() if "I2_GZIP_1: " in line]
    assert len(lines) == 1 and "outside the file" in lines[0], m.log()
    group = zarr.open_group(str(m.path), mode="r")
    assert "I2_GZIP_1" not in group
    with pytest.raises(Exception):  # (zarr's own gzip decoding of the raw view fails)
        group["I4_GZIP_2"][...]
    np.testing.assert_array_equal(group["I2_GZIP_2"][...], _astropy(source)["I2_GZIP_2"])
    decoded = mount(str(path))
    with pytest.raises(OSError) as failed:  # (tile 3: the fourth along FITS's fastest axis, key 0.3)
        (decoded.path / "I4_GZIP_2" / "0.3").read_bytes()
    assert failed.value.errno == errno.EIO
    assert (decoded.path / "I4_GZIP_2" / "0.2").read_bytes()


def test_cut_rice_tile_is_eio(mount, tmp_path):
    """A RICE_1 tile whose descriptor gives half its bytes: rcomp runs out of stream, EIO in the decoded
    view (Rice has no checksum: damaged bytes of a whole tile decode as astropy decodes them)."""
    pytest.importorskip("astropy")
    _need_imagecodecs()
    source = FITS_MADE / "rice.fits"
    data = bytearray(source.read_bytes())
    start, _, tiles = _tile_table(source, "I2")
    data[start + 8:start + 12] = (tiles[1][0] // 2).to_bytes(4, "big")  # (tile 1's byte count)
    path = tmp_path / "cut.fits"
    path.write_bytes(bytes(data))
    decoded = mount(str(path))
    with pytest.raises(OSError) as failed:  # (row tiles: tile 1 is key 1.0)
        (decoded.path / "I2" / "1.0").read_bytes()
    assert failed.value.errno == errno.EIO
    assert (decoded.path / "I2" / "0.0").read_bytes()


def test_rice_refused_without_imagecodecs_is_read_once_installed(tmp_path):
    """A scan refusing RICE_1 tiles for want of imagecodecs is not kept: the next mount, with imagecodecs,
    reads them (a kept scan would refuse them until the file changed)."""
    pytest.importorskip("astropy")
    _need_imagecodecs()
    hide = tmp_path / "hide" / "imagecodecs"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    source = tmp_path / "rice.fits"
    shutil.copy(FITS_MADE / "rice.fits", source)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    without = dict(env, PYTHONPATH=os.pathsep.join([str(hide.parent), env.get("PYTHONPATH", "")]))
    for run, environment in (("without", without), ("with", env)):
        m = Mount(str(source), tmp_path / f"mnt-{run}", ["--view", "raw"], env=environment).start()
        try:
            listed = set(os.listdir(m.path))
            said = [line for line in m.log().splitlines() if "I4: " in line]
        finally:
            m.stop()
        if run == "without":
            assert "I4" not in listed and len(said) == 1 and "RICE_1 tiles need imagecodecs" in said[0], said
        else:
            assert "I4" in listed and not said, said


def test_rcomp_config_larger_than_its_chunk_is_eio(mount, tmp_path):
    """A reference set may name imagecodecs_rcomp with a shape of its own: the decoded view refuses a
    codec that would make more than the chunk (EIO, nothing allocated) and reads one that fits."""
    _need_imagecodecs()
    import base64

    import imagecodecs

    tile = base64.b64encode(imagecodecs.rcomp_encode(np.arange(4, dtype="<i2"), nblock=32)).decode()
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    for name, codec_shape in (("fits", [4]), ("huge", [10**9])):
        refs[f"{name}/.zarray"] = json.dumps({
            "zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "<i2", "fill_value": None, "order": "C",
            "filters": None, "compressor": {"id": "imagecodecs_rcomp", "shape": codec_shape, "dtype": "<i2", "nblock": 32}})
        refs[f"{name}/.zattrs"] = json.dumps({"_ARRAY_DIMENSIONS": [f"{name}_x"]})
        refs[f"{name}/0"] = f"base64:{tile}"
    path = tmp_path / "refs.json"
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    m = mount(str(path))
    assert np.frombuffer((m.path / "fits" / "0").read_bytes(), "<i2").tolist() == [0, 1, 2, 3]
    with pytest.raises(OSError) as failed:
        (m.path / "huge" / "0").read_bytes()
    assert failed.value.errno == errno.EIO
    assert "declares 2000000000 decoded bytes" in m.log(), m.log()  # (not rcomp's own end-of-stream error)
