"""Which certificate authorities to trust, by the usual conventions, and one-line TLS error messages.

Order: `--ca-bundle`, then REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE (what requests and curl users already
set), then SSL_CERT_FILE / SSL_CERT_DIR (OpenSSL reads those itself) and the system store.
`{"ssl": false}` in --remote-options turns verification off for http(s), reference file and targets.
"""

from __future__ import annotations

import functools
import os
import ssl

from refmount.errors import RefmountError

_ca_bundle: str | None = None  # --ca-bundle, set once per process before anything is fetched


def set_ca_bundle(path: str | None) -> None:
    global _ca_bundle
    if path is not None and not os.path.isfile(path):
        raise RefmountError(f"--ca-bundle {path!r}: no such file")
    _ca_bundle = path


def explicit_ca_bundle() -> str | None:
    return _ca_bundle


def ca_bundle() -> str | None:
    """The CA file to trust instead of the system store, if the user named one."""
    return _ca_bundle or os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or None


def ssl_setting(remote_options: dict | None):
    """What aiohttp's `ssl=` should be: False when the user said {"ssl": false}, else a verifying context."""
    value = (remote_options or {}).get("ssl", True)
    if value is False:
        return False
    if isinstance(value, ssl.SSLContext):
        return value
    cafile = ca_bundle()
    try:
        stamp = os.stat(cafile).st_mtime_ns if cafile else None
        return _verifying_context(cafile, stamp, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    except (OSError, ssl.SSLError) as e:
        raise RefmountError(f"CA bundle {cafile!r} cannot be used: {e}") from None


@functools.lru_cache(maxsize=8)
def _verifying_context(cafile: str | None, stamp, cert_file, cert_dir) -> ssl.SSLContext:
    """One verifying context per trust store (file and its version, OpenSSL's variables), shared by
    every client of the process: loading the system store takes 30-130 ms, which a mount paid for each
    HTTP client (the fetcher's, each index page's) even when it never spoke TLS."""
    return ssl.create_default_context(cafile=cafile)


def certificate_problem(error: BaseException | None) -> str | None:
    """The TLS verification failure inside `error` (or its causes), named in a few words, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        certificate_error = getattr(error, "certificate_error", None)  # aiohttp's ClientConnectorCertificateError
        if isinstance(certificate_error, BaseException) and certificate_error is not error:
            error = certificate_error
            continue
        if isinstance(error, ssl.SSLCertVerificationError):
            return f"certificate verify failed ({getattr(error, 'verify_message', None) or error})"
        if isinstance(error, ssl.SSLError):
            return f"TLS error ({error.reason or error})"
        error = error.__cause__ or error.__context__
    return None
