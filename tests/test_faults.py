"""Robustness: a server that fails, stalls, lies and changes; the mount never returns a wrong byte."""

from __future__ import annotations

import errno
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import is_mounted, run_refmount

CHUNK = 4096


@pytest.fixture
def blob(tmp_path_factory, http_data):
    """A 40 MB file of random bytes beside the datasets, served by the loopback server."""
    root = http_data.path_for(http_data.url_for("x")).parent
    path = root / "faults.bin"
    if not path.exists():
        path.write_bytes(random.Random(7).randbytes(10_000 * CHUNK))
    return path


def chunk_refs(url: str, n: int) -> dict:
    return {f"c/{i}": [url, i * CHUNK, CHUNK] for i in range(n)}


def read_all(mnt, n: int, workers: int = 64) -> dict[int, bytes | OSError]:
    def one(i):
        try:
            return i, (mnt / "c" / str(i)).read_bytes()
        except OSError as e:
            return i, e

    with ThreadPoolExecutor(workers) as pool:
        return dict(pool.map(one, range(n)))


def test_25_percent_faults_every_byte_right(mount, http_data, blob):
    """64 readers, 10,000 chunks, a quarter of all requests faulted (5xx, 429, resets, stalls,
    truncated bodies, wrong Content-Range, 200 full bodies): every read succeeds with the right bytes."""
    n = 10_000
    url = http_data.url_for(blob.name)
    mnt = mount(chunk_refs(url, n), "--view", "raw", "--block-size", "4K", "--no-prefetch",
                "--stall-timeout", "0.5", "--read-timeout", "60", "--connections", "16")
    http_data.set_faults(rate=0.25, stall_seconds=3, retry_after=0.05, seed=11)
    try:
        results = read_all(mnt, n)
    finally:
        http_data.clear_faults()
    data = blob.read_bytes()
    failures = {i: r for i, r in results.items() if isinstance(r, OSError)}
    assert not failures, list(failures.items())[:3]
    wrong = [i for i, r in results.items() if r != data[i * CHUNK:(i + 1) * CHUNK]]
    assert not wrong
    stats = mnt.stats()["fetch"]
    assert stats["retries"] > 1000 and stats["errors"] == 0


def test_permanent_failure_is_eio_within_read_timeout_and_daemon_keeps_serving(mount, http_data, blob):
    url = http_data.url_for(blob.name)
    refs = {**chunk_refs(url, 4), "bad/503": [http_data.url_for("always-503.bin"), 0, 10],
            "bad/404": [http_data.url_for("missing.bin"), 0, 10]}
    http_data.fail_paths = {"always-503.bin": 503}
    try:
        mnt = mount(refs, "--view", "raw", "--read-timeout", "2")
        started = time.monotonic()
        with pytest.raises(OSError) as e:
            (mnt / "bad" / "503").read_bytes()
        assert e.value.errno == errno.EIO
        assert time.monotonic() - started < 6
        http_data.reset_stats()  # (its log keeps the latest requests only: an index into it may not hold)
        with pytest.raises(OSError) as e:
            (mnt / "bad" / "404").read_bytes()
        # a 404 is not retried: one request (the kernel's retry of the read fails at once). Counted,
        # not timed: "within 1 s" is no promise on a loaded machine
        assert e.value.errno == errno.EIO
        assert [path for _, path, _ in http_data.stats["log"]] == ["/missing.bin"]
        assert (mnt / "c" / "1").read_bytes() == blob.read_bytes()[CHUNK:2 * CHUNK]
        log = mnt.log()
        assert "bad/503" in log and "HTTP 503" in log and "attempts" in log
        assert "bad/404" in log and "HTTP 404" in log
    finally:
        http_data.fail_paths = {}


def test_a_failed_read_is_said_once_and_another_file_of_its_url_is_said_too(mount, http_data):
    """A server answering 500 forever: the read gets EIO and the kernel re-issues it at once, which
    fails at once (the url failed a moment ago). That logged the same failure twice; now once. A read
    of another file of the same url is another line."""
    refs = {"a": [http_data.url_for("always-500.bin"), 0, 10], "b": [http_data.url_for("always-500.bin"), 10, 10]}
    http_data.fail_paths = {"always-500.bin": 500}
    try:
        mnt = mount(refs, "--view", "raw", "--read-timeout", "1")
        for name in ("a", "b"):
            with pytest.raises(OSError) as e:
                (mnt / name).read_bytes()
            assert e.value.errno == errno.EIO
    finally:
        http_data.fail_paths = {}
    said = [line for line in mnt.log().splitlines() if "ERROR" in line]
    assert [line.split(" failed: ")[0] for line in said] == ["refmount: ERROR: read of a",
                                                            "refmount: ERROR: read of b"], said
    assert "HTTP 500" in said[0] and "not retried yet" in said[1], said


def test_server_ignoring_range_is_sliced_correctly(mount, http_data, blob):
    url = http_data.url_for(blob.name)
    mnt = mount(chunk_refs(url, 64), "--view", "raw", "--block-size", "4K", "--no-prefetch")
    http_data.ignore_range = True
    try:
        data = blob.read_bytes()
        for i in (0, 5, 63):
            assert (mnt / "c" / str(i)).read_bytes() == data[i * CHUNK:(i + 1) * CHUNK]
    finally:
        http_data.ignore_range = False


def test_changed_remote_object_is_eio_not_mixed_bytes(mount, http_data, tmp_path):
    root = http_data.path_for(http_data.url_for("x")).parent
    path = root / "changing.bin"
    path.write_bytes(b"A" * 3 * CHUNK)
    url = http_data.url_for(path.name)
    mnt = mount(chunk_refs(url, 3), "--view", "raw", "--block-size", "4K", "--no-prefetch")
    assert (mnt / "c" / "0").read_bytes() == b"A" * CHUNK
    time.sleep(0.01)
    path.write_bytes(b"B" * 4 * CHUNK)  # new size and ETag
    with pytest.raises(OSError) as e:
        (mnt / "c" / "1").read_bytes()
    assert e.value.errno == errno.EIO
    assert "changed" in mnt.log()


def test_remote_refs_cannot_read_local_files_by_default(tmp_path, http_data):
    root = http_data.path_for(http_data.url_for("x")).parent
    (root / "evil.json").write_text('{"shadow": ["/etc/shadow", 0, 100], "p": ["file:///etc/passwd"]}')
    mnt = tmp_path / "m"
    mnt.mkdir()
    result = run_refmount("mount", http_data.url_for("evil.json"), mnt)
    assert result.returncode != 0 and "/etc/" in result.stderr and "--allow-protocols" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not is_mounted(mnt)


def test_allow_protocols_refuses_others(tmp_path):
    refs = tmp_path / "r.json"
    refs.write_text('{"a": ["s3://bucket/key", 0, 1]}')
    (tmp_path / "m").mkdir()  # an empty mountpoint: a non-empty one is refused before loading
    result = run_refmount("mount", "--allow-protocols", "https", refs, tmp_path / "m")
    assert result.returncode != 0 and "'s3'" in result.stderr and "s3://bucket/key" in result.stderr


def test_credentials_never_logged(mount, http_data, blob):
    url = http_data.url_for("missing-secret.bin").replace("http://", "http://user:hunter2@") + "?token=s3cr3t"
    mnt = mount({"k": [url, 0, 5]}, "--view", "raw", "--read-timeout", "1")
    with pytest.raises(OSError):
        (mnt / "k").read_bytes()
    assert "hunter2" not in mnt.log() and "s3cr3t" not in mnt.log() and "***" in mnt.log()
    assert b"hunter2" not in os.getxattr(mnt / "k", "user.refmount.url")


def test_sigkill_then_mount_again_recovers(tmp_path, datasets):
    from tests.support.datasets import kerchunk_refs, write_refs

    refs = tmp_path / "refs.json"
    write_refs(kerchunk_refs(datasets["zlib"]), refs)
    mnt = tmp_path / "m"
    mnt.mkdir()
    try:
        assert run_refmount("mount", refs, mnt).returncode == 0
        pid = int(os.getxattr(mnt, "user.refmount.pid"))
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        with pytest.raises(OSError) as e:
            os.statvfs(mnt)
        assert e.value.errno == errno.ENOTCONN
        result = run_refmount("mount", refs, mnt)
        assert result.returncode == 0, result.stderr
        assert (mnt / ".zgroup").exists()
        assert run_refmount("umount", mnt).returncode == 0
        assert not is_mounted(mnt)
        # and umount of a dead daemon works too
        assert run_refmount("mount", refs, mnt).returncode == 0
        os.kill(int(os.getxattr(mnt, "user.refmount.pid")), signal.SIGKILL)
        time.sleep(0.3)
        assert run_refmount("umount", mnt).returncode == 0 and not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            os.system(f"fusermount3 -u -z {mnt}")


def test_a_fetcher_remembers_a_bounded_number_of_failures_without_their_tracebacks(monkeypatch):
    """A listing of 100,000 missing chunks once held every 404's error and traceback (1.3 GB): what is
    kept is its kind and message, for at most _FAILURES_KEPT urls; a retry within the window still
    fails at once, as the same kind."""
    import trio

    import refmount.fetch as fetch
    from refmount.errors import NotFound

    monkeypatch.setattr(fetch, "_FAILURES_KEPT", 100)
    fetcher = fetch.Fetcher()

    async def missing():
        raise NotFound("http://x/a: 404")

    async def main():
        for n in range(250):
            with pytest.raises(NotFound):
                await fetcher._remembering_failure(f"http://x/{n}", missing)
        assert len(fetcher._failed) <= 100
        assert all(not isinstance(kept, BaseException) for entry in fetcher._failed.values() for kept in entry)

        async def not_called():
            raise AssertionError("asked again within the window")

        with pytest.raises(NotFound, match="not retried yet"):
            await fetcher._remembering_failure("http://x/249", not_called)

    trio.run(main)
