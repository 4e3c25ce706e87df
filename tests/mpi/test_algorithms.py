"""Tier 2: every algorithm of every collective, each forced in turn, against mpi4py's own collectives.

The runtime picks an algorithm per call (``ring.cost``); these tests force each one with the
calls' ``algorithm=`` as COLLECTIVES_ALGORITHM would (the same on every rank; where the
collective lacks it or it cannot carry the call, the ring), so that each is run at every world
size whatever the model would choose: sizes from empty to several segments, uneven splits,
in place and not, and the bits compared across ranks.
"""
import numpy as np
import pytest

import collectives as col
from ring import cost
from tests.support.in_world import COMM, N, RANK, agree, mpi_reference, rank_input, same_on_every_rank


pytestmark = pytest.mark.mpi

SIZES = [0, 1, N + 1, 1001, 40_000]   # 40 000 float64: several 96-byte segments, above small sizes


@pytest.fixture(params=["ring", "halving", "doubling"])
def algorithm(request):
    col.init(segment_bytes=96)   # many segments per message: the segmented schedules too
    yield request.param
    col.init(segment_bytes=0)   # (the defaults)


def forced(algorithm: str, collective: str, nbytes: int) -> str:
    """What COLLECTIVES_ALGORITHM=algorithm runs for this call: the algorithm where the collective
    has it and it can carry ``nbytes`` (an allgather: every rank's rows and counts), else the ring."""
    return algorithm if algorithm in cost.candidates(collective, nbytes, col.settings().small_bytes) else "ring"


def gathered(x: np.ndarray) -> int:
    return N * (x.nbytes + 16)   # (what allgather's choice is made for: see collectives.ops.bodies)


@pytest.mark.parametrize("op, dtype", [("sum", "float64"), ("max", "int32"), ("avg", "float32"),
                                       ("avg", "float16"), ("prod", "uint8")])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
def test_allreduce(algorithm, op, dtype, in_place):
    for count in SIZES:
        x = rank_input(count, dtype, op)
        expected = mpi_reference(x, op)
        chosen = forced(algorithm, "allreduce", x.nbytes)
        result = col.allreduce(x, op, out=x if in_place else None, algorithm=chosen)
        close = np.allclose(result.astype(float), expected.astype(float), rtol=4e-3) if dtype == "float16" \
            else np.array_equal(result, expected)
        agree(close, f"{algorithm} {op} {dtype} count={count}: differs from MPI")
        agree(same_on_every_rank(result), f"{algorithm} {op} {dtype} count={count}: ranks got different bits")


def test_the_forced_algorithm_is_the_one_that_runs(algorithm):
    x = np.ones(1000, np.uint8)
    work = col.allreduce(x, algorithm=algorithm, async_op=True)
    work.wait()
    agree(work.algorithm == algorithm, f"{algorithm} was forced, {work.algorithm} ran")


@pytest.mark.parametrize("count", [0, 1, N + 1, 1001, 40_001])
def test_reduce_scatter(algorithm, count):
    x = rank_input(count, "int64", "sum")
    block = np.array_split(mpi_reference(x, "sum"), N)[RANK]
    result = col.reduce_scatter(x, algorithm=forced(algorithm, "reduce_scatter", x.nbytes))
    agree(np.array_equal(result, block), f"{algorithm} reduce_scatter count={count}: differs")


@pytest.mark.parametrize("rows", [0, 1, 3, 700])
def test_allgather_with_uneven_rows(algorithm, rows):
    x = np.full((rows + RANK % 2 * (rows // 3 + 1), 3), RANK * 1.5 - 0.25, np.float32)
    x[:, 1] = -0.0
    expected = np.concatenate(COMM.allgather(x))
    result = col.allgather(x, algorithm=forced(algorithm, "allgather", gathered(x)))
    agree(result.tobytes() == expected.tobytes(), f"{algorithm} allgather rows={rows}: differs from MPI")


def test_allgather_keeps_every_bit(algorithm):
    """The doubling all-gather combines by bitwise or: NaN payloads and -0.0 must come through."""
    x = np.array([np.nan, -0.0, 5e-324, RANK], np.float64).view(np.uint64)
    x[0] |= RANK + 1
    expected = np.concatenate(COMM.allgather(x))
    result = col.allgather(x.view(np.float64), algorithm=forced(algorithm, "allgather", gathered(x)))
    agree(result.view(np.uint64).tobytes() == expected.tobytes(),
          f"{algorithm}: an all-gathered bit changed")


def test_every_algorithm_is_known_to_the_model():
    for op, algorithms in cost.ALGORITHMS.items():
        for name in algorithms:
            assert cost.predict(op, name, max(N, 2), 4096) > 0


def test_allgather_into_out(algorithm):
    x = np.full((RANK + 1, 2), RANK, np.int32)
    expected = np.concatenate(COMM.allgather(x))
    out = np.full_like(expected, -1)
    chosen = forced(algorithm, "allgather", gathered(x))
    agree(col.allgather(x, out=out, algorithm=chosen) is out and np.array_equal(out, expected),
          f"{algorithm}: out= differs")
    wide = np.zeros((expected.shape[0], 4), np.int32)
    strided = wide[:, ::2]   # not contiguous: written back in place
    agree(col.allgather(x, out=strided, algorithm=chosen) is strided and np.array_equal(wide[:, ::2], expected)
          and not wide[:, 1::2].any(), f"{algorithm}: a strided out= was not filled in place")


def test_allgather_out_of_the_wrong_length_on_one_rank_fails_on_every_rank(algorithm):
    x = np.zeros((2, 3))
    out = np.zeros((2 * N + (1 if RANK == N - 1 else 0), 3))
    with pytest.raises(col.CollectiveUsageError, match=rf"allgather: out: axis 0 must be {2 * N} .* rank\(s\) {N - 1}"):
        col.allgather(x, out=out, algorithm=forced(algorithm, "allgather", gathered(x)))
    agree(np.array_equal(col.allgather(x), np.zeros((2 * N, 3))), "the next call was out of step")


@pytest.mark.parametrize("out, message", [
    (lambda x: x, "out: is x itself"), (lambda x: np.zeros((len(x) * N, 3), np.float32), "out: dtype float32"),
    (lambda x: np.zeros(len(x) * N), "out: expected 2 dimension"), (lambda x: np.zeros((len(x) * N, 4)), "out: shape"),
    (lambda x: [[0.0] * 3] * (len(x) * N), "out: expected None or a numpy.ndarray .* got list"),
    (lambda x: 5, "out: expected None or a numpy.ndarray .* got int"),
])
def test_allgather_refuses_a_bad_out_on_every_rank(out, message):
    x = np.zeros((2, 3))
    bad = out(x) if RANK == 0 else np.zeros((2 * N, 3))
    if N == 1 and message == "out: is x itself":
        bad = x
    with pytest.raises(col.CollectiveUsageError, match=f"allgather: {message}"):
        col.allgather(x, out=bad)


@pytest.mark.parametrize("count", [0, 1, N + 1, 1001, 40_001])
def test_broadcast_from_every_root_keeps_every_bit(algorithm, count):
    """The doubling broadcast combines by bitwise or: NaN payloads, -0.0 and subnormals must arrive
    unchanged, from a read-only root, into a strided buffer elsewhere."""
    bits = (np.arange(count, dtype=np.uint64) * 0x9E3779B97F4A7C15) | np.uint64(0x7FF0000000000001)
    bits[::3] = np.float64(-0.0).view(np.uint64)
    bits[1::5] = 1   # the smallest subnormal
    for root in sorted({0, N - 1}):
        if RANK == root:
            x = bits.view(np.float64).copy()
            x.flags.writeable = False
        else:
            x = np.zeros((count, 2))[:, 0]   # every other element of a wider array
        result = col.broadcast(x, root=root, algorithm=forced(algorithm, "broadcast", x.nbytes))
        agree(np.ascontiguousarray(result).view(np.uint64).tobytes() == bits.tobytes(),
              f"{algorithm} broadcast of {count} from {root}: a bit changed")


@pytest.mark.skipif(N == 1, reason="one rank cannot disagree with itself")
def test_allgather_is_checked_even_with_the_check_off():
    """Its counts exchange carries the signature whatever COLLECTIVES_CHECK says (README)."""
    col.init(check=False)
    try:
        x = np.zeros((2, 3 if RANK == 0 else 4))
        with pytest.raises(col.CollectiveUsageError, match="allgather: .*differs across ranks"):
            col.allgather(x)
        agree(np.array_equal(col.allgather(np.ones((1, 2))), np.ones((N, 2))), "the next call was out of step")
    finally:
        col.init(check=True)
