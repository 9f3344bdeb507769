"""A TIFF's references: tifffile's ZarrTiffStore of its first series (every level), as kerchunk's
`tiff_to_zarr` makes them, with the file's metadata as root attributes.

kerchunk (0.2.10) merges every `TiffFile.*_metadata` property into the attributes with `dict(value)`,
else parses it as XML: tifffile's `shaped_metadata` (a tuple of dicts, in every file tifffile writes
with its defaults) fails both, so kerchunk refused every such file (`TypeError: a bytes-like object is
required, not 'tuple'`). Here a property that is neither a mapping nor XML text is left out.

tifffile's fill_value is the GDAL_NODATA tag, else 0: a nodata is marked declared (refs/hdf5.py's
`UNDECLARED_FILL_KEY` false), so that a nodata of 0 is served as `_FillValue` like any other."""

from __future__ import annotations

import enum
import io
import json


def tiff_refs(pipe_url: str, size: int) -> dict:
    """The references of the TIFF at `pipe_url`, whose file holds `size` bytes."""
    import fsspec
    import tifffile

    url, name = pipe_url.rsplit("/", 1)
    with fsspec.open(pipe_url) as f, tifffile.TiffFile(f, name=name) as tif:
        _check_grid(tif, size)
        with tif.series[0].aszarr() as store:
            out = io.StringIO()
            store.write_fsspec(out, url=url)
        refs = json.loads(out.getvalue())
        if "GDAL_NODATA" in tif.series[0].keyframe.tags:  # (then tifffile's fill_value; else 0, no nodata)
            _mark_declared(refs)
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


def _mark_declared(refs: dict) -> None:
    """GDAL's nodata is the fill of every level: declared, even a 0 (which the decoded view otherwise
    takes for a fill no one declared, and leaves unmasked)."""
    from refmount.refs.hdf5 import UNDECLARED_FILL_KEY

    for key, value in refs.items():
        if key.endswith(".zarray"):
            meta = json.loads(value)
            meta[UNDECLARED_FILL_KEY] = False
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
