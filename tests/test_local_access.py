"""No way around file permissions: root mounts a local reference set with --allow-other, and user
nobody opens keys whose bytes come from local files only where nobody may read those files itself
(issue 25). Real mounts, a real other user (setpriv), real files; plus the permission rule itself.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from refmount.fuse.access import may_read
from tests.conftest import IN_CI, Mount, force_unmount

USER = "nobody"


@pytest.fixture
def shared_dir():
    """A directory every user can search (pytest's tmp_path is private to root); removed afterwards."""
    if os.geteuid() != 0:
        (pytest.fail if IN_CI else pytest.skip)("mounting for other users and switching users needs root")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is required")
    path = Path(tempfile.mkdtemp(prefix="refmount-access-"))
    path.chmod(0o755)
    mounts: list[Mount] = []
    yield path, mounts
    for m in mounts:
        m.stop()
        force_unmount(m.path)
    shutil.rmtree(path, ignore_errors=True)


def as_nobody(*command) -> subprocess.CompletedProcess:
    pw = pwd.getpwnam(USER)
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--",
                           *map(str, command)], capture_output=True, timeout=60)


def mounted(shared: Path, mounts: list, refs: dict, *args) -> Path:
    refs_path = shared / f"refs{len(mounts)}.json"
    refs_path.write_text(json.dumps(refs))
    m = Mount(refs_path, shared / f"mnt{len(mounts)}", ["--allow-other", *args],
              log_path=shared / f"mount{len(mounts)}.log")
    mounts.append(m)
    m.start()
    return m.path


@pytest.mark.parametrize("view", ["decoded", "raw"])
def test_nobody_gets_eacces_for_a_key_whose_target_is_etc_shadow(shared_dir, view):
    shared, mounts = shared_dir
    mnt = mounted(shared, mounts, {"secret": ["/etc/shadow", 0, 64], "note": "inline text"}, "--view", view)
    result = as_nobody("cat", mnt / "secret")
    assert result.returncode != 0 and b"Permission denied" in result.stderr, result
    assert result.stdout == b""
    assert as_nobody("cat", mnt / "note").stdout == b"inline text"  # inline keys: as before
    assert (mnt / "secret").read_bytes() == Path("/etc/shadow").read_bytes()[:64]  # root still reads it
    assert "may not read the local file(s) behind key 'secret'" in (shared / "mount0.log").read_text()


def test_nobody_still_reads_a_key_whose_target_is_world_readable(shared_dir):
    shared, mounts = shared_dir
    public = shared / "public.bin"
    public.write_bytes(os.urandom(5000))
    public.chmod(0o644)
    private = shared / "private.bin"
    private.write_bytes(b"root only")
    private.chmod(0o600)
    later = shared / "later.bin"  # does not exist when the set is mounted
    mnt = mounted(shared, mounts, {"public": [str(public), 100, 1000], "whole": [f"file://{public}"],
                                   "private": [str(private)], "later": [str(later), 0, 5]})
    assert as_nobody("cat", mnt / "public").stdout == public.read_bytes()[100:1100]
    assert as_nobody("cat", mnt / "whole").stdout == public.read_bytes()
    assert b"Permission denied" in as_nobody("cat", mnt / "private").stderr
    assert b"Permission denied" in as_nobody("cat", mnt / "later").stderr  # (cannot tell yet: refused)
    later.write_bytes(b"hello")
    later.chmod(0o644)
    result = as_nobody("cat", mnt / "later")
    assert result.stdout == b"hello", result.stderr
    later.chmod(0o600)  # checked at each open (after a second's memory of the last answer)
    subprocess.run(["sleep", "1.1"])
    assert b"Permission denied" in as_nobody("cat", mnt / "later").stderr


def test_permission_rule(shared_dir):
    """The kernel's rule, emulated: the owner's bits for the owner, else the group's for a member,
    else the others'; search permission on every directory; a missing file is not readable."""
    tmp_path, _ = shared_dir
    directory = tmp_path / "d"
    directory.mkdir()
    f = directory / "f"
    f.write_bytes(b"x")
    os.chown(directory, 0, 0)
    directory.chmod(0o755)
    os.chown(f, 1000, 2000)
    f.chmod(0o604)  # owner may read, group may not, others may
    assert may_read(str(f), 1000, {1000})
    assert not may_read(str(f), 3000, {2000})  # a member of the group: the group's bits, not the others'
    assert may_read(str(f), 3000, {3000})
    f.chmod(0o040)
    assert not may_read(str(f), 1000, {2000})  # the owner: the owner's bits only
    assert may_read(str(f), 3000, {2000, 5})
    f.chmod(0o444)
    directory.chmod(0o750)
    assert not may_read(str(f), 3000, {3000})  # no search permission on the directory
    assert may_read(str(f), 3000, {0})  # the directory's group
    assert not may_read(str(directory / "missing"), 0, {0})
    link = tmp_path / "link"
    link.symlink_to(f)
    directory.chmod(0o755)
    assert may_read(str(link), 3000, {3000})
    directory.chmod(0o700)
    assert not may_read(str(link), 3000, {3000})  # the link leads through a closed directory
