"""The personalized schedules as data: each rank's block goes to one rank, not to all of them.

In an all-to-all every rank has a block for every rank; in a gather every rank has a block for
the root; in a scatter the root has a block for every rank. Nothing is reduced on the way, so
these plans only say who sends which elements to whom; ``ring.execute.run`` walks them like the
ring's. A plan's ranges are element ranges of the flat send buffer (``send``, read from the
input) and of the flat receive buffer (``recv``, the output); a rank's block for itself is
copied by the caller and is in no plan.

All-to-all by pairwise exchange, n - 1 steps: at step s = 1 .. n-1 rank r sends its block for
rank (r + s) % n and receives the block of rank (r - s) % n, so every rank sends one block and
receives one block at every step and no link carries two. With 4 ranks (``to <- from``)::

    step   rank 0   rank 1   rank 2   rank 3
     1     1 <- 3   2 <- 0   3 <- 1   0 <- 2
     2     2 <- 2   3 <- 3   0 <- 0   1 <- 1     (with n even, step n/2 pairs ranks off)
     3     3 <- 1   0 <- 2   1 <- 3   2 <- 0

Gather: every other rank sends its block to the root, which receives them in rank order after
its own (root + 1, root + 2, ...); scatter is the same plan backwards. The root's link carries
(n - 1)/n of the data either way, which no schedule avoids, so the simple plan is the fast one.
"""
from __future__ import annotations

from functools import lru_cache

from ring.partition import Range
from ring.schedule import Plan, Transfer, cut_into_segments


def alltoall_steps(rank: int, nranks: int) -> list[tuple[int, int]]:
    """(rank sent to, rank received from) per all-to-all step; see the module table.

    >>> alltoall_steps(1, 4)
    [(2, 0), (3, 3), (0, 2)]
    """
    return [((rank + s) % nranks, (rank - s) % nranks) for s in range(1, nranks)]


@lru_cache(maxsize=256)
def alltoall_plan(rank: int, sends: tuple[Range, ...], recvs: tuple[Range, ...], segment_elems: int) -> Plan:
    """The all-to-all transfers of ``rank``: ``sends[j]`` is the range of its input that goes to
    rank j, ``recvs[j]`` the range of its output that rank j's block fills. Empty blocks send no
    message (the peer's matching range is empty too: the counts agree).

    >>> [(t.send, t.recv, t.peer, t.source) for t in alltoall_plan(0, ((0, 1), (1, 3), (3, 3)),
    ...                                                                  ((0, 1), (1, 2), (2, 4)), 8)]
    [((1, 3), (2, 4), 1, 2), (None, (1, 2), 2, 1)]
    """
    transfers = [Transfer(send=sends[to], recv=recvs[frm], reduce=False, send_from_input=True, send_waits=True,
                          peer=to, source=frm)
                 for to, frm in alltoall_steps(rank, len(sends))]
    return Plan(cut_into_segments(transfers, segment_elems))


@lru_cache(maxsize=256)
def gather_plan(rank: int, root: int, bounds: tuple[Range, ...], segment_elems: int) -> Plan:
    """The gather transfers of ``rank``: the root receives rank j's block into ``bounds[j]`` of
    its output, in turn from root + 1 on; every other rank sends its block, elements
    ``[0, its size)`` of its input (its own compact array).

    >>> [(t.send, t.recv, t.peer) for t in gather_plan(0, 0, ((0, 2), (2, 3), (3, 5)), 8)]
    [(None, (2, 3), 1), (None, (3, 5), 2)]
    >>> [(t.send, t.recv, t.peer) for t in gather_plan(2, 0, ((0, 2), (2, 3), (3, 5)), 8)]
    [((0, 2), None, 0)]
    """
    n = len(bounds)
    if rank != root:
        start, stop = bounds[rank]
        return Plan(cut_into_segments([_one_way((0, stop - start), None, root)], segment_elems))
    others = [(root + k) % n for k in range(1, n)]
    return Plan(cut_into_segments([_one_way(None, bounds[j], j) for j in others], segment_elems))


@lru_cache(maxsize=256)
def scatter_plan(rank: int, root: int, bounds: tuple[Range, ...], segment_elems: int) -> Plan:
    """The scatter transfers of ``rank``: the gather backwards. The root sends ``bounds[j]`` of
    its input to rank j; every other rank receives its block into ``[0, its size)`` of its output.

    >>> [(t.send, t.recv, t.peer) for t in scatter_plan(0, 0, ((0, 2), (2, 3), (3, 5)), 8)]
    [((2, 3), None, 1), ((3, 5), None, 2)]
    >>> [(t.send, t.recv, t.peer) for t in scatter_plan(1, 0, ((0, 2), (2, 3), (3, 5)), 8)]
    [(None, (0, 1), 0)]
    """
    return Plan(Transfer(send=t.recv, recv=t.send, reduce=False, send_from_input=True, send_waits=True,
                         peer=t.peer) for t in gather_plan(rank, root, bounds, segment_elems))


def _one_way(send: Range | None, recv: Range | None, peer: int) -> Transfer:
    return Transfer(send=send, recv=recv, reduce=False, send_from_input=True, send_waits=True, peer=peer)

