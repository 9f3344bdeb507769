"""Which snapshot a branch, tag or id names, and the repository's configuration, in either layout.

- Format spec 1 (Icechunk 1.x): one small JSON file per ref, `refs/branch.<name>/ref.json` and
  `refs/tag.<name>/ref.json` (a deleted tag leaves `ref.json.deleted`), and `config.yaml`.
- Format spec 2 (Icechunk 2.x): one `repo` file, the only mutable object of the repository (a
  FlatBuffer, schema icechunk-format/flatbuffers/repo.fbs): sorted lists of branches and tags, each
  an index into the list of snapshots, the names of deleted tags, and the configuration serialised
  as FlexBuffers. Icechunk reads it first: when it exists it is the repository's entry point, even
  beside a `refs/` left by an unfinished migration.

Both configurations become the same Python value (serde writes them alike): here only
`virtual_chunk_containers` is used, a mapping of url prefix -> {name, url_prefix, store}.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from refmount.errors import RefsError, quote
from refmount.refs.flatbuf import FormatError, Table
from refmount.refs.icechunk_files import FILE_REPO_INFO, RepoFiles, object_id, read_flatbuffer, unsupported_spec

REPO_FILE = "repo"

# Field numbers of repo.fbs (a union takes two: its type, then its value).
_REPO_SPEC, _REPO_TAGS, _REPO_BRANCHES, _REPO_DELETED_TAGS, _REPO_SNAPSHOTS = 0, 1, 2, 3, 4
_REPO_CONFIG = 9
_REF_NAME, _REF_SNAPSHOT_INDEX = 0, 1
_SNAPSHOT_INFO_ID = 0


@dataclass(frozen=True)
class Version:
    """Which snapshot to mount: exactly one of branch, tag, snapshot (default: branch main)."""

    branch: str | None = None
    tag: str | None = None
    snapshot: str | None = None

    def describe(self) -> str:
        if self.snapshot:
            return f"snapshot {self.snapshot}"
        return f"tag {self.tag!r}" if self.tag else f"branch {self.branch or 'main'!r}"


@dataclass
class RepoInfo:
    """What the entry point of a repository says (spec 2), or how to ask it (spec 1)."""

    spec: int
    writer: str = ""
    branches: dict[str, str] = field(default_factory=dict)  # spec 2: name -> snapshot id
    tags: dict[str, str] = field(default_factory=dict)
    deleted_tags: set[str] = field(default_factory=set)
    snapshots: set[str] = field(default_factory=set)
    config: dict = field(default_factory=dict)


def read_repo_info(files: RepoFiles) -> RepoInfo:
    """The spec-2 `repo` file, parsed; a spec-1 repository (no `repo`) gets its config.yaml only."""
    if not files.exists(REPO_FILE):
        return RepoInfo(spec=1, config=_config_yaml(files))
    spec, writer, buf = read_flatbuffer(files, REPO_FILE, FILE_REPO_INFO)
    what = f"the repo file of Icechunk repository {quote(files.location)}"
    try:
        root = Table.root(buf)
        declared = root.scalar(_REPO_SPEC, "B")
        if declared not in (0, 2) or spec != 2:  # (a spec-1 header on a repo file is no layout we know)
            raise unsupported_spec(what, declared or spec, writer)
        snapshot_ids = [object_id(info.struct_bytes(_SNAPSHOT_INFO_ID, 12) or b"")
                        for info in root.tables(_REPO_SNAPSHOTS)]

        def refs(index: int) -> dict[str, str]:
            out = {}
            for ref in root.tables(index):
                k = ref.scalar(_REF_SNAPSHOT_INDEX, "I")
                if k >= len(snapshot_ids):
                    raise FormatError(f"ref {ref.string(_REF_NAME)!r} points past the list of snapshots")
                out[ref.string(_REF_NAME) or ""] = snapshot_ids[k]
            return out

        v = root.vector_position(_REPO_DELETED_TAGS)
        deleted = set(_strings(buf, v)) if v else set()
        config_bytes = root.bytes_(_REPO_CONFIG)
        info = RepoInfo(spec=2, writer=writer, branches=refs(_REPO_BRANCHES), tags=refs(_REPO_TAGS), deleted_tags=deleted,
                        snapshots=set(snapshot_ids))
    except (FormatError, IndexError, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, RefsError):
            raise
        raise RefsError(f"{what} is malformed ({type(e).__name__}: {e})") from None
    if config_bytes:
        from refmount.refs.flexbuf import FlexError, loads

        try:
            config = loads(config_bytes)
        except (FlexError, UnicodeDecodeError, RecursionError) as e:
            raise RefsError(f"{what}: its configuration is malformed ({e})") from None
        info.config = config if isinstance(config, dict) else {}
    return info


def _strings(buf: bytes, vector_pos: int) -> list[str]:
    """A FlatBuffers vector of strings."""
    import struct

    n = struct.unpack_from("<I", buf, vector_pos)[0]
    out = []
    for k in range(n):
        e = vector_pos + 4 + 4 * k
        s = e + struct.unpack_from("<I", buf, e)[0]
        length = struct.unpack_from("<I", buf, s)[0]
        if s + 4 + length > len(buf):
            raise FormatError("string outside the buffer")
        out.append(bytes(buf[s + 4 : s + 4 + length]).decode("utf-8"))
    return out


def _config_yaml(files: RepoFiles) -> dict:
    """config.yaml of a spec-1 repository ({} if none). Store types are YAML tags (!http, !s3, ...):
    each becomes {type: options}, the form serde gives in spec 2."""
    if not files.exists("config.yaml"):
        return {}
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def tagged(loader, suffix, node):
        if isinstance(node, yaml.MappingNode):
            return {suffix: loader.construct_mapping(node, deep=True)}
        return suffix if isinstance(node, yaml.ScalarNode) else {suffix: loader.construct_sequence(node)}

    _Loader.add_multi_constructor("!", tagged)
    try:
        config = yaml.load(files.read("config.yaml"), Loader=_Loader) or {}
    except yaml.YAMLError as e:
        raise RefsError(f"config.yaml of Icechunk repository {quote(files.location)} is malformed: "
                        f"{str(e).splitlines()[0]}") from None
    return config if isinstance(config, dict) else {}


def resolve_snapshot(files: RepoFiles, info: RepoInfo, version: Version) -> str:
    """The snapshot id a branch or tag points at now (or the given snapshot id, checked)."""
    if info.spec >= 2:
        return _resolve_v2(files, info, version)
    if version.snapshot:
        if not files.exists(f"snapshots/{version.snapshot}"):
            raise RefsError(f"Icechunk repository {quote(files.location)} has no snapshot {version.snapshot!r}")
        return version.snapshot
    if version.tag:
        relpath = f"refs/tag.{version.tag}/ref.json"
        if files.exists(f"refs/tag.{version.tag}/ref.json.deleted"):
            raise RefsError(f"tag {version.tag!r} of Icechunk repository {quote(files.location)} was deleted")
    else:
        relpath = f"refs/branch.{version.branch or 'main'}/ref.json"
    if not files.exists(relpath):
        raise RefsError(f"Icechunk repository {quote(files.location)} has no {version.describe()}")
    try:
        snapshot = json.loads(files.read(relpath))["snapshot"]
    except (ValueError, KeyError, TypeError):
        raise RefsError(f"{relpath} of Icechunk repository {quote(files.location)} is malformed") from None
    return str(snapshot)


def _resolve_v2(files: RepoFiles, info: RepoInfo, version: Version) -> str:
    where = f"Icechunk repository {quote(files.location)}"
    if version.snapshot:
        if version.snapshot not in info.snapshots:
            raise RefsError(f"{where} has no snapshot {version.snapshot!r}")
        return version.snapshot
    if version.tag:
        if version.tag in info.deleted_tags:
            raise RefsError(f"tag {version.tag!r} of {where} was deleted")
        found = info.tags.get(version.tag)
        choices = info.tags
    else:
        found = info.branches.get(version.branch or "main")
        choices = info.branches
    if found is None:
        known = ", ".join(sorted(choices)[:10]) or "none"
        raise RefsError(f"{where} has no {version.describe()} (it has: {known})")
    return found
