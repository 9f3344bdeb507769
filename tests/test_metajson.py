"""refmount.view.metajson.dump_json is byte for byte json.dumps(indent=4, sort_keys, ensure_ascii=False),
the text every view and .zmetadata serves (and StreamedConsolidated re-emits piece by piece)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refmount.view.metajson import dump_json


def oracle(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, indent=4, sort_keys=True).encode("utf-8")


EDGE_FLOATS = [1e16, 1e-05, 1e-07, 0.0001, 1e15, 123456789012345680.0, 1e22, 5e-324, 1.7976931348623157e308,
               -0.0, 0.0, 0.1, 1.0, 100.0, 9.969209968386869e36, 2.5e-310, math.nan, math.inf, -math.inf]
EDGE_INTS = [0, -1, 2**31, 2**53 + 1, 2**63 - 1, -2**63, 2**64 - 1, 2**64, -2**63 - 1, 10**40, -10**40]
EDGE_STRINGS = ["", "a\"b\\c/d", "\x00\x01\x1f\x7f", "\b\f\n\r\t", "é ü ñ 中文 😀", "\u2028\u2029", "NaN", "1e-05",
                '": 1e-05,\n  ', "\\\"", "\ud7ff\ue000\uffff"]

scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(EDGE_FLOATS) | st.sampled_from(EDGE_INTS)
           | st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(EDGE_STRINGS))
keys = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8) | st.sampled_from(EDGE_STRINGS)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(keys, inner, max_size=6)
                      | st.lists(inner, max_size=4).map(tuple), max_leaves=40)


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(values)
def test_dump_json_is_json_dumps_indent_4(value):
    assert dump_json(value) == oracle(value)


@pytest.mark.parametrize("value", [
    {}, [], (), {"a": {}, "b": [], "c": [[]], "d": [{}]}, [[[[[]]]]], {"": ""},
    {"x": EDGE_FLOATS, "y": EDGE_INTS, "z": EDGE_STRINGS}, EDGE_FLOATS, EDGE_INTS, EDGE_STRINGS,
    {s: {s: [s, 1e-05, math.nan]} for s in EDGE_STRINGS},
    {"metadata": {f"v{n}/.zattrs": {"_FillValue": math.nan if n % 7 == 0 else 9.969209968386869e36, "scale": 1e-05,
                                    "units": "K", "long_name": f"n°{n}"} for n in range(50)},
     "zarr_consolidated_format": 1},
    [np.float64(1.5), np.float32(0.5).item(), True, False, None],  # (a float subclass: orjson refuses it)
    {"deep": [[[[[[[[[[[[[[[[[[[[1e-05]]]]]]]]]]]]]]]]]]]]},
    json.loads("[" * 270 + "1e-05" + "]" * 270),  # (deeper than orjson goes)
    {"b": 2, "a": 1, "é": 3, "z": 4, "A": 5, "\U0001F600": 6, "\uffff": 7},
])
def test_edge_values(value):
    assert dump_json(value) == oracle(value)


@pytest.mark.parametrize("value", [
    {1: "a", "b": 2},  # (sorting mixed keys fails in json)
    {"a": object()},
    {"a": "\ud800"},  # (a lone surrogate: not UTF-8)
    [{1, 2}],
])
def test_what_json_refuses_is_refused_the_same_way(value):
    with pytest.raises(Exception) as expected:
        oracle(value)
    with pytest.raises(type(expected.value)):
        dump_json(value)


def test_a_cycle_is_refused_as_json_refuses_it():
    value: dict = {"a": []}
    value["a"].append(value)
    with pytest.raises(ValueError):
        dump_json(value)


def test_non_str_keys_are_written_as_json_writes_them():
    value = {"1": {2: "x", 3: None}, "a": {True: 1}}
    assert dump_json(value) == oracle(value)


def test_containers_of_other_types_are_written_as_json_writes_them():
    from collections import OrderedDict

    class Listing(list):
        pass

    value = [OrderedDict([("b", 1), ("a", [1e-05])]), Listing([1, {"x": 2}]), OrderedDict()]
    assert dump_json(value) == oracle(value)
    assert dump_json(value[0]) == oracle(value[0]) and dump_json(value[1]) == oracle(value[1])


def test_strings_with_runs_of_spaces_keep_them():
    value = {"a  b": ["  ", "x    y", {"   ": " "}], "k": {"deep": {"deeper": ["  lead", "trail  "]}}}
    assert dump_json(value) == oracle(value)
    deep = {"a  ": json.loads("[" * 70 + '"  "' + "]" * 70)}  # (deeper than the indents made four in one pass)
    assert dump_json(deep) == oracle(deep)


def test_a_zmetadata_made_from_its_entries_texts_is_the_dump_of_the_whole():
    from refmount.view.consolidated import consolidated_text

    entries = {".zgroup": {"zarr_format": 2}, ".zattrs": {"title": "é\n", "n": math.nan, "e": 1e-05},
               "a/.zarray": {"chunks": [2], "compressor": None, "dtype": "<f8", "fill_value": "NaN", "filters": None,
                             "order": "C", "shape": [4], "zarr_format": 2},
               "a/.zattrs": {}, "b  c/.zattrs": {"k": [[], {}, "  "]}, "\u00e9/.zattrs": {"x": -math.inf}}
    value = {"metadata": entries, "zarr_consolidated_format": 1}
    assert consolidated_text(value) == oracle(value)
    assert consolidated_text(value, lambda entry: oracle(entry)) == oracle(value)
    for other in ({"metadata": {}, "zarr_consolidated_format": 1}, {"metadata": entries, "zarr_consolidated_format": True},
                  {"metadata": entries, "zarr_consolidated_format": 1, "x": 2}):
        assert consolidated_text(other) == oracle(other)
