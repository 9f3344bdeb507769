"""`--metrics`: a real Prometheus scrapes a mount that reads from two real nginx servers, and what it
reports through its HTTP API matches the servers' access logs (requests, bytes) and what the test
read (bytes served); `refmount stats` shows the same figures. A port in use fails the mount."""

from __future__ import annotations

import errno
import json
import os
import random
import socket
import time

import pytest

from tests.conftest import is_mounted, run_refmount
from tests.support.nginx import Nginx, free_port
from tests.support.prometheus import Prometheus
from tests.support.refusals import refusal_line

CHUNK = 192 << 10
# method, uri, Range header, status, body bytes sent
LOG_FORMAT = "$request_method $uri \"$http_range\" $status $body_bytes_sent"


def parse_log(server: Nginx) -> list[tuple[str, str, str, int, int]]:
    rows = []
    for line in server.access_log():
        method, uri, rest = line.split(" ", 2)
        rng, status, sent = rest.rsplit(" ", 2)
        rows.append((method, uri, rng.strip('"'), int(status), int(sent)))
    return rows


def write_refs(path, a: Nginx, b: Nginx) -> dict[str, int]:
    """A reference set of chunks on both servers (and one on a missing object); {key: length}."""
    refs, sizes = {".zgroup": json.dumps({"zarr_format": 2})}, {}
    for name, server, count in (("v", a, 24), ("w", b, 10)):
        refs[f"{name}/.zarray"] = json.dumps({"shape": [count * CHUNK], "chunks": [CHUNK], "dtype": "|u1",
                                              "compressor": None, "fill_value": 0, "filters": None, "order": "C",
                                              "zarr_format": 2})
        for i in range(count):
            refs[f"{name}/{i}"] = [f"{server.url}/{name}.bin", i * CHUNK, CHUNK]
            sizes[f"{name}/{i}"] = CHUNK
    refs["gone/.zarray"] = refs["w/.zarray"]
    refs["gone/0"] = [f"{a.url}/missing.bin", 0, CHUNK]
    refs["busy/.zarray"] = refs["w/.zarray"]
    refs["busy/0"] = [f"{a.url}/busy.bin", 0, CHUNK]  # always 503: retried until --read-timeout
    path.write_text(json.dumps({"version": 1, "refs": refs}))
    return sizes


def wait_quiet(m, timeout: float = 10.0) -> dict:
    """The mount's stats once nothing is in flight and the request count held still for 0.5 s."""
    deadline = time.monotonic() + timeout
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        stats = m.stats()
        now = (stats["fetch"]["requests"], stats["cache"]["inflight"], stats["memory"]["inflight"])
        if now != last:
            last, since = now, time.monotonic()
        elif now[1] == now[2] == 0 and time.monotonic() - since >= 0.5:
            return stats
        time.sleep(0.1)
    raise AssertionError(f"the mount did not go quiet: {last}")


def near(a: float, b: float) -> bool:
    return abs(a - b) <= 0.01 * max(a, b)


def test_prometheus_scrape_matches_the_servers_logs(tmp_path, mount):
    rng = random.Random(33)
    roots = {}
    for name, size in (("a", 24 * CHUNK), ("b", 10 * CHUNK)):
        roots[name] = tmp_path / f"www-{name}"
        (roots[name] / "data").mkdir(parents=True)
    (roots["a"] / "data" / "v.bin").write_bytes(rng.randbytes(24 * CHUNK))
    (roots["b"] / "data" / "w.bin").write_bytes(rng.randbytes(10 * CHUNK))
    port = free_port()
    with Nginx(roots["a"], f"root {roots['a'] / 'data'}; location = /busy.bin {{ return 503; }}", LOG_FORMAT) as a, \
            Nginx(roots["b"], f"root {roots['b'] / 'data'};", LOG_FORMAT) as b, \
            Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{port}"]) as prom:
        refs = tmp_path / "refs.json"
        write_refs(refs, a, b)
        m = mount(refs, "--view", "raw", "--metrics", str(port), "--read-timeout", "2")
        m.wait_announced()
        read = 0
        for i in range(24):  # a scan: the read-ahead fetches ahead of it
            read += len((m / f"v/{i}").read_bytes())
        for i in rng.sample(range(10), 6):  # chunks at random
            read += len((m / f"w/{i}").read_bytes())
        with pytest.raises(OSError) as e:
            (m / "gone/0").read_bytes()
        assert e.value.errno == errno.EIO
        with pytest.raises(OSError) as e:
            (m / "busy/0").read_bytes()
        assert e.value.errno == errno.EIO
        assert read == 24 * CHUNK + 6 * CHUNK
        stats = wait_quiet(m)

        hosts = {f"127.0.0.1:{a.port}": a, f"127.0.0.1:{b.port}": b}
        deadline = time.monotonic() + 15  # until a scrape after the reads has landed
        while True:
            requests = prom.values('refmount_fetch_requests_total{mountpoint="%s"}' % m.path, "host")
            fetched = prom.values("refmount_fetch_bytes_total", "host")
            served = prom.values("refmount_served_bytes_total", "mountpoint")
            if (all(requests.get(h) == stats["hosts"][h]["requests"] for h in hosts)
                    and all(fetched.get(h) == stats["hosts"][h]["bytes"] for h in hosts)
                    and served.get(str(m.path)) == read):
                break
            assert time.monotonic() < deadline, f"prometheus {requests} {fetched} {served}; stats {stats['hosts']}"
            time.sleep(0.2)

        for host, server in hosts.items():
            log = parse_log(server)
            got = [row for row in log if row[3] in (200, 206)]
            print(host, f"nginx: {len(log)} requests, {sum(r[4] for r in got):,} bytes;",
                  f"prometheus: {requests[host]:.0f} requests, {fetched[host]:,.0f} bytes")
            assert near(requests[host], len(log)), (host, requests[host], log)
            assert near(fetched[host], sum(r[4] for r in got)), host
            assert all(r[2].startswith("bytes=") or r[0] == "HEAD" for r in log), log  # ranged, as asked
        # the scan's read-ahead fetched chunks before they were asked for, and they were used
        used = prom.values("refmount_readahead_used_bytes_total", "mountpoint")[str(m.path)]
        assert 0 < used <= fetched[f"127.0.0.1:{a.port}"]
        # the missing object: one 404 in the log, one http_4xx error in the metrics; the busy one:
        # 503s retried, then one http_5xx error
        errors = prom.values('refmount_fetch_errors_total{host="127.0.0.1:%d"}' % a.port, "kind")
        assert errors.get("http_4xx") == sum(1 for r in parse_log(a) if r[3] == 404) == 1, errors
        assert errors.get("http_5xx") == 1, errors
        busy = sum(1 for r in parse_log(a) if r[3] == 503)
        retries = prom.values("refmount_fetch_retries_total", "host")
        assert busy >= 2 and retries[f"127.0.0.1:{a.port}"] == busy - 1, (busy, retries)
        # latency histograms: every fetch in the +Inf bucket, and the bounds are cumulative
        for host in hosts:
            buckets = prom.values('refmount_fetch_duration_seconds_bucket{host="%s"}' % host, "le")
            count = prom.values('refmount_fetch_duration_seconds_count{host="%s"}' % host, "host")[host]
            assert buckets["+Inf"] == count > 0
            ordered = [buckets[le] for le in sorted(buckets, key=lambda le: float(le))]
            assert ordered == sorted(ordered)
        hits = prom.values("refmount_cache_hits_total", "cache")
        assert hits["memory"] == stats["cache"]["hits"] > 0
        assert prom.values("up", "job")["refmount"] == 1

        # `refmount stats` shows the same figures
        shown = run_refmount("stats", "--json", m.path)
        assert shown.returncode == 0, shown.stderr
        shown = json.loads(shown.stdout)
        for host in hosts:
            assert shown["hosts"][host]["requests"] == requests[host]
            assert shown["hosts"][host]["bytes"] == fetched[host]
        assert shown["served"]["reader_bytes"] == read
        text = run_refmount("stats", m.path).stdout  # the registry's families, as --metrics has them
        assert "refmount_fetch_duration_seconds (histogram): " in text and "fetches, mean" in text
        assert "refmount_served_bytes_total (counter): " in text and f"  {read:,}" in text
        m.stop()
    assert not is_mounted(m.path)


def test_metrics_port_in_use_fails_the_mount(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        refs = tmp_path / "refs.json"
        refs.write_text(json.dumps({"version": 1, "refs": {"a": "x"}}))
        mnt = tmp_path / "mnt"
        line = refusal_line(refs, mnt, "--metrics", f"127.0.0.1:{port}", timeout=60)
        assert "--metrics 127.0.0.1:" in line and "in use" in line, line
        assert not is_mounted(mnt) and os.listdir(mnt) == []
    result = run_refmount("mount", "--metrics", "port", refs, mnt)
    assert result.returncode == 2 and "--metrics" in result.stderr and "Traceback" not in result.stderr


def test_error_kinds_and_addresses():
    import argparse

    from refmount.cli import parse_address
    from refmount.errors import FetchError, ReadRefused, RemoteChanged
    from refmount.fetch.stats import error_kind

    assert error_kind("HTTP 503") == "http_5xx"
    assert error_kind(FetchError("http://h/x: HTTP 404 Not Found")) == "http_4xx"
    assert error_kind("timed out (connection stalled)") == "timeout"
    assert error_kind(TimeoutError()) == "timeout"
    assert error_kind("ClientConnectorError: Cannot connect to host h:80") == "connection"
    assert error_kind("ConnectionResetError: [Errno 104] Connection reset by peer") == "connection"
    assert error_kind("Content-Range 'bytes 0-9/99' does not match the requested bytes=0-19") == "protocol"
    assert error_kind(RemoteChanged("x: the remote object changed while mounted (ETag a -> b)")) == "changed"
    assert error_kind(ReadRefused("x ignores Range", once="x")) == "refused"
    assert parse_address("9101") == parse_address(":9101") == ("127.0.0.1", 9101)
    assert parse_address("0.0.0.0:9101") == ("0.0.0.0", 9101)
    assert parse_address("[::1]:9101") == ("::1", 9101)
    for bad in ("0", "70000", "a:b", "1.2.3.4:", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_address(bad)


def test_exposition_escapes_labels():
    from refmount.fuse.metrics import exposition

    text = exposition({"mountpoint": '/mnt/a "b"\\c', "served": {"reader_bytes": 5, "reader_reads": 1},
                       "grid_readahead": {"predicted": 3, "used_bytes": 7, "per_axis": {"time": 2}, "pending": 4}})
    assert 'refmount_served_bytes_total{mountpoint="/mnt/a \\"b\\"\\\\c"} 5' in text
    assert "# TYPE refmount_grid_readahead_predicted_total counter" in text
    assert "refmount_grid_readahead_per_axis_time_total{" in text
    assert "# TYPE refmount_grid_readahead_pending gauge" in text and "pending_total" not in text


def test_stats_and_metrics_print_the_same_registry():
    """`refmount stats` and --metrics show the same families (each registered once by its component,
    with its kind and help) and the same samples; a family is registered once, typed."""
    from refmount.fuse.metrics import exposition
    from refmount.fetch.registry import REGISTRY, at, load_components, register, text

    stats = {"mountpoint": "/m", "keys": 7, "served": {"reader_bytes": 5, "reader_reads": 1, "bytes": 4},
             "hosts": {"h:1": {"requests": 3, "bytes": 9, "retries": 0, "errors": {"http_5xx": 1}, "in_flight": 0,
                               "parallel": 4, "latency_seconds": {"buckets": {"0.1": 2, "+Inf": 3}, "sum": 0.5,
                                                                  "count": 3}}},
             "cache": {"hits": 2, "misses": 1, "evictions": 0, "bytes": 10, "capacity": 20},
             "memory": {"budget": 100, "used": 10, "prefetch_wasted": 0, "rss": 1 << 20},
             "logins": {"logins": {"h:1": 1}, "cookies": 0}, "readahead": {"used_bytes": 3, "pending": 1}}
    shown = text(stats)
    exported = exposition(stats)
    in_text = [line.split(" ", 1)[0] for line in shown.splitlines() if not line.startswith(" ")]
    in_metrics = [line.split()[2] for line in exported.splitlines() if line.startswith("# TYPE ")]
    assert in_text == in_metrics and len(in_text) > 20, (in_text, in_metrics)
    kinds = {line.split()[2]: line.split()[3] for line in exported.splitlines() if line.startswith("# TYPE ")}
    for line in shown.splitlines():
        if not line.startswith(" "):
            name, kind = line.split(" ", 2)[:2]
            assert kinds[name] == kind.strip("():"), line
    assert 'refmount_fetch_errors_total{mountpoint="/m",host="h:1",kind="http_5xx"} 1' in exported
    assert '  {host="h:1",kind="http_5xx"} 1' in shown
    assert "refmount_readahead_pending (gauge)" in shown and "refmount_readahead_used_bytes_total (counter)" in shown
    load_components()
    with pytest.raises(ValueError):
        register("refmount_fetch_requests_total", "gauge", "again, as another kind", collect=at("x"))
    with pytest.raises(ValueError):
        register("refmount_things", "counter", "a counter not named *_total", collect=at("x"))
    assert len({f.name for f, _ in REGISTRY.collect(stats)}) == len(in_metrics)
