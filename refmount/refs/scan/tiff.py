"""A TIFF's references: tifffile's ZarrTiffStore of its first series (every level), as kerchunk's
`tiff_to_zarr` makes them, with the file's metadata as root attributes.

kerchunk (0.2.10) merges every `TiffFile.*_metadata` property into the attributes with `dict(value)`,
else parses it as XML: tifffile's `shaped_metadata` (a tuple of dicts, in every file tifffile writes
with its defaults) fails both, so kerchunk refused every such file (`TypeError: a bytes-like object is
required, not 'tuple'`). Here a property that is neither a mapping nor XML text is left out.

tifffile's fill_value is the GDAL_NODATA tag, else 0: a nodata is marked declared (refs/hdf5.py's
`UNDECLARED_FILL_KEY` false), so that a nodata of 0 is served as `_FillValue` like any other.

A striped image whose height is not a multiple of RowsPerStrip (GDAL's default striped GTiff, most
libtiff writers) has a short last strip: fewer rows than a chunk, so fewer bytes (compressed: it
decodes short). tifffile refuses to write such references ("incomplete chunks"); here they are
written, and each level's `.zarray` says which axis's last chunk is short (`SHORT_LAST_CHUNK_KEY`): the
decoded view pads that chunk to a whole one with the fill (view/decoded.py). The raw view serves the
strip as stored: every element inside the shape is where a whole chunk holds it, only rows past the
shape are missing, so a reader either fails on it (zarr-python, GDAL: a chunk of the wrong size) or pads
it; none reads a wrong value.

Only the first series is served (kerchunk's rule): an internal mask (NewSubfileType 4) and any other
image are left out, each said in one line at mount (`refused`).

Every TIFF is served as a group (`_as_group`): tifffile makes a one-level TIFF a bare array at the root,
which xarray (GroupNotFoundError) and netCDF-C (an empty dataset) do not open; only GDAL's `ZARR:` did.
The first image is variable `0` of the root group, with tifffile's dims (`Y`, `X`, `S` for samples), as
it is already in a TIFF with overviews, whose levels are `0`, `1`, ... with dims `Y1`, `X1`, ... (no
clash of sizes) and whose OME `multiscales` attribute names those paths. Peers name a band otherwise
(GDAL's netCDF driver `Band1`, one band; rioxarray `band_data`, every band): `0` is kept so that the
full-resolution image has one name in every TIFF, with or without overviews (an archive mixing COGs and
plain GeoTIFFs), and the multiscales paths stay right."""

from __future__ import annotations

import contextlib
import enum
import io
import json

# extra `.zarray` key: the grid axis whose last chunk holds fewer rows than the chunk (an int; absent:
# every chunk whole). Only the TIFF scan sets it, only the decoded view reads it.
SHORT_LAST_CHUNK_KEY = "short_last_chunk_axis"
# extra `.zarray` key: true when the TIFF has no nodata (no GDAL_NODATA tag). GDAL on the file then masks
# nothing, so its form on the mount must not give netCDF's default fill as nodata, as it does for a
# netCDF variable without _FillValue (view/forms.py). Only the TIFF scan sets it.
NO_NODATA_KEY = "no_nodata"


def tiff_refs(pipe_url: str, size: int, refused: list | None = None) -> dict:
    """The references of the TIFF at `pipe_url`, whose file holds `size` bytes (what is left out said in
    `refused`)."""
    import fsspec
    import tifffile

    url, name = pipe_url.rsplit("/", 1)
    with fsspec.open(pipe_url) as f, tifffile.TiffFile(f, name=name) as tif:
        _check_grid(tif, size)
        series = tif.series[0]
        with series.aszarr() as store, _whole_strips_said(series.levels) as short_axes:
            out = io.StringIO()
            store.write_fsspec(out, url=url)
        refs = _as_group(json.loads(out.getvalue()))
        _mark_short(refs, short_axes)
        if refused is not None:
            refused.extend(_described(n, s) for n, s in enumerate(tif.series) if n)
        _mark_fill(refs, "GDAL_NODATA" in tif.series[0].keyframe.tags)  # (tifffile's fill_value; else 0)
        attrs = json.loads(refs[".zattrs"])
        for key in dir(tif):
            if key.endswith("metadata"):
                try:
                    attrs.update(_as_mapping(getattr(tif, key, None)))
                except Exception:  # noqa: BLE001 - a property tifffile cannot parse: that metadata only
                    continue
    # (enums, as kerchunk writes them: by name)
    refs[".zattrs"] = json.dumps({k: v._name_ if isinstance(v, enum.EnumMeta) else v for k, v in attrs.items()},
                                 default=str)
    return refs


def _check_grid(tif, size: int) -> None:
    """Refuse a TIFF whose images declare more tiles or strips than the file could hold offsets for
    (each needs an entry of 2 bytes or more in the file), before they are listed one by one:
    ImageWidth and ImageLength of 65,536 over 16 x 16 tiles in a 434-byte file were 16.7 million chunks,
    a scanner busy until --load-timeout (300 s), again at each lookup of a lazily mounted file."""
    import math

    from refmount.errors import RefsError

    declared = 0
    for level in tif.series[0].levels if tif.series else ():
        key = level.keyframe
        images = math.prod(level.shape) // max(math.prod(key.shape), 1)  # (ImageJ's frames: never made)
        declared += images * math.prod(key.chunked)
    if declared > max(size // 2, 4096):
        raise RefsError(f"its images declare {declared:,} tiles or strips, more than its {size:,} bytes can "
                        "hold offsets for")


@contextlib.contextmanager
def _whole_strips_said(levels):
    """tifffile (2026.3) refuses references to a striped image whose height RowsPerStrip does not divide,
    by that one test of `keyframe.imagelength`: for the writing only, each such level's keyframe gives
    a height rounded up to whole strips (the array's shape and chunks are the store's, made before).
    Yields {level: its grid axis of rows} for the levels so marked."""
    changed, axes = [], {}
    for n, level in enumerate(levels):
        page = level.keyframe
        if page.is_tiled or not page.rowsperstrip or page.imagelength % page.rowsperstrip == 0:
            continue
        if page.imagedepth > 1 or "Y" not in page.axes:
            raise ValueError(f"a striped image of shape {page.shape} with a short last strip is not served")
        axis = len(level.shape) - len(page.axes) + page.axes.index("Y")
        axes[n] = axis
        changed.append((page, page.imagelength))
        page.imagelength += page.rowsperstrip - page.imagelength % page.rowsperstrip
    try:
        yield axes
    finally:
        for page, height in changed:
            page.imagelength = height


def _as_group(refs: dict) -> dict:
    """tifffile's references of a one-level TIFF (a root array) as a root group holding that array as
    `0`, the name a TIFF with overviews gives its first level; a multi-level TIFF's, as they are."""
    if ".zarray" not in refs:
        return refs
    grouped = {".zgroup": json.dumps({"zarr_format": 2}), ".zattrs": "{}"}
    grouped.update((f"0/{key}", value) for key, value in refs.items())
    return grouped


def _mark_short(refs: dict, axes: dict) -> None:
    for level, axis in axes.items():
        key = f"{level}/.zarray"
        meta = json.loads(refs[key])
        meta[SHORT_LAST_CHUNK_KEY] = axis
        refs[key] = json.dumps(meta)


def _described(n: int, series) -> str:
    """A series left out, as `refused` says it (archive.log_refused: "variable ... (...; left out)")."""
    what = "an internal mask (NewSubfileType 4)" if series.keyframe.subfiletype & 4 else "an image"
    return (f"series {n}: {what} of {'x'.join(map(str, series.shape))} {series.dtype}, "
            "not the TIFF's first image (only that one and its overviews are served)")


def _mark_fill(refs: dict, nodata: bool) -> None:
    """GDAL's nodata is the fill of every level: declared, even a 0 (which the decoded view otherwise
    takes for a fill no one declared, and leaves unmasked). Without one, every level says it has none."""
    from refmount.refs.hdf5 import UNDECLARED_FILL_KEY

    for key, value in refs.items():
        if key.endswith(".zarray"):
            meta = json.loads(value)
            meta[UNDECLARED_FILL_KEY if nodata else NO_NODATA_KEY] = not nodata
            refs[key] = json.dumps(meta)


def _as_mapping(value) -> dict:
    if not value:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, (str, bytes)):  # XML-structured tags (GDAL_METADATA): <Item name="...">text</Item>
        from xml.etree import ElementTree

        return {item.get("name"): item.text for item in ElementTree.fromstring(value)}
    return {}  # (shaped_metadata: a tuple of {"shape": ...}, one per series; nothing a reader needs)
