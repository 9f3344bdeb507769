"""A key's provenance: the files its bytes were read or scanned from when they are not a reference.

A reference names its own source (its url), and with --allow-other a key whose target is a local file
opens only for those who may read that file (refmount.fuse.access). Everything else a mount serves was
read from somewhere too: a data file's attributes and small variables are inlined by its scan, a
reference file's inline values are that file's bytes, and the views derive metadata (.zarray rewritten,
.zmetadata, zarr.json, fill chunks) from those. `Origins` says which files stand behind such a key, by
the directory it is in, as the reference set was built:

- a reference file, DMR++ or data file mounted alone: every key is that file's (a data file with a
  DMR++ sidecar: both files');
- one subdirectory per data file (a glob without --concat): a key is its subdirectory's file's, and a
  key outside them (the root's .zgroup, a consolidated .zmetadata) is every file's;
- several files combined (--concat): every key is every file's, since the order, the checks and the
  coordinate's values come from all of them;
- a reference set that is a directory: a Zarr store's keys are their directory's zarr.json's, a
  Parquet set's its .zmetadata's (and an array's inline chunks its records directory's), an Icechunk
  repository's the repository directory's (a directory stands for what is in it: read and search
  permission on it, fuse/access.py).

Only locations that reach local files are kept (plain paths made absolute): a remote file has no
permissions to answer for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Origins:
    default: tuple[str, ...] = ()  # the files behind a key outside every directory of `by_dir`
    by_dir: dict[str, tuple[str, ...]] = field(default_factory=dict)  # directory path -> its files

    def of(self, key: str) -> tuple[str, ...]:
        """The files behind `key`'s bytes (of an inline or derived key: a reference's own url is not
        here): its innermost directory's in `by_dir`, else the default. The root's consolidated
        metadata is every directory's metadata: every file's."""
        if self.by_dir:
            if key == ".zmetadata":
                return self.every()
            end = key.rfind("/")
            while end > 0:
                found = self.by_dir.get(key[:end])
                if found is not None:
                    return found
                end = key.rfind("/", 0, end)
        return self.default

    def every(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.default, *(f for found in self.by_dir.values() for f in found)]))


NONE = Origins()


def origins_of(refset) -> Origins:
    """A reference set's origins (NONE for a set built in memory, or from a remote source alone)."""
    return getattr(refset, "origins", None) or NONE


def of_files(*locations: str | None) -> Origins:
    """Every key's bytes come from these files (Nones and repeats left out)."""
    return Origins(files(*locations))


def files(*locations: str | None) -> tuple[str, ...]:
    """The ones of the locations that reach local files, plain paths made absolute (a remote file has no
    permissions to answer for; Nones and repeats left out)."""
    from refmount.fetch.protocols import is_remote, local_path, reaches_local

    return tuple(dict.fromkeys(loc if is_remote(loc) else os.path.abspath(local_path(loc))
                               for loc in locations if loc and reaches_local(loc)))


def of_reference_source(location: str) -> Origins:
    """The origins of a reference set read from `location` (a reference file, a DMR++, a Parquet, Zarr
    or Icechunk directory): every inline key is its bytes. Standard input redirected from a file is
    that file; a pipe has nothing to answer for but what the mounting user fed it (NONE)."""
    from refmount.fetch.protocols import is_remote, local_path

    if is_remote(location):  # (a chain through a local cache too: what it holds is the remote object's)
        return NONE
    path = os.path.abspath(local_path(location))
    real = os.path.realpath(path)  # (/dev/stdin: the file it was redirected from, or pipe:[N])
    if real.startswith("/proc/") or not (os.path.isfile(real) or os.path.isdir(real)):
        return NONE
    return of_files(real if path.startswith(("/dev/fd/", "/dev/std", "/proc/")) else path)
