"""Mount a reference set on every worker of a Dask `distributed` cluster.

    from distributed import Client
    from refmount.dask import RefmountPlugin

    client = Client("scheduler:8786")
    client.register_plugin(RefmountPlugin("https://example.org/era5.json", "/tmp/era5", cache_size="2G"))
    ds = xr.open_dataset("/tmp/era5", engine="zarr", chunks={})   # every worker reads /tmp/era5

Workers that share a machine share its one mount: the first to start mounts, the last to leave
unmounts (a small lock file and a list of worker PIDs named after the mountpoint, in a directory of the
user's own in the system temporary directory, keep count; PIDs of workers that died are dropped).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from pathlib import Path

from distributed.diagnostics.plugin import WorkerPlugin

import refmount
from refmount.api import Mount
from refmount.cache import owned
from refmount.errors import RefmountError
from refmount.fuse.table import mount_entry


class RefmountPlugin(WorkerPlugin):
    """`refmount.mount(refs, mountpoint, **options)` on every worker; unmounted on teardown."""

    def __init__(self, refs, mountpoint: str, **options) -> None:
        self.refs = refs
        self.mountpoint = os.path.abspath(mountpoint)
        self.options = options
        self.name = f"refmount:{self.mountpoint}"  # registering it again replaces it, per mountpoint

    # -- the machine-wide count of workers using the mount --------------------------------------------

    def _state_paths(self) -> tuple[str, str]:
        """In a directory of this user's own in the temporary directory: names of their own in /tmp could
        be another user's symlinks, which a root worker would follow to truncate and write any file."""
        directory = os.path.join(tempfile.gettempdir(), f"refmount-dask-{os.getuid()}")
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        why = owned.problem(directory)
        if why is not None:
            raise RefmountError(f"the Dask plugin's directory {directory!r} {why}; refused")
        base = os.path.join(directory, hashlib.sha1(self.mountpoint.encode()).hexdigest()[:16])
        return base + ".lock", base + ".users"

    @contextlib.contextmanager
    def _users(self):
        lock_path, users_path = self._state_paths()
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(users_path) as f:
                    users = [pid for pid in json.load(f) if _alive(pid)]
            except (OSError, ValueError):
                users = []
            yield users
            with open(users_path, "w") as f:
                json.dump(users, f)

    # -- WorkerPlugin -----------------------------------------------------------------------------------

    def setup(self, worker=None) -> None:
        with self._users() as users:
            entry = mount_entry(self.mountpoint)
            if entry is None or not users:
                if entry is not None and entry["fstype"] == "fuse.refmount":  # left by workers that died
                    Mount(Path(self.mountpoint), "?", None, False).unmount(lazy=True)
                os.makedirs(self.mountpoint, exist_ok=True)
                refmount.mount(self.refs, self.mountpoint, **self.options)
            if os.getpid() not in users:
                users.append(os.getpid())

    def teardown(self, worker=None) -> None:
        with self._users() as users:
            if os.getpid() in users:
                users.remove(os.getpid())
            if not users and mount_entry(self.mountpoint) is not None:
                Mount(Path(self.mountpoint), "?", None, False).unmount()


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        return True


__all__ = ["RefmountPlugin"]
