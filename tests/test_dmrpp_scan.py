"""DMR++ conversion in the capped scan workers (issue 38, row 5 and the DMR++ items of row 10).

A DMR++ is parsed as it streams through a scan worker (refs/scan/worker.py: forkserver process, address
space capped, bounded JSON back), at every door: mounted directly (a path, a url, standard input), as a
sidecar in a glob, and by `refmount scan`. --max-keys, --max-refs-size and what --memory-target leaves
for the reference set are enforced while it is read: the first key over refuses it, in one line naming
the file and the limit. The daemon's own memory (VmHWM of its /proc status) and CPU show it did not parse.

Names: a DMR++ variable (or group) whose name cannot be a directory entry (refs.model.name_problem) is
left out alone with one log line; of two variables of one name the first is kept and the second left
out, never merged with it.

The big files are generated here (3,000 arrays of 300 chunks: 900,000 keys, 61 MB of XML). Measured on
main before the change (2 cores, Python 3.11): that file mounted directly took the daemon to VmHWM 710
MiB and 10.4 s of CPU; after, 256 MiB and 4.0 s.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from refmount.refs.dmrpp import dmrpp_to_refs
from tests.conftest import run_refmount

ARRAYS, CHUNKS = 3000, 300  # 900,000 chunk keys
HEAD = ('<?xml version="1.0" encoding="UTF-8"?>\n<Dataset xmlns="http://xml.opendap.org/ns/DAP/4.0#" '
        'xmlns:dmrpp="http://xml.opendap.org/dap/dmrpp/1.0.0#" dapVersion="4.0" name="big.h5" '
        'dmrpp:href="{href}">\n')


def _dmrpp(body: str, href: str = "OPeNDAP_DMRpp_DATA_ACCESS_URL") -> bytes:
    return (HEAD.format(href=href) + body + "</Dataset>\n").encode()


def _int32(name: str, offset: int) -> str:
    return f'<Int32 name="{name}"><dmrpp:chunks><dmrpp:chunk offset="{offset}" nBytes="4"/></dmrpp:chunks></Int32>\n'


def chunky_dmrpp(arrays: int, chunks: int) -> bytes:
    """`arrays` Int32 arrays of `chunks` one-element chunks; chunk c of every array is int32 c of the file."""
    one = "".join(f'<dmrpp:chunk offset="{4 * c}" nBytes="4" chunkPositionInArray="[{c}]"/>\n' for c in range(chunks))
    body = "".join(f'<Int32 name="v{a:05d}"><Dim size="{chunks}"/><dmrpp:chunks>'
                   f'<dmrpp:chunkDimensionSizes>1</dmrpp:chunkDimensionSizes>\n{one}</dmrpp:chunks></Int32>\n'
                   for a in range(arrays))
    return _dmrpp(body)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bigdmrpp")
    (root / "big.h5").write_bytes(np.arange(CHUNKS, dtype="<i4").tobytes())
    path = root / "big.h5.dmrpp"
    path.write_bytes(chunky_dmrpp(ARRAYS, CHUNKS))
    return path


@pytest.fixture(autouse=True)
def _scans_of_their_own(tmp_path, monkeypatch):
    """Each test converts afresh (the scan store keeps DMR++ references between mounts)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _status_mib(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _check_daemon_did_not_parse(m, what: str) -> None:
    peak, cpu = _status_mib(m.proc.pid, "VmHWM"), _cpu_seconds(m.proc.pid)
    print(f"\n{what}: daemon VmHWM {peak:.0f} MiB, {cpu:.1f} s of CPU")
    # under the default --memory-target (1 GiB) with room to spare: converting in the daemon took 710 MiB
    # (the XML tree and a dict of 900,000 keys); loading the worker's JSON takes about 250
    assert peak < 480, f"daemon VmHWM {peak:.0f} MiB: the DMR++ was not converted in a scanner"


def test_a_big_dmrpp_mounted_directly_is_converted_in_a_scanner(big, slow_mount):
    m = slow_mount(big, "--view", "raw")
    assert (m.path / "v02999" / "299").read_bytes() == np.int32(299).tobytes()
    assert (m.path / "v00000" / "7").read_bytes() == np.int32(7).tobytes()
    _check_daemon_did_not_parse(m, "mounted directly")
    assert "converted in a scan worker" in m.log()


def test_a_big_dmrpp_sidecar_in_a_lazy_glob_is_converted_in_a_scanner(big, slow_mount):
    # (`*.dmrpp`: a lazy glob of `*.h5` lists no sidecar yet, issue 38 row 7; a DMR++ alone stands for its file)
    m = slow_mount(f"{big.parent}/*.dmrpp", "--view", "raw")
    assert (m.path / "big.h5" / "v01234" / "42").read_bytes() == np.int32(42).tobytes()
    _check_daemon_did_not_parse(m, "in a glob, scanned on lookup")


def _one_line_refusal(*args, timeout: float = 300) -> tuple[str, float]:
    started = time.monotonic()
    proc = run_refmount("mount", "--dry-run", *args, timeout=timeout)
    took = time.monotonic() - started
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0], took


def test_limits_refuse_while_the_dmrpp_is_read(big, tmp_path):
    """--max-keys, --max-refs-size and --memory-target each stop the conversion where it is over, in one
    line naming the file and the limit: far sooner than a whole conversion (the dry run that loads it)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    line, took_keys = _one_line_refusal("--max-keys", "1000", big, mnt)
    assert str(big) in line and "more than 1,000 keys (--max-keys 1,000); refused while it was read" in line, line
    line, took_bytes = _one_line_refusal("--max-refs-size", "1M", big, mnt)
    assert str(big) in line and "--max-refs-size 1M" in line and "refused while it was read" in line, line
    # 400 MiB leave the reference set room for some 600,000 keys (350 bytes each) beside the daemon
    line, _ = _one_line_refusal("--memory-target", "400M", big, mnt)
    assert str(big) in line and "all that --memory-target 400M leaves" in line, line
    assert "refused while it was read" in line, line

    started = time.monotonic()
    proc = run_refmount("mount", "--dry-run", big, mnt, timeout=300)
    whole = time.monotonic() - started
    assert proc.returncode == 0 and "900,000 byte ranges" in proc.stdout, proc.stdout + proc.stderr
    print(f"\nrefused by --max-keys after {took_keys:.1f} s, by --max-refs-size after {took_bytes:.1f} s; "
          f"converted whole in {whole:.1f} s")
    for took in (took_keys, took_bytes):
        assert took < whole / 2, f"refused after {took:.1f} s; the whole conversion takes {whole:.1f} s"
    # kept by the scan store now: the limits of a later mount apply to it just the same (before loading it)
    line, _ = _one_line_refusal("--max-keys", "1000", big, mnt)
    assert str(big) in line and "more than 1,000 keys (--max-keys 1,000)" in line, line


def test_the_scanner_bounds_what_it_sends_back(tmp_path):
    """The references cross the pipe as JSON bytes within --max-refs-size: the worker stops writing them
    at the first byte over (here 3 MB of XML make 7.7 MB of references), the parent never reads more."""
    from refmount.errors import RefsError
    from refmount.refs import load_refs

    path = tmp_path / "scalars.h5.dmrpp"
    path.write_bytes(_dmrpp("".join(_int32(f"v{i:06d}", 4 * i) for i in range(30_000))))
    assert path.stat().st_size < 5 << 20
    with pytest.raises(RefsError, match=r"its references exceed --max-refs-size 5M; refused while it was read"):
        load_refs(str(path), max_refs_size=5 << 20)
    assert len(load_refs(str(path), max_refs_size=10 << 20)) == 90_001


def _names_dmrpp() -> bytes:
    long = "x" * 256
    return _dmrpp(_int32("a", 0) + _int32("b", 4) + _int32("a", 8) + _int32(long, 12) + _int32("..", 16)
                  + f'<Group name="{"g" * 300}">{_int32("inner", 0)}</Group>'
                  + f'<Group name="g">{_int32("c", 4)}</Group><Group name="g">{_int32("d", 8)}</Group>'
                  + f'<Group name="b">{_int32("e", 8)}</Group>')


def test_duplicate_and_bad_names_drop_only_that_variable(caplog):
    refs, refused = dmrpp_to_refs(_names_dmrpp(), "/x/f.h5.dmrpp")
    assert refs["a/0"] == ["/x/f.h5", 0, 4]  # the first "a", not merged with the second
    assert refs["b/0"] == ["/x/f.h5", 4, 4] and refs["g/c/0"] == ["/x/f.h5", 4, 4]
    assert not [k for k in refs if k.startswith(("x", "g/d", "b/e", "gg", "inner"))]
    assert len(refused) == 6, refused
    assert sum("variable /a left out: a variable or group of this name came before it" in r for r in refused) == 1
    assert sum("variable /" + "x" * 50 in r and "is longer than 255 bytes" in r for r in refused) == 1
    assert sum("variable /.. left out: its name '..' is '..'" in r for r in refused) == 1
    assert sum("group /ggg" in r and "is longer than 255 bytes" in r for r in refused) == 1
    assert sum("group /g left out: a variable or group of this name" in r for r in refused) == 1
    assert sum("group /b left out: a variable or group of this name" in r for r in refused) == 1
    assert all(len(r) < 400 and "/x/f.h5.dmrpp" in r for r in refused)
    assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 6


def test_a_flood_of_refused_variables_is_counted_not_logged_line_by_line(caplog):
    from refmount.refs.dmrpp import MAX_REFUSED_LINES

    refs, refused = dmrpp_to_refs(_dmrpp(_int32("a", 0) * (MAX_REFUSED_LINES + 500)), "/x/f.h5.dmrpp")
    assert refs["a/0"] == ["/x/f.h5", 0, 4]
    assert len(refused) == MAX_REFUSED_LINES + 1 and refused[-1].endswith(": 499 more variables or groups left out")
    assert len(caplog.records) == MAX_REFUSED_LINES + 1


def test_a_mount_keeps_the_first_of_two_variables_and_drops_a_long_name_alone(tmp_path, mount):
    data = np.array([11, 22, 33, 44, 55], dtype="<i4")
    (tmp_path / "f.h5").write_bytes(data.tobytes())
    path = tmp_path / "f.h5.dmrpp"
    path.write_bytes(_names_dmrpp())
    for m, log_of in ((mount(path, "--view", "raw"), None), (mount(f"{tmp_path}/*.dmrpp", "--view", "raw"), "f.h5")):
        root = m.path / log_of if log_of else m.path
        assert (root / "a" / "0").read_bytes() == data[0].tobytes()  # the first a's bytes, not the second's
        assert (root / "g" / "c" / "0").read_bytes() == data[1].tobytes()
        assert {name for name in os.listdir(root) if not name.startswith(".")} == {"a", "b", "g"}
        assert os.listdir(root / "g") and "d" not in os.listdir(root / "g")
        log = m.log()
        assert log.count("variable /a left out: a variable or group of this name came before it") == 1, log
        assert log.count("is longer than 255 bytes") == 2, log
        assert log.count("left out") == 6, log


def test_refmount_scan_and_standard_input_convert_in_a_scanner(tmp_path):
    import subprocess
    import tempfile

    from tests.conftest import REFMOUNT

    data = np.array([7, 8, 9, 10], dtype="<i4")
    (tmp_path / "f.h5").write_bytes(data.tobytes())
    path = tmp_path / "f.h5.dmrpp"
    path.write_bytes(_dmrpp(_int32("a", 0) + _int32("a", 4) + _int32("b", 8)))
    out = tmp_path / "out.json"
    proc = run_refmount("scan", path, "-o", out)
    assert proc.returncode == 0, proc.stderr
    refs = json.loads(out.read_text())
    assert refs["a/0"] == [str(tmp_path / "f.h5"), 0, 4] and refs["b/0"][1] == 8
    assert proc.stderr.count("variable /a left out") == 1, proc.stderr
    # standard input (a pipe) is read once: a bounded private copy is converted, then removed
    mnt = tmp_path / "stdin-mnt"
    mnt.mkdir()
    proc = subprocess.run([*REFMOUNT, "mount", "--dry-run", "--data-url", str(tmp_path / "f.h5"), "-", str(mnt)],
                          input=path.read_bytes(), capture_output=True, timeout=120)
    assert proc.returncode == 0 and b"valid reference set" in proc.stdout, proc.stderr
    assert b"2 byte ranges" in proc.stdout, proc.stdout  # (a, b: the second a is left out)
    assert b"DMR++ /dev/stdin: variable /a left out" in proc.stderr, proc.stderr
    assert not list(Path(tempfile.gettempdir()).glob("refmount-dmrpp-*"))
