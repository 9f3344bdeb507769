"""`mount.fuse.refmount`: the mount(8) helper, so that fstab lines and `mount -t fuse.refmount` work.

    mount -t fuse.refmount /data/refs.json /mnt/x -o ro,cache_size=2G
    /data/refs.json  /mnt/x  fuse.refmount  ro,_netdev,allow_other  0 0     (in /etc/fstab)

mount(8) calls ``mount.fuse.refmount SOURCE MOUNTPOINT [-sfnv] -o OPTIONS``. Generic mount options
(ro, _netdev, nofail, x-systemd.*, ...) are mount(8)'s business and skipped; every other option maps
onto the CLI option of the same name (``cache_size=2G`` -> ``--cache-size 2G``, ``allow_other`` ->
``--allow-other``).
"""

from __future__ import annotations

import sys

from refmount.cli import main as cli_main

GENERIC = {"ro", "rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev",
           "nofail", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime", "relatime",
           "strictatime", "sync", "async", "loop"}


def options_to_args(options: str) -> list[str]:
    args: list[str] = []
    for item in filter(None, (o.strip() for o in options.split(","))):
        name, has_value, value = item.partition("=")
        if name in GENERIC or name.startswith(("x-", "comment", "fsname", "subtype")):
            continue
        flag = "--" + name.replace("_", "-")
        args += [flag, value] if has_value else [flag]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    positional, options = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-o" and i + 1 < len(argv):
            options.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("-o") and len(arg) > 2:
            options.append(arg[2:])
        elif arg == "-t" and i + 1 < len(argv):
            i += 1  # the type (fuse.refmount) is implied
        elif arg in ("-s", "-f", "-n", "-v"):
            pass  # sloppy, fake, no-mtab, verbose: nothing to do for us
        else:
            positional.append(arg)
        i += 1
    if len(positional) != 2:
        sys.stderr.write("usage: mount.fuse.refmount REFS MOUNTPOINT [-o OPTIONS]\n")
        return 2
    extra = [a for o in options for a in options_to_args(o)]
    return cli_main(["mount", *extra, *positional])


if __name__ == "__main__":
    raise SystemExit(main())
