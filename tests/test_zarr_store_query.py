"""A native Zarr store whose url carries a query (issue 40): a keeper's ``latest.zarr?email=...``, an
Azure Blob store signed with a SAS token (``x.zarr?sv=...&sig=...``). Every key's request carries the
store's query, after the key; the secret never shows in the mount's log.

Served by nginx that answers 403 to any request without the query; oracles: zarr-python and xarray on
the store itself, nginx's access log (with each request's query), ncdump."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np
import pytest

from tests.conftest import run_refmount
from tests.support.clients import NCDUMP, nczarr_url
from tests.support.nginx import Nginx
from tests.support.refusals import refusal_line
from tests.test_zarr_stores import assert_same_datasets, store_values, write_store

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

SECRET = "S3cr3tSig%2Bx"
QUERY = f"sv=2022-11-02&se=2026-12-01T00%3A00%3A00Z&sig={SECRET}&email=a@b"  # (as an Azure SAS, plus ?email=)


@pytest.fixture(scope="module")
def www(tmp_path_factory) -> Path:
    import warnings

    root = tmp_path_factory.mktemp("www")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (consolidated v3 metadata)
        for name in ("v2c", "v3c", "v2u"):
            write_store(str(root / f"{name}.zarr"), int(name[1]), consolidated=name.endswith("c"))
    return root


@pytest.fixture(scope="module")
def nginx(www, tmp_path_factory):
    """Every request without the store's query refused (403, as a signed url's server does); /idx/:
    the stores with nginx's autoindex."""
    block = (f'root {www}; if ($arg_sig != "{SECRET}") {{ return 403; }} '
             f"location /idx/ {{ alias {www}/; autoindex on; }}")
    with Nginx(tmp_path_factory.mktemp("nginx"), block, "$request_method $request_uri $status") as server:
        yield server


def requests(nginx) -> list[tuple[str, str]]:
    """(path, query) of each request nginx logged."""
    lines = (nginx.root / "logs" / "access.log").read_text().splitlines()
    return [tuple(line.split()[1].partition("?")[::2]) for line in lines]


def assert_all_carry_the_query(asked: list[tuple[str, str]]) -> None:
    """(as the server decodes it: aiohttp sends "%3A" as ":", which a query may hold as it is)"""
    assert asked, "no request"
    assert all(parse_qsl(query) == parse_qsl(QUERY) for _, query in asked), asked


@pytest.mark.parametrize("name", ["v2c", "v3c"])
def test_a_store_url_with_a_query_mounts_and_reads_what_zarr_reads(mount, www, nginx, name):
    before = len(requests(nginx))
    raw = mount(f"{nginx.url}/{name}.zarr?{QUERY}", "--view", "raw", "--log-level", "debug")
    assert_same_datasets(raw.path, str(www / f"{name}.zarr"))
    assert_same_datasets(raw.path, str(www / f"{name}.zarr"), "sub")
    decoded = mount(f"{nginx.url}/{name}.zarr?{QUERY}", "--log-level", "debug").wait_announced()
    mounted = zarr.open_group(str(decoded.path), mode="r")
    for path, values in store_values(str(www / f"{name}.zarr")).items():
        np.testing.assert_array_equal(np.asarray(mounted[path][...]), values, err_msg=path)
    asked = requests(nginx)[before:]
    assert_all_carry_the_query(asked)
    # chunks were asked for, one the store lacks among them (a 404 read as the fill value)
    assert any(path.endswith(("/temp/1.0", "/temp/c/1/0")) for path, _ in asked), asked
    assert any(path.endswith(("/temp/0.0", "/temp/c/0/0")) for path, _ in asked), asked
    with open("/proc/self/mountinfo") as f:  # (findmnt's source: world-readable)
        assert SECRET not in f.read()
    for m in (raw, decoded):
        assert SECRET not in m.log() and "sig=***" in m.log()
        assert SECRET.encode() not in os.getxattr(m.path, "user.refmount.refs")


@pytest.mark.parametrize("name", ["v2c", "v3c"])
def test_ncdump_header_of_a_store_with_a_query_makes_no_request_after_the_mount(mount, nginx, name):
    m = mount(f"{nginx.url}/{name}.zarr?{QUERY}").wait_announced()
    time.sleep(0.3)
    before = len(requests(nginx))
    header = subprocess.run([*NCDUMP, "-h", nczarr_url(m.path)], capture_output=True, text=True, timeout=60)
    assert header.returncode == 0, header.stderr
    assert "temp(y, x)" in header.stdout and "group: sub" in header.stdout
    time.sleep(0.3)
    assert requests(nginx)[before:] == []


def test_an_unconsolidated_store_with_a_query_is_walked_through_its_index_pages(mount, www, nginx):
    before = len(requests(nginx))
    m = mount(f"{nginx.url}/idx/v2u.zarr?{QUERY}", "--view", "raw", "--log-level", "debug")
    assert_same_datasets(m.path, str(www / "v2u.zarr"))
    assert_same_datasets(m.path, str(www / "v2u.zarr"), "sub")
    asked = requests(nginx)[before:]
    assert_all_carry_the_query(asked)
    pages = [path for path, _ in asked if path.endswith("/")]  # (the "/" before the query)
    assert "/idx/v2u.zarr/" in pages and "/idx/v2u.zarr/sub/" in pages, asked
    assert SECRET not in m.log()


def test_the_disk_cache_serves_a_store_with_a_query_again(mount, www, nginx, tmp_path):
    url, cache = f"{nginx.url}/v3c.zarr?{QUERY}", tmp_path / "cache"
    first = mount(url, "--view", "raw", "--cache-dir", str(cache))
    assert_same_datasets(first.path, str(www / "v3c.zarr"))
    first.stop()
    before = len(requests(nginx))
    second = mount(url, "--view", "raw", "--cache-dir", str(cache))
    assert_same_datasets(second.path, str(www / "v3c.zarr"))
    asked = requests(nginx)[before:]
    assert_all_carry_the_query(asked)
    chunk_gets = [line for line in (nginx.root / "logs" / "access.log").read_text().splitlines()[before:]
                  if line.startswith("GET ") and "/c/" in line and " 200" in line]
    assert chunk_gets == []  # (each chunk's validator asked, its bytes from the disk)
    assert second.stats()["disk"]["hits"] > 0


def test_refusals_and_inspect_name_a_store_with_a_query_without_its_secret(tmp_path, nginx):
    """A fragment, a query on s3:// and a wrong signature are refused in one line each."""
    from refmount.errors import RefsError
    from refmount.refs import load_refs

    line = refusal_line(f"{nginx.url}/v2c.zarr?{QUERY}#frag", tmp_path / "mnt")
    assert "takes no fragment" in line and SECRET not in line, line
    wrong = "Wr0ngS1g"
    line = refusal_line(f"{nginx.url}/v2c.zarr?sig={wrong}", tmp_path / "mnt")
    assert "403" in line and wrong not in line, line
    result = run_refmount("inspect", f"{nginx.url}/v2c.zarr?{QUERY}", timeout=120)
    assert result.returncode == 0 and "Zarr v2 store" in result.stdout, result.stderr
    assert SECRET not in result.stdout + result.stderr
    # (on the command line an s3 url's "?" is a glob's; a catalog's asset says it is a store)
    with pytest.raises(RefsError, match="takes no query over s3") as refused:
        load_refs(f"s3://bucket/x.zarr?{QUERY}", store="zarr")
    assert SECRET not in str(refused.value)


def test_a_store_without_a_suffix_is_asked_with_its_query_and_a_non_store_refused_without_it(mount, www, nginx, tmp_path):
    """A store url whose name says nothing (no suffix) but carries a query is asked as a store (its
    query on each document's request); a directory that holds none is refused in one line that names
    it with its secret redacted."""
    named = www / "latest"
    if not named.exists():
        named.symlink_to(www / "v2c.zarr")
    (www / "nothing").mkdir(exist_ok=True)
    (www / "nothing" / "readme.txt").write_text("not a store\n")
    m = mount(f"{nginx.url}/latest?{QUERY}")
    assert_same_datasets(m.path, str(www / "v2c.zarr"))
    line = refusal_line(f"{nginx.url}/nothing?{QUERY}", tmp_path / "mnt")
    assert SECRET not in line, line
    assert "/nothing?" in line and "sig=***" in line, line  # (here nginx's 403 for a directory)
