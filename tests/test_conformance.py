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
# attributes of group g, or "*" for every variable (and group) of the file; an entry covers both the source
# file and its deflated copy. The reasons are measured (tests/conformance/REPORT.md) and all reproduce on a
# cp -r copy of the mount.
CHARS_410 = "NCZarr error"  # --chars char (default): netCDF-C 4.10 cannot open a dataset with <U1 characters
CHARS_XARRAY = "larger dtype"  # ... and zarr/xarray cannot read those arrays (README, --chars)
FLETCHER = "fletcher32"  # kerchunk 0.2.10 rejects the fletcher32 filter
NCCOPY = "nccopy -d4 -s failed"  # nccopy 4.9.0 cannot deflate string variables: no deflated variant
EXPECTED = {
    ("ncdump/test0.cdl", "*", "netcdf4"): ("error", CHARS_410),
    ("ncdump/test0.cdl", "*", "xarray"): ("error", CHARS_XARRAY),
    ("ncdump/ref_ctest1_nc4.cdl", "*", "netcdf4"): ("error", CHARS_410),
    ("ncdump/ref_ctest1_nc4.cdl", "*", "xarray"): ("error", CHARS_XARRAY),
    ("ncdump/ref_tst_charfill.cdl", "*", "netcdf4"): ("error", CHARS_410),
    # IDENTIFIER's _FillValue "" (char) is served as an attribute zarr reads as the array fill: the group fails
    ("ncdump/ref_tst_charfill.cdl", "*", "xarray"): ("error", "cannot reshape array of size 8 into shape (1,32)"),
    ("ncdump/ref_tst_string_data.cdl", "*", "netcdf4"): ("error", CHARS_410),
    ("ncdump/ref_tst_string_data.cdl", "description", "xarray"): ("error", CHARS_XARRAY),
    ("ncdump/ref_tst_string_data.cdl", "*", "nccopy"): ("skipped", NCCOPY),
    ("nc_test4/ref_fixedstring.cdl", "*", "netcdf4"): ("error", CHARS_410),
    ("nc_test4/ref_fixedstring.cdl", "vn", "xarray"): ("error", "cannot reshape array of size 4 into shape (4,4)"),
    ("nc_test4/ref_fixedstring.cdl", "*", "nccopy"): ("skipped", NCCOPY),
    # a scalar string kerchunk wrote no chunk for: unknown, so hidden rather than served empty
    ("nc_test4/ref_fixedstring.cdl", "v1", "ncdump"): ("hidden", "no chunk is referenced"),
    ("nc_test4/ref_fixedstring.cdl", "v1", "xarray"): ("hidden", "no chunk is referenced"),
    ("ncdump/ref_tst_special_atts.cdl", "var2", "ncdump"): ("untranslatable", FLETCHER),
    ("ncdump/ref_tst_special_atts.cdl", "var2", "netcdf4"): ("untranslatable", FLETCHER),
    ("ncdump/ref_tst_special_atts.cdl", "var2", "xarray"): ("untranslatable", FLETCHER),
    # var5 is compound: this harness cannot parse its ncdump data, so ncdump is "source unreadable"
    ("ncdump/ref_tst_special_atts.cdl", "var5", "netcdf4"): ("untranslatable", FLETCHER),
    ("ncdump/ref_tst_special_atts.cdl", "var5", "xarray"): ("untranslatable", FLETCHER),
}


def expected_for(r):
    return EXPECTED.get((r["cdl"], r["var"], r["client"])) or EXPECTED.get((r["cdl"], "*", r["client"]))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("conformance") / "report.json"
    proc = subprocess.run([sys.executable, "-m", "tests.conformance.run", "--slice", "--jobs", "2",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_no_wrong_values(report):
    wrong = [r for r in report["rows"] if r["cls"] == "wrong"]
    assert not wrong, f"{len(wrong)} WRONG results:\n" + "\n".join(
        f"  {r['cdl']} {r['variant']} {r['var']} [{r['client']}]: {r['reason'][:200]}" for r in wrong)


def test_errors_and_hidden_are_expected(report):
    unexpected = []
    for r in report["rows"]:
        if r["cls"] in ("identical", "wrong", "lost by kerchunk", "source unreadable"):
            continue
        cls, reason = expected_for(r) or (None, None)
        if cls != r["cls"] or reason not in r["reason"]:
            unexpected.append(f"  {(r['cdl'], r['var'], r['client'])!r}: ({r['cls']!r}, {r['reason'][:160]!r}),")
    assert not unexpected, "results not in EXPECTED:\n" + "\n".join(unexpected)


def test_expected_still_happen(report):
    seen = set()
    for r in report["rows"]:
        if r["cls"] not in ("identical", "wrong"):
            seen.add((r["cdl"], r["var"], r["client"]))
            seen.add((r["cdl"], "*", r["client"]))
    gone = [k for k in EXPECTED if k not in seen]
    assert not gone, f"no longer happening, remove from EXPECTED: {gone}"


def test_summary_line(report):
    assert report["summary"].startswith("conformance: ")
    assert report["rows"], "the slice produced no results"


def test_header_parser_reads_types_groups_and_escaped_names():
    from tests.conformance.header import parse_header

    text = r'''netcdf x {
types:
  ubyte enum e {a = 1, b = 2} ;
dimensions:
	d = 2 ;
variables:
	short v\ 1(d) ;
		v\ 1:_FillValue = -1s ;
		v\ 1:list = 1.5f, NaNf ;
		string v\ 1:s = "a", "b" ;
	int64 n ;

// global attributes:
		:title = "x, y; z" ;
		:big = 3000000000LL ;
data:
 n = 1 ;

group: g {
  variables:
  	double t(d) ;
  		t:u = 7UB ;
  // group attributes:
  		string :names = "p" ;
  }
}
'''
    h = parse_header(text)
    v = h.variables["v 1"]
    assert (v.type, v.dims) == ("short", ("d",))
    assert v.attrs == {"_FillValue": ("short", ("-1s",)), "list": ("float", ("1.5f", "NaNf")),
                       "s": ("string", ('"a"', '"b"'))}
    assert h.variables["n"].dims == ()
    assert h.group_attrs[""] == {"title": ("char", ('"x, y; z"',)), "big": ("int64", ("3000000000LL",))}
    assert h.variables["g/t"].attrs == {"u": ("ubyte", ("7UB",))}
    assert h.group_attrs["g"] == {"names": ("string", ('"p"',))}


def test_header_parser_reads_attributes_of_a_group_without_variables():
    from tests.conformance.header import parse_header

    h = parse_header('netcdf mm {\n\n// global attributes:\n\t\t:title = "example" ;\n}\n')
    assert h.group_attrs[""] == {"title": ("char", ('"example"',))}


@pytest.fixture(scope="module")
def realistic_report(tmp_path_factory):
    """The harness on files shaped like users' data (tests/conformance/realistic.py), both chars forms."""
    from tests.conformance.realistic import write_all

    work = tmp_path_factory.mktemp("realistic")
    files = [str(p) for p in write_all(work / "files")]
    rows = []
    for chars in ("char", "string"):
        out = work / f"report-{chars}.json"
        proc = subprocess.run([sys.executable, "-m", "tests.conformance.run", "--jobs", "2", "--out", str(out),
                               f"--mount-args=--chars {chars}", *files], cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows += [dict(r, chars=chars) for r in json.loads(out.read_text())["rows"]]
    return rows


def test_realistic_files_read_as_the_source(realistic_report):
    """No wrong value; errors only where a client cannot read the served character form (netCDF-C
    >= 4.10 and zarr refuse 4.9's; ncdump 4.9.0 refuses the string form), proven on a copy."""
    wrong = [r for r in realistic_report if r["cls"] == "wrong"]
    assert not wrong, "\n".join(f"  {r['cdl']} {r['variant']} {r['var']} [{r['client']}, --chars {r['chars']}]: "
                                f"{r['reason'][:200]}" for r in wrong)
    errors = [r for r in realistic_report if r["cls"] == "error"]
    assert all(r.get("same_on_copy") for r in errors)
    assert {Path(r["cdl"]).name for r in errors} <= {"grouped_records.nc"}  # (the only file with text arrays)
    identical = [r for r in realistic_report if r["cls"] == "identical"]
    assert len(identical) > len(realistic_report) * 0.6
