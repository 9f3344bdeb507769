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
    ('nc_test4/ref_fillonly.cdl', '(attributes of /)', 'ncdump'): ('error', 'NCZarr error'),  # kerchunk writes shape [0] for f (HDF5 extent 0); ncdump 4.9.0 rejects a zero-length dimension (same on cp -r)
    ('nc_test4/ref_fillonly.cdl', 'f', 'ncdump'): ('error', 'NCZarr error'),  # kerchunk writes shape [0] for f (HDF5 extent 0); ncdump 4.9.0 rejects a zero-length dimension (same on cp -r)
    ('nc_test4/ref_fillonly.cdl', 'i', 'ncdump'): ('error', 'NCZarr error'),  # kerchunk writes shape [0] for f (HDF5 extent 0); ncdump 4.9.0 rejects a zero-length dimension (same on cp -r)
    ('nc_test4/ref_fixedstring.cdl', 'v1', 'ncdump'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('nc_test4/ref_fixedstring.cdl', 'v1', 'netcdf4'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('nc_test4/ref_fixedstring.cdl', 'v1', 'xarray'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('nc_test4/ref_fixedstring.cdl', 'vn', 'ncdump'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('nc_test4/ref_fixedstring.cdl', 'vn', 'netcdf4'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('nc_test4/ref_fixedstring.cdl', 'vn', 'xarray'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('nc_test4/ref_fixedstring.cdl', '*', 'nccopy'): ('skipped', 'nccopy -d4 -s failed'),  # nccopy 4.9.0 cannot deflate string variables
    ('ncdump/ref_inttags4.cdl', '(attributes of /)', 'netcdf4'): ('error', 'Numeric conversion not representable'),  # 4.10.1 cannot type the int64 list attribute attrll (same on cp -r; refmount writes no _nczarr_attr hint)
    ('ncdump/ref_inttags4.cdl', 'i64', 'netcdf4'): ('error', 'Numeric conversion not representable'),  # 4.10.1 cannot type the int64 list attribute attrll (same on cp -r; refmount writes no _nczarr_attr hint)
    ('ncdump/ref_inttags4.cdl', 'ub', 'netcdf4'): ('error', 'Numeric conversion not representable'),  # 4.10.1 cannot type the int64 list attribute attrll (same on cp -r; refmount writes no _nczarr_attr hint)
    ('ncdump/ref_inttags4.cdl', 'ui', 'netcdf4'): ('error', 'Numeric conversion not representable'),  # 4.10.1 cannot type the int64 list attribute attrll (same on cp -r; refmount writes no _nczarr_attr hint)
    ('ncdump/ref_inttags4.cdl', 'ui64', 'netcdf4'): ('error', 'Numeric conversion not representable'),  # 4.10.1 cannot type the int64 list attribute attrll (same on cp -r; refmount writes no _nczarr_attr hint)
    ('ncdump/ref_inttags4.cdl', 'us', 'netcdf4'): ('error', 'Numeric conversion not representable'),  # 4.10.1 cannot type the int64 list attribute attrll (same on cp -r; refmount writes no _nczarr_attr hint)
    ('ncdump/ref_tst_charfill.cdl', '(attributes of /)', 'netcdf4'): ('error', 'crashed (SIGABRT)'),  # libnetcdf 4.10.1 aborts opening it (same on cp -r)
    ('ncdump/ref_tst_charfill.cdl', 'IDENTIFIER', 'netcdf4'): ('error', 'crashed (SIGABRT)'),  # libnetcdf 4.10.1 aborts opening it (same on cp -r)
    ('ncdump/ref_tst_charfill.cdl', 'SEQUENCE', 'netcdf4'): ('error', 'crashed (SIGABRT)'),  # libnetcdf 4.10.1 aborts opening it (same on cp -r)
    ('ncdump/ref_tst_special_atts.cdl', 'var2', 'ncdump'): ('untranslatable', 'fletcher32'),  # kerchunk 0.2.10 rejects the fletcher32 filter
    ('ncdump/ref_tst_special_atts.cdl', 'var2', 'netcdf4'): ('untranslatable', 'fletcher32'),  # kerchunk 0.2.10 rejects the fletcher32 filter
    ('ncdump/ref_tst_special_atts.cdl', 'var2', 'xarray'): ('untranslatable', 'fletcher32'),  # kerchunk 0.2.10 rejects the fletcher32 filter
    ('ncdump/ref_tst_special_atts.cdl', 'var5', 'netcdf4'): ('untranslatable', 'fletcher32'),  # kerchunk 0.2.10 rejects the fletcher32 filter
    ('ncdump/ref_tst_special_atts.cdl', 'var5', 'xarray'): ('untranslatable', 'fletcher32'),  # kerchunk 0.2.10 rejects the fletcher32 filter
    ('ncdump/ref_tst_string_data.cdl', '*', 'nccopy'): ('skipped', 'nccopy -d4 -s failed'),  # nccopy 4.9.0 cannot deflate string variables
    ('ncdump/ref_tst_string_data.cdl', 'description', 'ncdump'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('ncdump/ref_tst_string_data.cdl', 'description', 'netcdf4'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
    ('ncdump/ref_tst_string_data.cdl', 'description', 'xarray'): ('hidden', 'variable-length strings'),  # kerchunk stores netCDF strings as |O
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
