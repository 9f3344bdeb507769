"""The Python API: `refmount.mount(refs, mountpoint=None, **options)`.

    import refmount, xarray as xr
    with refmount.mount(refs_dict) as m:          # refs: a path, a url, or kerchunk's translate() dict
        ds = xr.open_dataset(m.path, engine="zarr")

The daemon is started the way a user would start it, with `python -m refmount mount` in a child
process (never a fork of the caller: forking a Jupyter kernel or any threaded program is unsafe).
A dict travels to it on stdin (`refmount mount - MNT`), so no temporary file is written.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from refmount.errors import RefmountError

REMOTE_OPTIONS_ENV = "REFMOUNT_REMOTE_OPTIONS"  # --remote-options' default (kept out of `ps`), which mount() sets

_ON_BY_DEFAULT = {"prefetch", "tune_kernel"}  # booleans spelled --no-NAME on the command line
_NOT_HERE = {"foreground", "dry_run", "config"}


def _option_args(options: dict) -> list[str]:
    """Keyword options as `refmount mount` options: cache_size="2G" -> --cache-size 2G."""
    args: list[str] = []
    for name, value in options.items():
        if name in _NOT_HERE:
            raise RefmountError(f"option {name!r} is not available from Python")
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if name in _ON_BY_DEFAULT:
                args += [] if value else [f"--no-{name.replace('_', '-')}"]
            elif value:
                args.append(flag)
        elif value is None:
            continue
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple, set, frozenset)):
            args += [flag, ",".join(map(str, value))]
        else:
            args += [flag, str(value)]
    return args


def _json_value(value):
    """What json cannot write itself in a translate() dict: inline bytes and numpy numbers."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            text = data.decode("ascii")
            if not text.startswith("base64:"):
                return text
        except UnicodeDecodeError:
            pass
        return "base64:" + base64.b64encode(data).decode()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} in a reference set")


def refs_to_json(refs: dict) -> bytes:
    try:
        return json.dumps(refs, default=_json_value).encode()
    except (TypeError, ValueError) as e:
        raise RefmountError(f"the reference dict cannot be written as JSON: {e}") from None


class Mount:
    """A live mount made by `refmount.mount`; a context manager that unmounts on exit.

    Attributes:
        path: the mountpoint (a `pathlib.Path`); the handle is also path-like (`os.fspath(m)`).
        refs: the reference set as given (a path or url), or "stdin" for a dict.
        pid: the daemon's process id, or None if the mount could not tell it.
        log_file: where the daemon logs, as `refmount mount` announced it (a path, or
            "syslog (journalctl -t refmount)").
        mounted: False once `unmount()` has run.
    """

    def __init__(self, path: Path, refs: str, log_file: str | None, temporary: bool) -> None:
        self.path = path
        self.refs = refs
        self.log_file = log_file
        self._temporary = temporary
        self.mounted = True
        try:
            self.pid: int | None = int(os.getxattr(path, "user.refmount.pid"))
        except (OSError, ValueError):
            self.pid = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        state = "mounted" if self.mounted else "unmounted"
        return f"<refmount.Mount {self.refs!r} on {str(self.path)!r} ({state}, log: {self.log_file})>"

    def stats(self) -> dict:
        """The daemon's live counters, as `refmount stats MOUNTPOINT --json` prints them."""
        from refmount.fuse.summary import read_stats

        return read_stats(str(self.path))

    def unmount(self, lazy: bool = False) -> None:
        """Unmount (waiting for the daemon to exit); a temporary mountpoint is removed too."""
        if not self.mounted:
            return
        from refmount.fuse.daemon import umount
        from refmount.fuse.table import mount_entry

        if mount_entry(str(self.path)) is not None:
            umount(str(self.path), lazy=lazy)
        self.mounted = False
        if self._temporary:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> "Mount":
        return self

    def __exit__(self, *exc) -> None:
        self.unmount()


def mount(refs: str | os.PathLike | dict, mountpoint: str | os.PathLike | None = None, **options: object) -> Mount:
    """Mount the reference set `refs` on `mountpoint`; return once the mount answers.

    Args:
        refs: a path, a url, or a reference dict such as kerchunk's `translate()` output (sent to the
            daemon on its stdin, never written to a file).
        mountpoint: an empty directory; None makes a temporary one, removed at unmount, and the mount
            then never outlives this process (`--owner-pid`).
        **options: `refmount mount`'s options as keywords, with underscores: cache_size="2G",
            view="raw", remote_options={"anon": True}, allow_protocols={"https", "s3"};
            prefetch=False or tune_kernel=False for --no-prefetch and --no-tune-kernel.

    Returns:
        A `Mount` handle, which unmounts when used as a context manager.

    Raises:
        RefmountError: the mount failed; the message is the command line's one line.
    """
    temporary = mountpoint is None
    if temporary:  # nobody else knows this directory: the mount must not outlive its caller, even a crashed one
        options.setdefault("owner_pid", os.getpid())
    path = Path(tempfile.mkdtemp(prefix="refmount-") if temporary else mountpoint).absolute()
    stdin = None
    if isinstance(refs, dict):
        stdin, refs_arg, shown = refs_to_json(refs), "-", "stdin"
    else:
        refs_arg = shown = os.fspath(refs)
    env = dict(os.environ)
    # remote_options (headers, keys, tokens) go by the environment: a command line's words are every user's
    # to read (`ps`, /proc/PID/cmdline) for the daemon's whole life, its environment only its owner's
    secret = options.pop("remote_options", None)
    if secret is not None:
        env[REMOTE_OPTIONS_ENV] = json.dumps(secret)
    command = [sys.executable, "-m", "refmount", "mount", *_option_args(options), "--", refs_arg, str(path)]
    # the child imports this very refmount, even if the caller found it through sys.path alone
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(command, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        _, stderr = proc.communicate(stdin)
    except BaseException:  # e.g. KeyboardInterrupt in Jupyter: let the CLI end its loading daemon
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        if temporary:
            shutil.rmtree(path, ignore_errors=True)
        raise
    err = stderr.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0:
        if temporary:
            shutil.rmtree(path, ignore_errors=True)
        message = err[-1] if err else f"refmount mount exited with status {proc.returncode}"
        raise RefmountError(message.removeprefix("refmount: "))
    log_file = None
    for line in err:
        if "; log: " in line:
            log_file = line.split("; log: ", 1)[1]
    handle = Mount(path, shown, log_file, temporary)
    if temporary:  # unmount (and remove the directory) at a normal exit too, not only at the owner's death
        atexit.register(_unmount_quietly, handle)
    return handle


def _unmount_quietly(handle: Mount) -> None:
    try:
        handle.unmount(lazy=True)
    except RefmountError:
        pass


__all__ = ["mount", "Mount", "RefmountError"]
