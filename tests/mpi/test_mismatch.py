"""Tier 2, issue 6: ranks that disagree about a call all get the same clear CollectiveUsageError,
fast, with nothing written; never a hang and never a normal return. Runs at every world size
(the cases need two ranks); each call is bounded by timeout= so a regression fails, not hangs."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
ODD = RANK == N - 1          # the rank that disagrees
BOUND_S = 20                 # every call here gives up by then, so a hang cannot pass as slowness

needs_two = pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")


def _odd_or_even(odd, even):
    return odd if ODD else even


def _filled(shape, dtype):
    return (np.arange(int(np.prod(shape))) % 7 + RANK).astype(dtype).reshape(shape)


CASES = [   # id, what each rank calls, expected text (every rank's message contains it)
    ("count, small", lambda: col.allreduce(_filled(_odd_or_even(1001, 1000), np.float32), timeout=BOUND_S),
     "allreduce: x: count differs across ranks: rank 0: 1000, rank {odd}: 1001"),
    ("count, large", lambda: col.allreduce(_filled(_odd_or_even(300_001, 300_000), np.float32), timeout=BOUND_S),
     "allreduce: x: count differs across ranks: rank 0: 300000, rank {odd}: 300001"),
    ("shape, same count", lambda: col.allreduce(_filled(_odd_or_even((3, 2), (2, 3)), np.float64), timeout=BOUND_S),
     "allreduce: x: shape differs across ranks: rank 0: (2, 3), rank {odd}: (3, 2)"),
    ("dtype", lambda: col.allreduce(_filled(100, _odd_or_even(np.float64, np.float32)), timeout=BOUND_S),
     "allreduce: x: dtype differs across ranks: rank 0: float32, rank {odd}: float64"),
    ("same bytes, other dtype", lambda: col.allreduce(_filled(100, _odd_or_even(np.int32, np.float32)),
                                                      timeout=BOUND_S),
     "allreduce: x: dtype differs across ranks: rank 0: float32, rank {odd}: int32"),
    ("same bytes, other dtype, large", lambda: col.allreduce(_filled(100_000, _odd_or_even(np.int64, np.float64)),
                                                             timeout=BOUND_S),
     "allreduce: x: dtype differs across ranks: rank 0: float64, rank {odd}: int64"),
    ("op", lambda: col.allreduce(_filled(10, np.float32), op=_odd_or_even("max", "sum"), timeout=BOUND_S),
     "allreduce: op: op differs across ranks: rank 0: sum, rank {odd}: max"),
    ("op, reduce_scatter", lambda: col.reduce_scatter(_filled(50_000, np.float32), op=_odd_or_even("min", "sum"),
                                                      timeout=BOUND_S),
     "reduce_scatter: op: op differs across ranks: rank 0: sum, rank {odd}: min"),
    ("root", lambda: col.broadcast(_filled(10, np.float32), root=_odd_or_even(1, 0), timeout=BOUND_S),
     "broadcast: root: root differs across ranks: rank 0: 0, rank {odd}: 1"),
    ("broadcast count", lambda: col.broadcast(_filled(_odd_or_even(9, 10), np.int8), timeout=BOUND_S),
     "broadcast: x: count differs across ranks: rank 0: 10, rank {odd}: 9"),
    ("allgather trailing shape", lambda: col.allgather(_filled(_odd_or_even((2, 4), (2, 3)), np.float32),
                                                       timeout=BOUND_S),
     "allgather: x: trailing shape differs across ranks: rank 0: (3,), rank {odd}: (4,)"),
    ("allgather dtype", lambda: col.allgather(_filled(4, _odd_or_even(np.int16, np.uint16)), timeout=BOUND_S),
     "allgather: x: dtype differs across ranks: rank 0: uint16, rank {odd}: int16"),
    ("collective kind", lambda: (col.broadcast(_filled(10, np.float32), timeout=BOUND_S) if ODD
                                 else col.allreduce(_filled(10, np.float32), timeout=BOUND_S)),
     "collective differs across ranks: rank 0: allreduce, rank {odd}: broadcast"),
    ("allreduce vs reduce_scatter", lambda: (col.reduce_scatter(_filled(99, np.float32), timeout=BOUND_S) if ODD
                                             else col.allreduce(_filled(99, np.float32), timeout=BOUND_S)),
     "collective differs across ranks: rank 0: allreduce, rank {odd}: reduce_scatter"),
    ("allreduce vs barrier", lambda: col.barrier(timeout=BOUND_S) if ODD
     else col.allreduce(_filled(99, np.float32), timeout=BOUND_S),
     "collective differs across ranks: rank 0: allreduce, rank {odd}: barrier"),
]


@needs_two
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_disagreement_is_the_same_error_on_every_rank(case):
    _, call, expected = case
    started = time.monotonic()
    with pytest.raises(col.CollectiveUsageError) as error:
        call()
    assert expected.format(odd=N - 1) in str(error.value), str(error.value)
    assert time.monotonic() - started < BOUND_S / 2, "the error should come at once, not from a timeout"
    everyone = COMM.allgather(str(error.value).split(": ", 1)[1])   # same words, whichever collective raised
    assert all(m == everyone[0] for m in everyone), everyone
    _still_in_step()


@needs_two
def test_a_collective_mismatch_names_only_the_collectives():
    with pytest.raises(col.CollectiveUsageError) as error:
        col.barrier(timeout=BOUND_S) if ODD else col.allreduce(_filled(99, np.float32), timeout=BOUND_S)
    expected = f"collective differs across ranks: rank 0: allreduce, rank {N - 1}: barrier"
    assert str(error.value) == f"{'barrier' if ODD else 'allreduce'}: {expected}", str(error.value)
    _still_in_step()


@needs_two
@pytest.mark.parametrize("size", [10, 100_000], ids=["small", "large"])
def test_nothing_is_written_when_ranks_disagree(size):
    x = _filled(size + (1 if ODD else 0), np.float32)
    out, before = np.full_like(x, -5.0), x.copy()
    with pytest.raises(col.CollectiveUsageError):
        col.allreduce(x, out=out, timeout=BOUND_S)
    assert np.all(out == -5.0) and np.array_equal(x, before)
    with pytest.raises(col.CollectiveUsageError):
        col.allreduce(x, out=x, timeout=BOUND_S)        # in place
    assert np.array_equal(x, before)
    _still_in_step()


@needs_two
def test_a_rank_that_skips_a_collective_fails_every_rank():
    x = _filled(64, np.float32)
    with pytest.raises(col.CollectiveUsageError, match="collective differs across ranks"):
        if ODD:
            col.barrier(timeout=BOUND_S)               # skipped the allreduce, went on to the barrier
        else:
            col.allreduce(x, timeout=BOUND_S)
    if not ODD:
        with pytest.raises(col.CollectiveUsageError, match="collective differs across ranks"):
            col.barrier(timeout=BOUND_S)               # its barrier now meets the odd rank's next call
    else:
        with pytest.raises(col.CollectiveUsageError, match="collective differs across ranks"):
            col.allreduce(x, timeout=BOUND_S)          # which is this one, one step behind
    _still_in_step()


@needs_two
def test_a_usage_error_on_one_rank_is_raised_on_every_rank():
    x = _filled(10, np.float32)
    out = np.empty_like(x)
    if ODD:
        out.flags.writeable = False
    with pytest.raises(col.CollectiveUsageError) as error:
        col.allreduce(x, out=out, timeout=BOUND_S)
    assert str(error.value).startswith("allreduce: out: is read-only"), str(error.value)
    if not ODD:
        assert f"(on rank {N - 1};" in str(error.value)
    _still_in_step()


def test_the_check_can_be_switched_off_and_on():
    col.init(check=False)
    try:
        assert np.array_equal(col.allreduce(_filled(100_000, np.int64)),
                              COMM.allreduce(_filled(100_000, np.int64)))
    finally:
        col.init(check=True)
    _still_in_step()


def _still_in_step():
    """After a disagreement every rank is still in step: a normal call works and agrees with MPI."""
    x = _filled(33, np.int64)
    assert np.array_equal(col.allreduce(x, timeout=BOUND_S), COMM.allreduce(x))
