"""The objects of an Icechunk repository: where they are read from, and their common binary form.

Every metadata file of Icechunk (the `repo` file of format spec 2, snapshots, manifests, transaction
logs) is a 39-byte header, then a FlatBuffer compressed as the header says:

    magic "ICE🧊CHUNK" (12 bytes) | writer name, space-padded (24) | spec version (1) | file type (1) |
    compression (1: 0 none, 1 zstd)

Spec versions read here: 1 (Icechunk 1.x) and 2 (Icechunk 2.x; spec "2.1" of Icechunk >= 2.1 keeps
the byte 2 and only adds optional fields). A repository of spec 2 may still hold spec-1 snapshots and
manifests (Icechunk's migration rewrites only the entry point), so the version is checked per file.
"""

from __future__ import annotations

import base64
import os

from refmount.errors import RefsError, quote
from refmount.fetch.protocols import is_remote, local_path

MAGIC = "ICE🧊CHUNK".encode()
HEADER_BYTES = len(MAGIC) + 24 + 3
FILE_SNAPSHOT, FILE_MANIFEST, FILE_TRANSACTION_LOG, FILE_REPO_INFO = 1, 2, 4, 6
FILE_NAMES = {FILE_SNAPSHOT: "snapshot", FILE_MANIFEST: "manifest", FILE_TRANSACTION_LOG: "transaction log",
              FILE_REPO_INFO: "repo info"}
SUPPORTED_SPECS = (1, 2)
SUPPORTED_TEXT = "format specs 1 and 2 (Icechunk 1.x and 2.x)"
_RFC4648 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_CROCKFORD = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_TO_CROCKFORD = bytes.maketrans(_RFC4648, _CROCKFORD)


def object_id(raw: bytes) -> str:
    """Icechunk's text form of an object id: Crockford base32, no padding."""
    return base64.b32encode(raw).rstrip(b"=").translate(_TO_CROCKFORD).decode()


class RepoFiles:
    """Reads the repository's own objects (local directory, or any fsspec url)."""

    def __init__(self, location: str, remote_options: dict | None = None, max_bytes: int | None = None) -> None:
        self.location = location.rstrip("/")
        self.max_bytes = max_bytes  # --max-refs-size: the most one metadata file may hold, decompressed
        self.remote = is_remote(location)
        self.remote_options = remote_options or {}
        self._fs = None
        if self.remote:
            import fsspec

            from refmount.refs.source import fsspec_options

            # (http(s): the mount's one Trail, as the reference file's client: its logins, the user's
            # headers to the origin only, redirects as auth.py decides, addresses as addresses.py checks)
            self._fs, self._root = fsspec.core.url_to_fs(self.location, **fsspec_options(self.location,
                                                                                          self.remote_options))
        else:
            self._root = os.path.abspath(local_path(self.location))

    def url(self, relpath: str) -> str:
        """The url a chunk object is read from (an absolute path for a local repository)."""
        return f"{self.location}/{relpath}" if self.remote else os.path.join(self._root, relpath)

    def exists(self, relpath: str) -> bool:
        if not self.remote:
            return os.path.exists(os.path.join(self._root, relpath))
        try:  # (not fsspec's exists: its http says False for a 503, and a branch would be "not there")
            self._fs.info(f"{self._root}/{relpath}")
        except Exception as e:  # noqa: BLE001 - every backend's errors
            self._unavailable(relpath, e)
            return False
        return True

    def _unavailable(self, relpath: str, error: Exception) -> None:
        """A FetchError when `relpath` could not be had for a reason that may pass (a 503, a connection
        refused): asked again later, not taken for an object the repository lacks."""
        from refmount.refs.source import unavailable

        passing = unavailable(f"{relpath} of Icechunk repository {quote(self.location)}", error)
        if passing is not None:
            raise passing from None

    def read(self, relpath: str) -> bytes:
        try:
            if not self.remote:
                with open(os.path.join(self._root, relpath), "rb") as f:
                    return f.read()
            return self._fs.cat_file(f"{self._root}/{relpath}")
        except FileNotFoundError as e:
            self._unavailable(relpath, e)  # (fsspec's http says a 503 so too)
            raise RefsError(f"Icechunk repository {quote(self.location)} has no {relpath}") from None
        except OSError as e:
            self._unavailable(relpath, e)
            raise RefsError(f"cannot read {relpath} of Icechunk repository {quote(self.location)}: {e}") from None
        except Exception as e:  # network errors of every kind from every fsspec backend
            self._unavailable(relpath, e)
            raise RefsError(f"cannot read {relpath} of Icechunk repository {quote(self.location)}: "
                            f"{type(e).__name__}: {e}") from None


def unsupported_spec(what: str, spec: int, writer: str) -> RefsError:
    by = f", written by {writer}" if writer else ""
    return RefsError(f"{what} has Icechunk format spec {spec}{by}; refmount reads {SUPPORTED_TEXT}")


def parse_header(data: bytes, what: str, file_type: int) -> tuple[int, str, memoryview]:
    """(spec version, writer name, compressed body) of an Icechunk file, checked: its magic, a
    supported spec version, the expected file type and a known compression."""
    if len(data) < HEADER_BYTES or not data.startswith(MAGIC):
        raise RefsError(f"{what} is not an Icechunk file")
    writer = bytes(data[len(MAGIC) : len(MAGIC) + 24]).decode("utf-8", "replace").strip()
    spec, kind, compression = data[HEADER_BYTES - 3 : HEADER_BYTES]
    if spec not in SUPPORTED_SPECS:
        raise unsupported_spec(what, spec, writer)
    if kind != file_type:
        found = FILE_NAMES.get(kind, f"type {kind}")
        raise RefsError(f"{what} is an Icechunk {found} file, expected a {FILE_NAMES[file_type]} file")
    if compression not in (0, 1):
        raise RefsError(f"{what}: unknown Icechunk compression {compression}")
    return spec, writer, memoryview(data)[HEADER_BYTES:]


def read_flatbuffer(files: RepoFiles, relpath: str, file_type: int) -> tuple[int, str, bytes]:
    """(spec version, writer, decompressed FlatBuffer) of one metadata file of the repository."""
    what = f"{'the repo file' if relpath == 'repo' else relpath} of Icechunk repository {quote(files.location)}"
    data = files.read(relpath)
    spec, writer, body = parse_header(data, what, file_type)
    if data[HEADER_BYTES - 1] == 0:
        return spec, writer, bytes(body)
    import zstandard

    try:
        return spec, writer, _decompress(body, files.max_bytes)
    except zstandard.ZstdError as e:
        raise RefsError(f"{what}: corrupt zstd data: {e}") from None


def _decompress(body: memoryview, max_bytes: int | None = None) -> bytes | bytearray:
    """zstd data decompressed into one buffer of the size its frame header announces (a manifest of
    a million references is 76 MB: reading it in growing pieces would need twice that), at most
    `max_bytes` (RefsTooBig): a 98 kB manifest of zeros inflated to 3 GB at mount, and a --refresh
    that meets one loads without the load's memory limit."""
    import zstandard

    from refmount.refs.limits import RefsTooBig

    reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
    size = zstandard.frame_content_size(body)
    if max_bytes is not None and size > max_bytes:
        raise RefsTooBig(max_bytes)
    if size <= 0:
        out = reader.read(-1 if max_bytes is None else max_bytes + 1)
        if max_bytes is not None and len(out) > max_bytes:
            raise RefsTooBig(max_bytes)
        return out
    out = bytearray(size)
    view, filled = memoryview(out), 0
    while filled < size:
        got = reader.readinto(view[filled:])
        if not got:
            break
        filled += got
    rest = reader.read(-1 if max_bytes is None else max_bytes + 1 - filled)
    if max_bytes is not None and filled + len(rest) > max_bytes:
        raise RefsTooBig(max_bytes)
    if filled < size or rest:  # (not what the header said: take what there is)
        return bytes(view[:filled]) + rest
    return out
