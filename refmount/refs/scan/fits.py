"""FITS files as Zarr v2 references: each image HDU one array, read with astropy's header parser.

kerchunk's `kerchunk.fits.process_file` maps the same images, but is not used as it is: it gives BSCALE to
numcodecs' FixedScaleOffset, which divides by it (wrong values wherever BSCALE is not 1), names two HDUs
of the same EXTNAME (HST's SCI, ERR, DQ per chip) the same array, and names the axes z/y/x for every
image (two images of different sizes then conflict in xarray). Here an image's bytes are referenced as
they are (big-endian, one chunk), BSCALE/BZERO become CF's scale_factor/add_offset and BLANK _FillValue,
which xarray and netCDF-C apply themselves, and each image has axes of its own.

A tile-compressed image (a binary table of compressed tiles) is one chunk a tile where a numcodecs codec
reads its tiles: GZIP_1 (gzip), GZIP_2 (gzip, then byte shuffle) and NOCOMPRESS, of integers or floats
not quantized, and RICE_1 of integers where imagecodecs is installed (its codec `imagecodecs_rcomp`, which
a Zarr reader of the raw view resolves through imagecodecs-numcodecs' entry points), tiles dividing the
image. Without imagecodecs RICE_1 is refused, as are HCOMPRESS_1, PLIO_1, quantized floats (a scale per tile)
and tiles with a column of their own beside the data (ZBLANK, UNCOMPRESSED_DATA) are named in `refused`,
as are tables (binary and ASCII) and random groups; so are an
image whose data runs past the end of the file, and a 64-bit unsigned image (BZERO 2**63), whose values
above 2**53 no float add_offset gives exactly. A HIERARCH card keeps its key's case, so a header may say
`add_offset` or `_FillValue` itself: astropy applies none of them, so such a key is kept as the card
names it (`HIERARCH add_offset`), which no CF reader applies.
"""

from __future__ import annotations

import numpy as np
import orjson

from refmount.refs.scan.formats import INSTALL_ARCHIVES

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


def hdu_name(hdu, index: int, taken: set[str]) -> str:
    """The array name of the `index`th HDU: its EXTNAME, then EXTNAME_EXTVER where a second HDU has the
    name (HST's SCI per chip), HDU<index> where neither is free or the name cannot name a directory."""
    name = (hdu.name or f"HDU{index}").strip() or f"HDU{index}"
    if name in taken:
        name = f"{name}_{hdu.header.get('EXTVER', index)}"
    if name in taken or "/" in name or name.startswith("."):
        name = f"HDU{index}"
    return name


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
            name = hdu_name(hdu, index, taken)
            if isinstance(hdu, fits.CompImageHDU):
                try:
                    reason = _tiled(hdu, name, url, refs, size, fileobj)
                except (KeyError, ValueError, TypeError) as e:  # (a card missing or not a number)
                    reason = f"its header cannot be read ({type(e).__name__}: {e})"
                if reason:
                    refused.append(f"{name}: a tile-compressed image: {reason}")
                else:
                    taken.add(name)
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
    pieces = {".".join(["0"] * naxis): (start, length)} if length else {}
    return _write(header, name, dtype, shape, shape, None, None, pieces, url, refs)


# tile compression a numcodecs codec reads (FITS 4.0 section 10.4): GZIP_1 is gzip of the big-endian
# tile, GZIP_2 the same after byte shuffling (most significant bytes first), NOCOMPRESS the tile as is
_TILE_CODECS = {"GZIP_1": ({"id": "gzip", "level": 1}, False), "GZIP_2": ({"id": "gzip", "level": 1}, True),
                "NOCOMPRESS": (None, False)}
_TFORM_BYTES = {"B": 1, "I": 2, "J": 4, "K": 8, "E": 4, "D": 8}


def _tiled(hdu, name: str, url: str, refs: dict, size: int, fileobj) -> str | None:
    """A tile-compressed image (a binary table of one compressed tile a row, in the heap) as one Zarr
    chunk a tile; the reason it cannot be, or None."""
    table = getattr(hdu, "_bintable", None)  # (astropy's table behind the image: its header and place)
    if table is None:
        return "astropy gives no table behind it (not virtualised)"
    th, header = table.header, hdu.header
    kind = str(th.get("ZCMPTYPE", "")).strip()
    if kind not in _TILE_CODECS and kind != "RICE_1":
        return f"{kind or 'an unnamed'} tile compression (no codec refmount uses maps it)"
    columns = [str(th.get(f"TTYPE{n}", "")).strip() for n in range(1, int(th.get("TFIELDS", 0)) + 1)]
    if columns != ["COMPRESSED_DATA"]:  # (ZSCALE/ZZERO: quantized floats; ZBLANK, UNCOMPRESSED_DATA: per tile)
        return f"columns beside the compressed tiles ({', '.join(c for c in columns if c != 'COMPRESSED_DATA')})"
    dtype = _BITPIX.get(header.get("BITPIX"))
    if dtype is None or "ZBLANK" in th or (dtype[1] == "f" and str(th.get("ZQUANTIZ", "NONE")).strip() != "NONE"):
        return "quantized or blanked by the compression (not virtualised)"
    if kind == "RICE_1":
        rice = _rice(th, dtype)
        if isinstance(rice, str):
            return rice
        tile_dtype, blocksize = rice
    naxis = int(th.get("ZNAXIS", 0))
    if naxis < 1:
        return f"ZNAXIS {naxis} (no image)"
    shape = [int(th[f"ZNAXIS{n}"]) for n in range(naxis, 0, -1)]
    tile = [int(th.get(f"ZTILE{n}", shape[-1] if n == 1 else 1)) for n in range(naxis, 0, -1)]
    if any(t < 1 or s % t for s, t in zip(shape, tile)):
        return f"tiles {tile} that do not divide the image {shape} (edge tiles are cut short)"
    tform = str(th.get("TFORM1", "")).strip().lstrip("1")
    width = {"P": 8, "Q": 16}.get(tform[:1])
    element = _TFORM_BYTES.get(tform[1:2])
    if width is None or element not in (1, np.dtype(dtype).itemsize) or int(th["NAXIS1"]) != width:
        return f"a column form {th.get('TFORM1')!r} refmount does not read"
    rows = int(th["NAXIS2"])
    grid = [s // t for s, t in zip(shape, tile)]
    if rows != int(np.prod(grid, dtype=object)):
        return f"{rows} tiles where the image has {int(np.prod(grid, dtype=object))}"
    start = int(table.fileinfo()["datLoc"])
    heap = start + int(th.get("THEAP", width * rows))
    fileobj.seek(start)
    raw = fileobj.read(width * rows)
    if len(raw) != width * rows:
        return "its table runs past the end of the file: truncated"
    descriptors = np.frombuffer(raw, ">i4" if width == 8 else ">i8").reshape(rows, 2).tolist()
    pieces = {}
    for row, (count, offset) in enumerate(descriptors):
        if count <= 0 or offset < 0 or heap + offset + count * element > size:
            return f"tile {row} is empty or outside the file"
        if kind == "NOCOMPRESS" and count * element != np.dtype(dtype).itemsize * int(np.prod(tile)):
            return f"tile {row} is {count * element} bytes, not its tile's"
        key = ".".join(str(i) for i in np.unravel_index(row, grid))  # (FITS's fastest axis is Zarr's last)
        pieces[key] = (heap + offset, count * element)
    if kind == "RICE_1":
        compressor, filters = {"id": "imagecodecs_rcomp", "shape": tile, "dtype": tile_dtype, "nblock": blocksize}, None
        dtype = tile_dtype  # (the tile's integers, in the host's order: not the image's big-endian ones)
    else:
        compressor, shuffled = _TILE_CODECS[kind]
        filters = [{"id": "shuffle", "elementsize": np.dtype(dtype).itemsize}] if shuffled else None
    return _write(header, name, dtype, shape, tile, compressor, filters, pieces, url, refs)


def _rice(th, dtype: str) -> tuple[str, int] | str:
    """(the dtype a RICE_1 tile decodes to, its block size), or why its tiles cannot be read."""
    try:
        import imagecodecs
    except ImportError:
        return f"RICE_1 tiles need imagecodecs {INSTALL_ARCHIVES}"
    if not imagecodecs.RCOMP.available:
        return "RICE_1 tiles need imagecodecs built with rcomp"
    params = {str(th.get(f"ZNAME{n}", "")).strip().upper(): th.get(f"ZVAL{n}") for n in range(1, 10)}
    blocksize, bytepix = params.get("BLOCKSIZE", 32), params.get("BYTEPIX", 4)  # (FITS's defaults, astropy's)
    # (rcomp decodes to the host's byte order: "<i2" here, ">i2" on a big-endian host; not T, which is 1)
    ok = type(bytepix) is int and bytepix in (1, 2, 4)
    tile_dtype = np.dtype({1: "u1", 2: "i2", 4: "i4"}[bytepix]).str if ok else None
    if dtype[1] not in "iu" or tile_dtype is None or np.dtype(tile_dtype).itemsize < np.dtype(dtype).itemsize:
        return f"RICE_1 tiles of BYTEPIX {bytepix!r} for BITPIX {th.get('ZBITPIX')!r} (not virtualised)"
    if type(blocksize) is not int or blocksize not in (16, 32):
        return f"RICE_1 tiles of BLOCKSIZE {blocksize!r} (rcomp reads 16 and 32)"
    return tile_dtype, blocksize


def _write(header, name: str, dtype: str, shape: list, chunks: list, compressor, filters, pieces: dict,
           url: str, refs: dict) -> str | None:
    """An image's .zarray, .zattrs (BSCALE/BZERO/BLANK as CF's attributes) and chunk references."""
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
    attrs["_ARRAY_DIMENSIONS"] = [f"{name}_naxis{n}" for n in range(len(shape), 0, -1)]
    zarray = {"zarr_format": 2, "shape": shape, "chunks": [max(1, c) for c in chunks], "dtype": dtype,
              "compressor": compressor, "filters": filters, "order": "C", "dimension_separator": ".",
              "fill_value": fill if fill is not None else (None if dtype[1] in "iu" else "NaN")}
    refs[f"{name}/.zarray"] = orjson.dumps(zarray).decode()
    refs[f"{name}/.zattrs"] = orjson.dumps(attrs).decode()
    for key, (offset, length) in pieces.items():
        refs[f"{name}/{key}"] = [url, offset, length]
    return None
