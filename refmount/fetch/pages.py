"""Small http(s) pages (a listing's index pages, a directory's `.zmetadata` probe) fetched from
synchronous code, through the mount's HTTP engine (http.py) and logins (auth.py): the same headers,
credentials and redirect decisions as every read of the mount, never a client of their own; retried
as the context says (fetch/retry.py `retry_under`: a --refresh's listing gives up in seconds)."""

from __future__ import annotations

import contextvars
import threading

from refmount.fetch.pageguess import PageGuess, page_key


def _on_engine(remote_options: dict | None, call, first=None):
    """`call(backend)` (a coroutine) on a fresh HttpBackend with the mount's logins, on the asyncio loop;
    `first(backend)`: an attempt in this thread before it (the stdlib engine's), whose answer, if not
    None, is taken instead (no aiohttp, no asyncio loop)."""
    from refmount.fetch.auth import active
    from refmount.fetch.bridge import asyncio_loop
    from refmount.fetch.http import HttpBackend
    from refmount.fetch.retry import documents_policy
    from refmount.fetch.stats import FetchStats
    from refmount.fetch.tls import ssl_setting

    options = remote_options or {}
    backend = HttpBackend(documents_policy(), FetchStats(), headers=options.get("headers"),
                          ssl=lambda: ssl_setting(options), logins=active(), client="stdlib" if first else "aiohttp")
    if first is not None and (answer := first(backend)) is not None:
        return answer
    import asyncio  # (here: 20-35 ms that a listing answered on the stdlib engine never needs)

    async def once():
        try:
            return await call(backend)
        finally:
            await backend.close()

    return asyncio.run_coroutine_threadsafe(once(), asyncio_loop()).result()


class _Ahead:
    """A fetch_page begun ahead of its caller (fetch_page_ahead): its answer, or the error it met."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer = None
        self.error: BaseException | None = None


_ahead: dict = {}  # fetch_page's arguments and the logins -> _Ahead (taken once)
_guess: PageGuess | None = None  # (guess_pages)


def _ahead_key(url, limit, remote_options, same_origin) -> tuple:
    from refmount.fetch.auth import active
    from refmount.fetch.retry import policy_now

    headers = (remote_options or {}).get("headers") or {}
    return url, limit, tuple(sorted(headers.items())), same_origin, id(policy_now()), id(active())


def fetch_page_ahead(url: str, limit: int, remote_options: dict | None = None, *, same_origin: bool = False) -> None:
    """fetch_page(...) begun now in a thread, for the first later fetch_page of the same arguments, with
    the same logins and retry policy, to take (a mount's first index page, asked while its daemon
    imports): its answer, or the error it met after its retries (not asked twice: a server that is
    down fails the mount in the time one listing takes). Returns once the page is promised."""
    ahead = _ahead[_ahead_key(url, limit, remote_options, same_origin)] = _Ahead()

    def ask() -> None:
        try:
            ahead.answer = _fetch_page(url, limit, remote_options, same_origin)
        except Exception as e:  # noqa: BLE001 - raised in the caller's thread
            ahead.error = e
        finally:
            ahead.done.set()

    context = contextvars.copy_context()  # (the caller's retry policy: a thread does not inherit it)
    threading.Thread(target=context.run, args=(ask,), name="refmount-page-ahead", daemon=True).start()


def guess_pages(store) -> PageGuess:
    """From now on a page asked ahead and not yet answered is guessed (fetch/pageguess.py) from `store`,
    and every page answered ahead is kept there for next time. The daemon asks the returned guess
    `right()` before it mounts what it built; `guess_pages(None)`: no more guessing."""
    global _guess
    _guess = PageGuess(store) if store is not None else None
    return _guess


def check_guess() -> None:
    """Before a build fetches or scans anything beyond its listing's pages: GuessWrong when the page
    it was built on was a wrong guess (fetch/pageguess.py)."""
    if _guess is not None:
        _guess.check()


def fetch_page(url: str, limit: int, remote_options: dict | None = None, *,
               same_origin: bool = False) -> tuple[str, str, bytes]:
    """(the url found at after redirects, Content-Type, body) of a 200 answer of at most `limit`
    bytes; FetchError (LoginFailed for a refused login) otherwise. Not from the asyncio loop's thread."""
    key = _ahead_key(url, limit, remote_options, same_origin)
    ahead = _ahead.pop(key, None) if _ahead else None
    if _guess is not None:
        if ahead is not None:
            return _guess.answer(page_key(url, limit, dict(key[2]), same_origin), limit, ahead,
                                 lambda: _ahead.__setitem__(key, ahead))
        _guess.check()  # (another page: only once the guessed one is known right)
    if ahead is not None:
        ahead.done.wait()
        if ahead.error is not None:
            raise ahead.error
        return ahead.answer
    return _fetch_page(url, limit, remote_options, same_origin)


def _fetch_page(url, limit, remote_options, same_origin):
    return _on_engine(remote_options, lambda backend: backend.page(url, limit, same_origin=same_origin),
                      first=lambda backend: backend.page_direct(url, limit))


def fetch_answer(url: str, limit: int, remote_options: dict | None = None, *, same_origin: bool = False,
                 send: dict | None = None, post: bytes | None = None) -> tuple[str, dict, bytes]:
    """fetch_page's, with the answer's headers (case-insensitive) instead of its Content-Type; `send`:
    headers of this request only (a catalog's paging header); `post`: a POST of that body instead of a
    GET (a STAC API's next page)."""
    check_guess()
    return _on_engine(remote_options, lambda backend: backend.page_answer(url, limit, same_origin=same_origin,
                                                                          send=send, post=post))


def exists(url: str, remote_options: dict | None = None) -> bool:
    """Whether `url` is there (one HEAD, or a one-byte GET): False for a 404 or 410, FetchError for
    anything else (a refused login says so)."""
    from refmount.errors import FetchError

    check_guess()
    try:
        _on_engine(remote_options, lambda backend: backend.size(url))
    except FetchError as e:
        if getattr(e, "status", None) in (404, 410):
            return False
        raise
    return True


def which_exist(urls: list[str], remote_options: dict | None = None, at_once: int = 8) -> set[str]:
    """The urls of `urls` that are there (exists()'s question, asked `at_once` at a time on one engine);
    one that answers anything but a 2xx, 404 or 410 counts as not there."""
    import asyncio

    from refmount.errors import FetchError

    check_guess()

    async def ask(backend):
        gate, there = asyncio.Semaphore(at_once), set()

        async def one(url):
            async with gate:
                try:
                    await backend.size(url)
                except FetchError:
                    return
                there.add(url)

        await asyncio.gather(*(one(u) for u in urls))
        return there

    return _on_engine(remote_options, ask) if urls else set()
