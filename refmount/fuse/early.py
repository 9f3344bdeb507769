"""What a mount sets up before it loads anything (its CA bundle, its logins), and the first request of
its listing, begun in a thread as the daemon starts: the daemon imports its code (0.3-0.5 s of CPU:
trio, numpy, pyfuse3, the loaders) while the first index page of an http(s) glob travels (2 round
trips, 3 for a page past TCP's first window: 0.16-0.24 s at 80 ms), and the listing takes that answer
(fetch/pages.py `fetch_page_ahead`), the same request with the same logins. Kept light: trio and the
fetch code only, so that the request leaves early; on plain http its connection is opened before even
those (refmount/connectahead.py), so that the handshake's round trip passes under the imports too."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("refmount")


def install_logins(opts) -> None:
    """The mount's credentials (netrc, cookie jar, bearer tokens: fetch/auth.py), for the reference
    file's client and the fetcher alike; a token file that cannot be read fails the mount now."""
    from refmount.fetch.auth import Logins, check_token_files, install

    check_token_files(opts.bearer_tokens)
    if opts.s3_credentials_url:
        from refmount.fetch.s3creds import check_options

        check_options(opts.s3_credentials_url, opts.remote_options)
    install(Logins(cookie_jar=opts.cookie_jar, bearer_tokens=opts.bearer_tokens,
                   allow_cross_host_redirects=opts.allow_cross_host_redirects))


def prepare(opts) -> None:
    """Before the reference set is fetched: the CA bundle (it may be on https), the logins (... behind one),
    and the timeouts of the documents it reads to know what it serves (--read-timeout, --stall-timeout)."""
    from refmount.fetch.retry import RetryPolicy, bound_documents_by
    from refmount.fetch.tls import set_ca_bundle

    set_ca_bundle(opts.ca_bundle)
    bound_documents_by(RetryPolicy(read_timeout=opts.read_timeout, stall_timeout=opts.stall_timeout))
    install_logins(opts)


class BeginLoading:
    """prepare(opts), then the listing's first page promised (refs/scan/sources.py `ask_first_page`), in
    a thread started now; `prepared()` waits for both."""

    def __init__(self, opts) -> None:
        self._prepared = threading.Event()
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(opts,), name="refmount-early", daemon=True).start()

    def _run(self, opts) -> None:
        from refmount.connectahead import connect_ahead

        try:
            connect_ahead(opts.refs)  # (the origin of the page ask_first_page asks below: its handshake first)
            prepare(opts)
            try:  # (promised before prepared(): the listing, which waits for that, finds it)
                from refmount.refs.scan.sources import ask_first_page

                ask_first_page(opts.refs, (opts.remote_options or {}).get("headers"))
            except Exception as e:  # noqa: BLE001 - the listing asks for itself
                log.debug("first index page not asked early: %s", e)
        except BaseException as e:  # noqa: BLE001 - raised in the loading thread (prepared())
            self._error = e
        finally:
            self._prepared.set()

    def prepared(self) -> None:
        """Once prepare(opts) is done and the page promised; what prepare raised (a bad token file) is
        raised here."""
        self._prepared.wait()
        if self._error is not None:
            raise self._error
