"""HDF5 semantics that Zarr v2 metadata cannot say, shared by the DMR++ reader and the decoded view.

- **String padding.** An HDF5 fixed-length string is NUL-terminated (H5T_STR_NULLTERM), NUL-padded
  (NULLPAD) or space-padded (SPACEPAD); the bytes after the terminator are not part of the value (a
  NUL-terminated "swe" may be stored as ``swe\\0et\\0``). Hyrax (bes DmrppArray.cc) cuts a null_term or
  null_pad string at its first NUL and strips a space_pad one's trailing spaces and NULs; h5py reads
  null_term and space_pad strings so. netCDF-C 4.10 reads a space_pad value's bytes to its first NUL, its
  spaces kept (``ab   `` is ``ab   ``, ``ab \\0zz`` is ``ab ``, measured): a direct scan says
  `SPACE_PAD_KEPT`, so that netCDF clients read the file's values. A reference set
  says it with the extra ``.zarray`` key `STRING_PAD_KEY` (the Zarr v2
  spec has readers ignore keys they do not know: zarr-python and netCDF-C do), which the decoded view
  applies to each chunk (`cut_padding`). The raw view serves the bytes as stored.
- **A fill value the file does not declare.** Every HDF5 dataset has a fill value (0 unless its writer set
  one); netCDF-C and h5py-based readers mask it only when a `_FillValue` attribute declares it. kerchunk
  writes the fill of a dataset that is no netCDF variable as `fill_value` either way, which Zarr readers
  mask. refmount's scanner marks an undeclared one with the extra ``.zarray`` key `UNDECLARED_FILL_KEY`;
  the decoded view then serves no fill_value, and chunks never written as files of that fill. The same
  key false says a scanner knows the fill is declared, whatever its value (a TIFF's GDAL_NODATA of 0,
  refs/scan/tiff.py), where the decoded view would take a 0 for HDF5's own fill.
  A `_FillValue` attribute that is not HDF5's fill (h5py writers set the attribute alone): netCDF-C reads
  never-written chunks as HDF5's fill, and masks only the attribute's value. The scanner writes HDF5's
  fill as the extra key `MISSING_CHUNK_FILL_KEY`; the decoded view serves never-written chunks as files
  of it, the attribute stays `fill_value`.
- **Shuffle with leftover bytes.** HDF5's shuffle filter shuffles the whole elements of a buffer and
  leaves the bytes past the last whole one in place; numcodecs' refuses such a buffer. It occurs when
  fletcher32 runs before shuffle on 8-byte elements (the checksum's 4 bytes are no whole element):
  `HDF5Shuffle` decodes it as HDF5 does, and equals numcodecs' shuffle on every other buffer.
"""

from __future__ import annotations

import numpy as np
from numcodecs import Shuffle
from numcodecs.compat import ensure_contiguous_ndarray

STRING_PAD_KEY = "hdf5_string_pad"
STRING_PADS = ("null_term", "null_pad", "space_pad")  # Hyrax's names, as dmrpp:FixedLengthStringArray writes them
SPACE_PAD_KEPT = "space_pad_kept"  # refmount's own: space_pad as netCDF-C reads it (to the first NUL, spaces kept)
SERVED_PADS = (*STRING_PADS, SPACE_PAD_KEPT)
UNDECLARED_FILL_KEY = "hdf5_fill_undeclared"  # true: fill_value is HDF5's own, no _FillValue in the file;
# false: the file declares it
MISSING_CHUNK_FILL_KEY = "hdf5_missing_chunk_fill"  # HDF5's fill, where a _FillValue attribute is another value


def cut_padding(data, length: int, pad: str) -> bytes:
    """The bytes of fixed-length strings of `length` bytes each with their padding and whatever follows
    the terminator set to NUL (numpy and every Zarr reader then see the value), by HDF5's `pad`."""
    raw = np.frombuffer(ensure_contiguous_ndarray(data), np.uint8)
    if length <= 0 or raw.size % length:
        raise ValueError(f"{raw.size} bytes are no whole number of {length}-byte strings")
    strings = raw.reshape(-1, length)
    if pad == "space_pad":  # trailing spaces and NULs go (the value may hold NULs or spaces before them)
        kept = (strings != 0x20) & (strings != 0)
        ends = length - np.argmax(kept[:, ::-1], axis=1)
        ends[~kept.any(axis=1)] = 0
    else:  # null_term, null_pad, space_pad_kept: the value ends at its first NUL
        nul = strings == 0
        ends = np.where(nul.any(axis=1), np.argmax(nul, axis=1), length)
    out = strings.copy()
    out[np.arange(length)[None, :] >= ends[:, None]] = 0
    return out.tobytes()


class HDF5Shuffle(Shuffle):
    """numcodecs' shuffle, with the bytes past the last whole element left in place as HDF5's does."""

    codec_id = "shuffle"

    def _split(self, buf):
        data = ensure_contiguous_ndarray(buf).view(np.uint8).reshape(-1)
        whole = data.size - data.size % max(self.elementsize, 1)
        return data, whole

    def decode(self, buf, out=None):
        data, whole = self._split(buf)
        if whole == data.size:
            return super().decode(buf, out)
        result = np.concatenate([np.asarray(super().decode(data[:whole])).view(np.uint8), data[whole:]])
        if out is None:
            return result
        ensure_contiguous_ndarray(out).view(np.uint8)[:] = result
        return out

    def encode(self, buf):
        data, whole = self._split(buf)
        if whole == data.size:
            return super().encode(buf)
        return np.concatenate([np.asarray(super().encode(data[:whole])).view(np.uint8), data[whole:]])
