"""The persistent disk cache (--cache-dir): blocks survive a remount and are served without the
remote, a changed remote object is never mixed with its cached bytes, corrupt blocks are refetched,
the size bound holds, and a full disk degrades to memory-only caching."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from refmount.cache.disk import HEADER_SIZE, LAYOUT, DiskCache
from refmount.errors import RefmountError
from tests.conftest import force_unmount, run_refmount

MiB = 1 << 20


def write_blob(server, name: str, size: int, seed: int) -> bytes:
    data = (bytes(range(256)) * (size // 256 + 1))[:size]
    data = bytes((b + seed) % 256 for b in data[:4096]) + data[4096:]
    (server.root / name).write_bytes(data)
    return data


def chunk_refs(url: str, size: int, chunk: int) -> dict:
    refs = {".zgroup": '{"zarr_format": 2}', "whole": [url]}
    refs.update({f"c/{k}": [url, k * chunk, min(chunk, size - k * chunk)] for k in range((size + chunk - 1) // chunk)})
    return refs


def read_all(mnt, refs: dict) -> dict[str, bytes]:
    return {key: (mnt / key).read_bytes() for key in refs}


def data_gets(server) -> int:
    return sum(1 for method, _, _ in server.stats["log"] if method == "GET")


def blocks_on_disk(cache_dir: Path) -> list[Path]:
    return [p for p in (cache_dir / LAYOUT).glob("*/*/*") if p.is_file()]


def test_blocks_survive_a_remount_and_are_served_without_the_remote(mount, server, tmp_path):
    size = 5 * MiB + 123
    data = write_blob(server, "a.bin", size, seed=1)
    refs = chunk_refs(server.url_for("a.bin"), size, 300_000)
    cache_dir = tmp_path / "cache"
    first = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    got = read_all(first, refs)
    assert got["whole"] == data
    first.stop()
    assert data_gets(server) > 0
    assert sum(p.stat().st_size for p in blocks_on_disk(cache_dir)) == size + HEADER_SIZE * 6

    server.reset_stats()
    second = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    again = read_all(second, refs)
    assert again == got
    for key, value in refs.items():
        if isinstance(value, list) and len(value) == 3:
            assert again[key] == data[value[1] : value[1] + value[2]], key
    assert data_gets(server) == 0  # only the validator check (HEAD) reached the server
    disk = second.stats()["disk"]
    assert disk["hits"] >= 6 and disk["corrupt"] == 0


def test_changed_remote_object_is_never_mixed_with_cached_bytes(mount, server, tmp_path):
    size = 3 * MiB
    write_blob(server, "b.bin", size, seed=1)
    refs = chunk_refs(server.url_for("b.bin"), size, MiB)
    cache_dir = tmp_path / "cache"
    first = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    read_all(first, refs)
    first.stop()

    new = write_blob(server, "b.bin", size, seed=7)  # same size, new bytes, new ETag
    second = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    assert (second / "whole").read_bytes() == new
    assert (second / "c/0").read_bytes() == new[:MiB]


def cached_then_corrupted(mount, server, tmp_path, name: str, size: int, block: int, at: int):
    """An object read whole through a mount with --cache-dir, then byte `at` of its block file
    `block` flipped: (its bytes, refs, the cache directory)."""
    data = write_blob(server, name, size, seed=3)
    refs = {"whole": [server.url_for(name)]}
    cache_dir = tmp_path / "cache"
    first = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    assert (first / "whole").read_bytes() == data
    first.stop()
    victim = next(p for p in blocks_on_disk(cache_dir) if p.name == str(block))
    raw = bytearray(victim.read_bytes())
    raw[at] ^= 0xFF
    victim.write_bytes(bytes(raw))
    return data, refs, cache_dir


def test_corrupt_block_is_dropped_and_fetched_again(mount, server, tmp_path):
    data, refs, cache_dir = cached_then_corrupted(mount, server, tmp_path, "c.bin", 2 * MiB, block=0, at=1000)
    second = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    assert (second / "whole").read_bytes() == data
    stats = second.stats()
    assert stats["disk"]["corrupt"] == 1
    assert "failed its checksum" in second.log()


def test_a_sequential_re_read_after_a_remount_is_exact_and_a_bad_block_is_refetched(mount, server, tmp_path):
    # Big enough for read-ahead parts of several blocks loaded from disk: the block that fails its
    # check (inside such a part) comes from the remote, once, and is never served.
    data, refs, cache_dir = cached_then_corrupted(mount, server, tmp_path, "s.bin", 24 * MiB + 777, block=9,
                                                  at=HEADER_SIZE + 5000)
    server.reset_stats()
    second = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    with open(second / "whole", "rb", buffering=0) as f:
        got = b"".join(iter(lambda: f.read(MiB), b""))
    assert got == data
    assert second.stats()["disk"]["corrupt"] == 1
    assert [(method, rng) for method, _, rng in server.stats["log"] if method == "GET"] == [
        ("GET", f"bytes={9 * MiB}-{10 * MiB - 1}")]
    second.stop()

    server.reset_stats()
    third = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    assert (third / "whole").read_bytes() == data
    assert data_gets(server) == 0 and third.stats()["disk"]["corrupt"] == 0


def test_full_disk_degrades_to_memory_only(mount, server, tmp_path):
    size = 6 * MiB
    data = write_blob(server, "d.bin", size, seed=5)
    refs = chunk_refs(server.url_for("d.bin"), size, MiB)
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        m = mount(refs, "--view", "raw", "--cache-dir", str(small), "--disk-cache-size", "100M")
        assert (m / "whole").read_bytes() == data
        assert read_all(m, refs)["c/5"] == data[5 * MiB :]
        assert not m.stats()["disk"]["enabled"]
        assert "No space left on device; caching in memory only" in m.log()
        m.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_cache_dir_of_a_running_mount_is_refused_in_one_line(mount, server, tmp_path):
    refs = {"whole": [server.url_for("e.bin")]}
    write_blob(server, "e.bin", 1000, seed=0)
    cache_dir = tmp_path / "cache"
    mount(refs, "--cache-dir", str(cache_dir))
    other = tmp_path / "other"
    other.mkdir()
    try:
        r = run_refmount("mount", "--cache-dir", cache_dir, refs_file(tmp_path, refs), other)
    finally:
        force_unmount(other)
    assert r.returncode != 0
    assert "--cache-dir" in r.stderr and "in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def refs_file(tmp_path, refs) -> Path:
    path = tmp_path / "refs-extra.json"
    path.write_text(json.dumps(refs))
    return path


# -- without a mount ----------------------------------------------------------------------------------

def test_size_bound_evicts_least_recently_used_across_restarts(tmp_path):
    cache = DiskCache(str(tmp_path), capacity=3 * (1000 + HEADER_SIZE), block_size=1000)
    obj = cache.object_id("http://x/y", "etag 1")
    for index in range(3):
        cache.store(obj, index, bytes([index]) * 1000)
    os.utime(cache.root + f"/{obj[:2]}/{obj}/0", ns=(0, 1))  # block 0 is the oldest ...
    assert cache.load(obj, 0) == bytes([0]) * 1000          # ... until read
    cache.store(obj, 3, b"\3" * 1000)
    assert cache.load(obj, 1) is None  # block 1 was the least recently used
    assert cache.statistics()["evictions"] == 1
    cache.close()

    reopened = DiskCache(str(tmp_path), capacity=2 * (1000 + HEADER_SIZE), block_size=1000)
    assert reopened.statistics()["blocks"] == 2  # shrunk bound applied at start, oldest dropped
    assert reopened.load(obj, 3) == b"\3" * 1000
    reopened.close()


def test_object_id_depends_on_validator_and_block_size(tmp_path):
    a = DiskCache(str(tmp_path / "a"), capacity=MiB, block_size=MiB)
    b = DiskCache(str(tmp_path / "b"), capacity=MiB, block_size=2 * MiB)
    url = "https://example.org/data.nc"
    assert a.object_id(url, "etag 1") != a.object_id(url, "etag 2")
    assert a.object_id(url, "etag 1") != b.object_id(url, "etag 1")
    a.close()
    b.close()


def test_truncated_and_foreign_files_count_as_corrupt(tmp_path):
    cache = DiskCache(str(tmp_path), capacity=MiB, block_size=1000)
    obj = cache.object_id("http://x/y", "etag 1")
    cache.store(obj, 0, b"x" * 1000)
    path = Path(cache.root) / obj[:2] / obj / "0"
    path.write_bytes(path.read_bytes()[:500])
    assert cache.load(obj, 0) is None and not path.exists()
    cache.store(obj, 1, b"y" * 10)
    (Path(cache.root) / obj[:2] / obj / "1").write_bytes(b"not a block at all")
    assert cache.load(obj, 1) is None
    assert cache.statistics()["corrupt"] == 2
    with pytest.raises(RefmountError, match="in use"):
        DiskCache(str(tmp_path), capacity=MiB, block_size=1000)
    cache.close()


def test_blocks_read_into_pool_slots_and_both_checksums_are_checked(tmp_path, monkeypatch):
    """A block comes back as a read-only view of a pool slot (kept by the caches without a copy);
    blocks written with zlib's CRC-32 (a build without xxhash) still read; a flipped byte is caught
    in either kind."""
    from refmount.cache import disk
    from refmount.cache.buffers import BufferPool

    pool = BufferPool()
    cache = DiskCache(str(tmp_path), capacity=MiB, block_size=64 << 10)
    obj = cache.object_id("http://x/y", "etag 1")
    data = os.urandom(64 << 10)
    cache.store(obj, 0, data)
    with monkeypatch.context() as m:
        m.setattr(disk, "_MAGIC", b"RMB2")
        cache.store(obj, 1, data)
    paths = [Path(cache.root) / obj[:2] / obj / str(k) for k in (0, 1)]
    assert paths[1].read_bytes()[:4] == b"RMB2" and paths[0].read_bytes()[:4] == disk._MAGIC
    for k in (0, 1):
        got = cache.load(obj, k, pool)
        assert isinstance(got, memoryview) and got.readonly and got == data
    assert cache.load(obj, 0) == data  # without a pool: bytes
    for k, path in enumerate(paths):
        raw = bytearray(path.read_bytes())
        raw[HEADER_SIZE + 1000] ^= 1
        path.write_bytes(raw)
        assert cache.load(obj, k, pool) is None and not path.exists()
    assert cache.statistics()["corrupt"] == 2
    cache.close()


def test_where_a_block_lands_is_the_pools_decision(tmp_path, monkeypatch):
    """`load` asks the pool for every block and returns what it gave: a read-only view of a slot, or
    bytes for what the pool left on the heap (below its own `min_pooled`, or no mapping could be
    made), as without a pool."""
    import mmap
    import types

    from refmount.cache import buffers
    from refmount.cache.buffers import BufferPool

    cache = DiskCache(str(tmp_path), capacity=MiB, block_size=64 << 10)
    obj = cache.object_id("http://x/y", "etag 1")
    data = os.urandom(8 << 10)
    cache.store(obj, 0, data)
    got = cache.load(obj, 0, BufferPool(min_pooled=4096))  # a pool that pools 8 KiB
    assert isinstance(got, memoryview) and isinstance(got.obj, mmap.mmap) and got.readonly and got == data
    got = cache.load(obj, 0, BufferPool())  # one that does not
    assert type(got) is bytes and got == data

    def no_mapping(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(buffers, "mmap", types.SimpleNamespace(mmap=no_mapping, MAP_PRIVATE=mmap.MAP_PRIVATE))
    got = cache.load(obj, 0, BufferPool(min_pooled=4096))
    assert type(got) is bytes and got == data
    cache.close()


def _evict_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_blocks_not_in_the_page_cache_are_read_around_it_byte_exact(tmp_path):
    """A block file the page cache does not hold is read with O_DIRECT (where the filesystem has it)
    into its pool slot, whatever its size against the 4 KiB alignment; one it holds is copied from
    there; a flipped byte or a cut file read either way is caught."""
    from refmount.cache import direct
    from refmount.cache.buffers import BufferPool

    pool = BufferPool()
    cache = DiskCache(str(tmp_path), capacity=64 * MiB, block_size=MiB)
    obj = cache.object_id("http://x/y", "etag 1")
    sizes = [MiB, MiB - 1, MiB - HEADER_SIZE, 16_384, 16_385, 20_480 - HEADER_SIZE, 65_536 + 7, 4097]
    blocks = [os.urandom(n) for n in sizes]
    paths = [Path(cache.root) / obj[:2] / obj / str(k) for k in range(len(sizes))]
    for k, data in enumerate(blocks):
        cache.store(obj, k, data)
        _evict_from_page_cache(paths[k])
    for k, data in enumerate(blocks):
        got = cache.load(obj, k, pool)
        assert got == data, sizes[k]
        assert isinstance(got, memoryview) == (sizes[k] >= pool.min_pooled)  # (small ones: bytes, not pooled)
    around = cache.statistics()["direct_reads"]
    assert around == (len(sizes) - 1 if cache.use_direct else 0)

    paths[0].read_bytes()  # now in the page cache: copied from there
    fd = os.open(paths[0], os.O_RDONLY | os.O_CLOEXEC)
    held = direct.cached(fd, HEADER_SIZE + MiB)  # (False where the kernel cannot tell: before 6.5)
    os.close(fd)
    if held:
        assert cache.load(obj, 0, pool) == blocks[0]
        assert cache.statistics()["direct_reads"] == around

    for k, path in [(1, paths[1]), (2, paths[2])]:
        raw = bytearray(path.read_bytes())
        if k == 1:
            raw[HEADER_SIZE + sizes[k] - 3] ^= 1  # a byte in the part read into the tail buffer
        else:
            del raw[-5000:]  # cut short
        path.write_bytes(raw)
        _evict_from_page_cache(path)
        assert cache.load(obj, k, pool) is None and not path.exists()
    assert cache.statistics()["corrupt"] == 2
    cache.close()


def test_a_filesystem_without_o_direct_is_read_through_the_page_cache(tmp_path, monkeypatch):
    from refmount.cache import direct
    from refmount.cache.buffers import BufferPool

    def refused(*args):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(direct, "read_direct", refused)
    monkeypatch.setattr(direct, "cached", lambda fd, length: False)
    cache = DiskCache(str(tmp_path), capacity=8 * MiB, block_size=MiB)
    cache.use_direct = True  # (as where the platform has O_DIRECT)
    obj = cache.object_id("http://x/y", "etag 1")
    data = os.urandom(MiB - 100)
    cache.store(obj, 0, data)
    cache.store(obj, 1, data[:70_000])
    assert cache.load(obj, 0, BufferPool()) == data
    assert not cache.use_direct  # not tried again
    assert cache.load(obj, 1, BufferPool()) == data[:70_000]
    assert cache.statistics()["direct_reads"] == 0 and cache.statistics()["corrupt"] == 0
    cache.close()


@pytest.mark.parametrize("server_quirk", ["head refused", "no validators"])
def test_objects_whose_version_cannot_be_checked_are_read_but_not_cached_on_disk(mount, server, tmp_path,
                                                                                  server_quirk):
    size = 2 * MiB + 5
    data = write_blob(server, "f.bin", size, seed=9)
    refs = chunk_refs(server.url_for("f.bin"), size, MiB)
    del refs["whole"]  # a whole-file reference needs the size, which the refused HEAD would not tell
    if server_quirk == "head refused":
        server.head_status = 403
    else:
        server.send_validators = False
    cache_dir = tmp_path / "cache"
    m = mount(refs, "--view", "raw", "--cache-dir", str(cache_dir))
    assert read_all(m, refs)["c/2"] == data[2 * MiB :]
    assert blocks_on_disk(cache_dir) == []
    assert "not caching" in m.log()


def test_direct_reads_only_on_a_local_disk(tmp_path):
    """O_DIRECT only where it saves the page cache's copy: a local disk's filesystem, not tmpfs (or a
    network filesystem, whose client cache it would skip)."""
    from refmount.cache import direct

    assert direct.filesystem_type(str(tmp_path)) == direct.filesystem_type(os.path.dirname(str(tmp_path)))
    assert not direct.suits("/proc")
    if os.path.isdir("/dev/shm") and direct.filesystem_type("/dev/shm") == "tmpfs":
        memory = tempfile.mkdtemp(dir="/dev/shm")
        try:
            cache = DiskCache(memory, capacity=MiB, block_size=MiB)
            assert not cache.use_direct
            cache.close()
        finally:
            shutil.rmtree(memory)
