"""s3:// targets on refmount's HTTP engine (refmount/fetch/s3.py): obstore presigns, the HTTP backend
fetches. Against moto's S3 server (the real API: keys, ETags, errors) and against the loopback Range
server standing in for an S3 endpoint (path-style /bucket/key; its lies, redirects and the query
strings it was sent), without FUSE. The mount through moto is in test_ops.py."""

from __future__ import annotations

import http.server
import random
import threading
from urllib.parse import parse_qs, unquote

import pytest
import trio

from refmount.errors import FetchError, RemoteChanged
from refmount.fetch import Fetcher, RetryPolicy
from refmount.fetch.s3 import engine_config
from tests.support.moto import moto_server

KEY, SECRET, TOKEN = "AKIATESTTESTTEST0000", "test/secret/0000", "session-token-0000"
AWKWARD_KEYS = ["plain.bin", "with space/a b.bin", "unicodé/ß€.bin", "pct%20literal.bin", "plus+sign.bin",
                "q?mark.bin", "tilde~&=.bin"]


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


def with_fetcher(options: dict, body, client: str = "stdlib", **policy):
    async def main():
        fetcher = Fetcher(policy=RetryPolicy(**policy), remote_options=options, http_client=client)
        try:
            return await body(fetcher)
        finally:
            await fetcher.aclose()

    return trio.run(main)


async def joined(fetcher, url: str, start: int, end: int, piece: int = 0) -> bytes:
    return b"".join(map(bytes, await fetcher.read(url, start, end, piece)))


def on_the_engine(fetcher, url: str) -> bool:
    return getattr(fetcher._backend(url), "signer", None) is not None


@pytest.mark.parametrize("client", ["stdlib", "aiohttp"])
def test_objects_with_awkward_keys_read_right_through_the_engine(moto, client):
    """Spaces, non-ASCII, a literal %20, +, ?, ~, & and = in keys: signed and sent as S3 expects, on
    both clients; ranges split into pieces, sizes from HEAD."""
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=moto)
    fs.mkdir(f"awkward-{client}")
    blobs = {key: random.Random(key).randbytes(300_000 + len(key)) for key in AWKWARD_KEYS}
    for key, data in blobs.items():
        fs.pipe(f"awkward-{client}/{key}", data)
    options = {"key": KEY, "secret": SECRET, "endpoint_url": moto}

    async def body(fetcher):
        for key, data in blobs.items():
            url = f"s3://awkward-{client}/{key}"
            assert on_the_engine(fetcher, url)
            assert await fetcher.size(url) == len(data)
            pieces = await fetcher.read(url, 1000, len(data) + 50, 65536)
            assert b"".join(map(bytes, pieces)) == data[1000:]
            assert all(len(p) <= 65536 for p in pieces)
            assert await joined(fetcher, f"s3a://awkward-{client}/{key}", 5, 70) == data[5:70]

    with_fetcher(options, body, client)


def test_a_missing_object_or_bucket_fails_in_one_line_naming_the_url(moto):
    import s3fs

    s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=moto).mkdir("present")
    options = {"key": KEY, "secret": SECRET, "endpoint_url": moto}

    async def body(fetcher):
        for url in ("s3://present/nope.bin", "s3://absent-bucket/x.bin"):
            with pytest.raises(FetchError) as caught:
                await fetcher.read(url, 0, 100)
            message = str(caught.value)
            assert url in message and "\n" not in message and "404" in message

    with_fetcher(options, body, read_timeout=5)


def test_a_replaced_object_is_refused_not_mixed(moto):
    """The ETag of every answer is compared with the first one seen: an object replaced while mounted
    (same size) fails the read instead of mixing two versions' bytes."""
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=moto)
    fs.mkdir("changing")
    fs.pipe("changing/obj.bin", b"a" * 200_000)
    options = {"key": KEY, "secret": SECRET, "endpoint_url": moto}

    async def body(fetcher):
        assert await joined(fetcher, "s3://changing/obj.bin", 0, 1000) == b"a" * 1000
        await trio.to_thread.run_sync(fs.pipe, "changing/obj.bin", b"b" * 200_000)
        with pytest.raises(RemoteChanged, match="changed while mounted"):
            await fetcher.read("s3://changing/obj.bin", 1000, 2000)

    with_fetcher(options, body)


# -- the Range server as an S3 endpoint (path-style /bucket/key) ---------------------------------------

@pytest.fixture
def bucket(server):
    data = random.Random(11).randbytes(3 << 20)
    (server.root / "bkt").mkdir()
    (server.root / "bkt" / "obj.bin").write_bytes(data)
    return data


def endpoint_options(server, **extra) -> dict:
    return {"key": KEY, "secret": SECRET, "endpoint_url": server.url.rstrip("/"), **extra}


def signed_with(server) -> list[dict]:
    """The presigned query of every request the server got, parsed."""
    return [{k: v[0] for k, v in parse_qs(q).items()} for q in server.stats["queries"]]


def test_requests_are_presigned_and_carry_no_authorization_header(server, bucket):
    async def body(fetcher):
        assert await joined(fetcher, "s3://bkt/obj.bin", 0, 1 << 20) == bucket[: 1 << 20]
        assert await fetcher.size("s3://bkt/obj.bin") == len(bucket)

    with_fetcher(endpoint_options(server, token=TOKEN), body)
    for query, headers in zip(signed_with(server), server.stats["headers"]):
        assert query["X-Amz-Credential"].startswith(KEY + "/") and query["X-Amz-Security-Token"] == TOKEN
        assert query["X-Amz-SignedHeaders"] == "host"
        assert "authorization" not in headers


@pytest.mark.parametrize("client", ["stdlib", "aiohttp"])
def test_credentials_never_follow_a_redirect_to_another_host(server, other_server, bucket, client):
    """The endpoint redirects to another host: refused (as for http targets); the other host never
    sees a request, so neither the signature nor the session token reaches it. (obstore's own GET
    would follow it and send X-Amz-Security-Token along: docs/operations.md.)"""
    (other_server.root / "bkt").mkdir()
    (other_server.root / "bkt" / "obj.bin").write_bytes(bucket)
    server.redirects["/bkt/obj.bin"] = other_server.url_for("bkt/obj.bin")

    async def body(fetcher):
        with pytest.raises(FetchError, match="redirect to another host .* refused"):
            await fetcher.read("s3://bkt/obj.bin", 0, 1 << 20)

    with_fetcher(endpoint_options(server, token=TOKEN), body, client, read_timeout=3)
    assert other_server.stats["requests"] == 0


@pytest.mark.parametrize("lie", ["gzip", "long206", "long206-chunked"])
def test_answers_that_fail_a_check_are_never_used(server, bucket, lie):
    async def body(fetcher):
        assert await joined(fetcher, "s3://bkt/obj.bin", 0, 65536) == bucket[:65536]
        server.lie = lie
        with pytest.raises(FetchError):
            await fetcher.read("s3://bkt/obj.bin", 1 << 20, 2 << 20)

    with_fetcher(endpoint_options(server), body, backoff_base=0.001, read_timeout=0.5)


@pytest.mark.parametrize("kind", ["503", "reset", "truncate", "bad_range", "stall"])
def test_faults_are_retried_to_the_right_bytes(server, bucket, kind):
    server.set_faults(rate=0.5, kinds=(kind,), seed=5, stall_seconds=30)

    async def body(fetcher):
        for start in range(0, len(bucket), 512 << 10):
            assert await joined(fetcher, "s3://bkt/obj.bin", start, start + (512 << 10)) == \
                bucket[start:start + (512 << 10)]

    with_fetcher(endpoint_options(server), body, backoff_base=0.001, stall_timeout=0.3)
    assert server.stats["faults"].get(kind, 0) > 0


def test_anonymous_requests_are_not_signed(server, bucket):
    async def body(fetcher):
        assert await joined(fetcher, "s3://bkt/obj.bin", 7, 7000) == bucket[7:7000]

    with_fetcher({"anon": True, "endpoint_url": server.url.rstrip("/")}, body)
    assert all(not q for q in server.stats["queries"])


def test_credentials_from_a_profile_as_s3fs_finds_them(server, bucket, tmp_path, monkeypatch):
    """No credentials in the options: botocore's chain finds them (here a named profile in a shared
    credentials file), as it does for s3fs."""
    credentials = tmp_path / "credentials"
    credentials.write_text("[other]\naws_access_key_id = AKIAPROFILE000000000\naws_secret_access_key = s\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)

    async def body(fetcher):
        assert await joined(fetcher, "s3://bkt/obj.bin", 0, 100) == bucket[:100]

    with_fetcher({"profile": "other", "endpoint_url": server.url.rstrip("/")}, body)
    assert signed_with(server)[-1]["X-Amz-Credential"].startswith("AKIAPROFILE000000000/")


def test_a_bucket_s_region_is_asked_of_aws_when_not_given(server, bucket, monkeypatch):
    """No endpoint and no region: the bucket's region comes from x-amz-bucket-region (here from a
    loopback stand-in for s3.amazonaws.com), and the signature names it."""
    from refmount.fetch import s3

    asked = []

    class Probe(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            asked.append(unquote(self.path))
            self.send_response(301)
            self.send_header("x-amz-bucket-region", "eu-north-1")
            self.end_headers()

        def log_message(self, *args):
            pass

    probe = http.server.HTTPServer(("127.0.0.1", 0), Probe)
    threading.Thread(target=probe.serve_forever, daemon=True).start()
    monkeypatch.setattr(s3, "_AWS_REGION_PROBE", f"http://127.0.0.1:{probe.server_port}")
    try:
        signer = s3.S3Signer(engine_config({"key": KEY, "secret": SECRET})[0], None)
        signed = signer("s3://bkt/obj.bin", "GET")
        signer("s3://bkt/other.bin", "GET")
    finally:
        probe.shutdown()
    assert asked == ["/bkt"]  # once per bucket
    assert signed.startswith("https://s3.eu-north-1.amazonaws.com/bkt/obj.bin?")
    assert "%2Feu-north-1%2Fs3%2F" in signed


def test_options_only_s3fs_understands_keep_s3_on_s3fs():
    assert engine_config({"key": "k", "secret": "s", "endpoint_url": "http://h:1",
                          "client_kwargs": {"region_name": "r"}, "default_block_size": 5})[0] is not None
    assert engine_config({"anon": True, "config_kwargs": {"s3": {"addressing_style": "virtual"}}})[0]["virtual"]
    for options, culprit in [({"requester_pays": True}, "requester_pays"),
                             ({"s3_additional_kwargs": {"SSECustomerKey": "x"}}, "s3_additional_kwargs"),
                             ({"version_aware": True}, "version_aware"),
                             ({"client_kwargs": {"aws_session_token": "t"}}, "client_kwargs.aws_session_token"),
                             ({"config_kwargs": {"retries": {"max_attempts": 2}}}, "config_kwargs.retries"),
                             ({"key": "k"}, "key without secret")]:
        assert engine_config(options) == (None, culprit)


def test_options_only_s3fs_understands_read_through_s3fs(moto):
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=moto)
    fs.mkdir("fallback")
    fs.pipe("fallback/obj.bin", b"xyz" * 1000)
    options = {"key": KEY, "secret": SECRET, "endpoint_url": moto, "config_kwargs": {"retries": {"max_attempts": 2}}}

    async def body(fetcher):
        assert not on_the_engine(fetcher, "s3://fallback/obj.bin")
        assert await joined(fetcher, "s3://fallback/obj.bin", 3, 9) == b"xyzxyz"

    with_fetcher(options, body)
