import numpy as np, z5py, tensorstore as ts, json, os, shutil, sys
out = sys.argv[1]
shutil.rmtree(out, ignore_errors=True); os.makedirs(out)
a = (np.arange(7*9, dtype="f4").reshape(7, 9) * 1.5 - 20)
b = np.arange(5*6, dtype="i2").reshape(5, 6) - 7
for fmt, sep in ((2, "."), (2, "/"), (3, "/")):
    name = f"z5py_v{fmt}{'_nested' if sep == '/' and fmt == 2 else ''}.zarr"
    kw = {"zarr_format": fmt} if fmt == 3 else {"dimension_separator": sep}
    f = z5py.File(f"{out}/{name}", mode="w", use_zarr_format=True, **kw)
    d = f.create_dataset("gzip", data=a, chunks=(3, 4), compression="gzip", fillvalue=-1)
    r = f.create_dataset("raw", shape=b.shape, dtype="i2", chunks=(2, 4), compression="raw", fillvalue=9)
    r[:2] = b[:2]  # the rest unwritten: fill
    if fmt == 3:
        s = f.create_dataset("sharded", data=b, chunks=(1, 2), shards=(2, 4), compression="raw", fillvalue=0)
print(sorted(os.listdir(out)))
