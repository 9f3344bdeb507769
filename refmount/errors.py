"""Error types shared by every layer.

`RefmountError` is the user-facing kind: its message is one line that names the thing to fix (a key,
a url, an option). The CLI prints it without a traceback and exits non-zero.
"""


class RefmountError(Exception):
    """A mistake or condition the user can fix; printed as one line."""


class RefsError(RefmountError):
    """The reference set is malformed (raised only by the loaders)."""


class FetchError(RefmountError):
    """Remote bytes could not be obtained (after the retry policy gave up)."""


class RemoteChanged(FetchError):
    """The remote object's validator (ETag/size) changed while mounted."""


def quote(value, limit: int = 120) -> str:
    """repr() of a key or url, shortened so error lines stay one line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"
