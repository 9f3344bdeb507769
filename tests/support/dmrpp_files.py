"""DMR++ files in the shape Hyrax's build_dmrpp writes them, for HDF5/netCDF-4 files made here.

OPeNDAP's own test files (tests/data/dmrpp, from bes) cover most layouts; these fill the gaps with a
netCDF-4 file as NASA's archives hold them: groups, shared dimensions, every numeric type, missing
chunks with a _FillValue, shuffle+deflate and fletcher32 in the file's own filter order, big-endian,
contiguous and chunked, fixed and variable-length strings. Chunk offsets come from HDF5 itself
(h5py's `get_chunk_info`), so the DMR++ is as true as Hyrax's.
"""

from __future__ import annotations

import base64
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import numpy as np

DAP = {"u1": "UInt8", "i1": "Int8", "i2": "Int16", "u2": "UInt16", "i4": "Int32", "u4": "UInt32",
       "i8": "Int64", "u8": "UInt64", "f4": "Float32", "f8": "Float64"}
FILTERS = {1: "deflate", 2: "shuffle", 3: "fletcher32"}
SKIP_ATTRS = {"DIMENSION_LIST", "REFERENCE_LIST"}


def make_netcdf(path: Path) -> Path:
    """A netCDF-4 file with the layouts real archives have (see the module docstring)."""
    import netCDF4

    with netCDF4.Dataset(path, "w") as ds:
        ds.title = "DMR++ test file"
        ds.version = np.int32(3)
        ds.scales = np.array([0.5, 2.0], dtype="f8")
        ds.createDimension("time", 4)
        ds.createDimension("lat", 5)
        ds.createDimension("lon", 6)
        ds.createDimension("nchar", 3)
        lat = ds.createVariable("lat", "f8", ("lat",))
        lat[:] = np.linspace(-40, 40, 5)
        lat.units = "degrees_north"
        lon = ds.createVariable("lon", "f4", ("lon",), contiguous=True)
        lon[:] = np.arange(6) * 10.5
        temp = ds.createVariable("temp", "f4", ("time", "lat", "lon"), chunksizes=(1, 3, 4), zlib=True,
                                 shuffle=True, complevel=4, fill_value=np.float32(-999.0))
        temp.units = "K"
        temp.valid_range = np.array([150, 350], dtype="f4")
        temp[0:2] = np.arange(60, dtype="f4").reshape(2, 5, 6) + 200.5  # time 2 and 3: chunks never written
        pres = ds.createVariable("pres", ">i2", ("lat", "lon"), endian="big", contiguous=True)
        pres[:] = np.arange(30, dtype="i2").reshape(5, 6) - 7
        counts = ds.createVariable("counts", "u8", ("time", "lon"), chunksizes=(2, 3), zlib=True, shuffle=False,
                                   fletcher32=True, fill_value=np.uint64(2**64 - 2))
        counts[:] = np.arange(24, dtype="u8").reshape(4, 6) * 1_000_000_007
        for code in ("i1", "u1", "u2", "i4", "u4", "i8"):
            v = ds.createVariable(f"v_{code}", code, ("lon",), chunksizes=(4,), zlib=True, shuffle=True,
                                  fletcher32=code == "u4")  # netCDF-C's order: fletcher32 shuffle deflate
            info = np.iinfo(code)
            v[:] = np.array([info.min, info.max, 0, 1, 2, 3], dtype=code)
        scalar = ds.createVariable("answer", "i4")
        scalar[...] = 42
        names = ds.createVariable("names", str, ("lat",))
        for i, text in enumerate(["alpha", "beta", "γάμμα", "", "epsilon-long-name"]):
            names[i] = text
        code = ds.createVariable("code", "S1", ("lat", "nchar"))
        code[:] = netCDF4.stringtochar(np.array(["ab", "cde", "f", "gh", "ijk"], dtype="S3"))
        forecast = ds.createGroup("forecast")
        forecast.model = "toy"
        forecast.createDimension("step", 2)
        t2 = forecast.createVariable("t2", "i4", ("step", "lat", "lon"), chunksizes=(1, 5, 3), zlib=True,
                                     shuffle=True, fill_value=np.int32(-1))
        t2[:] = np.arange(60, dtype="i4").reshape(2, 5, 6)
        t2.long_name = "two-metre temperature"
    return path


def write_dmrpp(h5_path: Path, dmrpp_path: Path, href: str = "OPeNDAP_DMRpp_DATA_ACCESS_URL") -> Path:
    """A DMR++ of `h5_path` as build_dmrpp writes it (`href` as its dmrpp:href)."""
    import h5py

    with h5py.File(h5_path, "r") as f:
        body = _group(f, "    ")
    text = ('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<Dataset xmlns="http://xml.opendap.org/ns/DAP/4.0#" xmlns:dmrpp="http://xml.opendap.org/dap/dmrpp/1.0.0#" '
            f'dapVersion="4.0" dmrVersion="1.0" name={quoteattr(Path(h5_path).name)} dmrpp:href={quoteattr(href)} '
            'dmrpp:version="3.21.1">\n' + body +
            '    <Attribute name="build_dmrpp_metadata" type="Container">\n'
            '        <Attribute name="build_dmrpp" type="String"><Value>3.21.1</Value></Attribute>\n'
            '    </Attribute>\n</Dataset>\n')
    Path(dmrpp_path).write_text(text, encoding="utf-8")
    return Path(dmrpp_path)


def _is_scale(d) -> bool:
    cls = d.attrs.get("CLASS")
    return cls is not None and (cls.decode() if isinstance(cls, bytes) else cls) == "DIMENSION_SCALE"


def _group(g, pad: str) -> str:
    import h5py

    out = []
    for name, obj in g.items():
        if isinstance(obj, h5py.Dataset) and _is_scale(obj):
            out.append(f'{pad}<Dimension name={quoteattr(name)} size="{obj.shape[0]}"/>\n')
    for name, obj in g.items():
        if isinstance(obj, h5py.Dataset):
            out.append(_variable(obj, name, pad))
    for name, obj in g.items():
        if isinstance(obj, h5py.Group):
            out.append(f"{pad}<Group name={quoteattr(name)}>\n{_group(obj, pad + '    ')}{pad}</Group>\n")
    out.append(_attributes(g, pad))
    return "".join(out)


def _attributes(obj, pad: str) -> str:
    out = []
    for name, value in obj.attrs.items():
        if name in SKIP_ATTRS:
            continue
        values = np.atleast_1d(value)
        if values.dtype.kind in "SOU":
            kind = "String"
            texts = [v.decode() if isinstance(v, bytes) else str(v) for v in values]
        else:
            kind = DAP[values.dtype.str[1:]]
            texts = [repr(v.item()) for v in values]
        inner = "".join(f"<Value>{escape(t)}</Value>" for t in texts)
        out.append(f'{pad}<Attribute name={quoteattr(name)} type="{kind}">{inner}</Attribute>\n')
    return "".join(out)


def _variable(d, name: str, pad: str) -> str:
    import h5py

    dt = d.dtype
    vlen = h5py.check_string_dtype(dt)
    if vlen is not None:
        kind = "String"
    else:
        kind = DAP[dt.str[1:]] if dt.kind in "iuf" else "String"
    lines = [f"{pad}<{kind} name={quoteattr(name)}>\n"]
    inner = pad + "    "
    for axis in range(len(d.shape)):
        scales = [d] if _is_scale(d) else list(d.dims[axis].values())
        if scales:
            lines.append(f"{inner}<Dim name={quoteattr(scales[0].name)}/>\n")
        else:
            lines.append(f'{inner}<Dim size="{d.shape[axis]}"/>\n')
    lines.append(_attributes(d, inner))
    dcpl = d.id.get_create_plist()
    filters = [FILTERS[dcpl.get_filter(i)[0]] for i in range(dcpl.get_nfilters())]
    order = "BE" if dt.byteorder == ">" else "LE"
    fill = d.fillvalue
    fill_text = "" if dt.kind in "SO" else repr(np.asarray(fill).item())
    levels = [dcpl.get_filter(i)[2] for i in range(dcpl.get_nfilters()) if dcpl.get_filter(i)[0] == 1]
    attrs = (f' compressionType="{" ".join(filters)}"' if filters else "") + \
            (f' deflateLevel="{levels[0][0]}"' if levels and levels[0] else "") + \
            (f' fillValue="{fill_text}"' if dt.kind not in "SO" else "") + f' byteOrder="{order}"'
    if vlen is not None and vlen.length is None:  # variable-length strings: their values (-M)
        values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in d[...].ravel()]
        lines.append(f"{inner}<dmrpp:vlsa>\n" + "".join(f"{inner}    <v>{escape(v)}</v>\n" for v in values)
                     + f"{inner}</dmrpp:vlsa>\n")
    elif d.id.get_create_plist().get_layout() == h5py.h5d.COMPACT:
        lines.append(f"{inner}<dmrpp:chunks{attrs}/>\n")
        lines.append(f"{inner}<dmrpp:compact>{base64.b64encode(d[...].astype(dt).tobytes()).decode()}</dmrpp:compact>\n")
    elif d.chunks is None:
        lines.append(f"{inner}<dmrpp:chunks{attrs}>\n")
        if d.id.get_offset() is not None:
            lines.append(f'{inner}    <dmrpp:chunk offset="{d.id.get_offset()}" nBytes="{d.id.get_storage_size()}"/>\n')
        lines.append(f"{inner}</dmrpp:chunks>\n")
    else:
        lines.append(f"{inner}<dmrpp:chunks{attrs}>\n")
        lines.append(f"{inner}    <dmrpp:chunkDimensionSizes>{' '.join(map(str, d.chunks))}</dmrpp:chunkDimensionSizes>\n")
        for i in range(d.id.get_num_chunks()):
            info = d.id.get_chunk_info(i)
            position = ",".join(map(str, info.chunk_offset))
            lines.append(f'{inner}    <dmrpp:chunk offset="{info.byte_offset}" nBytes="{info.size}" '
                         f'chunkPositionInArray="[{position}]"/>\n')
        lines.append(f"{inner}</dmrpp:chunks>\n")
    if dt.kind == "S":
        lines.append(f'{inner}<dmrpp:FixedLengthStringArray string_length="{dt.itemsize}" pad="null_pad"/>\n')
    lines.append(f"{pad}</{kind}>\n")
    return "".join(lines)
