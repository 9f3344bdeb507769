"""How attributes are typed for netCDF-C (refmount.view.ncattrs), without a mount; the hints each
netCDF-C version needs were measured with Debian's ncdump 4.9.0 and libnetcdf 4.10.1."""

import numpy as np

from refmount.view.ncattrs import HINT_49, HINT_410, served_attributes


def types(attrs, key):
    return attrs.get(key, {}).get("types", {})


def test_fill_value_gets_the_array_type():
    attrs, _ = served_attributes({}, np.dtype("<f4"), 1e20)
    assert attrs["_FillValue"] == float(np.float32(1e20))
    assert types(attrs, HINT_49) == {"_FillValue": "<f4"} and HINT_410 not in attrs  # 4.10 converts it


def test_existing_fill_value_is_kept():
    attrs, _ = served_attributes({"_FillValue": -1}, np.dtype("<i2"), 7)
    assert attrs["_FillValue"] == -1


def test_lists_typed_by_first_element_get_hints_in_both_versions():
    attrs, _ = served_attributes({"ll": [-23232244, 1214124123423]}, None, None)
    assert types(attrs, HINT_49)["ll"] == "<i8" and types(attrs, HINT_410)["ll"] == "<i8"


def test_mixed_int_float_list_is_all_floats():
    attrs, _ = served_attributes({"m": [1, 2.5]}, None, None)
    assert attrs["m"] == [1.0, 2.5] and all(isinstance(v, float) for v in attrs["m"])


def test_float32_recognised_and_packing_kept_in_one_type():
    attrs, _ = served_attributes({"scale_factor": 0.0010000000474974513, "add_offset": 10.0,
                                  "g": [-9.9999996169031625e+35, 0.0]}, np.dtype("<i2"), -9999)
    assert types(attrs, HINT_410) == {"scale_factor": "<f4", "add_offset": "<f4", "g": "<f4"}


def test_cf_attributes_take_the_variable_type():
    attrs, _ = served_attributes({"valid_range": [-5000, 5000], "missing_value": 1e20}, np.dtype("<i2"), None)
    assert types(attrs, HINT_410)["valid_range"] == "<i2"
    assert "missing_value" not in types(attrs, HINT_410) or types(attrs, HINT_410)["missing_value"] != "<i2"


def test_attributes_4_9_cannot_read_are_left_out_with_a_note():
    attrs, notes = served_attributes({"a": ["x", "y"], "b": [], "c": None, "_ARRAY_DIMENSIONS": ["x"]}, None, None)
    assert set(attrs) == {"_ARRAY_DIMENSIONS"} and len(notes) == 3


def test_lists_of_objects_lists_or_nulls_are_left_out_objects_and_booleans_kept():
    """What Debian's ncdump 4.9.0 fails the whole open on (measured): a list holding an object (OME's
    "multiscales", which kerchunk's TIFF reader writes), a list or null. An object alone is read as
    its JSON text, and booleans as ubytes."""
    multiscales = [{"datasets": [{"path": "0"}, {"path": "1"}], "version": "0.1"}]
    attrs, notes = served_attributes({"multiscales": multiscales, "nested": [[1, 2]], "holes": [1, None],
                                      "object": {"a": [1]}, "flags": [True, False]}, None, None)
    assert set(attrs) == {"object", "flags"}
    assert len(notes) == 3 and all("a list of objects, lists or nulls" in n for n in notes)


def test_text_is_served_as_the_set_holds_it():
    # kerchunk writes "" as " ", but a real " " exists too (netCDF-C's own ref_nulls.cdl): no guessing
    attrs, _ = served_attributes({"space": " ", "text": "héllo", "empty": ""}, None, None)
    assert attrs == {"space": " ", "text": "héllo", "empty": ""}
