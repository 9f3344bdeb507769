"""Error types shared by every layer.

`RefmountError` is the user-facing kind: its message is one line that names the thing to fix (a key,
a url, an option). The CLI prints it without a traceback and exits non-zero.
"""

import re


class RefmountError(Exception):
    """A mistake or condition the user can fix; printed as one line."""


class RefsError(RefmountError):
    """The reference set is malformed (raised only by the loaders)."""


class FetchError(RefmountError):
    """Remote bytes could not be obtained (after the retry policy gave up)."""


class Unavailable(FetchError):
    """What was asked for could not be had now, for a reason that may pass (fetch/retry.py `passing`: a
    server down or answering 503; a load that ran out of --load-timeout; a scanner the system killed):
    asked again later where something asks again (a lazy mount's lookup, a --refresh)."""


class NotFound(FetchError):
    """The server says the object does not exist (HTTP 404, S3 NoSuchKey)."""


class Absent(FetchError):
    """A key that its store may lack (a chunk of a remote Zarr store's grid) is not there: the reader
    gets ENOENT, and a chunk of the decoded view reads as its fill value."""


class RemoteChanged(FetchError):
    """The remote object's validator (ETag/size) changed while mounted."""


class LoginFailed(FetchError):
    """A server refused our credentials, or a login could not complete: the reader gets EACCES, and
    the message names the login host and what was tried (never a secret)."""


class ReadRefused(FetchError):
    """A read a limit refuses (not a failure of its url: other reads of it go on). `once` names the
    limit and the url: the log says it once, not at every read it refuses."""

    def __init__(self, message: str, once: str) -> None:
        super().__init__(message)
        self.once = once


def same_failure(message: str, said: str | None) -> bool:
    """Whether a failure's message says what `said` said, whatever its counts and seconds ("gave up after 3
    attempts in 0.1s" and "... in 0.2s" are one failure): a failure that recurs is said once."""
    import re

    def kind(text: str) -> str:
        return re.sub(r"\b\d+(\.\d+)?( ?s\b| attempts\b)", "#", text)

    return said is not None and kind(message) == kind(said)


def quote(value, limit: int = 120) -> str:
    """repr() of a key or url, shortened so error lines stay one line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """`text` with its control characters escaped as repr() would (`\\n`, `\\x1b`): what refmount
    writes for a person (a log line, `refmount inspect`) stays one line per line, whatever names a
    remote document gave, and sends no escape to a terminal."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def format_size(n: int) -> str:
    """Bytes as the size options take them back (2G, 768M, 1.5G, 4096), for one-line errors."""
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= unit:
            value = n / unit
            return f"{value:.0f}{suffix}" if value == int(value) else f"{value:.1f}{suffix}"
    return str(n)
