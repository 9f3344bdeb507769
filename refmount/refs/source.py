"""Open a reference file wherever it lives (local path, file://, http(s)://, any fsspec url) as a
binary stream, transparently decompressing gzip, bz2, xz and zstd (by suffix or magic bytes)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os

from refmount.errors import RefmountError, quote

_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bz2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}
_SUFFIX = {".gz": "gzip", ".gzip": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}


def protocol_of(location: str) -> str:
    """'file' for plain paths and file:// urls, else the url scheme."""
    if "://" not in location:
        return "file"
    return location.split("://", 1)[0].lower()


def local_path(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


def is_remote(location: str) -> bool:
    return protocol_of(location) != "file"


def _open_raw(location: str, remote_options: dict):
    if not is_remote(location):
        path = local_path(location)
        try:
            return open(path, "rb")
        except FileNotFoundError:
            raise RefmountError(f"reference file {quote(location)} does not exist") from None
        except IsADirectoryError:
            raise RefmountError(f"reference file {quote(location)} is a directory without .zmetadata") from None
        except OSError as e:
            raise RefmountError(f"cannot read reference file {quote(location)}: {e.strerror}") from None
    import fsspec

    try:
        return fsspec.open(location, "rb", **remote_options).open()
    except FileNotFoundError as e:  # fsspec's http raises this for connection failures too
        reason = _connection_failure(e)
        if reason:
            raise RefmountError(f"cannot reach the server of reference file {quote(location)}: {reason}") from None
        raise RefmountError(f"reference file {quote(location)} was not found on its server") from None
    except ImportError as e:
        raise RefmountError(f"cannot open {quote(location)}: {e}") from None
    except Exception as e:  # network errors of every kind from every fsspec backend
        raise RefmountError(f"cannot fetch reference file {quote(location)}: {type(e).__name__}: {e}") from None


def _connection_failure(error: BaseException) -> str | None:
    """Why a connection failed, if the cause chain of `error` says so (else None: truly not found)."""
    import socket

    chain = []
    cause = error.__cause__ or error.__context__
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for cause in chain:
        if isinstance(cause, socket.gaierror):
            host = next((getattr(c, "host", None) for c in chain if getattr(c, "host", None)), None)
            return "cannot resolve host" + (f" {host!r}" if host else "") + f" ({cause.strerror})"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
    for cause in chain:
        if isinstance(cause, OSError) and not isinstance(cause, FileNotFoundError):
            return f"{type(cause).__name__}: {cause}"
    return None


def compression_of(location: str, head: bytes) -> str | None:
    for suffix, kind in _SUFFIX.items():
        if location.lower().endswith(suffix):
            return kind
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    return None


def open_reference_file(location: str, remote_options: dict | None = None):
    """A readable binary stream of the (decompressed) reference file."""
    raw = _open_raw(location, remote_options or {})
    if not isinstance(raw, io.BufferedIOBase) or not hasattr(raw, "peek"):
        raw = io.BufferedReader(raw) if hasattr(raw, "readinto") else raw
    head = raw.peek(8)[:8] if hasattr(raw, "peek") else b""
    kind = compression_of(location, head)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=raw)
    if kind == "bz2":
        return bz2.BZ2File(raw)
    if kind == "xz":
        return lzma.LZMAFile(raw)
    if kind == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def is_parquet_location(location: str, remote_options: dict | None = None) -> bool:
    """A Parquet reference set is a directory holding .zmetadata."""
    if not is_remote(location):
        return os.path.isdir(local_path(location))
    stripped = location.rstrip("/")
    return location.endswith("/") or stripped.endswith((".parq", ".parquet"))
