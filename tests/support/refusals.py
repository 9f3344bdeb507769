"""A mount that must be refused: the check many tests make of `refmount mount`'s error."""

from __future__ import annotations

import subprocess
from pathlib import Path


def refused_mount(*args, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`refmount mount ARGS... MNT`, expected to fail; unmounted again if it mounted after all."""
    from tests.conftest import is_mounted, run_refmount  # (conftest imports tests.support)

    result = run_refmount("mount", *args, timeout=timeout, **kw)
    if is_mounted(args[-1]):
        run_refmount("umount", args[-1])
    return result


def refusal_line(source, mountpoint, *options, timeout: float = 120, **kw) -> str:
    """Run `refmount mount SOURCE OPTIONS... MOUNTPOINT` (the mountpoint made if missing), which must
    fail with one line on stderr and no traceback; that line."""
    Path(mountpoint).mkdir(exist_ok=True)
    result = refused_mount(source, *options, mountpoint, timeout=timeout, **kw)
    assert result.returncode != 0, f"{source} was mounted"
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    return line
