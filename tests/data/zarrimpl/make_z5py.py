"""The z5py stores here (z5py 3.0.2 from PyPI): `python make_z5py.py OUT` (see README.md)."""

import os
import shutil
import sys

import numpy as np
import z5py

out = sys.argv[1]
a = np.arange(7 * 9, dtype="f4").reshape(7, 9) * 1.5 - 20
b = np.arange(5 * 6, dtype="i2").reshape(5, 6) - 7
for fmt, sep in ((2, "."), (2, "/"), (3, "/")):
    name = f"z5py_v{fmt}{'_nested' if sep == '/' and fmt == 2 else ''}.zarr"
    shutil.rmtree(f"{out}/{name}", ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    kw = {"zarr_format": fmt} if fmt == 3 else {"dimension_separator": sep}
    f = z5py.File(f"{out}/{name}", mode="w", use_zarr_format=True, **kw)
    f.create_dataset("gzip", data=a, chunks=(3, 4), compression="gzip", fillvalue=-1)  # (z5py writes zlib)
    r = f.create_dataset("raw", shape=b.shape, dtype="i2", chunks=(2, 4), compression="raw", fillvalue=9)
    r[:2] = b[:2]  # the rest unwritten: the fill
    if fmt == 3:
        f.create_dataset("sharded", data=b, chunks=(1, 2), shards=(2, 4), compression="raw", fillvalue=0)
