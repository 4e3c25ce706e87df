"""Tier 1: the reproducible sum's codec (ring/reproducible.py) against exact sums in fractions.

Contributions are dealt to simulated ranks: each rank's facts go into one grid, each rank encodes
its own contributions, the integer totals are summed (as the ring's integer all-reduce does),
and the decoded result must be the exact sum rounded once to nearest (ties to even), with the
same bits however the contributions were dealt.
"""
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ring import reproducible, rounding
from tests.support.reproducible import dealt, exact, reduce_simulated, simulated


ml_dtypes = pytest.importorskip("ml_dtypes")
DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float64": np.float64}


def values(dtype: str):
    """Finite values of ``dtype``: any bit pattern, so subnormals, zeros of both signs, the largest."""
    bits = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}[dtype]
    view = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]

    def finite(pattern: int):
        v = np.array([pattern], view).view(DTYPES[dtype])[0]
        return v if np.isfinite(float(v)) else DTYPES[dtype](0.0)
    scaled = st.floats(-1e3, 1e3).map(lambda f: DTYPES[dtype](f))
    return st.one_of(st.integers(0, 2 ** bits - 1).map(finite), scaled)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_exact_sum_rounded_once_whoever_holds_what(dtype, op, data):
    k = data.draw(st.integers(1, 12))
    width = data.draw(st.integers(1, 4))
    contributions = [np.array(data.draw(st.lists(values(dtype), min_size=width, max_size=width)), DTYPES[dtype])
                     for _ in range(k)]
    if data.draw(st.booleans()):   # cancellation: the last contribution takes back most of the others
        contributions.append(-contributions[0])
    expected = np.array([exact(contributions, i, dtype, op) for i in range(width)], DTYPES[dtype])
    results = [reduce_simulated(dealt(contributions, n, way), op)
               for n in range(1, min(4, len(contributions)) + 1) for way in range(3)]
    for result in results:
        assert result.tobytes() == expected.tobytes(), (result, expected, contributions)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_float_wire_gives_the_bits_of_the_integer_words(dtype, op, data):
    """Where the grid's span fits a float's significand the words travel as that float (the sums
    of values on the grid are then exact in it): the bits of the int64 words, specials included.
    (Not float64 data: the unit in the last place of its smallest value is 2**-52 of it, so the
    span and the headroom never fit float64's 53 bits.)"""
    k = data.draw(st.integers(1, 12))
    scale = data.draw(st.sampled_from([1.0, 2.0 ** -8]))
    element = st.one_of(st.integers(-6400, 6400).map(lambda i: i / 64 * scale),   # (2**-14 .. 2**7)
                        st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan]))
    contributions = [np.array(data.draw(st.lists(element, min_size=3, max_size=3)), DTYPES[dtype]) for _ in range(k)]
    held = dealt(contributions, min(k, 3), 0)
    g = reproducible.grid(np.stack([reproducible.facts(h) for h in held]), np.dtype(DTYPES[dtype]))
    words = replace(g, wire_dtype=np.dtype(np.int64))
    assert g.wire_dtype.kind == "f", g
    assert simulated(held, g, op).tobytes() == simulated(held, words, op).tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_two_words_round_through_a_window_as_the_whole_integer_does(dtype, data):
    """The quick decoding of two int64 words (the leading 62 bits, the rest folded into the last
    one) against the general one (every bit carried into a window and rounded in integers), on
    any words that a sum of ``count`` contributions can hold, overflow to infinity included."""
    count = data.draw(st.integers(1, 12))
    bits = 63 - count.bit_length()
    word = st.integers(-(count << bits) + 1, (count << bits) - 1)
    words = data.draw(st.lists(st.tuples(word, word), min_size=1, max_size=8))
    digits, lowest = reproducible.PRECISION[dtype]
    bottom = data.draw(st.integers(-126, 20) if dtype == "float32" else st.integers(-1022, 1000))
    total = np.array(words, np.int64).T.copy()
    quick = np.empty(total.shape[1], dtype)
    with np.errstate(over="ignore"):   # (an infinity is the rounding's result)
        rounding.two_words(total.copy(), bits, bottom, quick)
        general = rounding.rounded(total, bits, bottom, 1, digits, lowest).astype(dtype)
    assert quick.tobytes() == general.tobytes(), (words, quick, general)


def test_cancellation_leaves_the_smallest_contribution_exactly():
    x = [np.array([1e30, 3.0], np.float32), np.array([2.0 ** -149, -3.0], np.float32),
         np.array([-1e30, -0.0], np.float32)]
    assert reduce_simulated([x]).tolist() == [2.0 ** -149, 0.0]
    assert not np.signbit(reduce_simulated([x])[1])   # 3 - 3 - 0 is +0, as IEEE adds


def test_a_tie_goes_to_even_once_not_twice():
    """1 + 2**-24 + 2**-60 rounds up in float32 (above the tie); float64 first would round twice."""
    x = [np.array([1.0]), np.array([2.0 ** -24]), np.array([2.0 ** -60])]
    assert reduce_simulated([[c.astype(np.float32) for c in x]])[0] == np.float32(1 + 2.0 ** -23)


@pytest.mark.parametrize("parts, expected", [
    ([[np.nan, 1.0]], np.nan), ([[np.inf, -np.inf]], np.nan), ([[np.inf, 1e30]], np.inf),
    ([[-np.inf, -np.inf]], -np.inf), ([[-0.0, -0.0]], -0.0), ([[-0.0, 0.0]], 0.0), ([[1.0, -1.0]], 0.0)])
def test_special_values_as_ieee_sums_give_them(parts, expected):
    held = [[np.array([v], np.float32) for v in p] for p in parts]
    got = reduce_simulated(held)[0]
    assert np.array_equal(got, np.float32(expected), equal_nan=True) and np.signbit(got) == np.signbit(expected)


def test_an_exact_sum_past_the_largest_finite_is_infinite_and_one_that_comes_back_is_not():
    big = np.float32(3e38)
    assert reduce_simulated([[np.array([big]), np.array([big])]])[0] == np.inf
    assert reduce_simulated([[np.array([big]), np.array([big]), np.array([-big])]])[0] == big


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_facts_read_from_the_bits_are_those_of_the_values(dtype, data):
    """``facts`` reads magnitudes from the bits (sign cleared: integer order is magnitude order);
    here against the values themselves, any bit pattern, NaN and infinities among them."""
    bits = 8 * np.dtype(DTYPES[dtype]).itemsize
    view = {16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]
    patterns = data.draw(st.lists(st.lists(st.integers(0, 2 ** bits - 1), min_size=1, max_size=6), min_size=1,
                                  max_size=3))
    contributions = [np.array(p, view).view(DTYPES[dtype]) for p in patterns]
    every = np.concatenate([c.astype(np.float64) for c in contributions])
    sizes = np.abs(every[np.isfinite(every) & (every != 0)])
    special = (reproducible.NONFINITE * bool((~np.isfinite(every)).any())
               | reproducible.NEGATIVE_ZERO * bool(((every == 0) & np.signbit(every)).any()))
    digits, lowest = reproducible.PRECISION[dtype]
    expected = [-(1 << 20), -(1 << 20)] if not sizes.size else \
        [int(np.frexp(sizes.max())[1]), -max(int(np.frexp(sizes.min())[1]) - digits, lowest)]
    assert reproducible.facts(contributions).tolist() == [*expected, len(contributions), special]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_where_one_rounding_holds_the_plain_float_sum_is_the_exact_sum_rounded_once(dtype, op, data):
    """Two contributions (or one) need no grid: one IEEE addition rounds their exact sum once, and
    halving it ("avg", as the plain all-reduce divides) is exact or rounds once, unless the sum
    overflowed: ``one_rounding`` must say so from either rank's outline, and only then."""
    info = np.finfo(dtype)
    edges = [info.max, info.max / 2, 1.5 * (info.max / 2 + info.eps * info.max / 4), info.tiny, info.smallest_subnormal,
             3 * info.smallest_subnormal, 1.0, info.eps / 2, 1 + info.eps]   # (ties: 1 + eps/2 and 1 + eps + eps/2)
    element = st.one_of(values(dtype), st.sampled_from(edges + [-e for e in edges]).map(DTYPES[dtype]))
    width = data.draw(st.integers(1, 4))
    pair = [np.array(data.draw(st.lists(element, min_size=width, max_size=width)), DTYPES[dtype])
            for _ in range(data.draw(st.integers(1, 2)))]
    ranks = data.draw(st.integers(1, len(pair)))
    every = np.stack([reproducible.outline(h) for h in dealt(pair, ranks, 0)])
    held = reproducible.one_rounding(every, np.dtype(dtype), op)
    emax = {"float32": 128, "float64": 1024}[dtype]
    largest = max(float(np.abs(p).max()) for p in pair)
    assert held == (op == "sum" or largest < 2.0 ** (emax - 1)), (every, op)
    if held:
        with np.errstate(over="ignore"):
            plain = pair[0] + pair[1] if len(pair) == 2 else pair[0].copy()
            if op == "avg":
                plain /= len(pair)
        expected = np.array([exact(pair, i, dtype, op) for i in range(width)], DTYPES[dtype])
        assert plain.tobytes() == expected.tobytes(), (pair, plain, expected)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_the_outline_reads_the_facts_that_one_rounding_needs(dtype, data):
    """``outline`` (two reads) gives the top, count and NONFINITE flag that ``facts`` gives, any
    bit pattern, NaN and infinities among them (there it needs no top: one rounding does not hold),
    for one or two contributions; more, the count alone."""
    bits = 8 * np.dtype(dtype).itemsize
    view = {32: np.uint32, 64: np.uint64}[bits]
    patterns = data.draw(st.lists(st.lists(st.integers(0, 2 ** bits - 1), min_size=1, max_size=6), min_size=1,
                                  max_size=3))
    contributions = [np.array(p, view).view(dtype) for p in patterns]
    outline, facts = reproducible.outline(contributions), reproducible.facts(contributions)
    if len(contributions) > 2:   # (one rounding cannot hold: nothing is read)
        assert outline.tolist() == [-(1 << 20), 0, len(contributions), 0]
        return
    assert outline[2:].tolist() == [facts[2], facts[3] & reproducible.NONFINITE]
    assert outline[3] or outline[0] == facts[0]
