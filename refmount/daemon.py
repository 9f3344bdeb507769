"""Mount lifecycle: preflight checks, daemonising, serving, readiness, signals and unmounting.

`refmount mount` forks before anything starts a thread; the child loads the reference set, mounts,
checks that the mount answers, and only then reports "ready" through a pipe, so the parent exits 0
exactly when the filesystem is usable (and prints the child's one-line error otherwise). Under
systemd (`--foreground`, Type=notify) readiness is also sent as READY=1.
"""

from __future__ import annotations

import errno
import logging
import logging.handlers
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from refmount.errors import RefmountError, quote

log = logging.getLogger("refmount")


@dataclass
class MountOptions:
    refs: str
    mountpoint: str
    view: str = "decoded"
    foreground: bool = False
    cache_size: int = 512 << 20
    block_size: int = 1 << 20
    remote_options: dict = field(default_factory=dict)
    read_timeout: float = 30.0
    stall_timeout: float = 10.0
    connections: int = 8
    allow_other: bool = False
    allow_protocols: set | None = None
    allow_cross_host_redirects: bool = False
    max_keys: int | None = None
    log_level: str = "info"
    log_file: str | None = None
    tune_kernel: bool = True
    read_ahead_kb: int = 1024
    max_background: int = 64
    decoded_cache_size: int = 256 << 20
    prefetch: bool = True
    cache_dir: str | None = None
    disk_cache_size: int = 10 << 30
    chars: str = "char"
    branch: str | None = None  # Icechunk: which version to mount (one of branch, tag, snapshot)
    tag: str | None = None
    snapshot: str | None = None


# -- mount table helpers ----------------------------------------------------------------------------

def mount_entry(mountpoint: str) -> dict | None:
    """The /proc/self/mountinfo entry for `mountpoint`, if something is mounted there."""
    target = os.path.abspath(mountpoint)
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = None
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        point = fields[4].encode().decode("unicode_escape")
        if point == target:
            found = {"point": point, "fstype": fields[sep + 1], "source": fields[sep + 2],
                     "major_minor": fields[2]}
    return found


def _is_dead_fuse_mount(mountpoint: str) -> bool:
    try:  # statfs always reaches the daemon (stat may be answered from the kernel's attribute cache)
        os.statvfs(mountpoint)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def _fusermount(args: list[str]) -> subprocess.CompletedProcess:
    for tool in ("fusermount3", "fusermount"):
        try:
            return subprocess.run([tool, *args], capture_output=True, text=True)
        except FileNotFoundError:
            continue
    raise RefmountError("fusermount3 is not installed (Debian package 'fuse3')")


def preflight(opts: MountOptions) -> None:
    """Refuse bad mountpoints before anything is loaded; recover a dead previous mount."""
    mnt = opts.mountpoint
    if _is_dead_fuse_mount(mnt):
        log.warning("%s: a previous refmount daemon died; lazily unmounting its dead endpoint", mnt)
        result = _fusermount(["-u", "-z", mnt])
        if result.returncode != 0:
            raise RefmountError(f"mountpoint {quote(mnt)} holds a dead FUSE mount that could not be removed: "
                                f"{result.stderr.strip()}")
    if not os.path.isdir(mnt):
        what = "does not exist" if not os.path.exists(mnt) else "is not a directory"
        raise RefmountError(f"mountpoint {quote(mnt)} {what}")
    if mount_entry(mnt) is not None:
        raise RefmountError(f"mountpoint {quote(mnt)} is already a mount point (refmount umount it first)")
    if not os.path.exists("/dev/fuse"):
        raise RefmountError("/dev/fuse is missing: FUSE is not available here (modprobe fuse; install fuse3)")


# -- logging ---------------------------------------------------------------------------------------

def setup_logging(level: str, log_file: str | None) -> None:
    root = logging.getLogger("refmount")
    root.setLevel(getattr(logging, level.upper()))
    root.handlers.clear()
    if log_file:
        handler: logging.Handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        # journald adds its own timestamps; a terminal user wants short lines
        handler.setFormatter(logging.Formatter("refmount: %(levelname)s: %(message)s"))
    root.addHandler(handler)
    root.propagate = False


def _detach(log_file: str | None) -> None:
    """After readiness a background daemon lets go of the terminal (or the pipe of whoever started
    it, which would otherwise never see EOF) and logs to syslog (the journal) instead."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    if log_file:
        return
    root = logging.getLogger("refmount")
    root.handlers.clear()
    if os.path.exists("/dev/log"):
        try:
            handler = logging.handlers.SysLogHandler(address="/dev/log")
            handler.setFormatter(logging.Formatter("refmount[%(process)d]: %(levelname)s: %(message)s"))
            root.addHandler(handler)
            return
        except OSError:
            pass
    root.addHandler(logging.NullHandler())


# -- systemd ---------------------------------------------------------------------------------------

def sd_notify(message: str) -> bool:
    """Send `message` to systemd's notify socket if there is one (Type=notify units)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as e:
        log.warning("could not notify systemd: %s", e)
        return False


# -- mounting ---------------------------------------------------------------------------------------

def mount(opts: MountOptions) -> int:
    """Entry point of `refmount mount`. Returns the process exit status."""
    preflight(opts)
    if opts.foreground:
        setup_logging(opts.log_level, opts.log_file)
        return serve(opts, ready=None)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_fd)
        os.setsid()
        status = 1
        try:
            setup_logging(opts.log_level, opts.log_file)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            status = serve(opts, ready=write_fd)
        except RefmountError as e:
            _report(write_fd, f"ERR {e}")
        except BaseException as e:  # never let a traceback escape a forked child
            _report(write_fd, f"ERR internal error: {type(e).__name__}: {e}")
        finally:
            os._exit(status)
    os.close(write_fd)
    message = _read_report(read_fd)
    os.close(read_fd)
    if message.startswith("OK"):
        return 0
    if message.startswith("ERR "):
        raise RefmountError(message[4:])
    os.waitpid(pid, 0)
    raise RefmountError("the refmount daemon exited before the mount was ready (run with --foreground to see why)")


def _report(fd: int | None, message: str) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (message.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


def _read_report(fd: int) -> str:
    chunks = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            break
    return b"".join(chunks).decode(errors="replace").strip()


def serve(opts: MountOptions, ready: int | None) -> int:
    """Load, mount and serve until unmounted or signalled. Runs in the daemon process."""
    import pyfuse3
    import trio

    from refmount.assemble import build_filesystem
    from refmount.fuse_ops import FuseOperations

    fs, fetcher = build_filesystem(opts)
    operations = FuseOperations(fs)
    fuse_options = {"fsname=refmount", "subtype=refmount", "ro", "default_permissions", "noatime"}
    if opts.allow_other:
        fuse_options.add("allow_other")
    try:
        pyfuse3.init(operations, opts.mountpoint, fuse_options)
    except RuntimeError as e:
        raise RefmountError(f"cannot mount on {quote(opts.mountpoint)}: {e}") from None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_announce_ready, opts, ready, lambda: fetcher.import_backends(fs.refset.urls))
            nursery.start_soon(_stop_on_signals, nursery)
            await pyfuse3.main(min_tasks=4, max_tasks=256)
            nursery.cancel_scope.cancel()
        await fetcher.aclose()

    try:
        trio.run(main)
    finally:
        sd_notify("STOPPING=1")
        pyfuse3.close(unmount=True)
    log.info("unmounted %s", opts.mountpoint)
    return 0


async def _announce_ready(opts: MountOptions, ready: int | None, then=None) -> None:
    """Report readiness once the mount answers a stat (which our own main loop serves), then do
    `then()` in a thread: work that need not delay readiness (its errors show up later, in use)."""
    import trio

    from refmount.tuning import tune_kernel

    deadline = time.monotonic() + 30
    while True:
        try:
            st = await trio.to_thread.run_sync(os.stat, opts.mountpoint)
            if st.st_ino == 1:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            _report(ready, f"ERR mount on {quote(opts.mountpoint)} does not answer")
            raise RefmountError("mount does not answer")
        await trio.sleep(0.01)
    if opts.tune_kernel:
        tune_kernel(opts.mountpoint, opts.read_ahead_kb, opts.max_background)
    log.info("mounted %s on %s (view: %s)", opts.refs, opts.mountpoint, opts.view)
    sd_notify("READY=1")
    if ready is not None:
        _report(ready, "OK")
        os.close(ready)
        _detach(opts.log_file)
    if then is not None:
        try:
            await trio.to_thread.run_sync(then)
        except Exception as e:
            log.debug("after readiness: %s", e)


async def _stop_on_signals(nursery) -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


# -- unmounting -------------------------------------------------------------------------------------

def umount(mountpoint: str, lazy: bool = False, timeout: float = 10.0) -> int:
    """Unmount whether or not the daemon is alive; wait for a live daemon to exit."""
    entry = mount_entry(mountpoint)
    if entry is None:
        raise RefmountError(f"{quote(mountpoint)} is not mounted")
    pid = None
    if not _is_dead_fuse_mount(mountpoint):
        try:
            pid = int(os.getxattr(mountpoint, "user.refmount.pid"))
        except (OSError, ValueError):
            pid = None
    else:
        lazy = True  # a dead endpoint can only be detached
    result = _fusermount(["-u", *(["-z"] if lazy else []), mountpoint])
    if result.returncode != 0:
        detail = result.stderr.strip() or f"exit status {result.returncode}"
        if "busy" in detail.lower():
            raise RefmountError(f"{quote(mountpoint)} is busy (files open or a shell inside it); "
                                "close them or use 'refmount umount --lazy'")
        raise RefmountError(f"cannot unmount {quote(mountpoint)}: {detail}")
    if pid is not None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
    return 0
