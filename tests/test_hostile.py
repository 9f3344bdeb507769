"""Hostile reference sets: template, gen and compressed bombs, deep nesting, absurd numbers.

Every case goes through the real `refmount mount`, in the background (which forks a daemon) and in
the foreground, under a wrapper process that is the subreaper of everything refmount starts, so
that it can tell the peak RSS of the biggest of them and whether any outlived the command. Every
case must end within its limit with exit status != 0, exactly one stderr line naming the culprit,
nothing mounted and no process left.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from refmount.errors import RefsError
from refmount.refs import load_refs, refs_from_dict
from refmount.refs.limits import format_size
from tests.conftest import REFMOUNT, force_unmount, is_mounted

PEAK_RSS_MB = 256  # any hostile case, with --max-refs-size 64M (measured: 40-60 MB, 120 MB for the 64 MB bombs)
LIMIT_ARGS = ["--max-refs-size", "64M"]

# Runs the command as a child, adopts whatever it leaves behind (PR_SET_CHILD_SUBREAPER), waits for
# all of it for a few seconds, kills (by PID) and reports what is left, and prints the peak RSS.
_WRAPPER = r"""
import ctypes, json, os, resource, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
limit = float(sys.argv[1])
start = time.monotonic()
cli = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
try:
    rc = cli.wait(timeout=limit)
except subprocess.TimeoutExpired:
    cli.kill()
    rc = cli.wait()
seconds = time.monotonic() - start


def children():
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
                    found.append(int(entry))
        except (OSError, IndexError):
            pass
    return found


deadline = time.monotonic() + 5
while True:
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
    except ChildProcessError:
        break
left = children()
for _ in range(20):  # adopted grandchildren appear as their parents die
    pids = children()
    if not pids:
        break
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024
print(json.dumps({"rc": rc, "seconds": seconds, "left": left, "maxrss_mb": maxrss}))
"""


# -- the corpus ---------------------------------------------------------------------------------

def _v1_url(template: str) -> dict:
    return {"version": 1, "refs": {".zgroup": '{"zarr_format": 2}', "a": [template, 0, 1]}}


def _gen(**fields) -> dict:
    gen = {"key": "k/{{i}}", "url": "http://h/{{i}}", "dimensions": {"i": {"stop": 10}}}
    gen.update(fields)
    return {"version": 1, "gen": [gen]}


def _gzip_bomb(path, head: bytes, fill: bytes, tail: bytes, gigabytes: float = 1.0):
    """`head`, then `fill` repeated to about 1 GB, then `tail`, in about 1 MB of gzip members."""
    member = gzip.compress(fill * ((1 << 20) // len(fill)), 9)
    with open(path, "wb") as f:
        f.write(gzip.compress(head))
        for _ in range(int(1024 * gigabytes)):
            f.write(member)
        f.write(gzip.compress(tail))


def _zstd_bomb(path, head: bytes, fill: bytes, tail: bytes):
    import zstandard

    z = zstandard.ZstdCompressor(level=19)
    member = z.compress(fill * (1 << 20))
    with open(path, "wb") as f:
        f.write(z.compress(head))
        for _ in range(1024):
            f.write(member)
        f.write(z.compress(tail))


SLOW_LOOP = "{% for a in range(100000) %}{% for b in range(20) %}{% endfor %}{% endfor %}"

# name: (content or writer, extra args, words the one line must hold, time limit in seconds)
CASES = {
    "pow": (_v1_url("{{ 9**(9**9) }}"), [], ["9**(9**9)", "4096 bits"], 15),
    "lipsum": (_v1_url("{{ lipsum(n=10**6) }}"), [], ["lipsum", "undefined"], 15),
    "str-times": (_v1_url("{{ 'a' * 10**9 }}"), [], ["'a' * 10**9", "1,048,576 characters"], 15),
    "range-list": (_v1_url("{{ range(10**9)|list }}"), [], ["range(10**9)", "Range too big"], 15),
    "nested-times": (_v1_url("{{ ('a' * 1000) * 1000 * 1000 }}"), [], ["1,048,576 characters"], 15),
    "huge-join": (_v1_url("{{ range(100000)|join('x' * 100000) }}"), [], ["join", "1,048,576"], 15),
    "doubling": (_v1_url("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}{{ ns.s }}"), [], ["1,048,576 characters"], 15),
    "shared-list": (_v1_url("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}"
                            "{% endfor %}{{ ns.l }}"), [], ["1,048,576 characters"], 15),
    "join-shared": (_v1_url("{% set s = 'a' * 1000000 %}{{ ([s] * 100000)|join }}"), [], ["join", "1,048,576 characters"], 15),
    "format-widths": (_v1_url("{{ ('%999999s' * 1000) % ((1,) * 1000) }}"), [], ["formatted string"], 15),
    "format-args": (_v1_url("{% set s = 'a' * 1000000 %}{{ '%s%s' % (s, s) }}"), [], ["1,048,576 characters"], 15),
    "indent": (_v1_url("{{ ('\\n' * 100000)|indent(1000000) }}"), [], ["'indent'"], 15),
    "expandtabs": (_v1_url("{{ ('\\t' * 100000).expandtabs(1000000) }}"), [], ["expandtabs"], 15),
    "spin": (_v1_url("{{ 1 }}{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"), [],
             ["url", "takes more than 2 s"], 30),
    "load-timeout": (_gen(url="{{ i }}" + SLOW_LOOP, dimensions={"i": {"stop": 1000}}), ["--load-timeout", "2"],
                     ["--load-timeout (2 s)"], 15),
    "gzip-string": (lambda p: _gzip_bomb(p, b'{"k": "', b"a", b'"}'), [], ["--max-refs-size 64M", "decompressed"], 20),
    "gzip-spaces": (lambda p: _gzip_bomb(p, b"{", b" ", b'"k": "v"}'), [], ["--max-refs-size 64M"], 20),
    "zstd-string": (lambda p: _zstd_bomb(p, b'{"k": "', b"a", b'"}'), [], ["--max-refs-size 64M"], 20),
    # one JSON string of 1 GiB within the reference text's limit (issue 25: 3,113 MiB and "not valid JSON")
    "gzip-one-value": (lambda p: _gzip_bomb(p, b'{"version": 1, "refs": {"ok": "x", "k": "', b"a", b'"}}'),
                       ["--max-refs-size", "8G"], ["--max-value-size 64M", "key 'k'"], 20),
    "gen-keys": (_gen(dimensions={"i": {"stop": 10**12}}), [], ["gen[0]", "--max-keys"], 15),
    "gen-dims": (_gen(dimensions={"i": {"stop": 10**6}, "j": {"stop": 10**6}, "k": {"stop": 10**6}}), [],
                 ["gen[0]", "--max-keys"], 15),
    "gen-64bit": (_gen(dimensions={"i": {"start": 2**64 - 3, "stop": 2**64 - 1}}), [], ["gen[0]", "64 bits"], 15),
    "gen-url-bytes": ({"version": 1, "templates": {"u": "a" * 100_000},
                       "gen": [{"key": "k/{{i}}", "url": "http://h/{{u}}/{{i}}", "dimensions": {"i": {"stop": 100_000}}}]},
                      [], ["gen[0]", "--max-refs-size 64M"], 15),
    "gen-url-bytes-jinja": (_gen(url="{{ 'a' * 100000 }}{{ i }}", dimensions={"i": {"stop": 100_000}}), [],
                            ["gen[0]", "--max-refs-size 64M"], 15),
    "deep-json": ('{"version": 1, "refs": {"ok": "x", "deep/key": ' + "[" * 5000 + "]" * 5000 + "}}", [],
                  ["'deep/key'", "1024 levels"], 15),
    "deep-inline": ('{"a": "x", "deep": ' + '{"x": ' * 300 + "1" + "}" * 300 + "}", [], ["'deep'", "Recursion"], 15),
    "long-key": (json.dumps({"/".join(["d"] * 3000): "x"}), [], ["cannot be a path", "longer than 4096 bytes"], 15),
    "deep-dirs": (json.dumps({f"k{i}/" + "/".join(["a"] * 2000): "x" for i in range(100)}), [],
                  ["directory paths", "--max-refs-size 64M", "'k"], 15),
    "big-offset": ('{"k": ["http://h/x", 18446744073709551615, 1]}', [], ["'k'", "offset", "2**53"], 15),
    "negative-length": ('{"k": ["http://h/x", 0, -5]}', [], ["'k'", "length", "2**53"], 15),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    paths = {}
    for name, (content, _, _, _) in CASES.items():
        path = root / (name + (".json.gz" if name.startswith("gzip") else ".json.zst" if name.startswith("zstd")
                               else ".json"))
        if callable(content):
            content(path)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        paths[name] = path
    return paths


def run_wrapped(args, limit):
    """Run `refmount mount ...` under the subreaper wrapper: (report dict, stderr lines)."""
    result = subprocess.run([sys.executable, "-c", _WRAPPER, str(limit), *REFMOUNT, *args], capture_output=True,
                            text=True, timeout=limit + 30)
    return json.loads(result.stdout), result.stderr.strip().splitlines()


@pytest.fixture(scope="module")
def outcomes(corpus, tmp_path_factory):
    """Every case in both modes, three at a time (each has its own mountpoint): {(name, mode): (report,
    lines, mountpoint)}. The limits are generous enough for the sharing."""
    root = tmp_path_factory.mktemp("mnt")

    def run(job):
        name, mode = job
        _, extra, _, limit = CASES[name]
        mnt = root / f"{name}-{mode}"
        mnt.mkdir()
        args = ["mount", *LIMIT_ARGS, *extra, *(["--foreground"] if mode == "foreground" else []),
                str(corpus[name]), str(mnt)]
        try:
            return job, (*run_wrapped(args, limit), mnt)
        finally:
            if is_mounted(mnt):
                force_unmount(mnt)

    jobs = [(name, mode) for name in CASES for mode in MODES]
    with ThreadPoolExecutor(3) as pool:
        results = dict(pool.map(run, jobs))
    yield results
    for *_, mnt in results.values():
        force_unmount(mnt)


MODES = ("background", "foreground")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_hostile_reference_set(outcomes, name, mode):
    _, _, words, limit = CASES[name]
    report, lines, mnt = outcomes[name, mode]
    assert report["rc"] != 0
    assert len(lines) == 1, lines
    assert lines[0].startswith("refmount: ") and "Traceback" not in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    assert report["seconds"] < limit, (report, lines)
    assert not report["left"], f"processes left behind: {report['left']}"
    assert report["maxrss_mb"] < PEAK_RSS_MB, report
    assert not is_mounted(mnt)


# -- the same limits below the CLI ----------------------------------------------------------------

def test_load_timeout_stops_parallel_workers(tmp_path):
    """A deadline that fires while forked workers convert pieces leaves none of them running."""
    path = tmp_path / "big.json"
    with open(path, "w") as f:
        f.write("{")
        f.write(",".join(f'"a/{i}.0": ["http://h/file{i % 7}", {i * 100}, 100]' for i in range(700_000)))
        f.write("}")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    for timeout in ("0.3", "0.6"):
        report, lines = run_wrapped(["mount", "--load-timeout", timeout, str(path), str(mnt)], 20)
        if report["rc"] == 0:  # loaded within the time on a fast machine: nothing to check
            subprocess.run([*REFMOUNT, "umount", str(mnt)], capture_output=True)
            continue
        assert lines == [f"refmount: loading the reference set took longer than --load-timeout ({timeout} s)"]
        assert not report["left"], f"processes left behind: {report['left']}"
    assert not is_mounted(mnt)


def test_keys_thousands_of_segments_deep_load(tmp_path):
    key = "/".join(["d"] * 2000) + "/f"  # 4,001 bytes: up to PATH_MAX
    refset = refs_from_dict({key: "x", "top": "y", "d/x": "z"})
    assert refset.find(key) >= 0 and refset.find("d/x") >= 0 and len(refset.dirs) == 2001
    with pytest.raises(RefsError, match="is both a file and a directory prefix"):
        refs_from_dict({key: "x", key.rpartition("/")[0]: "y"})


def test_a_key_990_segments_deep_mounts_and_reads(mount):
    """(Was a RecursionError that failed the mount.) Past PATH_MAX, so walked one directory at a time."""
    m = mount({"/".join(["d"] * 990) + "/f": "deep", "top": "y"}, "--view", "raw")
    fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(990):
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        leaf = os.open("f", os.O_RDONLY, dir_fd=fd)
        try:
            assert os.read(leaf, 100) == b"deep"
        finally:
            os.close(leaf)
    finally:
        os.close(fd)


def test_whitespace_and_long_strings_are_read_in_linear_time(tmp_path):
    """128 MB of spaces before the first member, and a 32 MB string: each read once, not once per
    1 MB read (before: 6 s of CPU for the spaces, minutes per GB)."""
    path = tmp_path / "spaces.json"
    path.write_bytes(b"{" + b" " * (128 << 20) + b'"a": "x", "b": "' + b"y" * (32 << 20) + b'"}')
    start = time.process_time()
    assert len(load_refs(str(path))) == 2
    assert time.process_time() - start < 2.5


def test_gen_within_the_limits_still_loads():
    refset = refs_from_dict({"version": 1, "templates": {"u": "http://h/data"},
                             "gen": [{"key": "k/{{i}}", "url": "{{u}}/{{ '%03d' % i }}-{{ 'x' ~ i }}",
                                      "offset": "{{ i * 10 }}", "length": "10", "dimensions": {"i": {"stop": 50}}}]},
                            max_refs_size=1 << 20)
    assert refset.ref(refset.find("k/7")).url == "http://h/data/007-x7"


def test_gen_text_cap_counts_keys_and_urls():
    gen = {"version": 1, "gen": [{"key": "k/{{i}}", "url": "http://h/{{i}}", "dimensions": {"i": {"stop": 1000}}}]}
    refs_from_dict(gen, max_refs_size=20_000)
    with pytest.raises(RefsError, match=r"gen\[0\] would make [\d,]+ bytes of keys and urls, more than "
                                        r"--max-refs-size 10K"):
        refs_from_dict(gen, max_refs_size=10 << 10)


def test_default_limits_fit_the_machine():
    from refmount.refs import limits

    available = limits.available_memory()
    assert limits.default_max_keys() * limits.BYTES_PER_KEY <= available // 2 + limits.BYTES_PER_KEY * 10**6
    assert limits.default_max_refs_size() * limits.WORST_BYTES_PER_REFS_BYTE <= available // 2 + (1 << 30)
    assert format_size(2 << 30) == "2G" and format_size(1536 << 20) == "1.5G" and format_size(100) == "100"


def test_render_timer_and_deadline_do_not_outlive_the_load(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(_v1_url("http://h/{{ 'x' }}")))
    handlers = signal.getsignal(signal.SIGALRM), signal.getsignal(signal.SIGPROF)
    load_refs(str(path), load_timeout=0.5)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0)
    assert (signal.getsignal(signal.SIGALRM), signal.getsignal(signal.SIGPROF)) == handlers
    time.sleep(0.6)  # a timer left armed would fire here



@pytest.mark.parametrize("offsets", [[2**53, 0], [2**63 - 1, 0], [-1, 0], "uint64"], ids=["2**53", "2**63", "negative", "uint64"])
def test_parquet_offsets_out_of_range_are_one_line(tmp_path, offsets):
    """Record files load lazily: a bad one fails its reads with RefsError (EIO, one log line), not
    pyarrow's ArrowInvalid from a float cast."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import trio

    root = tmp_path / "bad.parq"
    (root / "a").mkdir(parents=True)
    (root / ".zmetadata").write_text(json.dumps({"record_size": 2, "metadata": {
        "a/.zarray": {"shape": [2], "chunks": [1], "dtype": "<f4", "compressor": None, "filters": None,
                      "fill_value": None, "order": "C", "zarr_format": 2}}}))
    column = pa.array([2**64 - 1, 0], pa.uint64()) if offsets == "uint64" else pa.array(offsets, pa.int64())
    pq.write_table(pa.table({"path": ["http://h/x"] * 2, "offset": column, "size": [4, 4]}), root / "a" / "refs.0.parq")
    refset = load_refs(str(root))

    async def read_target():
        i = await refset.afind("a/0")
        await refset.ensure(i)
        return refset.target(i)

    with pytest.raises(RefsError, match=r"refs\.0\.parq.*column 'offset' holds values that are not byte offsets"):
        trio.run(read_target)


@pytest.mark.parametrize("template, expected", [
    ("{{ '%03d' % 7 }}/2020010100", "007/2020010100"),  # long digit runs outside format specs are fine
    ("{{ '{0}-{1:05d}'.format('a', 3) }}", "a-00003"),
    ("{{ 'x%%1234567' % () }}", "x%1234567"),
    ("{{ ('ab' * 3)|upper }}{{ [1, 2]|join('-') }}", "ABABAB1-2"),
])
def test_ordinary_templates_still_render(template, expected):
    refset = refs_from_dict(_v1_url(template))
    assert refset.ref(refset.find("a")).url == expected


def test_memory_net_under_the_load(tmp_path):
    """Whatever no check foresaw still cannot take the machine: past the load's budget an allocation
    fails at once, and the limit is given back afterwards."""
    import resource

    from refmount.refs.limits import memory_limit

    before = resource.getrlimit(resource.RLIMIT_DATA)
    with memory_limit(64 << 20):
        with pytest.raises(MemoryError):
            bytearray(1 << 30)
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    assert len(bytearray(256 << 20)) == 256 << 20


def test_one_value_limit_counts_each_member(tmp_path):
    """--max-value-size refuses the first member whose text is bigger than it, naming its key (a
    string with nowhere to cut, a nested object full of false cuts); members within it load, however
    many, nested or not."""
    mib = 1 << 20

    def load(name, value, limit=4 * mib):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(value))
        return load_refs(str(path), max_value_size=limit)

    nested = {f"a{j}": "x" * 20 for j in range(100_000)}  # 3 MiB, a place to cut every 30 bytes
    assert len(load("nested-ok", {f"k{i}": nested for i in range(6)})) == 6
    assert len(load("string-ok", {"a": "x" * (3 * mib), "b": "y"})) == 2
    assert len(load("many-small", {f"k/{i}": ["http://h/x", i, 10] for i in range(100_000)}, limit=mib)) == 100_000
    for name, value, key in [
        ("string", {"a": "x", "b": "x" * (9 * mib), "c": "y"}, "b"),
        ("string-last", {"version": 1, "refs": {"a": "x", "b": "x" * (9 * mib)}}, "b"),
        ("nested", {"small": "x", "big": {f"a{j}": "x" * 20 for j in range(400_000)}}, "big"),
    ]:
        with pytest.raises(RefsError) as e:
            load(name, value)
        assert f"(key '{key}') larger than --max-value-size 4M" in str(e.value)
