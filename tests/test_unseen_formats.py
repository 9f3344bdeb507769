"""TIFFs refmount had not seen (bench/NOTES.md, unseen2): each mounted directly (a glob of the files) and
as a glob of a loopback nginx, read with zarr on the mount against tifffile on the file. A TIFF that
tifffile wrote with its defaults (its `shaped_metadata`) was refused by kerchunk's tiff_to_zarr; GDAL's
YCbCr JPEG tiles, whose JPEG tables the codec config holds in base64, read EIO; GDAL's nodata of 0 was
taken for tifffile's default fill and not served. A striped TIFF whose height RowsPerStrip does not divide
(GDAL's default striped output) was refused ("incomplete chunks"); its internal mask went unsaid."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

tifffile = pytest.importorskip("tifffile")
pytest.importorskip("imagecodecs")


@pytest.fixture(scope="module")
def tiffs(tmp_path_factory):
    """{file name: values as tifffile reads them} in one directory."""
    root = tmp_path_factory.mktemp("tiffs")
    y, x = np.mgrid[0:200, 0:300]
    f32 = (np.sin(y / 17.0) * np.cos(x / 13.0) * 100).astype("f4")
    u16 = (1000 + 500 * np.sin(y / 11.0) + (x * y) % 97).astype("u2")
    rgb = np.stack([x % 256, y % 256, (x + y) % 256], -1).astype("u1")
    tifffile.imwrite(root / "pred2_u2.tif", u16, tile=(64, 64), compression="zlib", predictor=2)
    tifffile.imwrite(root / "pred3_zstd_be.tif", f32, tile=(64, 64), compression="zstd", predictor=3, byteorder=">")
    tifffile.imwrite(root / "planar_rgb.tif", np.moveaxis(rgb, -1, 0), tile=(64, 64), photometric="rgb",
                     planarconfig="separate", compression="lzw")
    if shutil.which("gdal_translate"):
        tifffile.imwrite(root / "src.tif", rgb, photometric="rgb", metadata=None)
        subprocess.run(["gdal_translate", "-q", "-co", "TILED=YES", "-co", "COMPRESS=JPEG", "-co", "PHOTOMETRIC=YCBCR",
                        root / "src.tif", root / "ycbcr_jpeg.tif"], check=True)
        # GDAL's nodata 0 (tifffile's fill_value when no GDAL_NODATA tag is there too): pixels of 0 are nodata
        tifffile.imwrite(root / "src.tif", np.where(x > 250, 0, u16).astype("u2"), metadata=None)
        subprocess.run(["gdal_translate", "-q", "-a_nodata", "0", "-co", "TILED=YES", "-co", "COMPRESS=DEFLATE",
                        root / "src.tif", root / "nodata0.tif"], check=True)
        os.remove(root / "src.tif")
    return root, {p.name: tifffile.imread(p) for p in sorted(root.glob("*.tif"))}


def _check(mnt, want: dict) -> None:
    import zarr

    for name, values in want.items():
        got = zarr.open_array(str(mnt / name / "0"), mode="r")[...]  # (the image: variable 0)
        assert got.dtype.newbyteorder("=") == values.dtype.newbyteorder("=") and np.array_equal(got, values), name


def test_tiffs_read_as_tifffile_reads_them_directly_and_over_http(mount, tiffs, tmp_path):
    from tests.support.nginx import Nginx

    root, want = tiffs
    m = mount(f"{root}/*.tif", "--view", "raw").start()
    _check(m.path, want)
    (tmp_path / "www").mkdir()
    os.symlink(root, tmp_path / "www" / "data")
    with Nginx(tmp_path / "nginx", f"root {tmp_path / 'www'}; location /data/ {{ autoindex on; }}") as nginx:
        m = mount(f"{nginx.url}/data/*.tif").start()
        _check(m.path, want)
        if "nodata0.tif" in want:  # (the decoded view: GDAL's nodata is the _FillValue CF readers mask)
            import zarr

            a = zarr.open_array(str(m.path / "nodata0.tif" / "0"), mode="r")
            assert a.attrs.get("_FillValue") == 0 and a.fill_value == 0


@pytest.fixture(scope="module")
def striped(tmp_path_factory):
    """Striped TIFFs of 101 rows in strips of 8 (the last one 5 rows: shorter bytes, a shorter stream)."""
    root = tmp_path_factory.mktemp("striped")
    rng = np.random.default_rng(7)
    u16 = rng.integers(0, 60000, (101, 37), dtype="u2")
    f32 = rng.standard_normal((101, 37)).astype("f4")
    rgb = rng.integers(0, 255, (101, 37, 3), dtype="u1")
    tifffile.imwrite(root / "none_u2.tif", u16, rowsperstrip=8)
    tifffile.imwrite(root / "deflate_pred2_u2.tif", u16, rowsperstrip=8, compression="zlib", predictor=2)
    tifffile.imwrite(root / "lzw_pred3_f4.tif", f32, rowsperstrip=8, compression="lzw", predictor=3)
    tifffile.imwrite(root / "contig_rgb.tif", rgb, rowsperstrip=8, compression="zlib", photometric="rgb")
    tifffile.imwrite(root / "planar_rgb.tif", np.moveaxis(rgb, -1, 0), rowsperstrip=8, photometric="rgb",
                     planarconfig="separate")
    if shutil.which("gdal_translate"):  # GDAL's default striped GTiff (its own RowsPerStrip: 55 of 101 rows)
        tifffile.imwrite(root / "src.tif", f32, metadata=None)
        subprocess.run(["gdal_translate", "-q", "-co", "COMPRESS=DEFLATE", "-co", "PREDICTOR=3", "-a_nodata", "-9999",
                        root / "src.tif", root / "gdal_f4.tif"], check=True)
        tifffile.imwrite(root / "src.tif", rgb, photometric="rgb", metadata=None)
        subprocess.run(["gdal_translate", "-q", "-co", "COMPRESS=LZW", "-co", "PREDICTOR=2", "-co", "INTERLEAVE=BAND",
                        "-co", "BLOCKYSIZE=8", root / "src.tif", root / "gdal_band_rgb.tif"], check=True)
        tifffile.imwrite(root / "src.tif", u16, metadata=None)
        subprocess.run(["gdal_translate", "-q", "-co", "BLOCKYSIZE=8", "-mask", "1", "--config",
                        "GDAL_TIFF_INTERNAL_MASK", "YES", root / "src.tif", root / "gdal_mask_u2.tif"], check=True)
        os.remove(root / "src.tif")
    want = {p.name: tifffile.imread(p) for p in sorted(root.glob("*.tif"))}
    # cut inside strip 11 of 13 (uncompressed: strip 11 short, 12 gone): short chunks that are not the last
    data = (root / "none_u2.tif").read_bytes()
    offsets = tifffile.TiffFile(root / "none_u2.tif").pages[0].dataoffsets
    (root / "cut_u2.tif").write_bytes(data[:offsets[11] + 100])
    return root, want


def test_striped_tiffs_with_a_short_last_strip_read_in_the_decoded_view(mount, striped, tmp_path):
    import zarr

    from tests.support.nginx import Nginx

    root, want = striped
    m = mount(f"{root}/*.tif").start()
    _check(m.path, want)
    assert np.array_equal(zarr.open_array(str(m.path / "cut_u2.tif" / "0"), mode="r")[:88], want["none_u2.tif"][:88])
    for key in ("11.0", "12.0"):  # (a short chunk that is not the last one's rows, and the last cut short: EIO)
        with pytest.raises(OSError) as e:
            (m.path / "cut_u2.tif" / "0" / key).read_bytes()
        assert e.value.errno == 5, key
    if "gdal_mask_u2.tif" in want:  # (and the rows past the shape in the short strip: GDAL's nodata)
        last = np.frombuffer((m.path / "gdal_f4.tif" / "0" / "1.0").read_bytes(), "<f4").reshape(55, 37)
        assert np.array_equal(last[:46], want["gdal_f4.tif"][55:]) and (last[46:] == -9999).all()
        assert "gdal_mask_u2.tif: variable series 1: an internal mask (NewSubfileType 4) of 101x37 bool" in m.log()
    # the raw view serves the stored bytes: a reader fails at the short strip (never a wrong value)
    m = mount(f"{root}/*.tif", "--view", "raw").start()
    assert len((m.path / "none_u2.tif" / "0" / "12.0").read_bytes()) == 5 * 37 * 2
    with pytest.raises(ValueError):
        zarr.open_array(str(m.path / "deflate_pred2_u2.tif" / "0"), mode="r")[...]
    (tmp_path / "www").mkdir()
    os.symlink(root, tmp_path / "www" / "data")
    with Nginx(tmp_path / "nginx", f"root {tmp_path / 'www'}; location /data/ {{ autoindex on; }}") as nginx:
        m = mount(f"{nginx.url}/data/*.tif").start()
        _check(m.path, want)


def test_a_one_image_tiff_mounts_as_a_group_xarray_and_ncdump_open(mount, tmp_path):
    """tifffile's references of a one-level TIFF are a bare array at the root: xarray refused it
    (GroupNotFoundError), ncdump showed an empty dataset. Now a group holding the image as variable `0`
    (a COG's first level's name) with tifffile's dims, read equal to tifffile by both."""
    import xarray as xr

    from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump

    gray = np.arange(3072, dtype="u2").reshape(64, 48)
    rgb = np.stack([gray % 251, gray % 13, gray % 7], -1).astype("u1")
    tifffile.imwrite(tmp_path / "a.tif", gray, tile=(16, 16))
    tifffile.imwrite(tmp_path / "rgb.tif", rgb, tile=(16, 16), photometric="rgb")
    for name, dims in (("a.tif", ("Y", "X")), ("rgb.tif", ("Y", "X", "S"))):
        want = tifffile.imread(tmp_path / name)
        m = mount(tmp_path / name).start()
        with xr.open_zarr(m.path) as ds:
            assert list(ds.data_vars) == ["0"] and ds["0"].dims == dims, ds
            assert ds["0"].dtype == want.dtype and np.array_equal(ds["0"].values, want), name
        dumped = parse_ncdump(ncdump(nczarr_url(m.path), variables=["0"]))
        assert len(dumped) == 1, list(dumped)
        compare_dumped(next(iter(dumped.values())), want, [], f"ncdump {name}")


@pytest.mark.skipif(not shutil.which("gdalinfo"), reason="needs Debian's gdal-bin")
def test_gdal_on_a_tiff_mount_masks_what_gdal_on_the_file_masks(mount, tmp_path):
    """GDAL's form gives a variable without _FillValue netCDF's default fill as nodata, as GDAL's netCDF
    driver does for the source. A TIFF's source is read by GDAL's GTiff driver, which has no such default:
    a TIFF without nodata said NoData 65535 on the mount, so a full-range uint16 image lost its 65535s."""
    values = np.arange(64 * 48, dtype="u2").reshape(64, 48)
    values[0, :5] = 65535
    tifffile.imwrite(tmp_path / "full.tif", values, tile=(16, 16))
    m = mount(tmp_path / "full.tif").start()

    def described(target: str) -> tuple:
        out = subprocess.run(["gdalinfo", "-stats", "-nomd", target], capture_output=True, text=True, timeout=60).stdout
        return [line.strip() for line in out.splitlines() if "NoData" in line or "Minimum=" in line]

    on_file = described(str(tmp_path / "full.tif"))
    assert on_file and "Maximum=65535.000" in on_file[0] and not any("NoData" in line for line in on_file)
    assert described(f"ZARR:{m.path}:/0") == on_file
