"""A local Zarr store (a directory with a ``zarr.json`` at its root, as zarr-python 3 and
``xarray.to_zarr(zarr_format=3)`` write it, or a v2 one with ``.zgroup``/``.zarray``) as a reference set:
every file is a key, the metadata inline and every other file a byte range ``[path, 0, size]`` of itself.

Mounting one is what lets netCDF-C read it: the decoded view serves Zarr v3 as Zarr v2 (netCDF-C
through 4.10 reads no Zarr v3), sharded arrays as their inner chunks; the raw view serves the store
as it is. Stores over http(s) or S3, and zipped ones: refmount.refs.zarrremote.
"""

from __future__ import annotations

import os

from refmount.errors import RefsError, quote
from refmount.fetch.protocols import is_remote, local_path
from refmount.refs.model import INLINE, RefSet, RefSetBuilder
from refmount.refs.origins import Origins

BATCH = 4096
MAX_METADATA_BYTES = 64 << 20  # one zarr.json (consolidated metadata of a big hierarchy included)


V2_MARKERS = (".zgroup", ".zarray")
METADATA_NAMES = ("zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata")  # inlined


def is_zarr_store(location: str) -> bool:
    """A local directory holding a Zarr v3 store (zarr.json) or a v2 one (.zgroup or .zarray at its
    root; a .zmetadata alone is a Parquet reference set's, refs/parquet.py)."""
    if is_remote(location):
        return False
    root = local_path(location)
    return os.path.isdir(root) and any(os.path.isfile(os.path.join(root, m)) for m in ("zarr.json", *V2_MARKERS))


def load_zarr_store(location: str, *, max_keys: int | None = None, max_bytes: int | None = None) -> RefSet:
    root = os.path.abspath(local_path(location))
    builder = RefSetBuilder(max_keys, max_bytes)
    keys, url_ids, offsets, lengths, inline = [], [], [], [], {}
    metadata_files: dict[str, tuple[str]] = {}  # directory -> its zarr.json (what its metadata keys are)

    def flush() -> None:
        builder.add_batch(keys, url_ids, offsets, lengths, dict(inline))
        keys.clear(), url_ids.clear(), offsets.clear(), lengths.clear(), inline.clear()

    for key, path, size in _files(root):
        if os.path.basename(key) in METADATA_NAMES:
            if size > MAX_METADATA_BYTES:
                raise RefsError(f"{quote(path)} is larger than {MAX_METADATA_BYTES >> 20} MiB")
            with open(path, "rb") as f:
                inline[len(keys)] = f.read()
            metadata_files[key.rpartition("/")[0]] = (path,)
            url_ids.append(INLINE)
            lengths.append(len(inline[len(keys)]))
        else:
            url_ids.append(builder.url_id(path))
            lengths.append(size)
        keys.append(key)
        offsets.append(0)
        if len(keys) >= BATCH:
            flush()
    flush()
    refset = builder.build()
    refset.origins = Origins(metadata_files.pop("", ()), metadata_files)  # (--allow-other: refs/origins.py)
    version = 3 if os.path.isfile(os.path.join(root, "zarr.json")) else 2
    refset.format = f"Zarr v{version} store (a local directory)"
    return refset


def _files(root: str):
    """(key, path, size) of every regular file under `root`, directories in name order; hidden
    files and directories (".DS_Store", editors' leftovers) are not part of the store."""
    stack = [("", root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as e:
            raise RefsError(f"cannot list {quote(directory)}: {e.strerror}") from None
        subdirectories = []
        for entry in entries:
            if entry.name.startswith(".") and entry.name not in METADATA_NAMES:
                continue
            key = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                subdirectories.append((f"{key}/", entry.path))
            elif entry.is_file():
                yield key, entry.path, entry.stat().st_size
        stack.extend(reversed(subdirectories))
