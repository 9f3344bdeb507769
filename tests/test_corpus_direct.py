"""Data files mounted directly (issue 34), on files nobody here wrote: a slice of netCDF-C's CDL corpus
through the conformance harness in --direct mode (`refmount mount FILE.nc MNT`, six clients against the
file), and a slice of kerchunk's and netCDF4-python's own test files (tests/data/corpus) through
tests/conformance/datafiles.py (ncdump on the decoded view, xarray on the raw view, against the file and
against kerchunk's references of it made by hand). Nothing may be wrong: whatever differs from the file
must differ the same way through kerchunk's references. The whole corpus: tests/conformance/README.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conformance.run import row_class
from tests.test_conformance import COUNTED, expected_for

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "corpus"
CDLS = ["ncdump/test0.cdl"]  # (ref_tst_group_data.cdl too, by hand: it doubles the time)


def test_netcdf_c_cdl_slice_mounted_directly(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "tests.conformance.run", "--direct", "--jobs", "2",
                           "--out", str(out), *CDLS], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert rows
    bad = [r for r in rows if row_class(r) not in COUNTED and "reader's limitation" not in row_class(r)
           and not ((expected_for(r) or (None, None))[0] == row_class(r) and expected_for(r)[1] in r["reason"])]
    assert not bad, "\n".join(f"  {r['cdl']} {r['variant']} {r['var']} [{r['client']}]: {row_class(r)}: "
                              f"{r['reason'][:200]}" for r in bad)


def test_kerchunk_and_netcdf4_python_test_files_mounted_directly(tmp_path):
    files = [DATA / n for n in ("hdf5_mini_blosc.h5", "tinygrib.grb2", "ubyte.nc", "issue1152.nc")]
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "tests.conformance.datafiles", "--out", str(out), *map(str, files)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    bad = [r for r in report["rows"] if r["cls"] not in ("identical", "lost by kerchunk")]
    assert not bad, (report["summary"], bad)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(report["rows"]) == 2 * len(files)
