"""Every front door keeps out what the reference-set door keeps out (issue 38, "one trust boundary").

A remote document never reaches a local file, however it enters the mount: a DMR++ on an HTTP server
whose chunk href is `file://` or `local://`, listed in an @FILE list (lazily, eagerly with --strict or
--concat, in both views), mounted by url, or a remote JSON set listed in an @FILE list. A local one
still may: a local directory's DMR++ naming a local data file mounts as before. The secret stands for
/etc/shadow: a root-only file in the test's directory (and /etc/shadow's own first bytes, where this
machine has one, must not show either). Real mounts, a real loopback HTTP server (tests.conftest).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tests.conftest import is_mounted, run_refmount
from tests.support.dmrpp_files import make_netcdf, write_dmrpp
from tests.support.refusals import refused_mount

SECRET = b"refmount-front-door-secret-0123456789abcdefghijklmnopqrstuvwxyz"


@pytest.fixture
def secret(tmp_path) -> Path:
    path = tmp_path / "root-only" / "shadow"
    path.parent.mkdir()
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def forbidden(secret: Path) -> list[bytes]:
    """What must never be read through a mount: the secret's first bytes, and /etc/shadow's."""
    out = [SECRET[:16]]
    try:
        with open("/etc/shadow", "rb") as f:
            shadow = f.read(40)
        if len(shadow) >= 8:
            out.append(shadow[:8])
    except OSError:
        pass
    return out


def evil_dmrpp(href: str, dataset_href: str = "OPeNDAP_DMRpp_DATA_ACCESS_URL") -> bytes:
    """A DMR++ whose one variable's chunk is `href` (a chunk's own href overrides the data file)."""
    return ('<?xml version="1.0" encoding="UTF-8"?><Dataset xmlns="http://xml.opendap.org/ns/DAP/4.0#" '
            'xmlns:dmrpp="http://xml.opendap.org/dap/dmrpp/1.0.0#" dapVersion="4.0" name="evil.h5" '
            f'dmrpp:href="{dataset_href}">'
            '<UInt8 name="x"><Dim size="40"/><dmrpp:chunks><dmrpp:chunkDimensionSizes>40</dmrpp:chunkDimensionSizes>'
            f'<dmrpp:chunk href="{href}" offset="0" nBytes="40" chunkPositionInArray="[0]"/></dmrpp:chunks></UInt8>'
            '</Dataset>').encode()


def everything_read(root: Path, limit: int = 1 << 20) -> tuple[bytes, list[str]]:
    """The bytes of every file below `root` that can be read, and the paths that could not (bounded)."""
    data, failed = [], []
    for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: failed.append(e.filename)):
        for name in filenames:
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data.append(f.read(limit))
            except OSError:
                failed.append(os.path.join(dirpath, name))
    return b"".join(data), failed


@pytest.fixture
def good(server) -> str:
    """A real netCDF-4 file and its DMR++ on the server: the url of the DMR++."""
    data = make_netcdf(server.root / "good.nc")
    write_dmrpp(data, server.root / "good.nc.dmrpp")
    return server.url_for("good.nc.dmrpp")


def refused(tmp_path: Path, *args):
    """`refmount mount ARGS... MNT` that must fail (tests.support.refusals.refused_mount), and MNT."""
    mnt = tmp_path / "mnt"
    mnt.mkdir(exist_ok=True)
    return refused_mount(*args, mnt), mnt


def listing(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "list.txt"
    path.write_text("".join(line + "\n" for line in lines))
    return path


HREFS = ["file://{secret}", "local://{secret}", "file:///etc/shadow", "local:///etc/shadow"]


@pytest.mark.parametrize("view", ["raw", "decoded"])
@pytest.mark.parametrize("href", HREFS)
def test_a_remote_dmrpp_in_an_at_list_reaches_no_local_file_lazily(mount, server, good, secret, tmp_path, view, href):
    href = href.format(secret=secret)
    (server.root / "evil.h5.dmrpp").write_bytes(evil_dmrpp(href))
    evil_url = server.url_for("evil.h5.dmrpp")
    m = mount(f"@{listing(tmp_path, evil_url, good)}", "--view", view)
    assert sorted(os.listdir(m.path)) == ["evil.h5", "good.nc"]
    with pytest.raises(OSError) as e:
        os.listdir(m / "evil.h5")
    assert e.value.errno == errno.EIO
    data, _ = everything_read(m.path)
    assert b"DMR++ test file" in data or (m / "good.nc" / ".zattrs").exists()  # the good file reads
    for secret_bytes in forbidden(secret):
        assert secret_bytes not in data
    line = next(line for line in m.log().splitlines() if href in line)
    assert evil_url in line and "named by remote" in line and "--allow-protocols" in line


@pytest.mark.parametrize("href", HREFS[:2])
@pytest.mark.parametrize("args", [["--strict"], ["--strict", "--view", "raw"]])
def test_with_strict_the_whole_mount_is_refused_in_one_line(server, good, secret, tmp_path, href, args):
    href = href.format(secret=secret)
    (server.root / "evil.h5.dmrpp").write_bytes(evil_dmrpp(href))
    evil_url = server.url_for("evil.h5.dmrpp")
    result, mnt = refused(tmp_path, *args, f"@{listing(tmp_path, evil_url, good)}")
    assert result.returncode != 0 and not is_mounted(mnt)
    assert href in result.stderr and evil_url in result.stderr and "Traceback" not in result.stderr
    assert SECRET[:16].decode() not in result.stderr


@pytest.mark.parametrize("view", ["raw", "decoded"])
def test_with_concat_the_remote_dmrpp_is_left_out(mount, server, good, secret, tmp_path, view):
    href = f"local://{secret}"
    (server.root / "evil.h5.dmrpp").write_bytes(evil_dmrpp(href))
    evil_url = server.url_for("evil.h5.dmrpp")
    m = mount(f"@{listing(tmp_path, evil_url, good)}", "--concat", "time", "--view", view)
    data, failed = everything_read(m.path)
    assert not failed and data
    for secret_bytes in forbidden(secret):
        assert secret_bytes not in data
    assert "x" not in os.listdir(m.path)  # (the evil file's variable)
    assert any(href in line and "left out" in line for line in m.log().splitlines())


@pytest.mark.parametrize("href", HREFS[:2])
def test_the_same_dmrpp_mounted_by_url_is_refused(server, secret, tmp_path, href):
    href = href.format(secret=secret)
    (server.root / "evil.h5.dmrpp").write_bytes(evil_dmrpp(href))
    result, _ = refused(tmp_path, server.url_for("evil.h5.dmrpp"))
    assert result.returncode != 0 and href in result.stderr and "--allow-protocols" in result.stderr
    assert len([line for line in result.stderr.splitlines() if ": INFO: " not in line]) == 1


def test_a_remote_dataset_href_to_a_local_alias_is_refused_too(mount, server, good, secret, tmp_path):
    """The data file the Dataset's dmrpp:href names (not a chunk's href) is a target of the DMR++ too."""
    body = evil_dmrpp(str(server.url_for("x")), dataset_href=f"local://{secret}").replace(
        f' href="{server.url_for("x")}"'.encode(), b"")
    (server.root / "evil.h5.dmrpp").write_bytes(body)
    m = mount(f"@{listing(tmp_path, server.url_for('evil.h5.dmrpp'), good)}", "--view", "raw")
    data, failed = everything_read(m.path)
    assert str(m / "evil.h5") in failed and SECRET[:16] not in data


def test_a_remote_json_set_listed_in_an_at_list_serves_no_local_file(mount, server, good, secret, tmp_path):
    """An @FILE list holds data files and DMR++s; a JSON reference set there is not one of them (it is
    left out as not a data file), and never lends its targets the list's trust."""
    (server.root / "evil.json").write_text(json.dumps({".zgroup": '{"zarr_format":2}', "k": [f"file://{secret}", 0, 40]}))
    m = mount(f"@{listing(tmp_path, server.url_for('evil.json'), good)}", "--view", "raw")
    data, _ = everything_read(m.path)
    assert SECRET[:16] not in data


def test_a_local_directory_of_dmrpp_files_still_reaches_local_files(mount, secret, tmp_path):
    """A local document may name local files: a local DMR++ beside (or naming) its local data file."""
    local = tmp_path / "local"
    local.mkdir()
    data = make_netcdf(local / "a.nc")
    write_dmrpp(data, local / "a.nc.dmrpp")
    (local / "b.h5.dmrpp").write_bytes(evil_dmrpp(f"file://{secret}"))  # (the secret stands for a local data file)
    for args in ([], ["--strict"]):
        m = mount(local, "--view", "raw", *args)
        assert (m / "b.h5" / "x" / "0").read_bytes() == SECRET[:40]
        assert (m / "a.nc" / "lat" / ".zarray").exists()
        m.stop()
    m = mount(f"@{listing(tmp_path, str(local / 'b.h5.dmrpp'))}", "--view", "raw")
    assert (m / "b.h5" / "x" / "0").read_bytes() == SECRET[:40]


def test_a_remote_set_reaches_its_own_server_by_relative_targets_and_no_local_file(mount, server, secret, tmp_path):
    (server.root / "d").mkdir()
    (server.root / "d" / "0.bin").write_bytes(b"relative target bytes, forty bytes long!")
    (server.root / "d" / "refs.json").write_text(json.dumps({"k": ["0.bin", 0, 40]}))
    m = mount(server.url_for("d/refs.json"), "--view", "raw")
    assert (m / "k").read_bytes() == b"relative target bytes, forty bytes long!"
    (server.root / "d" / "evil.json").write_text(json.dumps({"k": ["0.bin", 0, 40], "s": [f"file://{secret}", 0, 40]}))
    result, _ = refused(tmp_path, server.url_for("d/evil.json"))
    assert result.returncode != 0 and f"file://{secret}" in result.stderr and "--allow-protocols" in result.stderr


def test_the_mount_message_and_refmount_list_show_the_list_by_its_absolute_path(mount, tmp_path, monkeypatch):
    local = tmp_path / "local"
    local.mkdir()
    write_dmrpp(make_netcdf(local / "a.nc"), local / "a.nc.dmrpp")
    lst = listing(tmp_path, str(local / "a.nc"))
    monkeypatch.chdir(tmp_path)
    m = mount("@list.txt", "--view", "raw").wait_announced()
    assert f"mounted @{lst} on {m.path}" in m.log()
    assert "/@" not in m.log()
    shown = run_refmount("list")
    assert f"@{lst}" in shown.stdout and f"{tmp_path}/@" not in shown.stdout
