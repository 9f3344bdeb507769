"""The CI slice of the conformance harness (tests/conformance): netCDF-C's own CDL files, mounted through the
decoded view with no flags, read by Debian's ncdump, NCO, CDO and GDAL, netCDF4-python and xarray, each
compared with the same client on the source file.

No result may be WRONG. Every error, hidden or untranslatable result, and every difference a store the
client's own library wrote shows too (a reader's limitation), must be listed in EXPECTED with its
reason, so that a new one fails the test (and a fixed one asks to be removed from the list). The whole
corpus: ``python -m tests.conformance.run`` (see tests/conformance/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.run import row_class
from tests.support.clients import netcdf_form, netcdf_version

ROOT = Path(__file__).resolve().parents[1]

# (cdl, variable, client) -> (class, a substring of the reason). A variable is "(attributes of /g)" for the
# attributes of group g, or "*" for every variable (and group) of the file; an entry covers both the source
# file and its deflated copy. The reasons are measured (tests/conformance/REPORT.md): EXPECTED on Debian 12
# (netCDF-C 4.9.0 in ncdump, nccopy, NCO and CDO) and on Debian 13 (4.9.3, REFMOUNT_TEST_NETCDF_ROOT),
# EXPECTED_490 on 4.9.0 only.
FLETCHER = "fletcher32"  # kerchunk 0.2.10 rejects the fletcher32 filter
NCCOPY = "nccopy -d4 -s failed"  # nccopy 4.9.0 cannot deflate string variables: no deflated variant
# netCDF-C 4.9.0 has no unlimited dimension in Zarr (nccopy writes one only as fixed, -u): CDO then sees no
# time axis (one row for all records) and takes a record dimension for levels; a store nccopy wrote shows it too
CDO_NO_RECORDS = ("wrong (reader's limitation)", "rows of infon")
CDO_LEVELS = ("wrong (reader's limitation)", "infon row 0")
# Expectations that hold with every netCDF-C (CDO's time axis in NCZarr, and what kerchunk or the refs lose)
EXPECTED_EVERYWHERE = {
    ("nc_test4/ref_fillonly.cdl", "*", "cdo"): CDO_NO_RECORDS,
    ("ncdump/ref_tst_charfill.cdl", "SEQUENCE", "cdo"): CDO_NO_RECORDS,
    **{("ncdump/ref_ctest1_nc4.cdl", v, "cdo"): CDO_NO_RECORDS for v in ("br", "br2", "fr", "ir", "sr", "sr3")},
    **{("ncdump/ref_ctest1_nc4.cdl", v, "cdo"): CDO_LEVELS
       for v in ("br22", "dr32", "fr13", "fr31", "ir12", "sr11", "sr23")},
    ("ncdump/ref_ctest1_nc4.cdl", "dr", "cdo"): ("hidden (reader's limitation)", "no log line names it"),
    # a scalar string kerchunk wrote no chunk for: unknown, so hidden rather than served empty
    **{("nc_test4/ref_fixedstring.cdl", "v1", c): ("hidden", "no chunk is referenced")
       for c in ("ncdump", "nco", "netcdf4", "xarray", "gdal")},
    **{("ncdump/ref_tst_special_atts.cdl", "var2", c): ("untranslatable", FLETCHER)
       for c in ("ncdump", "netcdf4", "xarray", "cdo", "gdal")},
    # var5 is compound: ncdump (this harness's parser), NCO and CDO cannot read it in the source either
    **{("ncdump/ref_tst_special_atts.cdl", "var5", c): ("untranslatable", FLETCHER) for c in ("netcdf4", "xarray", "gdal")},
}
# Expectations that belong to the netCDF-C of the system's tools (ncgen, nccopy, ncdump, NCO, CDO, GDAL):
# Debian 12 has 4.9.0 (the form nc49), Debian 13 4.9.3 (nc493: .ci/debian13 runs this file there). Measured.
EXPECTED_490 = {
    # a dimension name with two lengths in two groups: netCDF-C 4.9.0 reads Zarr dimensions as global (4.9.3
    # reads NCZarr's, each in its group)
    ("ncdump/ref_tst_group_data.cdl", "g2/g3/var2", "nco"): ("wrong (reader's limitation)", "shape (4, 2, 3)"),
    # 4.9.3's nccopy deflates string variables (no skipped variant there)
    ("ncdump/ref_tst_string_data.cdl", "*", "nccopy"): ("skipped", NCCOPY),
    ("nc_test4/ref_fixedstring.cdl", "*", "nccopy"): ("skipped", NCCOPY),
}
NETCDF_C = ".".join(map(str, netcdf_version()))
EXPECTED = {**EXPECTED_EVERYWHERE, **(EXPECTED_490 if netcdf_form(netcdf_version()) == "nc49" else {})}
# The same for the realistic files (file name, variable, client), by netCDF-C version
REALISTIC_EXPECTED_BY_NETCDF_C = {
    # Debian 13's CDO shows the source's time as 0000-00-00 00:00:00 (every variable of this file); through
    # the mount it shows the time the file holds (2020-08-06 15:33:20)
    "4.9.3": {("satellite.nc", "*", "cdo"): ("wrong", "source 0000-00-00")},
}
REALISTIC_EXPECTED = REALISTIC_EXPECTED_BY_NETCDF_C.get(NETCDF_C, {})
COUNTED = ("identical", "lost by kerchunk", "source unreadable")


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
    wrong = [r for r in report["rows"] if row_class(r).startswith("wrong") and "limitation" not in row_class(r)]
    assert not wrong, f"{len(wrong)} WRONG results:\n" + "\n".join(
        f"  {r['cdl']} {r['variant']} {r['var']} [{r['client']}]: {r['reason'][:200]}" for r in wrong)


def test_errors_and_hidden_are_expected(report):
    unexpected = []
    for r in report["rows"]:
        cls = row_class(r)
        if cls in COUNTED or cls == "wrong":
            continue
        want, reason = expected_for(r) or (None, None)
        if cls != want or reason not in r["reason"]:
            unexpected.append(f"  {(r['cdl'], r['var'], r['client'])!r}: ({cls!r}, {r['reason'][:160]!r}),")
    assert not unexpected, f"results not in EXPECTED (netCDF-C {NETCDF_C}):\n" + "\n".join(unexpected)


def test_expected_still_happen(report):
    seen = set()
    for r in report["rows"]:
        if row_class(r) not in ("identical", "wrong", "lost by kerchunk", "source unreadable"):
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
    """The harness on files shaped like users' data (tests/conformance/realistic.py), mounted with no flags."""
    from tests.conformance.realistic import write_all

    work = tmp_path_factory.mktemp("realistic")
    files = [str(p) for p in write_all(work / "files")]
    out = work / "report.json"
    proc = subprocess.run([sys.executable, "-m", "tests.conformance.run", "--jobs", "2", "--out", str(out), *files],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())["rows"]


def test_realistic_files_read_as_the_source(realistic_report):
    """No wrong value and no error: every client reads its own form. What differs is kerchunk's loss,
    or what netCDF-C 4.9.0 itself cannot represent in Zarr (scalars, unlimited dimensions: CDO sees them
    as axes), proven on a store Debian's nccopy wrote."""
    def expected(r) -> bool:
        name = Path(r["cdl"]).name
        want, reason = (REALISTIC_EXPECTED.get((name, r["var"], r["client"]))
                        or REALISTIC_EXPECTED.get((name, "*", r["client"])) or (None, None))
        return row_class(r) == want and reason in r["reason"]

    bad = [r for r in realistic_report if row_class(r) not in COUNTED and "reader's limitation" not in row_class(r)
           and not (r["client"] == "nccopy" and NCCOPY in r["reason"])  # (no deflated copy of vlen strings)
           and not expected(r)]
    assert not bad, "\n".join(f"  {Path(r['cdl']).name} {r['variant']} {r['var']} [{r['client']}]: {row_class(r)}: "
                              f"{r['reason'][:200]}" for r in bad)
    limited = {r["client"] for r in realistic_report if "reader's limitation" in row_class(r)}
    assert limited <= {"cdo", "nco", "ncdump"}
    identical = [r for r in realistic_report if r["cls"] == "identical"]
    assert len(identical) > len(realistic_report) * 0.7
