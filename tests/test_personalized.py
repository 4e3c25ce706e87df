"""Tier 1: the personalized schedules (all-to-all, gather, scatter) and reduce to a root, as data
and run by the real executor with n = 1..8 ranks as threads of one process."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ring import algorithms
from ring.partition import bounds_from_counts
from ring.personalized_schedule import alltoall_plan, alltoall_steps, gather_plan, scatter_plan
from ring.transport.base import unbounded
from tests.support.simulated import rank_input, reference, simulate


BOUND = unbounded()   # (the simulated world has its own timeout)


@pytest.mark.parametrize("n", range(1, 9))
def test_alltoall_steps_pair_every_sender_with_its_receiver_in_the_same_step(n):
    """In lockstep, step s of rank r sends to d, so step s of rank d must receive from r (else both
    wait), and over the steps every ordered pair of distinct ranks meets exactly once."""
    steps = [alltoall_steps(r, n) for r in range(n)]
    met = set()
    for s in range(n - 1):
        for r in range(n):
            to, _ = steps[r][s]
            assert steps[to][s][1] == r, f"step {s}: rank {r} sends to {to}, which receives from another"
            met.add((r, to))
    assert met == {(a, b) for a in range(n) for b in range(n) if a != b}


def split_counts(n, seed):
    """``counts[i][j]``: the elements rank i sends to rank j (zeros included)."""
    return np.random.default_rng(seed).integers(0, 5, size=(n, n)).tolist()


@pytest.mark.parametrize("n", range(1, 7))
@pytest.mark.parametrize("segment", [1, 3, 100])
def test_alltoall_plans_deliver_every_block_once_to_its_place(n, segment):
    """Replayed symbolically: each element of rank i's block for j lands at its place in j's output."""
    counts = split_counts(n, n * 7 + segment)
    sends = [bounds_from_counts(counts[i]) for i in range(n)]
    recvs = [bounds_from_counts([counts[i][j] for i in range(n)]) for j in range(n)]
    delivered = {}
    for r in range(n):
        for t in alltoall_plan(r, sends[r], recvs[r], segment):
            assert t.send is None or t.send[1] - t.send[0] <= segment
            if t.send is not None:
                for k in range(*t.send):
                    block_start = sends[r][t.peer][0]
                    place = recvs[t.peer][r][0] + (k - block_start)
                    key = (t.peer, place)
                    assert key not in delivered, "an element delivered twice"
                    delivered[key] = (r, k)
    for j in range(n):
        for i in range(n):
            if i == j:
                continue
            for offset in range(counts[i][j]):
                assert delivered[(j, recvs[j][i][0] + offset)] == (i, sends[i][j][0] + offset)


@pytest.mark.parametrize("n,root", [(1, 0), (3, 0), (4, 2), (5, 4)])
def test_scatter_is_the_gather_backwards(n, root):
    bounds = bounds_from_counts([2, 0, 3, 1, 4][:n])
    for r in range(n):
        gathered = [(t.send, t.recv, t.peer) for t in gather_plan(r, root, bounds, 2)]
        scattered = [(t.recv, t.send, t.peer) for t in scatter_plan(r, root, bounds, 2)]
        assert gathered == scattered


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), seed=st.integers(0, 1000), segment=st.integers(1, 9))
def test_alltoall_sends_each_block_to_its_rank(n, seed, segment):
    counts = split_counts(n, seed)
    inputs = [np.concatenate([np.full(counts[i][j], 100 * i + j, np.int32) for j in range(n)]) for i in range(n)]

    def body(t):
        me = t.rank
        sends = bounds_from_counts(counts[me])
        recvs = bounds_from_counts([counts[i][me] for i in range(n)])
        out = np.full(recvs[-1][1], -1, np.int32)
        algorithms.alltoall(t, BOUND, inputs[me], out, sends, recvs, segment)
        return out

    for j, got in enumerate(simulate(n, body)):
        expected = np.concatenate([np.full(counts[i][j], 100 * i + j, np.int32) for i in range(n)])
        np.testing.assert_array_equal(got, expected)


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=8), root=st.integers(0, 7),
       segment=st.integers(1, 16))
def test_gather_and_scatter_move_uneven_blocks_to_and_from_the_root(counts, root, segment):
    n, root = len(counts), root % len(counts)
    blocks = [rank_input(r, counts[r], np.float64) + 1000 * r for r in range(n)]
    whole = np.concatenate(blocks)

    def body(t):
        me = t.rank
        out = np.zeros(sum(counts)) if me == root else None
        algorithms.gather(t, BOUND, blocks[me], out, root, counts, segment)
        mine = np.zeros(counts[me])
        algorithms.scatter(t, BOUND, out if me == root else None, mine, root, counts, segment)
        return out, mine

    for r, (gathered, scattered) in enumerate(simulate(n, body)):
        if r == root:
            np.testing.assert_array_equal(gathered, whole)
        np.testing.assert_array_equal(scattered, blocks[r])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), count=st.integers(0, 300), root=st.integers(0, 7), segment=st.integers(1, 50),
       op=st.sampled_from(["sum", "max", "avg"]))
def test_reduce_leaves_the_reduction_on_the_root(n, count, root, segment, op):
    root %= n
    inputs = [rank_input(r, count, np.float64, op) for r in range(n)]

    def body(t):
        work = np.empty(count)
        algorithms.reduce(t, BOUND, inputs[t.rank], work, root, op, segment)
        return work

    results = simulate(n, body)
    np.testing.assert_array_equal(results[root], reference(inputs, op))
