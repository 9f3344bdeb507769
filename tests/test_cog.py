"""A multi-level Cloud-Optimised GeoTIFF, written by GDAL (rasterio's COG driver) and referenced by
kerchunk's TIFF reader (tifffile's ZarrTiffStore), which names the overview levels `0`, `1`, `2`, ...
Array names may be any string: the consolidated metadata lists every level (zarr and xarray trust it),
and each level reads equal to what GDAL reads from the file itself. Debian's ncdump (netCDF-C 4.9.0)
reads the decoded view: the OME "multiscales" attribute, a list of objects that fails 4.9.0's whole
open, is left out there with a log line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump

rasterio = pytest.importorskip("rasterio")
pytest.importorskip("tifffile")  # kerchunk.tiff's reader
LEVELS = 4


@pytest.fixture(scope="module")
def cog(tmp_path_factory):
    """(refs path, {level name: values as GDAL reads that level}) of a 600 x 520 uint16 COG, 128-pixel
    deflate tiles, overviews 2, 4, 8."""
    from rasterio.shutil import copy
    from rasterio.transform import from_origin

    root = tmp_path_factory.mktemp("cog")
    y, x = np.mgrid[0:600, 0:520]
    data = (1000 + 800 * np.sin(y / 37.0) * np.cos(x / 23.0) + (y * x) % 17).astype("uint16")
    src = root / "src.tif"
    with rasterio.open(src, "w", driver="GTiff", width=520, height=600, count=1, dtype="uint16", crs="EPSG:4326",
                       transform=from_origin(10, 50, 0.01, 0.01)) as dst:
        dst.write(data, 1)
    path = root / "cog.tif"
    copy(src, path, driver="COG", compress="DEFLATE", blocksize=128, overview_resampling="average")
    levels = {}
    for level in range(LEVELS):
        with rasterio.open(path, **({"overview_level": level - 1} if level else {})) as ds:
            levels[str(level)] = ds.read(1)
    assert [v.shape for v in levels.values()] == [(600, 520), (300, 260), (150, 130), (75, 65)]
    import kerchunk.tiff

    refs = kerchunk.tiff.tiff_to_zarr(str(path))
    assert "0/.zarray" in refs and f"{LEVELS - 1}/.zarray" in refs  # kerchunk's names for the levels
    refs_path = root / "cog.json"
    refs_path.write_text(json.dumps(refs))
    return refs_path, levels


def test_every_level_in_consolidated_metadata_reads_right_with_zarr_and_xarray(mount, cog):
    import xarray as xr
    import zarr

    refs, levels = cog
    m = mount(refs, "--view", "raw")
    listed = json.loads((m / ".zmetadata").read_text())["metadata"]
    assert {f"{level}/.zarray" for level in levels} <= set(listed)
    group = zarr.open_group(str(m.path), mode="r")  # trusts the consolidated metadata
    assert sorted(group.array_keys()) == sorted(levels)
    for level, values in levels.items():
        assert np.array_equal(group[level][...], values), level
    with xr.open_zarr(m.path, mask_and_scale=False) as ds:
        # the levels' paths, in order (newer tifffile adds each level's coordinateTransformations)
        assert [d["path"] for d in ds.attrs["multiscales"][0]["datasets"]] == list(levels)
        for level, values in levels.items():
            got = ds[level].values
            assert got.dtype == values.dtype and np.array_equal(got, values), level


def test_decoded_view_reads_in_ncdump_and_netcdf4(mount, cog):
    import netCDF4

    refs, levels = cog
    m = mount(refs)
    assert "attribute 'multiscales' left out" in m.log()
    dumped = parse_ncdump(ncdump(nczarr_url(m.path), variables=["3"]))
    compare_dumped(dumped["3"], levels["3"], [], "ncdump level 3")
    with netCDF4.Dataset(nczarr_url(m.path)) as ds:
        for level, values in levels.items():
            var = ds[level]
            var.set_auto_maskandscale(False)
            assert np.array_equal(var[...], values), level
