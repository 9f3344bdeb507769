"""Reference-set loaders: JSON (v0/v1, optionally compressed, local or remote) and Parquet.

Everything is parsed once, at mount time, into a compact `RefSet`; reads never look at strings again.
"""

from __future__ import annotations

import io

import orjson

from refmount.errors import RefmountError, RefsError, quote
from refmount.refs.model import INLINE, WHOLE_FILE, Ref, RefSet, RefSetBuilder
from refmount.refs.source import is_parquet_location, open_reference_file

DEFAULT_MAX_KEYS = 100_000_000

__all__ = ["INLINE", "WHOLE_FILE", "Ref", "RefSet", "load_refs", "refs_from_dict", "DEFAULT_MAX_KEYS"]


def load_refs(location: str, *, remote_options: dict | None = None, max_keys: int | None = DEFAULT_MAX_KEYS,
              progress=None, version=None) -> RefSet:
    """Load the reference set at `location` (path or url). Errors are one-line `RefmountError`s.
    `version` (refs.icechunk.Version) picks an Icechunk repository's branch, tag or snapshot."""
    from refmount.refs.jsonrefs import load_json
    from refmount.refs.icechunk import is_icechunk_location, load_icechunk, reject_version

    if is_icechunk_location(location, remote_options, version):
        return load_icechunk(location, remote_options=remote_options, version=version, max_keys=max_keys)
    reject_version(location, version)
    if is_parquet_location(location, remote_options):
        from refmount.refs.parquet import load_parquet

        return load_parquet(location, remote_options=remote_options or {}, max_keys=max_keys)
    builder = RefSetBuilder(max_keys)
    try:
        load_json(lambda: open_reference_file(location, remote_options), builder, progress=progress)
        return builder.build()
    except RefmountError:
        raise
    except (OSError, EOFError, ValueError) as e:  # decompression and read errors mid-stream
        raise RefsError(f"cannot read reference file {quote(location)}: {type(e).__name__}: {e}") from None


def refs_from_dict(refs: dict, *, max_keys: int | None = DEFAULT_MAX_KEYS, piece_bytes: int | None = None) -> RefSet:
    """Load an in-memory reference dict (tests, examples) through the same streaming parser."""
    from refmount.refs.jsonrefs import load_json

    text = orjson.dumps(refs)
    builder = RefSetBuilder(max_keys)
    kwargs = {"piece_bytes": piece_bytes} if piece_bytes else {}
    load_json(lambda: io.BytesIO(text), builder, **kwargs)
    return builder.build()
