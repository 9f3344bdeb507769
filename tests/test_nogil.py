"""refmount's pyfuse3 build (.ci/pyfuse3/nogil.patch: replies and request reads without the GIL) and
the plain one both serve a mount that reads the right bytes, and the daemon says which one it runs.

The builds come from what .ci/pyfuse3/build-nogil leaves in its cache (the patched wheel, and the
plain build copied aside), or from this venv's own pyfuse3. Under CI=true the venv .ci/setup made
must run the patched build when the cache holds one for it (.ci/setup built it), and both builds
must be found: a mount with each reads a file whose replies come from pool slots that are evicted
and reused while other replies are in the kernel's hands (a small block cache, readers in threads)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import IN_CI, run_refmount

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / ".ci" / "pyfuse3" / "nogil.patch"
CACHE = Path(os.environ.get("REFMOUNT_WHEEL_CACHE", "/var/cache/refmount/wheels"))
LABEL = "+refmount.nogil"
SIZE = 24 << 20


def _venv_version() -> str:
    return importlib.metadata.version("pyfuse3")


def _key_prefix() -> str:
    """What build-nogil keys its cache by, without the patch's hash: pyfuse3-VERSION-TAG."""
    return f"pyfuse3-{_venv_version().split('+')[0]}-{sys.implementation.cache_tag}"


def _patched_wheel() -> Path | None:
    digest = hashlib.sha256(PATCH.read_bytes()).hexdigest()[:12]
    return next(iter(sorted((CACHE / f"{_key_prefix()}-{digest}").glob(f"pyfuse3-*{LABEL}-*.whl"))), None)


def _missing(what: str):
    (pytest.fail if IN_CI else pytest.skip)(f"{what} (made by .ci/setup: bash .ci/pyfuse3/build-nogil VENV)")


@pytest.fixture(scope="module")
def patched_tree(tmp_path_factory) -> Path | None:
    """A directory to put first on the daemon's PYTHONPATH holding the patched pyfuse3 (None: the
    venv's own pyfuse3 is the patched one)."""
    if _venv_version().endswith(LABEL):
        return None
    wheel = _patched_wheel()
    if wheel is None:
        _missing(f"no patched pyfuse3 build for {_key_prefix()} in {CACHE}")
    tree = tmp_path_factory.mktemp("pyfuse3-nogil")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tree)
    return tree


@pytest.fixture(scope="module")
def plain_tree() -> Path | None:
    """The same for the plain pyfuse3 (None: the venv's own is the plain one)."""
    if not _venv_version().endswith(LABEL):
        return None
    tree = CACHE / f"{_key_prefix()}-plain"
    if not (tree / "pyfuse3").is_dir():
        _missing(f"the plain pyfuse3 was not copied aside to {tree}")
    return tree


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nogil-data") / "big.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


def _env(tree: Path | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree) if tree else None, str(ROOT)]))
    return env


def _read_and_check(m, source: Path) -> None:
    """Eight threads read the file in 1 MiB reads from different offsets, twice (the second pass
    after the 4 MiB block cache has let the first pass's blocks and their slots go)."""
    expected = source.read_bytes()

    def read_from(start: int) -> int:
        wrong = 0
        with open(m / "big", "rb", buffering=0) as f:
            for n in range(SIZE >> 20):
                offset = ((start + n) % (SIZE >> 20)) << 20
                f.seek(offset)
                got = f.read(1 << 20)
                wrong += got != expected[offset:offset + (1 << 20)]
        return wrong

    for _ in range(2):
        with ThreadPoolExecutor(8) as pool:
            assert sum(pool.map(read_from, range(0, SIZE >> 20, 3))) == 0


def _mount_with(mount, server, big_file, tree):
    (server.root / "big.bin").write_bytes(big_file.read_bytes())
    return mount({"big": [server.url_for("big.bin")]}, "--view", "raw", "--cache-size", "4M", env=_env(tree))


def test_patched_build_reads_right_and_says_so(mount, server, big_file, patched_tree):
    m = _mount_with(mount, server, big_file, patched_tree)
    m.wait_announced()
    assert LABEL + " (replies without the GIL)" in m.log()  # the log line at mount
    assert m.stats()["pyfuse3"].endswith(LABEL + " (replies without the GIL)")
    _read_and_check(m, big_file)
    assert m.stats()["memory"]["pool_reused"] > 0  # slots were reused while replies went out
    assert "Traceback" not in m.log()


def test_plain_build_reads_right_and_says_so(mount, server, big_file, plain_tree):
    m = _mount_with(mount, server, big_file, plain_tree)
    m.wait_announced()
    shown = m.stats()["pyfuse3"]
    assert shown.startswith("pyfuse3 ") and shown.endswith("(replies hold the GIL)") and LABEL not in shown
    _read_and_check(m, big_file)
    assert "Traceback" not in m.log()


def test_venv_runs_the_patched_build_setup_made():
    """.ci/setup built the patch for this venv's pyfuse3 and Python: then this venv imports it."""
    if not IN_CI:
        pytest.skip("checks the venv .ci/setup made (CI=true)")
    if _patched_wheel() is None:
        pytest.fail(f"no patched pyfuse3 build for {_key_prefix()} in {CACHE}: .ci/setup's build-nogil failed (its log line)")
    shown = run_refmount("--version")
    assert shown.returncode == 0, shown.stderr
    assert f"{LABEL} (replies without the GIL)" in shown.stdout, shown.stdout
