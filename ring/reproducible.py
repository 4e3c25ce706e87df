"""Reproducible sums: each contribution becomes integers on one grid that every rank agreed on.

Pure numpy, no MPI. An all-reduce with ``reproducible=True`` (``collectives.ops.reproducible``)
uses it in three steps around two integer all-reduces:

1. :func:`facts`: what this rank holds (the largest exponent, the finest unit, how many
   contributions, whether any is special); every rank's facts travel to every rank, and
   :func:`grid` makes the one grid they imply: a unit ``2**bottom`` fine enough to hold every
   contribution exactly, and ``words`` int64 words per element of ``bits`` bits each, with
   headroom for the sum of every contribution. Where the grid's whole span, headroom included,
   fits a float's significand (float32's 24 bits, float64's 53), the grid's one word travels as
   that float instead (``Grid.wire``): every float sum of values on the grid is then exact,
   so the float all-reduce adds integers too, and nothing needs scaling.
2. :func:`encode` puts this rank's contributions, summed on the grid, into an array of the
   wire's dtype; the all-reduce sums those across ranks. Sums on the grid are exact and
   associative, so the total is the exact sum of every contribution, whichever rank held which,
   in any order.
3. :func:`decode` rounds that exact total once, to nearest (ties to even), into the data's dtype.

So the result is the exact sum correctly rounded: within half a unit in the last place, for
subnormals too, and its bits depend on nothing but the contributions. The grid only decides
how many words travel; it never changes the result:

>>> x = [np.array([1e30, 1.0], np.float32), np.array([-1e30, 2.0**-149], np.float32)]
>>> g = grid(np.stack([facts([c]) for c in x]), np.dtype(np.float32))
>>> g.words, g.bits, g.wire                # 2**-149 .. 2**100: 250 bits in 5 words of 61
(5, 61, dtype('int64'))
>>> total, mine = np.empty((2, g.words, 2), np.int64)
>>> encode(x[:1], g, total); encode(x[1:], g, mine)      # (two ranks: each encodes its own,
>>> total += mine                                        # and the all-reduce sums them)
>>> decode(total, g, None, "sum", np.empty(2, np.float32)).tolist()   # a float sum gives [0.0, 1.0]
[0.0, 1.0]

Special values (:func:`marks`, one more all-reduce, only where some rank holds one): any NaN,
or +inf with -inf, gives NaN; infinities of one sign give that infinity; an element whose
every contribution is -0.0 sums to -0.0 (IEEE: -0 + -0 = -0), any other zero sum to +0.0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ring import arrays
from ring.arrays import ieee_floating_point, restore_floating_point
from ring.compression import BLOCK, blocks

#: The significant bits and the smallest unit (exponent of the smallest subnormal) of each dtype.
PRECISION = {"float16": (11, -24), "bfloat16": (8, -133), "float32": (24, -149), "float64": (53, -1074)}
#: The facts of one rank: [largest exponent, -finest unit, contributions, special (the flags below)].
FACTS = 4
#: The flags of the facts' last column: some value is NaN or infinite; some value is -0.0.
NONFINITE, NEGATIVE_ZERO = 1, 2
#: The float wires, narrowest first, each with the exponent that its sums must stay below (2**emax
#: is past its largest finite value).
FLOAT_WIRES = ((np.dtype(np.float32), 128), (np.dtype(np.float64), 1024))
_NONE = 1 << 20   # an exponent past every dtype's: "no nonzero finite value"
_WINDOW = 62      # bits of the total kept to round it (and a sticky bit): at least p + 2 for float64


@dataclass(frozen=True)
class Grid:
    """The grid every rank agreed on: the unit ``2**bottom``, ``words`` int64 words of ``bits``
    bits per element, ``count`` contributions in all, ``special`` if any is not finite or -0.0,
    the data's ``digits`` and ``lowest`` unit exponent (see PRECISION), the dtype that travels
    (``wire``: int64 words, or a float that holds the one word's sums exactly: see :func:`grid`)
    and ``nonfinite`` if any value is NaN or infinite."""
    bottom: int
    bits: int
    words: int
    count: int
    special: bool
    digits: int
    lowest: int
    wire: np.dtype = np.dtype(np.int64)
    nonfinite: bool = False

    @property
    def marked(self) -> bool:
        """Whether the special results travel apart (:func:`marks`): on int64 words, where some
        value is special; a float wire adds NaN, infinities and signed zeros as IEEE sums do."""
        return self.special and self.wire.kind == "i"


def precision(dtype: np.dtype) -> tuple[int, int]:
    """(significant bits, exponent of the smallest subnormal) of ``dtype``.

    >>> precision(np.dtype(np.float32))
    (24, -149)
    """
    return PRECISION[dtype.name]


def facts(contributions: list) -> np.ndarray:
    """This rank's facts (int64, FACTS of them): |x| < 2**top for every nonzero finite x, each
    such x a multiple of 2**bottom (its unit in the last place), the number of contributions,
    and the flags NONFINITE (some element is NaN or infinite) and NEGATIVE_ZERO (some is -0.0).
    Nothing nonzero: top -_NONE, bottom _NONE.

    >>> facts([np.array([3.0, -0.5], np.float32)]).tolist()     # 3 < 2**2; 0.5's unit is 2**-24
    [2, 24, 1, 0]
    >>> facts([np.array([np.inf, -0.0], np.float32)]).tolist()  # (NONFINITE | NEGATIVE_ZERO)
    [-1048576, -1048576, 1, 3]
    """
    dtype = contributions[0].dtype
    digits, lowest = precision(dtype)
    # The bits shifted left by one drop the sign: as unsigned integers, twice the magnitudes, in
    # the magnitudes' order, the exponent of all ones (inf, NaN) above every finite value. Minus
    # one, a zero wraps to the largest: the minimum is then the least nonzero magnitude. -0.0 is
    # the smallest signed integer. A few integer passes over each block, in cache, find them all.
    bits = 8 * dtype.itemsize
    unsigned, signed = np.dtype(f"uint{bits}"), np.dtype(f"int{bits}")
    one = unsigned.type(1)
    doubled_infinity = unsigned.type(int(np.array(np.inf, np.float32).astype(dtype).view(unsigned)[()]) << 1)
    negative_zero = np.iinfo(signed).min
    largest, least, flags = unsigned.type(0), np.iinfo(unsigned).max, 0
    doubled = _scratch(min(BLOCK, max(x.size for x in contributions)), unsigned, 0)
    for x in contributions:
        raw = x.reshape(-1).view(unsigned)
        for b in blocks(raw.size):
            twice = doubled[:b.stop - b.start]
            np.left_shift(raw[b], one, out=twice)
            most = twice.max()
            if most >= doubled_infinity:
                flags |= NONFINITE
                most = np.max(twice, where=twice < doubled_infinity, initial=0)
            largest = max(largest, most)
            if raw[b].view(signed).min() == negative_zero:
                flags |= NEGATIVE_ZERO
            twice -= one
            least = min(least, twice.min())
    if largest == 0:
        return np.array([-_NONE, -_NONE, len(contributions), flags], np.int64)
    largest, least = np.array([int(largest) >> 1, (int(least) + 1) >> 1], unsigned).view(dtype).astype(np.float64)
    bottom = max(math.frexp(least)[1] - digits, lowest)
    return np.array([math.frexp(largest)[1], -bottom, len(contributions), flags], np.int64)


def _working(x: np.ndarray) -> np.ndarray:
    """``x``, or for a 16-bit float dtype (ml_dtypes' bfloat16 among them) x as float32 (exact)."""
    return x if x.dtype.itemsize > 2 else x.astype(np.float32)


def _negative_zero(zeros: np.ndarray) -> bool:
    return bool(zeros.size) and bool(np.signbit(_working(zeros)).any())


def grid(every: np.ndarray, dtype: np.dtype) -> Grid:
    """The grid that every rank's facts (rows of ``every``) imply for data of ``dtype``.

    Each contribution's integer has at most ``top - bottom`` bits, so each word of it is under
    2**bits in magnitude, and a sum of ``count`` of them under count * 2**bits < 2**63. Where
    ``top - bottom + count.bit_length()`` bits fit a float's significand, and the sums its range
    (bottom at or above its smallest unit, ``top + count.bit_length()`` at most its emax), every
    partial sum of contributions, in any order, is a multiple of 2**bottom that the float holds
    exactly: the narrowest such float is the wire, and x itself (unscaled) its encoding.

    >>> g = grid(np.array([[2, 24, 3, 0], [5, 20, 9, 0]]), np.dtype(np.float32))
    >>> g.bottom, g.count, g.bits, g.words, g.wire   # 2**-24 .. 2**5: 29 bits; 12 contributions: 59 a word
    (-24, 12, 59, 1, dtype('float64'))
    >>> grid(np.array([[5, 0, 2, 0]]), np.dtype(np.float32)).wire   # integers below 2**5: 7 bits
    dtype('float32')
    >>> grid(np.array([[2, 60, 2, 0]]), np.dtype(np.float32)).wire   # 62 + 2 bits: more than 53
    dtype('int64')
    """
    digits, lowest = precision(dtype)
    rows = every.tolist()   # (a few rows: Python's own max and sum are quicker than numpy's here)
    top, bottom = max(r[0] for r in rows), -max(r[1] for r in rows)
    count, flags = sum(r[2] for r in rows), 0
    for r in rows:
        flags |= r[3]
    if top == -_NONE:
        top = bottom = 0
    bits = 63 - count.bit_length()
    words = max(1, -(-(top - bottom) // bits))
    wire = np.dtype(np.int64)
    headroom = count.bit_length()
    for candidate, emax in FLOAT_WIRES:
        significand, smallest = precision(candidate)
        if top - bottom + headroom <= significand and bottom >= smallest and top + headroom <= emax:
            wire = candidate
            break
    return Grid(bottom, bits, words, count, bool(flags), digits, lowest, wire, bool(flags & NONFINITE))


def scale(x: np.ndarray, exponent: int, out: np.ndarray | None = None) -> np.ndarray:
    """``x * 2**exponent`` (float64), in two steps where 2**exponent alone is past float64's range.

    >>> scale(np.array([1.0]), -1074).tolist(), scale(np.array([2.0 ** -1074]), 1074).tolist()
    ([5e-324], [1.0])
    """
    half = exponent // 2 if abs(exponent) > 1000 else 0
    out = np.multiply(x, 2.0 ** (exponent - half), out=out, dtype=np.float64)
    if half:
        out *= 2.0 ** half
    return out


def encode(contributions: list, g: Grid, total: np.ndarray) -> None:
    """``total`` (``g.wire``, ``(words, size)``) = the sum of ``contributions`` on grid ``g``
    (overwritten). int64 words: word j holds the bits ``bits * j`` and up of x / 2**bottom,
    truncated, with x's sign, and non-finite values count as 0 (see :func:`marks`). A float
    wire: the values themselves, summed (exactly: see :func:`grid`), NaN and infinities too.

    >>> g = Grid(bottom=-2, bits=3, words=2, count=2, special=False, digits=24, lowest=-149)
    >>> total = np.empty((2, 2), np.int64); encode([np.array([5.25, -1.0]), np.array([2.0, 0.5])], g, total)
    >>> total.tolist()          # 29 = 3 * 8 + 5 and -4 + 2 = -2 (units of 2**-2, words of 3 bits)
    [[5, -2], [3, 0]]
    >>> g = Grid(bottom=-2, bits=3, words=1, count=2, special=True, digits=24, lowest=-149, wire=np.dtype(np.float32))
    >>> total = np.empty((1, 2), np.float32); encode([np.array([5.25, -0.0]), np.array([2.0, -0.0])], g, total)
    >>> total.tolist()          # (-0.0 + -0.0 is -0.0, as IEEE adds)
    [[7.25, -0.0]]
    """
    quiet = ieee_floating_point()
    try:
        size = min(total.shape[1], BLOCK)
        integers = _scratch(size, np.int64, 0)   # (x's words, before they are added)
        whole = g.wire.kind == "i" and not _fast(g)
        words = _scratch(size, np.float64, 1), _scratch(size, np.float64, 2), integers   # (value, word: whole)
        if whole:
            total[...] = 0   # (the general path adds every word into it)
        for b in blocks(total.shape[1]):   # (block by block: each block of the total stays in cache)
            for i, x in enumerate(contributions):
                x = _working(x.reshape(-1)[b])
                if g.wire.kind == "f":
                    _add(total[0, b], x, first=i == 0)
                elif whole:
                    _encode(x, g, total[:, b], words)
                else:
                    scaled = _scratch(x.size, x.dtype, 1)
                    np.multiply(x, x.dtype.type(2.0 ** -g.bottom), out=scaled)   # (exact: x / 2**bottom)
                    _add(total[0, b], scaled, first=i == 0, words=integers[:x.size])
    finally:
        restore_floating_point(quiet)


#: The first of the scratch slots (``ring.arrays.scratch``) of the codec's blocks: past the
#: executor's and collectives.ops.reproducible's own.
_SCRATCH = 9


def _scratch(size: int, dtype, slot: int) -> np.ndarray:
    """A block's scratch of ``size`` elements of ``dtype``, kept between calls in slot ``slot``
    (0, 1, 2) of this thread's: a fresh one costs a page fault every 4 KiB on each call.

    >>> _scratch(3, np.int64, 0).shape
    (3,)
    """
    return arrays.scratch(_HOST, size, _SCRATCH + slot, np.dtype(dtype))


_HOST = np.empty(0)   # (what tells ring.arrays.scratch that the scratch is numpy's)


def _fast(g: Grid) -> bool:
    """One int64 word whose integers x / 2**bottom come exact from one multiplication in x's own
    dtype (the common case of int64 words)."""
    return g.words == 1 and not g.special and -126 <= g.bottom <= 126


def _add(total: np.ndarray, x: np.ndarray, first: bool, words: np.ndarray | None = None) -> None:
    """``total`` = ``x`` (``first``) or ``total + x``, x cast to total's dtype (through ``words``,
    int64 scratch, where total is integer: numpy's mixed add would compute in float64)."""
    if first:
        np.copyto(total, x, casting="unsafe")
    elif words is None:
        np.add(total, x, out=total, casting="unsafe")
    else:
        np.copyto(words, x, casting="unsafe")
        total += words


def _encode(x: np.ndarray, g: Grid, total: np.ndarray, scratch: tuple) -> None:
    """Add ``x``'s words to ``total``, from the top word down: each the truncated quotient by its
    unit, taken off the value (exactly: they are its leading bits) before the next."""
    value, word, integers = (a[:x.size] for a in scratch)
    np.copyto(value, x)
    if g.special:
        value[~np.isfinite(value)] = 0.0
    for j in range(g.words - 1, -1, -1):
        unit = g.bottom + g.bits * j
        scale(value, -unit, out=word)
        if j:   # (the last word is an integer already: x is a multiple of 2**bottom)
            np.trunc(word, out=word)
        np.copyto(integers, word, casting="unsafe")
        total[j] += integers
        if j:
            value -= scale(word, unit, out=word)


def marks(contributions: list, out: np.ndarray) -> None:
    """``out`` (uint8, ``(2, size)``): per element, the largest of each contribution's mark, whose
    largest over every rank (an all-reduce "max") says the special result (see :func:`decode`).
    Row 0: 3 NaN, 2 +inf, 1 any other value but -0.0, 0 -0.0; row 1 the same with -inf for +inf.

    >>> out = np.zeros((2, 4), np.uint8); marks([np.array([np.inf, -0.0, 0.0, -np.inf])], out); out.tolist()
    [[2, 0, 1, 0], [0, 0, 1, 2]]
    """
    for x in contributions:
        for b in blocks(x.size):
            _mark(_working(x.reshape(-1)[b]), out[:, b])


def _mark(flat: np.ndarray, out: np.ndarray) -> None:
    nan, inf = np.isnan(flat), np.isinf(flat)
    ordinary = ~(nan | inf | ((flat == 0) & np.signbit(flat)))
    for row, infinite in ((0, inf & (flat > 0)), (1, inf & (flat < 0))):
        mark = ordinary.astype(np.uint8)
        mark[infinite] = 2
        mark[nan] = 3
        np.maximum(out[row], mark, out=out[row])


def decode(total: np.ndarray, g: Grid, special: np.ndarray | None, op: str, out: np.ndarray) -> np.ndarray:
    """``out`` (flat, the data's dtype) = the exact sum that ``total`` holds (every rank's
    :func:`encode` summed), divided by ``count`` for "avg", rounded once to nearest, ties to even;
    ``special``: the :func:`marks` of every rank, or None where :attr:`Grid.marked` is not set.
    ``total`` is overwritten.

    >>> g = Grid(bottom=-2, bits=3, words=2, count=3, special=False, digits=24, lowest=-149)
    >>> decode(np.array([[5, -2], [3, 0]]), g, None, "avg", np.empty(2, np.float32)).tolist()
    [2.4166667461395264, -0.1666666716337204]
    >>> g = Grid(bottom=-50, bits=61, words=1, count=2, special=False, digits=24, lowest=-149, wire=np.dtype(np.float64))
    >>> decode(np.array([[1 + 2.0 ** -24 + 2.0 ** -50]]), g, None, "sum", np.empty(1, np.float32)).tolist()   # (above the tie)
    [1.0000001192092896]
    """
    quiet = ieee_floating_point()
    try:
        for b in blocks(out.size):
            if g.wire.kind == "f":
                _decode_float(total[0, b], g, op, out[b])
            else:
                _decode(total[:, b], g, None if special is None else special[:, b], op, out[b])
    finally:
        restore_floating_point(quiet)
    return out


def _decode_float(total: np.ndarray, g: Grid, op: str, out: np.ndarray) -> None:
    """``out`` = the exact sum that a float wire's ``total`` holds, rounded once (see decode)."""
    if op == "sum" and out.dtype.name != "bfloat16":
        np.copyto(out, total, casting="unsafe")   # (the one rounding, from the exact sum: numpy's casts round once)
    else:   # ("avg" divides in integers; ml_dtypes rounds float64 to bfloat16 through float32, twice)
        units = scale(total, -g.bottom)            # (exact: multiples of 2**bottom, under 2**53 of them)
        if g.special:
            units[~np.isfinite(units)] = 0.0
        _decode(units.astype(np.int64)[None], g, None, op, out)
        if g.special:   # (what IEEE sums gave on the wire: NaN, infinities, -0.0 where every one was -0.0)
            kept = ~np.isfinite(total) | ((total == 0) & np.signbit(total))
            out[kept] = total[kept].astype(np.float32)
    if g.nonfinite:
        out[np.isnan(out)] = np.nan   # (one NaN: which payload and sign a float sum keeps depends on the order)


#: The smallest normal exponent of each dtype whose conversion from int64 rounds once (correctly).
_NORMAL = {"float32": -126, "float64": -1022}


def _decode(total: np.ndarray, g: Grid, special: np.ndarray | None, op: str, out: np.ndarray) -> None:
    if g.words == 1 and op == "sum" and g.bottom >= _NORMAL.get(out.dtype.name, 1 << 20):
        np.copyto(out, total[0], casting="unsafe")   # (the one rounding: int64 to float)
        out *= out.dtype.type(2.0 ** g.bottom)         # (exact: nothing lands below the normal range)
        value = out
    elif g.words == 2 and op == "sum" and g.bottom >= _NORMAL.get(out.dtype.name, 1 << 20):
        _two_words(total, g, out)
        value = out
    elif g.words == 1 and op == "avg" and out.dtype == np.float64 and _narrow(total[0]):
        value = scale(total[0], g.bottom)              # (exact: under 2**53 units, normal or not)
        value /= g.count                               # (the one rounding)
    else:
        value = _rounded(total, g, op)
    if special is not None:
        _specials(value, special)
    if value is not out:
        np.copyto(out, value if out.dtype.name != "bfloat16" else value.astype(np.float32), casting="unsafe")


def _two_words(total: np.ndarray, g: Grid, out: np.ndarray) -> None:
    """``out`` = the exact value of two words (``total``, overwritten), rounded once, where no
    result can land below the normal range. The value's leading _WINDOW bits (fewer if it has
    fewer) make one int64, every bit below them folded into its last bit ("round to odd": a window
    with at least two bits past the dtype's precision rounds as the whole value does), and
    numpy's int64 to float conversion rounds that once; the scaling by a power of two is exact.

    >>> g = Grid(bottom=-4, bits=3, words=2, count=2, special=False, digits=24, lowest=-149)
    >>> out = np.empty(2, np.float32); _two_words(np.array([[5, 0], [-1, 2]]), g, out); out.tolist()
    [-0.1875, 1.0]
    """
    _carry(total, g.bits)
    sign = (total[1] >> 63) | 1   # (-1 or 1: a multiplication is quicker than numpy's negative with where=)
    total *= sign
    _carry(total, g.bits)   # now both words are in [0, 2**bits)
    high, low = total[1], total[0]
    shift = np.maximum(_bit_length(high) + (g.bits - _WINDOW), 0)   # (the bits below the window: <= 62)
    right = np.maximum(shift - g.bits, 0)   # (where the window lies within the high word: its bits below)
    window = (high >> right) << np.maximum(g.bits - shift, 0)
    window += low >> shift
    window |= ((low & ((1 << shift) - 1)) | (high & ((1 << right) - 1))) != 0
    np.copyto(out, window, casting="unsafe")   # (the one rounding)
    np.ldexp(out, (shift + g.bottom).astype(np.int32), out=out)   # (int32: numpy's int64 loop is slower)
    out *= sign


def _narrow(words: np.ndarray) -> bool:
    """Every integer of ``words`` converts to float64 exactly (|w| <= 2**53)."""
    return not words.size or max(int(words.max()), -int(words.min())) <= 1 << 53


def _rounded(total: np.ndarray, g: Grid, op: str) -> np.ndarray:
    """The exact value of ``total`` (words of ``g.bits`` bits, units of 2**bottom), divided by the
    count for "avg", rounded to the data's precision, as float64 (exactly the data's value)."""
    _carry(total, g.bits)
    negative = total[-1] < 0
    np.negative(total, out=total, where=negative)
    _carry(total, g.bits)   # now every word is in [0, 2**bits), the top one >= 0
    bottom, sticky = g.bottom, np.zeros(total.shape[1], bool)
    if op == "avg":   # words below the grid first, so that the quotient keeps a window's bits
        below = -(-(_WINDOW + g.count.bit_length()) // g.bits)
        total = np.concatenate([np.zeros((below, total.shape[1]), np.int64), total])
        bottom -= below * g.bits
        sticky = _divide(total, g.bits, g.count)
    window, exponent = _window(total, g.bits, sticky)
    value = _round(window, bottom + exponent, sticky, g.digits, g.lowest)
    return np.negative(value, out=value, where=negative)


def _carry(total: np.ndarray, bits: int) -> None:
    """Carry each word's bits past ``bits`` into the next (the value is unchanged): the lower words
    end in [0, 2**bits), the top one holds the sign."""
    for j in range(total.shape[0] - 1):
        carry = total[j] >> bits
        total[j] -= carry << bits
        total[j + 1] += carry


def _divide(total: np.ndarray, bits: int, count: int) -> np.ndarray:
    """``total`` (nonnegative words) = its value // ``count``, long division from the top word;
    returns where a remainder was left. (remainder * 2**bits + word < count * 2**bits < 2**63.)"""
    remainder = np.zeros(total.shape[1], np.int64)
    for j in range(total.shape[0] - 1, -1, -1):
        dividend = (remainder << bits) + total[j]
        total[j] = dividend // count
        remainder = dividend - total[j] * count
    return remainder != 0


def _bit_length(x: np.ndarray) -> np.ndarray:
    """The bits of each nonnegative int64 of ``x`` (0 for 0).

    >>> _bit_length(np.array([0, 1, 2, 3, 2 ** 53 + 1, 2 ** 62 - 1, 2 ** 63 - 1])).tolist()
    [0, 1, 2, 2, 54, 62, 63]
    """
    # The exponent field of x as a float64 (numpy's frexp is a slow loop); one too many where
    # the conversion rounded up to a power of two.
    length = np.maximum((x.astype(np.float64).view(np.int64) >> 52) - 1022, 0)
    length -= (x >> np.maximum(length - 1, 0)) == 0
    return np.maximum(length, 0, out=length)


def _window(total: np.ndarray, bits: int, sticky: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leading _WINDOW bits of each element's value (nonnegative words), as int64, and the
    exponent of the window's last bit; ``sticky`` is set where a 1 bit was left below it."""
    words = total.shape[0]
    leading = np.full(total.shape[1], -1, np.int64)
    for j in range(words):
        leading[total[j] != 0] = j
    length = np.zeros_like(leading)
    for j in range(words):
        at = leading == j
        length[at] = bits * j + _bit_length(total[j][at])
    exponent = np.maximum(length - _WINDOW, 0)
    window = np.zeros_like(leading)
    for j in range(words):
        shift = bits * j - exponent   # where word j's last bit lands in the window (< 0: below it)
        right = np.clip(-shift, 0, 63)
        window += np.where(shift >= 0, total[j] << np.clip(shift, 0, 62), total[j] >> right)
        below = np.where(right >= 63, total[j], total[j] & ((1 << np.minimum(right, 62)) - 1))
        sticky |= below != 0
    return window, exponent


def _round(window: np.ndarray, exponent: np.ndarray, sticky: np.ndarray, digits: int, lowest: int) -> np.ndarray:
    """``window * 2**exponent`` (plus a little more where ``sticky``) rounded to ``digits``
    significant bits and to a multiple of 2**lowest, to nearest, ties to even, as float64.

    >>> _round(np.array([0b1011, 0b1011, 0b1001]), np.array([0, 0, 0]), np.array([False, True, False]), 3, -149)
    array([12., 12.,  8.])
    """
    drop = np.clip(np.maximum(_bit_length(window) - digits, lowest - exponent), 0, 63)
    kept = window >> drop
    below = window - (kept << np.minimum(drop, 62)) * (drop < 63)
    half = np.where(drop > 0, 1 << np.maximum(drop - 1, 0), 0)
    up = (drop > 0) & ((below > half) | ((below == half) & (sticky | (kept & 1 == 1))))
    kept += up
    return np.ldexp(kept.astype(np.float64), exponent + drop)


def _specials(value: np.ndarray, special: np.ndarray) -> None:
    """Put the special results that every rank's :func:`marks` say into ``value``."""
    positive, negative = special[0], special[1]
    nan = (positive == 3) | (negative == 3) | ((positive == 2) & (negative == 2))
    value[(positive == 0) & (negative == 0)] = -0.0
    value[positive == 2] = np.inf
    value[negative == 2] = -np.inf
    value[nan] = np.nan
