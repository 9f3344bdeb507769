"""Ranges that run past their object's end, as kerchunk's GRIB scanner writes them
(`["{{u}}", 0, 1653931904]` for cfgrib's 2772-byte regular_ll_sfc.grib): refmount serves the bytes that
exist, as fsspec does, with the key's size taken from the object once known, and one warning per key;
an object that changed while mounted stays EIO. The GRIB values read through the mount equal
fsspec's ReferenceFileSystem's, decoded by the same codec (cfgrib's, through kerchunk) on both sides."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import time
import types
from pathlib import Path

import numpy as np
import pytest
import trio

SAMPLES = Path(__file__).parent / "data" / "cfgrib"
GRIB_FILES = ["regular_ll_sfc", "lambert_grid", "fields_with_missing_values", "scanning_mode_64"]
RAW = ("--view", "raw")
DECLARED = 1_653_931_904  # what kerchunk writes for regular_ll_sfc.grib


def fsspec_bytes(refs: dict, key: str) -> bytes:
    """The oracle: what fsspec's ReferenceFileSystem serves for `key`."""
    return reference_fs(refs).cat_file(key)


def reference_fs(refs: dict):
    """fsspec's ReferenceFileSystem over `refs`, with filesystems of its own (zarr makes fsspec's cached
    http filesystem asynchronous, which a synchronous ReferenceFileSystem refuses)."""
    import fsspec

    return fsspec.filesystem("reference", fo=refs, skip_instance_cache=True,
                             remote_options={"skip_instance_cache": True})


def read_or_errno(path: Path):
    try:
        return path.read_bytes()
    except OSError as e:
        return e.errno


def past_end_refs(url: str, size: int) -> dict:
    return {".zgroup": '{"zarr_format":2}',
            "beyond": [url, 0, DECLARED],  # runs past the end
            "tail": [url, size - 100, 1000],  # starts inside, ends past the end
            "after": [url, size + 10, 50],  # starts past the end
            "inside": [url, 10, 20]}


# -- the rule, on plain objects ----------------------------------------------------------------------

def test_local_object_past_end_sizes_right_before_and_after_reads(mount, tmp_path):
    data = random.Random(1).randbytes(2772)
    path = tmp_path / "obj.bin"
    path.write_bytes(data)
    refs = past_end_refs(str(path), len(data))
    m = mount(refs, *RAW)
    expected = {"beyond": data, "tail": data[-100:], "after": b"", "inside": data[10:30]}
    for key, want in expected.items():
        assert os.stat(m / key).st_size == len(want), key  # a local object's size is looked up at stat
        assert (m / key).read_bytes() == want == fsspec_bytes(refs, key), key
        assert os.stat(m / key).st_size == len(want), key
    assert os.getxattr(m / "beyond", "user.refmount.length") == b"2772"
    log = m.log()
    assert f"key 'beyond' refers to {DECLARED} bytes at offset 0 of {path}, whose object ends after 2772 bytes: " \
           "serving the 2772 bytes that exist" in log
    assert log.count("refers to") == 3  # one warning per key past the end, none for 'inside'


def test_remote_object_past_end_is_served_and_sized_once_its_server_told(mount, server):
    data = random.Random(2).randbytes(5000)
    (server.root / "obj.bin").write_bytes(data)
    refs = past_end_refs(server.url_for("obj.bin"), len(data))
    m = mount(refs, *RAW)
    # before any response of the server the declared length is all there is to show
    assert os.stat(m / "beyond").st_size == DECLARED
    got = (m / "beyond").read_bytes()
    assert got == data == fsspec_bytes(refs, "beyond")
    assert os.stat(m / "beyond").st_size == len(data)  # after the first read it agrees with reads
    # every other key of that object is sized from the object from then on
    for key, want in {"tail": data[-100:], "after": b"", "inside": data[10:30]}.items():
        assert os.stat(m / key).st_size == len(want), key
        assert (m / key).read_bytes() == want, key
        if key != "after":  # (fsspec's http answers a range wholly past the end with an error, its local
            assert want == fsspec_bytes(refs, key), key  # files with b"", as refmount for both)
    assert m.log().count("whose object ends after 5000 bytes") == 3


def test_key_wholly_past_the_end_of_an_object_not_yet_seen(mount, server):
    data = random.Random(3).randbytes(3000)
    (server.root / "obj.bin").write_bytes(data)
    m = mount({"after": [server.url_for("obj.bin"), 4000, 100]}, *RAW)
    assert (m / "after").read_bytes() == b""  # the server's 416 tells the object's size
    assert os.stat(m / "after").st_size == 0
    assert "whose object ends after 3000 bytes: serving the 0 bytes" in m.log()


@pytest.mark.parametrize("validators", [("etag", "last-modified"), ()])
def test_object_that_became_shorter_while_mounted_is_eio_not_past_end(mount, server, validators):
    """A validator (ETag, Last-Modified, or the size a Content-Range gave) says the object changed:
    EIO, never its new bytes served as 'the bytes that exist'."""
    server.validators = validators
    data = random.Random(4).randbytes(64 << 10)
    path = server.root / "obj.bin"
    path.write_bytes(data)
    url = server.url_for("obj.bin")
    m = mount({"a": [url, 0, 4096], "b": [url, 32 << 10, 4096], "c": [url, 56 << 10, 8192]}, *RAW,
              "--block-size", "4K", "--no-prefetch", "--read-timeout", "1.5")
    assert (m / "a").read_bytes() == data[:4096]
    old = path.stat()
    path.write_bytes(data[: 40 << 10])  # now 40 KiB: b still inside, c past the end
    os.utime(path, (old.st_atime + 100, old.st_mtime + 100))
    for key in ("b", "c"):
        assert read_or_errno(m / key) == errno.EIO, key
    assert "changed while mounted" in m.log()
    assert "refers to" not in m.log()


def test_local_object_that_became_shorter_while_mounted_is_eio(mount, tmp_path):
    data = random.Random(5).randbytes(64 << 10)
    path = tmp_path / "obj.bin"
    path.write_bytes(data)
    m = mount({"a": [str(path), 0, 4096], "c": [str(path), 56 << 10, 8192]}, *RAW, "--block-size", "4K",
              "--no-prefetch")
    assert (m / "a").read_bytes() == data[:4096]
    assert os.stat(m / "c").st_size == 8192
    with open(path, "r+b") as f:
        f.truncate(40 << 10)
    time.sleep(0.01)
    assert read_or_errno(m / "c") == errno.EIO
    assert "refers to" not in m.log()


# -- kerchunk's GRIB references ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grib_sets(tmp_path_factory):
    """{name: (refs dict with local urls, refs path)} from kerchunk.grib2.scan_grib of cfgrib's samples."""
    pytest.importorskip("cfgrib")
    grib2 = pytest.importorskip("kerchunk.grib2")
    root = tmp_path_factory.mktemp("grib")
    sets = {}
    for name in GRIB_FILES:
        shutil.copy(SAMPLES / f"{name}.grib", root)
        messages = grib2.scan_grib(str(root / f"{name}.grib"))
        assert len(messages) == 1
        refs = messages[0]
        assert any(isinstance(v, list) and v[2] > (root / f"{name}.grib").stat().st_size
                   for v in refs["refs"].values()), f"{name}: kerchunk no longer writes ranges past the end"
        path = root / f"{name}.json"
        path.write_text(json.dumps(refs))
        sets[name] = (refs, path)
    return sets


def fsspec_arrays(refs: dict) -> dict:
    """Every array as zarr reads it through fsspec's ReferenceFileSystem (the codec: kerchunk's grib)."""
    import zarr

    group = zarr.open_group(reference_fs(refs).get_mapper(""), mode="r", zarr_format=2)
    return {name: np.asarray(array[...]) for name, array in group.arrays()}


def assert_same_arrays(got: dict, expected: dict, what: str) -> None:
    assert set(got) == set(expected), what
    for name, values in expected.items():
        assert got[name].shape == values.shape and np.array_equal(got[name], values, equal_nan=True), \
            f"{what}: {name}"


@pytest.mark.parametrize("name", GRIB_FILES)
def test_grib_references_read_as_fsspec_reads_them(mount, grib_sets, name):
    import zarr

    refs, path = grib_sets[name]
    m = mount(path, *RAW, cwd="/")
    group = zarr.open_group(str(m.path), mode="r", zarr_format=2)
    got = {n: np.asarray(a[...]) for n, a in group.arrays()}
    expected = fsspec_arrays(refs)
    assert_same_arrays(got, expected, name)
    assert any(np.isfinite(v).any() and v.size > 100 for v in expected.values())  # real fields were decoded
    assert "serving the" in m.log()


def test_grib_over_http_through_both_views(mount, grib_sets, server):
    import netCDF4
    import zarr

    from tests.support.clients import compare_dumped, ncdump, nczarr_url, parse_ncdump

    refs, _ = grib_sets["regular_ll_sfc"]
    shutil.copy(SAMPLES / "regular_ll_sfc.grib", server.root)
    remote = {**refs, "templates": {"u": server.url_for("regular_ll_sfc.grib")}}
    (server.root / "refs.json").write_text(json.dumps(remote))
    # (zarr cannot read fsspec's synchronous ReferenceFileSystem over http: the oracle reads the same file
    # locally, and fsspec over http serves the same bytes for the key)
    expected = fsspec_arrays(refs)
    assert fsspec_bytes(remote, "skt/0.0") == (SAMPLES / "regular_ll_sfc.grib").read_bytes()
    raw = mount(server.url_for("refs.json"), *RAW)
    group = zarr.open_group(str(raw.path), mode="r", zarr_format=2)
    assert_same_arrays({n: np.asarray(a[...]) for n, a in group.arrays()}, expected, "raw view over http")
    assert os.stat(raw / "skt" / "0.0").st_size == 2772
    decoded = mount(server.url_for("refs.json"))
    dumped = parse_ncdump(ncdump(nczarr_url(decoded.path), variables=["skt"]))  # Debian's ncdump
    compare_dumped(dumped["skt"], expected["skt"], [], "ncdump skt")
    with netCDF4.Dataset(nczarr_url(decoded.path)) as ds:
        skt = ds["skt"]
        skt.set_auto_maskandscale(False)
        assert np.array_equal(skt[...], expected["skt"])
        assert np.array_equal(ds["latitude"][...], expected["latitude"])


# -- sizes: what a stat, a listing and a read say agree once the object's size is known ----------------

INLINE_CASE = b"stuff"  # kerchunk's tests/test_utils.py::test_inline: a key of 4 bytes at offset 2 of these 5


def inline_case_refs(url: str) -> dict:
    return {"key0": "00", "key1": [url, 2, 4], "key2": [url, 1, 1], "whole": [url]}


_NO_CACHE = types.SimpleNamespace(block_size=1 << 20)  # (sizes need no block cache)


class _NoRequests:
    """A fetcher that has been told nothing and must not be asked."""

    def known_size(self, url):
        return None

    async def size(self, url):
        raise AssertionError(f"a request for the size of {url}")


def test_sizes_known_at_mount_need_no_request():
    """Scanned files' sizes, given at mount (RawView.known_object_sizes): the keys past their end are
    sized by them from their first stat or listing on."""
    from refmount.fuse.fs import Filesystem
    from refmount.refs import refs_from_dict
    from refmount.view.raw import RawView

    url = "http://example.invalid/regular_ll_sfc.grib"
    refset = refs_from_dict({"version": 1, "refs": {"skt/0.0": [url, 0, DECLARED], "skt/1.0": [url, 100, 50],
                                                    "other": ["http://example.invalid/b", 0, 10]}})
    view = RawView(refset, _NoRequests(), cache=_NO_CACHE)
    view.known_object_sizes({url: 2772, "http://example.invalid/not-referenced": 1})
    fs = Filesystem(refset, view)
    seen = []
    fs.invalidate = seen.extend
    first, second = refset.find("skt/0.0"), refset.find("skt/1.0")
    assert view.known_size(first) == 2772 and view.known_size(second) == 50
    assert trio.run(view.size, first) == 2772
    assert view.known_size(refset.find("other")) == 10  # not given: its declared length until a response
    assert seen == []  # nothing was shown before


def test_a_listing_shows_local_sizes_and_the_kernel_forgets_what_it_was_shown(tmp_path):
    """A listing looks up the local objects' sizes before it shows its keys' sizes; a remote object's
    size, learnt later (at its first response), invalidates the sizes the kernel was shown, at once for
    keys not being read, after their reads for those that are."""
    from refmount.fuse.fs import ROOT_INODE, Filesystem
    from refmount.refs import refs_from_dict
    from refmount.view.raw import RawView

    class LocalSizes(_NoRequests):
        async def size(self, url):
            return os.path.getsize(url)

    local = tmp_path / "data"
    local.write_bytes(INLINE_CASE)
    remote = "http://example.invalid/r.grib"
    refset = refs_from_dict({**{f"l/{k}": v for k, v in inline_case_refs(str(local)).items()},
                             "r/a": [remote, 0, DECLARED], "r/b": [remote, 10, 20], "r/c": [remote, 2000, 5000]})
    view = RawView(refset, LocalSizes(), cache=_NO_CACHE)
    fs = Filesystem(refset, view)
    invalidated = []
    fs.invalidate = invalidated.extend

    async def sizes(path):
        d = refset.dirs.children[0][path]
        files = await fs.file_entries(fs.dir_inode(d), 0, 100)
        return {name.decode(): size for name, size in zip(files.names, files.sizes)}

    assert trio.run(sizes, "l") == {"key0": 2, "key1": 3, "key2": 1, "whole": 5}
    assert trio.run(sizes, "r") == {"a": DECLARED, "b": 20, "c": 5000}  # no request: the declared lengths
    assert invalidated == []
    a, c = fs.file_inode(refset.find("r/a")), fs.file_inode(refset.find("r/c"))
    fs._reading[a] = 1  # a read of r/a is under way
    view.past_end.learn(refset.url_id[refset.find("r/a")], 2772)  # as its first response tells
    assert trio.run(sizes, "r") == {"a": 2772, "b": 20, "c": 772}
    assert invalidated == [c]  # r/b is inside the object; r/a waits for its read to end
    del fs._reading[a]
    fs._invalidate_stale()
    assert invalidated == [c, a]
    assert ROOT_INODE not in invalidated


def test_ls_stat_and_read_agree_on_every_past_end_key_over_http(mount, grib_sets, server):
    """The issue's Done-when: cfgrib's four GRIB files (kerchunk's scan_grib references) and kerchunk's
    inline case, through a loopback Range server. Before any response `ls -l` can only show the declared
    lengths (the kernel then caches them for an hour); once one key of an object has been read, `ls -l`,
    `stat` and a read agree on every key of it."""
    refs = {".zgroup": '{"zarr_format":2}'}
    for name, (grib, _) in grib_sets.items():
        shutil.copy(SAMPLES / f"{name}.grib", server.root)
        url = server.url_for(f"{name}.grib")
        for key, value in grib["refs"].items():
            if isinstance(value, list) and value[0] == "{{u}}":
                value = [url, *value[1:]]
            refs[f"{name}/{key}"] = value
        refs[f"{name}/magic"] = [url, 0, 4]  # "GRIB": a key inside the object
    (server.root / "inline").write_bytes(INLINE_CASE)
    refs.update({f"inline/{k}": v for k, v in inline_case_refs(server.url_for("inline")).items()})
    m = mount(refs, *RAW)

    def ls_sizes(d: str) -> dict:
        """key -> the size `ls -l` shows, for every key under d."""
        sizes = {}
        for parent in sorted({k.rpartition("/")[0] for k in refs if k.startswith(d + "/")}):
            out = subprocess.run(["ls", "-lnA", str(m / parent)], capture_output=True, text=True, check=True).stdout
            sizes.update({f"{parent}/{line.split()[-1]}": int(line.split()[4])
                          for line in out.splitlines()[1:] if line.startswith("-")})
        return sizes

    def past_end(key: str) -> bool:
        value = refs[key]
        return isinstance(value, list) and len(value) == 3 and \
            value[1] + value[2] > (server.root / value[0].rsplit("/", 1)[1]).stat().st_size

    dirs = sorted(grib_sets) + ["inline"]
    before = {d: ls_sizes(d) for d in sorted(grib_sets)}
    assert all(os.stat(m / key).st_size == size for key, size in before["regular_ll_sfc"].items())
    assert DECLARED in before["regular_ll_sfc"].values()  # as the issue saw it: not known before a response
    # (the inline case has a whole-object key: its size, looked up at the listing, sizes the others)
    before["inline"] = ls_sizes("inline")
    assert before["inline"]["inline/whole"] == 5
    time.sleep(0.1)
    assert os.stat(m / "inline/key1").st_size == 3  # before any read
    # A read of a key inside each object tells its size (the server's Content-Range): the keys past its
    # end that `ls -l` and `stat` showed with their declared length must show what a read returns, at
    # once. (A listing refreshes what the kernel holds; without the invalidation a `stat` alone would
    # show the old size for an hour.)
    for d in dirs:
        inside = "inline/key2" if d == "inline" else f"{d}/magic"
        assert (m / inside).read_bytes() in (b"t", b"GRIB")
    time.sleep(0.2)  # (the invalidations go out after the reads' replies)
    stated = {key: int(subprocess.run(["stat", "-c", "%s", str(m / key)], capture_output=True, text=True,
                                      check=True).stdout) for d in dirs for key in before[d]}
    checked = 0
    for d in dirs:
        listed = ls_sizes(d)
        assert sorted(listed) == sorted(k for k in refs if k.startswith(d + "/"))
        for key, shown in listed.items():
            path = m / key
            data = path.read_bytes()
            assert stated[key] == shown == os.stat(path).st_size == len(data), key
            assert data == fsspec_bytes(refs, key), key
            checked += past_end(key)
    assert checked >= 5
    assert ls_sizes("inline")["inline/key1"] == 3
