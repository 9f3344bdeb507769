"""The core mount: kerchunk sets of real files, read through real FUSE, byte-compared to oracles."""

from __future__ import annotations

import errno
import os
import signal

import pytest

from tests.conftest import force_unmount, is_mounted, run_refmount
from tests.support.datasets import (gen_refs_for_contiguous, kerchunk_refs, oracle_bytes, retarget, to_v0,
                                    write_refs)


def listed_keys(root) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in filenames:
            out.add(name if rel == "." else f"{rel}/{name}")
    return out


def assert_mount_matches(mnt, refs, url_to_path=None):
    """ls -R lists exactly the keys (plus the consolidated metadata the raw view adds when the set has
    none); every st_size equals the bytes a read returns and the oracle."""
    v0 = to_v0(refs)
    assert listed_keys(mnt.path) == set(v0) | {".zmetadata"}
    if ".zmetadata" not in v0:
        import json

        consolidated = json.loads((mnt / ".zmetadata").read_bytes())["metadata"]
        assert consolidated == {k: json.loads(oracle_bytes(v0, k)) for k in v0
                                if k.rpartition("/")[2] in (".zarray", ".zattrs", ".zgroup")}
    for key in v0:
        path = mnt / key
        data = path.read_bytes()
        expected = oracle_bytes(v0, key, **({"url_to_path": url_to_path} if url_to_path else {}))
        if key.endswith((".zarray", ".zattrs", ".zgroup")) and not isinstance(v0[key], str):
            import json

            assert json.loads(data) == json.loads(expected), key
        else:
            assert data == expected, key
        assert os.stat(path).st_size == len(data), key


@pytest.mark.parametrize("kind", ["zlib", "groups", "missing", "bigendian", "air"])
def test_local_targets_byte_identical(mount, datasets, kind):
    refs = kerchunk_refs(datasets[kind])
    assert_mount_matches(mount(refs, "--view", "raw"), refs)


@pytest.mark.parametrize("kind", ["shuffle_zlib", "unlimited", "air"])
def test_http_targets_byte_identical(mount, datasets, http_data, kind):
    refs = kerchunk_refs(datasets[kind], url=http_data.url_for(datasets[kind].name))
    assert_mount_matches(mount(refs, "--view", "raw"), refs, url_to_path=http_data.path_for)


def test_v0_and_file_urls_and_inline(mount, datasets):
    refs = to_v0(kerchunk_refs(datasets["zstd"], inline_threshold=300))
    refs = retarget(refs, "file://" + str(datasets["zstd"]))
    assert_mount_matches(mount(refs, "--view", "raw"), refs)


def test_v1_templates_and_gen_over_http(mount, datasets, http_data):
    refs = gen_refs_for_contiguous(datasets["contiguous"], url=http_data.url_for(datasets["contiguous"].name))
    assert "gen" in refs and "templates" in refs
    assert_mount_matches(mount(refs, "--view", "raw"), refs, url_to_path=http_data.path_for)


def test_gzip_reference_file_served_over_http(mount, datasets, http_data):
    refs = kerchunk_refs(datasets["groups"], url=http_data.url_for(datasets["groups"].name))
    root = datasets["groups"].parent
    write_refs(refs, root / "groups-refs.json.gz")
    mnt = mount(http_data.url_for("groups-refs.json.gz"), "--view", "raw")
    assert_mount_matches(mnt, refs, url_to_path=http_data.path_for)


def test_whole_file_reference_size_from_head(mount, datasets, http_data):
    name = datasets["air"].name
    refs = {"whole": [http_data.url_for(name)], "local": [str(datasets["zlib"])], "part": [http_data.url_for(name), 10, 0]}
    mnt = mount(refs, "--view", "raw")
    assert os.stat(mnt / "whole").st_size == datasets["air"].stat().st_size
    assert (mnt / "whole").read_bytes() == datasets["air"].read_bytes()
    assert (mnt / "local").read_bytes() == datasets["zlib"].read_bytes()
    assert (mnt / "part").read_bytes() == b"" and os.stat(mnt / "part").st_size == 0
    assert os.getxattr(mnt / "whole", "user.refmount.url").decode() == http_data.url_for(name)


def test_a_mount_looks_up_the_sizes_of_a_few_whole_files_at_once(mount, server):
    """A stat of a whole-file reference needs its object's size: a mount of a few looks them up as
    it starts, without waiting for them (at 80 ms a first `dd` waited 0.16 s for it); a mount of
    many looks each up on first use, as before."""
    import time

    for k in range(20):
        (server.root / f"{k}.bin").write_bytes(bytes([k]) * (1000 + k))

    def requests_unasked(refs: dict, expected: int, wait: float) -> int:
        """The requests the mount makes before anything in it is used: counted once `expected` are
        in, or `wait` s after the mount's announcement (the lookups start when the client is warm,
        as the mount is announced). A few are looked up without waiting for a read, not within a
        given time: on a loaded 2-core machine 3 lookups took more than 2 s (3 of 8 runs), so the
        mount of a few waits for them as long as it may take; the mount of many, which must make
        none, is watched for 2 s (a lookup made later would go unseen, never fail the test)."""
        server.reset_stats()
        mnt = mount(refs, "--view", "raw").wait_announced()
        deadline = time.monotonic() + wait
        while server.stats["requests"] < max(expected, 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        made = server.stats["requests"]
        for key, ref in refs.items():  # and every file still reads right
            k = int(ref[0].rsplit("/", 1)[1].split(".")[0])
            assert (mnt / key).read_bytes() == bytes([k]) * (1000 + k)
        return made

    assert requests_unasked({f"w{k}": [server.url_for(f"{k}.bin")] for k in range(3)}, 3, wait=60) == 3
    assert requests_unasked({f"w{k}": [server.url_for(f"{k}.bin")] for k in range(20)}, 0, wait=2) == 0


def test_read_only_everywhere(mount, datasets):
    mnt = mount(kerchunk_refs(datasets["zlib"]), "--view", "raw")
    key = next(p for p in mnt.path.rglob("*") if p.is_file())
    for attempt in (lambda: open(key, "r+b"), lambda: open(mnt / "new", "wb"), lambda: os.mkdir(mnt / "d"),
                    lambda: os.rename(key, mnt / "renamed"), lambda: os.unlink(key), lambda: os.chmod(key, 0o644),
                    lambda: os.setxattr(key, "user.x", b"1")):
        with pytest.raises(OSError) as e:
            attempt()
        assert e.value.errno == errno.EROFS
    st = os.stat(key)
    assert st.st_mode & 0o777 == 0o444 and os.stat(mnt.path).st_mode & 0o777 == 0o555


def test_inodes_are_stable(mount, datasets):
    mnt = mount(kerchunk_refs(datasets["groups"]), "--view", "raw")
    before = {p: p.stat().st_ino for p in mnt.path.rglob("*")}
    os.system("echo 2 > /proc/sys/vm/drop_caches 2>/dev/null")
    assert {p: p.stat().st_ino for p in mnt.path.rglob("*")} == before
    assert len(set(before.values())) == len(before)


def test_background_mount_and_umount(tmp_path, datasets):
    refs_path = tmp_path / "refs.json"
    write_refs(kerchunk_refs(datasets["zlib"]), refs_path)
    mnt = tmp_path / "bg"
    mnt.mkdir()
    try:
        result = run_refmount("mount", "--view", "raw", refs_path, mnt)
        assert result.returncode == 0, result.stderr
        assert is_mounted(mnt) and (mnt / ".zgroup").read_bytes()
        pid = int(os.getxattr(mnt, "user.refmount.pid"))
        result = run_refmount("umount", mnt)
        assert result.returncode == 0, result.stderr
        assert not is_mounted(mnt)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    finally:
        force_unmount(mnt)


def test_sigterm_unmounts_cleanly(mount, datasets):
    mnt = mount(kerchunk_refs(datasets["zlib"]), "--view", "raw")
    mnt.proc.send_signal(signal.SIGTERM)
    assert mnt.proc.wait(timeout=15) == 0
    assert not is_mounted(mnt.path)


def test_sigterm_while_the_mount_comes_up(tmp_path):
    """A signal at any moment of start-up, also while the daemon's own readiness stat waits for its
    main loop: the daemon exits and leaves nothing mounted (it used to hang in that stat)."""
    import subprocess
    import sys
    import time

    refs = tmp_path / "refs.json"
    refs.write_text('{".zgroup": "{\\"zarr_format\\": 2}", "a": "x"}')
    for attempt in range(8):
        mnt = tmp_path / f"mnt{attempt}"
        mnt.mkdir()
        proc = subprocess.Popen([sys.executable, "-m", "refmount", "mount", "--foreground", str(refs), str(mnt)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not is_mounted(mnt) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.002 * attempt)  # from right as the mount appears to when it answers
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) is not None
            assert not is_mounted(mnt)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            force_unmount(mnt)


@pytest.mark.parametrize("case", ["bad-json", "bad-key", "missing-file", "no-mountpoint", "bad-option", "not-a-dir",
                                  "bad-cache-dir"])
def test_failed_mounts_are_one_line_and_leave_nothing(tmp_path, case):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    refs = tmp_path / "refs.json"
    refs.write_text('{"ok": "x"}')
    args = [refs, mnt]
    if case == "bad-json":
        refs.write_text('{"version": 1, "refs": {"a": ["http://h/x", 0, ')
    elif case == "bad-key":
        refs.write_text('{"a/../b": "x"}')
    elif case == "missing-file":
        args = [tmp_path / "nope.json", mnt]
    elif case == "no-mountpoint":
        args = [refs, tmp_path / "nowhere"]
    elif case == "bad-option":
        args = ["--cache-size", "lots", refs, mnt]
    elif case == "not-a-dir":
        args = [refs, refs]
    elif case == "bad-cache-dir":
        args = ["--cache-dir", refs / "cache", refs, mnt]  # below a file
    result = run_refmount("mount", *args, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("refmount: ")
    assert not is_mounted(mnt)
    culprit = {"bad-json": "truncated", "bad-key": "a/../b", "missing-file": "nope.json", "no-mountpoint": "nowhere",
               "bad-option": "--cache-size", "not-a-dir": "not a directory", "bad-cache-dir": "--cache-dir"}[case]
    assert culprit in lines[0]


def test_help_documents_every_option():
    result = run_refmount("mount", "--help")
    for option in ("--view", "--foreground", "--cache-size", "--remote-options", "--read-timeout", "--allow-other",
                   "--allow-protocols", "--max-keys", "--log-level", "--dry-run", "--no-prefetch", "--cache-dir",
                   "--disk-cache-size"):
        assert option in result.stdout
    assert run_refmount("--version").stdout.startswith("refmount ")


def test_concurrent_readers_share_fetches(mount, datasets, http_data):
    """Many readers of the same chunks through real FUSE: bytes right, fetched once (single-flight)."""
    from concurrent.futures import ThreadPoolExecutor

    refs = kerchunk_refs(datasets["air"], url=http_data.url_for(datasets["air"].name))
    mnt = mount(refs, "--view", "raw")
    key = mnt / "air" / "0.0.0"
    expected = oracle_bytes(refs, "air/0.0.0", url_to_path=http_data.path_for)
    http_data.reset_stats()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda _: key.read_bytes(), range(32)))
    assert all(r == expected for r in results)
    assert http_data.stats["requests"] <= 2


def test_a_chunk_file_is_read_in_one_piece(mount, server):
    """A file of up to 1 MiB (a chunk file) shows a st_blksize that holds it, in a listing and in a
    stat: `cat` reads it in one piece, which the kernel asks of the mount as one read (not a
    readahead window and then the rest). Smaller and bigger files keep 128 KiB. Bytes as the file's."""
    import json
    import random
    import subprocess

    data = random.Random(39).randbytes(3 << 20)
    (server.root / "data.bin").write_bytes(data)
    url = server.url_for("data.bin")
    sizes = {"small": (7, 5000), "chunk": (100, 640_000), "whole": (200, 1 << 20), "big": (0, 3_000_000)}
    mnt = mount({"version": 1, "refs": {key: [url, start, length] for key, (start, length) in sizes.items()}},
                "--view", "raw")
    expected = {"small": 128 << 10, "chunk": 1 << 20, "whole": 1 << 20, "big": 128 << 10}
    with os.scandir(mnt.path) as listing:  # (the listing's attributes, READDIRPLUS)
        listed = {e.name: e.stat().st_blksize for e in listing if e.name in sizes}
    assert listed == expected
    assert {key: os.stat(mnt / key).st_blksize for key in sizes} == expected

    def reads() -> int:
        return json.loads(os.getxattr(mnt.path, "user.refmount.stats"))["served"]["reads"]

    before = reads()
    out = subprocess.run(["cat", str(mnt / "chunk")], capture_output=True, timeout=60).stdout
    assert out == data[100:640_100]
    assert reads() - before == 1
    for key, (start, length) in sizes.items():
        assert (mnt / key).read_bytes() == data[start:start + length], key
