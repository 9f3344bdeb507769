"""Writes the HDF4 files of this directory and the sweep's (tests/sweeps/sweep_formats.py):
    python make.py DIR        (pyhdf 0.11.7)
then, for the sweep's chunked files of every compression (pyhdf has no chunking or NBIT call):
    for c in NONE RLE "HUFF 2" "GZIP 1"; do hrepack -i DIR/none_contiguous.hdf -o DIR/hrepack_$c.hdf -t "*:$c" -c "*:4x3"; done
    hrepack -i DIR/features.hdf -o DIR/features_gzip_chunked.hdf -t "*:GZIP 6" -c "*:2x2"
"""
import sys

import numpy as np
from pyhdf.HDF import HC, HDF
from pyhdf.SD import SD, SDC
import pyhdf.VS  # noqa: F401 - HDF.vstart needs it imported

out = sys.argv[1]
TYPES = {"int8": SDC.INT8, "uint8": SDC.UINT8, "int16": SDC.INT16, "uint16": SDC.UINT16, "int32": SDC.INT32,
         "uint32": SDC.UINT32, "float32": SDC.FLOAT32, "float64": SDC.FLOAT64}
COMP = {"none": None, "rle": (SDC.COMP_RLE,), "skphuff": (SDC.COMP_SKPHUFF, 2), "deflate": (SDC.COMP_DEFLATE, 6)}


def values(t, shape):
    n = int(np.prod(shape))
    if t.startswith("float"):
        v = np.linspace(-3.5, 1e3, n).astype(t)
        v.flat[0] = np.nan
        return v.reshape(shape)
    info = np.iinfo(t)
    return (np.arange(n) * 37 % (int(info.max) - int(info.min) + 1) + int(info.min)).astype(t).reshape(shape)


for comp, args in COMP.items():  # every number type, contiguous, in each compression
    sd = SD(f"{out}/{comp}_contiguous.hdf", SDC.WRITE | SDC.CREATE | SDC.TRUNC)
    for t, code in TYPES.items():
        s = sd.create(f"v_{t}", code, (11, 7))
        if args:
            s.setcompress(*args)
        s[:] = values(t, (11, 7))
        s.units = "K"
        s.endaccess()
    sd.end()
# fills, unlimited, scales, attributes, empty, char, partial writes
sd = SD(f"{out}/features.hdf", SDC.WRITE | SDC.CREATE | SDC.TRUNC)
sd.title = "features"
setattr(sd, "f64attr", 2.5)
a = sd.attr("ints"); a.set(SDC.INT32, [1, 2, 3])
a = sd.attr("u8s"); a.set(SDC.UINT8, [250, 3])
a = sd.attr("i8"); a.set(SDC.INT8, [-5])
a = sd.attr("f32s"); a.set(SDC.FLOAT32, [1.5, -2.25])
a = sd.attr("u16"); a.set(SDC.UINT16, [65535])
a = sd.attr("u32"); a.set(SDC.UINT32, [4000000000])
a = sd.attr("uchar"); a.set(SDC.UCHAR8, [98, 121, 0, 116])
a = sd.attr("text"); a.set(SDC.CHAR8, "some text")
s = sd.create("filled_partial", SDC.INT16, (6, 5)); s.setfillvalue(-99); s[0:2, :] = np.arange(10, dtype="i2").reshape(2, 5); s.endaccess()
s = sd.create("unfilled_partial", SDC.FLOAT32, (6, 5)); s[0:2, :] = np.ones((2, 5), "f4"); s.endaccess()
s = sd.create("never_written", SDC.INT32, (3, 4)); s.setfillvalue(7); s.endaccess()
s = sd.create("never_written_nofill", SDC.UINT16, (3, 4)); s.endaccess()
s = sd.create("chunk_partial", SDC.FLOAT64, (8, 8)); s.setfillvalue(-1.0); s[0:4, 0:4] = np.full((4, 4), 2.0); s.endaccess()
s = sd.create("chunk_partial_deflate", SDC.INT32, (8, 8)); s[4:8, 4:8] = np.full((4, 4), 3, "i4"); s.endaccess()
s = sd.create("unlimited", SDC.INT32, (SDC.UNLIMITED, 3)); s[0:4, :] = np.arange(12, dtype="i4").reshape(4, 3); s[4:6, :] = np.full((2, 3), 9, "i4"); s.endaccess()
s = sd.create("unlimited_once", SDC.FLOAT32, (SDC.UNLIMITED, 2)); s[0:3, :] = np.ones((3, 2), "f4"); s.endaccess()
s = sd.create("unlimited_empty", SDC.INT16, (SDC.UNLIMITED,)); s.endaccess()
s = sd.create("chars", SDC.CHAR8, (3, 5)); s[:] = np.array([list("hello"), list("world"), list("ab\x00\x00\x00")], "S1"); s.endaccess()
s = sd.create("uchars", SDC.UCHAR8, (4,)); s[:] = np.array([0, 1, 254, 255], "u1"); s.endaccess()
s = sd.create("scaled", SDC.INT16, (4, 3)); s[:] = np.arange(12, dtype="i2").reshape(4, 3)
s.setcal(0.5, 0.0, 10.0, 0.0, SDC.INT16)
d0 = s.dim(0); d0.setname("lat"); d0.setscale(SDC.FLOAT32, [10.0, 20.0, 30.0, 40.0]); d0.units = "degrees_north"
d1 = s.dim(1); d1.setname("lon"); d1.setscale(SDC.INT32, [1, 2, 3])
s.long_name = "scaled with setcal"; s.endaccess()
s = sd.create("scaled_attrs", SDC.INT16, (3,)); s[:] = np.array([0, 100, 200], "i2")
s.scale_factor = 0.01; s.add_offset = -5.0; s.endaccess()
s = sd.create("valid", SDC.INT16, (3,)); s[:] = np.array([0, 100, 200], "i2"); s.setrange(0, 150); s.endaccess()
s = sd.create("scalar1", SDC.FLOAT64, (1,)); s[:] = np.array([3.25]); s.endaccess()
s = sd.create("big3d", SDC.UINT16, (5, 4, 3)); s.setcompress(SDC.COMP_DEFLATE, 9); s[:] = np.arange(60, dtype="u2").reshape(5, 4, 3); s.endaccess()
s = sd.create("same_dim_a", SDC.INT8, (3,)); s.dim(0).setname("shared"); s[:] = np.array([1, 2, 3], "i1"); s.endaccess()
s = sd.create("same_dim_b", SDC.INT8, (3,)); s.dim(0).setname("shared"); s[:] = np.array([4, 5, 6], "i1"); s.endaccess()
sd.end()
# Vdata beside an SDS
hdf = HDF(f"{out}/vdata.hdf", HC.WRITE | HC.CREATE)
vs = hdf.vstart(); vd = vs.create("table", (("a", HC.INT32, 1), ("b", HC.FLOAT64, 1)))
vd.write([[1, 2.0], [3, 4.5]]); vd.detach(); vs.end(); hdf.close()
sd = SD(f"{out}/vdata.hdf", SDC.WRITE); s = sd.create("beside", SDC.INT32, (2,)); s[:] = np.array([5, 6], "i4"); s.endaccess(); sd.end()
