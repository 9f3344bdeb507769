"""Real files from other projects' test suites (issue 40), each mounted directly and compared with the
same tool on the file: HDF4's own test files (The HDF Group's hdp, hdiff, hdfimport and example files)
and HDF-EOS2 grid and swath files (pyhdfeos's), tests/data/hdf4/hdfgroup, with pyhdf; real GRIB2 messages of kerchunk's tests (HRRR sub-hourly, GEFS,
CMC) with NOAA-style `.idx` files, a glob of them served by nginx, with cfgrib; astropy's FITS test files
with astropy; zipped Zarr stores written by zarr's ZipStore with zarr; OPeNDAP's HDF4 files (scanned, and by their
DMR++) and netCDF-C's, with pyhdf; ecCodes' GRIB2 samples and cfgrib's and pygrib's GRIB2 files with cfgrib. Every variable of every file is
either read with the oracle's values or named in one log line of the mount (what is not virtualised);
never a wrong value. The READMEs beside the data say where each file comes from and its licence.
One mount per format, shared by the module's tests."""

from __future__ import annotations

import importlib.util
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import Mount

DATA = Path(__file__).parent / "data"
# (The HDF Group's, OPeNDAP's and Unidata's test files: one glob)
HDF4_SUITE = [DATA / "hdf4" / name for name in ("hdfgroup", "opendap", "unidata")]
HDF4_FILES = sorted(p.name for d in HDF4_SUITE for p in d.glob("*.hdf")) + ["partial_chunks.hdf"]
GRIB_REAL = DATA / "gribidx" / "real"
FITS_DIR = DATA / "fits"
FITS_FILES = sorted(p.name for p in FITS_DIR.glob("*.fits")) + ["unsigned.fits"]


def _mount(root: Path, source: str, *args: str) -> Mount:
    env = dict(os.environ, XDG_CACHE_HOME=str(root / "xdg-cache"))  # (this module's scans: its own)
    return Mount(source, root / "mnt", args, env=env).start(timeout=180)


def _suite(root: Path, files, write, written: str):
    """(data directory, mount of a glob of it in the raw view): `files` copied, and `write(path)` makes
    the file `written` beside them."""
    data = root / "data"
    data.mkdir()
    suffix = Path(written).suffix
    for path in files:
        shutil.copy(path, data / path.name)
    write(data / written)
    m = _mount(root, f"{data}/*{suffix}", "--view", "raw")
    yield data, m
    m.stop()


def _log_names(log: str, *words: str) -> list[str]:
    return [line for line in log.splitlines() if all(w in line for w in words)]


def _open_raw(path: Path):
    import xarray as xr

    return xr.open_zarr(path, mask_and_scale=False, decode_times=False, consolidated=True)


# ----------------------------------------------------------------------------- HDF4 (pyhdf)


def _partial_chunks(path: Path) -> None:
    """An SDS written in part (HDF4 writes the fill value in the rest), and SDSs never written, one with a
    fill value set and one without (HDF4's default). pyhdf cannot make chunked SDSs; a chunk never
    written takes the same path as an SDS never written (refs/scan/hdf4.py)."""
    from pyhdf.SD import SD, SDC

    sd = SD(str(path), SDC.WRITE | SDC.CREATE)
    try:
        sds = sd.create("partial", SDC.FLOAT32, (4, 9))
        sds.setfillvalue(-5.5)
        sds[0:2, 0:3] = np.arange(6, dtype="f4").reshape(2, 3)
        sds[2:4, 6:9] = -np.arange(6, dtype="f4").reshape(2, 3)
        sds.endaccess()
        sd.create("never_written", SDC.UINT16, (3, 2)).endaccess()
        sds = sd.create("never_written_filled", SDC.INT8, (5,))
        sds.setfillvalue(-3)
        sds.endaccess()
    finally:
        sd.end()


def pyhdf_sds(path: Path) -> dict[str, np.ndarray | None]:
    """{SDS name: values as pyhdf reads them (None where pyhdf cannot read them), coordinate variables left
    out where they are the old DFSD interface's dimension scales}"""
    from pyhdf.SD import SD, SDC

    sd = SD(str(path), SDC.READ)
    out = {}
    try:
        for name in sd.datasets():
            sds = sd.select(name)
            try:
                out[name] = np.asarray(sds[:])
            except Exception:  # (pyhdf: an unlimited dimension of no records, SZIP without the library)
                out[name] = None
            finally:
                sds.endaccess()
    finally:
        sd.end()
    return out


@pytest.fixture(scope="module")
def hdf4_mount(tmp_path_factory):
    pytest.importorskip("pyhdf")
    yield from _suite(tmp_path_factory.mktemp("hdf4suite"), [p for d in HDF4_SUITE for p in d.glob("*.hdf")], _partial_chunks,
                      "partial_chunks.hdf")


@pytest.mark.parametrize("name", HDF4_FILES)
def test_hdf4_test_suite_file_reads_as_pyhdf_reads_it(hdf4_mount, name):
    """Each SDS pyhdf reads: the same values (dtype, shape) on the mount, or one log line naming it."""
    data, m = hdf4_mount
    expected = pyhdf_sds(data / name)
    listed = set(os.listdir(m.path / name)) if (m.path / name).is_dir() else set()
    log = m.log()
    if not listed - {".zgroup", ".zattrs", ".zmetadata"}:
        ds = None
    else:
        ds = _open_raw(m.path / name)
    try:
        for var, values in expected.items():
            if var.startswith("fakeDim") and var not in listed:
                assert _log_names(log, name, "dimension scales") or not any(
                    v.startswith("Data-Set-") for v in listed), (name, var)  # (a DFSD dataset's scales)
                continue
            if var not in listed:
                assert _log_names(log, name, var), f"{name}: {var} neither mounted nor said: {log}"
                continue
            got = ds[var].values
            if values is None:  # (pyhdf cannot read it: an unlimited dimension with no record yet)
                assert 0 in got.shape, (name, var, got.shape)
                continue
            assert got.shape == values.shape, (name, var, got.shape, values.shape)
            assert got.dtype.newbyteorder("=") == values.dtype.newbyteorder("="), (name, var, got.dtype)
            np.testing.assert_array_equal(got, values, err_msg=f"{name}: {var}")
    finally:
        if ds is not None:
            ds.close()


def test_hdf4_values_never_written_read_as_hdf4s_fill(hdf4_mount):
    """kerchunk would give zeros where HDF4 gives the fill value of an SDS never written (its
    _FillValue, else HDF4's default: for uint16 32769, the bit pattern of netCDF's -32767)."""
    data, m = hdf4_mount
    with _open_raw(m.path / "partial_chunks.hdf") as ds:
        partial = ds["partial"].values
        assert (partial[0:2, 3:9] == -5.5).all() and partial[0, 1] == 1 and partial[3, 8] == -5
        assert (ds["never_written"].values == 32769).all()
        assert (ds["never_written_filled"].values == -3).all()


def test_hdf4_what_is_not_virtualised_is_said_per_variable(hdf4_mount):
    _, m = hdf4_mount
    log = m.log()
    for name, var, why in [("sds_compressed.hdf", "SDSskiphuff", "SKPHUFF compression"),
                           ("sds_compressed.hdf", "SDSszip", "SZIP compression"),
                           ("tdata.hdf", "a", "linked blocks"),
                           ("Tables.hdf", "Table AR with Attributes in External File", "Vdata table"),
                           ("storm110.hdf", "RIG 110", "raster image"),
                           ("Image_with_Palette.hdf", "RIG0.0", "GR raster image"),
                           ("Swath219.hdf", "Swath1", "swath dimension maps")]:
        assert len(_log_names(log, name, f"{var}: ", why)) == 1, (name, var, log)
    assert "Traceback" not in log


# ----------------------------------------------------------------------------- HDF4 by its DMR++ (pyhdf)

HDF4_DMRPP = DATA / "hdf4" / "opendap"
# (file, variable, why): what OPeNDAP's DMR++ of an HDF4 file holds that a reference cannot
DMRPP_REFUSED = [("SDS_unlimited_2.hdf", "/AppendableData", "linked blocks"),
                 ("vdata_linked_blocks.hdf", "/Solid_Particle_Mass", "linked blocks"),
                 ("grid_1_2d.hdf", "/GeoGrid/XDim_GeoGrid", "dmrpp:missingdata"),
                 ("vdata_test.hdf", "/vgroup/Test_Vset_Name", "compound type"),
                 ("PointFile.hdf", "/Simple_Point/Data_Vgroup/Sensor", "compound type")]


@pytest.fixture(scope="module")
def hdf4_dmrpp_mount(tmp_path_factory):
    """A glob of OPeNDAP's HDF4 files with their DMR++ beside them (each X.dmrpp stands for X)."""
    pytest.importorskip("pyhdf")
    root = tmp_path_factory.mktemp("hdf4dmrpp")
    shutil.copytree(HDF4_DMRPP, root / "data")
    m = _mount(root, f"{root / 'data'}/*.hdf", "--view", "raw")
    yield root / "data", m
    m.stop()


def _hdf4_by_ref(path: Path, attrs: dict) -> np.ndarray:
    """What pyhdf reads of the SDS (dmr_sds_ref) or single-field Vdata (dmr_vdata_ref) a DMR++ variable is:
    its reference number, not its name (h_swath.hdf has two SDSs named temperature)."""
    from pyhdf.HDF import HDF
    from pyhdf.SD import SD, SDC

    if "dmr_sds_ref" in attrs:
        sd = SD(str(path), SDC.READ)
        try:
            sds = sd.select(sd.reftoindex(attrs["dmr_sds_ref"]))
            try:
                return np.asarray(sds[:])
            finally:
                sds.endaccess()
        finally:
            sd.end()
    import pyhdf.VS  # noqa: F401  (HDF.vstart needs it imported)

    f = HDF(str(path))
    vs = f.vstart()
    try:
        vd = vs.attach(attrs["dmr_vdata_ref"])
        try:
            return np.asarray(vd[:] if vd.inquire()[0] else [])
        finally:
            vd.detach()
    finally:
        vs.end()
        f.close()


@pytest.mark.parametrize("name", sorted(p.name[:-len(".dmrpp")] for p in HDF4_DMRPP.glob("*.hdf.dmrpp")
                                        if p.with_suffix("").exists()))
def test_hdf4_dmrpp_reads_as_pyhdf_reads_the_file(hdf4_dmrpp_mount, name):
    """Every array of OPeNDAP's DMR++ of an HDF4 file holds pyhdf's values of the SDS or Vdata field it names
    by reference number (a Vdata field's type as the DMR++ declares it); what it cannot hold is one log line."""
    import zarr

    data, m = hdf4_dmrpp_mount
    try:
        (m.path / name).is_dir()  # (a glob's file is converted when first looked up)
    except OSError:
        pass
    log = m.log()
    assert "Traceback" not in log
    if not os.path.exists(m.path / name / ".zgroup"):  # (OPeNDAP's own SDS_simple.hdf.dmrpp has text before its XML)
        assert len(_log_names(log, f"/{name}.dmrpp", "not well-formed XML")) == 1, log
        return
    for _, var, why in [r for r in DMRPP_REFUSED if r[0] == name]:
        assert len(_log_names(log, f"/{name}.dmrpp: variable {var} left out", why)) == 1, (var, log)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for var, arr in _arrays(zarr.open_group(str(m.path / name), mode="r")):
            want, got = _hdf4_by_ref(data / name, dict(arr.attrs)), arr[...]
            if want.dtype.kind == "U":  # (pyhdf: a char Vdata field as text without its NULs; the DMR++: Int8)
                want = np.frombuffer("".join(want.ravel()).encode("latin-1").ljust(got.size, b"\0"), got.dtype)
            assert want.size == got.size, (name, var, want.shape, got.shape)
            if "dmr_sds_ref" in arr.attrs:
                assert got.shape == want.shape and got.dtype.newbyteorder("=") == want.dtype.newbyteorder("="), var
            np.testing.assert_array_equal(got, want.reshape(got.shape).astype(got.dtype), err_msg=f"{name}: {var}")


# ----------------------------------------------------------------------------- GRIB2 + .idx (cfgrib)

LOG_FORMAT = '$request_method $uri "$http_range" $status'
# (stored file, its name on the server, the same product's next cycle written from it, hours later):
# names as NOAA's (a kind's files differ in their digits only; the HRRR sample is t01z's wrfsubhf01)
CYCLES = [("hrrr.wrfsubhf.sample.grib2", "hrrr.t01z.wrfsubhf01.grib2", "hrrr.t02z.wrfsubhf01.grib2", 1),
          ("gec00_20250101_00_soilw.grib", "gec00_20250101_00_soilw.grib", "gec00_20250101_06_soilw.grib", 6),
          ("CMC_reg_DEPR_ISBL_10_ps10km_2022072000_P000.grib2", "CMC_reg_DEPR_ISBL_10_ps10km_2022072000_P000.grib2",
           "CMC_reg_DEPR_ISBL_10_ps10km_2022072012_P000.grib2", 12)]
GRIB_FILES = [name for cycle in CYCLES for name in cycle[1:3]]


@pytest.fixture(scope="module")
def grib_mount(tmp_path_factory):
    """nginx serving the real files, their idx and each one's next cycle; one mount of the glob, and the
    access log as it was once the metadata of every file had been read."""
    pytest.importorskip("cfgrib")
    import netCDF4

    from tests.support.clients import nczarr_url
    from tests.support.gribfiles import another_cycle
    from tests.support.nginx import Nginx

    root = tmp_path_factory.mktemp("gribreal")
    www = root / "www" / "data"
    www.mkdir(parents=True)
    for stored, first, second, hours in CYCLES:
        shutil.copy(GRIB_REAL / stored, www / first)
        shutil.copy(GRIB_REAL / f"{stored}.idx", www / f"{first}.idx")
        another_cycle(www / first, www / second, hours)
    with Nginx(root / "nginx", f"root {www.parent}; location /data/ {{ autoindex on; }}", LOG_FORMAT) as nginx:
        m = _mount(root, f"{nginx.url}/data/*[2b]")
        try:
            for name in GRIB_FILES:  # every file's metadata, as netCDF-C reads it
                with netCDF4.Dataset(nczarr_url(m.path / name)):
                    pass
            yield www, m, list(nginx.access_log())
        finally:
            m.stop()


def test_grib_glob_mounts_from_idx_with_one_scan_per_kind(grib_mount):
    _, m, log = grib_mount
    assert sorted(os.listdir(m.path)) == sorted(GRIB_FILES)
    gribs = {line.split()[1] for line in log if line.startswith("GET /data/") and not line.split()[1].endswith((".idx", "/"))}
    assert len(gribs) == len(CYCLES), gribs  # (the first file of each kind scanned; the other by its .idx)
    idx = [line for line in log if line.startswith("GET") and line.split()[1].endswith(".idx")]
    assert len(idx) == len(GRIB_FILES), idx


def _cfgrib(path: Path):
    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_dataset(path, engine="cfgrib", indexpath="", decode_timedelta=True).load()


def _groups(ds, prefix=""):
    yield prefix, ds
    for name, group in ds.groups.items():
        yield from _groups(group, f"{prefix}/{name}")


@pytest.mark.parametrize("name", GRIB_FILES)
def test_real_grib_reads_as_cfgrib_reads_it(grib_mount, name):
    """Every field's values, its run time, step and valid time (a sub-hourly HRRR step is 15 minutes,
    not 15 hours), read by netCDF-C on the decoded view, equal cfgrib's on the file."""
    import netCDF4

    from tests.support.clients import nczarr_url

    www, m, _ = grib_mount
    expected = _cfgrib(www / name)
    found = {}
    with netCDF4.Dataset(nczarr_url(m.path / name)) as ds:
        for _, group in _groups(ds):
            for var in set(group.variables) & set(expected.data_vars):
                v = group[var]
                v.set_auto_maskandscale(False)
                times = {}
                for coord in ("time", "step", "valid_time"):
                    c = group[coord]
                    values = np.asarray(c[:], dtype="f8").ravel()
                    scale = {"hours": 3600, "seconds": 1}[c.units.split()[0]]
                    times[coord] = values[0] * scale
                found[var] = (np.asarray(v[...]), times)
    assert set(found) == set(expected.data_vars), (found.keys(), expected.data_vars)
    for var, (values, times) in found.items():
        want = expected[var].values  # (cfgrib gives float32 of eccodes' doubles; kerchunk's codec the doubles)
        np.testing.assert_array_equal(values.reshape(want.shape).astype(want.dtype), want, err_msg=var)
        assert times["time"] == expected.time.values.astype("datetime64[s]").astype(int), var
        assert times["step"] == expected.step.values.astype("timedelta64[s]").astype(int), var
        assert times["valid_time"] == expected.valid_time.values.astype("datetime64[s]").astype(int), var


# ----------------------------------------------------------------------------- GRIB2 of other projects (cfgrib)

GRIB2_OTHERS = DATA / "grib2"
# files kerchunk's scan cannot give right, each said in one line: (a word of that line)
GRIB2_REFUSED = {"cfgrib_alternate-scanning.grib2": "alternativeRowScanning",
                 "pygrib_scanning_mode.grib2": "jPointsAreConsecutive",
                 "pygrib_scanning_mode_with_bitmap.grib2": "jPointsAreConsecutive",
                 "cfgrib_step_60m.grib2": "cannot be scanned",  # (kerchunk's grib_tree: an IndexError)
                 "eccodes_lambert_bf_grib2.grib2": "cannot be scanned",  # (bi-Fourier: no latitudes)
                 "eccodes_sh_sfc_grib2.grib2": "cannot be scanned",  # (spherical harmonics: no grid)
                 "eccodes_reduced_gg_pl_32_grib2.grib2": "reduced grid",
                 "eccodes_reduced_gg_sfc_jpeg_grib2.grib2": "reduced grid",
                 "eccodes_reduced_ll_sfc_grib2.grib2": "reduced grid",
                 "eccodes_reduced_rotated_gg_sfc_jpeg_grib2.grib2": "reduced grid"}
GRIB2_FILES = sorted(p.name for p in GRIB2_OTHERS.glob("*2"))


@pytest.fixture(scope="module")
def grib2_mount(tmp_path_factory):
    """eccodes' GRIB2 samples and cfgrib's and pygrib's GRIB2 test files, each with a NOAA-style .idx
    written here, one glob mount (decoded view)."""
    pytest.importorskip("cfgrib")
    from tests.support.gribfiles import write_idx

    root = tmp_path_factory.mktemp("grib2others")
    data = root / "data"
    shutil.copytree(GRIB2_OTHERS, data, ignore=shutil.ignore_patterns("README.md"))
    for path in data.iterdir():
        write_idx(path)
    m = _mount(root, f"{data}/*2")
    yield data, m
    m.stop()


@pytest.mark.parametrize("name", GRIB2_FILES)
def test_other_projects_grib2_reads_as_cfgrib_reads_it(grib2_mount, name):
    """Every field cfgrib reads (each of its hypercubes: cfgrib.open_datasets), netCDF-C's values on the
    decoded view, levels in either order; a file kerchunk cannot give right is one log line, never values."""
    import cfgrib
    import netCDF4

    from tests.support.clients import nczarr_url

    data, m = grib2_mount
    if name in GRIB2_REFUSED:
        with pytest.raises(OSError):
            (m.path / name / ".zgroup").stat()
        log = m.log()
        assert len(_log_names(log, f"/{name}: ", GRIB2_REFUSED[name])) == 1, log
        assert "Traceback" not in log
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = cfgrib.open_datasets(str(data / name), indexpath="")
    with netCDF4.Dataset(nczarr_url(m.path / name)) as nc:
        groups = dict(_groups(nc))
        for ds in expected:
            for var in ds.data_vars:
                a = ds[var].attrs
                group = groups.get(f"/{var}/{a['GRIB_stepType']}/{a['GRIB_typeOfLevel']}", groups[""])
                v = group[var]
                v.set_auto_maskandscale(False)
                got, want = np.asarray(v[...]).squeeze(), ds[var].values
                level = a["GRIB_typeOfLevel"]
                if level in ds[var].dims:  # (cfgrib orders pressure levels downwards, kerchunk upwards)
                    mounted = list(np.asarray(group[level][:]).ravel())
                    got = got[[mounted.index(x) for x in ds[level].values]]
                np.testing.assert_array_equal(got.reshape(want.shape).astype(want.dtype), want, err_msg=f"{name}: {var}")


def test_grib_split_ends_at_bytes_after_the_last_message():
    """kerchunk's splitter stepped back 4 bytes for ever at trailing bytes that hold no message (MARS pads
    files to 120 bytes); refmount's ends, and reads no more than the file."""
    import io

    from refmount.refs.scan.worker import _split_grib

    message = (DATA / "grib2" / "eccodes_GRIB2.grib2").read_bytes()

    class Counted(io.BytesIO):
        reads = 0

        def read(self, size=-1):
            Counted.reads += 1
            assert Counted.reads < 100, "the splitter does not end"
            return super().read(size)

    for tail in (b"", b"\0" * 3, b"\0" * 83, b"\0" * 5000):
        Counted.reads = 0
        parts = list(_split_grib(Counted(message * 2 + tail)))
        assert [(start, size) for start, size, _ in parts] == [(0, len(message)), (len(message), len(message))]


# ----------------------------------------------------------------------------- FITS (astropy)


def _unsigned(path: Path) -> None:
    """Unsigned and signed-byte images as astropy writes them (BZERO 2**15, 2**31, 2**63, -128)."""
    from astropy.io import fits

    fits.HDUList([fits.PrimaryHDU(np.arange(12, dtype="u2").reshape(3, 4) * 5000),
                  fits.ImageHDU(np.arange(6, dtype="u4") * 700_000_000, name="U32"),
                  fits.ImageHDU(np.arange(-3, 3, dtype="i1"), name="I8"),
                  fits.ImageHDU(np.array([1.5, np.nan, -2.25e300], ">f8"), name="F64")]).writeto(path)


def astropy_hdus(path: Path):
    """[(name refmount gives the HDU, stored values or None where it is not an image, physical values)]"""
    from astropy.io import fits

    from refmount.refs.scan.fits import hdu_name

    out, taken = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fits.open(path, do_not_scale_image_data=True) as raw, fits.open(path) as scaled:
            for index, (r, s) in enumerate(zip(raw, scaled)):
                if (r.is_image and not isinstance(r, (fits.CompImageHDU, fits.GroupsHDU))
                        and r.header.get("NAXIS", 0) == 0):
                    continue
                name = hdu_name(r, index, taken)
                # (the compressed images of astropy's files are RICE_1 tiles of integers: read with imagecodecs)
                image = r.is_image and not isinstance(r, fits.GroupsHDU) and (
                    not isinstance(r, fits.CompImageHDU) or importlib.util.find_spec("imagecodecs") is not None)
                if image:
                    taken.add(name)
                out.append((name, np.array(r.data) if image else None, np.array(s.data) if image else None))
    return out


@pytest.fixture(scope="module")
def fits_mount(tmp_path_factory):
    pytest.importorskip("astropy")
    yield from _suite(tmp_path_factory.mktemp("fitssuite"), FITS_DIR.glob("*.fits"), _unsigned, "unsigned.fits")


@pytest.mark.parametrize("name", FITS_FILES)
def test_fits_test_file_reads_as_astropy_reads_it(fits_mount, name):
    """Every image HDU: astropy's stored values in the raw view, its physical values (BSCALE, BZERO,
    BLANK, unsigned) through xarray's CF decoding; every other HDU named in one log line."""
    import xarray as xr

    data, m = fits_mount
    hdus = astropy_hdus(data / name)
    images = {n: (stored, physical) for n, stored, physical in hdus if stored is not None}
    listed = os.listdir(m.path / name)  # (a glob's file is scanned when its directory is first read)
    log = m.log()
    for hdu, stored, _ in hdus:
        if stored is None:
            assert len(_log_names(log, f"/{name}: ", f"{hdu}: ")) == 1, (name, hdu, log)
    if not images:
        assert not [n for n in listed if not n.startswith(".")], listed
        return
    with _open_raw(m.path / name) as ds:
        assert sorted(ds.data_vars) == sorted(images), name
        for var, (stored, _) in images.items():
            got = ds[var].values
            assert got.dtype.newbyteorder("=") == stored.dtype.newbyteorder("=") and got.shape == stored.shape, var
            np.testing.assert_array_equal(got, stored, err_msg=f"{name}: {var}")
    with xr.open_zarr(m.path / name, consolidated=True) as ds:
        for var, (_, physical) in images.items():  # (astropy scales 16-bit integers to float32)
            rtol = 1e-6 if physical.dtype.kind == "f" and physical.dtype.itemsize == 4 else 1e-12
            np.testing.assert_allclose(ds[var].values, physical.astype("f8"), rtol=rtol, err_msg=f"{name}: {var}")


# ----------------------------------------------------------------------------- zipped Zarr (zarr)


def _zipped(path: Path, zarr_format: int) -> None:
    """A store as zarr's ZipStore writes it: a nested group, several dtypes and codecs, chunks never
    written (fill values), edge chunks, and (v3) a sharded array."""
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = zarr.storage.ZipStore(str(path), mode="w")
        root = zarr.open_group(store, mode="w", zarr_format=zarr_format)
        root.attrs["title"] = "zipped"
        a = root.create_array("ints", shape=(7, 5), chunks=(3, 2), dtype="i2", fill_value=-9)
        a[:3, :] = np.arange(15, dtype="i2").reshape(3, 5)
        b = root.create_group("sub").create_array("floats", shape=(10,), chunks=(4,), dtype=">f8", fill_value=np.nan)
        b[:6] = np.linspace(0, 1, 6)
        c = root.create_array("bytes", shape=(6, 4), chunks=(6, 4), dtype="u1", fill_value=0)
        c[:] = np.arange(24, dtype="u1").reshape(6, 4)
        if zarr_format == 3:
            d = root.create_array("sharded", shape=(8, 8), chunks=(2, 2), shards=(4, 4), dtype="f4", fill_value=0)
            d[:4, :] = np.arange(32, dtype="f4").reshape(4, 8)
        store.close()


@pytest.fixture(scope="module")
def zip_mounts(tmp_path_factory):
    root = tmp_path_factory.mktemp("zipped")
    made = {}
    try:
        for fmt in (2, 3):
            path = root / f"z{fmt}.zarr.zip"
            _zipped(path, fmt)
            made[fmt] = (path, _mount(root / f"m{fmt}", str(path)))
        yield made
    finally:
        for _, m in made.values():
            m.stop()


def _arrays(group, prefix=""):
    for name, arr in group.arrays():
        yield f"{prefix}{name}", arr
    for name, sub in group.groups():
        yield from _arrays(sub, f"{prefix}{name}/")


@pytest.mark.parametrize("fmt", [2, 3])
def test_zipped_zarr_reads_as_zarr_reads_the_store(zip_mounts, fmt):
    import zarr

    path, m = zip_mounts[fmt]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = zarr.storage.ZipStore(str(path), mode="r")
        expected = dict((name, arr[...]) for name, arr in _arrays(zarr.open_group(store, mode="r")))
        mounted = zarr.open_group(str(m.path), mode="r")
        got = dict((name, arr[...]) for name, arr in _arrays(mounted))
        store.close()
    assert sorted(got) == sorted(expected)
    for name, values in expected.items():
        assert got[name].dtype.newbyteorder("=") == values.dtype.newbyteorder("="), name
        np.testing.assert_array_equal(got[name], values, err_msg=name)


# ----------------------------------------------------------------------------- HDF5 fixed-length strings


def _strings(path: Path) -> None:
    """Fixed-length strings of each HDF5 padding, with bytes after the terminator (HDF5 keeps whatever the
    writer's buffer held there; h5py's low-level write stores it), too many to be inlined by the scan."""
    import h5py

    values = np.array([b"ab\x00garb", b"abcdefg\x00", b"x  \x00\x00\x00\x00z", b"ab  "] * 75, dtype="S8")
    with h5py.File(path, "w") as f:
        for pad, name in [(h5py.h5t.STR_NULLTERM, b"null_term"), (h5py.h5t.STR_NULLPAD, b"null_pad"),
                          (h5py.h5t.STR_SPACEPAD, b"space_pad")]:
            tid = h5py.h5t.C_S1.copy()
            tid.set_size(8)
            tid.set_strpad(pad)
            h5py.h5d.create(f.id, name, tid, h5py.h5s.create_simple(values.shape)).write(
                h5py.h5s.ALL, h5py.h5s.ALL, values)


def _unwritten_strings(path: Path) -> None:
    """Chunked strings of which one chunk of four is written, with HDF5's default fill and one of their
    own (netCDF-C 4.9.0 crashes closing this file: h5py is the oracle)."""
    import h5py

    with h5py.File(path, "w") as f:
        for name, fill in (("unwritten", None), ("unwritten_filled", b"zz")):
            d = f.create_dataset(name, shape=(400,), dtype="S4", chunks=(100,), fillvalue=fill)
            d[:100] = np.array([b"abc"] * 100, "S4")


_NETCDF_STRINGS = """
import json, sys
import netCDF4
out = {}
for target in sys.argv[1:]:
    with netCDF4.Dataset(target) as ds:
        out[target] = {name: [str(v) for v in ds[name][:].tolist()] for name in ("null_term", "null_pad", "space_pad")}
print(json.dumps(out))
"""


def test_hdf5_strings_end_at_their_terminator_as_netcdf_c_reads_them(tmp_path, mount):
    """kerchunk references the stored bytes (``ab\\0garb``); the decoded view cuts each value where HDF5's
    padding says it ends: netCDF-C's values (a space-padded one to its first NUL, spaces kept, where h5py
    and Hyrax strip them). Chunks never written read as
    the dataset's fill value (kerchunk said b" " for every string) in either view. netCDF-C reads in a process of
    its own (the mount serves each reader its form: a process that has loaded zarr is zarr's)."""
    import json
    import subprocess
    import sys

    import h5py
    import xarray as xr

    from tests.support.clients import nczarr_url

    path = tmp_path / "strings.h5"
    _strings(path)
    m = mount(str(path))
    target = nczarr_url(m.path)
    proc = subprocess.run([sys.executable, "-c", _NETCDF_STRINGS, str(path), target], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    read = json.loads(proc.stdout)
    file, mounted = read[str(path)], read[target]
    for name in ("null_term", "null_pad", "space_pad"):
        assert mounted[name] == file[name], name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the decoded view has both v2 and v3 metadata)
        with xr.open_zarr(m.path, consolidated=True) as ds:  # (zarr: no NUL of its own to stop at)
            for name in ("null_term", "null_pad"):
                assert ds[name].values.tolist() == [v.encode() for v in file[name]], name
    assert "strings cut at their terminator (null_term)" in m.log()
    unwritten = tmp_path / "unwritten.h5"
    _unwritten_strings(unwritten)
    raw = mount(str(unwritten), "--view", "raw")  # (kerchunk gave every string the fill value b" ")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_zarr(raw.path, consolidated=True, mask_and_scale=False) as ds, h5py.File(unwritten) as h5:
            for name in ("unwritten", "unwritten_filled"):
                assert ds[name].values.tolist() == h5[name][:].tolist(), name
