"""Tier 2, issue 61: a doubling message of 8-24 KiB to a rank of its host goes in pieces below MPICH's
single-copy size (``ring.transport.mpi.transport.Persistent``). The calls around each cut keep
mpi4py's bits; a rank receives exactly the pieces its partner announced, whatever its own message was
(ranks that disagree, an all-gather whose rows differ, a rank that does not cut), so that no piece is
left behind for a later call. Runs at every world size; every call is bounded by timeout=."""
import os

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from collectives.errors import CollectiveUsageError
from ring.transport.mpi import transport as mpi_transport

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
ODD = RANK == N - 1
BOUND_S = 20
HEADER = 264   # ring.doubling's header, in front of every doubling message
#: Payloads whose messages end just before, at and after each cut (7936, MPICH's 8192, 15872, 23808)
PAYLOADS = [7664, 7672, 7928, 7936, 8192, 15600, 15608, 15616, 23536, 23544, 23552]

needs_two = pytest.mark.skipif(N < 2, reason="needs two ranks")


def _contribution(nbytes: int, step: int) -> np.ndarray:
    return ((np.arange(nbytes) * (RANK + 3) + step) % 7 + 1).astype(np.uint8)


def _allreduce_reference(x: np.ndarray) -> np.ndarray:
    result = np.empty_like(x)
    COMM.Allreduce(x, result, op=MPI.SUM)
    return result


def _allgather_reference(x: np.ndarray) -> np.ndarray:
    counts = COMM.allgather(x.size)
    result = np.empty(sum(counts), x.dtype)
    COMM.Allgatherv(x, [result, counts])
    return result


def _assert_exact(collective: str, x: np.ndarray) -> None:
    """``collective`` of ``x`` (broadcast: from rank 0) gives mpi4py's bits."""
    if collective == "allreduce":
        assert col.allreduce(x, timeout=BOUND_S).tobytes() == _allreduce_reference(x).tobytes()
    elif collective == "broadcast":
        expected = COMM.bcast(x if RANK == 0 else None, root=0)
        assert col.broadcast(x.copy(), timeout=BOUND_S).tobytes() == expected.tobytes()
    else:
        assert col.allgather(x, timeout=BOUND_S).tobytes() == _allgather_reference(x).tobytes()


@pytest.mark.skipif(not mpi_transport._MPICH or "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD" in os.environ
                    or os.environ.get("MPIR_CVAR_CH4_CMA_ENABLE") == "0", reason="MPICH's default single copy")
@needs_two
def test_a_message_of_8_to_24_kib_to_a_rank_of_this_host_is_cut_below_mpichs_single_copy_size():
    transport = col.world_group().transport
    peer = (RANK + 1) % N
    if transport.hosts[peer] != transport.hosts[RANK]:
        pytest.skip("the peer is on another host")
    assert transport.pieces(peer, 8191) == []
    assert transport.pieces(peer, 8192) == [(0, 7936), (7936, 8192)]
    assert transport.pieces(peer, HEADER + 16384) == [(0, 7936), (7936, 15872), (15872, HEADER + 16384)]
    assert len(transport.pieces(peer, 23808)) == 3
    assert transport.pieces(peer, 23809) == []


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather"])
def test_calls_around_each_cut_keep_mpi4pys_bits_the_usual_way_and_in_the_lanes(collective, payload):
    for step in range(4):   # (the usual way, the lane, then its one function on two ranks)
        _assert_exact(collective, _contribution(payload, step))


@needs_two
@pytest.mark.parametrize("odd, others", [(16384, 1024), (1024, 16384), (8192, 23000), (30000, 8192),
                                         (16384, 8192)])
@pytest.mark.parametrize("lane_first", [False, True])
def test_ranks_whose_messages_are_cut_differently_are_refused_and_their_next_calls_are_exact(odd, others,
                                                                                          lane_first):
    mine = odd if ODD else others
    if lane_first:   # (the others' lane is open: their call takes it while the odd rank's takes the usual way)
        for step in range(2):
            x = _contribution(others, step)
            assert col.allreduce(x, timeout=BOUND_S).tobytes() == _allreduce_reference(x).tobytes()
    with pytest.raises(CollectiveUsageError, match="count differs across ranks"):
        col.allreduce(_contribution(mine, 9), timeout=BOUND_S)
    for collective, payload in [("allreduce", 16384), ("broadcast", 1024), ("allreduce", 8192), ("allgather", 100)]:
        _assert_exact(collective, _contribution(payload, 5))


@needs_two
@pytest.mark.parametrize("odd_rows, others_rows", [(16000, 40), (40, 16000), (8000, 23000)])
def test_an_allgather_whose_rows_differ_across_the_cuts_gathers_every_ranks_rows(odd_rows, others_rows):
    for step in range(3):
        x = _contribution(odd_rows if ODD else others_rows, step)
        assert col.allgather(x, timeout=BOUND_S).tobytes() == _allgather_reference(x).tobytes()
    x = _contribution(64, 0)
    assert col.allgather(x, timeout=BOUND_S).tobytes() == _allgather_reference(x).tobytes()


@needs_two
@pytest.mark.parametrize("cutting", ["only the odd rank", "all but the odd rank"])
def test_a_rank_that_cuts_its_messages_and_one_that_does_not_keep_mpi4pys_bits(cutting, monkeypatch):
    """The receiver follows what the sender's first piece says, not its own settings (a rank whose
    MPICH single-copy size was set higher cuts nothing)."""
    transport = col.world_group().transport
    if ODD != (cutting == "only the odd rank"):
        monkeypatch.setattr(transport, "_cuts", frozenset())
    transport._free_persistent()   # (each ready exchange is made again, and decides again whether it cuts)
    try:
        for payload in (8192 + 8, 16384 + 16, 23000):
            for step in range(3):
                for collective in ("allreduce", "broadcast", "allgather"):
                    _assert_exact(collective, _contribution(payload, step))
    finally:
        monkeypatch.undo()
        transport._free_persistent()
