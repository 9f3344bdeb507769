"""Validate the test fixtures themselves (tests/support/datasets.py).

If these fail, the fixtures are wrong, not refmount: every file must open with
netCDF4, kerchunk must translate it, our independent byte oracle must agree with
fsspec, and data read back through the references must equal netCDF4's reading of
the source file.
"""

import bz2
import gzip
import json
import lzma
import time
import warnings

import netCDF4
import numpy as np
import pytest
import xarray as xr

from tests.support import datasets as D
from tests.support.rangeserver import RangeServer


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("nc")
    t0 = time.perf_counter()
    out = D.build_all(d)
    assert time.perf_counter() - t0 < 10
    return out


@pytest.fixture(scope="module")
def refsets(files):
    """{(name, inline_threshold): refs} with local-path targets."""
    out = {}
    for thr in (0, 300):
        for name, refs in D.all_refs(files, inline_threshold=thr).items():
            out[name, thr] = refs
    return out


def _groups(ds, prefix=""):
    """Yield (group path, netCDF4 group) depth-first, root first ("" = root)."""
    yield prefix, ds
    for name, g in ds.groups.items():
        yield from _groups(g, f"{prefix}/{name}" if prefix else name)


def _same(refs, key, got, expected):
    """Bytes equality, except JSON-object values: fsspec's text differs, compare parsed."""
    value = D.to_v0(refs)[key] if "version" in refs else refs[key]
    if isinstance(value, dict):
        return json.loads(got) == json.loads(expected) == value
    return got == expected


def _open_refs(refs, group=""):
    # zarr/xarray read through fsspec's reference filesystem; a group is selected by
    # rooting the mapper there (xarray's group= is refused for FSMap stores).
    fs = D.reference_fs(refs)
    return xr.open_dataset(fs.get_mapper(group), engine="zarr", consolidated=False,
                           zarr_format=2, decode_cf=False)


# ---------------------------------------------------------------------------- files


def test_every_kind_built_small_and_opens(files):
    assert set(D.KINDS) <= set(files)
    for name, path in files.items():
        assert path.stat().st_size < 2 * 1024 * 1024, name
        with netCDF4.Dataset(path) as ds:
            assert ds.data_model == "NETCDF4"
            assert list(_groups(ds))


def test_features_present(files):
    with netCDF4.Dataset(files["zlib"]) as ds:
        f = ds["t3"].filters()
        assert f["zlib"] and not f["shuffle"]
        assert ds["t3"].ndim == 3 and ds["t2"].ndim == 2
    with netCDF4.Dataset(files["shuffle_zlib"]) as ds:
        f = ds["t2"].filters()
        assert f["zlib"] and f["shuffle"]
    with netCDF4.Dataset(files["blosc"]) as ds:
        assert ds["t3"].filters()["blosc"]["compressor"] == "blosc_lz4"
        assert ds["t2"].filters()["blosc"]["compressor"] == "blosc_zstd"
    with netCDF4.Dataset(files["zstd"]) as ds:
        assert ds["t3"].filters()["zstd"]
    with netCDF4.Dataset(files["fletcher32"]) as ds:
        assert ds["t3"].filters()["fletcher32"]
    with netCDF4.Dataset(files["bigendian"]) as ds:
        assert ds["t3"].endian() == "big" and ds["t2"].chunking() == "contiguous"
    with netCDF4.Dataset(files["contiguous"]) as ds:
        assert ds["t3"].chunking() == "contiguous"
    with netCDF4.Dataset(files["unlimited"]) as ds:
        assert ds.dimensions["time"].isunlimited()
        assert len(ds.dimensions["time"]) == D.UNLIMITED_LEN
        assert ds["t3"].chunking()[0] == D.UNLIMITED_CHUNK > D.UNLIMITED_LEN
    with netCDF4.Dataset(files["groups"]) as ds:
        assert ds["forecast/surface/t2"].shape == (D.NY, D.NX)
    with netCDF4.Dataset(files["chars"]) as ds:
        assert ds["name"].dtype == np.dtype("S1")
        assert list(netCDF4.chartostring(ds["name"][:].data)) == D.CHAR_NAMES
    with netCDF4.Dataset(files["scalar"]) as ds:
        assert ds["pi"].shape == () and float(ds["pi"][...]) == np.pi
    with netCDF4.Dataset(files["attrs"]) as ds:
        assert ds.title == D.ATTRS_TITLE and ds["temp"].units == D.ATTRS_UNITS


def test_deterministic(tmp_path, files):
    again = D.make_netcdf(tmp_path, "zlib")
    with netCDF4.Dataset(again) as a, netCDF4.Dataset(files["zlib"]) as b:
        np.testing.assert_array_equal(a["t3"][:], b["t3"][:])


# ---------------------------------------------------------------------------- kerchunk output


def test_kerchunk_shapes_of_output(files, refsets):
    refs = refsets["zlib", 0]
    assert refs["version"] == 1
    body = refs["refs"]
    # metadata values are JSON *strings*; urls were normalised to the absolute path
    assert isinstance(body["t3/.zarray"], str)
    assert body["t3/0.0.0"][0] == str(files["zlib"].resolve())
    # with inline_threshold=300 every zlib chunk (< 300 bytes) is inline
    inl = refsets["zlib", 300]["refs"]
    assert any(isinstance(v, str) and v.startswith("base64:") for v in inl.values())
    # missing chunks: no key; never-written variable: metadata only
    m = refsets["missing", 0]["refs"]
    assert sorted(k for k in m if k.startswith("sparse/") and "/." not in k) == [
        "sparse/0.0", "sparse/2.1", "sparse/3.3"]
    assert not [k for k in m if k.startswith("never/") and "/." not in k]
    assert json.loads(m["sparse/.zarray"])["fill_value"] == D.MISSING_FILL
    assert json.loads(m["nanfill/.zarray"])["fill_value"] == "NaN"
    # unlimited: chunk longer than the array
    za = json.loads(refsets["unlimited", 0]["refs"]["t3/.zarray"])
    assert za["shape"][0] == D.UNLIMITED_LEN and za["chunks"][0] == D.UNLIMITED_CHUNK
    # big-endian and char dtypes
    assert json.loads(refsets["bigendian", 0]["refs"]["t3/.zarray"])["dtype"] == ">f4"
    assert json.loads(refsets["chars", 0]["refs"]["name/.zarray"])["dtype"] == "|S1"
    # non-ASCII attributes survive, but kerchunk's metadata text is ASCII with \uXXXX
    # escapes (and "\/"), which netCDF-C does not unescape (NOTES.md section 1)
    text = refsets["attrs", 0]["refs"]["temp/.zattrs"]
    assert text.isascii() and "\\u00b0C" in text
    assert json.loads(text)["units"] == D.ATTRS_UNITS
    assert "\\/" in refsets["groups", 0]["refs"]["forecast/t3/.zattrs"]


def test_kerchunk_rejects_fletcher32_by_default(files):
    with pytest.raises(Exception, match="fletcher32"):
        D.kerchunk_refs(files["fletcher32"])
    # kerchunk's own default error="warn" drops the variables silently
    refs = D.kerchunk_refs(files["fletcher32"], error="warn")
    assert "t3/.zarray" not in refs["refs"]


def test_url_forms(files):
    p = files["zlib"]
    for url in (str(p), D.file_url(p), "http://127.0.0.1:1/zlib.nc"):
        refs = D.kerchunk_refs(p, url=url)
        urls = {v[0] for v in refs["refs"].values() if isinstance(v, list)}
        assert urls == {url}
    http = D.retarget(D.kerchunk_refs(p), lambda u: "http://h/" + u.rsplit("/", 1)[1])
    assert {v[0] for v in http["refs"].values() if isinstance(v, list)} == {"http://h/zlib.nc"}


# ---------------------------------------------------------------------------- oracles


def test_oracle_matches_fsspec_every_key(refsets):
    n = 0
    for (name, thr), refs in refsets.items():
        fs = D.reference_fs(refs)
        for key in refs["refs"]:
            assert D.oracle_bytes(refs, key) == fs.cat_file(key), (name, thr, key)
            n += 1
    assert n > 500


def test_oracle_file_url_and_v0(files, refsets):
    refs = D.kerchunk_refs(files["groups"], url=D.file_url(files["groups"]))
    v0 = D.to_v0(refs)
    assert "version" not in v0 and set(v0) == set(refs["refs"])
    for key in v0:
        expected = D.oracle_bytes(refsets["groups", 0], key)
        assert D.oracle_bytes(refs, key) == expected
        assert D.oracle_bytes(v0, key) == expected
        assert D.oracle_fsspec(v0, key) == expected


def test_oracle_value_kinds(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(bytes(range(256)))
    refs = {
        "text": "°C é",
        "b64": "base64:" + __import__("base64").b64encode(b"\x00\xff\x10").decode(),
        "obj": {"zarr_format": 2},
        "whole": [str(f)],
        "part": [str(f), 10, 5],
        "empty": [str(f), 7, 0],
        "refs": "a v0 key may be called refs",
    }
    assert D.oracle_bytes(refs, "text") == "°C é".encode()
    assert D.oracle_bytes(refs, "b64") == b"\x00\xff\x10"
    assert D.oracle_bytes(refs, "obj") == b'{"zarr_format":2}'
    assert D.oracle_bytes(refs, "obj", json_text=json.dumps) == b'{"zarr_format": 2}'
    assert D.oracle_bytes(refs, "whole") == bytes(range(256))
    assert D.oracle_bytes(refs, "part") == bytes(range(10, 15))
    assert D.oracle_bytes(refs, "empty") == b""
    assert D.oracle_bytes(refs, "refs") == b"a v0 key may be called refs"
    for key in refs:
        assert _same(refs, key, D.oracle_fsspec(refs, key), D.oracle_bytes(refs, key)), key
    with pytest.raises(ValueError):
        D.oracle_bytes({"short": [str(f), 250, 10]}, "short")
    with pytest.raises(KeyError):
        D.oracle_bytes(refs, "nope")


def test_oracle_over_http(files):
    names = ["zlib", "groups", "air"]
    with RangeServer(files["zlib"].parent) as srv:
        for name in names:
            refs = D.kerchunk_refs(files[name], url=srv.url_for(files[name].name))
            fs = D.reference_fs(refs, remote_protocol="http")
            for key in refs["refs"]:
                expected = D.oracle_bytes(refs, key, url_to_path=srv.path_for)
                assert fs.cat_file(key) == expected, (name, key)
        assert srv.stats["status"].get(206, 0) > 0


# ---------------------------------------------------------------------------- data equality


def _assert_same_raw(nc_path, refs):
    """netCDF4 raw values == zarr-through-references raw values, every variable/group."""
    checked = 0
    with netCDF4.Dataset(nc_path) as nc:
        nc.set_auto_maskandscale(False)
        nc.set_auto_chartostring(False)
        for gpath, g in _groups(nc):
            zds = _open_refs(refs, gpath)
            for vname, var in g.variables.items():
                expected = var[...]
                got = zds[vname].values
                assert got.dtype.newbyteorder("=") == expected.dtype.newbyteorder("="), (gpath, vname)
                assert got.shape == expected.shape, (gpath, vname)
                np.testing.assert_array_equal(got, expected, err_msg=f"{nc_path.name}:{gpath}/{vname}")
                checked += 1
            zds.close()
    return checked


def test_refs_give_same_values_as_netcdf4(files, refsets):
    for name, path in files.items():
        for thr in (0, 300):
            assert _assert_same_raw(path, refsets[name, thr]) > 0, name


def test_refs_give_same_masked_values(files, refsets):
    # CF decoding (fill -> NaN, scale_factor) agrees too, for numeric variables.
    for name in ("missing", "bigendian", "scalar", "air", "unlimited"):
        fs = D.reference_fs(refsets[name, 0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zds = xr.open_dataset(fs.get_mapper(""), engine="zarr", consolidated=False,
                                  zarr_format=2, decode_times=False)
        with netCDF4.Dataset(files[name]) as nc:
            for vname, var in nc.variables.items():
                if var.dtype.kind not in "fiu":
                    continue
                expected = np.ma.filled(np.ma.asarray(var[...]).astype("f8"), np.nan)
                np.testing.assert_allclose(zds[vname].values.astype("f8"), expected,
                                           rtol=1e-6, err_msg=f"{name}/{vname}")


# ---------------------------------------------------------------------------- v1 templates/gen


def test_spec_example_expansion():
    assert D.to_v0(D.SPEC_V1_EXAMPLE) == D.SPEC_V0_EXPANSION
    # fsspec agrees, but only with simple_templates=False (else gen is dropped and the
    # callable template f(c=...) cannot render)
    fs = D.reference_fs(D.SPEC_V1_EXAMPLE, simple_templates=False, skip_instance_cache=True)
    assert {k: (list(v) if isinstance(v, (list, tuple)) else v)
            for k, v in fs.references.items()} == D.SPEC_V0_EXPANSION
    for bad in (2, "1", 1.0, True, None):
        with pytest.raises(ValueError):
            D.to_v0({"version": bad, "refs": {}})


def test_gen_refs_over_real_file(files):
    path = files["contiguous"]
    refs = D.gen_refs_for_contiguous(path)
    v0 = D.to_v0(refs)
    gen_keys = [k for k in v0 if k.startswith("t3/") and "/." not in k]
    assert len(gen_keys) == D.NT * 2
    # itertools.product order: last dimension (j) fastest
    assert gen_keys[:3] == ["t3/0.0.0", "t3/0.1.0", "t3/1.0.0"]
    fs = D.reference_fs(refs, simple_templates=False)
    for key in v0:
        assert _same(refs, key, fs.cat_file(key), D.oracle_bytes(refs, key)), key
    # zarr re-creates the filesystem from fs.to_json(), which chokes on None inside
    # JSON-object values: hand it the expanded set with metadata as JSON text.
    flat = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in v0.items()}
    zds = _open_refs(flat)
    with netCDF4.Dataset(path) as nc:
        np.testing.assert_array_equal(zds["t3"].values, nc["t3"][:].data)
    # and through http, via a templated url
    with RangeServer(path.parent) as srv:
        hrefs = D.gen_refs_for_contiguous(path, url=srv.url_for(path.name))
        hfs = D.reference_fs(hrefs, simple_templates=False, remote_protocol="http")
        for key in gen_keys:
            assert hfs.cat_file(key) == D.oracle_bytes(hrefs, key, url_to_path=srv.path_for)


# ---------------------------------------------------------------------------- writing


MAGIC = {".gz": b"\x1f\x8b", ".bz2": b"BZh", ".xz": b"\xfd7zXZ\x00", ".zst": b"\x28\xb5\x2f\xfd"}


def test_write_all_formats_roundtrip(tmp_path, refsets):
    refs = refsets["attrs", 300]
    written = D.write_all_formats(refs, tmp_path)
    assert set(written) == {"", ".gz", ".bz2", ".xz", ".zst"}
    for suf, path in written.items():
        raw = path.read_bytes()
        if suf:
            assert raw.startswith(MAGIC[suf]), suf
        assert D.read_refs(path) == refs, suf
    # independent decompressors agree
    assert json.loads(gzip.decompress(written[".gz"].read_bytes())) == refs
    assert json.loads(bz2.decompress(written[".bz2"].read_bytes())) == refs
    assert json.loads(lzma.decompress(written[".xz"].read_bytes())) == refs
    # ensure_ascii: plain file is pure ASCII with \\u escapes; False keeps UTF-8
    assert written[""].read_bytes().isascii()
    plain = {"version": 1, "refs": {".zattrs": {"units": "°C"}, "k": "é"}}
    utf8 = D.write_refs(plain, tmp_path / "u.json", ensure_ascii=False).read_bytes()
    assert "°C".encode() in utf8 and "é".encode() in utf8
    assert D.read_refs(tmp_path / "u.json") == plain
    assert D.write_refs(plain, tmp_path / "a.json").read_bytes().isascii()
    # explicit compression overrides the suffix
    p = D.write_refs(refs, tmp_path / "noext", compression="zstd")
    assert p.read_bytes().startswith(MAGIC[".zst"])
    assert D.read_refs(p, compression="zstd") == refs
