"""A mount that must be refused in one line: the check many tests make of `refmount mount`'s error."""

from __future__ import annotations

from pathlib import Path


def refused_mount(source, mountpoint, *options, timeout: float = 120, **kw) -> str:
    """Run `refmount mount SOURCE MOUNTPOINT OPTIONS...` (the mountpoint made if missing), which must
    fail with one line on stderr and no traceback; that line. A mount that succeeds anyway is
    unmounted before the test fails, so it leaves nothing mounted."""
    from tests.conftest import force_unmount, run_refmount  # (conftest imports tests.support)

    Path(mountpoint).mkdir(exist_ok=True)
    result = run_refmount("mount", source, mountpoint, *options, timeout=timeout, **kw)
    if result.returncode == 0:
        force_unmount(mountpoint)
    assert result.returncode != 0, f"{source} was mounted"
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    return line
