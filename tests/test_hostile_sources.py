"""Hostile inputs on the newer source paths (remote Zarr stores, zipped stores, GRIB2 .idx): a server
that controls the metadata makes the daemon allocate no more than its limits, and each hostile array or
file is one line (an array hidden, a mount refused, an index refused), never a traceback or wrong bytes.
Real mounts of stores served by a loopback Range server; ncdump and the daemon's peak memory as oracles."""

from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path

import pytest

from tests.conftest import run_refmount
from tests.support.clients import ncdump, nczarr_url


def _zarray(shape, chunks, dtype="<f8", fill=None, compressor=None) -> dict:
    return {"zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype, "compressor": compressor,
            "filters": None, "order": "C", "fill_value": fill}


def _v2_store(root: Path, arrays: dict[str, dict], chunks: dict[str, bytes] | None = None) -> None:
    """A consolidated Zarr v2 store: `arrays` (name -> .zarray), each with dimension d_<name>, and
    `chunks` (key -> bytes)."""
    metadata = {".zgroup": {"zarr_format": 2}}
    for name, zarray in arrays.items():
        metadata[f"{name}/.zarray"] = zarray
        metadata[f"{name}/.zattrs"] = {"_ARRAY_DIMENSIONS": [f"d_{name}{n}" for n in range(len(zarray["shape"]))]}
    root.mkdir(parents=True)
    (root / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    (root / ".zmetadata").write_text(json.dumps({"zarr_consolidated_format": 1, "metadata": metadata}))
    for key, data in (chunks or {}).items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(data)


def _peak_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_chunk_far_past_its_shape_is_hidden_not_decoded_whole(mount, server):
    """chunks [2**28] of an array of shape [1], one 2 MB zlib stream: decoded whole before its crop, it
    took the daemon to 3.8 GB (its memory target 1 GiB). Hidden in one line; the other array reads; the
    daemon stays small. chunks [2**62] (its fill made by np.full for an absent chunk: a traceback) too."""
    n = 2**28
    compress = zlib.compressobj(9)
    zeros = bytes(1 << 24)
    bomb = b"".join(compress.compress(zeros) for _ in range(n * 8 // len(zeros))) + compress.flush()
    _v2_store(server.root / "bomb.zarr",
              {"bomb": _zarray([1], [n], compressor={"id": "zlib", "level": 9}), "huge": _zarray([1], [2**62]),
               "fine": _zarray([2], [2], "<i4", fill=-1)},
              {"bomb/0": bomb, "fine/0": (b"\x01\x00\x00\x00\x02\x00\x00\x00")})
    m = mount(server.url_for("bomb.zarr"))
    assert sorted(p.name for p in m.path.iterdir() if not p.name.startswith(".")) == ["fine"]
    assert (m / "fine/0").read_bytes() == b"\x01\x00\x00\x00\x02\x00\x00\x00"
    log = m.log()
    assert "hiding array bomb: its stored chunks decode to 2,147,483,648 bytes each" in log, log
    assert "hiding array huge: its stored chunks decode to" in log and "Traceback" not in log, log
    assert _peak_kb(m.proc.pid) < 600 << 10, log
    raw = mount(server.url_for("bomb.zarr"), "--view", "raw")  # (the raw view serves the stored bytes)
    assert (raw / "bomb/0").read_bytes() == bomb


def test_a_fill_value_not_of_its_dtype_hides_its_array_and_ncdump_reads_the_rest(mount, server):
    """A fill_value of 1e30 for int8 or a 1000-character string for float64 was served as such, and
    netCDF-C then refused the whole dataset ("Numeric conversion not representable"); each absent chunk
    was an EIO whose log line held the whole fill. Now each such array is hidden in one short line."""
    _v2_store(server.root / "fills.zarr",
              {"big": _zarray([4], [2], "|i1", fill=10**30), "text": _zarray([4], [2], fill="x" * 1000),
               "nan": _zarray([2], [2], "<f4", fill="NaN"), "ok": _zarray([2], [2], "<i2", fill=-5)})
    m = mount(server.url_for("fills.zarr"))
    log = m.log()
    assert "hiding array big: fill_value 1000000000000000000000000000000 is not a value of its dtype |i1" in log
    assert "hiding array text: fill_value 'xxxxx" in log and "(1,002 characters) is not a value of its dtype <f8" in log
    assert max(map(len, log.splitlines())) < 400, log
    dumped = ncdump(nczarr_url(m.path))
    assert "short ok(d_ok0)" in dumped and "float nan(d_nan0)" in dumped, dumped
    assert "big" not in dumped and "text" not in dumped, dumped
    assert "ok = _, _ ;" in dumped, dumped  # (no chunk stored: the fill, which ncdump shows as _)


def test_a_shard_index_past_16_mib_hides_its_array(mount, server):
    """A v3 shard of 2**21 inner chunks has a 32 MiB index, read whole (and not kept by the 16 MiB LRU)
    at every inner chunk's read: the array is hidden in one line; a sharded array beside it reads."""
    def array(shape, shard, inner, names):
        return {"zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
                "chunk_key_encoding": {"name": "default"}, "fill_value": 7, "attributes": {},
                "dimension_names": names,
                "codecs": [{"name": "sharding_indexed", "configuration": {
                    "chunk_shape": inner, "codecs": [{"name": "bytes"}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_location": "end"}}]}
    root = server.root / "shards.zarr"
    root.mkdir()
    (root / "zarr.json").write_text(json.dumps({
        "zarr_format": 3, "node_type": "group", "attributes": {},
        "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {
            "wide": array([2**22], [2**21], [1], ["x"]), "small": array([8], [8], [2], ["y"])}}}))
    m = mount(server.url_for("shards.zarr"))
    assert "hiding array wide: unsupported Zarr v3 sharding into 2,097,152 inner chunks a shard, whose index (33,554,432 " \
           "bytes) is larger than the decoded view reads (16,777,216)" in m.log(), m.log()
    assert not (m / "wide").exists()
    assert (m / "small/3").read_bytes() == b"\x07\x07"  # (no shard stored: the fill)


def test_a_zip_of_inflating_metadata_is_held_to_max_refs_size(tmp_path, server):
    """Forty DEFLATED .zattrs of 60 MB each (a 2.4 MB zip): inflated, 2.4 GB in the mounting process
    (which then said its memory target was too small). Their inflated sizes count against
    --max-refs-size as a reference set's decompressed text does: one line, the process small."""
    with zipfile.ZipFile(server.root / "inflating.zarr.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(".zgroup", '{"zarr_format": 2}')
        z.writestr("a0/.zarray", json.dumps(_zarray([4], [2])))
        for i in range(40):
            z.writestr(f"a{i}/.zattrs", "{" + " " * (60 << 20) + "}")
    (tmp_path / "mnt").mkdir()
    done = run_refmount("mount", "--max-refs-size", "64M", server.url_for("inflating.zarr.zip"), tmp_path / "mnt")
    assert done.returncode != 0
    assert done.stderr.strip() == (f"refmount: {server.url_for('inflating.zarr.zip')!r}: its metadata exceeds "
                                   "--max-refs-size 64M once decompressed"), done.stderr


def test_an_unconsolidated_stores_documents_count_against_max_refs_size(tmp_path, server):
    """The same budget for a store's documents read one by one (a server's, gzip-inflated or not): an
    unconsolidated root array whose .zattrs is 3 MB, under --max-refs-size 2M."""
    root = server.root / "walked.zarr"
    root.mkdir()
    (root / ".zarray").write_text(json.dumps(_zarray([4], [2])))
    (root / ".zattrs").write_text("{" + " " * (3 << 20) + "}")
    (tmp_path / "mnt").mkdir()
    done = run_refmount("mount", "--max-refs-size", "2M", server.url_for("walked.zarr"), tmp_path / "mnt")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith("walked.zarr': its metadata exceeds --max-refs-size 2M once decompressed"), \
        done.stderr


def test_a_chunk_cut_short_is_eio_in_the_decoded_view_unless_only_elements_past_the_shape_are_missing(
        mount, tmp_path):
    """An uncompressed chunk is served as stored: one whose reference runs past its file's end was
    served short (the raw view's "the bytes that exist", as fsspec), and netCDF-C read the rest as zeros.
    Now EIO with one line; an edge chunk that lacks only elements outside the shape (a TIFF's last
    strip) still reads."""
    data = tmp_path / "d.bin"
    data.write_bytes(bytes(range(1, 13)))  # 12 bytes: three int32
    zarray = lambda shape, chunks: json.dumps(_zarray(shape, chunks, "<i4", fill=-1))  # noqa: E731
    refs = {".zgroup": '{"zarr_format": 2}',
            "cut/.zarray": zarray([4], [4]), "cut/.zattrs": '{"_ARRAY_DIMENSIONS": ["a"]}',
            "cut/0": [str(data), 0, 16],
            "edge/.zarray": zarray([3], [2]), "edge/.zattrs": '{"_ARRAY_DIMENSIONS": ["b"]}',
            "edge/0": [str(data), 0, 8], "edge/1": [str(data), 8, 8]}
    m = mount(refs)
    with pytest.raises(OSError) as cut:
        (m / "cut/0").read_bytes()
    assert cut.value.errno == 5
    assert "chunk 'cut/0' ends after 12 bytes, short of the 16 that hold its elements (its file is cut short)" \
        in m.log(), m.log()
    assert (m / "edge/1").read_bytes() == bytes(range(9, 13))
    dumped = ncdump(nczarr_url(m.path), ["edge"])
    assert "edge = 67305985, 134678021, 202050057 ;" in dumped, dumped


def test_a_fits_header_whose_image_runs_past_the_file_is_left_out_in_one_line(tmp_path):
    """NAXIS1 x NAXIS2 of 10**15 bytes in a 5 kB file: the decoded view hid it, the raw view served a
    chunk of the bytes that exist. The FITS scanner leaves that image out, in one line naming it (the
    file's other HDUs, if any, still read: a download cut short keeps what it has)."""
    def card(key, value):
        return f"{key:<8}= {value:>20}".ljust(80).encode()

    header = b"".join(card(k, v) for k, v in (("SIMPLE", "T"), ("BITPIX", 8), ("NAXIS", 2), ("NAXIS1", 10**9),
                                              ("NAXIS2", 10**6))) + b"END".ljust(80)
    (tmp_path / "lies.fits").write_bytes(header.ljust(2880) + bytes(2880))
    (tmp_path / "mnt").mkdir()
    log = tmp_path / "mnt.log"
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = run_refmount("mount", "--log-file", log, tmp_path / "lies.fits", tmp_path / "mnt", env=env)
    try:
        assert done.returncode == 0, done.stderr
        assert not (tmp_path / "mnt" / "PRIMARY").exists()
        said = [line for line in log.read_text().splitlines() if "runs past the end of the file" in line]
        assert len(said) == 1 and "variable PRIMARY" in said[0] and "truncated" in said[0], said
    finally:
        run_refmount("umount", tmp_path / "mnt")


def test_a_lone_compressor_stops_one_byte_past_the_chunk(mount, server):
    """A 16 MiB chunk whose zlib stream inflates to 128 MiB: every stage was allowed 8x the chunk (room
    for filters), so it inflated 128 MiB before its size was checked (for a 128 MiB chunk of a 1 GiB
    stream the daemon peaked at 3.5 GB). The last stage's output is the chunk itself: it stops at once."""
    n = 1 << 24
    compress = zlib.compressobj(9)
    stream = b"".join(compress.compress(bytes(n)) for _ in range(8)) + compress.flush()
    _v2_store(server.root / "inflating.zarr", {"a": _zarray([n], [n], "|u1", compressor={"id": "zlib", "level": 9})},
              {"a/0": stream})
    m = mount(server.url_for("inflating.zarr"))
    with pytest.raises(OSError) as failed:
        (m / "a/0").read_bytes()
    assert failed.value.errno == 5
    assert f"chunk 'a/0' could not be decoded: TooLarge: decodes to more than the expected {n} bytes" in m.log()


def test_a_large_reference_file_on_a_server_ignoring_range_mounts_within_max_refs_size(mount, server, tmp_path):
    """A 6 MiB JSON reference file (past fsspec's 5 MiB block) on a server that answers every GET with
    the whole file: fsspec's ranged reads refused it ("doesn't appear to support range requests"). It is
    read as one stream now: it mounts, and past --max-refs-size it is refused in one line naming the
    url and the option."""
    (server.root / "d.bin").write_bytes(bytes(range(1, 9)))
    refs = {".zgroup": '{"zarr_format": 2}', "a/.zattrs": '{"_ARRAY_DIMENSIONS": ["x"]}',
            "a/.zarray": json.dumps(_zarray([2], [2], "<i4")), "a/0": [server.url_for("d.bin"), 0, 8]}
    refs.update({f"pad/{i}": "x" * 100 for i in range(60_000)})  # inline values: 6 MB of text
    (server.root / "big.json").write_text(json.dumps({"version": 1, "refs": refs}))
    server.ignore_range = True
    m = mount(server.url_for("big.json"))
    assert (m / "a/0").read_bytes() == bytes(range(1, 9))
    (tmp_path / "small").mkdir()
    done = run_refmount("mount", "--max-refs-size", "4M", server.url_for("big.json"), tmp_path / "small")
    assert done.returncode != 0
    assert done.stderr.strip() == (f"refmount: reference file {server.url_for('big.json')!r} exceeds --max-refs-size"
                                   " 4M once decompressed (raise the option to load it)"), done.stderr
