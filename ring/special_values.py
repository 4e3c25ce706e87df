"""The special results of a reproducible sum whose words are int64 (``ring.reproducible``).

Integers carry no NaN, infinity or -0.0: where some rank holds one, each rank marks what it
holds (:func:`marks`), an all-reduce "max" of the marks gives every rank every rank's, and
:func:`put` writes the results IEEE sums give whatever their order: any NaN, or +inf with -inf,
gives NaN; infinities of one sign give that infinity; an element whose every contribution is
-0.0 gives -0.0.
"""
from __future__ import annotations

import numpy as np

from ring.compression import blocks


def working(x: np.ndarray) -> np.ndarray:
    """``x``, or for a 16-bit float dtype (ml_dtypes' bfloat16 among them) x as float32 (exact).

    >>> working(np.zeros(1, np.float16)).dtype
    dtype('float32')
    """
    return x if x.dtype.itemsize > 2 else x.astype(np.float32)


def marks(contributions: list, out: np.ndarray) -> None:
    """``out`` (uint8, ``(2, size)``): per element, the largest of each contribution's mark, whose
    largest over every rank (an all-reduce "max") says the special result (see :func:`decode`).
    Row 0: 3 NaN, 2 +inf, 1 any other value but -0.0, 0 -0.0; row 1 the same with -inf for +inf.

    >>> out = np.zeros((2, 4), np.uint8); marks([np.array([np.inf, -0.0, 0.0, -np.inf])], out); out.tolist()
    [[2, 0, 1, 0], [0, 0, 1, 2]]
    """
    for x in contributions:
        for b in blocks(x.size):
            _mark(working(x.reshape(-1)[b]), out[:, b])


def _mark(flat: np.ndarray, out: np.ndarray) -> None:
    nan, inf = np.isnan(flat), np.isinf(flat)
    ordinary = ~(nan | inf | ((flat == 0) & np.signbit(flat)))
    for row, infinite in ((0, inf & (flat > 0)), (1, inf & (flat < 0))):
        mark = ordinary.astype(np.uint8)
        mark[infinite] = 2
        mark[nan] = 3
        np.maximum(out[row], mark, out=out[row])


def put(value: np.ndarray, special: np.ndarray) -> None:
    """Put the special results that every rank's :func:`marks` say into ``value``."""
    positive, negative = special[0], special[1]
    nan = (positive == 3) | (negative == 3) | ((positive == 2) & (negative == 2))
    value[(positive == 0) & (negative == 0)] = -0.0
    value[positive == 2] = np.inf
    value[negative == 2] = -np.inf
    value[nan] = np.nan
