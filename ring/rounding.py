"""Rounding an exact integer once: the words of a reproducible sum (``ring.reproducible``).

A total arrives as int64 words of ``bits`` bits each (word j counts units of 2**(bottom + bits*j),
any sign, any carry): :func:`carry` normalizes them, :func:`divide` divides them exactly ("avg"),
:func:`leading_bits` takes the leading WINDOW bits and a sticky bit of the rest, and :func:`round_window`
rounds those to nearest, ties to even, at a dtype's precision and smallest unit. :func:`rounded`
does all of it for any number of words; :func:`two_words`, the common case of two, rounds to odd
into one int64 and lets numpy's conversion round once.
"""
from __future__ import annotations

import numpy as np

#: Bits of the total kept to round it (and a sticky bit): at least p + 2 for float64.
WINDOW = 62


def two_words(total: np.ndarray, bits: int, bottom: int, out: np.ndarray) -> None:
    """``out`` (float32 or float64) = the exact value of two words of ``bits`` bits (``total``,
    overwritten; units of 2**bottom), rounded once, where no result can land below the normal range. The value's leading WINDOW bits (fewer if it has
    fewer) make one int64, every bit below them folded into its last bit ("round to odd": a window
    with at least two bits past the dtype's precision rounds as the whole value does), and
    numpy's int64 to float conversion rounds that once; the scaling by a power of two is exact.

    >>> out = np.empty(2, np.float32); two_words(np.array([[5, 0], [-1, 2]]), 3, -4, out); out.tolist()
    [-0.1875, 1.0]
    """
    carry(total, bits)
    sign = (total[1] >> 63) | 1   # (-1 or 1: a multiplication is quicker than numpy's negative with where=)
    total *= sign
    carry(total, bits)   # now both words are in [0, 2**bits)
    high, low = total[1], total[0]
    shift = np.maximum(bit_length(high) + (bits - WINDOW), 0)   # (the bits below the window: <= 62)
    right = np.maximum(shift - bits, 0)   # (where the window lies within the high word: its bits below)
    window = (high >> right) << np.maximum(bits - shift, 0)
    window += low >> shift
    window |= ((low & ((1 << shift) - 1)) | (high & ((1 << right) - 1))) != 0
    np.copyto(out, window, casting="unsafe")   # (the one rounding)
    np.ldexp(out, (shift + bottom).astype(np.int32), out=out)   # (int32: numpy's int64 loop is slower)
    out *= sign


def rounded(total: np.ndarray, bits: int, bottom: int, count: int, digits: int, lowest: int) -> np.ndarray:
    """The exact value of ``total`` (words of ``bits`` bits, units of 2**bottom, overwritten),
    divided by ``count`` (1: "sum"), rounded to ``digits`` significant bits and a multiple of
    2**lowest, as float64 (exactly the rounded value).

    >>> rounded(np.array([[5, -2], [3, 0]]), 3, -2, 3, 24, -149).tolist()   # (29 / 4 / 3 and -2 / 4 / 3)
    [2.4166667461395264, -0.1666666716337204]
    """
    carry(total, bits)
    negative = total[-1] < 0
    np.negative(total, out=total, where=negative)
    carry(total, bits)   # now every word is in [0, 2**bits), the top one >= 0
    sticky = np.zeros(total.shape[1], bool)
    if count > 1:   # words below the grid first, so that the quotient keeps a window's bits
        below = -(-(WINDOW + count.bit_length()) // bits)
        total = np.concatenate([np.zeros((below, total.shape[1]), np.int64), total])
        bottom -= below * bits
        sticky = divide(total, bits, count)
    window, exponent = leading_bits(total, bits, sticky)
    value = round_window(window, bottom + exponent, sticky, digits, lowest)
    return np.negative(value, out=value, where=negative)


def carry(total: np.ndarray, bits: int) -> None:
    """Carry each word's bits past ``bits`` into the next (the value is unchanged): the lower words
    end in [0, 2**bits), the top one holds the sign."""
    for j in range(total.shape[0] - 1):
        carry = total[j] >> bits
        total[j] -= carry << bits
        total[j + 1] += carry


def divide(total: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``total`` (nonnegative words) = its value // ``count``, long division from the top word;
    returns where a remainder was left. (remainder * 2**bits + word < count * 2**bits < 2**63.)"""
    remainder = np.zeros(total.shape[1], np.int64)
    for j in range(total.shape[0] - 1, -1, -1):
        dividend = (remainder << bits) + total[j]
        total[j] = dividend // count
        remainder = dividend - total[j] * count
    return remainder != 0


def bit_length(x: np.ndarray) -> np.ndarray:
    """The bits of each nonnegative int64 of ``x`` (0 for 0).

    >>> bit_length(np.array([0, 1, 2, 3, 2 ** 53 + 1, 2 ** 62 - 1, 2 ** 63 - 1])).tolist()
    [0, 1, 2, 2, 54, 62, 63]
    """
    # The exponent field of x as a float64 (numpy's frexp is a slow loop); one too many where
    # the conversion rounded up to a power of two.
    length = np.maximum((x.astype(np.float64).view(np.int64) >> 52) - 1022, 0)
    length -= (x >> np.maximum(length - 1, 0)) == 0
    return np.maximum(length, 0, out=length)


def leading_bits(total: np.ndarray, bits: int, sticky: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leading WINDOW bits of each element's value (nonnegative words), as int64, and the
    exponent of the window's last bit; ``sticky`` is set where a 1 bit was left below it."""
    words = total.shape[0]
    leading = np.full(total.shape[1], -1, np.int64)
    for j in range(words):
        leading[total[j] != 0] = j
    length = np.zeros_like(leading)
    for j in range(words):
        at = leading == j
        length[at] = bits * j + bit_length(total[j][at])
    exponent = np.maximum(length - WINDOW, 0)
    window = np.zeros_like(leading)
    for j in range(words):
        shift = bits * j - exponent   # where word j's last bit lands in the window (< 0: below it)
        right = np.clip(-shift, 0, 63)
        window += np.where(shift >= 0, total[j] << np.clip(shift, 0, 62), total[j] >> right)
        below = np.where(right >= 63, total[j], total[j] & ((1 << np.minimum(right, 62)) - 1))
        sticky |= below != 0
    return window, exponent


def round_window(window: np.ndarray, exponent: np.ndarray, sticky: np.ndarray, digits: int, lowest: int) -> np.ndarray:
    """``window * 2**exponent`` (plus a little more where ``sticky``) rounded to ``digits``
    significant bits and to a multiple of 2**lowest, to nearest, ties to even, as float64.

    >>> round_window(np.array([0b1011, 0b1011, 0b1001]), np.array([0, 0, 0]), np.array([False, True, False]), 3, -149)
    array([12., 12.,  8.])
    """
    drop = np.clip(np.maximum(bit_length(window) - digits, lowest - exponent), 0, 63)
    kept = window >> drop
    below = window - (kept << np.minimum(drop, 62)) * (drop < 63)
    half = np.where(drop > 0, 1 << np.maximum(drop - 1, 0), 0)
    up = (drop > 0) & ((below > half) | ((below == half) & (sticky | (kept & 1 == 1))))
    kept += up
    return np.ldexp(kept.astype(np.float64), exponent + drop)
