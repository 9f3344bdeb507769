"""Reference-set loaders: JSON (v0/v1, optionally compressed, local or remote), Parquet, and
OPeNDAP's DMR++ (XML, converted at load in a capped scan worker: refs/dmrpp.py, refs/scan/).

Everything is parsed once, at mount time, into a compact `RefSet`; reads never look at strings again.
Every load is bounded (refs/limits.py): keys (--max-keys), reference text once decompressed and text
that `gen` makes (--max-refs-size), the text of one JSON member (--max-value-size), and time
(--load-timeout).
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

import orjson

from refmount.errors import FetchError, RefmountError, RefsError, quote
from refmount.refs.limits import (DEFAULT_LOAD_TIMEOUT, DEFAULT_MAX_VALUE_SIZE, RefsTooBig, ValueTooBig,
                                  default_max_keys, default_max_refs_size, format_size, load_deadline, memory_budget,
                                  memory_limit)

if TYPE_CHECKING:
    from refmount.refs.model import RefSet

_MODEL_NAMES = ("INLINE", "WHOLE_FILE", "Ref", "RefSet", "RefSetBuilder")


def __getattr__(name: str):
    """The model's names, imported when first asked for (the model imports numpy, the loaders trio: the
    CLI, which takes its option defaults from this package's limits, starts without them)."""
    if name in _MODEL_NAMES:
        from refmount.refs import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DEFAULT_MAX_KEYS = default_max_keys()  # from the memory available at start (refs/limits.py)

__all__ = ["INLINE", "WHOLE_FILE", "Ref", "RefSet", "load_refs", "refs_from_dict", "DEFAULT_MAX_KEYS",
           "DEFAULT_LOAD_TIMEOUT", "DEFAULT_MAX_VALUE_SIZE", "default_max_refs_size"]


def load_refs(location: str, *, remote_options: dict | None = None, max_keys: int | None = DEFAULT_MAX_KEYS,
              progress=None, max_refs_size: int | None = None, load_timeout: float | None = DEFAULT_LOAD_TIMEOUT,
              version=None, containers: dict[str, str] | None = None,
              max_value_size: int | None = DEFAULT_MAX_VALUE_SIZE, data_url: str | None = None,
              archive=None, store: str | None = None, serving: bool = False) -> RefSet:
    """Load the reference set at `location` (path or url). Errors are one-line `RefmountError`s.
    `max_refs_size` None means the machine's default; `load_timeout` None or 0 means no limit.
    `version` (refs.icechunk.Version) picks an Icechunk repository's branch, tag or snapshot, and
    `containers` re-points its named virtual chunk containers (name -> url prefix).
    `max_value_size`: the most text one JSON member may have (None: no limit).
    `data_url`: a DMR++'s data file, instead of the one it names (--data-url).
    A data file or an archive of them (refmount.refs.scan) is scanned, with `archive`
    (refs.scan.archive.ArchiveOptions) saying how; `load_timeout` then bounds each file's scan.
    `store` ('zarr', 'icechunk', 'parquet'): what the location is, as a catalog's asset said, rather
    than told by its name or by asking. `serving`: loaded while the mount serves (a catalog's store,
    in a thread), where the process-wide memory net of loading must not be set."""
    from refmount.refs.origins import of_reference_source
    from refmount.refs.scan.archive import ArchiveOptions, is_archive_source, load_archive

    if max_refs_size is None:
        max_refs_size = default_max_refs_size()
    from refmount.refs.zarrremote import NotAStore, load_zarr_location, zarr_store_kind

    import contextlib

    def memory_net():
        return contextlib.nullcontext() if serving else memory_limit(memory_budget(max_keys, max_refs_size))

    asked = None  # (a url whose name said nothing, asked as a store first: an error says how)
    try:
        # (first: a remote store is taken for a store before it is taken for a prefix or a file)
        zarr_kind = zarr_store_kind(location)
        zarr_kind = "remote" if store == "zarr" and zarr_kind != "zip" else zarr_kind
        if zarr_kind is not None and (store is None or zarr_kind != "maybe"):
            try:
                with load_deadline(load_timeout), memory_net():
                    return load_zarr_location(location, zarr_kind, remote_options=remote_options,
                                              max_keys=max_keys, max_bytes=max_refs_size)
            except NotAStore as e:
                if zarr_kind != "maybe":
                    raise
                asked = e.nor
        if store is None and is_archive_source(location, remote_options, archive):
            options = archive or ArchiveOptions(remote_options=remote_options or {})
            return load_archive(location, options, max_keys=max_keys, max_refs_size=max_refs_size,
                                max_value_size=max_value_size, timeout=load_timeout)
        with load_deadline(load_timeout), memory_net():
            loaded = _load(location, remote_options, max_keys, progress, max_refs_size, version, containers,
                           max_value_size, data_url, store)
        if isinstance(loaded, _DmrppFound):  # converted in a scan worker, as a DMR++ in a glob is
            from refmount.refs.scan.archive import load_dmrpp

            loaded = load_dmrpp(location, loaded.stream, archive or ArchiveOptions(remote_options=remote_options or {}),
                                data_url=data_url, max_keys=max_keys, max_refs_size=max_refs_size,
                                max_value_size=max_value_size, timeout=load_timeout)
        if getattr(loaded, "origins", None) is None:  # (a directory's loader says which of its files)
            loaded.origins = of_reference_source(location)  # its inline values are that file's bytes
        return loaded
    except ValueTooBig as e:
        key = f" (key {quote(e.key)})" if e.key is not None else ""
        raise RefsError(f"reference file {quote(location)} holds a single JSON value{key} larger than "
                        f"--max-value-size {format_size(e.limit)} near byte {e.pos} once decompressed "
                        "(raise the option to load it)") from None
    except RefsTooBig as e:
        raise RefsError(f"reference file {quote(location)} exceeds --max-refs-size {format_size(e.limit)} once "
                        "decompressed (raise the option to load it)") from None
    except MemoryError:
        limits = f"--max-refs-size {format_size(max_refs_size)}" + (f", --max-keys {max_keys:,}" if max_keys else "")
        raise RefsError(f"reference file {quote(location)} needs more memory than its limits allow ({limits})") \
            from None
    except RecursionError:  # a last resort: the loaders use loops, and name the key when they can
        raise RefsError(f"reference file {quote(location)} nests too deeply") from None
    except RefmountError as e:
        if asked is None or isinstance(e, FetchError):
            raise
        raise type(e)(f"{e}; nor is it a Zarr store ({asked})") from None


def _load(location, remote_options, max_keys, progress, max_refs_size, version=None, containers=None,
          max_value_size=None, data_url=None, store=None):
    from refmount.refs.icechunk import is_icechunk_location, load_icechunk, reject_version
    from refmount.refs.jsonrefs import load_json
    from refmount.refs.model import RefSetBuilder
    from refmount.refs.source import is_parquet_location, open_reference_file

    if store == "icechunk" or store is None and is_icechunk_location(location, remote_options, version):
        return load_icechunk(location, remote_options=remote_options, version=version, max_keys=max_keys,
                             containers=containers, max_bytes=max_refs_size)
    reject_version(location, version)
    if containers:
        raise RefsError(f"--container applies to Icechunk repositories only; {quote(location)} is not one")
    from refmount.refs.zarrstore import is_zarr_store, load_zarr_store

    if is_zarr_store(location):
        return load_zarr_store(location, max_keys=max_keys, max_bytes=max_refs_size)
    if store == "parquet" or store is None and is_parquet_location(location, remote_options):
        from refmount.refs.parquet import load_parquet

        return load_parquet(location, remote_options=remote_options or {}, max_keys=max_keys,
                            max_bytes=max_refs_size)
    from refmount.refs.relative import resolve_builder_urls

    builder = RefSetBuilder(max_keys, max_refs_size)
    try:
        # one opening tells JSON from a DMR++ (XML) by its first byte; the JSON loader reads on from it
        first = [open_reference_file(location, remote_options)]
        if _is_dmrpp(location, first[0]):
            return _DmrppFound(first[0])
        if data_url:
            raise RefsError(f"--data-url applies to DMR++ files only; {quote(location)} is not one")
        try:
            load_json(lambda: first.pop() if first else open_reference_file(location, remote_options), builder,
                      progress=progress, max_value=max_value_size)
        except RefsError as e:  # the parser's "reference file is empty" and the like, named
            text = str(e)
            if type(e) is RefsError and text.startswith("reference file ") and location != "/dev/stdin":
                raise RefsError(f"reference file {quote(location)} {text.removeprefix('reference file ')}") \
                    from None
            raise
        resolve_builder_urls(builder, location)
        return builder.build()
    except RefmountError:
        raise
    except (OSError, EOFError, ValueError) as e:  # decompression and read errors mid-stream
        raise RefsError(f"cannot read reference file {quote(location)}: {type(e).__name__}: {e}") from None


def _is_dmrpp(location: str, stream) -> bool:
    from refmount.refs.dmrpp import is_dmrpp_text

    if location.partition("?")[0].endswith(".dmrpp"):
        return True
    peek = getattr(stream, "peek", None)
    return bool(peek) and is_dmrpp_text(peek(64)[:64])


class _DmrppFound:
    """`_load`'s answer for a DMR++: the stream it opened (the conversion runs outside the loaders'
    memory net and deadline, in a scan worker with limits of its own)."""

    def __init__(self, stream) -> None:
        self.stream = stream


def refs_from_dict(refs: dict, *, max_keys: int | None = DEFAULT_MAX_KEYS, piece_bytes: int | None = None,
                   max_refs_size: int | None = None) -> RefSet:
    """Load an in-memory reference dict (tests, examples) through the same streaming parser."""
    from refmount.refs.jsonrefs import load_json
    from refmount.refs.model import RefSetBuilder

    text = orjson.dumps(refs)
    builder = RefSetBuilder(max_keys, max_refs_size)
    kwargs = {"piece_bytes": piece_bytes} if piece_bytes else {}
    load_json(lambda: io.BytesIO(text), builder, **kwargs)
    return builder.build()
