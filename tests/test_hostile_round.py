"""Red-team attacks on the round that brought refs/codecs.py's allowlist, the stdlib engine's HEAD,
STAC items gone and roundtrip.py's socket notes: each through a real mount.

A reference set's codec params are its author's: `make_codec` builds an allowed class with them. A
filter's params may name any item type, and numcodecs decodes to it before anything checks the size
(64 bytes of u1 "decoded" as |S25000000 were 1.6 GB); a vlen count of 2^31 strings made a 16 GiB
array of objects; categorize compared the whole chunk once per label (10^6 labels: minutes a chunk).
Each hostile chunk is an EIO (or its array hidden) in one line, the daemon lives on under its
--memory-target, and the arrays beside it read the bytes numcodecs gives."""

from __future__ import annotations

import json
import os
import struct
import zlib

import numcodecs
import numpy as np
import pytest

from tests.test_codec_trust import _array, _names
from tests.test_hostile_sources import _peak_kb


def _eio(path) -> None:
    with pytest.raises(OSError) as e:
        path.read_bytes()
    assert e.value.errno == 5, e.value


def test_codec_params_naming_huge_or_object_types_are_refused_before_decoding(mount):
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    codes = bytes(range(64))
    # filters whose decoded type is not the array's: sized from params and input before decoding
    _array(refs, "astype_huge", [64], "|u1", codes, filters=[{"id": "astype", "encode_dtype": "|u1",
                                                              "decode_dtype": "|S25000000"}])
    _array(refs, "astype_void", [64], "|u1", codes, filters=[{"id": "astype", "encode_dtype": "|u1",
                                                              "decode_dtype": "|V25000000"}])
    _array(refs, "categorize_huge", [64], "<U1", codes, filters=[{"id": "categorize", "labels": ["a", "b"],
                                                                 "dtype": "<U6000000", "astype": "|u1"}])
    _array(refs, "astype_object", [8], "<i8", np.arange(8, dtype="<i8").tobytes(),
           filters=[{"id": "astype", "encode_dtype": "<i8", "decode_dtype": "|O"}])
    _array(refs, "delta_wider", [8], "<i8", bytes(64), filters=[{"id": "delta", "dtype": "<c16", "astype": "|u1"}])
    _array(refs, "fso_wider", [64], "|u1", codes, filters=[{"id": "fixedscaleoffset", "offset": 0, "scale": 1,
                                                            "dtype": "<c16", "astype": "|u1"}])
    _array(refs, "packbits_wider", [8], "|b1", b"\x00" + bytes(64), filters=[{"id": "packbits"}])
    # a vlen count past the data (numcodecs made the count's object array first), on the mount's
    # string scan and on reads alike; and scan-time decoders failing in other ways than ValueError
    _array(refs, "vlen_count", [2], "|O", struct.pack("<I", 0x7FFFFFFF) + bytes(8), filters=[{"id": "vlen-utf8"}])
    lying = bytearray(numcodecs.Blosc().encode(numcodecs.VLenUTF8().encode(np.array(["ab", "c"], dtype=object))))
    struct.pack_into("<I", lying, 12, 1 << 20)  # (its compressed size: past the chunk's bytes)
    _array(refs, "vlen_blosc_lying", [2], "|O", bytes(lying), compressor={"id": "blosc"},
           filters=[{"id": "vlen-utf8"}])
    _array(refs, "vlen_fletcher_short", [2], "|O", b"ab", filters=[{"id": "vlen-utf8"}, {"id": "fletcher32"}])
    # what the same filters decode when honest
    fso = numcodecs.FixedScaleOffset(offset=10, scale=4, dtype="<f8", astype="|u1")
    values = np.linspace(10, 40, 64)
    _array(refs, "fso", [64], "<f8", zlib.compress(fso.encode(values)), compressor={"id": "zlib"},
           filters=[fso.get_config()])
    bits = np.array([True, False, True, True, False])  # (5 booleans: 3 bits of padding)
    _array(refs, "packbits", [5], "|b1", numcodecs.PackBits().encode(bits), filters=[{"id": "packbits"}])
    one = np.array(["x"], dtype=object)  # (a 1-byte string in 9 bytes: more than 8x its served size)
    _array(refs, "vlen_one", [1], "|O", numcodecs.VLenUTF8().encode(one), filters=[{"id": "vlen-utf8"}])
    labels = [f"label{n}" for n in range(20000)]
    label_codes = (np.arange(200000) % 20003).astype("<u2")  # (0 and codes past the labels: "")
    categorize = {"id": "categorize", "labels": labels, "dtype": "<U10", "astype": "<u2"}
    _array(refs, "categorize", [200000], "<U10", zlib.compress(label_codes.tobytes()), compressor={"id": "zlib"},
           filters=[categorize])
    m = mount(refs, "--view", "decoded", "--memory-target", "256M")
    hidden = {"vlen_count", "vlen_blosc_lying", "vlen_fletcher_short"}  # (the string scan decodes them at mount)
    assert _names(m) == sorted({"astype_huge", "astype_void", "categorize_huge", "astype_object", "delta_wider",
                                "fso_wider", "packbits_wider", "fso", "categorize", "packbits", "vlen_one"}), m.log()
    assert (m / "packbits/0").read_bytes() == bits.astype("u1").tobytes()
    assert (m / "vlen_one/0").read_bytes() == b"x"
    for name in ("astype_huge", "astype_void", "categorize_huge", "astype_object", "delta_wider", "fso_wider",
                 "packbits_wider"):
        _eio(m / f"{name}/0")
    assert (m / "fso/0").read_bytes() == fso.decode(fso.encode(values)).tobytes()
    oracle = numcodecs.Categorize(labels, "<U10", astype="<u2").decode(label_codes)  # (numcodecs' own loop)
    assert (m / "categorize/0").read_bytes() == np.array([s.encode() for s in oracle], dtype="S40").tobytes()
    log = m.log()
    assert "declares 1600000000 decoded bytes, more than the expected 64" in log, log
    assert "declares 1536000000 decoded bytes, more than the expected 2048" in log, log
    assert "declares 2147483647 strings, more than its 12 bytes can hold" in log, log
    for name in hidden:
        said = [line for line in log.splitlines() if f"hiding array {name}:" in line]
        assert len(said) == 1, log
    assert m.proc.poll() is None
    assert _peak_kb(m.proc.pid) < 600 << 10, log


def test_a_jp2_file_declaring_a_small_image_in_a_box_before_its_codestream_is_sized_by_its_codestream(mount):
    """view/bounded.py sized a JPEG 2000 chunk from the first SIZ marker found anywhere: a box before
    the jp2c box could declare 16x16 while OpenJPEG decoded the codestream's 3000x3000 (9 MB for a
    768-byte chunk). Now the boxes are walked to the codestream OpenJPEG reads."""
    imagecodecs = pytest.importorskip("imagecodecs")
    image = (np.arange(16 * 16 * 3) % 251).astype("u1").reshape(16, 16, 3)
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    for name in ("JP2", "J2K"):
        honest = imagecodecs.jpeg2k_encode(image, codecformat=name, level=0)
        _array(refs, name.lower(), [16, 16, 3], "|u1", honest, compressor={"id": "imagecodecs_jpeg2k"})
    big = imagecodecs.jpeg2k_encode(np.zeros((3000, 3000), "u1"), codecformat="JP2", level=0)
    siz = b"\xff\x4f\xff\x51" + struct.pack(">HHIIIIIIIIH", 41, 0, 16, 16, 0, 0, 16, 16, 0, 0, 1) + b"\x07\x01\x01"
    assert big[36:40] == b"jp2h"  # (the fake SIZ goes in an xml box between ftyp and jp2h)
    lying = big[:32] + struct.pack(">I", 8 + len(siz)) + b"xml " + siz + big[32:]
    _array(refs, "lying", [16, 16, 3], "|u1", lying, compressor={"id": "imagecodecs_jpeg2k"})
    m = mount(refs, "--view", "decoded")
    assert (m / "jp2/0.0.0").read_bytes() == image.tobytes()
    assert (m / "j2k/0.0.0").read_bytes() == image.tobytes()
    _eio(m / "lying/0.0.0")
    assert "declares 9000000 decoded bytes, more than the expected 768" in m.log(), m.log()


# -- the stdlib engine's HEAD (fetch/http.py `size_direct`, fetch/direct.py `Request.head`) -----------

class _RawServer:
    """A loopback HTTP/1.1 server written on sockets, to answer a HEAD as no framework would (a
    Content-Length of 10^18 or "+1000", a body after a HEAD's headers) and every GET honestly: a 206
    of the Range asked, ETag "v1" (or `get_etag`), keep-alive."""

    def __init__(self, blob: bytes, head: bytes, tls=None) -> None:
        import socket
        import threading

        self.blob, self.head, self.get_etag, self.tls = blob, head, '"v1"', tls
        self.close_after = False  # answer each GET with Connection: close, and close
        self.idle_close: float | None = None  # close a kept-alive connection idle this long (as nginx does)
        self.requests: list[str] = []
        self.headers_seen: list[dict] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.sock.getsockname()[1]}/blob.bin"
        self._threads: list = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn) -> None:
        buffered = b""
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                return
        with conn:
            while True:
                while b"\r\n\r\n" not in buffered:
                    try:
                        piece = conn.recv(65536)
                    except OSError:
                        return
                    if not piece:
                        return
                    buffered += piece
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method = lines[0].split()[0]
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
                self.requests.append(method)
                self.headers_seen.append(headers)
                if method == "HEAD":
                    conn.sendall(self.head)
                    continue
                start, _, end = headers.get("range", "bytes=0-").removeprefix("bytes=").partition("-")
                start, end = int(start), min(int(end or len(self.blob) - 1), len(self.blob) - 1)
                body = self.blob[start:end + 1]
                closing = "Connection: close\r\n" if self.close_after else ""
                conn.sendall(f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{end}/{len(self.blob)}\r\n"
                             f"Content-Length: {len(body)}\r\nETag: {self.get_etag}\r\n{closing}\r\n".encode() + body)
                if self.close_after:
                    return
                conn.settimeout(self.idle_close)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_server():
    made: list[_RawServer] = []

    def make(blob: bytes, head: bytes, tls=None) -> _RawServer:
        made.append(_RawServer(blob, head, tls))
        return made[-1]
    yield make
    for s in made:
        s.close()


BLOB = bytes(range(256)) * 16  # 4096 bytes


def _head(length: str, extra: str = "", etag: str = '"v1"') -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nETag: {etag}\r\n{extra}\r\n".encode()


@pytest.mark.parametrize("length", ["1000000000000000000", "+4096", " 4096 ", "-1", "4096, 4096", "\u00b2"],
                         ids=["1e18", "plus", "spaces", "negative", "twice", "superscript"])
def test_a_head_lying_about_the_size_gives_the_right_bytes_or_eio(mount, raw_server, length):
    """A whole-file reference's size from a HEAD whose Content-Length is not the object's: the
    ranged GETs' Content-Range says the real size, and the read is the object's bytes or EIO,
    never a byte past it nor a daemon holding memory for 10^18 bytes."""
    server = raw_server(BLOB, _head(length))
    m = mount({"f": [server.url]}, "--view", "raw", "--read-timeout", "5")
    try:
        with open(m / "f", "rb", buffering=0) as f:  # (not read_bytes: st_size may be 10^18)
            got = f.read(2 * len(BLOB))
    except OSError as e:
        assert e.errno == 5, e
    else:
        assert got == BLOB
    assert m.proc.poll() is None
    assert _peak_kb(m.proc.pid) < 600 << 10


def test_a_head_claiming_an_unbelievable_size_is_never_shown(mount, raw_server):
    """A HEAD saying 10^18 bytes: st_size showed 10^18 until the first GET's Content-Range said 4096.
    A size past any object store's maximum (1 PiB) is refused: the stat is EIO, in one line naming
    the url, and never shows that size."""
    server = raw_server(BLOB, _head("1000000000000000000"))
    m = mount({"f": [server.url]}, "--view", "raw", "--read-timeout", "5")
    with pytest.raises(OSError) as failed:
        os.stat(m / "f")
    assert failed.value.errno == 5
    said = [line for line in m.log().splitlines() if "ERROR" in line]
    assert len(said) == 1 and server.url in said[0] and "1,000,000,000,000,000,000 bytes" in said[0], said
    assert "not believed" in said[0], said


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("trailing", ["blob", "fake206"])
def test_a_head_answered_with_a_body_never_desynchronizes_the_connection(mount, raw_server, trailing, tls, tmp_path):
    """A HEAD whose answer carries a body anyway (servers that write one regardless): http.client
    reads none, as it must. The connection must not go back to the pool with those bytes waiting,
    or the next GET on it takes them for its answer: the object's own bytes (a bad status line), or
    bytes shaped as a 206 of the range asked (served as the chunk's bytes)."""
    fake = BLOB[:64] if trailing == "blob" else (
        b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-4095/4096\r\nContent-Length: 4096\r\n"
        b'ETag: "v1"\r\n\r\n' + bytes(4096))
    args = ()
    context = None
    if tls:
        import ssl

        from tests.support.tls import self_signed

        cert, key = self_signed(tmp_path)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        args = ("--ca-bundle", str(cert))
    server = raw_server(BLOB, _head("4096") + fake, context)
    m = mount({"f": [server.url]}, "--view", "raw", "--read-timeout", "5", "--no-prefetch", "--connections", "1", *args)
    try:
        got = (m / "f").read_bytes()
    except OSError as e:
        assert e.errno == 5, e
    else:
        assert got == BLOB, "a HEAD's leftover body was served as the object's bytes"


def test_cookies_a_head_sets_go_to_their_own_host_only(mount, raw_server):
    """The stdlib engine's HEAD keeps the cookies its answer sets (fetch/auth.py's jar): one for its
    own host, and one naming another domain (localhost) that the jar must refuse. The server on
    localhost, read next, gets neither."""
    a = raw_server(BLOB, _head("4096", extra="Set-Cookie: own=1; Path=/\r\nSet-Cookie: other=2; Domain=localhost; Path=/\r\n"))
    b = raw_server(BLOB, _head("4096"))
    b_url = b.url.replace("127.0.0.1", "localhost")
    m = mount({"a": [a.url], "b": [b_url]}, "--view", "raw", "--read-timeout", "5")
    assert (m / "a").read_bytes() == BLOB
    assert (m / "b").read_bytes() == BLOB
    assert "HEAD" in a.requests and b.requests, (a.requests, b.requests)
    assert all("cookie" not in h for h in b.headers_seen), b.headers_seen


def test_an_etag_that_changes_between_the_head_and_the_get_is_eio_never_mixed(mount, raw_server):
    server = raw_server(BLOB, _head("4096", etag='"v1"'))
    server.get_etag = '"v2"'
    m = mount({"f": [server.url]}, "--view", "raw", "--read-timeout", "5")
    with pytest.raises(OSError) as e:
        (m / "f").read_bytes()
    assert e.value.errno == 5
    assert "changed while mounted" in m.log(), m.log()


# -- STAC items gone (refs/scan/catalogs.py) ---------------------------------------------------------

def test_a_stac_item_gone_under_concat_leaves_a_gap_in_time_never_data_shifted(mount, tmp_path, monkeypatch):
    """The middle day's item answers 404: --concat time orders the files by their time values, so
    the two days left keep their own times (a gap of a day the reader sees), and each day's values
    are that day's file's, not the next one's moved up a place."""
    xr = pytest.importorskip("xarray")
    from tests.support.daily import make_daily
    from tests.support.nginx import Nginx
    from tests.test_catalogs import write_stac

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    daily = make_daily(tmp_path / "daily", 3, nlat=7, nlon=12)
    www = tmp_path / "www"
    write_stac(www, daily)
    gone = daily[1].stem
    (www / "stac" / "daily" / gone / f"{gone}.json").unlink()
    with Nginx(tmp_path / "nginx", f"root {www};") as nginx:
        m = mount(f"{nginx.url}/stac/daily/collection.json", "--concat", "time", "--view", "raw")
        kept = [daily[0], daily[2]]
        with xr.open_zarr(m.path) as got, xr.open_mfdataset(kept, combine="by_coords") as want:
            xr.testing.assert_allclose(got.load(), want.load())
            assert got.time.values.tolist() == want.time.values.tolist()
            assert len(got.time) == 48 and got.time.values[24] - got.time.values[23] == np.timedelta64(25, "h")
        assert sum("gone, left out" in line for line in m.log().splitlines()) == 1, m.log()


def test_a_catalog_of_thousands_of_gone_items_says_so_in_a_few_lines(mount, tmp_path, monkeypatch):
    """3 items and 3,000 item links answering 404: the 3 mount, the log names the first 5 gone and
    the rest in one line (one line each was 3,000 lines; gone items now count towards the catalog's
    100,000-item limit, so 10^6 gone links are refused rather than fetched one by one)."""
    pytest.importorskip("xarray")
    from tests.support.daily import make_daily
    from tests.support.nginx import Nginx
    from tests.test_catalogs import listed, write_stac

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    daily = make_daily(tmp_path / "daily", 3, nlat=7, nlon=12)
    www = tmp_path / "www"
    write_stac(www, daily)
    path = www / "stac" / "daily" / "collection.json"
    collection = json.loads(path.read_text())
    collection["links"] += [{"rel": "item", "href": f"./gone{n}/gone{n}.json", "type": "application/json"}
                            for n in range(3000)]
    path.write_text(json.dumps(collection))
    with Nginx(tmp_path / "nginx", f"root {www}; access_log off;") as nginx:
        m = mount(f"{nginx.url}/stac/daily/collection.json", "--view", "raw")
        assert listed(m.path) == sorted(f.stem for f in daily)
        said = [line for line in m.log().splitlines() if "gone" in line]
        assert len(said) == 6, "\n".join(said[:20])
        assert "2995 more item(s) answered HTTP 404 or 410" in said[-1] and "gone2999/gone2999.json" in said[-1], said


# -- sockets over many hosts (fetch/roundtrip.py's socket_factory and context variable) ---------------

def _fds(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.parametrize("client", ["aiohttp", "stdlib"])
@pytest.mark.parametrize("keep_alive", [False, True], ids=["close", "keep-alive"])
def test_no_descriptor_is_left_behind_over_many_loopback_origins(mount, raw_server, client, keep_alive):
    """One daemon reads from 3 x 40 servers on distinct loopback ports in turn. Servers that close
    each connection, or that close one idle for 0.3 s (as nginx does after its keepalive_timeout):
    the descriptors it holds after the third round are those after the first, never one more per
    origin seen. (On integ the stdlib engine kept every origin's idle connection, closed by its
    server or not, until that origin was asked again: 59, 99, 139.)"""
    import time

    servers = [raw_server(BLOB, _head("4096")) for _ in range(120)]
    for s in servers:
        s.close_after, s.idle_close = not keep_alive, 0.3
    refs = {f"k{n}": [s.url, 100 * (n % 40), 100] for n, s in enumerate(servers)}
    m = mount(refs, "--view", "raw", "--http-client", client, "--connections", "2", "--no-prefetch")
    counts = []
    for round_ in range(3):
        if round_:
            time.sleep(1.5)  # (the servers close what is idle; the daemon sweeps at most once a second)
        for n in range(40 * round_, 40 * round_ + 40):
            assert (m / f"k{n}").read_bytes() == BLOB[100 * (n % 40):100 * (n % 40) + 100]
        counts.append(_fds(m.proc.pid))
    assert counts[2] <= counts[0] + 4, counts


def _grib(points: int | None = None, values=None) -> bytes:
    """A GRIB2 message of eccodes' regular_ll_sfc_grib2 sample (16 x 31 points): `values` packed, or
    a constant field (0 bits a value) whose grid then claims `points` points in 179 bytes."""
    import eccodes

    h = eccodes.codes_grib_new_from_samples("regular_ll_sfc_grib2")
    try:
        eccodes.codes_set_values(h, np.full(496, 5.0) if values is None else values)
        if points is not None:
            for key, value in (("Ni", 8000), ("Nj", points // 8000), ("numberOfDataPoints", points),
                               ("numberOfValues", points)):
                eccodes.codes_set(h, key, value)
        return eccodes.codes_get_message(h)
    finally:
        eccodes.codes_release(h)


def test_a_grib_message_whose_grid_claims_millions_of_points_is_refused_before_its_values_are_made(mount):
    """The GRIB codec (refs/gribcodec.py) made every value its message's grid declares: 179 bytes of a
    constant field claiming 64,000,000 points decoded to 512 MB of float64 (then 256 MB of float32)
    for a 1,984-byte chunk; a dtype param of |S100000000 multiplied the values' size by 10^8/4. Now
    the count is read from the message first."""
    eccodes = pytest.importorskip("eccodes")
    values = np.linspace(250, 300, 496)
    honest = _grib(values=values)
    refs = {".zgroup": json.dumps({"zarr_format": 2})}
    _array(refs, "t", [31, 16], "<f4", honest, filters=[{"id": "grib", "var": "t"}])
    _array(refs, "bomb", [31, 16], "<f4", _grib(points=64_000_000), filters=[{"id": "grib", "var": "t"}])
    _array(refs, "wide", [31, 16], "<f4", honest, filters=[{"id": "grib", "var": "t", "dtype": "|S100000000"}])
    m = mount(refs, "--view", "decoded")
    mid = eccodes.codes_new_from_message(honest)  # (the oracle: eccodes' own values)
    want = eccodes.codes_get_array(mid, "values").astype("<f4")
    eccodes.codes_release(mid)
    assert (m / "t/0.0").read_bytes() == want.tobytes()
    _eio(m / "bomb/0.0")
    _eio(m / "wide/0.0")
    log = m.log()
    assert "the GRIB message declares 64000000 points, 256000000 decoded bytes, more than the expected 1984" in log, log
    assert "the GRIB message declares 496 points, 49600000000 decoded bytes" in log, log
    assert _peak_kb(m.proc.pid) < 400 << 10, log
