"""The tensorstore stores here (tensorstore 0.1.86 from PyPI): `python make_tensorstore.py OUT`."""

import sys

import numpy as np
import tensorstore as ts

out = sys.argv[1]


def make(path, metadata, driver, data, region=None):
    t = ts.open({"driver": driver, "kvstore": {"driver": "file", "path": f"{out}/{path}"}, "metadata": metadata},
                create=True, delete_existing=True).result()
    (t[region] if region is not None else t).write(data).result()


v = np.arange(6 * 5, dtype=">f8").reshape(6, 5) / 4 - 2
make("tensorstore_v2.zarr/bigendian", {"dtype": ">f8", "shape": [6, 5], "chunks": [4, 2], "dimension_separator": "/",
     "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}, "fill_value": "NaN"},
     "zarr", v[:4], np.s_[:4])
make("tensorstore_v2.zarr/forder", {"dtype": "<i4", "shape": [5, 3], "chunks": [2, 2], "order": "F",
     "compressor": {"id": "zlib", "level": 1}, "fill_value": -3}, "zarr", np.arange(15, dtype="<i4").reshape(5, 3))
make("tensorstore_v3.zarr/sharded", {"data_type": "float32", "shape": [8, 6], "fill_value": "NaN",
     "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 6]}},
     "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [2, 3],
                 "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                            {"name": "zstd", "configuration": {"level": 3}}],
                 "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}],
     "dimension_names": ["y", "x"]}, "zarr3", np.arange(24, dtype="f4").reshape(4, 6), np.s_[:4])
make("tensorstore_v3.zarr/bigendian", {"data_type": "int32", "shape": [5], "fill_value": 7,
     "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
     "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
     "codecs": [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "gzip", "configuration": {"level": 5}}]},
     "zarr3", np.array([1, -2, 3], dtype="i4"), np.s_[:3])
# the roots' group documents (tensorstore writes arrays only)
with open(f"{out}/tensorstore_v2.zarr/.zgroup", "w") as f:
    f.write('{"zarr_format":2}')
with open(f"{out}/tensorstore_v3.zarr/zarr.json", "w") as f:
    f.write('{"zarr_format":3,"node_type":"group","attributes":{"written by":"tensorstore"}}')
