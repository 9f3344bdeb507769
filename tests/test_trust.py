"""The trust boundary's one decision (refmount/fetch/trust.py), without a mount: where a location came
from, what a document from there may name, and how the mount's argument is shown. The mounts that
show it end to end are in tests/test_front_doors.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from refmount.errors import RefmountError
from refmount.fetch.trust import Location, TargetRefused, origin_of, shown_location

LOCAL_ALIASES = ["/etc/shadow", "file:///etc/shadow", "local:///etc/shadow", "memory://x", "simplecache::file:///etc/shadow",
                 "blockcache::/etc/shadow", "weird://x", "relative/path", "file://localhost/etc/shadow",
                 "simplecache::s3://bucket/key"]  # (a cache wrapper keeps files on local disk: protocols.py)
REMOTE = ["http://other.example/x.nc", "https://h:8443/a?sig=1", "s3://bucket/key", "gs://b/k"]


@pytest.mark.parametrize("location, origin", [
    ("/data/refs.json", None), ("refs.json", None), ("file:///data/refs.json", None), ("local:///data/x", None),
    ("@list.txt", None), ("simplecache::file:///x", None),
    ("http://Example.org:8080/d/x.dmrpp", "http://example.org:8080"), ("https://user:pw@h/x", "https://h"),
    ("s3://bucket/key", "s3://bucket"), ("simplecache::https://h/x", "https://h"),
    ("http://[::1]:8080/x", "http://[::1]:8080"),
    ("memory://x", "memory://x"), ("weird://host/x", "weird://host"),  # not known to be local: not the user's file
])
def test_origin_of_each_form(location, origin):
    assert origin_of(location) == origin


@pytest.mark.parametrize("target", LOCAL_ALIASES)
def test_a_remote_document_reaches_no_local_alias(target):
    document = Location.argument("@/lists/l.txt").names("https://data.example/d/x.h5.dmrpp")
    assert document.remote and document.named_by == "@/lists/l.txt"
    with pytest.raises(TargetRefused) as e:
        document.check(target)
    message = str(e.value)
    assert "\n" not in message and repr(target) in message
    assert "'https://data.example/d/x.h5.dmrpp'" in message and "--allow-protocols" in message


@pytest.mark.parametrize("target", LOCAL_ALIASES + REMOTE)
def test_a_local_document_may_name_local_files_and_remote_urls(target):
    for arg in ("/data/refs.json", "@lists/l.txt", "file:///data/x.dmrpp", "local:///data/x.dmrpp"):
        Location.argument(arg).check(target)


@pytest.mark.parametrize("target", REMOTE)
def test_a_remote_document_may_name_other_remotes(target):
    Location.argument("https://h/refs.json").check(target)


def test_what_a_local_list_names_is_judged_by_its_own_origin():
    """A line of the user's own @FILE list is the user's; what a remote line names is the remote's."""
    listed = Location.argument("@l.txt")
    remote = listed.names("http://h/a.dmrpp")
    local = listed.names("/data/b.dmrpp")
    assert remote.origin == "http://h" and local.origin is None
    local.check("/data/b.h5")
    with pytest.raises(TargetRefused):
        remote.check("/data/b.h5")
    with pytest.raises(TargetRefused):  # a remote document never names a local one to launder through
        remote.names("/data/b.dmrpp")
    again = remote.names("https://cdn.example/a.h5")  # a remote one may name another remote
    with pytest.raises(TargetRefused):
        again.check("file:///etc/shadow")


def test_allow_protocols_decides_for_every_origin():
    for arg in ("/data/refs.json", "https://h/refs.json"):
        root = Location.argument(arg, {"https", "s3"})
        root.check("https://x/y")
        root.check("s3://b/k")
        for target in ("http://x/y", "/etc/shadow", "local:///etc/shadow", "gs://b/k"):
            with pytest.raises(TargetRefused, match="--allow-protocols does not include"):
                root.check(target)
        with_file = Location.argument(arg, {"https", "file"})
        for target in ("/etc/shadow", "local:///etc/shadow", "simplecache::file:///x", "https://x/y"):
            with_file.check(target)  # 'file' allows every alias of local files, from a remote set too
        assert root.names("https://x/y").policy == root.policy  # the policy travels


def test_a_refusal_is_a_refmount_error_with_credentials_redacted():
    document = Location.argument("https://user:secret@h/refs.json?X-Amz-Signature=abc")
    with pytest.raises(RefmountError) as e:
        document.check("file:///etc/shadow")
    assert "secret" not in str(e.value) and "abc" not in str(e.value)


def test_logins_and_limits_travel_with_every_location():
    from refmount.fetch.auth import Logins

    logins, limits = Logins(), {"max_keys": 10}
    root = Location.argument("@l.txt", None, logins=logins, limits=limits)
    child = root.names("https://h/a.dmrpp").names("https://h/a.h5")
    assert child.policy.logins is logins and child.policy.limits is limits
    assert child.named_by == "https://h/a.dmrpp"
    assert logins.public_only == {"h"}  # (a name that resolves nowhere counts as public: held to public addresses)


def test_the_argument_is_shown_as_given_or_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shown_location("@list.txt") == f"@{tmp_path}/list.txt"
    assert shown_location("@/abs/list.txt") == "@/abs/list.txt"
    assert shown_location("refs.json") == f"{tmp_path}/refs.json"
    assert shown_location("file:///data/refs.json") == "/data/refs.json"
    assert shown_location("https://h/refs.json") == "https://h/refs.json"
    assert shown_location("local:///x") == "local:///x"
    assert shown_location("/dev/stdin") == "stdin"
    assert Location.argument("@list.txt").url == f"@{tmp_path}/list.txt"


def test_a_scanned_file_is_checked_against_the_document_that_named_its_targets():
    """refs/scan/archive.check_scanned: a DMR++'s targets against the DMR++, not the list."""
    from refmount.refs.scan.archive import Entry, Scanned, check_scanned
    from refmount.refs.scan.pool import ScanFailed

    root = Location.argument("@l.txt")
    refs = {".zgroup": "{}", "x/0": ["local:///etc/shadow", 0, 40], "y/0": ["https://h/a.h5", 0, 8], "z/0": "inline"}
    remote = Entry("a.h5", "https://h/a.h5", sidecar="https://h/a.h5.dmrpp")
    with pytest.raises(ScanFailed, match=re.escape("named by remote 'https://h/a.h5.dmrpp'")):
        check_scanned(root, remote, Scanned("a.h5", remote.url, "dmrpp", refs, []))
    local = Entry("a.h5", "/data/a.h5", sidecar="/data/a.h5.dmrpp")
    check_scanned(root, local, Scanned("a.h5", local.url, "dmrpp", refs, []))
    ok = {"x/0": ["https://h/a.h5", 0, 40]}
    check_scanned(root, remote, Scanned("a.h5", remote.url, "dmrpp", ok, []))


def test_one_decision():
    """No other module decides local/remote policy from a string: the old check is gone."""
    import refmount.fetch as fetch
    import refmount.fuse.assemble as assemble

    assert not hasattr(fetch, "check_protocols")
    source = Path(assemble.__file__).read_text()
    assert "is_remote(opts.refs)" not in source and "reaches_local" not in source
    assert os.path.basename(Location.__module__.replace(".", "/")) == "trust"
