"""refmount as an ordinary user: a real non-root uid (nobody) mounts through fusermount3 in a directory
it owns, reads, lists, and unmounts with `refmount umount` and with `fusermount3 -u`.

/dev/fuse: Debian's udev rules (50-udev-default.rules, from systemd) make it 0666 on a normal host;
containers often pass it as 0600. The test grants the test user access for its duration only (group
ownership, restored in `finally`), and first checks the message a user gets without access."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI, REFMOUNT, force_unmount, is_mounted
from tests.support.datasets import kerchunk_refs, oracle_bytes

USER = "nobody"


@pytest.fixture
def user_home():
    """A directory the test user owns (pytest's own tmp_path is private to root)."""
    if os.geteuid() != 0:
        (pytest.fail if IN_CI else pytest.skip)("switching to another user needs root")
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is required")
    pw = pwd.getpwnam(USER)

    def probe() -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--",
                               *REFMOUNT, "--version"], capture_output=True, text=True, timeout=60)

    opened = []  # directories given o+x for the test, to be put back
    try:
        result = probe()
        if result.returncode != 0:  # e.g. a checkout under /root (0700): let the user through, for now
            opened = _traversable([Path(__file__).resolve(), Path(REFMOUNT[0]).resolve()])
            result = probe()
        if result.returncode != 0:
            message = f"user {USER} cannot run this checkout's Python: {result.stderr.strip()[-200:]}"
            (pytest.fail if IN_CI else pytest.skip)(message)
        home = Path(tempfile.mkdtemp(prefix="refmount-user-"))
        os.chown(home, pw.pw_uid, pw.pw_gid)
        yield home, pw
        for mnt in home.glob("mnt*"):
            force_unmount(mnt)
        shutil.rmtree(home, ignore_errors=True)
    finally:
        for directory, mode in reversed(opened):
            os.chmod(directory, mode)


def _traversable(paths) -> list[tuple[Path, int]]:
    """Give others search (x) permission on every parent directory of `paths` that lacks it;
    returns what to put back."""
    changed = []
    for path in paths:
        for directory in reversed(path.parents):
            mode = directory.stat().st_mode & 0o7777
            if not mode & 0o001 and (directory, mode) not in changed:
                os.chmod(directory, mode | 0o001)
                changed.append((directory, mode))
    return changed


def as_user(pw, home: Path, *command, check=False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REFMOUNT_", "XDG_"))}
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / "state"), REFMOUNT_SYSLOG_SOCKET="")
    result = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--",
                             *map(str, command)], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


class fuse_access:
    """Let the test user's group open /dev/fuse; put owner, group and mode back afterwards."""

    def __init__(self, gid: int):
        self.gid = gid

    def __enter__(self):
        st = os.stat("/dev/fuse")
        self.saved = (st.st_gid, st.st_mode & 0o7777)
        os.chown("/dev/fuse", -1, self.gid)
        os.chmod("/dev/fuse", self.saved[1] | 0o060)

    def __exit__(self, *exc):
        os.chown("/dev/fuse", -1, self.saved[0])
        os.chmod("/dev/fuse", self.saved[1])


def user_can_open_fuse(pw) -> bool:
    st = os.stat("/dev/fuse")
    return bool(st.st_mode & 0o006) or (st.st_gid == pw.pw_gid and bool(st.st_mode & 0o060))


def test_non_root_mount_read_list_unmount(user_home, datasets, http_data, mount):
    home, pw = user_home
    refs = kerchunk_refs(datasets["air"], url=http_data.url_for(datasets["air"].name))
    refs_path = home / "refs.json"
    refs_path.write_text(json.dumps(refs))
    os.chown(refs_path, pw.pw_uid, pw.pw_gid)
    mnt = home / "mnt"
    as_user(pw, home, "mkdir", mnt, check=True)

    if not user_can_open_fuse(pw):  # the message a user sees before the admin fixed /dev/fuse
        result = as_user(pw, home, *REFMOUNT, "mount", refs_path, mnt)
        assert result.returncode == 1 and result.stderr.strip().startswith(
            "refmount: /dev/fuse is not accessible to you"), result.stderr
    with fuse_access(pw.pw_gid):
        if "user_allow_other" not in Path("/etc/fuse.conf").read_text().split():
            result = as_user(pw, home, *REFMOUNT, "mount", "--allow-other", refs_path, mnt)
            assert result.returncode == 1 and "user_allow_other" in result.stderr and "/etc/fuse.conf" in result.stderr
        for unmount in (["refmount", "umount"], ["fusermount3", "-u"]):
            result = as_user(pw, home, *REFMOUNT, "mount", "--view", "raw", refs_path, mnt, check=True)
            log_file = home / "state" / "refmount" / (str(mnt).strip("/").replace("/", "-") + ".log")
            # one line, nothing about kernel tuning (root only, skipped silently)
            assert result.stderr.strip().splitlines() == [f"refmount: mounted {refs_path} on {mnt}; log: {log_file}"]
            assert is_mounted(mnt)
            cat = subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
                                  "cat", str(mnt / "air" / "0.0.0")], capture_output=True, timeout=60)
            assert cat.returncode == 0 and cat.stdout == oracle_bytes(refs, "air/0.0.0", url_to_path=http_data.path_for)
            listed = json.loads(as_user(pw, home, *REFMOUNT, "list", "--json", check=True).stdout)
            [mine] = [m for m in listed if m["mountpoint"] == str(mnt)]
            assert mine["owner"] == pw.pw_uid and mine["refs"] == str(refs_path) and mine["log"] == str(log_file)
            pid = mine["pid"]
            # someone else's mount: a root mount, which the user may not unmount
            other = mount({"a": "x"})
            result = as_user(pw, home, *REFMOUNT, "umount", other.path)
            assert result.returncode == 1 and result.stderr.strip() == (
                f"refmount: '{other.path}' was mounted by user 'root' (uid 0); only they (or root) can unmount it")
            assert is_mounted(other.path)
            other.stop()
            if unmount[0] == "refmount":
                as_user(pw, home, *REFMOUNT, "umount", mnt, check=True)
            else:
                as_user(pw, home, "fusermount3", "-u", mnt, check=True)
            deadline = time.monotonic() + 15
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not is_mounted(mnt) and not os.path.exists(f"/proc/{pid}")
            assert "read of" not in log_file.read_text() and log_file.stat().st_uid == pw.pw_uid
    assert os.stat("/dev/fuse").st_gid != pw.pw_gid or pw.pw_gid == 0
