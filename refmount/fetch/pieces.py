"""Byte ranges handed over as pieces split at block boundaries.

Every backend returns [start, end) as a list of pieces that split at multiples of the block size,
so that the block cache keeps them as its blocks without copying them again.
"""

from __future__ import annotations


def piece_sizes(start: int, end: int, piece: int) -> list[int]:
    """Sizes of the pieces of [start, end) split at multiples of `piece` (one piece if 0)."""
    if end <= start:
        return []
    if piece <= 0:
        return [end - start]
    sizes = []
    pos = start
    while pos < end:
        stop = min((pos // piece + 1) * piece, end)
        sizes.append(stop - pos)
        pos = stop
    return sizes


def split(data: bytes, start: int, piece: int) -> list[bytes]:
    """`data` (the bytes from offset `start`) cut into pieces (a copy each; for backends that
    can only return one buffer)."""
    if piece <= 0 or len(data) <= piece - start % piece:
        return [data] if data else []
    pieces, pos = [], 0
    for size in piece_sizes(start, start + len(data), piece):
        pieces.append(data[pos : pos + size])
        pos += size
    return pieces
