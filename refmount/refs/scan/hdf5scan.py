"""kerchunk's SingleHdf5ToZarr as the scanners run it (worker.py, in a scanner process).

Three changes to kerchunk's translation, each keeping its references otherwise as they are:
- a variable kerchunk cannot reference is left out whole and named (`refused`), not half-written;
- a fixed-length string dataset gets HDF5's fill value and padding (`_fixed_strings`);
- a plain numeric dataset (integers or floats, contiguous or chunked, no filter but shuffle and deflate,
  every chunk with all of them) is written straight: the same keys, and the metadata zarr would store
  for it (zarr's own ArrayV2Metadata, encoded as zarr encodes it), without zarr's store. kerchunk goes
  through zarr's synchronous API, three hand-offs to zarr's I/O thread a variable: with the
  attributes read again for each, most of a 0.3 MB netCDF-4 file's scan (bench/NOTES.md, "Issue 39:
  the scanners' CPU"). Anything else, and anything this path cannot tell, goes kerchunk's way.
tests/test_scan_hdf5_plain.py holds both ways to the same references on files of every kind.
"""

from __future__ import annotations

import base64
import functools

import h5py
import numpy as np
import orjson
from h5py import h5d, h5t, h5z
from kerchunk.hdf import SingleHdf5ToZarr, _is_netcdf_datetime, _is_netcdf_variable, encode_fill_value

_BZIP2 = 307  # HDF5's registered bzip2 filter (netCDF-C's nc_def_var_bzip2, hdf5plugin): a plain bz2 stream per chunk
_PIPELINES = {(): (), (h5z.FILTER_DEFLATE,): ("zlib",), (h5z.FILTER_SHUFFLE,): ("shuffle",),
              (h5z.FILTER_SHUFFLE, h5z.FILTER_DEFLATE): ("shuffle", "zlib"),  # (the order kerchunk writes them)
              (_BZIP2,): ("bz2",), (h5z.FILTER_SHUFFLE, _BZIP2): ("shuffle", "bz2")}  # (kerchunk refuses bzip2)


class Translator(SingleHdf5ToZarr):
    """kerchunk's translator with the changes above; `refused` gathers "name: reason" lines."""

    def __init__(self, fileobj, url: str, refused: list, plain: bool = True) -> None:
        super().__init__(fileobj, url=url, error="raise")
        self.refused = refused
        self.plain = plain  # (False: every dataset kerchunk's way, as the test's oracle)

    def _transfer_attrs(self, h5obj, zobj):
        super()._transfer_attrs(h5obj, zobj)
        for key, value in space_padded_attributes(h5obj).items():
            if key in zobj.attrs:
                zobj.attrs[key] = value

    def _translator(self, name, h5obj):
        if isinstance(h5obj, h5py.Dataset) and h5obj.shape is None:  # (kerchunk fails on it with a TypeError)
            self.refused.append(f"{name}: an empty dataspace (H5S_NULL): no values (netCDF-C fails the open on it)")
            return
        try:
            _refuse_other_files(h5obj)
            keys = plain_dataset_keys(self, h5obj) if self.plain else None
            if keys is not None:
                self.store_dict.update(keys)
            else:
                super()._translator(name, h5obj)
                _fixed_strings(self.store_dict, name, h5obj)
            _undeclared_fill(self.store_dict, name, h5obj)
            _disagreeing_fill(self.store_dict, name, h5obj)
        except Exception as e:  # noqa: BLE001 - kerchunk's reasons are of every kind
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.refused.append(f"{name}: {reason}")
            prefix = name.strip("/") + "/"
            for key in [k for k in self.store_dict if k.startswith(prefix)]:
                del self.store_dict[key]


def _refuse_other_files(h5obj) -> None:
    """A dataset whose values HDF5 reads from other files is refused before anything reads it: external
    storage names any path on this machine, which HDF5 opens as it reads (kerchunk reads a compound or
    variable-length dataset whole: a remote file's worker, maybe root's, opened /etc/shadow or a device);
    a virtual dataset's sources are other files too. Neither has references into this file: kerchunk
    wrote it as an array of its fill value."""
    if not isinstance(h5obj, h5py.Dataset):
        return
    dcpl = h5obj.id.get_create_plist()
    if dcpl.get_external_count():
        raise ValueError("its values are in external files (HDF5 external storage: not virtualised)")
    if dcpl.get_layout() == h5d.VIRTUAL:
        raise ValueError("a virtual dataset: its values are in other files (not virtualised)")


class _Attributes:
    """Stands for a zarr array in kerchunk's _transfer_attrs (what it would set is kept in `attrs`), and
    for the dataset there (its attributes read once: h5py reads each again at every look)."""

    def __init__(self, attrs: dict, name: str = "") -> None:
        self.attrs = attrs
        self.name = name


def plain_dataset_keys(translator: SingleHdf5ToZarr, h5obj) -> dict | None:
    """The keys kerchunk's _translator writes for `h5obj` (metadata as zarr Buffers, as kerchunk's store
    holds them), or None when it is not a plain numeric dataset or anything about it is unusual."""
    try:
        return _plain_keys(translator, h5obj)
    except Exception:  # noqa: BLE001 - kerchunk's way then decides, and says why if it fails
        return None


def _plain_keys(translator: SingleHdf5ToZarr, h5obj) -> dict | None:
    if not isinstance(h5obj, h5py.Dataset) or h5obj.shape is None:
        return None
    dsid = h5obj.id
    dtype = h5obj.dtype
    if (dsid.get_type().get_class() not in (h5t.INTEGER, h5t.FLOAT) or dtype.kind not in "iuf"
            or dtype.metadata or dtype.byteorder not in "<|="):
        return None
    dcpl = dsid.get_create_plist()
    layout = dcpl.get_layout()
    if layout not in (h5d.CONTIGUOUS, h5d.CHUNKED) or dcpl.get_external_count():
        return None
    filters = _filters(dcpl, dtype)
    if filters is None:
        return None
    chunks = _chunk_places(h5obj, dsid, layout)
    if chunks is None:
        return None

    read = _Attributes({**h5obj.attrs, **space_padded_attributes(h5obj)}, h5obj.name)
    fill = None if _is_netcdf_datetime(read) or _is_netcdf_variable(read) else h5obj.fillvalue
    if h5py.h5ds.is_scale(dsid) and not chunks:
        return {}  # (kerchunk writes nothing for a dimension without values: netCDF's bare dimensions)
    declared = read.attrs.get("_FillValue")
    if declared is not None:
        fill = encode_fill_value(declared, dtype)
    attributes = {"_ARRAY_DIMENSIONS": translator._get_array_dims(h5obj)}
    translator._transfer_attrs(read, _Attributes(attributes))

    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.metadata.v2 import ArrayV2Metadata

    metadata = ArrayV2Metadata(shape=h5obj.shape, dtype=_zarr_dtype(dtype),
                               chunks=h5obj.chunks or h5obj.shape, fill_value=fill, order="C",
                               dimension_separator=".", compressor=None, filters=filters,
                               attributes=attributes)
    path = h5obj.name.removeprefix("/")
    keys = {f"{path}/{k}": v for k, v in metadata.to_buffer_dict(default_buffer_prototype()).items()}
    inline = translator.inline
    for index, (offset, size) in chunks.items():
        key = f"{path}/{'.'.join(map(str, index))}"
        if inline and size < inline:  # (kerchunk's inline_threshold: the bytes themselves)
            translator.input_file.seek(offset)
            keys[key] = translator.input_file.read(size)
        else:
            keys[key] = [translator._uri, offset, size]
    return keys


@functools.lru_cache(maxsize=64)
def _zarr_dtype(dtype: np.dtype):
    """zarr's data type of a plain numeric dtype (zarr matches it against every type it knows: 1 ms)."""
    from zarr.core.dtype import parse_dtype

    return parse_dtype(dtype, zarr_format=2)


def _filters(dcpl, dtype: np.dtype) -> list | None:
    """kerchunk's filters of a pipeline of shuffle and deflate or bzip2 only (numcodecs), else None."""
    import numcodecs

    found = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]
    names = _PIPELINES.get(tuple(code for code, *_ in found))
    if names is None:
        return None
    out = []
    for name, (_, _, values, _) in zip(names, found):
        if name == "shuffle":
            out.append(numcodecs.Shuffle(elementsize=dtype.itemsize))
        elif len(values) != 1:
            return None
        elif name == "bz2":
            out.append(numcodecs.BZ2(level=min(max(values[0], 1), 9)))  # (the level only matters to a writer)
        else:
            out.append(numcodecs.Zlib(level=values[0]))
    return out


def _chunk_places(h5obj, dsid, layout: int) -> dict | None:
    """{chunk index: (offset, size)} in kerchunk's order, or None if a chunk skips a filter."""
    if layout == h5d.CONTIGUOUS:
        offset = dsid.get_offset()
        return {} if offset is None else {(0,) * (len(h5obj.shape) or 1): (offset, dsid.get_storage_size())}
    if dsid.get_num_chunks() == 0:
        return {}
    shape = h5obj.chunks
    places: dict = {}
    masked = []

    def keep(blob) -> None:
        if blob.filter_mask:
            masked.append(blob)
        places[tuple(a // b for a, b in zip(blob.chunk_offset, shape))] = (blob.byte_offset, blob.size)

    if callable(getattr(dsid, "chunk_iter", None)):
        dsid.chunk_iter(keep)
    else:
        for index in range(dsid.get_num_chunks()):
            keep(dsid.get_chunk_info(index))
    return None if masked else places


def _edit_zarray(store: dict, key: str, edit) -> None:
    """Apply `edit` to the .zarray `key` of kerchunk's store (zarr 3's Buffer there, or bytes)."""
    raw = store[key]
    meta = orjson.loads(raw.to_bytes() if hasattr(raw, "to_bytes") else raw)
    edit(meta)
    data = orjson.dumps(meta)
    store[key] = type(raw).from_bytes(data) if hasattr(type(raw), "from_bytes") else data


def _undeclared_fill(store: dict, name: str, h5obj) -> None:
    """A numeric dataset's fill_value that is HDF5's own, with no _FillValue attribute (refmount.refs.hdf5):
    marked so, for the decoded view to serve it as data (as netCDF-C and h5py read the file)."""
    from refmount.refs.hdf5 import UNDECLARED_FILL_KEY

    key = f"{name.strip('/')}/.zarray"
    if not isinstance(h5obj, h5py.Dataset) or h5obj.dtype.kind not in "iuf" or key not in store:
        return
    if "_FillValue" in h5obj.attrs:
        return

    def mark(meta: dict) -> None:
        if meta.get("fill_value") is not None:
            meta[UNDECLARED_FILL_KEY] = True

    _edit_zarray(store, key, mark)


def _disagreeing_fill(store: dict, name: str, h5obj) -> None:
    """A numeric dataset whose _FillValue attribute is not its HDF5 fill (refmount.refs.hdf5): HDF5's
    fill, which netCDF-C and h5py read where no chunk was written, kept beside fill_value."""
    from refmount.refs.hdf5 import MISSING_CHUNK_FILL_KEY

    key = f"{name.strip('/')}/.zarray"
    if not isinstance(h5obj, h5py.Dataset) or h5obj.dtype.kind not in "iuf" or key not in store:
        return
    declared = h5obj.attrs.get("_FillValue")
    if declared is None or np.size(declared) != 1:
        return
    own = np.asarray(h5obj.fillvalue, h5obj.dtype)
    if own.tobytes() == np.asarray(declared).astype(h5obj.dtype).tobytes():
        return

    def mark(meta: dict) -> None:
        meta[MISSING_CHUNK_FILL_KEY] = encode_fill_value(own[()], h5obj.dtype)

    _edit_zarray(store, key, mark)


def space_padded_attributes(h5obj) -> dict:
    """{name: value} of the object's space-padded fixed-length string attributes as netCDF-C reads them
    (its bytes to the first NUL, spaces kept: refmount.refs.hdf5), where h5py strips the spaces."""
    out = {}
    oid = getattr(h5obj, "id", None)
    if oid is None or not hasattr(h5obj, "attrs"):
        return out
    for name in h5obj.attrs:
        try:
            aid = h5py.h5a.open(oid, name.encode())
            tid = aid.get_type()
            if (tid.get_class() != h5t.STRING or tid.is_variable_str() or tid.get_strpad() != h5t.STR_SPACEPAD
                    or aid.shape is None or len(aid.shape) > 1):
                continue
            raw = np.empty(aid.shape, dtype=f"S{tid.get_size()}")
            aid.read(raw, mtype=tid)  # (the stored bytes: no conversion)
        except Exception:  # noqa: BLE001 - kerchunk's value then stands
            continue
        codec = "utf-8" if tid.get_cset() == h5t.CSET_UTF8 else "latin-1"
        values = [bytes(v).split(b"\0", 1)[0].decode(codec, "replace") for v in raw.ravel().tolist()]
        out[name] = values[0] if raw.ndim == 0 else values
    return out


def _fixed_strings(store: dict, name: str, h5obj) -> None:
    """A fixed-length string dataset's .zarray as HDF5 reads it. kerchunk gives every one the fill value
    b" " (zarr then reads a chunk never written as spaces; HDF5 and h5py read NULs, or the dataset's own
    fill): here the dataset's. And its padding (refmount.refs.hdf5: the decoded view cuts each value at
    its terminator, as h5py and netCDF-C read it; kerchunk keeps the bytes after), not for one-byte
    strings (netCDF-4's char data), which cutting leaves as they are."""
    from refmount.refs.hdf5 import SPACE_PAD_KEPT, STRING_PAD_KEY, STRING_PADS

    key = f"{name.strip('/')}/.zarray"
    if not isinstance(h5obj, h5py.Dataset) or h5obj.dtype.kind != "S" or key not in store:
        return
    size = h5obj.dtype.itemsize
    fill = bytes(np.asarray(h5obj.fillvalue, dtype=h5obj.dtype).item()).ljust(size, b"\0")[:size]
    pad = h5obj.id.get_type().get_strpad()  # (H5T_STR_NULLTERM 0, NULLPAD 1, SPACEPAD 2)

    def edit(meta: dict) -> None:
        meta["fill_value"] = base64.b64encode(fill).decode()
        if size > 1 and 0 <= pad < len(STRING_PADS):  # (space_pad: netCDF-C's reading, refmount.refs.hdf5)
            meta[STRING_PAD_KEY] = SPACE_PAD_KEPT if STRING_PADS[pad] == "space_pad" else STRING_PADS[pad]

    _edit_zarray(store, key, edit)
