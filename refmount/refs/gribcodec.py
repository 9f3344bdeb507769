"""GRIB messages decoded as cfgrib decodes them, for the decoded view (codec id "grib", kerchunk's).

kerchunk's GRIBCodec turns every value equal to eccodes' default missingValue, 9999, into NaN, whether or
not the message has a bitmap: a real 9999 (a geopotential height of 9999 m in NCEP's eta.grb) read as
NaN where cfgrib reads 9999. Here, as cfgrib does, the message's missingValue is first set to float32's
largest value (which no field holds), so that only the points its bitmap leaves out become NaN.
"""

from __future__ import annotations

import threading

import numpy as np

MISSING = float(np.finfo(np.float32).max)  # cfgrib's MISSING_VAUE_INDICATOR
_lock = threading.Lock()  # (eccodes' handles: one thread at a time, as kerchunk's codec)


class GribCodec:
    codec_id = "grib"

    def __init__(self, var: str, dtype: str | None = None) -> None:
        self.var, self.dtype = var, dtype

    def decode(self, buf, out=None, limit: int | None = None):
        """The message's values (or its latitudes/longitudes); `limit`: the most bytes they may come
        to, checked against the count its grid declares before eccodes makes them (a 179-byte message
        of a constant field declared 64,000,000 points: 512 MB)."""
        import eccodes

        coordinate = self.var in ("latitude", "longitude")
        served = np.dtype(self.dtype or ("float64" if coordinate else "float32"))
        with _lock:
            mid = eccodes.codes_new_from_message(bytes(buf))
            try:
                if limit is not None:
                    points = eccodes.codes_get(mid, "numberOfDataPoints" if coordinate else "numberOfValues")
                    if points * served.itemsize > limit:
                        raise ValueError(f"the GRIB message declares {points} points, {points * served.itemsize} "
                                         f"decoded bytes, more than the expected {limit}")
                if coordinate:
                    data = eccodes.codes_get_array(mid, self.var + "s")
                else:
                    eccodes.codes_set(mid, "missingValue", MISSING)
                    data = eccodes.codes_get_array(mid, "values")
                    data[data == MISSING] = np.nan
            finally:
                eccodes.codes_release(mid)
        return data.astype(served, copy=False)

    def encode(self, buf):
        return buf
