"""Reproducible sums: each contribution becomes integers on one grid that every rank agreed on.

Pure numpy, no MPI. An all-reduce with ``reproducible=True`` (``collectives.ops.reproducible``)
uses it in three steps around two integer all-reduces:

1. :func:`facts`: what this rank holds (the largest exponent, the finest unit, how many
   contributions, whether any is special); every rank's facts travel to every rank, and
   :func:`grid` makes the one grid they imply: a unit ``2**bottom`` fine enough to hold every
   contribution exactly, and ``words`` int64 words per element of ``bits`` bits each, with
   headroom for the sum of every contribution. Where the grid's whole span, headroom included,
   fits a float's significand (float32's 24 bits, float64's 53), the grid's one word travels as
   that float instead (``Grid.wire_dtype``): every float sum of values on the grid is then exact,
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
>>> g.words, g.bits, g.wire_dtype                # 2**-149 .. 2**100: 250 bits in 5 words of 61
(5, 61, dtype('int64'))
>>> total, mine = np.empty((2, g.words, 2), np.int64)
>>> encode(x[:1], g, total); encode(x[1:], g, mine)      # (two ranks: each encodes its own,
>>> total += mine                                        # and the all-reduce sums them)
>>> decode(total, g, None, "sum", np.empty(2, np.float32)).tolist()   # a float sum gives [0.0, 1.0]
[0.0, 1.0]

Two contributions in all need none of this: one IEEE addition rounds their exact sum once
already, whichever adds them (:func:`one_rounding`, which an :func:`outline` of the data decides).

Special values as IEEE sums give them: a float wire adds them; int64 words need one more all-reduce
(``ring.special_values``). Decoding several words is ``ring.rounding``'s (exact integer rounding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ring import arrays, rounding, special_values
from ring.arrays import ieee_floating_point, restore_floating_point
from ring.compression import BLOCK, blocks
from ring.special_values import marks, working   # (marks: re-exported, the codec's step for specials)

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


@dataclass(frozen=True)
class Grid:
    """The grid every rank agreed on: the unit ``2**bottom``, ``words`` int64 words of ``bits``
    bits per element, ``count`` contributions in all, ``special`` if any is not finite or -0.0,
    the data's ``digits`` and ``lowest`` unit exponent (see PRECISION), the dtype that travels
    (``wire_dtype``: int64 words, or a float that holds the one word's sums exactly: see :func:`grid`)
    and ``nonfinite`` if any value is NaN or infinite."""
    bottom: int
    bits: int
    words: int
    count: int
    special: bool
    digits: int
    lowest: int
    wire_dtype: np.dtype = np.dtype(np.int64)
    nonfinite: bool = False

    @property
    def marked(self) -> bool:
        """Whether the special results travel apart (:func:`marks`): on int64 words, where some
        value is special; a float wire adds NaN, infinities and signed zeros as IEEE sums do."""
        return self.special and self.wire_dtype.kind == "i"


def precision(dtype: np.dtype) -> tuple[int, int]:
    """(significant bits, exponent of the smallest subnormal) of ``dtype``.

    >>> precision(np.dtype(np.float32))
    (24, -149)
    """
    return PRECISION[dtype.name]


def facts(contributions: list, cast: np.ndarray | None = None) -> np.ndarray:
    """This rank's facts (int64, FACTS of them): |x| < 2**top for every nonzero finite x, each
    such x a multiple of 2**bottom (its unit in the last place), the number of contributions,
    and the flags NONFINITE (some element is NaN or infinite) and NEGATIVE_ZERO (some is -0.0).
    Nothing nonzero: top -_NONE, bottom _NONE. ``cast`` (one contribution): x is copied into it
    too, block by block as the facts read it: a float wire's encoding, for one read of x.

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
            if cast is not None:
                np.copyto(cast[b], x.reshape(-1)[b], casting="unsafe")
    if largest == 0:
        return np.array([-_NONE, -_NONE, len(contributions), flags], np.int64)
    largest, least = np.array([int(largest) >> 1, (int(least) + 1) >> 1], unsigned).view(dtype).astype(np.float64)
    bottom = max(math.frexp(least)[1] - digits, lowest)
    return np.array([math.frexp(largest)[1], -bottom, len(contributions), flags], np.int64)


def outline(contributions: list) -> np.ndarray:
    """The facts that :func:`one_rounding` reads, from the largest and the least value of each
    block of each contribution (two reads, nothing written: about a third of :func:`facts`' time):
    [top, 0, contributions, NONFINITE or 0]; the finest unit and -0.0 are not looked for, nor the
    top of a block that holds NaN or an infinity (one rounding does not hold then).

    Where they are more than two, one rounding cannot hold whatever the others hold: the count
    alone, nothing read.

    >>> outline([np.array([3.0, -5.0], np.float32), np.array([np.nan], np.float32)]).tolist()
    [3, 0, 2, 1]
    """
    top, flags = -_NONE, 0
    for x in contributions if len(contributions) <= 2 else ():
        flat = x.reshape(-1)
        for b in blocks(flat.size):
            most, least = flat[b].max(), flat[b].min()
            if not (np.isfinite(most) and np.isfinite(least)):
                flags |= NONFINITE
            elif most or least:
                top = max(top, math.frexp(max(float(most), -float(least)))[1])
    return np.array([top, 0, len(contributions), flags], np.int64)


def one_rounding(every: np.ndarray, dtype: np.dtype, op: str) -> bool:
    """Whether a plain all-reduce already gives the reproducible result, given every rank's facts
    (or :func:`outline`): two contributions in all, or one. One IEEE addition of two floats rounds
    their exact sum once, to nearest, ties to even, whichever adds them, and gives the infinities'
    and zeros' signs as the grid does; so does one division by 2 of that sum, where no value is at
    2**(emax-1) or above (the sum cannot overflow) and the sum is in the normal range (halving
    there commutes with rounding) or below 2**(emin+1), where it was exact. float32 and float64
    only (numpy's own arithmetic), and nothing NaN or infinite (a NaN's payload would depend on
    the order).

    >>> one_rounding(np.array([[3, 9, 1, 0], [5, 20, 1, 0]]), np.dtype(np.float32), "avg")
    True
    >>> one_rounding(np.array([[128, 9, 1, 0], [5, 20, 1, 0]]), np.dtype(np.float32), "avg")  # 2**127 <= |x|
    False
    >>> one_rounding(np.array([[3, 9, 2, 0], [5, 20, 1, 0]]), np.dtype(np.float32), "sum")   # three in all
    False
    """
    emax = dict((wire.name, e) for wire, e in FLOAT_WIRES).get(dtype.name)
    rows = every.tolist()
    flags = 0
    for r in rows:
        flags |= r[3]
    return (emax is not None and sum(r[2] for r in rows) <= 2 and not flags & NONFINITE
            and (op == "sum" or max(r[0] for r in rows) < emax))


def outline_first(ranks: int, dtype: np.dtype, held: int) -> bool:
    """Whether a call on ``ranks`` ranks, ``held`` contributions on this one, outlines its data
    (:func:`outline`) and exchanges that before its facts: where :func:`one_rounding` may hold,
    on two ranks or one (there, with two contributions at most), float32 or float64. An outline
    costs about a third of the facts (a fifth for small data, 10 us against 30 for 1024 elements
    here): where one rounding holds it is all that is read; where it does not, the facts follow
    in one more small exchange.

    >>> outline_first(2, np.dtype(np.float32), 1), outline_first(3, np.dtype(np.float32), 1)
    (True, False)
    >>> outline_first(1, np.dtype(np.float32), 3), outline_first(2, np.dtype(np.float32), 3)  # (the other decides too)
    (False, True)
    """
    return (ranks == 2 or ranks == 1 and held <= 2) and dtype.name in ("float32", "float64")


def grid(every: np.ndarray, dtype: np.dtype) -> Grid:
    """The grid that every rank's facts (rows of ``every``) imply for data of ``dtype``.

    Each contribution's integer has at most ``top - bottom`` bits, so each word of it is under
    2**bits in magnitude, and a sum of ``count`` of them under count * 2**bits < 2**63. Where
    ``top - bottom + count.bit_length()`` bits fit a float's significand, and the sums its range
    (bottom at or above its smallest unit, ``top + count.bit_length()`` at most its emax), every
    partial sum of contributions, in any order, is a multiple of 2**bottom that the float holds
    exactly: the narrowest such float is the wire, and x itself (unscaled) its encoding.

    >>> g = grid(np.array([[2, 24, 3, 0], [5, 20, 9, 0]]), np.dtype(np.float32))
    >>> g.bottom, g.count, g.bits, g.words, g.wire_dtype   # 2**-24 .. 2**5: 29 bits; 12 contributions: 59 a word
    (-24, 12, 59, 1, dtype('float64'))
    >>> grid(np.array([[5, 0, 2, 0]]), np.dtype(np.float32)).wire_dtype   # integers below 2**5: 7 bits
    dtype('float32')
    >>> grid(np.array([[2, 60, 2, 0]]), np.dtype(np.float32)).wire_dtype   # 62 + 2 bits: more than 53
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
    wire_dtype = np.dtype(np.int64)
    headroom = count.bit_length()
    for candidate, emax in FLOAT_WIRES:
        significand, smallest = precision(candidate)
        if top - bottom + headroom <= significand and bottom >= smallest and top + headroom <= emax:
            wire_dtype = candidate
            break
    return Grid(bottom, bits, words, count, bool(flags), digits, lowest, wire_dtype, bool(flags & NONFINITE))


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
    """``total`` (``g.wire_dtype``, ``(words, size)``) = the sum of ``contributions`` on grid ``g``
    (overwritten). int64 words: word j holds the bits ``bits * j`` and up of x / 2**bottom,
    truncated, with x's sign, and non-finite values count as 0 (see :func:`marks`). A float
    wire: the values themselves, summed (exactly: see :func:`grid`), NaN and infinities too.

    >>> g = Grid(bottom=-2, bits=3, words=2, count=2, special=False, digits=24, lowest=-149)
    >>> total = np.empty((2, 2), np.int64); encode([np.array([5.25, -1.0]), np.array([2.0, 0.5])], g, total)
    >>> total.tolist()          # 29 = 3 * 8 + 5 and -4 + 2 = -2 (units of 2**-2, words of 3 bits)
    [[5, -2], [3, 0]]
    >>> g = Grid(bottom=-2, bits=3, words=1, count=2, special=True, digits=24, lowest=-149, wire_dtype=np.dtype(np.float32))
    >>> total = np.empty((1, 2), np.float32); encode([np.array([5.25, -0.0]), np.array([2.0, -0.0])], g, total)
    >>> total.tolist()          # (-0.0 + -0.0 is -0.0, as IEEE adds)
    [[7.25, -0.0]]
    """
    quiet = ieee_floating_point()
    try:
        size = min(total.shape[1], BLOCK)
        integers = _scratch(size, np.int64, 0)   # (x's words, before they are added)
        whole = g.wire_dtype.kind == "i" and not _fast(g)
        words = _scratch(size, np.float64, 1), _scratch(size, np.float64, 2), integers   # (value, word: whole)
        if whole:
            total[...] = 0   # (the general path adds every word into it)
        for b in blocks(total.shape[1]):   # (block by block: each block of the total stays in cache)
            for i, x in enumerate(contributions):
                x = working(x.reshape(-1)[b])
                if g.wire_dtype.kind == "f":
                    _add(total[0, b], x, first=i == 0)
                elif whole:
                    _encode(x, g, total[:, b], words)
                else:
                    scaled = _scratch(x.size, x.dtype, 1)
                    np.multiply(x, x.dtype.type(2.0 ** -g.bottom), out=scaled)   # (exact: x / 2**bottom)
                    _add(total[0, b], scaled, first=i == 0, words=integers[:x.size])
    finally:
        restore_floating_point(quiet)


_SCRATCH = 9   # (the codec's first scratch slot, past the executor's and the op's own)


def _scratch(size: int, dtype, slot: int) -> np.ndarray:
    """A block's scratch of ``size`` elements of ``dtype``, kept between calls in slot ``slot``
    (0, 1, 2) of this thread's: a fresh one costs a page fault every 4 KiB on each call.

    >>> _scratch(3, np.int64, 0).shape
    (3,)
    """
    return arrays.scratch(np.empty(0), size, _SCRATCH + slot, np.dtype(dtype))   # (numpy's scratch)


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


def decode(total: np.ndarray, g: Grid, special: np.ndarray | None, op: str, out: np.ndarray) -> np.ndarray:
    """``out`` (flat, the data's dtype) = the exact sum that ``total`` holds (every rank's
    :func:`encode` summed), divided by ``count`` for "avg", rounded once to nearest, ties to even;
    ``special``: the :func:`marks` of every rank, or None where :attr:`Grid.marked` is not set.
    ``total`` is overwritten.

    >>> g = Grid(bottom=-2, bits=3, words=2, count=3, special=False, digits=24, lowest=-149)
    >>> decode(np.array([[5, -2], [3, 0]]), g, None, "avg", np.empty(2, np.float32)).tolist()
    [2.4166667461395264, -0.1666666716337204]
    >>> g = Grid(bottom=-50, bits=61, words=1, count=2, special=False, digits=24, lowest=-149, wire_dtype=np.dtype(np.float64))
    >>> decode(np.array([[1 + 2.0 ** -24 + 2.0 ** -50]]), g, None, "sum", np.empty(1, np.float32)).tolist()   # (above the tie)
    [1.0000001192092896]
    """
    quiet = ieee_floating_point()
    try:
        for b in blocks(out.size):
            if g.wire_dtype.kind == "f":
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
        rounding.two_words(total, g.bits, g.bottom, out)
        value = out
    elif g.words == 1 and op == "avg" and out.dtype == np.float64 and _narrow(total[0]):
        value = scale(total[0], g.bottom)              # (exact: under 2**53 units, normal or not)
        value /= g.count                               # (the one rounding)
    else:
        value = rounding.rounded(total, g.bits, g.bottom, g.count if op == "avg" else 1, g.digits, g.lowest)
    if special is not None:
        special_values.put(value, special)
    if value is not out:
        np.copyto(out, value if out.dtype.name != "bfloat16" else value.astype(np.float32), casting="unsafe")


def _narrow(words: np.ndarray) -> bool:
    """Every integer of ``words`` converts to float64 exactly (|w| <= 2**53)."""
    return not words.size or max(int(words.max()), -int(words.min())) <= 1 << 53
