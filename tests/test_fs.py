"""Filesystem semantics without a mount: directory listings (batches, resuming, hidden keys) and
extended attributes per namespace."""

from __future__ import annotations

import errno
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trio

from refmount.fuse.fs import ROOT_INODE, Filesystem, FsError
from refmount.refs import WHOLE_FILE, refs_from_dict
from refmount.refs.model import each_file
from refmount.refs.parquet import load_parquet

URL = "http://h/f.nc"
REFS = {
    ".zgroup": '{"zarr_format": 2}',
    "b/c/d": [URL, 0, 1],
    "a/x": "inline",
    "whole": [URL],  # its size takes a request: unknown in a listing
    **{f"f{n}": [URL, 100 * n, 10 + n] for n in range(12)},
    "a/y": [URL, 5, 6],
}


class FakeView:
    """The view interface Filesystem uses, with chosen keys and directories hidden."""

    name = "fake"

    def __init__(self, refset, hidden_keys=(), hidden_dirs=()) -> None:
        self.refset = refset
        self.hidden_keys = set(hidden_keys)
        self.hidden_dirs = set(hidden_dirs)

    def hidden(self, i: int) -> bool:
        return self.refset.key(i) in self.hidden_keys or self.hidden_dir(self.refset.dir_id(i))

    def hidden_dir(self, d: int) -> bool:
        return any((self.refset.dirs.paths[d] + "/").startswith(p + "/") for p in self.hidden_dirs)

    def known_size(self, i: int) -> int | None:
        length = self.refset.target(i)[2]
        return None if length == WHOLE_FILE else length

    async def size(self, i: int) -> int:
        known = self.known_size(i)
        return 4321 if known is None else known

    def xattrs(self, i: int) -> dict[str, str]:
        return {"user.refmount.url": URL}


class HidesNothing(FakeView):
    hides_nothing = True

    def hidden(self, i: int) -> bool:
        raise AssertionError("a view that hides nothing is not asked about every key")


def make_fs(view_class=FakeView, refs=REFS, **hide) -> Filesystem:
    refset = refs_from_dict(refs)
    return Filesystem(refset, view_class(refset, **hide))


def listing(fs: Filesystem, ino: int = ROOT_INODE, start: int = 0, count: int = 3) -> list[tuple]:
    """(name, inode, size or 'dir', next offset) from `start` on, gathered as the FUSE glue does."""

    async def gather() -> list[tuple]:
        out = [(name, a.ino, "dir", next_id) for name, a, next_id in fs.subdir_entries(ino, start)]
        pos = start
        while True:
            files = await fs.file_entries(ino, pos, count)
            if not files.names:
                return out
            assert len(files.names) <= count
            out += zip(files.names, files.inodes, files.sizes, files.next_offsets)
            assert len(out) <= 1000, "the listing does not end"
            pos = files.next_offsets[-1]

    return trio.run(gather)


def names(entries) -> list[bytes]:
    return [e[0] for e in entries]


def test_listing_order_sizes_and_inodes_agree_with_lookup():
    fs = make_fs()
    entries = listing(fs)
    files = [b".zgroup", b"whole"] + [f"f{n}".encode() for n in range(12)]
    assert names(entries) == [b"a", b"b"] + files  # subdirectories by name, then files in load order
    sizes = {e[0]: e[2] for e in entries}
    assert sizes[b"whole"] is None and sizes[b"f3"] == 13 and sizes[b".zgroup"] == len(REFS[".zgroup"])

    async def looked_up():
        return {name: await fs.lookup(ROOT_INODE, name) for name in names(entries)}

    attrs = trio.run(looked_up)
    assert all(attrs[name].ino == ino for name, ino, _, _ in entries)
    sub = attrs[b"a"].ino
    assert names(listing(fs, sub)) == [b"x", b"y"]
    assert names(listing(fs, attrs[b"b"].ino)) == [b"c"]


@pytest.mark.parametrize("view_class", [FakeView, HidesNothing])
def test_listing_resumes_at_every_offset_with_the_same_entries(view_class):
    fs = make_fs(view_class)
    full = listing(fs, count=1000)
    for count in (1, 2, 5, 64):
        assert listing(fs, count=count) == full
    offsets = [e[3] for e in full]
    assert offsets == sorted(set(offsets))  # strictly increasing: a resume point identifies one entry
    for k, entry in enumerate(full):
        for count in (1, 4):
            assert listing(fs, start=entry[3], count=count) == full[k + 1:], (k, count)
    assert listing(fs, start=offsets[-1] + 5) == []


def test_hidden_keys_and_directories_are_not_listed():
    hidden = {f"f{n}" for n in (2, 3, 4, 5, 6, 7)} | {"a/y"}  # a whole batch of 3 hidden: look further
    fs = make_fs(hidden_keys=hidden, hidden_dirs={"b"})
    full = listing(fs, count=3)
    assert names(full) == [b"a", b".zgroup", b"whole", b"f0", b"f1", b"f8", b"f9", b"f10", b"f11"]
    assert names(listing(fs, trio.run(fs.lookup, ROOT_INODE, b"a").ino)) == [b"x"]
    for k, entry in enumerate(full):
        assert listing(fs, start=entry[3], count=2) == full[k + 1:]
    with pytest.raises(FsError) as e:
        trio.run(fs.lookup, ROOT_INODE, b"f3")
    assert e.value.errno == errno.ENOENT


def test_listing_a_file_is_enotdir():
    fs = make_fs()
    ino = trio.run(fs.lookup, ROOT_INODE, b"f1").ino
    for attempt in (lambda: list(fs.subdir_entries(ino, 0)), lambda: trio.run(fs.file_entries, ino, 0, 10)):
        with pytest.raises(FsError) as e:
            attempt()
        assert e.value.errno == errno.ENOTDIR


def getxattr_errno(fs, ino, name: bytes) -> int | None:
    try:
        trio.run(fs.getxattr, ino, name)
    except FsError as e:
        return e.errno
    return None


def test_xattr_errno_per_namespace():
    fs = make_fs()
    f1 = trio.run(fs.lookup, ROOT_INODE, b"f1").ino
    a = trio.run(fs.lookup, ROOT_INODE, b"a").ino
    assert trio.run(fs.getxattr, f1, b"user.refmount.url") == URL.encode()
    assert json.loads(trio.run(fs.getxattr, ROOT_INODE, b"user.refmount.stats")) == {}
    for ino in (ROOT_INODE, a, f1):
        # "not supported" outside user.*: `ls -l` then stops asking (security.selinux, POSIX ACLs)
        for name in (b"security.selinux", b"system.posix_acl_access", b"system.posix_acl_default",
                     b"trusted.overlay.opaque", b"security.capability"):
            assert getxattr_errno(fs, ino, name) == errno.EOPNOTSUPP, (ino, name)
        assert getxattr_errno(fs, ino, b"user.other") == errno.ENODATA
        assert getxattr_errno(fs, ino, b"user.refmount.nope") == errno.ENODATA
    assert trio.run(fs.listxattr, f1) == [b"user.refmount.url"]


# -- a lazily loaded (Parquet) set: chunks listed record by record ------------------------------------

GRID = (4, 3)  # 12 chunks, named "i.j"; record size 5: records hold chunks 0-4, 5-9, 10-11
MISSING = {1, 5, 6, 7, 8, 9}  # chunk 5-9 all missing: one record file holds no reference at all


def write_parquet_set(root, absent_record_file: bool) -> list[str]:
    root.mkdir()
    meta = {".zgroup": {"zarr_format": 2},
            "v/.zarray": {"chunks": [1, 1], "compressor": None, "dtype": "<i4", "fill_value": 0, "filters": None,
                          "order": "C", "shape": list(GRID), "zarr_format": 2}}
    (root / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": 5}))
    (root / "v").mkdir()
    for record, chunks in enumerate((range(0, 5), range(5, 10), range(10, 12))):
        if absent_record_file and record == 1:
            continue  # kerchunk writes no file for a record without references
        rows = [n not in MISSING for n in chunks]
        table = pa.table({"path": pa.array([URL if r else None for r in rows], pa.string()),
                          "offset": pa.array([10 * n for n in chunks], pa.int64()),
                          "size": pa.array([4] * len(rows), pa.int64()),
                          "raw": pa.nulls(len(rows), pa.binary())})
        pq.write_table(table, root / "v" / f"refs.{record}.parq")
    return [f"{n // GRID[1]}.{n % GRID[1]}" for n in range(12) if n not in MISSING]


@pytest.mark.parametrize("absent_record_file", [False, True])
def test_parquet_listing_loads_records_and_resumes(tmp_path, absent_record_file):
    chunks = write_parquet_set(tmp_path / "p.parq", absent_record_file)
    refset = load_parquet(str(tmp_path / "p.parq"), remote_options={})
    fs = Filesystem(refset, FakeView(refset))
    v = trio.run(fs.lookup, ROOT_INODE, b"v").ino
    full = listing(fs, v, count=2)
    assert names(full) == [b".zarray"] + [c.encode() for c in chunks]
    assert all(size == 4 for _, _, size, _ in full[1:])

    async def looked_up():
        return [(await fs.lookup(v, name)).ino for name in names(full)]

    assert trio.run(looked_up) == [e[1] for e in full]
    for k, entry in enumerate(full):
        assert listing(fs, v, start=entry[3], count=1) == full[k + 1:]

    async def one_by_one():  # the per-entry iterator that `refmount inspect` uses
        return [i async for _, i in each_file(refset, refset.dirs.ids["v"])]

    assert [fs.file_inode(i) for i in trio.run(one_by_one)] == [e[1] for e in full]
