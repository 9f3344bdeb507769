"""A red-team pass over the whole trust boundary (what a remote source, or another user of the machine,
may make a root daemon do), each attack against real mounts and real loopback servers. The attacks
already shown elsewhere (tests/test_hostile*.py, test_address_guard.py, test_local_access.py,
test_one_trail.py, test_catalogs.py) are not repeated here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import refmount


def _cmdlines() -> list[bytes]:
    """Every process's command line, as any user of the machine reads it (`ps`)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            pass
    return found


def test_remote_options_given_to_the_python_api_are_not_in_any_command_line(server, tmp_path):
    """Attack: `ps` by any user while a mount made with refmount.mount(..., remote_options={"headers":
    {"Authorization": ...}}) runs. Before: the daemon's command line held the token for its whole life.
    After: it travels in the daemon's environment (its owner's only), and still reaches the server."""
    (server.root / "data.bin").write_bytes(bytes(range(256)) * 4)
    refs = {"version": 1, "refs": {
        ".zgroup": '{"zarr_format": 2}',
        "x/.zarray": json.dumps({"chunks": [1024], "compressor": None, "dtype": "|u1", "fill_value": 0,
                                 "filters": None, "order": "C", "shape": [1024], "zarr_format": 2}),
        "x/0": [server.url_for("data.bin"), 0, 1024]}}
    token = "Bearer sEcReT-7f3a9c"
    (tmp_path / "mnt").mkdir()
    with refmount.mount(refs, tmp_path / "mnt", view="raw",
                        remote_options={"headers": {"Authorization": token}}) as m:
        assert (m.path / "x" / "0").read_bytes() == bytes(range(256)) * 4
        assert not [c for c in _cmdlines() if token.encode() in c]
    assert any(h.get("authorization") == token for h in server.stats["headers"])

