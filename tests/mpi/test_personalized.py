"""Tier 2: alltoall, gather, scatter and reduce in a real MPI world, against mpi4py's Alltoall(v),
Gatherv, Scatterv and Reduce; bfloat16 reductions against an exact float64 reference.

Run under mpiexec -n 1..4 by tests/test_worlds.py, like tests/mpi/test_collectives.py.
"""
import numpy as np
import pytest
from mpi4py import MPI

from tests.support.in_world import MPI_OPS, agree, pipelined, rank_input, segment_size  # noqa: F401 (autouse)

import collectives as col


pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
ROOTS = sorted({0, N - 1, N // 2})


def splits_of(rank):
    """Rows rank ``rank`` sends to each rank: uneven, zeros included, different on every rank."""
    return [(rank * 3 + j * 5) % 4 for j in range(N)]


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint64", "complex128", "bool"])
def test_alltoall_equal_blocks_matches_mpi(dtype):
    x = (np.arange(N * 6).reshape(N * 2, 3) + 100 * RANK).astype(dtype)
    expected = np.empty_like(x)
    COMM.Alltoall(x, expected)
    got = col.alltoall(x)
    agree(got.shape == x.shape and np.array_equal(got, expected), f"alltoall {dtype}")


@pytest.mark.parametrize("trailing", [(), (2, 3)])
def test_alltoall_uneven_splits_matches_mpi_alltoallv(trailing):
    send_rows = splits_of(RANK)
    recv_rows = [splits_of(j)[RANK] for j in range(N)]
    row = int(np.prod(trailing))
    x = (np.arange(sum(send_rows) * row).reshape((sum(send_rows),) + trailing) + 1000 * RANK).astype(np.float64)
    expected = np.empty((sum(recv_rows),) + trailing)
    COMM.Alltoallv([x, [r * row for r in send_rows]], [expected, [r * row for r in recv_rows]])
    got = col.alltoall(x, splits=send_rows)
    out = np.full_like(expected, -1.0)
    col.alltoall(x, splits=send_rows, out=out)
    named = col.alltoall(x, splits=send_rows, out_splits=recv_rows)
    agree(np.array_equal(got, expected) and np.array_equal(out, expected) and np.array_equal(named, expected),
          "alltoall with splits")


def test_alltoall_out_splits_that_differ_from_what_is_sent_are_refused_on_every_rank():
    x = np.arange(N * 2.0)
    wrong = [2] * N if RANK != N - 1 else [1] * (N - 1) + [N + 1]   # (the last rank's expectations are off)
    if N > 1:
        with pytest.raises(col.CollectiveUsageError, match=rf"out_splits: must be the rows each rank sends this one, "
                                                            rf"but rank {N - 1} expects 1 from rank 0, which sends 2"):
            col.alltoall(x, out_splits=wrong)
    with pytest.raises(col.CollectiveUsageError, match="out_splits: expected"):
        col.alltoall(x, out_splits=[2] * (N + 1))
    agree(col.alltoall(x, out_splits=[2] * N).tolist() == [float(2 * RANK + j) for j in range(2)] * N or N > 1,
          "alltoall with right out_splits")
    col.barrier()   # still in step


def test_alltoall_refuses_bad_splits_and_out_on_every_rank():
    x = np.zeros((N * 2, 2))
    with pytest.raises(col.CollectiveUsageError, match="splits: counts add up to"):
        col.alltoall(x, splits=[1] * N if RANK == 0 else [2] * N)
    if N > 1:
        with pytest.raises(col.CollectiveUsageError, match="x: axis 0 has"):
            col.alltoall(np.zeros((N * 2 + (RANK == 0), 2)))
    with pytest.raises(col.CollectiveUsageError, match="out: axis 0 must be the rows"):
        col.alltoall(x, out=np.zeros((N * 2 + (RANK == N - 1), 2)))
    col.barrier()   # still in step


@pytest.mark.parametrize("root", ROOTS)
def test_gather_checks_every_ranks_out_alike(root):
    """Issue 36, item 4: a non-root out with the wrong rows was ignored while a read-only one was
    refused. Now any rank's out is checked alike: wrong rows on the last rank, refused on every rank;
    a right one on a non-root is accepted and left unwritten."""
    x = np.full((2, 3), RANK, np.int64)
    bad = N - 1
    with pytest.raises(col.CollectiveUsageError, match=rf"gather: out: axis 0 must be {2 * N} \(the rows of every "
                                                     rf"rank together\), but is {2 * N + 1} on .*rank {bad}$"):
        col.gather(x, root=root, out=np.zeros((2 * N + (RANK == bad), 3), np.int64))
    out = np.full((2 * N, 3), -1, np.int64)
    got = col.gather(x, root=root, out=out)
    expected = np.repeat(np.arange(N), 2)[:, None] * np.ones(3, np.int64)
    good = got is out and np.array_equal(out, expected) if RANK == root else got is None and np.all(out == -1)
    agree(good, f"gather to {root} with out on every rank")


@pytest.mark.parametrize("root", ROOTS)
def test_gather_uneven_rows_matches_mpi_gatherv(root):
    rows = [(r * 5) % 3 + r for r in range(N)]
    x = rank_input(rows[RANK] * 2, "int32", "sum").reshape(rows[RANK], 2)
    expected = np.empty((sum(rows), 2), np.int32) if RANK == root else None
    COMM.Gatherv(x, [expected, [r * 2 for r in rows]] if RANK == root else None, root=root)
    got = col.gather(x, root=root)
    good = np.array_equal(got, expected) if RANK == root else got is None
    agree(good, f"gather to {root}")


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("dtype", ["float16", "int64", "complex64"])
def test_scatter_matches_mpi_scatterv_and_needs_nothing_but_on_the_root(root, dtype):
    rows = [(r * 3) % 4 + 1 for r in range(N)]
    whole = np.arange(sum(rows) * 3).reshape(sum(rows), 3).astype(dtype)
    expected = np.empty((rows[RANK], 3), dtype)
    COMM.Scatterv([whole, [r * 3 for r in rows]] if RANK == root else None, expected, root=root)
    got = col.scatter(whole if RANK == root else None, root=root, splits=rows)
    agree(got.dtype == whole.dtype and np.array_equal(got, expected), f"scatter from {root}")
    equal = col.scatter(np.arange(N * 2) if RANK == root else None, root=root)
    agree(equal.tolist() == [2 * RANK, 2 * RANK + 1], "scatter in equal blocks")
    out = np.full((rows[RANK], 3), -1, dtype)
    into = col.scatter(whole if RANK == root else None, root=root, splits=rows, out=out)
    agree(into is out and np.array_equal(out, expected), f"scatter into out from {root}")


@pytest.mark.parametrize("collective", ["alltoall", "gather", "allgather"])
def test_a_0_d_array_is_refused_naming_the_collective(collective):
    with pytest.raises(col.CollectiveUsageError, match=f"^{collective}: x: is 0-dimensional; {collective} moves rows"):
        getattr(col, collective)(np.array(2.0))
    col.barrier()   # still in step


def test_scatter_out_is_checked_across_ranks():
    whole = np.arange(N * 3.0).reshape(N, 3)
    if N > 1:
        out = np.zeros((1, 3 + (RANK == 1)))
        with pytest.raises(col.CollectiveUsageError, match="scatter: out: count differs across ranks: rank 0: 3, "
                                                           "rank 1: 4"):
            col.scatter(whole if RANK == 0 else None, out=out)
    out = np.zeros((1 + (RANK == N - 1), 3))   # (the last rank's rows are not what the root's splits give it)
    if RANK == N - 1:
        with pytest.raises(col.CollectiveUsageError, match=f"out: expected 1 rows for rank {N - 1}"):
            col.scatter(whole if RANK == 0 else None, out=out)
        good = not out.any()   # left as it was
    else:
        col.scatter(whole if RANK == 0 else None, out=out)
        good = out[0].tolist() == whole[RANK].tolist()
    agree(good, "scatter with one wrong out")   # (and the ranks are still in step)


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize("count", [5, 100_001])   # recursive doubling, and the ring then a gather
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_reduce_matches_mpi_reduce(root, count, op, segment_size):
    x = rank_input(pipelined(count, "float64", segment_size), "float64", op)
    expected = np.empty_like(x) if RANK == root else None
    COMM.Reduce(x, expected, op=MPI_OPS[op], root=root)
    got = col.reduce(x, op=op, root=root)
    good = np.array_equal(got, expected) if RANK == root else got is None
    agree(good, f"reduce {op} to {root}")


def test_reduce_in_place_on_the_root_leaves_the_others_untouched():
    x = rank_input(3001, "float32", "sum")
    before = x.copy()
    expected = np.empty_like(x)
    COMM.Allreduce(before, expected, op=MPI.SUM)
    result = col.reduce(x, root=0, out=x)
    agree(result is x and np.array_equal(x, expected) if RANK == 0 else result is None and
          np.array_equal(x, before), "reduce in place")


@pytest.mark.parametrize("collective", ["alltoall", "gather", "scatter", "reduce"])
def test_async_op_and_name_and_groups(collective):
    """async_op gives a Work; a group runs the collective among its members only."""
    evens = col.new_group(range(0, N, 2))
    ok = True
    if evens:
        m = evens.size()
        x = np.arange(2 * m, dtype=np.float64) + RANK
        calls = {"alltoall": lambda **kw: evens.alltoall(x, **kw), "gather": lambda **kw: evens.gather(x, **kw),
                 "scatter": lambda **kw: evens.scatter(x if evens.rank() == 0 else None, **kw),
                 "reduce": lambda **kw: evens.reduce(x, **kw)}
        work = calls[collective](async_op=True, name="step 1")
        now = calls[collective](name="step 2")
        later = work.wait()
        ok = (later is None and now is None) or np.array_equal(later, now)
        evens.destroy()
    agree(ok, f"{collective} async on a group")


@pytest.mark.parametrize("op", ["sum", "avg", "max", "prod"])
@pytest.mark.parametrize("count", [7, 200_003])
def test_bfloat16_is_reduced_in_float32_and_rounded_once(op, count, segment_size):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    count = pipelined(count, bf16, segment_size)
    rng = np.random.default_rng(RANK)
    x = (rng.standard_normal(count) * (1.0 if op != "prod" else 0.5) + (1.0 if op == "prod" else 0)).astype(bf16)
    everyone = np.stack(COMM.allgather(x.astype(np.float64)))
    exact = {"sum": everyone.sum(0), "avg": everyone.sum(0) / N, "max": everyone.max(0),
             "prod": everyone.prod(0)}[op]
    # float32's own roundings, bounded by the magnitudes summed (or multiplied); far below bfloat16's ulp
    magnitude = np.abs(everyone).sum(0) / (N if op == "avg" else 1) if op in ("sum", "avg") else np.abs(exact)
    slack = magnitude * 2.0 ** -19

    def rounded_once(got, start=0, stop=count) -> bool:
        """Within float32's slack of the bfloat16 nearest the exact result. Algorithms differ in the order
        they combine (across hosts the all-reduce takes two levels, the reduce-scatter one ring), so
        results are compared with the exact one, not bit for bit with each other."""
        nearest = exact[start:stop].astype(np.float32).astype(bf16).astype(np.float64)
        error = np.abs(np.asarray(got, np.float64) - exact[start:stop])
        return got.dtype == bf16 and bool((error <= np.abs(nearest - exact[start:stop]) + slack[start:stop]).all())

    got = col.allreduce(x, op=op)
    agree(rounded_once(got), f"bfloat16 {op}")
    start, stop = col.block_bounds(count)[RANK]
    agree(rounded_once(col.reduce_scatter(x, op=op), start, stop), "bfloat16 reduce_scatter")
    reduced = col.reduce(x, op=op, root=N - 1)
    agree(reduced is None if RANK != N - 1 else rounded_once(reduced), "bfloat16 reduce")
    agree(np.array_equal(col.broadcast(got.copy(), root=0), got), "bfloat16 broadcast")
    agree(np.array_equal(col.allgather(x)[RANK * count:(RANK + 1) * count], x), "bfloat16 allgather")
