"""Imported by the scanners' fork server: kerchunk and h5py are in memory before any worker forks."""

from refmount.refs.scan.worker import preload

preload()
