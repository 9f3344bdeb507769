"""Lying and changing servers: gzip bodies, 206s longer than their Content-Range, objects replaced
while mounted (each validator combination), swapped disk-cache blocks, stalls, servers that ignore
Range. The rule: EIO or the right bytes, never a wrong byte."""

from __future__ import annotations

import errno
import os
import random
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from refmount.cache.disk import LAYOUT

CHUNK = 4096
N = 64  # chunks in the blob
FAST = ("--view", "raw", "--block-size", "4K", "--no-prefetch", "--read-timeout", "1.5")


def write_blob(server, name: str = "blob.bin", seed: int = 1, size: int = N * CHUNK) -> bytes:
    data = random.Random(seed).randbytes(size)
    (server.root / name).write_bytes(data)
    return data


def chunk_refs(url: str, n: int = N) -> dict:
    return {f"c/{i}": [url, i * CHUNK, CHUNK] for i in range(n)}


def read_or_errno(path: Path):
    try:
        return path.read_bytes()
    except OSError as e:
        return e.errno


# -- wrong encodings and lengths ---------------------------------------------------------------------

@pytest.mark.parametrize("lie", ["gzip", "long206", "long206-chunked"])
def test_lying_206_is_eio_never_its_bytes(mount, server, lie):
    data = write_blob(server)
    mnt = mount(chunk_refs(server.url_for("blob.bin")), *FAST)
    server.lie = lie
    got = read_or_errno(mnt / "c" / "3")
    assert got == errno.EIO, "a lying 206 was served" if got == data[3 * CHUNK:4 * CHUNK] else got
    assert ("Content-Encoding" if lie == "gzip" else "206") in mnt.log()
    server.lie = None
    time.sleep(2)  # the failure is remembered for a few seconds (fail fast); then reads work again
    assert (mnt / "c" / "4").read_bytes() == data[4 * CHUNK:5 * CHUNK]


def test_identity_encoding_is_asked_for(mount, server):
    data = write_blob(server)
    mnt = mount(chunk_refs(server.url_for("blob.bin")), *FAST)
    assert (mnt / "c" / "0").read_bytes() == data[:CHUNK]
    gets = [h for h in server.stats["headers"] if "range" in h]
    assert gets and all(h.get("accept-encoding") == "identity" for h in gets)


NGINX_CONF = """\
{user}
worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
daemon off;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {run}/tmp-body;
    proxy_temp_path {run}/tmp-proxy;
    fastcgi_temp_path {run}/tmp-fastcgi;
    uwsgi_temp_path {run}/tmp-uwsgi;
    scgi_temp_path {run}/tmp-scgi;
    types {{ application/octet-stream bin; }}
    gzip on;
    gzip_min_length 1;
    gzip_types application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
}}
"""


@pytest.fixture
def gzip_nginx(tmp_path):
    """Our own nginx (foreground, stopped by PID) that gzips application/octet-stream."""
    if shutil.which("nginx") is None:
        pytest.fail("nginx is required (Debian package nginx-light)")
    root, run = tmp_path / "nginx-www", tmp_path / "nginx-run"
    root.mkdir()
    run.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (run / "nginx.conf").write_text(NGINX_CONF.format(run=run, port=port, root=root,
                                                          user="user root;" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen(["nginx", "-p", str(run), "-c", str(run / "nginx.conf"), "-e", str(run / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        assert proc.poll() is None, (run / "error.log").read_text()
        yield root, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_real_nginx_with_gzip_on_serves_the_right_bytes(mount, gzip_nginx):
    root, base = gzip_nginx
    data = random.Random(5).randbytes(N * CHUNK)  # nginx gzips it anyway, and the gzip stream is longer
    (root / "blob.bin").write_bytes(data)
    mnt = mount(chunk_refs(f"{base}/blob.bin"), *FAST)
    for i in (0, 17, N - 1):
        assert (mnt / "c" / str(i)).read_bytes() == data[i * CHUNK:(i + 1) * CHUNK]


# -- objects replaced while mounted ------------------------------------------------------------------

def test_real_nginx_refuses_a_replaced_object_with_verify_remote(mount, gzip_nginx):
    root, base = gzip_nginx
    old = random.Random(6).randbytes(N * CHUNK)
    (root / "blob.bin").write_bytes(old)
    mnt = mount(chunk_refs(f"{base}/blob.bin"), *FAST, "--verify-remote")
    assert (mnt / "c" / "0").read_bytes() == old[:CHUNK]
    path = root / "blob.bin"
    path.write_bytes(random.Random(7).randbytes(N * CHUNK))
    os.utime(path, (path.stat().st_atime + 100, path.stat().st_mtime + 100))
    assert read_or_errno(mnt / "c" / "1") == errno.EIO
    assert "412" in mnt.log()


def replace(server, name: str, seed: int) -> bytes:
    """New content of the same size, with a Last-Modified 100 s later (one-second resolution)."""
    path = server.root / name
    old = path.stat()
    data = random.Random(seed).randbytes(old.st_size)
    path.write_bytes(data)
    os.utime(path, (old.st_atime + 100, old.st_mtime + 100))
    return data


@pytest.mark.parametrize("validators", [("etag", "last-modified"), ("etag",), ("last-modified",)])
def test_object_replaced_while_mounted_is_eio_never_mixed(mount, server, validators):
    server.validators = validators
    old = write_blob(server)
    mnt = mount(chunk_refs(server.url_for("blob.bin")), *FAST)
    assert (mnt / "c" / "0").read_bytes() == old[:CHUNK]
    new = replace(server, "blob.bin", seed=2)
    for i in range(1, 8):
        got = read_or_errno(mnt / "c" / str(i))
        assert got != new[i * CHUNK:(i + 1) * CHUNK], "bytes of the new version mixed with the old"
        assert got == errno.EIO
    assert "changed while mounted" in mnt.log()


def test_verify_remote_sends_conditional_requests_and_412_is_eio(mount, server):
    server.validators = ("last-modified",)
    old = write_blob(server)
    mnt = mount(chunk_refs(server.url_for("blob.bin")), *FAST, "--verify-remote")
    assert (mnt / "c" / "0").read_bytes() == old[:CHUNK]
    assert (mnt / "c" / "1").read_bytes() == old[CHUNK:2 * CHUNK]
    assert any("if-unmodified-since" in h for h in server.stats["headers"])
    server.validators = ()  # now the server gives no validator at all: only the condition can tell
    replace(server, "blob.bin", seed=2)
    assert read_or_errno(mnt / "c" / "2") == errno.EIO
    assert "412" in mnt.log()


def test_verify_remote_uses_if_match_with_a_strong_etag(mount, server):
    old = write_blob(server)
    mnt = mount(chunk_refs(server.url_for("blob.bin")), *FAST, "--verify-remote")
    assert (mnt / "c" / "0").read_bytes() == old[:CHUNK]
    assert (mnt / "c" / "1").read_bytes() == old[CHUNK:2 * CHUNK]
    assert any(h.get("if-match", "").startswith('"') for h in server.stats["headers"])


# -- the disk cache -----------------------------------------------------------------------------------

def test_swapped_disk_cache_blocks_are_caught(mount, server, tmp_path):
    """Block files moved to another key's name (same size, valid checksums) are never served."""
    a, b = write_blob(server, "a.bin", seed=3), write_blob(server, "b.bin", seed=4)
    refs = {**{f"a/{i}": [server.url_for("a.bin"), i * CHUNK, CHUNK] for i in range(4)},
            **{f"b/{i}": [server.url_for("b.bin"), i * CHUNK, CHUNK] for i in range(4)}}
    cache = tmp_path / "cache"
    args = ("--view", "raw", "--block-size", "4K", "--no-prefetch", "--cache-dir", str(cache))
    first = mount(refs, *args)
    for key in refs:
        (first / key).read_bytes()
    first.stop()
    blocks = sorted(p for p in (cache / LAYOUT).glob("*/*/*") if p.is_file())
    assert len(blocks) == 8
    by_object: dict = {}
    for p in blocks:
        by_object.setdefault(p.parent, []).append(p)
    (obj_a, blocks_a), (obj_b, blocks_b) = sorted(by_object.items())
    swaps = [(blocks_a[0], blocks_b[0]), (blocks_a[1], blocks_a[2])]  # across objects, and within one
    for x, y in swaps:
        tmp = x.with_name("swap")
        x.rename(tmp)
        y.rename(x)
        tmp.rename(y)
    second = mount(refs, *args)
    wrong = [key for key in refs if (second / key).read_bytes()
             != (a if key[0] == "a" else b)[int(key[2:]) * CHUNK:(int(key[2:]) + 1) * CHUNK]]
    assert wrong == []
    assert second.stats()["disk"]["corrupt"] == 4


def test_bytes_of_a_replaced_object_never_reach_the_disk_cache(mount, server, tmp_path):
    """v1 is cached; the server briefly serves v2 (Last-Modified only), then v1 again: after a remount
    every byte is v1's - no v2 block was stored under v1's name."""
    server.validators = ("last-modified",)
    v1 = write_blob(server)
    path = server.root / "blob.bin"
    v1_times = (path.stat().st_atime, path.stat().st_mtime)
    cache = tmp_path / "cache"
    args = ("--view", "raw", "--block-size", "4K", "--no-prefetch", "--read-timeout", "1.5", "--cache-dir", str(cache))
    refs = chunk_refs(server.url_for("blob.bin"), 8)
    first = mount(refs, *args)
    assert (first / "c" / "0").read_bytes() == v1[:CHUNK]
    replace(server, "blob.bin", seed=2)
    for i in range(1, 8):
        read_or_errno(first / "c" / str(i))
    first.stop()
    path.write_bytes(v1)  # the server is fixed
    os.utime(path, v1_times)
    second = mount(refs, *args)
    wrong = [i for i in range(8) if (second / "c" / str(i)).read_bytes() != v1[i * CHUNK:(i + 1) * CHUNK]]
    assert wrong == []


# -- time limits, stalls and servers that ignore Range -------------------------------------------------

def test_stalled_read_ends_within_its_read_timeout_counting_the_kernels_retry(mount, server):
    write_blob(server, "stall.bin")
    server.stall_paths = {"stall.bin"}
    mnt = mount({"k": [server.url_for("stall.bin"), 0, 256 * 1024]}, "--view", "raw", "--read-timeout", "5",
                "--stall-timeout", "30")
    started = time.monotonic()
    result = subprocess.run(["cat", str(mnt / "k")], capture_output=True, timeout=30)
    elapsed = time.monotonic() - started
    assert result.returncode != 0 and b"Input/output error" in result.stderr
    assert elapsed < 5 * 1.2 + 1, elapsed  # (+1 s to start cat and look the file up on a loaded machine)


def test_one_stalled_object_does_not_block_its_host(mount, server):
    data = write_blob(server)
    write_blob(server, "stall.bin")
    server.stall_paths = {"stall.bin"}
    refs = {**chunk_refs(server.url_for("blob.bin"), 4),
            **{f"s/{i}": [server.url_for("stall.bin"), i * CHUNK, CHUNK] for i in range(12)}}
    mnt = mount(refs, "--view", "raw", "--block-size", "4K", "--no-prefetch", "--connections", "4",
                "--read-timeout", "4", "--stall-timeout", "30")
    readers = [threading.Thread(target=read_or_errno, args=(mnt / "s" / str(i),), daemon=True) for i in range(12)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 5
    while server.stats["faults"].get("stall", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the stalled reads hold (at least) their connections now
    started = time.monotonic()
    assert (mnt / "c" / "1").read_bytes() == data[CHUNK:2 * CHUNK]
    assert time.monotonic() - started < 2
    for t in readers:
        t.join(20)


def test_server_ignoring_range_stops_early_and_warns_once(mount, server):
    size = 16 << 20
    data = write_blob(server, size=size)
    server.ignore_range = True
    refs = {f"c/{i}": [server.url_for("blob.bin"), i * CHUNK, CHUNK] for i in range(8)}
    mnt = mount(refs, "--view", "raw", "--block-size", "4K", "--no-prefetch")
    server.reset_stats()
    # paced, so that what the server pushes before the mount hangs up measures the mount, not how
    # fast a busy machine schedules it (a whole object would take a second, all eight eight seconds)
    server.body_rate = 16 << 20
    for i in range(8):
        assert (mnt / "c" / str(i)).read_bytes() == data[i * CHUNK:(i + 1) * CHUNK]
    sent = server.stats["bytes_sent"]
    assert sent < 8 * (3 << 20), f"{sent} bytes sent for 8 chunks near the start of a 16 MiB object"
    # (one pass may serve all eight, keeping the referenced chunks as it goes: then the server has
    # answered one 200 only, which could be a passing fault, and nothing is said)
    assert mnt.log().count("ignores Range") <= 1


def test_reads_of_an_object_whose_server_ignores_range_share_one_download(mount, server):
    size = 16 << 20
    data = write_blob(server, size=size)
    server.ignore_range = True
    near_end = size - 64 * CHUNK
    refs = {"first": [server.url_for("blob.bin"), 0, CHUNK], "second": [server.url_for("blob.bin"), CHUNK, CHUNK],
            **{f"c/{i}": [server.url_for("blob.bin"), near_end + i * CHUNK, CHUNK] for i in range(8)}}
    mnt = mount(refs, "--view", "raw", "--block-size", "4K", "--no-prefetch")
    assert (mnt / "first").read_bytes() == data[:CHUNK]
    assert (mnt / "second").read_bytes() == data[CHUNK:2 * CHUNK]  # two 200s: the server ignores Range
    server.reset_stats()
    server.body_rate = 32 << 20  # half a second for the whole object: the readers below join one download
    results = {}
    readers = [threading.Thread(target=lambda i=i: results.__setitem__(i, read_or_errno(mnt / "c" / str(i))))
               for i in range(8)]
    for t in readers:
        t.start()
    for t in readers:
        t.join(30)
    assert all(results[i] == data[near_end + i * CHUNK:near_end + (i + 1) * CHUNK] for i in range(8))
    sent = server.stats["bytes_sent"]
    assert sent < 2 * size, f"{sent / size:.1f} whole objects sent for 8 concurrent reads"


@pytest.mark.parametrize("order", ["forward", "backward", "shuffled"])
def test_reads_one_after_the_other_near_the_end_take_one_pass(mount, server, order):
    """Eight 4 KiB keys near the end of an object whose server ignores Range, read one after the
    other (issue 25: eight passes): one pass serves them all, keeping the referenced blocks it goes
    past and waiting, its connection open, for a read further on."""
    size = 64 << 20
    data = write_blob(server, size=size)
    server.ignore_range = True
    offsets = [size - (9 - n) * (1 << 20) + 123 for n in range(8)]
    refs = {f"k{n}": [server.url_for("blob.bin"), offset, CHUNK] for n, offset in enumerate(offsets)}
    mnt = mount(refs, "--view", "raw")
    keys = list(range(8))
    if order == "backward":
        keys.reverse()
    elif order == "shuffled":
        random.Random(5).shuffle(keys)
    for n in keys:
        assert (mnt / f"k{n}").read_bytes() == data[offsets[n]:offsets[n] + CHUNK]
    sent = server.stats["bytes_sent"]
    assert sent <= 1.2 * size, f"{sent / size:.2f} passes over the object for 8 reads"


def test_a_read_past_max_full_download_gets_eio_and_one_log_line(mount, server):
    size = 16 << 20
    data = write_blob(server, size=size)
    server.ignore_range = True
    url = server.url_for("blob.bin")
    refs = {"near": [url, 1 << 20, CHUNK], "far": [url, 12 << 20, CHUNK], "farther": [url, 14 << 20, CHUNK]}
    mnt = mount(refs, "--view", "raw", "--max-full-download", "8M")
    assert (mnt / "near").read_bytes() == data[1 << 20:(1 << 20) + CHUNK]
    requests = server.stats["requests"]
    for _ in range(2):
        assert read_or_errno(mnt / "far") == errno.EIO
        assert read_or_errno(mnt / "farther") == errno.EIO
    # one ranged GET (a lone 200 so far could have been a passing fault), answered 200 again and
    # closed at once; then refused before asking the server for anything
    assert server.stats["requests"] <= requests + 1
    assert (mnt / "near").read_bytes() == data[1 << 20:(1 << 20) + CHUNK]  # the url itself did not fail
    lines = [line for line in mnt.log().splitlines() if "--max-full-download" in line]
    assert len(lines) == 1 and url in lines[0] and "8M" in lines[0], lines
