"""How a flat buffer is cut into chunks (one per rank) and chunks into segments.

Both functions are pure and deterministic: every rank computes the same cuts
from the same numbers, which is what lets neighbours agree on message sizes
without ever exchanging them.
"""
from __future__ import annotations

from functools import lru_cache

Range = tuple[int, int]  # [start, stop) in elements of the flat buffer


@lru_cache(maxsize=1024)
def chunk_bounds(count: int, nranks: int) -> tuple[Range, ...]:
    """Split ``count`` elements into ``nranks`` contiguous chunks like ``np.array_split``.

    The first ``count % nranks`` chunks get one extra element; chunks may be empty.

    >>> chunk_bounds(10, 4)
    ((0, 3), (3, 6), (6, 8), (8, 10))
    >>> chunk_bounds(2, 4)
    ((0, 1), (1, 2), (2, 2), (2, 2))
    """
    if count < 0 or nranks < 1:
        raise ValueError(f"chunk_bounds needs count >= 0 and nranks >= 1, got {count}, {nranks}")
    base, extra = divmod(count, nranks)
    bounds, start = [], 0
    for i in range(nranks):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return tuple(bounds)


def bounds_from_counts(counts: list[int]) -> tuple[Range, ...]:
    """Chunks of the given sizes laid end to end (allgather, where each rank brings its own).

    >>> bounds_from_counts([2, 0, 3])
    ((0, 2), (2, 2), (2, 5))
    """
    bounds, start = [], 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    return tuple(bounds)


def segment_bounds(chunk: Range, segment_elems: int) -> list[Range]:
    """Cut one chunk into messages of at most ``segment_elems`` elements; empty chunk -> no messages.

    >>> segment_bounds((10, 20), 4)
    [(10, 14), (14, 18), (18, 20)]
    >>> segment_bounds((5, 5), 4)
    []
    """
    if segment_elems < 1:
        raise ValueError(f"segment_elems must be >= 1, got {segment_elems}")
    start, stop = chunk
    return [(s, min(s + segment_elems, stop)) for s in range(start, stop, segment_elems)]
