"""Which target urls reach only the network, and which may reach this machine's files.

Protocols are classified by what they reach, not by name: fsspec registers several aliases of local
files (`file`, `local`, ...), in-process stores (`memory`), wrappers whose real target is another url
(`simplecache::`, `filecache::`, `blockcache::`, `dir`, `reference`, `zip`/`tar`/`libarchive`
archives, `generic`, `async_wrapper`), and local repositories (`git`, `dvc`). Only the protocols
below that talk to a remote service count as remote; everything else, including anything unknown,
counts as local: a remote reference set may not use it unless `file` is in --allow-protocols.
"""

from __future__ import annotations

import sys

# Protocols whose filesystems reach a remote service over the network.
NETWORK_PROTOCOLS = frozenset({
    "http", "https", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oci", "ocilake", "oss",
    "tos", "tosfs", "hf", "ftp", "sftp", "ssh", "smb", "webdav", "webhdfs", "hdfs", "arrow_hdfs", "dbfs",
    "github", "gist", "box", "dropbox", "gdrive", "jupyter", "jlab", "lakefs", "wandb", "root",
})


# Network protocols whose url names the host their fsspec client connects to, through connections
# refmount cannot check (fetch/addresses.py checks its own http clients'): a document from a public
# address may not name them (fetch/trust.py) unless --allow-protocols lists them. (s3, gs, az and the
# like go to the endpoint the user's options name, whatever the url's bucket.)
HOST_NAMING_PROTOCOLS = frozenset({"ftp", "sftp", "ssh", "smb", "webdav", "webhdfs", "hdfs", "arrow_hdfs", "root",
                                   "jupyter", "jlab"})


def protocol_of(location: str) -> str:
    """'file' for plain paths and file:// urls, else the url scheme."""
    if "://" not in location:
        return "file"
    return location.split("://", 1)[0].lower()


def local_path(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


def is_remote(location: str) -> bool:
    return protocol_of(location) != "file"


def protocol_chain(url: str) -> list[str]:
    """The protocol of each element of an fsspec url chain ('simplecache::s3://b/k' -> ['simplecache',
    's3']); a plain path (or a chain ending in one) is 'file'."""
    if url.split("://", 1)[0].lower() in ("http", "https"):
        return [url.split("://", 1)[0].lower()]  # our own HTTP client takes it whole ('::' in an IPv6 host)
    parts = url.split("::")
    chain = []
    for i, part in enumerate(parts):
        if "://" in part:
            chain.append(part.split("://", 1)[0].lower())
        elif i == len(parts) - 1:
            chain.append("file")
        else:
            chain.append(part.lower())  # a bare protocol name in a chain, e.g. 'blockcache'
    return chain


def is_local_protocol(protocol: str) -> bool:
    """True unless `protocol` is known to reach only the network (and no local filesystem class has
    been registered under its name)."""
    if protocol not in NETWORK_PROTOCOLS:
        return True
    if "fsspec.registry" not in sys.modules:  # nothing can have been registered (and fsspec costs 40 ms)
        return False
    from fsspec.implementations.local import LocalFileSystem
    from fsspec.registry import registry

    cls = registry.get(protocol)  # only what is imported already: no imports here
    return isinstance(cls, type) and issubclass(cls, LocalFileSystem)


def reaches_local(url: str) -> bool:
    return any(is_local_protocol(p) for p in protocol_chain(url))
