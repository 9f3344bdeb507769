"""refmount: mount kerchunk/fsspec reference sets as a read-only FUSE filesystem.

From Python: `refmount.mount(refs, mountpoint=None, **options)` (see refmount.api).
"""

__version__ = "0.1.0"

from refmount.errors import RefmountError  # noqa: E402


def mount(refs, mountpoint=None, **options):
    """Mount `refs` (a path, a url or a reference dict) and return a `refmount.api.Mount` handle,
    a context manager that unmounts on exit. Options are `refmount mount`'s, as keywords."""
    from refmount.api import mount as _mount

    return _mount(refs, mountpoint, **options)


__all__ = ["__version__", "mount", "RefmountError"]
