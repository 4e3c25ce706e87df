"""Tier 2: every collective in a real MPI world, against mpi4py's own collectives.

One body, many worlds: tests/test_worlds.py runs this file under mpiexec -n 1..4.
Every rank runs the same tests in the same order; each check is agreed across
ranks (see ``agree``) so a failure on one rank fails all of them, and none hangs.
"""
import numpy as np
import pytest

from tests.support.in_world import (COMM, N, RANK, agree, mpi_reference, pipelined, rank_input, same_on_every_rank,
                                    segment_size)  # noqa: F401 - (segment_size: an autouse fixture)

import collectives as col


pytestmark = pytest.mark.mpi

OPS = ["sum", "avg", "min", "max", "prod"]
DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
SIZES = [0, 1, max(N - 1, 0), N + 1, 1001]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "bfloat16"])
def test_the_pipelined_counts_take_the_segmented_ring(dtype, segment_size):
    """The premise of :func:`pipelined`: its counts are above recursive doubling's bytes, so the
    tests that use them run a bandwidth algorithm in segments, under tiny segments as under the defaults."""
    dtype = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else dtype
    x = np.zeros(pipelined(3 * 2**20, dtype, segment_size), dtype)
    bandwidth = ("ring", "halving", "hierarchical")   # (the last: across hosts)
    agree(N == 1 or col.algorithm_for("allreduce", x) in bandwidth, f"{dtype}: {x.nbytes} bytes")


def _close(result, expected, dtype, op):
    if op == "avg" and np.dtype(dtype) == np.float16:   # pre-scaled: a few ulps from sum / n
        return np.allclose(result.astype(float), expected.astype(float), rtol=4e-3, atol=1e-3)
    return np.array_equal(result, expected)


VALID_PAIRS = [(op, dtype) for op in OPS for dtype in DTYPES
               if not (op == "avg" and np.dtype(dtype).kind in "iu")]   # that one is a usage error


@pytest.mark.parametrize("op, dtype", VALID_PAIRS)
def test_allreduce_matches_mpi(op, dtype):
    for count in SIZES:
        x = rank_input(count, dtype, op)
        before = x.copy()
        result = col.allreduce(x, op=op)
        expected = mpi_reference(x, op)
        agree(result.dtype == x.dtype and result.shape == x.shape, f"{op} {dtype} n={count}: wrong dtype/shape")
        agree(_close(result, expected, dtype, op), f"{op} {dtype} count={count}: differs from MPI")
        agree(np.array_equal(x, before), f"{op} {dtype} count={count}: input was modified")
        agree(same_on_every_rank(result), f"{op} {dtype} count={count}: ranks got different bits")


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_allreduce_several_segments_per_chunk(dtype, segment_size):
    count = pipelined(3 * 2**20 + 5, dtype, segment_size)   # default segments: 12-24 MiB, several per chunk
    x = rank_input(count, dtype, "sum")
    agree(np.array_equal(col.allreduce(x), mpi_reference(x, "sum")), f"{dtype} x {count}: differs from MPI")


def test_float16_avg_does_not_overflow():
    x = np.full(100, 30000, np.float16)
    agree(np.array_equal(col.allreduce(x, op="avg"), x), "float16 avg of 30000 everywhere is not 30000")


@pytest.mark.parametrize("layout", ["in-place", "out", "non-contiguous", "non-contiguous-in-place", "fortran"])
def test_allreduce_shapes_layouts_and_out(layout):
    base = rank_input(6 * 5 * 4, "float64", "sum").reshape(6, 5, 4)
    expected = mpi_reference(np.ascontiguousarray(base), "sum")
    if layout == "in-place":
        x = base.copy()
        result = col.allreduce(x, out=x)
        agree(result is x, "out=x did not return x")
    elif layout == "out":
        out = np.zeros_like(base)
        result = col.allreduce(base, out=out)
        agree(result is out, "out was not returned")
    elif layout == "non-contiguous":
        big = np.zeros((6, 10, 4)); big[:, ::2] = base
        x = big[:, ::2]
        result = col.allreduce(x)
        agree(np.array_equal(big[:, ::2], base), "non-contiguous input was modified")
    elif layout == "non-contiguous-in-place":
        big = np.zeros((6, 10, 4)); big[:, ::2] = base
        x = big[:, ::2]
        result = col.allreduce(x, out=x)
        agree(np.all(big[:, 1::2] == 0), "in-place on a view wrote outside the view")
    else:
        x = np.asfortranarray(base)
        result = col.allreduce(x)
    agree(result.shape == base.shape and np.array_equal(result, expected), f"{layout}: wrong result")


def test_allreduce_zero_dimensional_array():
    x = np.array(float(RANK + 1))
    agree(col.allreduce(x) == N * (N + 1) / 2, "0-d sum is wrong")


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "uint32"])
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_reduce_scatter_matches_mpi(dtype, op):
    for count in SIZES:
        x = rank_input(count, dtype, op)
        before = x.copy()
        block = col.reduce_scatter(x, op=op)
        expected = np.array_split(mpi_reference(x, op), N)[RANK]
        agree(np.array_equal(block, expected), f"{op} {dtype} count={count}: block differs from MPI")
        agree(np.array_equal(x, before), f"{op} {dtype} count={count}: input was modified")


def test_reduce_scatter_into_out_and_from_a_view():
    x = rank_input(60, "float32", "sum").reshape(6, 10)[:, ::2]
    expected = np.array_split(mpi_reference(np.ascontiguousarray(x), "sum").ravel(), N)[RANK]
    out = np.empty(expected.size, np.float32)
    agree(col.reduce_scatter(x, out=out) is out and np.array_equal(out, expected), "reduce_scatter into out")


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "uint64", "bool"])
def test_allgather_matches_mpi_with_uneven_first_axis(dtype):
    rows = (RANK * 2 + 1) % 4            # includes ranks with 0 rows
    x = (np.arange(rows * 3).reshape(rows, 3) + 100 * RANK).astype(dtype)
    counts = COMM.allgather(x.size)
    expected = np.empty((sum(counts) // 3, 3), dtype)
    COMM.Allgatherv(x, [expected, counts])
    result = col.allgather(x)
    agree(result.shape == expected.shape and np.array_equal(result, expected), f"{dtype}: differs from MPI")


@pytest.mark.parametrize("root", ["first", "last"])
@pytest.mark.parametrize("count", [0, 1, 1001, 3 * 2**20])
def test_broadcast_matches_mpi(root, count, segment_size):
    root, count = 0 if root == "first" else N - 1, pipelined(count, "float32", segment_size)
    x = rank_input(count, "float32", "sum")
    expected = x.copy()
    COMM.Bcast(expected, root=root)
    agree(col.broadcast(x, root=root) is x and np.array_equal(x, expected), f"root {root}: differs from MPI")


@pytest.mark.parametrize("count", [4, 5000])   # the latency path and the ring
def test_broadcast_keeps_every_bit_from_a_read_only_root(count):
    special = np.array([-0.0, np.nan, -np.inf, 5e-324], np.float64)   # a sign, a NaN, a subnormal
    source = np.resize(special, count)
    payloads = np.uint64(0x7FF8000000000000) | np.arange(len(source[1::4]), dtype=np.uint64)
    source[1::4] = payloads.view(np.float64)   # NaNs, each with its own payload
    if RANK == 0:
        source.flags.writeable = False
        x = source
    else:
        x = np.full(count, 7.0)
    col.broadcast(x, root=0)
    agree(x.tobytes() == source.tobytes(), "broadcast changed some bits")


@pytest.mark.parametrize("dtype, bits", [("float64", (0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000ABC)),
                                         ("float32", (0x7FC00000, 0xFFC00000, 0x7FC00ABC)),
                                         ("float16", (0x7E00, 0xFE00, 0x7E0B))])
@pytest.mark.parametrize("op", ["sum", "avg", "prod", "min", "max"])
def test_nans_of_several_signs_and_payloads_reduce_to_the_same_bits_on_every_rank(dtype, bits, op):
    """Ranks bring NaNs of other signs or payloads (one rank's unlike the others', and every pair of
    kinds), beside numbers and infinities: whatever NaN the result keeps, every rank keeps the same
    one (with recursive doubling every rank combines the partial results itself, and must write
    them as its partners do), through the usual way and a lane."""
    nans = np.array(bits, dtype=f"uint{np.dtype(dtype).itemsize * 8}").view(dtype)
    others = np.array([1, np.inf, -np.inf], dtype)
    for odd_one in range(N):
        for mine, theirs in [(0, 1), (1, 0), (0, 2), (2, 1)]:
            nan = [nans[mine if RANK == odd_one else theirs]]
            for x in (np.array(nan), np.concatenate((nan, others)), np.resize(np.concatenate((others, nan)), 67)):
                for _ in range(2):   # (the second of a kind takes the lane, where one opens)
                    got = col.allreduce(x, op)
                    agree(same_on_every_rank(got), f"{op}, {x.size} elements: the ranks hold different bits "
                          f"(rank {odd_one} brings NaN {mine}, the others {theirs})")


def test_broadcast_into_a_non_contiguous_view():
    big = np.full((4, 6), -1.0)
    view = big[:, ::2]
    if RANK == 0:
        view[...] = np.arange(12.0).reshape(4, 3)
    col.broadcast(view, root=0)
    agree(np.array_equal(view, np.arange(12.0).reshape(4, 3)) and np.all(big[:, 1::2] == -1), "view broadcast")


def test_barrier_and_world_facts():
    col.barrier()
    agree(col.rank() == RANK and col.size() == N, "rank()/size() disagree with MPI")
