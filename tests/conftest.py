"""Shared fixtures: real FUSE mounts (always cleaned up, by PID), loopback HTTP servers, datasets."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# h5py before netCDF4: the two wheels bundle their own HDF5, and h5py fails ("Not property objects")
# once netCDF4's is loaded first in the same process (the tests import both, in any order)
import h5py  # noqa: F401,E402

from tests.support.rangeserver import RangeServer

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REFMOUNT = [sys.executable, "-m", "refmount"]


def fuse_problem() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    try:
        import pyfuse3  # noqa: F401
    except ImportError as e:
        return f"pyfuse3 does not import: {e}"
    return None


@pytest.fixture(scope="session", autouse=True)
def _fuse_available():
    """Mount tests are the point of this suite: a machine without FUSE fails them, never skips."""
    problem = fuse_problem()
    if problem:
        pytest.fail(f"FUSE is required for refmount's tests: {problem}", pytrace=False)


# The skips CI expects: what only a newer Python can do (.ci/setup runs those tests there too)
EXPECTED_SKIPS_IN_CI = ("needs Python >= 3.12",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skip is a failure (a missing ncdump, GDAL, server or test dependency would
    otherwise pass unseen), except for EXPECTED_SKIPS_IN_CI."""
    _fail_unexpected_skip((yield).get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped at import (`pytest.importorskip` of a test dependency)."""
    _fail_unexpected_skip((yield).get_result())


def _fail_unexpected_skip(report) -> None:
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        if not any(expected in reason for expected in EXPECTED_SKIPS_IN_CI):
            report.outcome = "failed"
            report.longrepr = f"skipped under CI=true, which must not skip: {reason}"


@pytest.fixture(scope="session", autouse=True)
def _daemon_logs_in_tmp(tmp_path_factory):
    """Background daemons of the tests log under a temporary directory, not /var/log or the journal."""
    saved = {k: os.environ.get(k) for k in ("REFMOUNT_LOG_DIR", "REFMOUNT_SYSLOG_SOCKET")}
    os.environ["REFMOUNT_LOG_DIR"] = str(tmp_path_factory.mktemp("daemon-logs"))
    os.environ["REFMOUNT_SYSLOG_SOCKET"] = ""
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def is_mounted(path) -> bool:
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def force_unmount(path) -> None:
    if is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


class Mount:
    """A refmount daemon in --foreground, started and stopped by this test (by PID)."""

    def __init__(self, refs, mountpoint: Path, args=(), log_path: Path | None = None, env=None, cwd=None):
        self.refs = str(refs)
        self.path = Path(mountpoint)
        self.args = list(args)
        self.log_path = log_path or self.path.with_name(self.path.name + ".log")
        self.env = env
        self.cwd = cwd  # the daemon's working directory (None: the test's)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "Mount":
        self.path.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        cmd = [*REFMOUNT, "mount", "--foreground", *self.args, self.refs, str(self.path)]
        env = self.env
        if self.cwd is not None:  # `python -m refmount` from elsewhere must still import this worktree's refmount
            root = str(Path(__file__).resolve().parent.parent)
            env = dict(os.environ if env is None else env)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"refmount exited with {self.proc.returncode}: {self.log()}")
            try:
                if is_mounted(self.path) and os.stat(self.path).st_ino == 1:
                    return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mount did not become ready: {self.log()}")

    def wait_announced(self, timeout: float = 30.0) -> "Mount":
        """Wait until the daemon logs its mount as ready (its remote backends warm): `start` returns
        as soon as the kernel mount answers, which may be a second earlier on a loaded machine."""
        deadline = time.monotonic() + timeout
        while f" on {self.path} (view: " not in self.log():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"mount was not announced: {self.log()}")
            time.sleep(0.02)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        force_unmount(self.path)
        if getattr(self, "_log", None):
            self._log.close()

    def stats(self) -> dict:
        return json.loads(os.getxattr(self.path, "user.refmount.stats"))

    def __truediv__(self, key: str) -> Path:
        return self.path / key


@pytest.fixture
def mount(tmp_path):
    """mount(refs, *args) -> Mount; refs may be a dict (written as JSON) or a path/url."""
    mounts: list[Mount] = []
    counter = iter(range(1000))

    def make(refs, *args, env=None, cwd=None) -> Mount:
        n = next(counter)
        if isinstance(refs, dict):
            path = tmp_path / f"refs{n}.json"
            path.write_text(json.dumps(refs))
            refs = path
        m = Mount(refs, tmp_path / f"mnt{n}", args, env=env, cwd=cwd)
        mounts.append(m)
        return m.start()

    yield make
    for m in mounts:
        m.stop()


@pytest.fixture
def slow_mount(tmp_path):
    """As `mount`, with room for a big reference set's mount on a loaded machine (15 minutes)."""
    mounts: list[Mount] = []

    def make(refs, *args) -> Mount:
        m = Mount(refs, tmp_path / f"slow-mnt{len(mounts)}", args)
        mounts.append(m)
        return m.start(timeout=900)

    yield make
    for m in mounts:
        m.stop()


def run_refmount(*args, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*REFMOUNT, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def datasets(tmp_path_factory):
    """The real netCDF-4/HDF5 files of tests.support.datasets, built once."""
    from tests.support.datasets import build_all

    return build_all(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def http_data(datasets):
    """A loopback Range-honouring HTTP server over the dataset directory."""
    root = next(iter(datasets.values())).parent
    with RangeServer(root) as server:
        yield server


def _empty_server(root):
    root.mkdir()
    with RangeServer(root) as s:
        yield s


@pytest.fixture
def server(tmp_path):
    """An empty loopback Range server over tmp_path/www; tests put their files there."""
    yield from _empty_server(tmp_path / "www")


@pytest.fixture
def other_server(tmp_path):
    """A second, independent one (another host for redirects)."""
    yield from _empty_server(tmp_path / "www2")
