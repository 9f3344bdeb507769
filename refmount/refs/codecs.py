"""The codecs refmount decodes with: a named list, and nothing else.

A reference set names its codecs, and the daemon decoding its chunks may run as root. numcodecs'
registry resolves any id that an installed package registers (entry points): ``pickle`` (code
execution on decode wherever numcodecs' own guard is missing, as in Debian 12's numcodecs 0.10, or
lifted by NUMCODECS_ALLOW_UNSAFE_PICKLE_DECODE), ``msgpack2``/``json2`` (Python objects), and
imagecodecs' C decoders of dozens of image formats. So every codec refmount makes (the decoded view,
its string scan, Zarr v3 fills, --concat's comparison, DMR++ fills) is made by `make_codec`, from the
classes named in `ALLOWED`, never through the registry: an id not listed imports nothing.

The list is what refmount's scanners and the reference formats it reads emit: numcodecs' data
transforms, HDF5's shuffle (refs/hdf5.py), GRIB (refs/gribcodec.py), kerchunk's HDF5 string and record
codecs, FITS RICE_1 tiles, Zarr v3's transpose, and the image codecs tifffile writes for TIFF/COG
tiles. Each image codec gets a size check from its stream's own header before its C decoder runs
(view/bounded.py); image codecs with no practical check (LERC, JPEG XL, JPEG XR, Jetraw, EER) are not
listed.
"""

from __future__ import annotations

import importlib
import importlib.util

import numpy as np
from numcodecs.abc import Codec
from numcodecs.categorize import Categorize
from numcodecs.compat import ensure_contiguous_ndarray, ensure_ndarray, ndarray_copy

_NUMCODECS = {"zlib": "Zlib", "gzip": "GZip", "bz2": "BZ2", "lzma": "LZMA", "zstd": "Zstd", "blosc": "Blosc",
              "lz4": "LZ4", "delta": "Delta", "fixedscaleoffset": "FixedScaleOffset", "quantize": "Quantize",
              "bitround": "BitRound", "packbits": "PackBits", "astype": "AsType",
              "fletcher32": "Fletcher32", "crc32": "CRC32", "adler32": "Adler32", "crc32c": "CRC32C",
              "jenkins_lookup3": "JenkinsLookup3", "vlen-utf8": "VLenUTF8", "vlen-bytes": "VLenBytes",
              "base64": "Base64"}
# kerchunk's own (importing kerchunk.codecs imports zarr: 0.3 s, paid at the first chunk decoded)
_KERCHUNK = {"fill_hdf_strings": "FillStringsCodec", "record_member": "RecordArrayMember",
             "FITSAscii": "AsciiTableCodec"}
# imagecodecs' numcodecs classes (package imagecodecs): TIFF/COG tiles (tifffile's ids) and FITS RICE_1
_IMAGECODECS = {"imagecodecs_jpeg": "Jpeg", "imagecodecs_png": "Png", "imagecodecs_jpeg2k": "Jpeg2k",
                "imagecodecs_webp": "Webp", "imagecodecs_deflate": "Deflate", "imagecodecs_lzw": "Lzw",
                "imagecodecs_packbits": "Packbits", "imagecodecs_zstd": "Zstd", "imagecodecs_delta": "Delta",
                "imagecodecs_floatpred": "Floatpred", "imagecodecs_rcomp": "Rcomp"}
TRANSPOSE_ID = "refmount.zarr3.transpose"

# id -> (module, class)
ALLOWED = {**{cid: ("numcodecs", name) for cid, name in _NUMCODECS.items()},
           **{cid: ("kerchunk.codecs", name) for cid, name in _KERCHUNK.items()},
           **{cid: ("imagecodecs.numcodecs", name) for cid, name in _IMAGECODECS.items()},
           "shuffle": ("refmount.refs.hdf5", "HDF5Shuffle"),  # (numcodecs' own, with HDF5's rule for leftover bytes)
           "grib": ("refmount.refs.gribcodec", "GribCodec"),  # (kerchunk's id; its codec took a real 9999 for missing)
           "categorize": ("refmount.refs.codecs", "LookupCategorize"),  # (numcodecs' own, decoded in one pass)
           TRANSPOSE_ID: ("refmount.refs.codecs", "TransposeCodec")}


class RefusedCodec(ValueError):
    """A codec id refmount does not decode with."""


def refusal(config) -> str | None:
    """Why `config`'s codec is not made here (one line naming its id), or None when it is allowed."""
    cid = config.get("id") if isinstance(config, dict) else None
    if isinstance(cid, str) and cid in ALLOWED:
        return None
    return f"codec {str(cid)[:80]!r} is not one refmount decodes"


def make_codec(config: dict):
    """The codec of an allowed `config` (from its class named in ALLOWED); RefusedCodec otherwise,
    having imported nothing."""
    why = refusal(config)
    if why:
        raise RefusedCodec(why)
    params = {k: v for k, v in config.items() if k != "id"}
    module, name = ALLOWED[config["id"]]
    if name == "GribCodec":
        params = {"var": params.get("var", "values"), "dtype": params.get("dtype")}
    elif name == "HDF5Shuffle":
        params = {"elementsize": params.get("elementsize", 4)}
    cls = getattr(importlib.import_module(module), name)
    if module == "imagecodecs.numcodecs":  # (its from_config decodes base64 values: a JPEG tile's tables)
        return cls.from_config(params)
    return cls(**params)


class TransposeCodec(Codec):
    """Undo a Zarr v3 `transpose` codec: the stored chunk is the array transposed by `order`."""

    codec_id = TRANSPOSE_ID

    def __init__(self, order, shape, dtype):
        self.order = list(order)
        self.shape = list(shape)
        self.dtype = dtype

    def decode(self, buf, out=None):
        stored = ensure_contiguous_ndarray(buf).view(np.dtype(self.dtype))
        stored = stored.reshape([self.shape[k] for k in self.order])
        return np.ascontiguousarray(stored.transpose(np.argsort(self.order)))

    def encode(self, buf):
        array = np.frombuffer(ensure_contiguous_ndarray(buf), np.dtype(self.dtype)).reshape(self.shape)
        return np.ascontiguousarray(array.transpose(self.order))


class LookupCategorize(Categorize):
    """numcodecs' Categorize, decoded by one lookup in a table of its labels: numcodecs' own compares
    the whole chunk once per label (a reference set naming 10^6 labels held a worker for minutes per
    chunk). Codes past the labels decode to "", as numcodecs' do; codes must be integers."""

    def decode(self, buf, out=None):
        if self.astype.kind not in "iu":
            raise ValueError(f"categorize codes of type {self.astype} are not integers")
        codes = ensure_ndarray(buf).view(self.astype).reshape(-1, order="A")
        table = getattr(self, "_table", None)
        if table is None:  # ("" first: code 0, and every code past the labels, is no label)
            table = self._table = np.array(["", *self.labels], dtype=self.dtype)
        known = (codes >= 1) & (codes <= len(self.labels))
        decoded = np.full(codes.shape, "", dtype=self.dtype)
        decoded[known] = table[codes[known].astype(np.intp)]
        return ndarray_copy(decoded, out)


def check_codec(config: dict) -> None:
    """Raises RefusedCodec for an id not allowed, another error when its codec cannot be had here. A
    codec of another package (kerchunk's, imagecodecs') is only looked for: importing it waits for
    the first chunk decoded (kerchunk imports zarr: 0.3 s of a warm GRIB mount's 0.5)."""
    why = refusal(config)
    if why:
        raise RefusedCodec(why)
    module = ALLOWED[config["id"]][0]
    if module == "numcodecs" or module.startswith("refmount."):
        make_codec(config)
    elif importlib.util.find_spec(module.partition(".")[0]) is None:
        raise ModuleNotFoundError(f"no module named {module.partition('.')[0]!r}")
