"""Mount lifecycle: preflight checks, daemonising, serving, readiness, signals and unmounting.

`refmount mount` forks before anything starts a thread; the child loads the reference set, mounts,
checks that the mount answers, and only then reports "ready" through a pipe, so the parent exits 0
exactly when the filesystem is usable (and prints the child's one-line error otherwise). Under
systemd (`--foreground`, Type=notify) readiness is also sent as READY=1.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from refmount.errors import RefmountError, quote
from refmount.fetch.stats import RedactingFormatter
from refmount.fuse.pyfuse3_build import describe as pyfuse3_build
from refmount.fuse.table import mount_entry

log = logging.getLogger("refmount")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_WARM_UP_WAIT = 5.0  # seconds the mount waits for its HTTP client before it reports ready anyway
_early_stops: list[int] = []  # stop signals received after mounting, before the main loop listened


@dataclass
class MountOptions:
    refs: str
    mountpoint: str
    view: str = "decoded"
    foreground: bool = False
    memory_target: int | None = None  # the whole daemon (cache/target.py); None: 1G, or what the cache sizes add up to
    cache_size: int | None = None  # None: a share of the memory target
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
    decoded_cache_size: int | None = None
    prefetch: bool = True
    cache_dir: str | None = None
    disk_cache_size: int = 10 << 30
    max_full_download: int | None = None  # None: 1G, or --disk-cache-size with --cache-dir
    chars: str | None = None  # an override of every form's characters (refmount.view.forms)
    form: str | None = None  # serve this form to every reader; None: each reader its own
    fallback_form: str = "portable"  # the form of a reader that cannot be identified
    proxy: str | None = None
    owner_pid: int | None = None
    metrics: tuple | None = None  # (address, port) of the Prometheus endpoint (fuse/metrics.py); None: off
    verify_remote: bool = False
    http_client: str = "stdlib"  # "stdlib" (http.client in threads for plain 206s, else aiohttp) or "aiohttp"
    ca_bundle: str | None = None
    cookie_jar: str | None = None  # --cookie-jar: the mount's cookies kept in this Netscape cookie file
    bearer_tokens: dict = field(default_factory=dict)  # host -> the file holding its bearer token
    s3_credentials_url: str | None = None  # temporary S3 credentials from there (fetch/s3creds.py)
    max_refs_size: int | None = None  # None: the machine's default (refs/limits.py)
    max_value_size: int | None = 64 << 20  # the most text one JSON member may have (None: no limit)
    load_timeout: float | None = 300.0
    branch: str | None = None  # Icechunk: which version to mount (one of branch, tag, snapshot)
    tag: str | None = None
    snapshot: str | None = None
    containers: dict = field(default_factory=dict)  # Icechunk: named virtual chunk containers re-pointed
    authorized_containers: set = field(default_factory=set)  # Icechunk: url prefixes of containers to read
    data_url: str | None = None  # DMR++: the data file, instead of the one the DMR++ names
    concat: str | None = None  # data files: combine them along this dimension (refmount.refs.combine)
    identical: tuple = ()  # data files: variables taken once without comparing them
    skip_mismatched: bool = False  # data files: leave out files whose other variables differ
    strict: bool = False  # data files: a file that cannot be scanned fails the mount
    refresh: float | None = None  # --refresh: list the source again every this many seconds (fuse/refresh.py)


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
    entry = mount_entry(mnt)
    if entry is not None:
        raise RefmountError(f"mountpoint {quote(mnt)} is already a mount point (refmount umount it first)")
    try:
        if os.listdir(mnt):
            raise RefmountError(f"mountpoint {quote(mnt)} is not empty (its files would be hidden; use an empty directory)")
    except PermissionError:
        raise RefmountError(f"mountpoint {quote(mnt)} is not readable by you") from None
    if not os.path.exists("/dev/fuse"):
        raise RefmountError("/dev/fuse is missing: FUSE is not available here (modprobe fuse; install fuse3)")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise RefmountError("/dev/fuse is not accessible to you (Debian's udev rules make it mode 0666; "
                            "ask your administrator)")
    if opts.allow_other and os.geteuid() != 0 and not user_allow_other():
        raise RefmountError("--allow-other needs 'user_allow_other' in /etc/fuse.conf for users other than root "
                            "(ask your administrator), or mount without --allow-other")


def user_allow_other(conf: str = "/etc/fuse.conf") -> bool:
    try:
        with open(conf) as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def check_remote_options(urls, remote_options: dict) -> None:
    """Create each target filesystem (other than http, which has its own client) now, so that an
    option the installed backend does not know fails the mount in one line, not the first read."""
    from refmount.fetch.protocols import protocol_of

    protocols = {protocol_of(u) for u in urls} - {"http", "https", "file", "local"}
    if not protocols:
        return
    import fsspec

    for protocol in sorted(protocols):
        try:  # the same arguments as the fetcher's backend (fetch/fsspec_backend.py) will use
            fs = fsspec.filesystem(protocol, skip_instance_cache=True, **remote_options)
            connect = getattr(fs, "connect", None)  # s3fs checks its session arguments only here
            if callable(connect) and hasattr(fs, "set_session"):
                connect()
        except ImportError as e:
            raise RefmountError(f"protocol {protocol!r} is not available: {e}") from None
        except (TypeError, ValueError) as e:
            bad = re.search(r"unexpected keyword argument '([^']+)'", str(e))
            backend = fsspec.get_filesystem_class(protocol).__module__.split(".")[0]
            if bad:
                raise RefmountError(f"--remote-options: {backend} does not accept {bad.group(1)!r}") from None
            raise RefmountError(f"--remote-options for {protocol}://: {e}") from None


# -- logging ---------------------------------------------------------------------------------------

def syslog_socket() -> str | None:
    """The syslog socket (the journal's, under systemd) a background daemon logs to, if one listens.
    REFMOUNT_SYSLOG_SOCKET names another path, or none when empty (tests; hosts whose syslog listens
    elsewhere)."""
    path = os.environ.get("REFMOUNT_SYSLOG_SOCKET", "/dev/log")
    if not path or not os.path.exists(path):
        return None
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):  # a socket nobody listens on counts as none
        with socket.socket(socket.AF_UNIX, kind) as probe:
            try:
                probe.connect(path)
                return path
            except OSError:
                continue
    return None


def log_directory() -> str:
    """Where per-mount log files go when there is no syslog: $REFMOUNT_LOG_DIR if set, else
    /var/log/refmount for root, else the user's XDG state directory."""
    if os.environ.get("REFMOUNT_LOG_DIR"):
        return os.environ["REFMOUNT_LOG_DIR"]
    if os.geteuid() == 0:
        return "/var/log/refmount"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "refmount")


def default_log_file(mountpoint: str) -> str:
    """One file per mountpoint, named like systemd names mount units: /mnt/era5 -> mnt-era5.log."""
    name = os.path.abspath(mountpoint).strip("/").replace("/", "-") or "root"
    return os.path.join(log_directory(), name + ".log")


def log_destination(opts: MountOptions) -> tuple[str | None, str]:
    """(syslog socket or None, what to tell the user) for a background daemon: --log-file if given,
    else syslog when present, else a per-mount file (created here, so a failure is a mount error)."""
    if opts.log_file:
        return None, opts.log_file
    socket_path = syslog_socket()
    if socket_path:
        return socket_path, "syslog (journalctl -t refmount)"
    path = default_log_file(opts.mountpoint)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    except OSError as e:
        raise RefmountError(f"cannot write the log file {quote(path)}: {e.strerror} (choose one with --log-file)") from None
    open_log(path).close()
    return None, path


def open_log(path: str):
    """The log file, opened to append. In a directory others may write (/tmp), only a file of this
    user's own is: another user's symlink there would have the daemon append its lines (names a
    document gave among them) to a file of their choosing, root's ~/.bashrc say, and a file of theirs
    would get every line. (What the kernel's protected_symlinks and protected_regular do, when on.)"""
    from refmount.cache import owned

    shared = owned.problem(os.path.dirname(os.path.abspath(path))) is not None
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | (os.O_NOFOLLOW if shared else 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        why = "it is a symlink in a directory others may write" if e.errno == errno.ELOOP else e.strerror
        raise RefmountError(f"cannot write the log file {quote(path)}: {why} (choose one with --log-file)") from None
    owner = os.fstat(fd).st_uid
    if shared and owner != os.geteuid():
        os.close(fd)
        raise RefmountError(f"cannot write the log file {quote(path)}: it belongs to uid {owner}, in a directory "
                            "others may write (choose one with --log-file)")
    return os.fdopen(fd, "a", encoding="utf-8")


class _LogFile(logging.FileHandler):
    def _open(self):
        return open_log(self.baseFilename)


_FILE_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def setup_logging(level: str, log_file: str | None, syslog: str | None = None, also_stderr: bool = False) -> None:
    """Log to `log_file` or the `syslog` socket (and then to stderr too, warnings only, with
    `also_stderr`), else to stderr."""
    handlers: list[logging.Handler] = []
    if syslog:
        from logging.handlers import SysLogHandler  # (imported for --syslog only: 10-15 ms of a warm mount)

        handler: logging.Handler = SysLogHandler(address=syslog)
        handler.setFormatter(RedactingFormatter("refmount[%(process)d]: %(levelname)s: %(message)s"))
        handlers.append(handler)
    if log_file:
        handler = _LogFile(log_file)
        handler.setFormatter(RedactingFormatter(_FILE_FORMAT))
        handlers.append(handler)
    if also_stderr or not handlers:
        handler = logging.StreamHandler(sys.stderr)
        if handlers:  # the file or syslog has everything; the terminal only what needs attention
            handler.setLevel(logging.WARNING)
        # journald adds its own timestamps; a terminal user wants short lines
        handler.setFormatter(RedactingFormatter("refmount: %(levelname)s: %(message)s"))
        handlers.append(handler)
    root = logging.getLogger("refmount")
    root.setLevel(getattr(logging, level.upper()))
    root.handlers[:] = handlers
    root.propagate = False


def _detach() -> None:
    """After readiness a background daemon lets go of the terminal (or the pipe of whoever started
    it, which would otherwise never see EOF); its log goes on in its file, or to syslog."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    root = logging.getLogger("refmount")
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler:
            root.removeHandler(handler)


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
    syslog, shown = log_destination(opts)
    log_file = None if syslog else shown
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the daemon
        os.close(read_fd)
        os.setsid()  # its own process group: an interrupted mount kills it and its loader workers at once
        status = 1
        try:
            # until ready, the user also sees warnings on the terminal
            setup_logging(opts.log_level, log_file, syslog, also_stderr=True)
            status = serve(opts, ready=write_fd, log_shown=shown)
        except RefmountError as e:
            _report(write_fd, f"ERR {e}")
        except BaseException as e:  # never let a traceback escape a forked child
            _report(write_fd, f"ERR internal error: {type(e).__name__}: {e}")
        finally:
            os._exit(status)
    os.close(write_fd)
    try:
        with _signals_interrupt():
            message = _read_report(read_fd)
    except KeyboardInterrupt:
        _abandon(pid, opts.mountpoint)
        raise
    finally:
        os.close(read_fd)
    if message.startswith("OK "):  # "OK <the source as shown>": the daemon has fetch.trust (and trio) imported
        sys.stderr.write(f"refmount: mounted {message[3:]} on {opts.mountpoint}; log: {shown}\n")
        return 0
    if message.startswith("ERR "):
        os.waitpid(pid, 0)
        raise RefmountError(message[4:])
    os.waitpid(pid, 0)
    raise RefmountError("the refmount daemon exited before the mount was ready (run with --foreground to see why)")


@contextlib.contextmanager
def _signals_interrupt():
    """SIGTERM and SIGHUP interrupt the waiting CLI like Ctrl-C does, so that it can clean up."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signals = (signal.SIGTERM, signal.SIGHUP)
    saved = [signal.signal(s, interrupt) for s in signals]
    try:
        yield
    finally:
        for s, handler in zip(signals, saved):
            signal.signal(s, handler)


def _reaped(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        time.sleep(0.02)
    return False


def _abandon(pid: int, mountpoint: str) -> None:
    """The user gave up on a mount still loading: end the daemon's whole process group (it and its
    loader workers), and remove a mount it may have made in the meantime."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        if _reaped(pid, 5.0):
            break
    entry = mount_entry(mountpoint)
    if entry is not None and entry["fstype"] == "fuse.refmount":
        _fusermount(["-u", "-z", mountpoint])


def _parent_gone(fd: int | None) -> bool:
    """Whether the CLI that waits on the ready pipe has gone away (its read end closed)."""
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _report(fd: int | None, message: str) -> bool:
    """Send one line to the waiting CLI, secrets redacted (a signed url a loader's error names); False if
    nobody is waiting any more."""
    from refmount.fetch.stats import redact

    if fd is None:
        return True
    try:
        os.write(fd, (redact(message).replace("\n", " ") + "\n").encode())
        return True
    except OSError:
        return False


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


def shown_refs(refs: str) -> str:
    """The reference set as `refmount list`, findmnt and df show it: urls as given but their secrets
    (a signed url's token: /proc/mounts is world-readable), paths absolute, an @FILE list as '@' and
    its absolute path."""
    from refmount.fetch.stats import redact
    from refmount.fetch.trust import shown_location

    return redact(shown_location(refs))


def fsname_option(refs: str) -> str:
    """The mount's source as findmnt and df show it: the reference set. libfuse splits options at
    commas, so those (and backslashes) are escaped."""
    return "fsname=" + refs.replace("\\", "\\\\").replace(",", "\\,")


def serve(opts: MountOptions, ready: int | None, log_shown: str | None = None) -> int:
    """Load, mount and serve until unmounted or signalled. Runs in the daemon process."""
    from refmount.cache.malloc import configure_malloc
    from refmount.fuse.early import BeginLoading

    configure_malloc()  # before any thread makes a heap of its own
    metrics = None
    if opts.metrics:  # first: a port in use fails the mount at once, before anything is loaded
        from refmount.fuse.metrics import bind_metrics

        metrics = bind_metrics(opts.metrics)
    if opts.proxy:  # the http(s) targets' client follows the usual variables (as aiohttp's trust_env)
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            os.environ[name] = opts.proxy
    # the listing's first page is asked while the code below is imported (--refresh: checked first)
    early = None if opts.refresh else BeginLoading(opts)
    import pyfuse3
    import trio

    from refmount.fuse.fuse_ops import FuseOperations

    fs, fetcher = _build(opts, early)
    check_remote_options(fs.refset.urls, opts.remote_options)
    fs.mount_info = {"refs": shown_refs(opts.refs), "log": log_shown or opts.log_file or "stderr"}
    operations = FuseOperations(fs)
    fuse_options = {fsname_option(shown_refs(opts.refs)), "subtype=refmount", "ro", "default_permissions", "noatime"}
    if opts.allow_other:
        from refmount.fuse.access import LocalAccess

        fuse_options.add("allow_other")
        fs.local_access = LocalAccess()  # other users open local files' keys only if they may read the files
    if _parent_gone(ready):  # interrupted while loading: never mount behind the user's back
        raise RefmountError("the mount was interrupted")
    # From the mount on, a stop signal must unmount: it is noted until the main loop listens for
    # signals (the default action would end the process and leave a dead mount behind)
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda signum, _frame: _early_stops.append(signum))
    try:
        pyfuse3.init(operations, opts.mountpoint, fuse_options)
    except RuntimeError as e:
        raise RefmountError(f"cannot mount on {quote(opts.mountpoint)}: {e}") from None

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            # The HTTP client is made ready alongside, and the mount is announced once it is (or
            # after _WARM_UP_WAIT): a first read right after `refmount mount` returns would
            # otherwise wait 0.1-0.3 s for it.
            warmed = trio.Event()
            nursery.start_soon(_warm_up, fetcher, fs.refset.urls, warmed)
            nursery.start_soon(_look_up_sizes, fs, warmed)
            nursery.start_soon(_announce_ready, opts, ready, warmed)
            nursery.start_soon(_stop_on_signals, nursery)
            nursery.start_soon(fs.governor.run)
            if getattr(fs, "refresher", None) is not None:
                nursery.start_soon(fs.refresher.run)
            if metrics is not None:
                from refmount.fuse.metrics import serve_metrics, shown_address

                nursery.start_soon(serve_metrics, metrics, fs.stats)
                log.info("metrics at http://%s/metrics", shown_address(*opts.metrics))
            if opts.owner_pid:
                nursery.start_soon(_unmount_when_gone, opts.owner_pid)
            await pyfuse3.main(min_tasks=4, max_tasks=256)
            nursery.cancel_scope.cancel()
        if hasattr(fs, "scanner"):  # a lazily mounted glob's scanners
            fs.scanner.close()
        await fetcher.aclose()

    try:
        trio.run(main)
    finally:
        sd_notify("STOPPING=1")
        pyfuse3.close(unmount=True)
        disk = sys.modules.get("refmount.cache.disk")  # (imported only with --cache-dir)
        if disk is not None:
            disk.DiskCache.close_all()
    log.info("unmounted %s", opts.mountpoint)
    return 0


def _build(opts: MountOptions, early):
    """build_filesystem; a --concat glob's on its first index page as last answered while the page
    itself travels (fetch/pageguess.py), and built again on the page as it came if that was not the
    same. (Not with --cache-dir, whose disk cache a first build holds, nor --refresh: no page ahead.)
    The fetcher's warm-up is begun as soon as it is built: its imports pass under the page too."""
    from refmount.fetch.pages import guess_pages
    from refmount.fuse.assemble import build_filesystem

    def warming(built):
        fs, fetcher = built
        fetcher.begin_warm_up(fs.refset.urls)  # imports in a thread while the mount comes up
        return built

    guess = None
    if early is not None and opts.concat and not opts.cache_dir:
        from refmount.refs.scan.store import ScanStore, default_scan_dir

        guess = guess_pages(ScanStore(default_scan_dir()))
    try:
        try:
            built = warming(build_filesystem(opts, early))
        except Exception:
            if guess is None or guess.right():  # (the build's own error, as on the page itself)
                raise
        else:
            if guess is None or guess.right():
                return built
            _let_go(*built)
            del built  # (before the second build: not two in memory)
    finally:
        guess_pages(None)
    return warming(build_filesystem(opts, early))


def _let_go(fs, fetcher) -> None:
    """A build that is not served (built on a wrong page guess): its fetcher's warm-up thread joined
    and its connections and files closed, its scanners stopped, before the build again."""
    fetcher.close_unused()
    if hasattr(fs, "scanner"):
        fs.scanner.close()
    log.debug("the build on the guessed page let go: its warm-up thread joined, its fetcher closed")


async def _warm_up(fetcher, urls, warmed) -> None:
    """Ready the remote backends, then set `warmed`. Need not succeed now: errors show up in use."""
    try:
        await fetcher.warm_up(urls)
    except Exception as e:
        log.debug("warm-up: %s", e)
    finally:
        warmed.set()


_SIZES_AT_MOUNT = 16  # whole-file references whose objects' sizes a mount looks up at once (at most)


async def _look_up_sizes(fs, warmed) -> None:
    """Once the HTTP client is warm, the sizes of the remote objects of the raw view's whole-file
    references, when there are only a few: a stat of such a file needs its object's size, and the
    first one would otherwise wait for the lookup (two round trips on a new connection: 0.16 s at
    80 ms, before `dd` reads a byte). Not waited for; a lookup that fails is left for the first use
    of the file to report."""
    import trio

    from refmount.refs import WHOLE_FILE

    lengths = getattr(fs.refset, "length", None)
    if fs.view.name != "raw" or lengths is None:
        return
    first_whole = (lengths == WHOLE_FILE).nonzero()[0][: _SIZES_AT_MOUNT + 1]
    whole = [int(i) for i in first_whole if fs.refset.exists(int(i))]
    if not whole or len(whole) > _SIZES_AT_MOUNT:
        return

    async def look_up(i: int) -> None:
        try:
            await fs.view.size(i)
        except Exception as e:  # noqa: BLE001 - the first read of the file reports it
            log.debug("size of %s at mount: %s", fs.refset.key(i), e)

    await warmed.wait()
    async with trio.open_nursery() as nursery:
        for i in whole:
            nursery.start_soon(look_up, i)


async def _announce_ready(opts: MountOptions, ready: int | None, warmed=None) -> None:
    """Report readiness once the mount answers a stat (which our own main loop serves) and the
    remote backends are warm (`warmed` is set), or have had _WARM_UP_WAIT seconds."""
    import pyfuse3
    import trio

    from refmount.fuse.tuning import tune_kernel

    deadline = time.monotonic() + 30
    while True:
        try:
            # abandon_on_cancel: a signal that ends the main loop while this stat waits for it
            # must not leave the daemon waiting for the thread (the stat is answered once the
            # session is closed and the mount gone)
            st = await trio.to_thread.run_sync(os.stat, opts.mountpoint, abandon_on_cancel=True)
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
    if warmed is not None:
        with trio.move_on_after(_WARM_UP_WAIT):
            await warmed.wait()
    if ready is not None and not _report(ready, f"OK {shown_refs(opts.refs)}"):  # the CLI gave up: undo the mount
        log.warning("mount of %s on %s was interrupted: unmounting", shown_refs(opts.refs), opts.mountpoint)
        pyfuse3.terminate()
        return
    log.info("mounted %s on %s (view: %s; %s)", shown_refs(opts.refs), opts.mountpoint, opts.view, pyfuse3_build())
    sd_notify("READY=1")
    if ready is not None:
        os.close(ready)
        _detach()


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` (None if it does not exist): a PID alone may be reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


async def _unmount_when_gone(pid: int, interval: float = 0.5) -> None:
    """--owner-pid: unmount once that process has exited (a Jupyter kernel killed on restart, a
    script that crashed before it could unmount)."""
    import pyfuse3
    import trio

    started = _process_start(pid)
    while started is not None and _process_start(pid) == started:
        await trio.sleep(interval)
    log.info("process %d, the owner of this mount, has exited: unmounting", pid)
    pyfuse3.terminate()


async def _stop_on_signals(nursery) -> None:
    import pyfuse3
    import trio

    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        if _early_stops:  # a signal came while the mount was coming up (serve)
            log.info("received %s: unmounting", signal.Signals(_early_stops[0]).name)
            pyfuse3.terminate()
            return
        async for signum in signals:
            log.info("received %s: unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


# -- unmounting -------------------------------------------------------------------------------------

def _user_name(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def umount(mountpoint: str, lazy: bool = False, timeout: float = 10.0) -> int:
    """Unmount whether or not the daemon is alive; wait for a live daemon to exit."""
    entry = mount_entry(mountpoint)
    if entry is None:
        raise RefmountError(f"{quote(mountpoint)} is not mounted")
    owner = re.search(r"user_id=(\d+)", entry["super_options"])
    if os.geteuid() != 0 and owner and int(owner.group(1)) != os.getuid():
        raise RefmountError(f"{quote(mountpoint)} was mounted by {_user_name(int(owner.group(1)))}; only they "
                            "(or root) can unmount it")
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
