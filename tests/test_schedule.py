"""Tier 1: the ring schedules as data. Replays them symbolically, with sets of contributions
instead of numbers, so "every element reduced exactly once from every rank" is checked directly."""
import pytest
from hypothesis import given, strategies as st

from ring.partition import chunk_bounds
from ring.schedule import (allgather_plan, allgather_steps, broadcast_plan, core_size, doubling_gather_plan,
                           halving_plans, reduce_scatter_plan, reduce_scatter_steps)

WORLD_SIZES = range(1, 9)
pytestmark = pytest.mark.quick   # (pure and fast: every schedule's properties)


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_reduce_scatter_collects_each_contribution_exactly_once(n):
    held = [[{rank} for _ in range(n)] for rank in range(n)]   # held[rank][chunk]: whose data it sums
    for step in range(n - 1):
        messages = [held[rank][reduce_scatter_steps(rank, n)[step][0]] for rank in range(n)]
        for rank in range(n):
            recv_chunk = reduce_scatter_steps(rank, n)[step][1]
            incoming = messages[(rank - 1) % n]
            assert not incoming & held[rank][recv_chunk], "a contribution would be counted twice"
            held[rank][recv_chunk] = held[rank][recv_chunk] | incoming
    for rank in range(n):
        assert held[rank][rank] == set(range(n)), f"rank {rank} does not own its complete chunk"


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_allgather_delivers_every_chunk_to_every_rank(n):
    has = [{rank} for rank in range(n)]
    for step in range(n - 1):
        sent = [allgather_steps(rank, n)[step][0] for rank in range(n)]
        for rank in range(n):
            assert sent[rank] in has[rank], "a rank would forward a chunk it does not have yet"
        for rank in range(n):
            recv_chunk = allgather_steps(rank, n)[step][1]
            assert recv_chunk == sent[(rank - 1) % n], "receiver and sender disagree on the chunk"
            has[rank].add(recv_chunk)
    assert all(h == set(range(n)) for h in has)


def _messages(plan, direction):
    return [getattr(t, direction) for t in plan if getattr(t, direction) is not None]


@given(n=st.integers(1, 8), count=st.integers(0, 300), segment=st.integers(1, 40))
def test_what_a_rank_sends_is_exactly_what_its_right_neighbour_receives(n, count, segment):
    bounds = chunk_bounds(count, n)
    for make in (reduce_scatter_plan, allgather_plan):
        plans = [make(rank, bounds, segment) for rank in range(n)]
        for rank in range(n):
            assert _messages(plans[rank], "send") == _messages(plans[(rank + 1) % n], "recv")


@given(n=st.integers(1, 8), count=st.integers(0, 300), segment=st.integers(1, 40), root=st.integers(0, 7))
def test_broadcast_chain_reaches_every_rank_in_order(n, count, segment, root):
    root %= n
    plans = [broadcast_plan(rank, n, root, count, segment) for rank in range(n)]
    every_segment = [(a, min(a + segment, count)) for a in range(0, count, segment)]
    for rank in range(n):
        assert _messages(plans[rank], "send") == _messages(plans[(rank + 1) % n], "recv")
        if rank != root:
            assert _messages(plans[rank], "recv") == every_segment
    assert _messages(plans[(root - 1) % n], "send") == [] or n == 1


@given(n=st.integers(2, 8), count=st.integers(0, 300), segment=st.integers(1, 40))
def test_a_send_never_forwards_data_that_is_still_being_reduced(n, count, segment):
    """A send may read a range only after the transfer that writes it has finished."""
    bounds = chunk_bounds(count, n)
    for rank in range(n):
        plan = reduce_scatter_plan(rank, bounds, segment)
        for previous, t in zip(plan, plan[1:]):
            overlaps = (t.send and previous.recv and t.send[0] < previous.recv[1]
                        and previous.recv[0] < t.send[1])
            if overlaps:
                assert t.send_waits


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 31, 64])
@pytest.mark.parametrize("count, segment", [(0, 4), (5, 2), (1000, 7), (1000, 1000)])
def test_halving_doubling_plans_pair_up_and_leave_each_core_rank_its_chunk(n, count, segment):
    """Between any two ranks, what one sends (in order) is what the other receives (same sizes,
    same order): MPI pairs messages so. After the halving, core rank r owns chunk r of p."""
    p = core_size(n)
    plans = {r: halving_plans(r, n, count, segment) for r in range(n)}
    gathers = {r: doubling_gather_plan(r, n, count, segment) for r in range(n)}
    for r in range(n):
        assert plans[r][2] == (chunk_bounds(count, p)[r] if r < p else (0, 0))
    for phase in (lambda r: plans[r][0] + plans[r][1], lambda r: gathers[r]):
        sent = {(a, t.peer): [] for a in range(n) for t in phase(a)}
        received = {(t.peer, b): [] for b in range(n) for t in phase(b)}
        for a in range(n):
            for t in phase(a):
                if t.send is not None:
                    sent[(a, t.peer)].append(t.send[1] - t.send[0])
                if t.recv is not None:
                    received[(t.peer, a)].append(t.recv[1] - t.recv[0])
        for pair in set(sent) | set(received):
            assert sent.get(pair, []) == received.get(pair, []), f"n={n}: {pair} sends and receives differ"
