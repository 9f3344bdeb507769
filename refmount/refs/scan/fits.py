"""FITS files as Zarr v2 references: each image HDU one array, read with astropy's header parser.

kerchunk's `kerchunk.fits.process_file` maps the same images, but is not used as it is: it gives BSCALE to
numcodecs' FixedScaleOffset, which divides by it (wrong values wherever BSCALE is not 1), names two HDUs
of the same EXTNAME (HST's SCI, ERR, DQ per chip) the same array, and names the axes z/y/x for every
image (two images of different sizes then conflict in xarray). Here an image's bytes are referenced as
they are (big-endian, one chunk), BSCALE/BZERO become CF's scale_factor/add_offset and BLANK _FillValue,
which xarray and netCDF-C apply themselves, and each image has axes of its own.

Tile-compressed images, tables (binary and ASCII) and random groups are named in `refused`; so are an
image whose data runs past the end of the file, and a 64-bit unsigned image (BZERO 2**63), whose values
above 2**53 no float add_offset gives exactly. A HIERARCH card keeps its key's case, so a header may say
`add_offset` or `_FillValue` itself: astropy applies none of them, so such a key is kept as the card
names it (`HIERARCH add_offset`), which no CF reader applies.
"""

from __future__ import annotations

import numpy as np
import orjson

_BITPIX = {8: "|u1", 16: ">i2", 32: ">i4", 64: ">i8", -32: ">f4", -64: ">f8"}
# attribute names a CF or Zarr reader acts on (values, dimensions, times): a header's own card of that
# name (lower case: only HIERARCH spells it) is renamed, never applied
_CF_NAMES = {"scale_factor", "add_offset", "missing_value", "valid_min", "valid_max", "valid_range", "units",
             "calendar", "coordinates", "dtype", "bounds", "grid_mapping", "compress", "flag_values"}
_SKIPPED_CARDS = {"", "COMMENT", "HISTORY", "SIMPLE", "XTENSION", "BITPIX", "EXTEND", "PCOUNT", "GCOUNT",
                  "BSCALE", "BZERO", "BLANK", "CHECKSUM", "DATASUM"}


def _attrs(header) -> dict:
    out = {}
    for key, value in header.items():
        if key in _SKIPPED_CARDS or key.startswith("NAXIS") or key in out:
            continue
        if key.startswith("_") or key in _CF_NAMES:
            key = f"HIERARCH {key}"
        if isinstance(value, bool):
            out[key] = int(value)
        elif isinstance(value, (int, float, str)):
            out[key] = value
    return out


def scan_fits(fileobj, url: str) -> tuple[dict, list[str]]:
    """(Version-0 references, refused lines) of the FITS file open as `fileobj`, its chunks at `url`."""
    try:
        from astropy.io import fits
    except ImportError:
        raise ValueError("reading FITS needs astropy (pip install 'refmount[archives]')") from None

    refs: dict = {".zgroup": orjson.dumps({"zarr_format": 2}).decode()}
    refused: list[str] = []
    group_attrs: dict = {}
    taken: set[str] = set()
    size = fileobj.seek(0, 2)
    fileobj.seek(0)
    with fits.open(fileobj, memmap=False, lazy_load_hdus=True, do_not_scale_image_data=True) as hdus:
        for index, hdu in enumerate(hdus):
            header = hdu.header
            name = (hdu.name or f"HDU{index}").strip() or f"HDU{index}"
            if name in taken:
                name = f"{name}_{header.get('EXTVER', index)}"
            if name in taken or "/" in name or name.startswith("."):
                name = f"HDU{index}"
            if isinstance(hdu, fits.CompImageHDU):
                refused.append(f"{name}: a tile-compressed image (not virtualised)")
            elif isinstance(hdu, fits.GroupsHDU):
                refused.append(f"{name}: random groups (not virtualised)")
            elif isinstance(hdu, (fits.BinTableHDU, fits.TableHDU)):
                refused.append(f"{name}: {'a binary' if isinstance(hdu, fits.BinTableHDU) else 'an ASCII'} table "
                               "(records, not arrays: not virtualised)")
            elif not hdu.is_image:
                refused.append(f"{name}: an HDU of a kind refmount does not know ({type(hdu).__name__})")
            elif int(header.get("NAXIS", 0)) == 0:
                if index == 0:
                    group_attrs = _attrs(header)  # (the primary header of a file of extensions)
            else:
                reason = _image(hdu, name, url, refs, size)
                if reason:
                    refused.append(f"{name}: {reason}")
                else:
                    taken.add(name)
    refs[".zattrs"] = orjson.dumps(group_attrs).decode()
    return refs, refused


def _image(hdu, name: str, url: str, refs: dict, size: int) -> str | None:
    header = hdu.header
    dtype = _BITPIX.get(header.get("BITPIX"))
    if dtype is None:
        return f"BITPIX {header.get('BITPIX')!r} is not a FITS type"
    naxis = int(header["NAXIS"])
    shape = [int(header[f"NAXIS{n}"]) for n in range(naxis, 0, -1)]  # FITS lists the fastest axis first
    length = np.dtype(dtype).itemsize * int(np.prod(shape, dtype=object))
    start = int(hdu.fileinfo()["datLoc"])
    if start + length > size:
        return f"its data runs past the end of the file ({start + length - size} bytes short): truncated"
    if dtype == ">i8" and float(header.get("BZERO", 0)) == 2.0**63 and float(header.get("BSCALE", 1)) == 1.0:
        return "unsigned 64-bit (BZERO 2**63): CF's add_offset would round values above 2**53 (not virtualised)"
    attrs = _attrs(header)
    if "BSCALE" in header and float(header["BSCALE"]) != 1.0:
        attrs["scale_factor"] = float(header["BSCALE"])
    if "BZERO" in header and float(header["BZERO"]) != 0.0:
        attrs["add_offset"] = float(header["BZERO"])
    fill = None
    if "BLANK" in header and dtype[1] in "iu":
        fill = int(header["BLANK"])
        attrs["_FillValue"] = fill
    attrs["_ARRAY_DIMENSIONS"] = [f"{name}_naxis{n}" for n in range(naxis, 0, -1)]
    zarray = {"zarr_format": 2, "shape": shape, "chunks": [max(1, s) for s in shape], "dtype": dtype,
              "compressor": None, "filters": None, "order": "C", "dimension_separator": ".",
              "fill_value": fill if fill is not None else (None if dtype[1] in "iu" else "NaN")}
    refs[f"{name}/.zarray"] = orjson.dumps(zarray).decode()
    refs[f"{name}/.zattrs"] = orjson.dumps(attrs).decode()
    if length:
        refs[f"{name}/" + ".".join(["0"] * naxis)] = [url, start, length]
    return None
