"""A mount's first index page as it answered last time, handed to the listing while the page itself is
still on its way (fetch/pages.py `fetch_page_ahead`: 3 round trips for a 50 KB page, 0.24 s at 80 ms),
so that the daemon builds the mount under those round trips instead of after them.

Nothing is served from a guess: before the mount is made the daemon asks `right()`, which waits for
the page and compares it byte for byte (final url, Content-Type, body) with the guess; only when they
are the same is what was built on the guess kept (the build is a function of the page: the same page,
the same build), else it is dropped and built again on the page as it came. Anything beyond the
guessed page that the build would ask of the network (another index page, a file to scan) first
settles the guess (`check()`): a wrong guess stops the build there (GuessWrong) rather than fetch or
scan for a listing that is not the source's. What is kept is the page as last answered, per url and
headers, in the scan store's directory (the store's `get_page`/`put_page`)."""

from __future__ import annotations

import hashlib
import json
import logging

log = logging.getLogger("refmount")


class GuessWrong(Exception):
    """The guessed page was not the page: what was built on it is dropped (the daemon builds again)."""


def page_key(url: str, limit: int, headers: dict, same_origin: bool) -> str:
    """The kept page's name: the request's arguments (a header's value, a token, only as a hash)."""
    text = json.dumps([url, limit, sorted(headers.items()), same_origin])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class PageGuess:
    """The guessing of one mount (armed by the daemon before it builds: fetch/pages.py `guess_pages`)."""

    def __init__(self, store) -> None:
        self.store = store  # refs/scan/store.py ScanStore (get_page, put_page)
        self._pending = None  # (key, limit, the guess, the _Ahead of the real page, put_back) once one is out
        self._wrong: bool | None = None  # settled: whether the guess was wrong

    def answer(self, key: str, limit: int, ahead, put_back):
        """The answer the listing takes for the page `ahead` fetches: the kept one while `ahead` is
        still on its way (a guess, at most one a mount), else `ahead`'s own (kept for next time).
        `put_back()`: makes `ahead` the next fetch of the page again (the build again, after a wrong guess)."""
        if self._pending is None and self._wrong is None and not ahead.done.is_set():
            kept = self.store.get_page(key, limit)
            if kept is not None:
                self._pending = (key, limit, kept, ahead, put_back)
                log.debug("building on the listing's first page as last answered, while it comes")
                return kept
        ahead.done.wait()
        if ahead.error is not None:
            raise ahead.error
        self._keep(key, limit, ahead.answer)
        return ahead.answer

    def _keep(self, key: str, limit: int, answer) -> None:
        if self.store.get_page(key, limit) != answer:
            self.store.put_page(key, answer)

    def right(self) -> bool:
        """Whether what was built can be kept: no guess was handed out, or it was the page (waits for
        it; a page that failed counts as wrong: the build again meets its error where the listing
        says it)."""
        if self._pending is not None:
            key, limit, kept, ahead, put_back = self._pending
            self._pending = None
            ahead.done.wait()
            self._wrong = ahead.error is not None or ahead.answer != kept
            log.debug("the listing's first page came %s", "otherwise: built again" if self._wrong else "as guessed")
            if self._wrong:  # (the page, or its error, is the build's again: the listing says what it met)
                if ahead.error is None:
                    self._keep(key, limit, ahead.answer)
                put_back()
        return not self._wrong

    def check(self) -> None:
        """Before the build asks the network for more than the guessed page: GuessWrong if the guess
        was wrong (the build stops there; the daemon builds again)."""
        if not self.right():
            raise GuessWrong("the listing's first page changed since the last mount")
