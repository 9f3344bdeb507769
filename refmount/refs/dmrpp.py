"""DMR++ (OPeNDAP Hyrax's XML sidecar `X.dmrpp` beside a netCDF-4/HDF5 file `X`) as a reference set.

A DMR++ is a DAP4 DMR (groups, dimensions, typed variables, attributes) whose variables carry
`dmrpp:` elements saying where their bytes are: `dmrpp:chunks` (filters in `compressionType`,
`fillValue`, `byteOrder`, `dmrpp:chunkDimensionSizes`, one `dmrpp:chunk offset= nBytes=
chunkPositionInArray= [href=]` per stored chunk), `dmrpp:compact` (the bytes, base64),
`dmrpp:vlsa` (variable-length strings, their values) and `dmrpp:FixedLengthStringArray`.
It is converted once, at load, into a kerchunk Version-0 reference dict (Zarr v2 metadata inline,
chunks as [url, offset, length]), so the rest of refmount sees an ordinary reference set. The
conversion streams (`convert_dmrpp`): each variable is converted and let go as soon as its XML ends,
and the keys go to a sink that may refuse at any key; a mount runs it in a capped scan worker
(refs/scan/worker.py), never in the daemon.

The reading follows Hyrax's own (bes modules/dmrpp_module/DMZ.cc and Chunk.cc) and VirtualiZarr's
DMR++ parser:
- `compressionType` lists the filters in HDF5's pipeline (encoding) order; Hyrax decodes in the
  reverse order, as Zarr decodes `filters`. deflate -> zlib, shuffle -> shuffle with the element
  size, fletcher32 -> fletcher32 (numcodecs checks and strips HDF5's checksum). All go into
  `filters` with a null compressor, as kerchunk writes HDF5 filters. deflate listed twice is zlib
  twice; fletcher32 before shuffle on 8-byte elements leaves the checksum past the last whole element,
  which the decoded view's shuffle leaves in place as HDF5's does (refmount.refs.hdf5).
- `fillValue` is HDF5's fill. It is Zarr's fill_value only where the variable declares `_FillValue`
  (NCZarr and xarray take fill_value for one); elsewhere the chunks never written are inline chunks
  of it (`write_missing_chunks`), so no reader masks what the file's readers do not.
- Fixed-length strings keep HDF5's padding in .zarray's `hdf5_string_pad` key (refmount.refs.hdf5);
  enumerations are their base type with CF's flag_values and flag_meanings.
- A variable without `chunkDimensionSizes` is contiguous: one chunk, the whole array.
- Anonymous dimensions (`<Dim size=N/>`) are named `phony_dim_N` as netCDF-C names them: within a
  group, an axis reuses the first phony dimension of its size that the variable does not use yet.
- The data url: `--data-url`; else `dmrpp:href` on the Dataset: a url as it is, a path from '/' on
  the DMR++'s own server (or this machine), a relative one against the DMR++ file's location; when
  the file so named does not exist, the sibling (Hyrax writes hrefs relative to its data root). NASA's
  placeholder `OPeNDAP_DMRpp_DATA_ACCESS_URL` (or no href at all): the sibling, i.e. the DMR++'s own
  url without `.dmrpp`. A chunk's own `href` overrides it.

What the format cannot give is refused per variable (one log line naming it and why); the rest
mounts. So is a variable whose name cannot be a directory entry (refs.model.name_problem), and the
second of two variables (or groups) of one path: the first is kept, never merged with it. A DMR++ that is not well-formed XML is a one-line error naming the file.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import math
import os
import re
import zlib
from xml.etree import ElementTree

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.arraymeta import ArrayMeta, ArrayMetaError
from refmount.refs.hdf5 import STRING_PAD_KEY, STRING_PADS
from refmount.refs.limits import MAX_REFUSED_LINES
from refmount.fetch.protocols import is_remote, local_path
from refmount.refs.model import name_problem
from refmount.refs.relative import base_of, is_relative, resolve

log = logging.getLogger("refmount")

DMRPP_NAMESPACE = "xml.opendap.org/dap/dmrpp/1.0.0#"  # http:// or https:// (both occur)
PLACEHOLDER = "OPeNDAP_DMRpp_DATA_ACCESS_URL"
DAP_TYPES = {
    "Byte": "u1", "UByte": "u1", "Int8": "i1", "UInt8": "u1", "Char": "S1",
    "Int16": "i2", "UInt16": "u2", "Int32": "i4", "UInt32": "u4", "Int64": "i8", "UInt64": "u8",
    "Float32": "f4", "Float64": "f8",
}
STRING_TYPES = ("String", "URL", "Url")
REFUSED_TYPES = {
    "Structure": "compound type (Structure): Zarr v2 has no form netCDF-C reads",
    "Sequence": "sequence type: not an array",
    "Opaque": "opaque type: raw bytes are not a netCDF type",
}
# attributes HDF5 and netCDF-4 keep for themselves; ncdump does not show them (kerchunk drops them too)
HIDDEN_ATTRIBUTES = {"CLASS", "NAME", "REFERENCE_LIST", "DIMENSION_LIST", "_Netcdf4Dimid", "_Netcdf4Coordinates",
                     "_nc3_strict", "_NCProperties", "_SuperblockVersion", "_IsNetcdf4"}
NOT_A_VARIABLE = "This is a netCDF dimension but not a netCDF variable"
BUILD_METADATA = "build_dmrpp_metadata"  # how the DMR++ was made, not part of the data (VirtualiZarr drops it too)
HDF5_VLEN_ELEMENT = 16  # bytes of one HDF5 variable-length element (length, heap address, index)
# Chunks never written are written out as inline chunks of the fill (`write_missing_chunks`), up to these
# totals per DMR++ (a shape of 10**12 chunks listing none must not make the daemon allocate them)
MAX_FILL_CHUNKS = 100_000
MAX_FILL_BYTES = 32 << 20
MAX_FILL_CHUNK = 16 << 20  # bytes of one chunk made to be encoded (chunk sizes come from the DMR++)


class Refused(Exception):
    """A variable the reference model cannot represent (the message says why)."""


def is_dmrpp_text(head: bytes) -> bool:
    """Whether the start of a file is XML (a DMR++ if anything here: JSON cannot start with '<')."""
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"<")


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _attr(element, name: str, default=None):
    """An XML attribute by its local name, whatever its namespace prefix (dmrpp:href, href)."""
    for key, value in element.attrib.items():
        if _local(key) == name:
            return value
    return default


def _children(element, name: str):
    return [child for child in element if _local(child.tag) == name]


def _child(element, name: str):
    for child in element:
        if _local(child.tag) == name:
            return child
    return None


def sibling_of(dmrpp_url: str) -> str | None:
    """The data file beside a DMR++: its url without `.dmrpp` (None if it has no such suffix)."""
    path, sep, query = dmrpp_url.partition("?")
    if not path.endswith(".dmrpp") or len(path) == len(".dmrpp"):
        return None
    return path[: -len(".dmrpp")] + sep + query


def _server_root(url: str) -> str:
    """scheme://host/ of a url (what an href starting with '/' is relative to)."""
    scheme, _, rest = url.rpartition("::")[2].partition("://")
    return f"{scheme}://{rest.split('/', 1)[0].split('?', 1)[0]}/"


def _exists(url: str, remote_options: dict | None) -> bool | None:
    """Whether `url` exists (None: cannot tell). A remote one costs a HEAD, with the reference file's
    own options and redirect policy. FetchError when its server cannot answer now (a 503, a connection
    refused): not taken for "not there", which would send the chunks to the file beside the DMR++ and be
    kept so in the scan store; the scan fails for now, and is asked again later."""
    if not is_remote(url):
        return os.path.exists(local_path(url))
    from refmount.refs.source import fsspec_options, unavailable

    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url, **fsspec_options(url, remote_options or {}))
        fs.info(path)  # (not fs.exists: fsspec's http says False for a 503)
    except Exception as e:  # noqa: BLE001 - of every backend: then the href stands, and a read that fails names it
        passing = unavailable(quote(url), e)
        if passing is not None:
            raise passing from None
        return False if isinstance(e, FileNotFoundError) else None
    return True


def data_url_of(root, dmrpp_url: str, data_url: str | None, remote_options: dict | None = None, *,
                exists=None) -> tuple[str, str]:
    """(url of the data file, how it was chosen) by the rules in the module docstring. `exists` (url ->
    True, False or None: cannot tell) answers whether a file is there; by default `_exists`."""
    if exists is None:
        def exists(url):
            return _exists(url, remote_options)
    if data_url:
        return data_url, "--data-url"
    href = (_attr(root, "href") or "").strip()
    sibling = sibling_of(dmrpp_url)
    if not href or href == PLACEHOLDER:
        if sibling is None:
            named = "no dmrpp:href" if not href else PLACEHOLDER
            raise RefsError(f"DMR++ file {quote(dmrpp_url)} names no data file ({named}) and its name does not end "
                            "in .dmrpp: give the data file with --data-url")
        return sibling, "the DMR++'s own name without .dmrpp" + (f" ({PLACEHOLDER})" if href else " (no dmrpp:href)")
    if "://" in href and not href.startswith("file://"):
        return href, "dmrpp:href"
    href = href.removeprefix("file://")
    if href.startswith("/"):
        # an absolute path: on the DMR++'s own server when it is remote (RFC 3986), else a local path
        candidate = resolve(href.lstrip("/"), _server_root(dmrpp_url)) if is_remote(dmrpp_url) else href
        how = "dmrpp:href"
    else:
        candidate, how = resolve(href, base_of(dmrpp_url)), "dmrpp:href relative to the DMR++"
    if sibling is not None and candidate != sibling and exists(candidate) is False:
        # Hyrax writes hrefs relative to its own data root (data/dmrpp/X.h5): then the file beside the DMR++
        if is_remote(sibling) or exists(sibling):
            return sibling, f"the DMR++'s own name without .dmrpp (its dmrpp:href {href!r} does not exist)"
    return candidate, how


def dmrpp_to_refs(text: bytes, dmrpp_url: str, data_url: str | None = None, *,
                  remote_options: dict | None = None) -> tuple[dict, list[str]]:
    """A kerchunk Version-0 reference dict of the DMR++ `text` read from `dmrpp_url`, and one message
    per variable refused. `data_url` points the chunks at another copy of the data file;
    `remote_options` are used to ask whether a relative href's file exists. (In memory, for tests and
    tools: a mount converts in a scan worker, refs/scan/worker.py, through `convert_dmrpp`.)"""
    refs: dict = {}
    refused = convert_dmrpp(io.BytesIO(text), dmrpp_url, data_url, emit=refs.update,
                            exists=lambda url: _exists(url, remote_options))
    return refs, refused


FEED_BYTES = 256 << 10  # what the streaming parser is fed at a time


def convert_dmrpp(stream, dmrpp_url: str, data_url: str | None = None, *, emit, exists=None,
                  on_data_url=None) -> list[str]:
    """Convert the DMR++ read from binary `stream` as it is parsed: each variable (and each group's own
    metadata) is handed to `emit` (a dict of its keys) once read, and its XML is dropped, so the memory
    held is one variable's, not the document's; `emit` may refuse (raise) at any key. Returns one
    message per variable refused. `exists`: as for `data_url_of`; `on_data_url(url, how)`: told the
    data file chosen."""
    parser = ElementTree.XMLPullParser(events=("start", "end"))
    converter: _Converter | None = None
    head = b""
    while True:
        data = stream.read(FEED_BYTES)
        if len(head) < 1 << 20:
            head += data[: (1 << 20) - len(head)]
        try:
            if data:
                parser.feed(data)
            else:
                parser.close()
            for event, element in parser.read_events():
                if converter is None:  # the root's start: its attributes name the data file
                    converter = _start(element, head, dmrpp_url, data_url, exists, on_data_url, emit)
                converter.event(event, element)
        except ElementTree.ParseError as e:
            raise RefsError(f"DMR++ file {quote(dmrpp_url)} is not well-formed XML: {e}") from None
        if not data:
            break
    if converter is None:
        raise RefsError(f"DMR++ file {quote(dmrpp_url)} is not well-formed XML: no element found")
    return converter.finish()


def _start(root, head: bytes, dmrpp_url: str, data_url, exists, on_data_url, emit) -> "_Converter":
    if _local(root.tag) != "Dataset" or DMRPP_NAMESPACE.encode() not in head:
        raise RefsError(f"{quote(dmrpp_url)} is XML but not a DMR++ (a DAP4 Dataset with the dmrpp namespace)")
    url, how = data_url_of(root, dmrpp_url, data_url, exists=exists)
    if not is_remote(url):  # a path relative to the working directory: it must not depend on the daemon's
        url = os.path.abspath(local_path(url))
    log.info("DMR++ %s: data file %s (%s)", dmrpp_url, url, how)
    if on_data_url is not None:
        on_data_url(url, how)
    return _Converter(dmrpp_url, url, emit)


class _Group:
    """A group open in the stream: its path, and the dimensions, enumerations and anonymous dimensions
    declared so far (in it and around it)."""

    def __init__(self, element, path: str, dims: dict, enums: dict) -> None:
        self.element, self.path, self.dims, self.enums = element, path, dims, enums
        self.phony: list[tuple[str, int]] = []  # this group's anonymous dimensions, in order


class _Converter:
    def __init__(self, dmrpp_url: str, data_url: str, emit) -> None:
        self.dmrpp_url = dmrpp_url
        self.data_url = data_url
        self.base = base_of(dmrpp_url)
        self.emit = emit
        self.refs: dict = {}  # the keys of the variable (or group) being converted
        self.refused: list[str] = []
        self.phony_count = 0
        self.enum_names: dict[str, list] = {}  # enumeration -> its (name, value) pairs
        self.fill_chunks = MAX_FILL_CHUNKS  # what is left of the budget for missing chunks written out
        self.fill_bytes = MAX_FILL_BYTES
        self.names: set[str] = set()  # the variables and groups converted: a second of one name is refused
        self.open: list = []  # the elements open in the stream, outermost first
        self.groups: list[_Group] = []  # the groups open (the Dataset first)
        self.skipping = None  # a refused group: nothing in it is read
        self.refs_made = False  # whether the last conversion made any key
        self.refused_count = 0

    # -- the stream ---------------------------------------------------------------------------------
    # Declarations (Dimension, Enumeration) count from where they appear, as DAP4 writes them: before use.

    def event(self, event: str, element) -> None:
        if event == "start":
            parent = self.open[-1] if self.open else None
            self.open.append(element)
            if self.skipping is not None:
                return
            if parent is None:
                self.groups.append(_Group(element, "", {}, {}))
            elif parent is self.groups[-1].element and _local(element.tag) == "Group":
                group = self.groups[-1]
                full = f"{group.path}/{_attr(element, 'name') or ''}"
                try:
                    self._check_name(full, _attr(element, "name") or "")
                except Refused as e:
                    self._refuse("group", full, e)
                    self.skipping = element
                    return
                self.names.add(full)
                self.groups.append(_Group(element, full, dict(group.dims), dict(group.enums)))
            return
        self.open.pop()
        parent = self.open[-1] if self.open else None
        if self.skipping is not None:
            if element is self.skipping:
                self.skipping = None
            _drop(parent, element)
            return
        group = self.groups[-1] if self.groups else None
        if group is not None and element is group.element:
            self._flush(self._group_metadata, group)
            self.groups.pop()
            _drop(parent, element)
        elif group is not None and parent is group.element:
            kind = _local(element.tag)
            if kind == "Attribute":
                return  # kept: the group's attributes, read when it ends
            if kind == "Dimension":
                self._dimension(element, group)
            elif kind == "Enumeration":
                group.enums[f"{group.path}/{_attr(element, 'name')}"] = _attr(element, "basetype")
                self.enum_names[f"{group.path}/{_attr(element, 'name')}"] = [
                    (_attr(const, "name") or "", _attr(const, "value")) for const in _children(element, "EnumConst")]
            elif kind == "Enum" or kind in DAP_TYPES or kind in STRING_TYPES or kind in REFUSED_TYPES:
                self._top_variable(element, kind, group)
            _drop(parent, element)

    def _dimension(self, dim, group: _Group) -> None:
        name = _attr(dim, "name")
        try:
            group.dims[f"{group.path}/{name}"] = int(_attr(dim, "size"))
        except (TypeError, ValueError):
            raise RefsError(f"DMR++ file {quote(self.dmrpp_url)}: dimension {group.path}/{name} has no valid "
                            "size") from None

    def _check_name(self, full: str, name: str) -> None:
        """Refused unless `name` can be an entry of the tree (refs.model.name_problem, the one check) and
        no variable or group of this path was converted before (the first one of a name is kept: two
        would be merged into one array)."""
        problem = name_problem(name)
        if problem is not None:
            raise Refused(f"its name {quote(name, 60)} {problem}")
        if full in self.names:
            raise Refused("a variable or group of this name came before it (the first is kept)")

    def _top_variable(self, element, kind: str, group: _Group) -> None:
        name = _attr(element, "name") or ""
        full = f"{group.path}/{name}"
        try:
            self._check_name(full, name)
            self._flush(self.variable, element, kind, full, group.dims, group.phony, group.enums)
            if self.refs_made:
                self.names.add(full)
        except Refused as e:
            self._refuse("variable", full, e)

    def _refuse(self, what: str, full: str, reason: Refused) -> None:
        self.refused_count += 1
        if self.refused_count > MAX_REFUSED_LINES:
            return  # (said once, at the end: a hostile file must not flood the log)
        shown = full if len(full) <= 200 else full[:196] + "..."
        message = f"DMR++ {self.dmrpp_url}: {what} {shown} left out: {reason}"
        log.warning("%s", message)
        self.refused.append(message)

    def finish(self) -> list[str]:
        """One message per variable refused (the first MAX_REFUSED_LINES, then how many more)."""
        more = self.refused_count - len(self.refused)
        if more > 0:
            message = f"DMR++ {self.dmrpp_url}: {more:,} more variables or groups left out"
            log.warning("%s", message)
            self.refused.append(message)
        return self.refused

    def _flush(self, convert, *args) -> None:
        """Convert one variable (or a group's metadata) into `self.refs`, then hand its keys on: a variable
        refused half way leaves no key behind."""
        self.refs = {}
        convert(*args)
        self.refs_made = bool(self.refs)
        if self.refs:
            self.emit(self.refs)
        self.refs = {}

    def _group_metadata(self, group: _Group) -> None:
        prefix = f"{group.path.lstrip('/')}/" if group.path else ""
        self.refs[f"{prefix}.zgroup"] = json.dumps({"zarr_format": 2})
        attrs = self.attributes(group.element, top=not group.path)
        if attrs:
            self.refs[f"{prefix}.zattrs"] = _dumps(attrs)

    # -- attributes ---------------------------------------------------------------------------------

    def attributes(self, element, top: bool = False) -> dict:
        attrs: dict = {}
        for attr in _children(element, "Attribute"):
            name = _attr(attr, "name")
            if name is None or name == BUILD_METADATA:
                continue
            if top and name == "HDF5_GLOBAL" and _attr(attr, "type") == "Container":
                attrs.update(self.attributes(attr))  # the file's own attributes (VirtualiZarr unwraps it too)
                continue
            self._attribute(attr, name, attrs)
        return {k: v for k, v in attrs.items() if k not in HIDDEN_ATTRIBUTES}

    def _attribute(self, attr, name: str, out: dict) -> None:
        kind = _attr(attr, "type")
        if kind == "Container":  # nested: flattened as "container.name", as netCDF keeps HDF4/HDF-EOS names
            for inner in _children(attr, "Attribute"):
                inner_name = _attr(inner, "name")
                if inner_name is not None:
                    self._attribute(inner, f"{name}.{inner_name}", out)
            return
        texts = [value.text or "" for value in _children(attr, "Value")]
        if kind in DAP_TYPES and kind != "Char":
            dtype = np.dtype(DAP_TYPES[kind])
            try:
                values = [_number(t, dtype) for t in texts]
            except ValueError:
                log.info("DMR++ %s: attribute %s left out: values %r are not %s", self.dmrpp_url, name, texts[:3],
                         kind)
                return
        else:  # String, URL, Char, OtherXML: text
            values = texts
            if kind == "OtherXML":
                values = ["".join(ElementTree.tostring(c, encoding="unicode") for c in attr)]
        if not values:
            return
        out[name] = values[0] if len(values) == 1 else values

    # -- variables ----------------------------------------------------------------------------------

    def variable(self, element, kind: str, full: str, dims: dict, phony: list, enums: dict) -> None:
        if (_raw_attr(element, "NAME") or "").startswith(NOT_A_VARIABLE):
            return  # a netCDF-4 dimension without a coordinate variable: ncdump shows none
        if kind in REFUSED_TYPES:
            raise Refused(REFUSED_TYPES[kind])
        enum = None
        if kind == "Enum":
            kind, enum = self.enum_base(element, full, enums)
        attrs = self.attributes(element)
        if enum is not None:
            self.enum_attributes(enum, DAP_TYPES[kind], attrs)
        names, shape = self.dimensions(element, full, dims, phony)
        chunks_el = _child(element, "chunks")
        if chunks_el is None and _child(element, "chunk") is not None:
            chunks_el = element  # older DMR++ (NASA's MERRA-2 ones): a dmrpp:chunk right in the variable
        compact = _child(element, "compact")
        vlsa = _child(element, "vlsa")
        for unsupported in ("missingdata", "specialstructuredata"):
            if _child(element, unsupported) is not None:
                raise Refused(f"dmrpp:{unsupported} (Hyrax's own encoding of HDF4 data) is not read")
        order = "<"
        if chunks_el is not None:  # ("byteOrde": a misspelling some of OPeNDAP's own files have)
            byte_order = _attr(chunks_el, "byteOrder") or _attr(chunks_el, "byteOrde") or "LE"
            order = ">" if byte_order.upper() in ("BE", "BIG_ENDIAN") else "<"
        pad = None
        if kind in STRING_TYPES:
            dtype, filters, fill, pad = self.string_type(element, chunks_el, compact, vlsa, shape)
        else:
            dtype = np.dtype(DAP_TYPES[kind])
            if dtype.itemsize > 1:
                dtype = dtype.newbyteorder(order)
            filters = self.filters(chunks_el, dtype)
            fill = _fill_value(chunks_el, dtype)
        chunk_shape = shape
        if chunks_el is not None:
            sizes = _child(chunks_el, "chunkDimensionSizes")
            if sizes is not None and (sizes.text or "").split():
                try:
                    chunk_shape = [int(n) for n in sizes.text.split()]
                except ValueError:
                    raise Refused(f"chunkDimensionSizes {sizes.text!r} are not integers") from None
                if len(chunk_shape) != len(shape) or any(n <= 0 for n in chunk_shape):
                    raise Refused(f"chunkDimensionSizes {sizes.text.strip()!r} do not match its shape {shape}")
        prefix = full.lstrip("/")
        # HDF5's fill value is what never-written chunks hold; it is netCDF's _FillValue only when the
        # variable declares one. Zarr's fill_value is both (NCZarr and xarray take it for _FillValue): so it
        # is served only when declared, and otherwise the missing chunks are written out as chunks of it
        declared = "_FillValue" in attrs and dtype.kind in "iuf"
        value = attrs.get("_FillValue")
        if declared and (chunks_el is None or _attr(chunks_el, "fillValue") is None) \
                and isinstance(value, (int, float)) and not isinstance(value, bool):
            # (no fillValue: HDF5's fill of a netCDF-4 variable is its _FillValue)
            fill = value if math.isfinite(value) else "NaN" if math.isnan(value) else \
                "Infinity" if value > 0 else "-Infinity"
        zarray = {"zarr_format": 2, "shape": shape, "chunks": [max(n, 1) for n in chunk_shape] if shape else [],
                  "dtype": dtype.str if dtype.kind != "O" else "|O", "fill_value": fill if declared else None,
                  "order": "C", "filters": filters or None, "compressor": None}
        if pad is not None:
            zarray[STRING_PAD_KEY] = pad
        chunk_refs = self.chunk_refs(element, chunks_el, compact, vlsa, shape, zarray["chunks"], dtype)
        if not declared and fill is not None and not self.write_missing_chunks(full, zarray, dtype, fill, chunk_refs):
            zarray["fill_value"] = fill if dtype.kind in "iuf" else None
        attrs["_ARRAY_DIMENSIONS"] = names
        self.refs[f"{prefix}/.zarray"] = _dumps(zarray)
        self.refs[f"{prefix}/.zattrs"] = _dumps(attrs)
        for key, ref in chunk_refs.items():
            self.refs[f"{prefix}/{key}"] = ref

    def enum_base(self, element, full: str, enums: dict) -> tuple[str, str]:
        """(base integer type, the enumeration's name): an enumeration's values are stored as that type;
        its names are no Zarr type, nor one NCZarr can carry (netCDF-C 4.9 and 4.10 refuse user-defined
        types there: measured), so they become CF's flag_values and flag_meanings (`enum_attributes`)."""
        name = _attr(element, "enum") or ""
        fqn = self._find_declared(name, full.rpartition("/")[0], enums)
        base = enums.get(fqn) if fqn else None
        if base not in DAP_TYPES or base in ("Float32", "Float64", "Char"):
            raise Refused(f"enumeration {name!r} is not declared with an integer base type")
        log.info("DMR++ %s: variable %s: enumeration %s served as its base type %s, its names as flag_values and "
                 "flag_meanings", self.dmrpp_url, full, fqn, base)
        return base, fqn

    def enum_attributes(self, fqn: str, base: str, attrs: dict) -> None:
        """An enumeration's names as CF's flag_values (numbers of the variable's type) and flag_meanings
        (the names, blank-separated; a blank inside a name becomes '_'), unless the variable has its own."""
        if "flag_values" in attrs or "flag_meanings" in attrs:
            return
        dtype = np.dtype(base)
        pairs = []
        for name, value in self.enum_names.get(fqn, []):
            try:
                pairs.append((_number(value or "", dtype), "_".join(name.split()) or "_"))
            except (ValueError, OverflowError):
                log.info("DMR++ %s: enumeration %s: value %r of %r is not %s: its names are left out", self.dmrpp_url,
                         fqn, value, name, base)
                return
        if pairs:
            attrs["flag_values"] = [v for v, _ in pairs]
            attrs["flag_meanings"] = " ".join(n for _, n in pairs)

    def dimensions(self, element, full: str, dims: dict, phony: list) -> tuple[list[str], list[int]]:
        names, shape, used = [], [], set()
        group = full.rpartition("/")[0]
        for dim in _children(element, "Dim"):
            name, size = _attr(dim, "name"), _attr(dim, "size")
            if name is not None:
                fqn = self._find_declared(name, group, dims)
                if fqn is None:
                    raise Refused(f"dimension {name!r} is not declared")
                names.append(fqn.rpartition("/")[2])
                shape.append(dims[fqn])
                continue
            try:
                size = int(size)
            except (TypeError, ValueError):
                raise Refused("a Dim has neither a name nor a size") from None
            # netCDF-C's phony dimensions: the group's first of this size not used by this variable yet
            found = next((n for n, s in phony if s == size and n not in used), None)
            if found is None:
                found = f"phony_dim_{self.phony_count}"
                self.phony_count += 1
                phony.append((found, size))
            used.add(found)
            names.append(found)
            shape.append(size)
        return names, shape

    @staticmethod
    def _find_declared(name: str, group: str, dims: dict) -> str | None:
        """The fully qualified name of a dimension (or enumeration) `name` seen from `group`."""
        if name.startswith("/"):
            return name if name in dims else None
        while True:  # a relative name: this group, then the ones around it
            candidate = f"{group}/{name}"
            if candidate in dims:
                return candidate
            if not group:
                return None
            group = group.rpartition("/")[0]

    def string_type(self, element, chunks_el, compact, vlsa, shape):
        """(dtype, filters, fill, padding) of a String variable, or Refused. Fixed-length strings get
        their fill (bytes) and HDF5's padding (refmount.refs.hdf5: the decoded view cuts each value at
        its terminator); where the DMR++ does not say (scalars), a value ends at its first NUL."""
        fixed = _child(element, "FixedLengthStringArray")
        if vlsa is not None:
            return np.dtype("O"), [{"id": "vlen-utf8"}], None, None
        if fixed is not None:
            try:
                length = int(_attr(fixed, "string_length"))
            except (TypeError, ValueError):
                raise Refused("FixedLengthStringArray has no valid string_length") from None
            pad = _attr(fixed, "pad")
            if pad not in STRING_PADS:
                pad = "null_pad"
            dtype = np.dtype(f"S{max(length, 1)}")
            return dtype, self.filters(chunks_el, np.dtype("u1")), _string_fill(chunks_el, dtype), pad
        count = math.prod(shape)
        if compact is not None:
            data = _compact_bytes(compact)
            if count and len(data) % count == 0 and len(data):
                dtype = np.dtype(f"S{len(data) // count}")
                return dtype, None, _string_fill(chunks_el, dtype), "null_pad"
            raise Refused(f"compact strings of {len(data)} bytes for {count} elements")
        chunk_list = _children(chunks_el, "chunk") if chunks_el is not None else []
        if (chunks_el is not None and _child(chunks_el, "chunkDimensionSizes") is None and len(chunk_list) == 1
                and not _attr(chunks_el, "compressionType") and count):
            nbytes = int(_attr(chunk_list[0], "nBytes") or 0)
            if nbytes % count == 0 and nbytes // count not in (0, HDF5_VLEN_ELEMENT):
                # contiguous, uncompressed, not 16 bytes an element: fixed-length strings (netCDF char)
                dtype = np.dtype(f"S{nbytes // count}")
                return dtype, None, _string_fill(chunks_el, dtype), "null_pad"
        raise Refused("variable-length strings whose values the DMR++ does not hold (its chunks hold HDF5 heap "
                      "references, not text; Hyrax's build_dmrpp -M writes them as dmrpp:vlsa)")

    def filters(self, chunks_el, dtype: np.dtype) -> list[dict]:
        if chunks_el is None:
            return []
        # deflate listed twice is zlib twice (a chunk HDF5 deflated once: refmount.view.decoded._deflated_once);
        # fletcher32 before shuffle on 8-byte elements leaves the checksum's 4 bytes past the last
        # whole element, which HDF5's shuffle (and the decoded view's, refmount.refs.hdf5) leaves in place
        kinds = (_attr(chunks_el, "compressionType") or "").split()
        level = _attr(chunks_el, "deflateLevel") or _attr(chunks_el, "deflate_level")
        out = []
        for kind in kinds:
            if kind == "deflate":
                out.append({"id": "zlib", "level": int(level) if level and level.isdigit() else 6})
            elif kind == "shuffle":
                out.append({"id": "shuffle", "elementsize": dtype.itemsize})
            elif kind == "fletcher32":
                out.append({"id": "fletcher32"})
            else:
                raise Refused(f"compression {kind!r} (of compressionType {' '.join(kinds)!r}) is not known")
        return out

    # -- chunks -------------------------------------------------------------------------------------

    def chunk_url(self, href: str) -> str:
        """A chunk's own href: relative to the DMR++, a path from '/' on its server if it is remote."""
        href = href.strip()
        if href.startswith("/") and is_remote(self.dmrpp_url):
            return resolve(href.lstrip("/"), _server_root(self.dmrpp_url))
        return resolve(href, self.base) if is_relative(href) else href

    def write_missing_chunks(self, full: str, zarray: dict, dtype: np.dtype, fill, chunk_refs: dict) -> bool:
        """The chunks of the grid the DMR++ does not list (never written) as inline chunks of HDF5's
        `fill`, encoded once with the variable's filters, so that every reader reads the fill without a
        fill_value (a _FillValue) being declared. False when they would pass the DMR++'s budget
        (MAX_FILL_CHUNKS, MAX_FILL_BYTES): the caller then serves the fill as fill_value."""
        meta = ArrayMeta.from_zarray(zarray)
        try:
            missing = meta.nchunks() - len(chunk_refs)
        except ArrayMetaError as e:
            raise Refused(str(e)) from None
        chunks = meta.chunks
        if missing <= 0 or (dtype.kind == "S" and not fill.strip(b"\0")):
            return True  # (a NUL string: what every reader fills characters with anyway)
        data = b""
        if missing <= self.fill_chunks and math.prod(chunks) * dtype.itemsize <= MAX_FILL_CHUNK:
            try:
                data = _fill_chunk(fill, dtype, chunks, zarray["filters"] or [])
            except Exception as e:  # (a fill no filter chain here encodes: served as fill_value instead)
                log.warning("DMR++ %s: variable %s: its fill cannot be encoded (%s)", self.dmrpp_url, full, e)
                return False
        if not data or missing > self.fill_chunks or missing * len(data) > self.fill_bytes:
            log.warning("DMR++ %s: variable %s: its %d missing chunks are too many or too large to write out: "
                        "they read as %s", self.dmrpp_url, full, missing,
                        f"fill_value {fill!r}, which netCDF readers and xarray take for its _FillValue"
                        if dtype.kind in "iuf" else "empty strings")
            return False
        self.fill_chunks -= missing
        self.fill_bytes -= missing * len(data)
        value = _inline(data)
        prefix = full.lstrip("/")
        for key in meta.chunk_keys():
            if key not in chunk_refs:
                self.refs[f"{prefix}/{key}"] = value
        return True

    def chunk_refs(self, element, chunks_el, compact, vlsa, shape, chunks, dtype) -> dict:
        scalar_key = "0"
        whole_key = ".".join("0" for _ in shape) or scalar_key
        if vlsa is not None:
            values = _vlsa_values(vlsa)
            if len(values) != math.prod(shape):
                raise Refused(f"dmrpp:vlsa holds {len(values)} strings for {math.prod(shape)} elements")
            from numcodecs import VLenUTF8

            data = VLenUTF8().encode(np.array(values, dtype=object))
            return {whole_key: _inline(data)}
        if compact is not None:
            data = _compact_bytes(compact)
            expected = math.prod(shape) * dtype.itemsize
            if len(data) != expected:
                raise Refused(f"dmrpp:compact holds {len(data)} bytes, not the {expected} of its shape and type")
            return {whole_key: _inline(data)}
        if chunks_el is None:
            raise Refused("no dmrpp:chunks, dmrpp:compact or dmrpp:vlsa: the DMR++ does not say where its data is")
        out = {}
        grid = [-(-n // c) if c else 0 for n, c in zip(shape, chunks)]
        chunk_els = _children(chunks_el, "chunk")
        if not chunk_els and _children(chunks_el, "block"):
            if list(chunks) != [max(n, 1) for n in shape]:
                raise Refused("dmrpp:block outside a dmrpp:chunk of a chunked variable")
            chunk_els = [chunks_el]  # (HDF4's linked blocks of an unchunked SDS or Vdata: the whole array's blocks)
        for chunk in chunk_els:
            try:
                blocks = [(int(_attr(b, "offset")), int(_attr(b, "nBytes"))) for b in _children(chunk, "block")]
                offset, length = blocks[0] if blocks else (int(_attr(chunk, "offset")), int(_attr(chunk, "nBytes")))
            except (TypeError, ValueError):
                raise Refused("a dmrpp:chunk or dmrpp:block has no valid offset and nBytes") from None
            for start, size in blocks[1:]:  # HDF4's linked blocks: one range only where each follows the last
                if start != offset + length:
                    raise Refused("a chunk made of blocks that do not follow each other (dmrpp:block, HDF4's "
                                  "linked blocks) is not one range")
                length += size
            if _attr(chunk, "fm") not in (None, "0"):
                raise Refused("a chunk skips some of its filters (filter mask fm): Zarr applies the same ones to "
                              "every chunk")
            position = _attr(chunk, "chunkPositionInArray")
            if position is None:
                key = whole_key
                if len(_children(chunks_el, "chunk")) > 1:
                    raise Refused("several chunks without a chunkPositionInArray")
            else:
                try:
                    numbers = [int(n) for n in position.strip().strip("[]").split(",") if n.strip()]
                except ValueError:
                    raise Refused(f"chunkPositionInArray {position!r} is not a list of integers") from None
                if not shape:
                    numbers = numbers[:0]
                corners = all(p % c == 0 and 0 <= p // c < g for p, c, g in zip(numbers, chunks, grid))
                if len(numbers) != len(shape) or not corners:
                    raise Refused(f"chunkPositionInArray {position!r} is not the corner of a chunk of shape {chunks} "
                                  f"within {shape}")
                key = ".".join(str(p // c) for p, c in zip(numbers, chunks)) or scalar_key
            if key in out:
                raise Refused(f"two chunks at the same position (key {key})")
            href = _attr(chunk, "href")
            url = self.data_url if not href else self.chunk_url(href)
            out[key] = [url, offset, length]
        return out


def _drop(parent, element) -> None:
    """Let go of a converted element (at its end it is its parent's last child so far)."""
    if parent is not None:
        if len(parent) and parent[-1] is element:
            del parent[-1]
        else:
            parent.remove(element)


def _raw_attr(element, name: str):
    for attr in _children(element, "Attribute"):
        if _attr(attr, "name") == name:
            value = _child(attr, "Value")
            return value.text if value is not None else None
    return None


def _number(text: str, dtype: np.dtype):
    text = text.strip()
    if dtype.kind == "f":
        value = float({"*": "nan"}.get(text, text))
        return value if not math.isfinite(value) else float(np.array(value, dtype=dtype))
    if re.fullmatch(r"[+-]?0[xX][0-9a-fA-F]+", text):
        value = int(text, 16)
    elif re.fullmatch(r"[+-]?\d+", text):
        value = int(text)
    else:  # "1.0", "1e3": an integer written as a float
        number = float(text)
        if not number.is_integer():
            raise ValueError(text)
        value = int(number)
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(text)
    return value


def _fill_value(chunks_el, dtype: np.dtype):
    """The .zarray fill_value of a numeric variable: the DMR++'s fillValue, else HDF5's default 0."""
    text = _attr(chunks_el, "fillValue") if chunks_el is not None else None
    if dtype.kind == "S":
        return None
    if text is None or not text.strip():
        return 0.0 if dtype.kind == "f" else 0
    try:
        value = _number(text, dtype)
    except (ValueError, OverflowError):
        raise Refused(f"fillValue {text!r} is not a value of its type {dtype.str}") from None
    if isinstance(value, float) and not math.isfinite(value):  # Zarr v2 spells these as strings
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def _string_fill(chunks_el, dtype: np.dtype) -> bytes:
    """The fill of fixed-length strings: fillValue's text (Hyrax's older "unsupported-string" is none)."""
    text = _attr(chunks_el, "fillValue") if chunks_el is not None else None
    if not text or text == "unsupported-string":
        return b""
    data = text.encode("utf-8")
    if len(data) > dtype.itemsize:
        raise Refused(f"fillValue {text!r} is longer than its {dtype.itemsize}-byte strings")
    return data


def _fill_chunk(fill, dtype: np.dtype, chunks: list, filters: list) -> bytes:
    """One chunk of `fill` encoded with `filters` (HDF5's pipeline order), as HDF5 would store it."""
    from numcodecs.compat import ensure_bytes

    from refmount.refs.codecs import make_codec

    if isinstance(fill, str):  # "NaN", "Infinity", "-Infinity"
        fill = float(fill)
    data = np.full(chunks or [], fill, dtype).tobytes()
    for config in filters:
        data = ensure_bytes(make_codec(config).encode(data))
    return data


def _compact_bytes(compact) -> bytes:
    try:
        return base64.b64decode("".join((compact.text or "").split()), validate=True)
    except ValueError:
        raise Refused("dmrpp:compact is not base64") from None


def _vlsa_values(vlsa) -> list[str]:
    values = []
    if not _children(vlsa, "v") and (vlsa.text or "").strip():
        # an older form: each value base64, each followed by ';'
        text = "".join(vlsa.text.split())
        try:
            return [base64.b64decode(v, validate=True).decode("utf-8") for v in text.removesuffix(";").split(";")]
        except ValueError:
            raise Refused("dmrpp:vlsa text is not base64 values separated by ';'") from None
    for v in _children(vlsa, "v"):
        text = v.text or ""
        size = _attr(v, "s")
        if size is not None:  # Hyrax's long strings: zlib-compressed, then base64
            try:
                text = zlib.decompress(base64.b64decode(text)).decode("utf-8")
            except (ValueError, zlib.error):
                raise Refused("a dmrpp:vlsa value is not base64 of zlib-compressed text") from None
        count = _attr(v, "c")
        values.extend([text] * (int(count) if count and count.isdigit() else 1))
    return values


def _inline(data: bytes) -> str:
    """A kerchunk inline value (bytes as base64, so no text is taken for anything else)."""
    return "base64:" + base64.b64encode(bytes(data)).decode()


def _dumps(value) -> str:
    """JSON as zarr-python writes Zarr v2 metadata (NaN and Infinity as bare words in attributes)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
