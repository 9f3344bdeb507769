"""Conformance harness: netCDF-C's own CDL corpus, through refmount's decoded view, compared with the source."""
