"""Tier 2: bad input raises CollectiveUsageError naming the collective and the argument, on every
rank, before anything is sent, with every buffer untouched; and the runtime stays usable after."""
import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()


def _x():
    return np.arange(10, dtype=np.float32) + RANK


def _one_place(count):
    """A writable array of ``count`` elements that are all one place in memory (stride 0)."""
    return np.lib.stride_tricks.as_strided(np.empty(1, np.float32), (count,), (0,), writeable=True)


def _readonly(y=None):
    y = np.empty(10, np.float32) if y is None else y
    y.flags.writeable = False
    return y


CASES = [
    ("unknown op", lambda x: col.allreduce(x, op="mean"), "allreduce: op"),
    ("op not a string", lambda x: col.allreduce(x, op=None), "allreduce: op"),
    ("avg on integers", lambda x: col.allreduce(x.astype(np.int32), op="avg"), "allreduce: op"),
    ("unsupported dtype", lambda x: col.allreduce(x.astype(np.complex64)), "allreduce: x"),
    ("bool dtype", lambda x: col.allreduce(x > 3), "allreduce: x"),
    ("not an array", lambda x: col.allreduce(x.tolist()), "allreduce: x"),
    ("out wrong shape", lambda x: col.allreduce(x, out=np.empty(9, np.float32)), "allreduce: out"),
    ("out wrong dtype", lambda x: col.allreduce(x, out=np.empty(10, np.float64)), "allreduce: out"),
    ("out read-only", lambda x: col.allreduce(x, out=_readonly()), "allreduce: out"),
    ("in place, x read-only", lambda x: col.allreduce(_readonly(x), out=x), "allreduce: out: is read-only"),
    ("in place async, x read-only", lambda x: col.allreduce(_readonly(x), out=x, async_op=True).wait(),
     "allreduce: out: is read-only"),
    ("out overlaps x", lambda x: col.allreduce(x[:-1], out=x[1:]), "allreduce: out"),
    ("out's elements share memory", lambda x: col.allreduce(x, out=_one_place(10)),
     "allreduce: out: has elements that share memory"),
    ("allgather out's elements share memory", lambda x: col.allgather(x, out=_one_place(10 * N)),
     "allgather: out: has elements that share memory"),
    ("in place, x's elements share memory", lambda x: (lambda y: col.allreduce(y, out=y))(_one_place(10)),
     "allreduce: out: has elements that share memory"),
    ("allreduce_many, an array's elements share memory", lambda x: col.allreduce_many([x, _one_place(10)]),
     "allreduce_many: arrays[1]: has elements that share memory"),
    ("reduce_scatter bad op", lambda x: col.reduce_scatter(x, op="avg!"), "reduce_scatter: op"),
    ("reduce_scatter out shape", lambda x: col.reduce_scatter(x, out=np.empty(11, np.float32)), "reduce_scatter: out"),
    ("allgather 0-d", lambda x: col.allgather(np.float32(1.0) * np.ones(())), "allgather: x"),
    ("allgather object dtype", lambda x: col.allgather(np.array([object()])), "allgather: x"),
    ("allgather out's trailing shape", lambda x: col.allgather(x.reshape(2, 5), out=np.empty((2 * N, 4), np.float32)),
     "allgather: out: shape (%d, 4): its shape past axis 0 must be x's, (5,) (axis 0: the rows of every rank "
     "together)" % (2 * N)),
    ("broadcast root too big", lambda x: col.broadcast(x, root=N), "broadcast: root"),
    ("broadcast root negative", lambda x: col.broadcast(x, root=-1), "broadcast: root"),
    ("broadcast root not int", lambda x: col.broadcast(x, root=0.0), "broadcast: root"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_usage_error_and_changes_nothing(case):
    _, call, prefix = case
    x = _x()
    before = x.copy()
    with pytest.raises(col.CollectiveUsageError) as error:
        call(x)
    assert str(error.value).startswith(prefix), str(error.value)
    assert isinstance(error.value, ValueError)
    assert np.array_equal(x, before)
    # the runtime is still usable, and every rank is still in step with the others
    assert np.array_equal(col.allreduce(np.ones(3)), np.full(3, float(N)))


def test_allgather_mismatched_trailing_shapes_fail_on_every_rank():
    if N == 1:
        pytest.skip("needs two ranks to disagree")
    x = np.zeros((2, 3 if RANK == 0 else 4))
    with pytest.raises(col.CollectiveUsageError, match=r"allgather: x: trailing shape differs across ranks: rank 0: \(3,\)"):
        col.allgather(x)


def test_allgather_mismatched_dtypes_fail_on_every_rank():
    if N == 1:
        pytest.skip("needs two ranks to disagree")
    x = np.zeros((2, 3), np.float32 if RANK == 0 else np.float64)
    with pytest.raises(col.CollectiveUsageError, match="allgather: x: dtype differs across ranks"):
        col.allgather(x)


def test_a_broadcast_into_elements_that_share_memory_fails_on_every_rank():
    if N == 1:
        pytest.skip("a world of one writes nothing")
    x = _one_place(10) if RANK else _x()   # (the root's x is only read)
    with pytest.raises(col.CollectiveUsageError, match="broadcast: x"):
        col.broadcast(x, root=0)
    assert np.array_equal(col.allreduce(np.ones(3)), np.full(3, float(N)))
