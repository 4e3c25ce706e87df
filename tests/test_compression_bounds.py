"""Tier 1: the error bound of ``compression=`` as docs/api.md states it ("Error bound"), checked
element by element against the exact sum (``fractions``), for every algorithm the runtime may run
a compressed all-reduce with, at every world size n = 1..5, simulated in one process.

The bound, per element, with A = sum_r |x_r| (divided by n for "avg"):

    |result - exact| <= (e^y - 1) A + e^y (r t + d t_data),    y = m u + k eps

u and t: the wire's unit roundoff and half its smallest subnormal (``Codec.digits``, ``Codec.tiny``);
eps and t_data: the same for the data's dtype. m: the most wire roundings one contribution passes
through; k: the most additions and divisions; r: all the wire roundings of the element's partial
sums; d: the divisions by n of "avg". :func:`counts` gives them per algorithm.
"""
import doctest
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ring import algorithms
from ring.compression import CODECS
from tests.support import compression as support_compression
from tests.support.compression import bound, errors
from tests.support.simulated import BOUND, simulate, simulate_hosts


def reduce(inputs, op, codec, algorithm, hosts=1) -> list[np.ndarray]:
    """Every rank's result of ``algorithm`` over ``inputs``, simulated ("doubling": what a small
    compressed call runs, recursive doubling, uncompressed); segments of 3 elements."""
    n = len(inputs)
    if algorithm == "hierarchical":
        def on_hosts(local, across, rank):
            out = np.empty_like(inputs[rank])
            algorithms.allreduce_two_level(local, across, BOUND, inputs[rank], out, op, 3, codec=codec)
            return out
        return simulate_hosts(hosts, n // hosts, on_hosts)

    def body(t):
        out = np.empty_like(inputs[t.rank])
        if algorithm == "doubling":
            assert algorithms.allreduce_small(t, BOUND, inputs[t.rank], out, op, b"bounds")
        else:
            run = algorithms.allreduce if algorithm == "ring" else algorithms.allreduce_halving_doubling
            run(t, BOUND, inputs[t.rank], out, op, 3, codec=codec)
        return out
    return simulate(n, body)


def largest(codec, n, op) -> float:
    """The largest |x_r| drawn: no partial sum may pass the wire's range (fp16: 65504; "avg" sums
    contributions divided by n), and far from it for bf16, which has float32's range."""
    if codec.name == "bf16":
        return 2.0 ** 100
    return 6e4 if op == "avg" else 6e4 / n


@st.composite
def contributions(draw, n, codec, op):
    """Every rank's input, float32 or float64 (1 to 6 elements): zeros of both signs, values below
    the wire's normal range (the data's own subnormals among them), on the wire's subnormal grid and
    halfway between (ties), and normal values of mixed signs and magnitudes."""
    dtype = np.dtype(draw(st.sampled_from([np.float32, np.float64])))
    width = dtype.itemsize * 8
    normal = 2.0 ** (-126 if codec.name == "bf16" else -14)   # the wire's smallest normal value
    big = largest(codec, n, op)
    value = st.one_of(
        st.sampled_from([0.0, -0.0]),
        st.floats(-normal, normal, width=width),
        st.integers(-64, 64).map(lambda j: j * codec.tiny),
        st.floats(-1.0, 1.0, width=width),
        st.floats(-big, big, width=width),
    )
    count = draw(st.integers(1, 6))
    return [np.array(draw(st.lists(value, min_size=count, max_size=count)), dtype) for _ in range(n)]


def assert_within_the_bound(inputs, op, codec, algorithm, hosts=1) -> float:
    """Runs ``algorithm``, checks every rank's bits alike and every element within the bound;
    returns the largest error as a fraction of its bound."""
    results = reduce(inputs, op, codec, algorithm, hosts)
    assert all(r.tobytes() == results[0].tobytes() for r in results), "ranks differ"
    worst = 0.0
    for i, (error, most) in enumerate(zip(errors(inputs, op, results[0]), bound(inputs, op, codec, algorithm, hosts))):
        assert error <= Fraction(most), (f"element {i}: error {float(error):.3g} > bound {most:.3g} "
                                         f"({[float(x[i]) for x in inputs]} -> {float(results[0][i])!r})")
        if most:   # (0: nothing may round, and nothing did)
            worst = max(worst, float(error / Fraction(most)))
    return worst


@pytest.mark.parametrize("n", range(1, 6))
@pytest.mark.parametrize("algorithm", ["ring", "halving", "doubling"])
@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_every_element_is_within_the_documented_bound(n, algorithm, name, op, data):
    codec = CODECS[name]
    assert_within_the_bound(data.draw(contributions(n, codec, op)), op, codec, algorithm)


@pytest.mark.parametrize("hosts, n", [(2, 2), (3, 3), (2, 4), (4, 4), (5, 5)])
@pytest.mark.parametrize("name", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_two_levels_are_within_the_documented_bound(hosts, n, name, op, data):
    codec = CODECS[name]
    assert_within_the_bound(data.draw(contributions(n, codec, op)), op, codec, "hierarchical", hosts)


@pytest.mark.quick
def test_below_the_normal_range_the_error_is_absolute():
    """2**-134 on each of 2 ranks sums, over bf16, to 0, not 2**-133: rank 1's contribution rounds
    to 0 on the wire (a tie, to even) and so does the owner's 0 + 2**-134. The error is all of
    sum |x|, which the relative term alone does not allow; the absolute term does."""
    codec = CODECS["bf16"]
    inputs = [np.full(3, 2.0 ** -134, np.float32)] * 2
    assert np.array_equal(reduce(inputs, "sum", codec, "ring")[0], np.zeros(3, np.float32))
    assert assert_within_the_bound(inputs, "sum", codec, "ring") > 0.98
    relative_part = np.expm1(2 * 2.0 ** -8 + 2.0 ** -24) * 2.0 ** -133
    assert 2.0 ** -133 > relative_part


@pytest.mark.quick
def test_the_absolute_term_of_avg_is_not_divided_by_n():
    """fp16 "avg" divides each contribution by n first, then rounds the pre-scaled partial sums at
    float16's own spacing: 2 roundings of up to 2**-25 each, not 2 / n of them. 4.348152e-06 on 2
    ranks: 2.174076e-06 rounds down by 2.84e-08 (36.48 units of 2**-24 to 36), the owner's sum
    4.319e-06 by 2.82e-08 again (72.48 to 72): the mean comes out 4.2915344e-06, 5.66e-08 off."""
    codec = CODECS["fp16"]
    inputs = [np.array([4.348152288002893e-06], np.float32)] * 2
    result = reduce(inputs, "avg", codec, "ring")[0]
    assert result[0] == np.float32(4.2915344e-06)
    error = float(errors(inputs, "avg", result)[0])
    assert error > 2.0 ** -25 + np.expm1(2 * 2.0 ** -11 + 2 * 2.0 ** -24) * 4.35e-06   # (r t / n: too little)
    assert assert_within_the_bound(inputs, "avg", codec, "ring") > 0.85


@pytest.mark.quick
def test_the_worked_examples_of_the_bound_hold():
    """The examples of the bound's counts (tests/support/compression.py; tests/test_doctests.py runs
    those of the packages only)."""
    result = doctest.testmod(support_compression, extraglobs={"np": np, "CODECS": CODECS})
    assert result.attempted > 0 and result.failed == 0
