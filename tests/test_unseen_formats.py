"""TIFFs refmount had not seen (bench/NOTES.md, unseen2): each mounted directly (a glob of the files) and
as a glob of a loopback nginx, read with zarr on the mount against tifffile on the file. A TIFF that
tifffile wrote with its defaults (its `shaped_metadata`) was refused by kerchunk's tiff_to_zarr; GDAL's
YCbCr JPEG tiles, whose JPEG tables the codec config holds in base64, read EIO; GDAL's nodata of 0 was
taken for tifffile's default fill and not served."""

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
        got = zarr.open_array(str(mnt / name), mode="r")[...]
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

            a = zarr.open_array(str(m.path / "nodata0.tif"), mode="r")
            assert a.attrs.get("_FillValue") == 0 and a.fill_value == 0
