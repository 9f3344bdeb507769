"""Fuzzing the loaders: mutated reference sets only ever produce the loader's own error, quickly."""

from __future__ import annotations

import io
import time

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refmount.errors import RefmountError
from refmount.refs import RefSetBuilder
from refmount.refs.jsonrefs import load_json

SEED = orjson.dumps({
    "version": 1,
    "templates": {"u": "http://h/data", "f": "{{c}}.nc"},
    "gen": [{"key": "g/{{i}}.{{j}}", "url": "{{u}}/{{f(c=i)}}", "offset": "{{i * 100 + j}}", "length": "10",
             "dimensions": {"i": {"stop": 3}, "j": [0, 2]}}],
    "refs": {".zgroup": '{"zarr_format":2}', "a/.zarray": {"shape": [4], "chunks": [2], "dtype": "<f4"},
             "a/0": ["http://h/x.nc", 10, 20], "a/1": ["{{u}}/y.nc"], "b": "base64:AAEC", "c/d/e": "text"},
})
TIME_BOUND = 2.0


def load_bytes(text: bytes, piece_bytes: int) -> None:
    builder = RefSetBuilder(max_keys=100_000)
    load_json(lambda: io.BytesIO(text), builder, piece_bytes=piece_bytes)
    builder.build()


def assert_only_own_errors(text: bytes, piece_bytes: int = 16) -> None:
    started = time.monotonic()
    try:
        load_bytes(text, piece_bytes)
    except RefmountError as e:
        assert "\n" not in str(e)
    assert time.monotonic() - started < TIME_BOUND


mutation = st.tuples(st.sampled_from(["replace", "insert", "delete", "truncate"]),
                     st.integers(0, len(SEED)), st.binary(min_size=1, max_size=4))


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutations=st.lists(mutation, min_size=1, max_size=4), piece=st.integers(1, 64))
def test_byte_mutations(mutations, piece):
    text = bytearray(SEED)
    for kind, pos, data in mutations:
        pos = min(pos, len(text))
        if kind == "replace":
            text[pos:pos + len(data)] = data
        elif kind == "insert":
            text[pos:pos] = data
        elif kind == "delete":
            del text[pos:pos + len(data)]
        else:
            del text[pos:]
    assert_only_own_errors(bytes(text), piece)


json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | \
    st.text(max_size=8) | st.sampled_from(["{{", "{{ x }}", "{{ ''.__class__ }}", "base64:!!", "a/../b", "/x"])
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))
@given(section=st.sampled_from(["version", "templates", "gen", "refs"]), path=st.lists(st.integers(0, 5), max_size=3),
       value=json_values)
def test_structural_mutations(section, path, value):
    doc = orjson.loads(SEED)
    target = doc
    key = section
    for step in path:  # walk into the document and replace something there
        current = target[key]
        if isinstance(current, dict) and current:
            target, key = current, list(current)[step % len(current)]
        elif isinstance(current, list) and current:
            target, key = current, step % len(current)
        else:
            break
    target[key] = value
    try:
        text = orjson.dumps(doc)
    except TypeError:  # integers beyond 64 bits: write them as JSON text ourselves
        import json

        text = json.dumps(doc).encode()
    assert_only_own_errors(text)
