"""HDF4 (HDF-EOS2: NASA's MODIS) files as Zarr v2 references: kerchunk's HDF4 reader walks the file's
data descriptors; this module decides what each SDS becomes, and refuses what it cannot say exactly.

kerchunk's `HDF4ToZarr` (0.2.x, "experimental") is used for its walk of the file's tags only. What it
makes of them is replaced here because it gives wrong values where this does not:
- floats are big-endian in HDF4 (XDR) unless the number type's class says little: kerchunk reads
  `f4`/`f8` in the machine's order (wrong values and attributes);
- every compressed block is taken for DEFLATE (kerchunk never reads the compression type): SZIP, NBIT,
  skipping Huffman, RLE and JPEG blocks would be handed to zlib. Here they refuse their variable;
- a chunked SDS whose chunks are not compressed was given zlib as its codec; attributes of several
  values kept the first; dimension names came from the variable's name, not the file's dimensions.
- kerchunk's `translate` stops the whole file at the first record it cannot decode (a Vgroup naming a
  tag it does not know, a VERSION string that is not UTF-8, a file without Vgroups): here a record that
  cannot be read refuses only the variable that needs it;
- an SDS never written, or a chunked SDS with chunks never written, reads as HDF4's fill value (its
  `_FillValue`, else the netCDF default HDF4 uses), not as zeros.
The SD interface's variables (VG class `Var0.0`) and the older DFSD interface's datasets (a data group,
NDG, in no Vgroup; the SD interface calls them `Data-Set-<ref>`) are arrays. GR raster images, Vdata
tables and HDF-EOS swath dimension maps are named in `refused` (one log line): the rest of the file mounts.
"""

from __future__ import annotations

import numpy as np
import orjson

# hdf/src/hntdefs.h: number types (the low byte; 0x4000 says little-endian, 0x1000 native order)
_NUMBER_TYPES = {3: "u1", 4: "S1", 5: "f4", 6: "f8", 20: "i1", 21: "u1", 22: "i2", 23: "u2", 24: "i4",
                 25: "u4", 26: "i8", 27: "u8"}
_TEXT_TYPES = (3, 4)  # uchar8 and char8: attributes of them are text
# HDF4's value for what was never written (mfhdf: the netCDF defaults, as the unsigned types' bit patterns;
# uchar8 and char8 are 0): pyhdf reads an unwritten SDS of each type as these
_DEFAULT_FILL = {3: 0, 5: 9.969209968386869e36, 6: 9.969209968386869e36, 20: -127, 21: 129, 22: -32767,
                 23: 32769, 24: -2147483647, 25: 2147483649}
_LITTLE_ENDIAN_CLASS = 4  # DFNTF_PC / DFNTI_IBO in an NT tag's class byte
_COMPRESSION = {0: "NONE", 1: "RLE", 2: "NBIT", 3: "SKPHUFF", 4: "DEFLATE", 5: "SZIP", 7: "JPEG"}  # hcomp.h
_SPECIAL = {1: "LINKED", 2: "EXT", 3: "COMP", 4: "VLINKED", 5: "CHUNKED", 6: "BUFFERED", 7: "COMPRAS"}
# Vdata classes of the SD interface's own bookkeeping (attributes, dimension values, chunk tables, SDS
# markers): anything else is a table of records the user wrote, which no array here stands for
_ODL = ("CoreMetadata.", "ArchiveMetadata.", "StructMetadata.")
_BOOKKEEPING = ("Attr0.0", "DimVal0.", "_HDF_CHK_TBL_", "SDSVar", "CoordVar", "Var0.0", "Dim0.0", "UDim0.0")


def _dtype(code: int, little: bool) -> str | None:
    base = _NUMBER_TYPES.get(code & 0xFF)
    if base is None:
        return None
    if base[1] == "1":
        return "|" + base  # (zarr-python reads "|S1", not "S1")
    return ("<" if little else ">") + base


def scan_hdf4(path: str) -> tuple[dict, list[str]]:
    """(kerchunk-style Version-0 references, refused lines) of the HDF4 file at fsspec url `path`."""
    from kerchunk.hdf4 import HDF4ToZarr
    from kerchunk.hdf4 import tags as kerchunk_tags

    class Walker(HDF4ToZarr):
        """kerchunk's tag walk; the variables are collected by `collect` below, not by kerchunk."""

        def read_ddh(self):  # (a hostile file's list of descriptor blocks may loop: said, not followed)
            seen = self.__dict__.setdefault("_seen_ddh", set())
            if self.f.tell() in seen:
                raise ValueError("its list of data descriptor blocks loops back on itself")
            seen.add(self.f.tell())
            return super().read_ddh()

        def _dec_linked_block(self, block):  # (the same for a linked element's list of blocks)
            if not hasattr(self, "_links_left"):  # (no list visits a block twice: all lists, each block once)
                self._links_left = sum(1 for tag, _ in self.tags if tag == "LINKED")
            self._links_left -= 1
            if self._links_left < 0:
                raise ValueError("a list of linked blocks loops back on itself")
            return super()._dec_linked_block(block)

        def decode(self, tag, info):
            if tag == "NT":  # version, type, width, class: the class says the byte order
                self.f.seek(info["offset"])
                _, code, _, cls = self.f.read(4)
                return {"typ": _dtype(code, cls == _LITTLE_ENDIAN_CLASS)}
            if tag == "SD":  # contiguous, uncompressed (kerchunk has no reading of it)
                return {"data": ("NONE", info["offset"], info["length"])}
            if tag == "VG":  # (kerchunk's decoder fails on a child tag it has no name for)
                nelt = self.read_int(2)
                children = [kerchunk_tags.get(self.read_int(2), "unknown") for _ in range(nelt)]
                refs = [self.read_int(2) for _ in range(nelt)]
                name = self.f.read(self.read_int(2)).split(b"\x00", 1)[0].decode("utf-8", "replace")
                cls = self.f.read(self.read_int(2)).split(b"\x00", 1)[0].decode("utf-8", "replace")
                return {"tag": children, "refs": refs, "name": name, "cls": cls}
            if tag == "VERSION":
                return {}  # (the library's version string: not needed, and not always UTF-8)
            return super().decode(tag, info)

        def _dec_extended(self):
            here = self.f.tell()
            kind = _SPECIAL.get(self.read_int(2), "unknown")
            self.f.seek(here)
            if kind in ("CHUNKED", "COMP", "LINKED"):  # (a linked block is read whole: tables are)
                return super()._dec_extended()
            return (f"{kind} storage", 0, 0)

        def _dec_comp(self):
            self.read_int(2)  # version
            self.read_int(4)  # uncompressed length
            data_ref = self.read_int(2)
            model = self.read_int(2)
            kind = _COMPRESSION.get(self.read_int(2), "an unknown") if model == 0 else "a modelled"
            block = self.tags.get(("COMPRESSED", data_ref))
            if block is None or block["extended"]:
                return ("linked compressed blocks", 0, 0)
            return (kind, block["offset"], block["length"])

        def _descend_vg(self, tag, ref):
            return {}  # (kerchunk's own arrays: none; scan_hdf4 makes them from the tags)

    walker = Walker(path)
    try:
        _read_tags(walker)
        return _collect(walker, path)
    finally:
        if getattr(walker, "f", None) is not None:
            walker.f.close()


# what a record that does not decode raises (I/O errors are not among them: they end the scan)
_UNDECODABLE = (ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError, AttributeError)


def _read_tags(walker) -> None:
    """Read the file's data descriptors and decode each record; one that cannot be decoded is marked
    `unreadable` (what needs it is refused) instead of stopping the file."""
    import fsspec

    walker.f = fsspec.open(walker.path).open()
    if walker.f.read(4) != b"\x0e\x03\x13\x01":
        raise ValueError("not an HDF4 file (no HDF4 signature)")
    walker.tags = {}
    while True:
        ddh = walker.read_ddh()
        for _ in range(ddh["ndd"]):
            ident, info = walker.read_dd()
            walker.tags[ident] = info
        if ddh["next"] == 0:
            break
        walker.f.seek(ddh["next"])
    for key in list(walker.tags):
        try:
            walker._dec(*key)
        except _UNDECODABLE as exc:
            walker.tags[key]["unreadable"] = f"{type(exc).__name__}: {exc}"


def _odl(text: str) -> dict:
    """The OBJECT = VALUE pairs of HDF-EOS's ODL metadata (CoreMetadata.0, ...), as kerchunk gives them."""
    out, obj = {}, None
    for line in text.split("\n"):
        if "OBJECT" in line and line.split():
            obj = line.split()[-1]
        if "VALUE" in line and line.split():
            out[obj] = line.split()[-1].lstrip('"').rstrip('"')
    return out


def _collect(walker, path: str) -> tuple[dict, list[str]]:
    """The arrays and attributes of the SDSs among the tags `walker` has read."""
    refs: dict = {".zgroup": orjson.dumps({"zarr_format": 2}).decode()}
    attrs: dict = {}
    refused: list[str] = []
    taken: set[str] = set()
    parents = {}  # (tag, ref) -> the class of the group holding it
    for (tag, _), info in walker.tags.items():
        if tag == "VG":
            for child in zip(info.get("tag", ()), info.get("refs", ())):
                parents[child] = info.get("cls")
    rigs = any(tag == "RIG" for tag, _ in walker.tags)  # (an 8-bit image has an RI8 and, later, a RIG)
    for (tag, ref), info in walker.tags.items():
        if tag == "VH" and _is_attribute(info) and info["name"].startswith(_ODL):
            data = walker.tags.get(("VS", ref))
            if data and "offset" in data:
                walker.f.seek(data["offset"])
                attrs.update(_odl(walker.f.read(data["length"]).split(b"\x00", 1)[0].decode("utf-8", "replace")))
    for (tag, ref), info in walker.tags.items():
        if tag in ("VG", "NDG") and "unreadable" in info:
            refused.append(f"{tag} record {ref}: cannot be read ({info['unreadable']}); what it holds is left out")
        elif tag == "NDG" and ("NDG", ref) not in parents:  # (the DFSD interface's dataset: no Vgroup)
            found = {t: r for t, r in info.get("tags", ()) if t in ("SD", "SDD")}
            if "SDD" not in found:
                continue  # (a data group of something else: not an SDS)
            sdd = walker.tags.get(("SDD", found["SDD"]), {})
            nt = sdd.get("data_tag", ("NT", None))[1]
            group = {"tag": list(found) + ["NT"], "refs": list(found.values()) + [nt]}
            name = f"Data-Set-{ref}"
            taken.add(name)
            reason = _array(walker, group, name, path, refs) if "SD" in found else \
                "never written, and a DFSD dataset's fill value is not read (not virtualised)"
            if reason:
                refused.append(f"{name}: {reason}")
            elif any(t == "SDS" for t, _ in info.get("tags", ())):
                refused.append(f"{name}: its dimension scales (the SD interface's fakeDim variables) are not "
                               "virtualised")
        elif tag == "VG" and info.get("cls") == "Var0.0":
            name = info.get("name") or f"sds{ref}"
            if "/" in name or name.startswith(".") or "\x00" in name:  # (a name is a directory of the mount)
                refused.append(f"sds{ref}: its name {name!r} cannot name a directory")
                continue
            if name in taken:
                refused.append(f"{name}: a second SDS of that name (another HDF-EOS grid's field)")
                continue
            taken.add(name)
            reason = _array(walker, info, name, path, refs)
            if reason:
                refused.append(f"{name}: {reason}")
        elif tag == "VG" and info.get("cls") == "SWATH":
            refused.append(f"{info.get('name')}: HDF-EOS swath dimension maps and geolocation links (not "
                           "virtualised; the swath's fields are arrays)")
        elif tag in ("RIG", "RI8") and (tag, ref) not in parents and not (tag == "RI8" and rigs):
            refused.append(f"{tag} {ref}: a raster image of the DFR8/DF24 interface (not virtualised)")
        elif tag == "VG" and info.get("cls", "").startswith("RIG"):
            refused.append(f"{info.get('name') or ref}: a GR raster image (not virtualised)")
        elif tag == "VH" and not str(info.get("cls", "")).startswith(_BOOKKEEPING) and not _is_attribute(info):
            refused.append(f"{info.get('name') or ref}: a Vdata table (not virtualised)")
        elif tag == "VH" and _is_attribute(info) and parents.get(("VH", ref), "CDF0.0") == "CDF0.0":
            value = _values(walker, info, ref)
            if value is not None:
                attrs.setdefault(info["name"], value)
    for key in [k for k in attrs if k.startswith(_ODL)]:
        attrs.pop(key)
    refs[".zattrs"] = orjson.dumps(attrs).decode()
    return refs, refused


def _is_attribute(info: dict) -> bool:
    return len(info.get("names", ())) == 1 and info["names"][0].upper() == "VALUES"


def _values(walker, info: dict, ref: int):
    """An attribute's value: text, one number, or a list of them; None where its type is not known."""
    data = walker.tags.get(("VS", ref))
    if data is None or not info.get("types"):
        return None
    code = info["types"][0]
    walker.f.seek(data["offset"])
    raw = walker.f.read(data["length"])
    if code & 0xFF in _TEXT_TYPES:
        return raw.split(b"\x00", 1)[0].decode("utf-8", "replace")
    dtype = _dtype(code, bool(code & 0x4000))
    if dtype is None:
        return None
    values = np.frombuffer(raw[: len(raw) // np.dtype(dtype).itemsize * np.dtype(dtype).itemsize], dtype)
    values = values.tolist()
    return values[0] if len(values) == 1 else values


def _array(walker, info: dict, name: str, path: str, refs: dict) -> str | None:
    """Write one SDS's .zarray/.zattrs and chunk references into `refs`; the reason it cannot, or None."""
    dims, dim_names, dtype, storage, attrs, code = None, [], None, None, {}, None
    for tag, ref in zip(info["tag"], info["refs"]):
        child = walker.tags.get((tag, ref), {})
        if "unreadable" in child and tag in ("NT", "SDD", "SD", "VH"):
            return f"its {tag} record cannot be read ({child['unreadable']})"
        if tag == "VG" and child.get("cls") in ("Dim0.0", "UDim0.0"):
            dim_names.append(child.get("name") or f"{name}_dim{len(dim_names)}")
        elif tag == "VH" and _is_attribute(child):
            value = _values(walker, child, ref)
            if value is not None:
                attrs[child["name"]] = value
        elif tag == "NT":
            dtype, code = child.get("typ"), _number_type(walker, child)
        elif tag == "SDD":
            dims = list(child.get("dims") or [])
        elif tag == "SD":
            storage = child.get("data")
    if dims is None:
        return "no dimension record (SDD)"
    if dtype is None:
        return "a number type HDF4 readers know and refmount does not"
    chunks, pieces, reason = _pieces(storage, dims)
    if reason:
        return reason
    kinds = {p[3] for p in pieces}
    if len(kinds) > 1:
        return f"chunks stored in several ways ({', '.join(sorted(kinds))})"
    kind = kinds.pop() if kinds else "NONE"
    if kind not in ("NONE", "DEFLATE"):
        return f"{kind} compression (no codec refmount uses maps it)"
    fill = attrs.get("_FillValue")
    grid = [-(-d // max(1, c)) for d, c in zip(dims, chunks or dims)]
    if len(pieces) < int(np.prod(grid, dtype=object)) and np.prod(dims, dtype=object) > 0:
        # (values never written: HDF4 reads its fill value there, which the zarr fill value must say)
        if not isinstance(fill, (int, float)):
            fill = _DEFAULT_FILL.get(code)
        if fill is None:
            return "values never written, of a type whose fill value refmount does not know (not virtualised)"
    zarray = {"zarr_format": 2, "shape": dims, "chunks": [max(1, c) for c in (chunks or dims)], "dtype": dtype,
              "compressor": {"id": "zlib", "level": 1} if kind == "DEFLATE" else None,
              "fill_value": _zarr_fill(fill),  # (xarray masks a zarr fill value)
              "order": "C", "filters": None, "dimension_separator": "."}
    if len(dim_names) != len(dims):
        dim_names = [f"{name}_dim{i}" for i in range(len(dims))]
    attrs["_ARRAY_DIMENSIONS"] = dim_names
    refs[f"{name}/.zarray"] = orjson.dumps(zarray).decode()
    refs[f"{name}/.zattrs"] = orjson.dumps(attrs).decode()
    for key, offset, length, _ in pieces:
        refs[f"{name}/{key}"] = [path, offset, length]
    return None


def _zarr_fill(fill):
    """A fill value as .zarray writes it (NaN is a string there: JSON has none)."""
    if isinstance(fill, float) and not np.isfinite(fill):
        return "NaN" if np.isnan(fill) else ("Infinity" if fill > 0 else "-Infinity")
    return fill if isinstance(fill, (int, float)) else None


def _number_type(walker, nt: dict) -> int | None:
    """The number type code of an NT record (0 where the record is not there)."""
    if "offset" not in nt:
        return None
    walker.f.seek(nt["offset"] + 1)
    return walker.f.read(1)[0]


def _pieces(storage, dims: list[int]):
    """(chunk shape or None, [(key, offset, length, compression)], reason) of an SD's storage."""
    if storage is None:
        return None, [], None  # never written: every value is the fill value
    if isinstance(storage, tuple) and len(storage) == 3 and isinstance(storage[0], str):
        kind, offset, length = storage  # contiguous: one chunk the array's shape
        if kind.endswith("storage") or kind.startswith("linked"):
            return None, [], f"{kind} (not virtualised)"
        return list(dims), [(".".join(["0"] * len(dims)) or "0", offset, length, kind)], None
    if isinstance(storage, list) and storage and isinstance(storage[-1], list):
        chunks = [int(d["chunk_length"]) for d in storage[-1]]
        if len(chunks) != len(dims) or not all(chunks):
            return None, [], "a chunk table that does not match the dimensions"
        pieces = []
        for row in storage[:-1]:
            kind = row[3] if len(row) == 4 else "NONE"
            if kind.endswith("storage") or kind.startswith("linked"):
                return None, [], f"{kind} in its chunks (not virtualised)"
            pieces.append((row[0], int(row[1]), int(row[2]), kind))
        return chunks, pieces, None
    if isinstance(storage, (bytes, bytearray)):
        return None, [], "linked blocks (not virtualised)"
    return None, [], "a storage layout refmount does not know"
