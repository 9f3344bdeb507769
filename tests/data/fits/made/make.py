"""Writes the FITS files of this directory (and a few more the sweep reads): python make.py DIR (astropy 8.0.2)."""
import numpy as np, warnings, sys
from astropy.io import fits
warnings.simplefilter("ignore")
out = sys.argv[1]
def w(name, hdus): fits.HDUList(hdus).writeto(f"{out}/{name}.fits", overwrite=True)
r = np.random.default_rng(1)
w("unsigned", [fits.PrimaryHDU(np.arange(12, dtype="u2").reshape(3, 4) * 5000),
               fits.ImageHDU(np.arange(6, dtype="u4") * 700_000_000, name="U32"),
               fits.ImageHDU(np.array([0, 1, 2**63, 2**64 - 1, 2**53 + 1], dtype="u8"), name="U64"),
               fits.ImageHDU(np.arange(-3, 3, dtype="i1"), name="I8")])
# scaled ints with BLANK
raw = np.arange(-5, 7, dtype=">i2").reshape(3, 4); raw[1, 1] = -32768
h = fits.ImageHDU(raw, name="SCALEDBLANK", do_not_scale_image_data=True)
h.header["BSCALE"] = 0.25; h.header["BZERO"] = 100.0; h.header["BLANK"] = -32768
# scaled float
f = fits.ImageHDU(np.array([1.5, np.nan, 3.0, np.inf], ">f4"), name="FSCALED", do_not_scale_image_data=True)
f.header["BSCALE"] = 2.0; f.header["BZERO"] = -1.0
fb = fits.ImageHDU(np.array([1.5, -99.0], ">f8"), name="FBLANK"); fb.header["BLANK"] = -99
u8b = fits.ImageHDU(np.array([[0, 255, 7]], "u1"), name="U8BLANK"); u8b.header["BLANK"] = 255
i4s = fits.ImageHDU(np.arange(10, dtype=">i4") * 1000003, name="I4SCALED", do_not_scale_image_data=True)
i4s.header["BSCALE"] = 1e-3; i4s.header["BZERO"] = 0.5
i8 = fits.ImageHDU(np.array([-2**62, 3, 2**62], ">i8"), name="I64")
explicit = fits.ImageHDU(np.arange(4, dtype=">i2"), name="EXPLICIT", do_not_scale_image_data=True)
explicit.header["BSCALE"] = 1.0; explicit.header["BZERO"] = 0.0
w("scaled", [fits.PrimaryHDU(), h, f, fb, u8b, i4s, i8, explicit])
# odd shapes and names
zero = fits.ImageHDU(name="ZERO1"); zero.header["NAXIS"] = 1; zero.header["NAXIS1"] = 0
w("shapes", [fits.PrimaryHDU(np.arange(2 * 3 * 1 * 2 * 2, dtype=">f8").reshape(2, 3, 1, 2, 2)),
             fits.ImageHDU(np.zeros((0, 5), ">i2"), name="ZERO2"),
             fits.ImageHDU(np.array([42], ">i4"), name="ONE"),
             fits.ImageHDU(np.ones((2, 2), ">f4"), name="A/B"),
             fits.ImageHDU(np.ones((2, 2), ">f4"), name=".HIDDEN"),
             fits.ImageHDU(np.ones((3,), ">f4"), name="SCI", ver=1),
             fits.ImageHDU(np.ones((3,), ">f4") * 2, name="SCI", ver=1),
             fits.ImageHDU(np.ones((3,), ">f4") * 3, name="SCI", ver=2),
             fits.ImageHDU(np.ones((2,), ">f4") * 4, name="SCI_2"),
             fits.ImageHDU(np.ones((2,), ">f4") * 5, name="HDU9")])
# the CF names a header may carry (HIERARCH keeps their case): astropy applies none of them
h = fits.ImageHDU(np.arange(4, dtype=">i2"), name="X")
for k, v in [("add_offset", 1000), ("scale_factor", 2.0), ("_FillValue", 3), ("missing_value", 1),
             ("_Unsigned", "true"), ("units", "days since 2000-01-01"), ("valid_max", 1)]:
    h.header[f"HIERARCH {k}"] = v
g = fits.ImageHDU(np.arange(4, dtype=">f4"), name="Y")
g.header["HIERARCH _ARRAY_DIMENSIONS"] = "oops"
g.header["HIERARCH coordinates"] = "X"
w("hierarch", [fits.PrimaryHDU(), h, g])
# tile compressed, every algorithm
img = (r.normal(100, 10, (40, 30))).astype("f4")
comp = [fits.PrimaryHDU()]
for algo in ("RICE_1", "GZIP_1", "GZIP_2", "HCOMPRESS_1", "PLIO_1", "NOCOMPRESS"):
    data = img.astype("i4") if algo == "PLIO_1" else img
    comp.append(fits.CompImageHDU(data, compression_type=algo, name=algo))
w("tiled", comp)
# checksum cards, big-endian floats, NaN
p = fits.PrimaryHDU(np.array([[np.nan, -0.0, 1e-30, 3.4e38]], ">f4"))
p.add_checksum()
w("checksum_nan", [p])
# a truncated file: the image runs past the end
w("whole", [fits.PrimaryHDU(np.arange(2000, dtype=">f8"))])
data = open(f"{out}/whole.fits", "rb").read()
open(f"{out}/truncated.fits", "wb").write(data[:2880 + 4000])
import os; os.remove(f"{out}/whole.fits")

# ---- tiled_gzip.fits (gen_tiled)
r = np.random.default_rng(2)
img = r.integers(-3000, 3000, (24, 20)).astype("i2")
hdus = [fits.PrimaryHDU()]
for algo in ("GZIP_1", "GZIP_2", "NOCOMPRESS"):
    hdus.append(fits.CompImageHDU(img, compression_type=algo, name=f"I2_{algo}"))
    hdus.append(fits.CompImageHDU(img.astype("i4") * 1000, compression_type=algo, name=f"I4_{algo}", tile_shape=(6, 5)))
    hdus.append(fits.CompImageHDU((img % 256).astype("u1"), compression_type=algo, name=f"U1_{algo}", tile_shape=(24, 4)))
    hdus.append(fits.CompImageHDU((img.astype("i4") + 30000).astype("u2"), compression_type=algo, name=f"U2_{algo}"))
    hdus.append(fits.CompImageHDU(r.normal(0, 1, (3, 8, 10)).astype("f4"), compression_type=algo, name=f"F4_{algo}",
                                  quantize_level=0.0))
    hdus.append(fits.CompImageHDU(r.normal(0, 1, (8, 10)).astype("f8"), compression_type=algo, name=f"F8Q_{algo}"))
hdus.append(fits.CompImageHDU(img, compression_type="GZIP_2", name="UNEVEN", tile_shape=(7, 6)))
hdus.append(fits.CompImageHDU(img, compression_type="RICE_1", name="RICE"))
s = fits.CompImageHDU(img, compression_type="GZIP_1", name="SCALED")
hdus.append(s)
fits.HDUList(hdus).writeto(f"{out}/tiled_gzip.fits", overwrite=True)
# a scaled integer image with BLANK, tile-compressed
with fits.open(f"{out}/tiled_gzip.fits", mode="update", disable_image_compression=True) as f:
    f["SCALED"].header["BSCALE"] = 0.5
    f["SCALED"].header["BZERO"] = 7.0
    f["SCALED"].header["BLANK"] = int(img[0, 0])

# ---- rice.fits: RICE_1 tiles (fpack's and astropy's default) of each integer width, 2-D and uneven tiles
r = np.random.default_rng(3)
img = r.integers(-3000, 3000, (12, 10)).astype("i2")
hdus = [fits.PrimaryHDU(),
        fits.CompImageHDU(img, compression_type="RICE_1", name="I2"),  # (rows, BYTEPIX 2)
        fits.CompImageHDU(img.astype("i4") * 70000, compression_type="RICE_1", name="I4", tile_shape=(4, 5)),
        fits.CompImageHDU((img % 256).astype("u1"), compression_type="RICE_1", name="U1", tile_shape=(12, 2)),
        fits.CompImageHDU((img.astype("i4") + 30000).astype("u2"), compression_type="RICE_1", name="U2"),
        fits.CompImageHDU(r.integers(0, 9, (2, 3, 4)).astype("i2"), compression_type="RICE_1", name="CUBE",
                          tile_shape=(1, 3, 2)),
        fits.CompImageHDU(img, compression_type="RICE_1", name="SCALED"),
        fits.CompImageHDU(img.astype("i4"), compression_type="RICE_1", name="NOBYTEPIX"),
        fits.CompImageHDU(img, compression_type="RICE_1", name="UNEVEN", tile_shape=(5, 4)),
        fits.CompImageHDU(r.normal(0, 1, (6, 5)).astype("f4"), compression_type="RICE_1", name="F4Q")]
fits.HDUList(hdus).writeto(f"{out}/rice.fits", overwrite=True)
with fits.open(f"{out}/rice.fits", mode="update", disable_image_compression=True) as f:
    f["SCALED"].header["BSCALE"] = 0.5
    f["SCALED"].header["BZERO"] = 7.0
    f["SCALED"].header["BLANK"] = int(img[0, 0])
    # int16 values in BYTEPIX 4 tiles with no BYTEPIX card (cfitsio's default, 4): the image says BITPIX 16
    t = f["NOBYTEPIX"].header
    t["ZBITPIX"] = 16
    del t["ZNAME2"], t["ZVAL2"]
# BLOCKSIZE 16 (astropy writes 32 only): I2's rows encoded again with imagecodecs' rcomp (cfitsio's coder)
import imagecodecs
with fits.open(f"{out}/rice.fits", disable_image_compression=True) as f:
    t = f["I2"]
    tiles = np.array([np.frombuffer(imagecodecs.rcomp_encode(row.astype("<i2"), nblock=16), "u1") for row in img],
                     dtype=object)
    b16 = fits.BinTableHDU.from_columns([fits.Column(name="COMPRESSED_DATA", format="1PB()", array=tiles)],
                                        header=t.header)
    b16.header["ZVAL1"] = 16
    b16.header["EXTNAME"] = "B16"
with fits.open(f"{out}/rice.fits", mode="append") as f:
    f.append(b16)
