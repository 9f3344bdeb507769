"""`refmount scan SOURCE... -o OUT`: the references of data files, written as kerchunk JSON (OUT ending
in .json or .json.gz) or Parquet (any other OUT: a directory in fsspec's LazyReferenceMapper layout,
through kerchunk's refs_to_dataframe). fsspec, GDAL and refmount read either."""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import tempfile

import orjson

from refmount.errors import RefmountError, quote
from refmount.refs.scan.archive import ArchiveOptions, Scanned, combined_refs, refs_dict, scan_source

log = logging.getLogger("refmount")


def output_kind(out: str) -> str:
    lower = out.lower()
    if lower.endswith(".json"):
        return "json"
    if lower.endswith(".json.gz"):
        return "json.gz"
    return "parquet"


def scan_to_file(sources: list[str], out: str, options: ArchiveOptions, *, max_refs_size: int,
                 timeout: float | None) -> int:
    kind = output_kind(out)
    if kind == "parquet" and os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise RefmountError(f"output {quote(out)} exists (Parquet output is a new or empty directory)")
    if len(sources) == 1:
        _, scanned, refs = scan_source(sources[0], options, max_refs_size=max_refs_size, timeout=timeout,
                                       then=lambda kind, scanned, read: combined_refs(kind, scanned, options, read))
    else:
        scanned = _scan_several(sources, options, max_refs_size, timeout)
        _, _, refs = scan_source(f"@{_list_file(scanned)}", options, max_refs_size=max_refs_size, timeout=timeout,
                                 then=lambda kind, files, read: combined_refs(kind, files, options, read))
    refs = refs_dict(refs)  # (one DMR++'s come as JSON bytes)
    if kind == "parquet":
        _write_parquet(refs, out)
    else:
        text = orjson.dumps(refs, option=orjson.OPT_SORT_KEYS)
        _write_atomically(out, gzip.compress(text, 6) if kind == "json.gz" else text)
    log.info("wrote %d references of %d file(s) to %s", len(refs), len(scanned), out)
    return 0


def _scan_several(sources, options, max_refs_size, timeout) -> list[Scanned]:
    """Every file of every source, scanned (each then comes from the scan store when combined)."""
    scanned: list[Scanned] = []
    for source in sources:
        scanned += scan_source(source, options, max_refs_size=max_refs_size, timeout=timeout)[1]
    return scanned


def _list_file(scanned: list[Scanned]) -> str:
    """The files of several sources as one @FILE list (kept until the process ends)."""
    fd, path = tempfile.mkstemp(prefix="refmount-scan-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write("".join(s.url + "\n" for s in scanned))
    import atexit

    atexit.register(os.unlink, path)
    return path


def _write_atomically(path: str, data: bytes) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".refmount-scan-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise RefmountError(f"cannot write {quote(path)}: {e.strerror}") from None


def _write_parquet(refs: dict, out: str) -> None:
    try:
        from kerchunk.df import refs_to_dataframe
    except ImportError as e:
        raise RefmountError(f"Parquet output needs kerchunk and fastparquet or pyarrow: {e}") from None
    target = os.path.abspath(out)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".refmount-scan-")
    try:
        refs_to_dataframe(refs, tmp)
        if os.path.isdir(target):
            os.rmdir(target)  # (empty: checked before scanning)
        os.replace(tmp, target)
    except RefmountError:
        raise
    except Exception as e:  # noqa: BLE001 - pandas/pyarrow errors of every kind
        raise RefmountError(f"cannot write Parquet references to {quote(out)}: {type(e).__name__}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
