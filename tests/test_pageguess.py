"""A --concat glob's daemon builds on its listing's first page as last answered while the page travels
(fetch/pageguess.py), and keeps that build only when the page comes back the same: the tree served
is the one a build on the page itself gives, guessed right or wrong. nginx's autoindex behind a
loopback relay that holds the answers until the daemon has taken its guess (so the guess is taken
whatever the machine's load)."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from refmount.fetch.pageguess import GuessWrong, PageGuess, page_key
from refmount.refs.scan.store import ScanStore
from tests.support.clients import nczarr_url
from tests.support.daily import make_daily
from tests.support.nginx import Nginx

GUESSED = "building on the listing's first page as last answered"


class _Ahead:
    def __init__(self, answer=None, error=None, done=False):
        self.done = threading.Event()
        self.answer, self.error = answer, error
        if done:
            self.done.set()


class _Store:
    def __init__(self, page=None):
        self.pages = {} if page is None else {"k": page}
        self.puts = 0

    def get_page(self, key, limit):
        return self.pages.get(key)

    def put_page(self, key, answer):
        self.puts += 1
        self.pages[key] = answer


PAGE = ("http://h/d/", "text/html", b"<a href='x.nc'>x.nc</a>")
OTHER = ("http://h/d/", "text/html", b"<a href='y.nc'>y.nc</a>")


def _answered(ahead, answer=None, error=None):
    ahead.answer, ahead.error = answer, error
    ahead.done.set()


def test_a_right_guess_is_kept_and_nothing_is_written():
    guess, ahead, put_back = PageGuess(_Store(PAGE)), _Ahead(), []
    assert guess.answer("k", 1000, ahead, lambda: put_back.append(1)) == PAGE
    _answered(ahead, PAGE)
    assert guess.right() and not put_back and guess.store.puts == 0
    guess.check()  # (right: the build goes on)


def test_a_wrong_guess_is_said_the_page_kept_and_put_back():
    guess, ahead, put_back = PageGuess(_Store(PAGE)), _Ahead(), []
    assert guess.answer("k", 1000, ahead, lambda: put_back.append(1)) == PAGE
    _answered(ahead, OTHER)
    with pytest.raises(GuessWrong):
        guess.check()
    assert put_back == [1] and guess.store.pages["k"] == OTHER
    assert not guess.right()  # (settled: said again, not waited for again)
    assert guess.answer("k", 1000, _Ahead(OTHER, done=True), None) == OTHER  # (no second guess)


def test_a_page_that_failed_is_a_wrong_guess_and_its_error_the_builds_again():
    guess, ahead, put_back = PageGuess(_Store(PAGE)), _Ahead(), []
    guess.answer("k", 1000, ahead, lambda: put_back.append(1))
    _answered(ahead, error=OSError("refused"))
    assert not guess.right() and put_back == [1] and guess.store.pages["k"] == PAGE
    with pytest.raises(OSError):
        PageGuess(_Store(PAGE)).answer("k", 1000, ahead, None)  # (answered: its error, no guess)


def test_no_guess_once_the_page_is_there_or_without_a_kept_one():
    store = _Store()
    guess = PageGuess(store)
    assert guess.answer("k", 1000, _Ahead(PAGE, done=True), None) == PAGE
    assert store.pages["k"] == PAGE and store.puts == 1  # (kept for next time)
    ahead = _Ahead()
    threading.Timer(0.05, _answered, (ahead, OTHER)).start()
    assert PageGuess(_Store()).answer("k", 1000, ahead, None) == OTHER  # (nothing kept: waited for)
    assert PageGuess(_Store()).right()  # (no guess: what was built stands)


def test_the_store_keeps_a_page_whole_bounded_and_by_its_key(tmp_path):
    store = ScanStore(str(tmp_path))
    key = page_key("http://h/d/", 1000, {"Authorization": "Bearer secret"}, True)
    assert store.get_page(key, 1000) is None
    store.put_page(key, PAGE)
    assert store.get_page(key, 1000) == PAGE
    assert store.get_page(key, len(PAGE[2]) - 1) is None  # (longer than the listing takes)
    assert store.get_page(page_key("http://h/d/", 1000, {}, True), 1000) is None
    assert not any(b"secret" in gzip.decompress(p.read_bytes()) for p in tmp_path.iterdir())
    (path,) = tmp_path.glob("page-*")
    path.write_bytes(path.read_bytes()[:-8])  # (cut short: not a guess)
    assert store.get_page(key, 1000) is None


# -- real mounts --------------------------------------------------------------------------------------

class HeldAnswers:
    """A loopback TCP relay to `port` that passes requests at once and, while held, keeps the answers'
    bytes back until `release()` (at most 120 s)."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.released = threading.Event()
        self.released.set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if answers:
                    self.released.wait(120)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()


def guessed_mount(mount, relay: HeldAnswers, logs: Path, url: str, came: str):
    """A mount whose index page the relay holds until the daemon logs its guess (or 120 s: the test then
    fails on the log); the log must say the page then `came` "as guessed" or "otherwise: built again"."""
    for p in logs.glob("mnt*.log"):
        p.unlink()  # (the logs of earlier mounts, which name a guess too)
    relay.hold()

    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(GUESSED in p.read_text(errors="replace")
                                                      for p in logs.glob("mnt*.log")):
            time.sleep(0.02)
        relay.release()

    threading.Thread(target=watch, daemon=True).start()
    m = mount(url, "--concat", "time", "--log-level", "debug")
    assert GUESSED in m.log() and f"first page came {came}" in m.log(), m.log()
    return m


def tree(root: Path) -> dict:
    """Every file of a mount, its bytes, and `ncdump -h` of it (Debian's netCDF-C)."""
    files = {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    done = subprocess.run(["ncdump", "-h", nczarr_url(root)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return {"files": files, "ncdump -h": done.stdout.split("\n", 1)[1]}  # (after "netcdf <mountpoint's name> {")


def _settle(paths) -> None:
    settled = time.time() - 3 * 86400  # (older than a day: the listing's dates name the versions)
    for p in paths:
        os.utime(p, (settled, settled))


def test_a_warm_mount_on_a_guessed_page_serves_what_a_build_on_the_page_serves(mount, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = tmp_path / "www" / "data" / "tas"
    _settle(make_daily(data, 3, 7, 12))
    with Nginx(tmp_path / "nginx", f"root {tmp_path / 'www'}; location /data/ {{ autoindex on; }}") as nginx:
        relay = HeldAnswers(nginx.port)
        try:
            url = f"http://127.0.0.1:{relay.port}/data/tas/*.nc"
            cold = mount(url, "--concat", "time", "--log-level", "debug")
            expected = tree(cold.path)
            assert GUESSED not in cold.log()
            cold.stop()

            warm = guessed_mount(mount, relay, tmp_path, url, "as guessed")  # the same listing: its build served
            assert tree(warm.path) == expected
            warm.stop()

            _settle(make_daily(data, 4, 7, 12)[3:])  # a day more: the guess is wrong, built again
            changed = guessed_mount(mount, relay, tmp_path, url, "otherwise: built again")
            assert "the build on the guessed page let go" in changed.log()  # (joined and closed, not dropped)
            got = tree(changed.path)
            assert "\ttime = 96 ;" in got["ncdump -h"] and "\ttime = 72 ;" in expected["ncdump -h"]  # (4 days, 3 before)
            fresh = mount(url, "--concat", "time", env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg-fresh")})
            assert got == tree(fresh.path)  # (the new listing built cold, with no guess and no scan kept)
            assert got != expected
            changed.stop()

            for p in (tmp_path / "xdg" / "refmount" / "scans").glob("combined-*"):
                p.unlink()  # the page as kept, its combination not: combined again once the page is known
            again = guessed_mount(mount, relay, tmp_path, url, "as guessed")
            assert tree(again.path) == got
        finally:
            relay.release()
            relay.close()


def test_a_wrong_guess_leaves_no_thread_or_fetcher_of_its_build_behind(tmp_path, monkeypatch):
    """The daemon's build on a wrong guess (the listing gained a day) is let go before the build again:
    its fetcher's warm-up thread joined and the fetcher closed, so that once `_build` returns (here in
    this process, as `refmount mount` runs it) the only warm-up thread and fetcher are the served build's,
    and this process holds no connection to the server beyond those of the build without a guess."""
    import gc
    import logging

    from refmount.cli import build_parser, options_from_args
    from refmount.fetch import Fetcher
    from refmount.fuse import daemon
    from refmount.fuse.early import BeginLoading

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    data = tmp_path / "www" / "data" / "tas"
    _settle(make_daily(data, 3, 7, 12))

    def build(url):
        # (a cache size, not the default memory target: the daemon's own memory measured here is the
        # whole test run's process)
        opts = options_from_args(build_parser().parse_args(["mount", url, str(tmp_path), "--concat", "time",
                                                            "--cache-size", "64M"]))
        return daemon._build(opts, BeginLoading(opts))

    def warming():  # (this test's: not another test's in the same process)
        return [t for t in threading.enumerate() if t.name == "refmount-warm-up" and t.is_alive() and t not in others]

    def connections():
        """This process's established connections to the relay (/proc/net/tcp against its own fds)."""
        mine = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                mine.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # (the listing's own fd, closed since)
                pass
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
        return sum(1 for row in rows if (f := row.split())[3] == "01" and int(f[2].split(":")[1], 16) == relay.port
                   and f"socket:[{f[9]}]" in mine)

    def fetchers():
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, Fetcher) and not any(o is f for f in others)]

    others: list = []
    others += [*fetchers(), *warming()]  # (held: their ids are not reused)

    class Said(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            said.append(message)
            if GUESSED in message:
                relay.release()

    said: list[str] = []
    handler, logger = Said(), logging.getLogger("refmount")
    with Nginx(tmp_path / "nginx", f"root {tmp_path / 'www'}; location /data/ {{ autoindex on; }}") as nginx:
        relay = HeldAnswers(nginx.port)
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        try:
            url = f"http://127.0.0.1:{relay.port}/data/tas/*.nc"
            built = build(url)  # cold: the page and its combination kept for next time
            built[1].close_unused()
            del built
            assert not warming() and not fetchers()
            baseline = connections()  # (the page's engine keeps none open: 0 here)
            _settle(make_daily(data, 4, 7, 12)[3:])  # a day more: the guess is wrong
            said.clear()
            relay.hold()
            fs, fetcher = build(url)
            assert any(GUESSED in m for m in said) and any("otherwise: built again" in m for m in said), said
            assert any("the build on the guessed page let go" in m for m in said), said
            assert warming() in ([], [fetcher._warming])  # (the served build's own, if still importing)
            assert fetchers() == [fetcher]
            assert connections() == baseline
            fetcher.close_unused()
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            relay.release()
            relay.close()
