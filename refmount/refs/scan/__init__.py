"""Data files and archives of them as reference sets: a netCDF-4/HDF5, netCDF-3, GRIB or TIFF file,
a glob, a directory, an s3:// prefix or an @FILE list of them is scanned with kerchunk's parsers in
worker processes (pool.py, worker.py), through refmount's own fetcher and block cache; what was
scanned is kept on disk (store.py) and only revalidated on the next mount."""
