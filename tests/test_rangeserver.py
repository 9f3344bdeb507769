"""Quick tests of the loopback Range server (tests/support/rangeserver.py)."""

import http.client
import os
import threading
import time

import pytest

from tests.support.rangeserver import FAULT_KINDS, Faults, RangeServer

SIZE = 10_000
DATA = bytes((i * 7 + i // 256) % 256 for i in range(SIZE))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("www")
    (d / "data.bin").write_bytes(DATA)
    (d / "sub").mkdir()
    (d / "sub" / "one.bin").write_bytes(b"x")
    (d / "empty.bin").write_bytes(b"")
    return d


@pytest.fixture
def srv(root):
    with RangeServer(root) as s:
        yield s


def request(srv, path="/data.bin", rng=None, method="GET", timeout=5.0, headers=None):
    """(status, headers dict with lower-case names, body) via a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=timeout)
    try:
        h = dict(headers or {})
        if rng is not None:
            h["Range"] = rng
        conn.request(method, path, headers=h)
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


# ---------------------------------------------------------------------------- ranges


def test_url(srv):
    assert srv.url == f"http://127.0.0.1:{srv.port}"
    assert srv.url_for("sub/one.bin") == srv.url + "/sub/one.bin"
    assert srv.path_for(srv.url_for("sub/one.bin")) == srv.root / "sub" / "one.bin"


def test_range_exact(srv):
    status, h, body = request(srv, rng="bytes=100-199")
    assert status == 206
    assert h["content-range"] == f"bytes 100-199/{SIZE}"
    assert h["content-length"] == "100"
    assert body == DATA[100:200]
    assert "etag" in h and "last-modified" in h


@pytest.mark.parametrize("rng,start,end", [
    (f"bytes={SIZE - 10}-{SIZE + 5000}", SIZE - 10, SIZE - 1),  # clipped at EOF
    ("bytes=9000-", 9000, SIZE - 1),                            # open-ended
    ("bytes=-10", SIZE - 10, SIZE - 1),                         # suffix
    ("bytes=0-0", 0, 0),
    (f"bytes={SIZE - 1}-{SIZE - 1}", SIZE - 1, SIZE - 1),
])
def test_range_forms(srv, rng, start, end):
    status, h, body = request(srv, rng=rng)
    assert status == 206
    assert h["content-range"] == f"bytes {start}-{end}/{SIZE}"
    assert int(h["content-length"]) == end - start + 1 == len(body)
    assert body == DATA[start:end + 1]


@pytest.mark.parametrize("rng", [f"bytes={SIZE}-", f"bytes={SIZE}-{SIZE + 10}", "bytes=-0"])
def test_unsatisfiable(srv, rng):
    status, h, body = request(srv, rng=rng)
    assert status == 416
    assert h["content-range"] == f"bytes */{SIZE}"


def test_empty_file(srv):
    assert request(srv, "/empty.bin")[0] == 200
    assert request(srv, "/empty.bin", rng="bytes=0-0")[0] == 416


def test_no_range_and_ignored_ranges(srv):
    for rng in (None, "bytes=0-1,5-6", "items=0-5", "bytes=5-2"):
        status, h, body = request(srv, rng=rng)
        assert status == 200 and body == DATA and "content-range" not in h, rng


def test_head(srv, root):
    status, h, body = request(srv, method="HEAD")
    assert status == 200 and body == b""
    assert h["content-length"] == str(SIZE)
    assert h["accept-ranges"] == "bytes"
    st = os.stat(root / "data.bin")
    assert h["etag"] == f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
    assert h["last-modified"].endswith(" GMT")
    assert request(srv)[1]["etag"] == h["etag"]  # GET sends the same validators


def test_etag_changes_with_file(srv, root):
    p = root / "sub" / "one.bin"
    before = request(srv, "/sub/one.bin", method="HEAD")[1]["etag"]
    p.write_bytes(b"yy")
    try:
        after = request(srv, "/sub/one.bin", method="HEAD")[1]["etag"]
    finally:
        p.write_bytes(b"x")
    assert before != after


def test_missing_and_traversal(srv):
    assert request(srv, "/nope.bin")[0] == 404
    assert request(srv, "/sub")[0] == 404  # directories are not files
    assert request(srv, "/../../etc/passwd")[0] == 404
    assert request(srv, "/%2e%2e/%2e%2e/etc/passwd")[0] == 404


def test_fail_paths_and_ignore_range(srv):
    srv.fail_paths = {"data.bin": 403, "sub/one.bin": 500}
    assert request(srv)[0] == 403
    assert request(srv, method="HEAD")[0] == 403
    assert request(srv, "/sub/one.bin")[0] == 500
    srv.fail_paths = {}
    srv.ignore_range = True
    status, h, body = request(srv, rng="bytes=0-9")
    assert status == 200 and body == DATA
    assert "accept-ranges" not in request(srv, method="HEAD")[1]


def test_stats(root):
    with RangeServer(root, log_size=3) as srv:
        request(srv, rng="bytes=0-9")
        request(srv, method="HEAD")
        request(srv, "/nope")
        request(srv, rng="bytes=-5")
        # the server counts a body after handing it to the socket, which may be after the client
        # has read it: give the counter a moment
        deadline = time.monotonic() + 2
        while srv.stats["bytes_sent"] < 15 and time.monotonic() < deadline:
            time.sleep(0.01)
        s = srv.stats
        assert s["requests"] == 4
        assert s["bytes_sent"] == 15
        assert s["status"] == {206: 2, 200: 1, 404: 1}
        assert s["log"] == [("HEAD", "/data.bin", None), ("GET", "/nope", None),
                            ("GET", "/data.bin", "bytes=-5")]
        srv.reset_stats()
        assert srv.stats["requests"] == 0 and srv.stats["log"] == []


# ---------------------------------------------------------------------------- faults


def test_faults_validation():
    assert Faults().rate == 0
    with pytest.raises(ValueError):
        Faults(rate=1.0, kinds=("nope",))
    with pytest.raises(ValueError):
        Faults(rate=2.0)
    assert Faults(rate=1.0, kinds="reset").kinds == ("reset",)


@pytest.mark.parametrize("kind", ["500", "503"])
def test_fault_status(srv, kind):
    srv.faults = Faults(rate=1.0, kinds=(kind,))
    assert request(srv, rng="bytes=0-9")[0] == int(kind)
    assert request(srv, method="HEAD")[0] == 200  # HEAD is never faulted
    assert srv.stats["faults"] == {kind: 1}


def test_fault_429(srv):
    srv.set_faults(rate=1.0, kinds=("429",), retry_after=0.1)
    status, h, _ = request(srv, rng="bytes=0-9")
    assert status == 429 and h["retry-after"] == "0.1"


def test_fault_reset(srv):
    srv.set_faults(rate=1.0, kinds=("reset",))
    with pytest.raises(ConnectionError):  # ConnectionResetError / RemoteDisconnected
        request(srv, rng="bytes=0-9")
    srv.clear_faults()
    assert request(srv, rng="bytes=0-9")[0] == 206  # server still fine


def test_fault_truncate(srv):
    srv.set_faults(rate=1.0, kinds=("truncate",))
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", "/data.bin", headers={"Range": "bytes=0-999"})
    resp = conn.getresponse()
    assert resp.status == 206 and resp.getheader("Content-Length") == "1000"
    with pytest.raises(http.client.IncompleteRead) as e:
        resp.read()
    assert 0 < len(e.value.partial) < 1000
    assert e.value.partial == DATA[:len(e.value.partial)]
    conn.close()


def test_fault_stall_does_not_block_others(srv):
    srv.set_faults(rate=1.0, kinds=("stall",), stall_seconds=30)
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=0.5)
    conn.request("GET", "/data.bin", headers={"Range": "bytes=0-999"})
    resp = conn.getresponse()  # headers arrive
    assert resp.status == 206
    assert resp.read(400) == DATA[:400]  # part of the body arrives ...
    with pytest.raises(TimeoutError):  # ... then nothing
        resp.read(600)
    srv.clear_faults()
    t0 = time.perf_counter()
    assert request(srv, rng="bytes=0-9")[2] == DATA[:10]  # others are served meanwhile
    assert time.perf_counter() - t0 < 1
    conn.close()


def test_stop_with_stalled_request_is_fast(root):
    srv = RangeServer(root).start()
    srv.set_faults(rate=1.0, kinds=("stall",), stall_seconds=30)
    got = []

    def client():
        try:
            got.append(request(srv, rng="bytes=0-999", timeout=10))
        except Exception as e:
            got.append(e)

    t = threading.Thread(target=client)
    t.start()
    while srv.stats["faults"].get("stall", 0) == 0:
        time.sleep(0.01)
    t0 = time.perf_counter()
    srv.stop()
    assert time.perf_counter() - t0 < 3
    t.join(5)
    assert got and isinstance(got[0], Exception)  # the client saw a short body


def test_fault_bad_range(srv):
    srv.set_faults(rate=1.0, kinds=("bad_range",))
    status, h, body = request(srv, rng="bytes=100-199")
    assert status == 206
    cr = h["content-range"]
    assert cr != f"bytes 100-199/{SIZE}"
    start, end = map(int, cr.split()[1].split("/")[0].split("-"))
    assert body == DATA[start:end + 1] and int(h["content-length"]) == len(body)
    # at EOF it shifts the other way
    status, h, body = request(srv, rng=f"bytes={SIZE - 10}-")
    assert h["content-range"] == f"bytes {SIZE - 11}-{SIZE - 2}/{SIZE}"
    assert body == DATA[SIZE - 11:SIZE - 1]


def test_fault_full200(srv):
    srv.set_faults(rate=1.0, kinds=("full200",))
    status, h, body = request(srv, rng="bytes=100-199")
    assert status == 200 and body == DATA and "content-range" not in h


def test_fault_rate_and_seed(srv):
    def run():
        srv.set_faults(rate=0.25, kinds=("503", "500"), seed=1)
        return [request(srv, rng="bytes=0-9")[0] for _ in range(80)]

    a, b = run(), run()
    assert a == b  # same seed, same sequence
    failed = sum(s != 206 for s in a)
    assert 8 <= failed <= 35
    assert set(a) <= {206, 500, 503}


def test_all_kinds_mixed_concurrently(srv):
    # every kind at once from several threads: the server survives and counts right
    srv.set_faults(rate=0.5, kinds=FAULT_KINDS, stall_seconds=0.2, seed=3)
    n_threads, per_thread = 4, 15
    errors = []

    def worker():
        for i in range(per_thread):
            try:
                request(srv, rng=f"bytes={i}-{i + 99}", timeout=2)
            except Exception as e:  # resets, truncations, stalls
                errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    s = srv.stats
    assert s["requests"] == n_threads * per_thread
    assert sum(s["faults"].values()) > 0 and errors
    srv.clear_faults()
    assert request(srv, rng="bytes=0-9")[2] == DATA[:10]


def test_throughput(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(32 << 20))
    with RangeServer(tmp_path) as srv:
        t0 = time.perf_counter()
        status, _, body = request(srv, "/big.bin", timeout=30)
        assert status == 200 and len(body) == 32 << 20
        status, _, body = request(srv, "/big.bin", rng="bytes=1000000-9388607")
        assert status == 206 and len(body) == 8388608
        assert time.perf_counter() - t0 < 5
