"""Whether a directory the daemon keeps things in (the disk cache, the scan store) is its own.

What is read back from such a directory is trusted: cached blocks are served as the remote's bytes,
kept scans as a file's references. A directory another user can write (or swap: an ancestor they can
write, a name they created first, as in /tmp) is someone else's, and a daemon running as root would
serve what they planted, write where their symlinks lead, and delete (evict) what they point it at.
So the directory must be a real directory (not a symlink) owned by this process's user, writable by
no one else, and every directory above it owned by that user or root and writable by no one else
(sticky ones such as /tmp excepted: nobody else can rename what is in them), as ssh's StrictModes asks.

That rule for the directories above is root's. An ordinary user's daemon can do no more than the user
can, and on a cluster their directories sit under project directories a group shares or another
account owns, which they cannot change: for them only an ancestor anyone may write is refused.
"""

from __future__ import annotations

import os
import stat


def problem(path: str) -> str | None:
    """Why `path` (an existing directory) is not this user's own to keep trusted things in, or None."""
    me = os.geteuid()
    try:
        st = os.lstat(path)
    except OSError as e:
        return e.strerror
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory (a symlink is refused: it leads where someone else chose)"
    if st.st_uid != me:
        return f"belongs to uid {st.st_uid}, not to this process's uid {me}"
    if st.st_mode & 0o022:
        return f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    above = os.path.dirname(os.path.realpath(path))
    others_only = 0o002 if me != 0 else 0o022  # (the bits that make an ancestor someone else's)
    while True:
        try:
            st = os.stat(above)
        except OSError as e:
            return f"{above}: {e.strerror}"
        if me == 0 and st.st_uid != 0:
            return f"lies in {above}, which belongs to uid {st.st_uid}"
        if st.st_mode & others_only and not st.st_mode & stat.S_ISVTX:
            return f"lies in {above}, which others may write (mode {stat.S_IMODE(st.st_mode):o})"
        if above == "/":
            return None
        above = os.path.dirname(above)
