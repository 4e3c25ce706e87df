"""Tier 2: ``allreduce(x, reproducible=True)`` in real worlds of 1 to 4 ranks (tests/test_worlds.py).

Twelve fixed contributions are dealt to the world's ranks three ways; every world, every deal,
every algorithm must give the exact sum rounded once (computed here in fractions), so the same
digest at any world size. Every check is agreed across ranks, so a failure on one fails all.
"""
import hashlib

import numpy as np
import pytest

import collectives as col
from collectives.errors import CollectiveUsageError
from collectives.ops import reproducible
from tests.support.in_world import N, RANK, agree
from tests.support.reproducible import dealt, exact, reduce_simulated

pytestmark = pytest.mark.mpi

BOUND_S = 60
#: sha256 of the float32 and float64 sums of the twelve contributions: the same at every world size.
DIGESTS = {"float32": "310a0a13a096939a8d6c5142047ab428c1194935de15d717e7ba90a94fff7355",
           "float64": "2d39a1109d876123f1afcdfb881f8b53cbdf0c060415a0df4821b1c7cef3c8b1"}


def twelve(count: int, dtype) -> list[np.ndarray]:
    """Twelve fixed contributions: mixed signs and magnitudes, one that cancels another, subnormals
    and zeros of both signs, so that a float sum's order shows in its bits."""
    rng = np.random.default_rng([62, count])
    parts = [rng.standard_normal(count) * 10.0 ** rng.integers(-6, 7, count) for _ in range(10)]
    parts.append(-parts[3] + rng.standard_normal(count) * 1e-3)
    tiny = np.finfo(dtype).smallest_subnormal * rng.integers(-3, 4, count)
    parts.append(np.where(np.arange(count) % 5 == 0, -0.0, tiny))
    return [p.astype(dtype) for p in parts]


def digest(x: np.ndarray) -> str:
    return hashlib.sha256(x.tobytes()).hexdigest()


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_twelve_contributions_give_the_exact_sum_at_any_size_and_deal(dtype, op):
    parts = twelve(257, dtype)
    expected = np.array([exact(parts, i, dtype, op) for i in range(257)], dtype)
    for way in range(3):
        mine = dealt(parts, N, way)[RANK]
        result = col.allreduce(mine, op, reproducible=True, timeout=BOUND_S)
        agree(result.tobytes() == expected.tobytes(), f"{dtype} {op}, deal {way}: not the exact sum rounded once")
        if op == "sum" and DIGESTS[dtype]:
            agree(digest(result) == DIGESTS[dtype], f"{dtype}: digest {digest(result)}")


@pytest.mark.parametrize("algorithm", ["ring", "halving", None])
def test_every_algorithm_and_size_gives_the_same_bits(algorithm):
    for count in (1, 1001, 70_001):   # (the last: past recursive doubling's bytes)
        parts = twelve(count, "float32")
        expected = reduce_simulated([parts])
        for way in (0, 2):
            result = col.allreduce(dealt(parts, N, way)[RANK], reproducible=True, algorithm=algorithm,
                                   timeout=BOUND_S)
            agree(result.tobytes() == expected.tobytes(), f"{algorithm} x {count}, deal {way}: other bits")


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_ring_that_rounds_between_its_halves_gives_the_same_bits(dtype, op):
    """Past recursive doubling's sizes each rank rounds its own chunk of the exact total and the
    chunks go round in the data's dtype: float32 normal data on a float64 wire, the twelve's wide
    float64 on several int64 words, a NaN and -0.0 among them; sizes that the ranks do not divide."""
    for count in (70_001, 5):
        parts = twelve(count, dtype) if dtype == "float64" else \
            [np.random.default_rng([62, k]).standard_normal(count).astype(dtype) for k in range(12)]
        parts[1][:2] = [np.nan, -0.0]
        parts[2][1] = -0.0
        expected = reduce_simulated([parts], op)
        result = col.allreduce(dealt(parts, N, 1)[RANK], op, reproducible=True, algorithm="ring", timeout=BOUND_S)
        agree(result.tobytes() == expected.tobytes(), f"{dtype} {op} x {count}: other bits")


@pytest.mark.parametrize("algorithm", ["ring", None, "halving"])
def test_one_float32_contribution_per_rank_cast_while_its_facts_are_read(algorithm):
    """One float32 contribution on each rank is cast to float64 as its facts are read (its grid is
    mostly a float64 wire): normal data, specials among it, and a span too wide for float64 (a
    2**-140 on one rank) whose cast is dropped for int64 words; small and large, in place too."""
    for count, tiny in ((70_001, False), (70_001, True), (3, False)):
        every = [np.random.default_rng([62, r]).standard_normal(count).astype(np.float32) for r in range(N)]
        every[0][:2] = [np.nan if count > 3 else 1.0, -0.0]
        every[-1][1] = -0.0
        if tiny:
            every[N // 2][-1] = 2.0 ** -140
        expected = reduce_simulated([[e] for e in every])
        mine = every[RANK].copy()
        result = col.allreduce(mine, out=mine, reproducible=True, algorithm=algorithm, timeout=BOUND_S)
        agree(result.tobytes() == expected.tobytes(), f"{algorithm} x {count}, tiny {tiny}: other bits")


def pair(dtype, count: int, big: bool) -> list[np.ndarray]:
    """Two contributions with the edges of one IEEE addition: ties to even, subnormals,
    cancellation, the largest finite value and a sum past it (``big``: whose "avg" needs the grid)
    or values just below 2**(emax-1) whose sum is the largest."""
    info = np.finfo(dtype)
    half_eps, top = info.eps / 2, info.max if big else info.max / 2   # (below 2**(emax-1): the sum is the largest)
    a = [1.0, 1 + info.eps, 3 * info.smallest_subnormal, info.smallest_subnormal, top, top * 0.75, 1e8, -0.0, 2.0]
    b = [half_eps, half_eps, info.smallest_subnormal, 2 * info.smallest_subnormal, top, -top / 3, 1 - 1e8, -0.0, 0.0]
    rng = np.random.default_rng([62, 2])
    return [np.concatenate([np.array(v, dtype), rng.standard_normal(count).astype(dtype)]) for v in (a, b)]


@pytest.mark.parametrize("op, big", [("sum", True), ("avg", False), ("avg", True)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("algorithm, count", [("ring", 70_001), ("halving", 70_001), (None, 70_001), (None, 0)])
def test_two_contributions_need_no_grid_and_give_the_grids_bits(dtype, op, big, algorithm, count):
    """Two contributions in all (on one rank or one each on two) take the plain all-reduce, which
    encodes nothing: one IEEE addition is their exact sum rounded once (halved: "avg", unless a
    value is so large that the sum could overflow). The grid on one process says the bits, and
    the fractions its edges; on 3 and 4 ranks the others add -0.0 (x + -0.0 is x) and the grid
    gives the same bits on the wire. In place."""
    parts = pair(dtype, count, big)
    if N > 2:
        parts += [np.full_like(parts[0], -0.0)] * (N - 2)
    expected = reduce_simulated([parts], op)
    edges = np.array([exact(parts, i, dtype, op) for i in range(9)], dtype)
    agree(expected[:9].tobytes() == edges.tobytes(), f"the grid on one process: {expected[:9]} against {edges}")
    stages: dict = {}
    reproducible.record_stages(stages)
    try:
        with np.errstate(over="ignore"):
            mine = [p.copy() for p in dealt(parts, N, 1)[RANK]]
            result = col.allreduce(mine if N == 1 else mine[0], op, out=mine[-1], reproducible=True,
                                   algorithm=algorithm, timeout=BOUND_S)
    finally:
        reproducible.record_stages(None)
    agree(result.tobytes() == expected.tobytes(), f"{dtype} {op} {algorithm}: {result[:9]} against {expected[:9]}")
    gridded = N > 2 or (op == "avg" and big)
    agree(("encode" in stages or "decode" in stages) == gridded, f"the grid {'not ' * gridded}used: {sorted(stages)}")


@pytest.mark.parametrize("layout", ["strided x, out a row of its array", "strided x in place", "Fortran x in place",
                                    "strided out", "contiguous in place"])
def test_every_layout_of_x_and_out_gives_the_sum(layout):
    """x and out as the plain call takes them (a strided x, out sharing x's array but no element of
    it, in place on a strided or Fortran-order x), on every path: one rounding on one or two ranks,
    the grid on more; against the grid's sum on one process, in place or not."""
    def mine(r: int) -> np.ndarray:
        return np.random.default_rng([62, r]).standard_normal(6).astype(np.float32) * 10.0 ** r
    expected = reduce_simulated([[mine(r) for r in range(N)]])
    base = np.zeros((6, 7), np.float32)
    base[:, 0] = mine(RANK)
    x, out, shape = {
        "strided x, out a row of its array": (base[:, 0], base[0, 1:7], (6,)),
        "strided x in place": (base[:, 0], base[:, 0], (6,)),
        "Fortran x in place": (np.asfortranarray(mine(RANK).reshape(2, 3)),) * 2 + ((2, 3),),
        "strided out": (mine(RANK), base[:, 3], (6,)),
        "contiguous in place": (mine(RANK),) * 2 + ((6,),),
    }[layout]
    if layout == "Fortran x in place":
        expected = expected.reshape(2, 3)
    result = col.allreduce(x, out=out, reproducible=True, timeout=BOUND_S)
    agree(result is out and out.shape == shape and out.tobytes() == expected.tobytes(),
          f"{layout}: {out.ravel()} against {expected.ravel()}")
    if layout == "strided x, out a row of its array":
        agree(base[:, 0].tobytes() == mine(RANK).tobytes(), "x was written")


def test_special_values_and_signed_zeros_as_ieee_sums_give_them():
    values = [[np.nan, 1.0], [np.inf, -np.inf], [np.inf, 5.0], [-np.inf, -np.inf], [-0.0, -0.0], [-0.0, 0.0]]
    parts = [np.array([v[k % 2] for v in values], np.float32) for k in range(max(4, N))]   # (a part for every rank)
    result = col.allreduce(dealt(parts, N, 1)[RANK], reproducible=True, timeout=BOUND_S)
    expected = np.array([np.nan, np.nan, np.inf, -np.inf, -0.0, 0.0], np.float32)
    agree(np.array_equal(result, expected, equal_nan=True) and (np.signbit(result) == np.signbit(expected))[4:].all(),
          f"got {result.tolist()}")


def test_one_array_in_place_async_and_on_a_group():
    x = np.float32([1e8, 1.0]) * (1 if RANK % 2 else -1) + np.float32([0, RANK])
    expected = reduce_simulated([[np.float32([1e8, 1.0]) * (1 if r % 2 else -1) + np.float32([0, r]) for r in range(N)]])
    work = col.allreduce(x, out=x, reproducible=True, async_op=True, timeout=BOUND_S)
    agree(work.wait(timeout=BOUND_S) is x and x.tobytes() == expected.tobytes(), f"in place, async: {x}")
    half = col.split(RANK % 2)
    mine = [np.float32([r + 0.1]) for r in half.ranks]
    agree(half.allreduce(mine[half.rank()], reproducible=True).tobytes() == reduce_simulated([mine]).tobytes(),
          "on a group")


@pytest.mark.parametrize("case, call, named", [
    ("op", lambda: col.allreduce(np.ones(3), "max", reproducible=True), "allreduce: op: reproducible=True sums"),
    ("integers", lambda: col.allreduce(np.ones(3, np.int32), reproducible=True), "allreduce: x: reproducible=True"),
    ("shapes", lambda: col.allreduce([np.ones(3), np.ones(4)], reproducible=True), "allreduce: x[1]: shape (4,)"),
    ("compression", lambda: col.allreduce(np.ones(3), reproducible=True, compression="bf16"), "compression"),
    ("empty list", lambda: col.allreduce([], reproducible=True), "allreduce: x: is an empty list"),
    ("byte order", lambda: col.allreduce([np.ones(3, ">f8")], reproducible=True), "allreduce: x[0]: dtype >f8 is not"),
    ("not a bool", lambda: col.allreduce(np.ones(3), reproducible=1), "allreduce: reproducible"),
])
def test_bad_input_is_refused_by_name_on_every_rank(case, call, named):
    with pytest.raises(CollectiveUsageError) as raised:
        call()
    agree(named in str(raised.value), f"{case}: {raised.value}")


def test_one_rank_that_passes_other_shapes_or_no_reproducible_fails_every_rank():
    bad = [np.ones(3), np.ones(4 if RANK == 0 else 3)]
    with pytest.raises(CollectiveUsageError) as raised:
        col.allreduce(bad, reproducible=True, timeout=BOUND_S)
    agree("x[1]: shape (4,)" in str(raised.value), str(raised.value))
    if N > 1:
        with pytest.raises(CollectiveUsageError) as raised:
            col.allreduce(np.ones(3), reproducible=RANK == 0, timeout=BOUND_S)
        agree("reproducible differs across ranks" in str(raised.value), str(raised.value))
    agree(np.array_equal(col.allreduce(np.ones(2), reproducible=True), np.full(2, N)), "usable after")
