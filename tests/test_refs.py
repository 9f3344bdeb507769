"""Reference-set loading without a mount: spec semantics, streaming, templates, gen, errors."""

from __future__ import annotations

import io
import itertools
import json
import os
import threading

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refmount.errors import RefsError
from refmount.refs import load_refs, refs_from_dict
from refmount.refs.model import MAX_LENGTH
from tests.support.datasets import SPEC_V0_EXPANSION, SPEC_V1_EXAMPLE, write_all_formats


def as_v0(refset) -> dict:
    """RefSet -> plain v0 dict with inline bytes decoded like the spec's examples."""
    out = {}
    for key, value in refset.to_dict().items():
        out[key] = value.decode() if isinstance(value, bytes) else value
    return out


@pytest.mark.parametrize("piece_bytes", [None, 1, 7, 64])
def test_spec_v1_example_expands_to_its_v0_equivalent(piece_bytes):
    assert as_v0(refs_from_dict(SPEC_V1_EXAMPLE, piece_bytes=piece_bytes)) == SPEC_V0_EXPANSION


def test_inline_values_are_exact_bytes():
    refs = refs_from_dict({
        "text": "température",
        "bin": "base64:" + "AAEC/w==",
        "obj": {"zarr_format": 2, "units": "°C"},
        "empty": ["file:///dev/null", 5, 0],
    })
    d = refs.to_dict()
    assert d["text"] == "température".encode()
    assert d["bin"] == b"\x00\x01\x02\xff"
    assert json.loads(d["obj"]) == {"zarr_format": 2, "units": "°C"}
    assert d["empty"] == ["file:///dev/null", 5, 0]


def test_whole_file_and_ranges_and_dirs():
    refs = refs_from_dict({"a/b/c": ["http://x/f"], "a/d": ["http://x/g", 10, 20], "e": "x"})
    assert refs.to_dict()["a/b/c"] == ["http://x/f"]
    assert sorted(refs.dirs.paths) == ["", "a", "a/b"]
    assert refs.find("a/d") >= 0 and refs.find("a/zz") == -1 and refs.find("a") == -1
    assert len(refs.urls) == 2


def test_urls_are_interned():
    refs = refs_from_dict({f"v/{i}": ["http://h/file.nc", i * 10, 10] for i in range(1000)})
    assert refs.urls == ["http://h/file.nc"]
    assert refs.url_id.dtype.itemsize == 4 and refs.offset.dtype.itemsize == 8


def test_gen_product_order_lists_and_ranges():
    spec = {"version": 1, "gen": [{
        "key": "k{{a}}.{{b}}", "url": "http://h/{{a}}", "offset": "{{a * 100 + b}}", "length": "{{b + 1}}",
        "dimensions": {"a": {"start": 1, "stop": 7, "step": 3}, "b": [5, 0, 2]}}]}
    got = refs_from_dict(spec).to_dict()
    expected = {f"k{a}.{b}": [f"http://h/{a}", a * 100 + b, b + 1]
                for a, b in itertools.product(range(1, 7, 3), [5, 0, 2])}
    assert list(got.items()) == list(expected.items())


def test_gen_without_offset_is_whole_files_and_jinja_fallback():
    spec = {"version": 1, "templates": {"up": "{{x|upper}}"}, "gen": [{
        "key": "{{ 'k%02d' % i }}", "url": "http://h/{{up(x='f')}}{{i}}", "dimensions": {"i": {"stop": 3}}}]}
    assert refs_from_dict(spec).to_dict() == {"k00": ["http://h/F0"], "k01": ["http://h/F1"], "k02": ["http://h/F2"]}


def test_gen_arithmetic_fast_path_matches_jinja():
    from jinja2.sandbox import SandboxedEnvironment

    expr = "(i + 3) * 7 // 2 - j % 5 + -i"
    spec = {"version": 1, "gen": [{"key": "k{{i}}_{{j}}", "url": "u", "offset": "{{%s}}" % expr.replace("-i", "0"),
                                   "length": "1", "dimensions": {"i": {"stop": 20}, "j": [0, 3, 99]}}]}
    got = refs_from_dict(spec).to_dict()
    template = SandboxedEnvironment().from_string("{{%s}}" % expr.replace("-i", "0"))
    for i, j in itertools.product(range(20), [0, 3, 99]):
        assert got[f"k{i}_{j}"][1] == int(template.render(i=i, j=j))


def test_gen_constant_expressions_render_as_jinja_does():
    # found by test_fuzz: "{{0}}" in a key made the fast path map over a number instead of a column
    spec = {"version": 1, "gen": [{"key": "g/{{i}}.{{0}}", "url": "u{{2 * 3}}", "offset": "{{7}}", "length": "{{i + 1}}",
                                   "dimensions": {"i": {"stop": 3}}}]}
    assert refs_from_dict(spec).to_dict() == {f"g/{i}.0": ["u6", 7, i + 1] for i in range(3)}


@pytest.mark.parametrize("gen,message", [
    ({"key": "k{{i}}", "url": "u", "offset": "1", "dimensions": {"i": {"stop": 2}}}, "together"),
    ({"key": "k{{i}}", "url": "u", "dimensions": {"i": {"stop": 10**9}, "j": {"stop": 10**9}}}, "--max-keys"),
    ({"key": "k{{i}}", "url": "u", "dimensions": {"i": {"start": 2}}}, "stop"),
    ({"key": "k{{i}}", "url": "u", "offset": "{{i - 5}}", "length": "1", "dimensions": {"i": [1, 2]}}, "out of range"),
    ({"key": "k{{i}}", "url": "u", "offset": "x{{i}}", "length": "1", "dimensions": {"i": [1]}}, "not an integer"),
    ({"url": "u", "dimensions": {"i": [1]}}, "missing 'key'"),
])
def test_gen_errors(gen, message):
    with pytest.raises(RefsError, match=message) as e:
        refs_from_dict({"version": 1, "gen": [gen]}, max_keys=10**6)
    assert "gen[0]" in str(e.value) and "\n" not in str(e.value)


def test_templates_are_sandboxed():
    for evil in ["{{ ''.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}", "{{ f.__globals__ }}"]:
        with pytest.raises(RefsError) as e:
            refs_from_dict({"version": 1, "templates": {"f": "{{x}}"}, "refs": {"k": [f"http://h/{evil}", 0, 1]}})
        assert "\n" not in str(e.value)


def test_recursive_and_failing_templates_are_one_line_errors():
    with pytest.raises(RefsError, match="recursive|failed"):
        refs_from_dict({"version": 1, "templates": {"f": "{{f(c=1)}}"}, "refs": {"k": ["http://{{f(c=2)}}", 0, 1]}})
    with pytest.raises(RefsError, match="failed"):
        refs_from_dict({"version": 1, "templates": {"f": "{{ 1 // c }}"}, "refs": {"k": ["http://{{f(c=0)}}", 0, 1]}})
    with pytest.raises(RefsError, match="undefined"):
        refs_from_dict({"version": 1, "refs": {"k": ["http://{{nope}}/x", 0, 1]}})


@pytest.mark.parametrize("refs,needle", [
    ({"a//b": "x"}, "'a//b'"),
    ({"/a": "x"}, "'/a'"),
    ({"a/../b": "x"}, "'a/../b'"),
    ({"a/./b": "x"}, "'a/./b'"),
    ({"a/": "x"}, "'a/'"),
    ({"": "x"}, "''"),
    ({"a\x00b": "x"}, "NUL"),
    ({"x" * 256: "x"}, "255"),
    ({"a": "x", "a/b": "y"}, "both a file and a directory"),
    ({"k": ["u", -1, 5]}, "offset"),
    ({"k": ["u", 0, MAX_LENGTH]}, "length"),
    ({"k": ["u", 1.5, 5]}, "offset"),
    ({"k": ["u", 0]}, "[url]"),
    ({"k": [None, 0, 5]}, "no url"),
    ({"k": 5}, "value must be"),
    ({"k": "base64:@@@"}, "base64"),
    ({"version": 2, "refs": {}}, "version"),
    ({"version": "1", "refs": {}}, "version"),
])
def test_malformed_sets_name_the_culprit(refs, needle):
    with pytest.raises(RefsError) as e:
        refs_from_dict(refs)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text", [b"", b"[1, 2]", b'{"a": "x"', b'{"a": ["u", 1, 2], "b": [', b'{"a": "x"} trailing'])
def test_broken_json_is_one_line(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    with pytest.raises(RefsError) as e:
        load_refs(str(path))
    assert "\n" not in str(e.value)


def test_duplicate_keys_keep_the_last_value():
    refs = refs_from_dict({"version": 1, "refs": {"k": ["u", 0, 1]},
                           "gen": [{"key": "k", "url": "v", "dimensions": {"i": [0]}}]})
    assert refs.to_dict() == {"k": ["v"]} and len(refs) == 1


def test_v0_key_named_refs_and_late_version():
    assert refs_from_dict({"refs": {"a": 1}, "b": "x"}, piece_bytes=3).to_dict() == \
        {"refs": b'{"a":1}', "b": b"x"}
    assert refs_from_dict({"refs": {"a": "x"}, "version": 1}, piece_bytes=3).to_dict() == {"a": b"x"}


def test_compressed_reference_files(tmp_path):
    refs = {"version": 1, "refs": {"a/b": "hello", "c": ["http://h/x", 1, 2]}}
    for kind, path in write_all_formats(refs, tmp_path).items():
        assert load_refs(str(path)).to_dict() == {"a/b": b"hello", "c": ["http://h/x", 1, 2]}, kind


def test_reference_file_over_http(http_data, datasets, tmp_path):
    from tests.support.datasets import write_refs

    root = next(iter(datasets.values())).parent
    write_refs({"k": "v", "r": ["http://h/x", 0, 3]}, root / "served-refs.json.gz")
    assert load_refs(http_data.url_for("served-refs.json.gz")).to_dict() == {"k": b"v", "r": ["http://h/x", 0, 3]}


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=6)
ref_values = st.one_of(
    st.text(max_size=12).filter(lambda s: not s.startswith("base64:")),
    st.dictionaries(st.text(max_size=4), json_values, max_size=3),
    st.tuples(st.sampled_from(["http://h/a", "s3://b/k", "/p/f", "u,\"x\"]"]),
              st.integers(0, 2**40), st.integers(0, 2**30)).map(list),
    st.sampled_from(["http://h/a", "/p/f"]).map(lambda u: [u]),
)
keys = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)), min_size=1, max_size=6) \
    .filter(lambda s: s not in (".", ".."))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(refs=st.dictionaries(keys, ref_values, max_size=25), piece=st.integers(1, 200), v1=st.booleans())
def test_streaming_parser_matches_a_whole_document_parse(refs, piece, v1):
    doc = {"version": 1, "refs": refs} if v1 else refs
    whole = refs_from_dict(doc, piece_bytes=10**9).to_dict()
    assert refs_from_dict(doc, piece_bytes=piece).to_dict() == whole
    expected = {}
    for k, v in refs.items():
        if isinstance(v, str):
            expected[k] = v.encode("utf-8", "surrogatepass")
        elif isinstance(v, dict):
            expected[k] = orjson.dumps(v)
        else:
            expected[k] = v
    assert whole == expected


@pytest.mark.parametrize("source", ["memory", "file", "pipe"])
def test_parallel_workers_match_serial(monkeypatch, tmp_path, source):
    """Big refs objects are converted by forked workers at speculative cuts; force that path on a
    small set whose strings contain cut look-alikes (`,"`) and check it against the serial parse.
    From a regular file the workers read their pieces themselves; not from a pipe (bash's <(...))."""
    from refmount.refs import RefSetBuilder
    from refmount.refs import jsonrefs
    from refmount.refs.jsonrefs import load_json

    refs = {f"a/{i}": [f'http://h/x",{i % 7}', i * 10, 10] for i in range(3000)}
    refs["d/big"] = {f"k{i}": {"x": i, "y": [i, {"z": i}]} for i in range(400)}  # cuts inside it are wrong
    refs.update({f"b/{i}": f'text ,"b/{i}": tricky' for i in range(500)})
    refs["c/meta"] = {"nested": {"k": [1, 2, {"x": '",'}]}}
    refs.update({f"r/{i}": [f"http://h/r{i // 50}", i * 1000, 7] for i in range(3000)})  # the range scanner's
    text = json.dumps({"version": 1, "refs": refs}).replace("/", "\\/").encode()  # as kerchunk writes it

    def opener(data: bytes):
        if source == "memory":
            return lambda: io.BytesIO(data)
        if source == "pipe":
            return lambda: open(f"/dev/fd/{pipe_with(data)}", "rb")
        path = tmp_path / f"refs-{len(data)}.json"
        path.write_bytes(data)
        return lambda: open(path, "rb")

    def load(parallel: bool):
        builder = RefSetBuilder(None)
        load_json(opener(text), builder, piece_bytes=2048, parallel=parallel)
        return builder.build().to_dict()

    def pipe_with(data: bytes) -> int:
        read_end, write_end = os.pipe()

        def write():
            with open(write_end, "wb") as f:
                f.write(data)

        threading.Thread(target=write, daemon=True).start()
        return read_end

    monkeypatch.setattr(jsonrefs, "PARALLEL_AFTER_BYTES", 0)
    monkeypatch.setattr(jsonrefs.Workers, "piece_bytes", 2048)
    assert load(True) == load(False)
    bad = orjson.dumps({"version": 1, "refs": {**refs, "a/../x": "y"}})
    with pytest.raises(RefsError, match="a/../x"):
        builder = RefSetBuilder(None)
        load_json(opener(bad), builder, piece_bytes=2048, parallel=True)


def test_batch_key_screen_never_misses_a_bad_key():
    """The vectorised screen of a batch of keys may flag good keys (they are then checked one by
    one) but must flag every batch that holds a bad one."""
    import random

    from refmount.refs.model import _has_bad_key, key_problem

    rng = random.Random(3)
    alphabet = ["a", "b", ".", "/", "é", "\x00", "x" * 130, "\udcff"]
    for _ in range(20000):
        keys = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(1, 4))]
        if any(key_problem(k) for k in keys):
            assert _has_bad_key("\x00".join(keys).encode("utf-8", "surrogatepass"), len(keys)), keys
    good = ["var/0.0.0", "a/b/c", ".zarray", "x/.zattrs", "..a/b..", "a./.b", "é" * 127]
    assert not _has_bad_key("\x00".join(good).encode(), len(good))


def test_empty_refs_object_is_a_key_in_v0_and_nothing_in_v1():
    """Without "version", "refs" is an ordinary v0 key (found by the property test above)."""
    assert refs_from_dict({"refs": {}}).to_dict() == {"refs": b"{}"}
    assert refs_from_dict({"refs": {}, "a": "x"}, piece_bytes=4).to_dict() == {"refs": b"{}", "a": b"x"}
    assert refs_from_dict({"version": 1, "refs": {}}).to_dict() == {}


def _members(text: bytes):
    """The (key, value) members of a refs-object piece, duplicates kept, by Python's own parser."""
    return json.loads(b"{" + text + b"}", object_pairs_hook=list)


def _scanned(ranges) -> list:
    keys = ranges.keys.decode().split("\x00")[:-1]
    return [(k, [ranges.urls[u], o, n]) for k, u, o, n in zip(keys, ranges.url_index.tolist(),
                                                              ranges.offsets.tolist(), ranges.lengths.tolist())]


@pytest.mark.parametrize("layout", ["kerchunk", "compact", "lines"])
def test_range_scanner_reads_uniform_layouts_exactly(layout):
    from refmount.refs.rangescan import scan_ranges

    refs = {f"v{i % 3}é/{i}.0": [f"https://h/d/file_{i // 7:05}.nc", i * 1000, 2**53 - 1 - i] for i in range(500)}
    refs["x/0"] = ["s3://b/other-length-url", 0, 0]
    if layout == "kerchunk":  # ujson's separators and "/" escaped as "\/" (NOTES §1)
        text = json.dumps(refs, ensure_ascii=False).replace("/", "\\/").encode()
    elif layout == "compact":
        text = orjson.dumps(refs)
    else:
        text = json.dumps(refs, indent=1, ensure_ascii=False).encode()
    piece = text.strip()[1:-1]
    assert _scanned(scan_ranges(piece)) == _members(piece)


@pytest.mark.parametrize("piece", [
    b"", b"  ", b'"a": ["u", 1, 2]\\', b'"a": ["u", 1, 2], "b": "inline"', b'"a": ["u", 1.0, 2]',
    b'"a": ["u", 01, 2]', b'"a": ["u", -1, 2]',
    b'"a": ["u", 1, 2, 3]', b'"a": ["u", 1]', b'"a": ["", 1, 2]', b'"a\\n": ["u", 1, 2]', b'"a": ["u\\"", 1, 2]',
    b'"a": ["u", 1, 2], "b": ["u",3, 4]', b'"a": ["u", 9007199254740992, 2]', b'"a": ["u", 1 2, 3]',
    b'"a": ["u", 1, ]2', b'"a\t": ["u", 1, 2]', b'"\\u00e9": ["u", 1, 2]', b'"\xff": ["u", 1, 2]', b'"a": ["u", 1, 2],',
])
def test_range_scanner_leaves_everything_else_to_orjson(piece):
    from refmount.refs.rangescan import scan_ranges

    assert scan_ranges(piece) is None


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_range_scanner_is_never_wrong(data):
    """Mutate a kerchunk-layout piece at random: the scanner either declines or reads exactly what
    a JSON parser reads."""
    from refmount.refs.rangescan import scan_ranges

    n = data.draw(st.integers(1, 6))
    refs = {f"k{i}/{i}.0": [f"http://h/f{i % 2}", i * 17, i + 3] for i in range(n)}
    text = bytearray(json.dumps(refs).replace("/", "\\/").encode()[1:-1])
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(text)))
        edit = data.draw(st.sampled_from(["insert", "replace", "delete"]))
        byte = data.draw(st.sampled_from(b' ,:[]"\\/019-.e\t\n\x00x\xc3\xa9\xff'))
        if edit == "insert":
            text[at:at] = bytes([byte])
        elif at < len(text):
            text[at:at + 1] = b"" if edit == "delete" else bytes([byte])
    text = bytes(text)
    ranges = scan_ranges(text)
    if ranges is not None:
        assert _scanned(ranges) == _members(text)


def test_batch_key_hashes_equal_single_key_hashes(monkeypatch):
    """Lookups hash one key in Python; loading hashes whole batches with numpy, in runs of keys."""
    import random

    import numpy as np

    from refmount.refs import model

    monkeypatch.setattr(model, "_HASH_RUN_BYTES", 50)  # many runs, and keys longer than a run
    rng = random.Random(1)
    keys = [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 80))) for _ in range(2000)]
    hashes = model.key_hashes(b"".join(keys), np.array([len(k) for k in keys]))
    assert hashes.tolist() == [model.key_hash(k) for k in keys]
    assert len(set(hashes.tolist())) == len(set(keys))


# -- trailing commas (GDAL accepts them; its own json_ref_v1_min has one) ----------------------------

@pytest.mark.parametrize("text, expected", [
    ('{"a": "x",}', {"a": b"x"}),
    ('{"version": 1, "refs": {"a": "x"},}', {"a": b"x"}),
    ('{"version": 1, "refs": {"a": "x",},}', {"a": b"x"}),
    ('{"refs": {"a": "x"}, "version": 1,}', {"a": b"x"}),
    ('{"version": 1, "refs": {"a": ["/u", 0, 1,]}}', {"a": ["/u", 0, 1]}),
    ('{"a": {"b": [1, 2,],},}', {"a": b'{"b":[1,2]}'}),
    ('{"a": "text ,} inside a string",}', {"a": b"text ,} inside a string"}),
    ('{"a": "escaped quote \\\\",}', {"a": b"escaped quote \\"}),
])
def test_trailing_commas_are_accepted_with_a_warning(tmp_path, caplog, text, expected):
    path = tmp_path / "refs.json"
    path.write_text(text)
    assert load_refs(str(path)).to_dict() == expected
    assert "trailing comma" in caplog.text and "accepted, as GDAL accepts them" in caplog.text


@pytest.mark.parametrize("text", ['{"a": "x",,}', '{,}', '{"a": [1,,]}', '{"a": "x" "b": "y",}'])
def test_other_broken_json_still_fails_in_one_line(tmp_path, text):
    path = tmp_path / "refs.json"
    path.write_text(text)
    with pytest.raises(RefsError, match="not valid JSON"):
        load_refs(str(path))


def test_trailing_comma_from_a_pipe_says_why_it_is_refused(tmp_path):
    from tests.conftest import run_refmount

    result = run_refmount("mount", "--dry-run", "-", str(tmp_path), input='{"a": "x",}')
    assert result.returncode != 0
    assert result.stderr.strip() == ("refmount: reference file is not valid JSON near byte 9: trailing comma is not "
                                     "allowed (accepted as GDAL accepts it only from a file, which can be read twice, "
                                     "not from a pipe)")
