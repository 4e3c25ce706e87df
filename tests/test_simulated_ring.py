"""Tier 1: the real algorithms and executor, with n = 1..8 ranks as threads of one process."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ring import algorithms
from ring.partition import chunk_bounds
from tests.support.simulated import BOUND, allreduce_each, rank_input, reference, simulate


pytestmark = pytest.mark.quick   # (every algorithm on 1 to 8 ranks as threads, in seconds)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 8), count=st.integers(0, 400), segment=st.integers(1, 64),
       op=st.sampled_from(["sum", "avg", "min", "max", "prod"]), in_place=st.booleans(),
       reduce=st.sampled_from([algorithms.allreduce, algorithms.allreduce_halving_doubling]))
def test_allreduce_matches_numpy(n, count, segment, op, in_place, reduce):
    """The ring and Rabenseifner's halving-doubling alike."""
    inputs = [rank_input(r, count, np.float64, op) for r in range(n)]
    expected = reference(inputs, op)
    originals = [x.copy() for x in inputs]

    for rank, result in enumerate(simulate(n, allreduce_each(inputs, op, segment, in_place, reduce))):
        np.testing.assert_array_equal(result, expected, err_msg=f"rank {rank}")
        if not in_place:
            np.testing.assert_array_equal(inputs[rank], originals[rank], err_msg="input modified")


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("dtype", ["float16", "float32", "int8", "uint64"])
def test_allreduce_every_size_class_and_dtype(n, dtype):
    for count in (0, 1, max(n - 1, 0), n + 1, 1001):
        inputs = [rank_input(r, count, dtype) for r in range(n)]
        results = simulate(n, lambda t: _allreduced(t, inputs[t.rank], "sum", 5))
        for result in results:
            np.testing.assert_array_equal(result, reference(inputs, "sum"))


def _allreduced(t, x, op, segment):
    out = np.empty_like(x)
    algorithms.allreduce(t, BOUND, x, out, op, segment)
    return out


@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_float16_avg_stays_in_range(n):
    results = simulate(n, lambda t: _allreduced(t, np.full(9, 30000, np.float16), "avg", 4))
    for result in results:
        np.testing.assert_array_equal(result, np.full(9, 30000, np.float16))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), count=st.integers(0, 300), segment=st.integers(1, 50))
def test_reduce_scatter_leaves_each_rank_its_array_split_block(n, count, segment):
    inputs = [rank_input(r, count, np.int32) for r in range(n)]
    expected_blocks = np.array_split(reference(inputs, "sum"), n)

    def body(t):
        work = np.empty(count, np.int32)
        owned = algorithms.reduce_scatter(t, BOUND, inputs[t.rank], work, "sum", segment)
        return work[owned]

    for rank, block in enumerate(simulate(n, body)):
        np.testing.assert_array_equal(block, expected_blocks[rank])


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 60), min_size=1, max_size=8), segment=st.integers(1, 30))
def test_allgather_concatenates_uneven_contributions(counts, segment):
    n = len(counts)
    inputs = [np.arange(c, dtype=np.int64) + 1000 * r for r, c in enumerate(counts)]

    def body(t):
        out = np.empty(sum(counts), np.int64)
        algorithms.allgather(t, BOUND, inputs[t.rank], out, counts, segment)
        return out

    for result in simulate(n, body):
        np.testing.assert_array_equal(result, np.concatenate(inputs))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), count=st.integers(0, 300), segment=st.integers(1, 50), root=st.integers(0, 7))
def test_broadcast_copies_the_roots_buffer_everywhere(n, count, segment, root):
    root %= n
    buffers = [np.full(count, -1.0) if r != root else np.arange(count, dtype=float) for r in range(n)]

    def body(t):
        algorithms.broadcast(t, BOUND, buffers[t.rank], root, segment)
        return buffers[t.rank]

    for result in simulate(n, body):
        np.testing.assert_array_equal(result, np.arange(count, dtype=float))


SCALE = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 33, 64]   # up to 64 ranks: powers of two, one off, odd


@pytest.mark.parametrize("n", SCALE)
def test_every_algorithm_of_every_collective_at_scale(n):
    """Each algorithm the cost model can choose (``ring.cost.ALGORITHMS``), on one uneven size per
    collective, as n threads: exact against numpy, and the same bits on every rank."""
    count = 3 * n + 2   # uneven chunks; a few ranks' shares differ by one element
    segment = 2         # several messages per chunk: the segmented schedules too
    inputs = [rank_input(r, count, np.int64) for r in range(n)]
    rows = [r % 3 for r in range(n)]   # all-gather: some ranks bring nothing
    signature = b"same call"

    def body(t):
        x = inputs[t.rank]
        results = {}
        for name, reduce in [("ring", algorithms.allreduce), ("halving", algorithms.allreduce_halving_doubling)]:
            results[name] = np.empty_like(x)
            reduce(t, BOUND, x, results[name], "sum", segment)
        results["doubling"] = np.empty_like(x)
        assert algorithms.allreduce_small(t, BOUND, x, results["doubling"], "max", signature)
        work = x.copy()
        results["reduce_scatter"] = work[algorithms.reduce_scatter(t, BOUND, x, work, "sum", segment)].copy()
        mine = np.full(rows[t.rank], t.rank, np.int16)
        counts, _ = algorithms.allgather_small(t, BOUND, (rows[t.rank],), None, signature)
        results["allgather ring"] = np.empty(int(counts.sum()), np.int16)
        algorithms.allgather(t, BOUND, mine, results["allgather ring"], counts[:, 0].tolist(), segment)
        same = np.full(3, t.rank, np.int16)   # doubling: every rank brings as many
        counts, results["allgather doubling"] = algorithms.allgather_small(t, BOUND, (3, -t.rank), same, signature)
        assert counts.tolist() == [[3, -r] for r in range(n)]
        results["broadcast"] = x.copy() if t.rank == n - 1 else np.zeros_like(x)
        algorithms.broadcast(t, BOUND, results["broadcast"], n - 1, segment)
        results["broadcast doubling"] = x.copy() if t.rank == 0 else np.full_like(x, -1)
        assert algorithms.broadcast_small(t, BOUND, results["broadcast doubling"], 0, signature)
        return results

    outcomes = simulate(n, body)
    total, gathered = reference(inputs, "sum"), np.repeat(np.arange(n), rows).astype(np.int16)
    same = np.repeat(np.arange(n), 3).astype(np.int16).view(np.uint8)   # (allgather_small returns bytes)
    expected = {"ring": total, "halving": total, "doubling": reference(inputs, "max"),
                "allgather ring": gathered, "allgather doubling": same, "broadcast": inputs[-1],
                "broadcast doubling": inputs[0]}
    for rank, results in enumerate(outcomes):
        for name, want in expected.items():
            assert results[name].tobytes() == want.tobytes(), f"n={n} rank {rank}: {name} differs"
        np.testing.assert_array_equal(results["reduce_scatter"], total[slice(*chunk_bounds(count, n)[rank])])
