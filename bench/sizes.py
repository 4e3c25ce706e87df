"""The geometric sweep of message sizes between two sizes (sizes read as in ``collectives.calls.sizes``).

>>> sweep(8, 64, 2)
[8, 16, 32, 64]
"""
from __future__ import annotations

from collectives import format_size, parse_size

__all__ = ["format_size", "parse_size", "sweep"]


def sweep(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """``min_bytes``, then each size ``factor`` times the last, while at most ``max_bytes``."""
    if min_bytes <= 0 or max_bytes < min_bytes or factor <= 1:
        raise ValueError(f"need 0 < min ({min_bytes}) <= max ({max_bytes}) and factor ({factor}) > 1")
    sizes, size = [], float(min_bytes)
    while size <= max_bytes:
        if not sizes or int(size) != sizes[-1]:
            sizes.append(int(size))
        size *= factor
    return sizes
