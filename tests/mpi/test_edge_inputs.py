"""Tier 2, issue 12: inputs and program settings at the edges, where wrong results or stray errors hide.
Every result is compared with mpi4py's own collectives on rank-dependent inputs."""
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
BOUND_S = 20


@pytest.mark.parametrize("count", [10, 300_000], ids=["small", "ring"])
@pytest.mark.parametrize("seterr", ["raise", "warn"])
def test_overflow_follows_ieee_on_every_rank_whatever_np_seterr_says(count, seterr):
    x = np.full(count, 3e38, np.float32)   # two of these overflow float32
    x[::3] = RANK + 1.0
    big = np.arange(count) % 3 != 0
    expected_sum = np.where(big, np.float32(np.inf) if N > 1 else np.float32(3e38), np.float32(N * (N + 1) / 2))
    expected_prod = np.where(big, np.float32(np.inf) if N > 1 else np.float32(3e38),
                             np.float32(np.prod(np.arange(1, N + 1))))
    previous = np.seterr(all=seterr)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            total = col.allreduce(x, timeout=BOUND_S)
            prod = col.allreduce(x, op="prod", timeout=BOUND_S)
    finally:
        np.seterr(**previous)
    assert not caught, [str(w.message) for w in caught]
    assert np.array_equal(total, expected_sum) and np.array_equal(prod, expected_prod)
    every = COMM.allgather(np.concatenate([total, prod]).tobytes())
    assert all(b == every[0] for b in every), "the same bits on every rank"


def test_a_matrix_is_reduced_as_a_plain_array():
    m = np.asmatrix(np.arange(12, dtype=np.float64).reshape(3, 4) + RANK)
    result = col.allreduce(m, timeout=BOUND_S)
    expected = COMM.allreduce(np.asarray(m))
    assert type(result) is np.ndarray and np.array_equal(result, expected)
    col.allreduce(m, out=m, timeout=BOUND_S)
    assert np.array_equal(np.asarray(m), expected)
    rows = col.allgather(np.asmatrix(np.full((1, 3), RANK, np.int32)), timeout=BOUND_S)
    assert np.array_equal(rows, np.repeat(np.arange(N, dtype=np.int32), 3).reshape(N, 3))
    b = np.asmatrix(np.full((2, 2), RANK, np.int16))
    assert np.array_equal(col.broadcast(b, root=N - 1, timeout=BOUND_S), np.full((2, 2), N - 1))


def test_a_masked_array_is_refused_on_every_rank_and_nothing_moves():
    x = np.ma.masked_array(np.arange(5.0) + RANK, mask=[0, 1, 0, 0, 0])
    with pytest.raises(col.CollectiveUsageError, match="allreduce: x: is a masked array"):
        col.allreduce(x, timeout=BOUND_S)
    assert np.array_equal(x.data, np.arange(5.0) + RANK)
    assert np.array_equal(col.allreduce(np.ones(3), timeout=BOUND_S), np.full(3, float(N)))   # in step


RECORD = np.dtype([("id", np.int32), ("pos", np.float64, (3,)), ("tag", "S5")])


def _records(count: int, rank: int) -> np.ndarray:
    r = np.zeros(count, RECORD)
    r["id"] = np.arange(count) + 100 * rank
    r["pos"] = np.arange(count * 3).reshape(count, 3) * 0.5 - rank
    r["tag"] = [f"r{rank}n{i % 100}".encode() for i in range(count)]
    return r


@pytest.mark.parametrize("count", [1, 7, 20_000])
def test_structured_dtypes_allgather_and_broadcast(count):
    mine = _records(count + RANK, RANK)   # axis 0 differs between ranks
    gathered = col.allgather(mine, timeout=BOUND_S)
    expected = np.concatenate(COMM.allgather(mine))
    assert gathered.dtype == RECORD and gathered.tobytes() == expected.tobytes()
    x = _records(count, RANK)
    col.broadcast(x, root=N - 1, timeout=BOUND_S)
    assert x.tobytes() == _records(count, N - 1).tobytes()


def test_structured_dtypes_that_differ_are_a_usage_error():
    other = np.dtype([("id", np.int32), ("pos", np.float64, (3,)), ("tag", "S5" if RANK else "S6")])
    if N < 2:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(col.CollectiveUsageError, match="allgather: x: dtype differs across ranks"):
        col.allgather(np.zeros(3, other), timeout=BOUND_S)


@pytest.mark.parametrize("count", [10, 200_000])
def test_disjoint_views_of_one_array_may_be_x_and_out(count):
    a = np.zeros((2, count), np.float32)
    a[:, :count // 2] = (np.arange(count // 2) % 13 + RANK)
    x, out = a[:, :count // 2], a[:, count // 2:]
    expected = COMM.allreduce(np.ascontiguousarray(x))
    before = x.copy()
    col.allreduce(x, out=out, timeout=BOUND_S)
    assert np.array_equal(out, expected) and np.array_equal(x, before)
    with pytest.raises(col.CollectiveUsageError, match="allreduce: out: overlaps x; pass out=x for an in-place"):
        col.allreduce(a[:, 1:count // 2 + 1], out=a[:, :count // 2], timeout=BOUND_S)


def test_an_allgather_whose_out_overlaps_x_is_not_offered_the_in_place_call_it_refuses():
    big = np.zeros(4 * N + 4, np.float32)
    with pytest.raises(col.CollectiveUsageError, match=r"allgather: out: overlaps x; pass a separate array$"):
        col.allgather(big[2:6], out=big[:4 * N], timeout=BOUND_S)
    with pytest.raises(col.CollectiveUsageError, match="allgather: out: is x itself"):
        col.allgather(big, out=big, timeout=BOUND_S)


def test_name_must_be_a_string():
    with pytest.raises(col.CollectiveUsageError, match="allreduce: name: expected a str"):
        col.allreduce(np.ones(3), name=7, timeout=BOUND_S)
    assert np.array_equal(col.allreduce(np.ones(3), name="after", timeout=BOUND_S), np.full(3, float(N)))


def test_long_names_and_names_with_separators_compare_exactly():
    long = "layer." * 40 + "weight|%d"
    assert np.array_equal(col.allreduce(np.ones(3), name=long, timeout=BOUND_S), np.full(3, float(N)))
    if N > 1:
        with pytest.raises(col.CollectiveUsageError, match="allreduce: name: name differs across ranks"):
            col.allreduce(np.ones(3), name=long + ("x" if RANK == N - 1 else ""), timeout=BOUND_S)


def test_the_largest_segment_does_not_allocate_beyond_the_data():
    from ring import arrays
    col.init(segment_bytes=1 << 30)
    arrays._scratch_pools.__dict__.clear()   # (what earlier calls with larger data kept)
    try:
        x = np.arange(300_000, dtype=np.float32) % 7 + RANK
        expected = COMM.allreduce(x)
        col.allreduce(x, out=x, timeout=BOUND_S)   # in place: receives go through scratch
        assert np.array_equal(x, expected)
        pool = arrays._scratch_pools.__dict__
        assert all(buf.nbytes <= x.nbytes for buf in pool.values()), {k: b.nbytes for k, b in pool.items()}
    finally:
        col.init(segment_bytes=0)   # (the defaults)
