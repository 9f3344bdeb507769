"""A reference set of very many arrays (issue 38 row 5): what the views build after loading it.

A DMR++ of 300,000 small variables (generated here: one contiguous Int32 scalar each, every 1,000th
deflated) mounts in the raw view under the default 1 GiB --memory-target, the daemon's VmHWM (its
/proc status) under it: the compression warning is one line (names parsed one .zarray at a time, not
planned: scan_arrays held ~640 MB), and .zmetadata is streamed from the inline metadata (a column of
entry lengths, measured on its first stat) instead of built whole at mount. The decoded view of it would
need ~7 GiB to build (each array's plan and metadata in every reader's form): the mount is refused
before it is built, in one line naming the file and the --memory-target that would do. A decoded view
logs a few lines about single arrays and counts the rest, never one line per array.

Measured on main before (2 cores, Python 3.11; bench/NOTES.md "Issue 38"): see the tests' printed lines.
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.test_dmrpp_scan import _dmrpp, _scans_of_their_own, _status_mib  # noqa: F401 (an autouse fixture)

ARRAYS = 300_000
TARGET_MIB = 1024  # the default --memory-target


def scalars_dmrpp(arrays: int, every_deflated: int = 1000) -> bytes:
    """`arrays` Int32 scalars: v<n> is int32 n % 1000 at offset 4 * (n % 1000) of the file (every
    `every_deflated`-th one deflated, after the 4,000 plain bytes)."""
    def one(n: int) -> str:
        if n % every_deflated == 0:
            return (f'<Int32 name="v{n:06d}"><dmrpp:chunks compressionType="deflate"><dmrpp:chunk offset="4000" '
                    f'nBytes="{len(DEFLATED)}"/></dmrpp:chunks></Int32>\n')
        return (f'<Int32 name="v{n:06d}"><dmrpp:chunks><dmrpp:chunk offset="{4 * (n % 1000)}" nBytes="4"/>'
                f'</dmrpp:chunks></Int32>\n')
    return _dmrpp("".join(map(one, range(arrays))))


DEFLATED = zlib.compress(np.int32(-5).tobytes())


def _data_file(root: Path) -> None:
    (root / "many.h5").write_bytes(np.arange(1000, dtype="<i4").tobytes() + DEFLATED)


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("many")
    _data_file(root)
    path = root / "many.h5.dmrpp"
    path.write_bytes(scalars_dmrpp(ARRAYS))
    return path


def test_300000_arrays_mount_in_the_raw_view_under_the_memory_target(many, slow_mount):
    started = time.monotonic()
    m = slow_mount(many, "--view", "raw")
    took = time.monotonic() - started
    at_mount = _status_mib(m.proc.pid, "VmHWM")
    assert (m.path / "v123456" / "0").read_bytes() == np.int32(456).tobytes()
    # one warning line for 300 compressed arrays, naming a few and counting the rest
    warned = [line for line in m.log().splitlines() if "are compressed or filtered" in line]
    assert len(warned) == 1 and "v000000, v001000" in warned[0] and "and 292 more" in warned[0], warned
    # .zmetadata: every array's metadata, streamed (read whole here, in FUSE's pieces)
    started = time.monotonic()
    with open(m.path / ".zmetadata", "rb") as f:
        consolidated = json.load(f)["metadata"]
    read_took = time.monotonic() - started
    assert sum(key.endswith("/.zarray") for key in consolidated) == ARRAYS and ".zgroup" in consolidated
    assert consolidated["v299999/.zarray"]["dtype"] == "<i4"
    assert consolidated["v001000/.zarray"]["filters"] or consolidated["v001000/.zarray"]["compressor"]
    del consolidated
    peak = _status_mib(m.proc.pid, "VmHWM")
    print(f"\n{ARRAYS:,} arrays, --view raw: mounted in {took:.1f} s, daemon VmHWM {at_mount:.0f} MiB at mount, "
          f"{peak:.0f} MiB after reading .zmetadata ({read_took:.1f} s)")
    assert peak < TARGET_MIB, f"daemon VmHWM {peak:.0f} MiB, over the default --memory-target"


def test_300000_arrays_in_the_decoded_view_are_refused_in_one_line_before_it_is_built(many, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    started = time.monotonic()
    proc = run_refmount("mount", "--foreground", "--view", "decoded", many, mnt, timeout=900)
    took = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in lines if "would take the decoded view" in line]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert str(many) in line and "300,000 arrays" in line and "the default memory target 1,024 MiB" in line, line
    assert "--view raw" in line and "give --memory-target" in line, line
    print(f"\nrefused in {took:.1f} s: {line}")


def test_a_decoded_view_of_many_arrays_logs_a_few_lines_and_a_count(tmp_path, slow_mount):
    _data_file(tmp_path)
    path = tmp_path / "many.h5.dmrpp"
    path.write_bytes(scalars_dmrpp(2000))
    m = slow_mount(path, "--view", "decoded")
    assert (m.path / "v001234" / "0").read_bytes() == np.int32(234).tobytes()
    assert (m.path / "v001000" / "0").read_bytes() == np.int32(-5).tobytes()
    log = m.log().splitlines()
    single = [line for line in log if "decoded view: array v" in line]
    assert 0 < len(single) <= 20, len(single)
    counted = [line for line in log if "more arrays served changed (not logged one by one)" in line]
    assert len(counted) == 1 and "1,980 more" in counted[0], counted


def test_streamed_consolidated_metadata_is_the_bytes_of_the_whole_dump():
    """Every byte range of the streamed .zmetadata is that of json's indented dump of the whole (as before)."""
    import trio

    from refmount.refs import refs_from_dict
    from refmount.view.arrays import load_json_value
    from refmount.view.consolidated import with_consolidated_metadata

    zarray = {"chunks": [2], "compressor": None, "dtype": "<f8", "fill_value": "NaN", "filters": None,
              "order": "C", "shape": [4], "zarr_format": 2}
    refs = {".zgroup": '{"zarr_format": 2}', ".zattrs": '{"title": "caf\u00e9 \\u00e9", "n": NaN}',
            "b/.zarray": json.dumps(zarray), "b/.zattrs": '{"_ARRAY_DIMENSIONS": ["x"], "s": "a\\nb"}',
            "a/.zattrs": "not json", "a/.zarray": json.dumps({**zarray, "compressor": {"id": "zlib", "level": 1}}),
            "a/0": ["file:///x", 0, 4], "g/.zgroup": '{"zarr_format": 2}', "g/c/.zarray": json.dumps(zarray)}
    refset = refs_from_dict(refs)
    entries = {k: load_json_value(v.encode()) for k, v in refs.items() if k.rsplit("/", 1)[-1].startswith(".z")
               and k != "a/.zattrs"}
    expected = json.dumps({"metadata": entries, "zarr_consolidated_format": 1}, ensure_ascii=False, indent=4,
                          sort_keys=True).encode("utf-8")

    class Raw:
        name = "raw"

    raw = Raw()
    raw.refset = refset
    view = with_consolidated_metadata(raw)
    i = view.refset.find(".zmetadata")
    assert view.known_size(i) is None  # (nothing built at mount)

    async def main():
        size = await view.size(i)
        pieces = [await view.read(i, offset, 7) for offset in range(0, size + 14, 7)]
        return size, await view.read_all(i), b"".join(pieces), await view.read(i, 100, 333)

    size, whole, pieces, middle = trio.run(main)
    assert size == len(expected) and whole == expected and pieces == expected
    assert middle == expected[100:433]


def test_planning_arrays_is_linear_in_their_number():
    """count_chunks tested every directory for every array: 30,000 arrays took 114 s to plan."""
    from refmount.refs import refs_from_dict
    from refmount.view.arrays import compressed_arrays, scan_arrays

    zarray = json.dumps({"chunks": [1], "compressor": None, "dtype": "<i4", "fill_value": None, "filters": None,
                         "order": "C", "shape": [1], "zarr_format": 2})
    refs = {".zgroup": '{"zarr_format": 2}'}
    for n in range(20_000):
        refs[f"v{n}/.zarray"] = zarray
        refs[f"v{n}/0"] = ["file:///x", 0, 4]
    refset = refs_from_dict(refs)
    started = time.monotonic()
    arrays = scan_arrays(refset)
    took = time.monotonic() - started
    assert len(arrays) == 20_000 and not compressed_arrays(refset)
    assert took < 30, f"{took:.1f} s to plan 20,000 arrays"
