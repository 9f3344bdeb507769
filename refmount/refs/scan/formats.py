"""Which kind of data file a file is, from its first bytes (never its name).

HDF5 (netCDF-4, HDF-EOS5) may start after a user block: its signature then sits at 512, 1024, 2048, ...
(a power of two), which `signature_offsets` lists up to what the caller has read.
"""

from __future__ import annotations

# the words a refusal ends with where a package of the archives extra would read it: such a scan is not
# kept (refs/scan/archive.py), so that the file is read once the package is installed
INSTALL_ARCHIVES = "(pip install 'refmount[archives]')"

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
HDF4_SIGNATURE = b"\x0e\x03\x13\x01"  # (HDF4 has no user block: at 0 only)
FITS_SIGNATURE = b"SIMPLE  ="  # the first 80-character card of every FITS file (SIMPLE = T)
WMO_HEADING_BYTES = 256  # where the first "GRIB" of a file of WMO bulletins may be
SNIFF_BYTES = 64 << 10  # one request's worth: the first bytes of a file, for every test below

FORMAT_NAMES = {"hdf5": "netCDF-4/HDF5", "netcdf3": "netCDF-3", "grib": "GRIB", "tiff": "TIFF", "hdf4": "HDF4",
                "fits": "FITS"}

# what each format's scanner makes arrays of, and what it leaves out (named per variable in its log line);
# `refmount inspect` and docs/archives.md say the same
VIRTUALISED = {
    "hdf5": ("every dataset kerchunk's SingleHdf5ToZarr references (HDF5 filters with a numcodecs codec)",
             "datasets whose filters or layout kerchunk cannot reference, external storage, virtual datasets"),
    "netcdf3": ("every variable, record variables included", "nothing"),
    "grib": ("every message of either edition, grouped by kerchunk's grib_tree, decoded as cfgrib decodes it",
             ("reduced grids, spherical harmonics, rows stored alternately reversed or column by column, "
              "ensemble members at one time, step and level, messages of several fields")),
    "tiff": (("the first image (variable 0) and its overview levels (1, 2, ...), tifffile's chunks; a short last "
              "strip padded in the decoded view"),
             ("compressions with no codec, volumetric images (ImageDepth) with a short last strip, images after "
              "the first (an internal mask)")),
    "hdf4": (("every SD-interface SDS (HDF-EOS2's fields are SDSs): contiguous or chunked, plain or deflated, "
              "with its attributes and dimension names; DFSD datasets"),
             ("SZIP, RLE, NBIT, skipping-Huffman and JPEG compression, linked or external storage, GR and DFR8 "
              "raster images, Vdata tables, HDF-EOS swath dimension maps")),
    "fits": (("every image HDU (BSCALE/BZERO/BLANK as scale_factor/add_offset/_FillValue), its header as "
              "attributes; tile-compressed images of GZIP_1, GZIP_2 or NOCOMPRESS tiles, and RICE_1 tiles with "
              "imagecodecs, a chunk a tile"),
             ("HCOMPRESS_1 and PLIO_1 tiles, tiles that do not divide the image, quantized floats, binary and ASCII "
              "tables, random groups, 64-bit unsigned images, truncated images")),
}


def signature_offsets(limit: int):
    yield 0
    offset = 512
    while offset + len(HDF5_SIGNATURE) <= limit:
        yield offset
        offset *= 2


def sniff(head: bytes) -> str | None:
    """'hdf5', 'netcdf3', 'grib', 'tiff', 'hdf4' or 'fits' from a file's first bytes, or None: not a data
    file we scan."""
    if head[:3] == b"CDF" and head[3:4] in (b"\x01", b"\x02", b"\x05"):
        return "netcdf3"
    if head[:4] == b"GRIB" or (head[:4] == b"****" and b"GRIB" in head[:WMO_HEADING_BYTES]):
        return "grib"  # (NOAA's NDFD files: each message after a WMO bulletin heading "****0000014913****...")
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):  # TIFF and BigTIFF, either byte order
        return "tiff"
    if head[:4] == HDF4_SIGNATURE:
        return "hdf4"
    if head[:9] == FITS_SIGNATURE:
        return "fits"
    for offset in signature_offsets(len(head)):
        if head[offset:offset + len(HDF5_SIGNATURE)] == HDF5_SIGNATURE:
            return "hdf5"
    return None
