"""refmount mounts for benches: each a context manager that unmounts in its `finally`, so also on
Ctrl-C (KeyboardInterrupt) and, after system.exit_on_signals(), on SIGTERM and SIGHUP.

The daemon runs this checkout's code (PYTHONPATH=ROOT first) unless `code` names another tree (a
--baseline checkout), whatever refmount the venv has installed."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from harness import ROOT
from harness.system import TreePeak, drop_caches, proc_status_mib, stop, vmhwm_mib, wait_for

PYTHON = sys.executable


@dataclass
class Mount:
    path: Path
    pid: int  # the daemon's
    seconds: float = 0.0  # from the mount command to a mount that answers
    mount_tree_peak_mib: float = 0.0  # with tree_peak: PSS of `refmount mount` + daemon + workers while mounting

    def peak_rss_mib(self) -> float:
        return vmhwm_mib(self.pid)

    def rss_mib(self) -> float:
        return proc_status_mib(self.pid, "VmRSS")

    def stats(self) -> dict:
        return json.loads(os.getxattr(self.path, "user.refmount.stats"))

    def remote_requests(self) -> int:
        return self.stats()["fetch"]["requests"]


def code_env(code: Path | None = None, env: dict | None = None) -> dict:
    """`env` (default: ours) with refmount's code from `code` (default: this checkout) first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(code or ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def wait_cache_dir_free(cache_dir: Path, timeout: float = 120) -> None:
    """Until no daemon holds the lock of the --cache-dir `cache_dir`: `refmount umount` waits 10 s at
    most for its daemon to exit, and one took 29 s under load, so the next mount of the directory was
    refused. (Not by the daemon's pid: pids were reused within a minute here.)"""

    def free() -> bool:
        for lock in cache_dir.glob("*/lock"):
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            finally:
                os.close(fd)  # (the lock goes with it)
        return True

    wait_for(free, f"the last daemon to let go of {cache_dir}", timeout)


def disk_cache_blocks(cache_dir: Path) -> list[Path]:
    """The block files of the --cache-dir `cache_dir`, each object's in block order (listed once, so
    that a timed `cat` of them reads files, not directories, and in the order a sequential reader's
    daemon reads them: a `find` lists a directory in its hash order)."""
    blocks = [p for p in cache_dir.glob("*/*/*/*") if p.name.isdigit()]
    return sorted(blocks, key=lambda p: (str(p.parent), int(p.name)))


def cat_cold_mbps(blocks: list[Path], nbytes: int) -> float:
    """`cat` of the block files `blocks` after dropping the page cache, as MB/s of `nbytes` (the data
    they hold): the disk's own limit for a re-read from the disk cache."""
    drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, blocks)], stdout=subprocess.DEVNULL, check=True)
    return nbytes / (time.perf_counter() - t0) / 1e6


def stat_after_remount_ms(path: Path) -> float:
    """A stat of `path` on a mount just made, in ms: it waits for what the mount looks up first (a
    whole-file reference's size and validator: a HEAD, and the import of the client that sends it), a
    cost of the remount that a re-read timed after it should not carry (reported apart)."""
    t0 = time.perf_counter()
    os.stat(path)
    return (time.perf_counter() - t0) * 1000


def is_mounted(path: Path) -> bool:
    return os.path.ismount(path)


def answers(path: Path) -> bool:
    """Mounted and serving: the root's inode is 1 (a stat of a mount still starting would block)."""
    if not is_mounted(path):
        return False
    try:
        return os.stat(path).st_ino == 1
    except OSError:
        return False


def unmount_if_mounted(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)


def refmount(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`refmount ARGS` with this checkout's code; its stderr through a file (a daemon that a mount leaves
    running keeps what it inherited open, so a pipe would never reach EOF)."""
    import tempfile

    with tempfile.TemporaryFile("w+") as err:
        done = subprocess.run([PYTHON, "-m", "refmount", *args], stdout=subprocess.DEVNULL, stderr=err, text=True,
                              env=code_env(env=env), timeout=timeout)
        err.seek(0)
        done.stderr = err.read()
    return done


@contextmanager
def refmount_mounted(refs: Path, mnt: Path, options: list[str], code: Path | None = None, env: dict | None = None,
                     tree_peak: bool = False):
    """`refmount mount OPTIONS REFS MNT` (the daemon in the background); yields a Mount, unmounts after.
    `tree_peak`: sample the PSS of our descendants while mounting (the loader's forked workers)."""
    mnt = Path(mnt)
    mnt.mkdir(parents=True, exist_ok=True)
    unmount_if_mounted(mnt)
    env = code_env(code, env)
    with TreePeak(include_self=False) if tree_peak else nullcontext() as tree:
        t0 = time.perf_counter()
        # (cwd: `python -m` puts the working directory before PYTHONPATH, so from a checkout a
        # --baseline tree would run that checkout's code)
        done = subprocess.run([PYTHON, "-m", "refmount", "mount", *options, str(Path(refs).absolute()),
                               str(mnt.absolute())], capture_output=True, text=True, env=env, cwd=code or ROOT)
        seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"refmount mount {' '.join(options)} failed: {done.stderr.strip()}")
    try:
        yield Mount(mnt, int(os.getxattr(mnt, "user.refmount.pid")), seconds, tree.peak_mb if tree else 0.0)
    finally:
        if subprocess.run([PYTHON, "-m", "refmount", "umount", str(mnt.absolute())], capture_output=True,
                          env=env, cwd=code or ROOT).returncode != 0:
            unmount_if_mounted(mnt)


@contextmanager
def refmount_foreground(source: Path, mnt: Path, options: list[str], code: Path | None = None,
                        log_path: Path | None = None, timeout: float = 60, env: dict | None = None,
                        launcher: list[str] | None = None):
    """`refmount mount --foreground` as our child (its pid is the daemon's), ready when the mount answers;
    yields a Mount, then SIGTERM (SIGKILL after 30 s) and a lazy unmount of whatever is left. `env`: the
    daemon's environment (default ours); `launcher`: what runs refmount (default `-m refmount`)."""
    mnt = Path(mnt)
    mnt.mkdir(parents=True, exist_ok=True)
    unmount_if_mounted(mnt)
    log_path = log_path or mnt.with_name(mnt.name + ".log")
    with open(log_path, "wb") as log:  # (a pipe nobody reads could fill and stall the daemon)
        t0 = time.monotonic()
        proc = subprocess.Popen([PYTHON, *(launcher or ["-m", "refmount"]), "mount", "--foreground", *options,
                                 str(source), str(mnt)], stdout=log, stderr=subprocess.STDOUT,
                                env=code_env(code, env), cwd=code or ROOT)
    try:
        while not answers(mnt):
            if proc.poll() is not None:
                raise RuntimeError(f"refmount mount failed: {log_path.read_text()[-2000:]}")
            if time.monotonic() > t0 + timeout:
                raise RuntimeError(f"refmount mount did not answer in {timeout:g} s")
            time.sleep(0.01)
        yield Mount(mnt, proc.pid, time.monotonic() - t0)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop(proc)
        unmount_if_mounted(mnt)


def scratch_dir(stack, given: Path | None, parent: str, prefix: str) -> Path:
    """`given`, or a new temporary directory under `parent`; removed (after unmounting its mnt-*) when
    `stack` closes."""
    import tempfile

    path = given or Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path.mkdir(parents=True, exist_ok=True)
    stack.callback(remove_scratch, path)
    return path


def remove_scratch(path: Path) -> None:
    for mnt in Path(path).glob("mnt*"):
        unmount_if_mounted(mnt)
    shutil.rmtree(path, ignore_errors=True)


def cold_read(m: Mount, name: str, expect: int) -> dict:
    """`dd bs=1M` of `name` in the mount after drop_caches: {seconds, cpu (the daemon's), minflt (its minor
    page faults)}; an error if dd did not read `expect` bytes."""
    from harness.system import dd_bytes, drop_caches, proc_minflt, timed

    drop_caches()
    faults = proc_minflt(m.pid)
    seconds, cpu, out = timed(f"dd if={m.path / name} of=/dev/null bs=1M", lambda: m.pid)
    if dd_bytes(out) != expect:
        raise RuntimeError(f"dd read {dd_bytes(out)} of {expect} bytes")
    return {"seconds": seconds, "cpu": cpu, "minflt": proc_minflt(m.pid) - faults}
