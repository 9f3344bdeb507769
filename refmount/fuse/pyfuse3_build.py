"""Which pyfuse3 serves the mount: refmount's build (.ci/pyfuse3/nogil.patch: replies to the kernel
and reads of requests without the GIL) or the plain one (PyPI's or Debian's python3-pyfuse3).

The build is told by its version's local label, "+refmount.nogil", read from the metadata installed
beside the module that was imported (not the first pyfuse3 metadata on sys.path, which may belong to
another copy: a PYTHONPATH tree in front of a venv)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

NOGIL_LABEL = "+refmount.nogil"


@cache
def pyfuse3_version() -> str | None:
    try:
        import pyfuse3
    except ImportError:
        return None

    here = Path(pyfuse3.__file__).resolve().parent.parent  # the site-packages (or tree) holding it
    for meta in sorted(here.glob("pyfuse3-*.dist-info")) + sorted(here.glob("pyfuse3-*.egg-info")):
        version = _metadata_version(meta)
        if version:
            return version
    return getattr(pyfuse3, "__version__", "unknown")


def _metadata_version(meta: Path) -> str | None:
    """The `Version:` of a dist-info's METADATA (an egg-info's PKG-INFO), read directly: importlib.metadata
    costs 25 ms of imports on every mount's start. None for a damaged metadata directory."""
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(meta / name, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip() or None
                    if not line.strip():  # (the headers end at the first empty line)
                        break
        except OSError:
            continue
    return None


def replies_without_gil() -> bool:
    return (pyfuse3_version() or "").endswith(NOGIL_LABEL)


def describe() -> str:
    """For `refmount stats`, --version and the log line at mount."""
    if pyfuse3_version() is None:
        return "pyfuse3 not installed"
    how = "replies without the GIL" if replies_without_gil() else "replies hold the GIL"
    return f"pyfuse3 {pyfuse3_version()} ({how})"
