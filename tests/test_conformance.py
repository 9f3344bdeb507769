"""The CI slice of the conformance harness (tests/conformance): netCDF-C's own CDL files, mounted through the
decoded view, read by Debian's ncdump, netCDF4-python and xarray, compared with the source file.

No result may be WRONG. Every error, hidden or untranslatable result must be listed in EXPECTED with its
reason, so that a new one fails the test (and a fixed one asks to be removed from the list). The whole
corpus: ``python -m tests.conformance.run`` (see tests/conformance/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (cdl, variable, client) -> (class, a substring of the reason). A variable is "(attributes of /g)" for the
# attributes of group g; the entry covers both the source file and its deflated copy.
EXPECTED = {
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance") / "report.json"
    proc = subprocess.run([sys.executable, "-m", "tests.conformance.run", "--slice", "--jobs", "2",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def key(r):
    return (r["cdl"], r["var"], r["client"])


def test_no_wrong_values(report):
    wrong = [r for r in report["rows"] if r["cls"] == "wrong"]
    assert not wrong, f"{len(wrong)} WRONG results:\n" + "\n".join(
        f"  {r['cdl']} {r['variant']} {r['var']} [{r['client']}]: {r['reason'][:200]}" for r in wrong)


def test_errors_and_hidden_are_expected(report):
    unexpected = []
    for r in report["rows"]:
        if r["cls"] in ("identical", "wrong", "lost by kerchunk", "source unreadable"):
            continue
        cls, reason = EXPECTED.get(key(r), (None, None))
        if cls != r["cls"] or reason not in r["reason"]:
            unexpected.append(f"  {key(r)!r}: ({r['cls']!r}, {r['reason'][:160]!r}),")
    assert not unexpected, "results not in EXPECTED:\n" + "\n".join(unexpected)


def test_expected_still_happen(report):
    seen = {key(r) for r in report["rows"] if r["cls"] not in ("identical", "wrong")}
    gone = [k for k in EXPECTED if k not in seen]
    assert not gone, f"no longer happening, remove from EXPECTED: {gone}"


def test_summary_line(report):
    assert report["summary"].startswith("conformance: ")
    assert report["rows"], "the slice produced no results"
