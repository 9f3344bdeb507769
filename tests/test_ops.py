"""Operations: systemd units and sd_notify, mount(8)/fstab, S3 through moto, stats, xattrs, dry-run."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refmount.fstab import options_to_args
from tests.conftest import Mount, force_unmount, is_mounted, run_refmount
from tests.support.datasets import kerchunk_refs, oracle_bytes, to_v0, write_refs
from tests.support.moto import moto_server

REPO = Path(__file__).resolve().parent.parent


def test_systemd_units_verify():
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing (Debian package systemd)"
    units = sorted(str(p) for p in (REPO / "systemd").iterdir())
    # --man=no: a minimal system (Debian 13's debootstrap) has no man pages, and verify would fail on
    # the units' Documentation=man:fusermount3(1) otherwise
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    service = (REPO / "systemd" / "refmount@.service").read_text()
    assert "Type=notify" in service and "ExecStop=" in service and "--config /etc/refmount/%i.toml" in service


def test_sd_notify_ready_only_once_the_mount_answers(tmp_path, datasets):
    refs = tmp_path / "refs.json"
    write_refs(kerchunk_refs(datasets["zlib"]), refs)
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(address)
        sock.settimeout(60)
        m = Mount(refs, tmp_path / "mnt", env={**os.environ, "NOTIFY_SOCKET": address})
        m.path.mkdir()
        m._log = open(m.log_path, "wb")
        m.proc = subprocess.Popen([sys.executable, "-m", "refmount", "mount", "--foreground", str(refs), str(m.path)],
                                  stdout=m._log, stderr=subprocess.STDOUT, env=m.env)
        try:
            message = sock.recv(4096).decode()
            assert message == "READY=1"
            assert is_mounted(m.path) and (m.path / ".zgroup").read_bytes()  # it answers right away
            m.proc.terminate()
            assert sock.recv(4096).decode() == "STOPPING=1"
            assert m.proc.wait(15) == 0
        finally:
            m.stop()


def test_config_file_carries_every_option(tmp_path, datasets):
    refs = tmp_path / "refs.json"
    write_refs(kerchunk_refs(datasets["zlib"]), refs)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    config = tmp_path / "x.toml"
    config.write_text(f'refs = "{refs}"\nmountpoint = "{mnt}"\nview = "raw"\ncache-size = "64M"\n'
                      'read_timeout = 5\nallow-protocols = ["file", "https"]\nremote-options = {anon = true}\n'
                      'prefetch = false\n')
    try:
        result = run_refmount("mount", "--config", config)
        assert result.returncode == 0, result.stderr
        assert os.getxattr(mnt, "user.refmount.view") == b"raw"
        assert run_refmount("umount", "--config", config).returncode == 0
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)
    config.write_text('refs = "x.json"\n')
    result = run_refmount("mount", "--config", config)
    assert result.returncode == 1 and "lacks mountpoint" in result.stderr


def test_fstab_options_map_onto_cli_options():
    assert options_to_args("ro,_netdev,allow_other,cache_size=2G,view=raw,x-systemd.automount,nofail") == \
        ["--allow-other", "--cache-size", "2G", "--view", "raw"]


def test_mount_t_fuse_refmount_and_umount(tmp_path, datasets):
    helper = Path("/sbin/mount.fuse.refmount")
    assert helper.exists(), "mount.fuse.refmount is not installed (bash .ci/setup installs it)"
    refs = tmp_path / "refs.json"
    write_refs(kerchunk_refs(datasets["zlib"]), refs)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "fuse.refmount", str(refs), str(mnt), "-o", "ro,view=raw,cache_size=64M"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert is_mounted(mnt) and os.getxattr(mnt, "user.refmount.view") == b"raw"
        pid = int(os.getxattr(mnt, "user.refmount.pid"))
        assert subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0
        assert not is_mounted(mnt)
        for _ in range(100):  # the daemon notices the unmount and exits
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("daemon did not exit after umount")
    finally:
        force_unmount(mnt)


def test_stats_and_xattrs(mount, datasets, http_data):
    refs = kerchunk_refs(datasets["air"], url=http_data.url_for(datasets["air"].name))
    mnt = mount(refs, "--view", "raw")
    before = json.loads(run_refmount("stats", "--json", mnt.path).stdout)
    data = (mnt / "air" / "0.0.0").read_bytes()
    after = json.loads(run_refmount("stats", "--json", mnt.path).stdout)
    assert after["fetch"]["requests"] >= before["fetch"]["requests"] + 1
    assert after["fetch"]["bytes"] >= before["fetch"]["bytes"] + len(data)
    assert after["cache"]["misses"] > before["cache"]["misses"]
    assert "p50_ms" in after["fetch"]["latency"]
    (mnt / "air" / "0.0.0").read_bytes()
    os.system("echo 1 > /proc/sys/vm/drop_caches")
    (mnt / "air" / "0.0.0").read_bytes()
    assert json.loads(run_refmount("stats", "--json", mnt.path).stdout)["cache"]["hits"] > after["cache"]["hits"]
    human = run_refmount("stats", mnt.path).stdout
    assert "requests" in human and "hits" in human
    url, offset, length = refs["refs"]["air/0.0.0"]
    out = subprocess.run(["getfattr", "-d", str(mnt / "air" / "0.0.0")], capture_output=True, text=True).stdout
    assert f'user.refmount.url="{url}"' in out
    assert f'user.refmount.offset="{offset}"' in out and f'user.refmount.length="{length}"' in out


def test_decoded_view_xattrs_show_codecs(mount, datasets):
    mnt = mount(kerchunk_refs(datasets["shuffle_zlib"]))
    chunk = next(p for p in (mnt.path).rglob("*") if p.is_file() and not p.name.startswith("."))
    assert os.getxattr(chunk, "user.refmount.codecs").decode() == "zlib -> shuffle"


def test_dry_run_summary(tmp_path, datasets):
    refs = tmp_path / "refs.json"
    write_refs(kerchunk_refs(datasets["groups"]), refs)
    result = run_refmount("mount", "--dry-run", refs, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "keys:" in result.stdout and "arrays:" in result.stdout and "distinct urls:" in result.stdout
    assert "file (1 urls)" in result.stdout and not is_mounted(tmp_path)


# -- S3 through a real S3 API (moto's server on loopback) ------------------------------------------------

@pytest.fixture(scope="module")
def s3_server():
    with moto_server() as endpoint:
        yield endpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_s3_targets_and_reference_file_in_bucket(s3_server, datasets, tmp_path, mount):
    import s3fs

    creds = {"key": "testing", "secret": "testing", "endpoint_url": s3_server}
    fs = s3fs.S3FileSystem(**creds)
    fs.mkdir("refbucket")
    fs.put(str(datasets["groups"]), "refbucket/data/groups.nc")
    refs = kerchunk_refs(datasets["groups"], url="s3://refbucket/data/groups.nc")
    refs["refs"]["missing/0"] = ["s3://refbucket/data/nope.nc", 0, 10]
    local = tmp_path / "refs.json"
    write_refs(refs, local)
    fs.put(str(local), "refbucket/refs.json")
    mnt = mount("s3://refbucket/refs.json", "--view", "raw", "--read-timeout", "5",
                "--remote-options", json.dumps(creds))
    v0 = to_v0(refs)
    for key in v0:
        if key.startswith("missing/"):
            continue
        expected = oracle_bytes(v0, key, url_to_path=lambda u: datasets["groups"])
        got = (mnt / key).read_bytes()
        if key.endswith((".zarray", ".zattrs", ".zgroup")) and not isinstance(v0[key], str):
            assert json.loads(got) == json.loads(expected), key
        else:
            assert got == expected, key
    with pytest.raises(OSError):
        (mnt / "missing" / "0").read_bytes()
    assert "missing/0" in mnt.log() and "nope.nc" in mnt.log()
