"""What changed between two listings of a source (`--refresh`): files new, changed, gone. Pure: a
listing is {name: identity}, where an identity is whatever names a file's version (its url, sidecar,
size and version: the listing's date or ETag, a stat or a HEAD: archive.py `identities`)."""

from __future__ import annotations

from dataclasses import dataclass

from refmount.errors import quote

_SHOWN = 3  # names a log line shows of each kind


@dataclass(frozen=True)
class Changes:
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def describe(self) -> str:
        """'2 new (c.nc, d.nc), 1 changed (a.nc), 1 gone (b.nc)': for the one log line of a refresh."""
        parts = []
        for label, names in (("new", self.added), ("changed", self.changed), ("gone", self.removed)):
            if names:
                shown = ", ".join(quote(n) for n in names[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
                parts.append(f"{len(names)} {label} ({shown})")
        return ", ".join(parts) or "nothing changed"


def listing_changes(before: dict, after: dict) -> Changes:
    """The files of listing `after` not in `before` (added), in both with another identity (changed),
    and in `before` only (removed); each in the listings' order."""
    return Changes(added=tuple(n for n in after if n not in before),
                   changed=tuple(n for n in after if n in before and before[n] != after[n]),
                   removed=tuple(n for n in before if n not in after))
