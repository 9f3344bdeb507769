"""Sweeps of other projects' files through a mount against each format's own library (issue 40):
lab tools run by hand with `python -m tests.sweeps.NAME`, not tests and not benchmarks (they time
nothing, and use the tests' mount and server helpers)."""
