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


REMOUNT = "remount is not supported; unmount and mount again"


class OptionError(Exception):
    pass


def mount_option_names() -> set[str]:
    """The long options `refmount mount` accepts, e.g. '--cache-size'."""
    import argparse

    from refmount.cli import _Parser, add_mount_options

    parser = _Parser(prog="mount.fuse.refmount", add_help=False)
    add_mount_options(parser)
    return {name for action in parser._actions for name in action.option_strings if name.startswith("--")
            and not isinstance(action, argparse._HelpAction)}


def options_to_args(options: str) -> list[str]:
    """-o items as CLI options. An unknown one is refused here, by its own name, before the CLI
    could mistake its value for a positional (and blame the mountpoint)."""
    from refmount.cli import did_you_mean

    known = None
    args: list[str] = []
    for item in filter(None, (o.strip() for o in options.split(","))):
        name, has_value, value = item.partition("=")
        if name == "remount":
            raise OptionError(REMOUNT)
        if name in GENERIC or name.startswith(("x-", "comment", "fsname", "subtype")):
            continue
        flag = "--" + name.replace("_", "-")
        known = known or mount_option_names()
        if flag not in known:
            spelled = {f[2:].replace("-", "_") for f in known}
            raise OptionError(f"unknown mount option {name!r}" + did_you_mean(name, spelled))
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
    if any("remount" in o.split(",") for o in options):  # mount(8) may pass only the mountpoint
        sys.stderr.write(f"refmount: {REMOUNT}\n")
        return 2
    if len(positional) != 2:
        sys.stderr.write("usage: mount.fuse.refmount REFS MOUNTPOINT [-o OPTIONS]\n")
        return 2
    try:
        extra = [a for o in options for a in options_to_args(o)]
    except OptionError as e:
        sys.stderr.write(f"refmount: {e}\n")
        return 2
    return cli_main(["mount", *extra, *positional])


if __name__ == "__main__":
    raise SystemExit(main())
