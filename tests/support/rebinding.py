"""A name that answers a public address when a catalog is listed and 127.0.0.1 when its data is read
(DNS rebinding), played for real in a network and mount namespace of its own (`unshare --net
--mount`, as root): the loopback interface there also holds two public addresses, 93.184.215.14 (the
catalog's server) and 93.184.215.15 (the data's, at listing), and /etc/hosts is a file of the
scenario's, bind-mounted, which it rewrites between listing and reading (glibc reads it at every
lookup). A server on 127.0.0.1 at the data's port stands for the machine's own services: it serves
the same file, so a read that reached it would succeed.

    unshare --net --mount -- python -m tests.support.rebinding WORKDIR

prints one JSON line of what happened (run by tests/test_address_guard.py); every server and the
mount are stopped before it exits, whatever happened.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

CATALOG_ADDRESS = "93.184.215.14"
PUBLIC_ADDRESS = "93.184.215.15"
NAME = "rebind.example"
DATA_PORT = 8080
RAW = ("--view", "raw", "--block-size", "4K", "--no-prefetch", "--read-timeout", "10")


def _hosts(path: Path, address: str) -> None:
    with open(path, "w") as f:  # (in place: the bind mount is of this inode)
        f.write(f"127.0.0.1 localhost\n::1 localhost\n{address} {NAME}\n")


def _network(work: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in (CATALOG_ADDRESS, PUBLIC_ADDRESS):
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    hosts = work / "hosts"
    _hosts(hosts, PUBLIC_ADDRESS)
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)


def _catalog(root: Path, data_url: str) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "catalog.json").write_text(json.dumps({
        "type": "Catalog", "stac_version": "1.0.0", "id": "c", "description": "rebinding",
        "links": [{"rel": "item", "href": "./item.json", "type": "application/json"}]}))
    (root / "item.json").write_text(json.dumps({
        "type": "Feature", "stac_version": "1.0.0", "id": "day", "geometry": None,
        "properties": {"datetime": "2020-01-01T00:00:00Z"}, "links": [],
        "assets": {"data": {"href": data_url, "type": "application/x-netcdf"}}}))


def _read(path: Path) -> str:
    """'ok' or the errno's name of a whole read of `path`."""
    try:
        path.read_bytes()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    return "ok"


def main(work: Path) -> dict:
    from tests.conftest import Mount
    from tests.support.daily import make_daily
    from tests.support.rangeserver import RangeServer

    _network(work)
    data = work / "data"
    (nc,) = make_daily(data, 1, nlat=721, nlon=1440)  # (24 chunks of 100 KB: most past what a scan reads)
    url = f"http://{NAME}:{DATA_PORT}/{nc.name}"
    _catalog(work / "stac", url)
    out: dict = {}
    with RangeServer(work / "stac", host=CATALOG_ADDRESS) as catalog, \
            RangeServer(data, host=PUBLIC_ADDRESS, port=DATA_PORT) as public, \
            RangeServer(data, host="127.0.0.1", port=DATA_PORT) as internal:
        mount = Mount(f"{catalog.url}/catalog.json", work / "mnt", RAW, log_path=work / "mount.log")
        try:
            mount.start()
            out["listed"] = sorted(os.listdir(mount.path))
            day = mount.path / "day"
            (day / "tas" / ".zarray").read_bytes()  # (its header scanned: what a scan reads is cached)
            scanned = public.stats["requests"]
            out["before"] = {"tas": _read(day / "tas" / "12.0.0"), "public_requests": public.stats["requests"] - scanned}
            # the name now answers loopback; the public server goes away (its kept-alive connections with it)
            _hosts(work / "hosts", "127.0.0.1")
            public.stop()
            out["after"] = {"tas": _read(day / "tas" / "23.0.0")}
            out["internal_requests"] = internal.stats["requests"]
        finally:
            mount.stop()
            out["log"] = mount.log()
    return out


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
