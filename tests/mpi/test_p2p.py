"""Tier 2, issue 24: point-to-point messages in real worlds of 1..4 ranks: what arrives is what was
sent (rank-dependent data, every dtype, empty messages, any-source receives, many messages with
one tag kept in order), sends to self, and messages posted while async collectives are queued.
Mismatched messages stop the runtime, so they are tested in their own worlds (tests/test_edges.py).
Every wait is bounded."""
import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from tests.support.in_world import N, RANK, agree


pytestmark = pytest.mark.mpi

BOUND_S = 30
RIGHT, LEFT = (RANK + 1) % N, (RANK - 1) % N


def _message(rank: int, count: int, dtype, salt: int = 0) -> np.ndarray:
    return ((np.arange(count) * 5 + rank * 3 + salt) % 13).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int8, np.int64, np.uint16, np.bool_])
@pytest.mark.parametrize("count", [0, 1, 1000, 300_001])
def test_a_ring_of_messages_arrives_whole(dtype, count):
    sent = _message(RANK, count, dtype)
    got = np.full(count, 1, dtype)
    requests = [col.irecv(got, source=LEFT, tag=7), col.isend(sent, dest=RIGHT, tag=7)]
    agree(col.wait_all(requests, timeout=BOUND_S) == [LEFT, RIGHT], "wait_all did not return the peers")
    agree(np.array_equal(got, _message(LEFT, count, dtype)), f"rank {RANK} received the wrong data")


def test_receives_from_any_rank_name_the_sender_and_keep_each_senders_order():
    """Every rank sends three messages with one tag to rank 0, which receives them from any rank:
    each sender's messages arrive in the order sent, and each receive names its sender."""
    if RANK == 0:
        got = [np.empty(5, np.int64) for _ in range(3 * (N - 1))]
        requests = [col.irecv(buf, source=None, tag=2) for buf in got]
        sources = col.wait_all(requests, timeout=BOUND_S)
        arrived = {source: [int(buf[0]) for buf, s in zip(got, sources) if s == source] for source in range(1, N)}
        ok = all(arrived[source] == [source * 10 + k for k in range(3)] for source in arrived)
    else:
        col.wait_all([col.isend(np.full(5, RANK * 10 + k, np.int64), dest=0, tag=2) for k in range(3)],
                     timeout=BOUND_S)
        ok, arrived = True, None
    agree(ok, f"each sender's messages in the order sent, from the sender named: {arrived}")


def test_receives_from_any_rank_posted_one_after_another_take_every_message_in_order():
    """A parameter server's loop: the last rank receives from any rank, one receive after another,
    20 messages from every other rank (across hosts, MPICH over UCX lost them once one receive from
    any rank had taken a message from another host: ``ring.transport.mpi.p2p``)."""
    if N < 2:
        pytest.skip("needs two ranks")
    server, count = N - 1, 20
    if RANK == server:
        buf, arrived = np.empty(2, np.int64), {}
        for _ in range(count * (N - 1)):
            source = col.recv(buf, source=None, tag=5, timeout=BOUND_S)
            arrived.setdefault(source, []).append(int(buf[1]) if buf[0] == source else -1)
        ok = sorted(arrived) == list(range(N - 1)) and all(seen == list(range(count)) for seen in arrived.values())
    else:
        for k in range(count):
            col.send(np.array([RANK, k], np.int64), dest=server, tag=5, timeout=BOUND_S)
        ok, arrived = True, None
    agree(ok, f"every sender's messages, in the order sent: {arrived}")


def test_receives_from_any_rank_take_every_message_of_a_flood_on_three_tags():
    """Every other rank sends rank 0 30 rounds of three messages, each on its own tag (empty, 40 KB:
    a header and its bytes, and 64 B), all at once; rank 0 takes one tag's from any rank first, then
    the others'. Over libfabric's tcp across hosts, probes for them missed some (see
    ``ring.transport.mpi.p2p``)."""
    if N < 2:
        pytest.skip("needs two ranks")
    rounds, large = 30, 5000
    if RANK == 0:
        arrived = {}
        buf = np.empty(large)
        for _ in range(rounds * (N - 1)):
            source = col.recv(buf, source=None, tag=13, timeout=BOUND_S)
            arrived.setdefault(source, []).append(int(buf[0]) if np.all(buf == buf[0]) else -1)
        small = np.empty(8)
        for _ in range(rounds * (N - 1)):
            col.recv(np.empty(0), source=None, tag=11, timeout=BOUND_S)
            col.recv(small, source=None, tag=12, timeout=BOUND_S)
        ok = sorted(arrived) == list(range(1, N)) and \
            all(seen == [source * 1000 + k for k in range(rounds)] for source, seen in arrived.items())
    else:
        sends = []
        for k in range(rounds):
            sends += [col.isend(np.empty(0), dest=0, tag=11), col.isend(np.full(large, RANK * 1000.0 + k), dest=0, tag=13),
                      col.isend(np.full(8, float(k)), dest=0, tag=12)]
        col.wait_all(sends, timeout=BOUND_S)
        ok, arrived = True, None
    agree(ok, f"every sender's large messages, whole and in the order sent: {arrived}")


def test_two_receives_with_one_tag_take_one_ranks_messages_in_posting_order():
    """Rank 0 sends every other rank a small message, then a large one, with one tag; each posts a
    receive from any rank for the first and one from rank 0 for the second, before either comes: the
    first posted takes the first sent (as a worker's pull of its version and its parameters)."""
    if N < 2:
        pytest.skip("needs two ranks")
    for step in range(10):
        if RANK == 0:
            for peer in range(1, N):
                col.send(np.array([step, peer], np.int64), dest=peer, tag=6, timeout=BOUND_S)
                col.send(_message(peer, 4810, np.float32, step), dest=peer, tag=6, timeout=BOUND_S)
            ok = True
        else:
            version, params = np.zeros(2, np.int64), np.zeros(4810, np.float32)
            col.wait_all([col.irecv(version, source=None, tag=6), col.irecv(params, source=0, tag=6)],
                         timeout=BOUND_S)
            ok = version.tolist() == [step, RANK] and np.array_equal(params, _message(RANK, 4810, np.float32, step))
        agree(ok, f"step {step}: rank {RANK} took the messages out of order")


def test_messages_to_self_of_8_mb_complete_every_time():
    for k in range(20):
        sent = np.arange(1 << 20, dtype=np.float64) + RANK + k
        got = np.empty_like(sent)
        col.wait_all([col.irecv(got, source=RANK, tag=1), col.isend(sent, dest=RANK, tag=1)], timeout=5)
        agree(np.array_equal(got, sent), f"rank {RANK}: a message to itself arrived wrong")


def test_point_to_point_never_waits_for_queued_collectives():
    """Rank 0 queues an async all-reduce, then sends to rank 1, which receives before it joins the
    all-reduce: valid in MPI, and it must not deadlock."""
    if N < 2:
        pytest.skip("needs two ranks")
    x = np.full(100_000, RANK + 1.0)
    message = np.empty(1 << 18)
    if RANK == 0:
        work = col.allreduce(x, async_op=True, timeout=BOUND_S)
        col.isend(np.arange(1 << 18, dtype=np.float64), dest=1, tag=4).wait(timeout=BOUND_S)
        total = work.wait(timeout=BOUND_S)
    else:
        if RANK == 1:
            col.recv(message, source=0, tag=4, timeout=BOUND_S)
        total = col.allreduce(x, timeout=BOUND_S)
    agree(np.all(total == N * (N + 1) / 2), "the all-reduce was wrong")
    if RANK == 1:
        agree(np.array_equal(message, np.arange(1 << 18, dtype=np.float64)), "the message was wrong")
    else:
        agree(True, "")


def test_a_message_matches_mpi4pys_own_sendrecv():
    """The bytes that arrive are the bytes mpi4py's Sendrecv delivers for the same exchange."""
    sent = _message(RANK, 4097, np.float32, salt=1)
    ours, theirs = np.empty_like(sent), np.empty_like(sent)
    col.wait_all([col.irecv(ours, source=LEFT), col.isend(sent, dest=RIGHT)], timeout=BOUND_S)
    MPI.COMM_WORLD.Sendrecv(sent, dest=RIGHT, recvbuf=theirs, source=LEFT)
    agree(ours.tobytes() == theirs.tobytes(), "point-to-point and mpi4py's Sendrecv differ")


def test_a_timeout_of_inf_means_no_bound():
    sent = _message(RANK, 10, np.int32)
    got = np.empty_like(sent)
    col.wait_all([col.irecv(got, source=LEFT), col.isend(sent, dest=RIGHT)], timeout=float("inf"))
    work = col.allreduce(sent, async_op=True, timeout=1e12)
    agree(np.array_equal(work.wait(timeout=float("inf")), MPI.COMM_WORLD.allreduce(sent)) and
          np.array_equal(got, _message(LEFT, 10, np.int32)), "a call with an unbounded timeout was wrong")
    col.barrier(timeout=1e300)
