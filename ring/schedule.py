"""The ring algorithms as data: which elements each rank sends, receives and reduces, in order.

Nothing here touches a network. A *plan* is a tuple of :class:`Transfer`, one per
message pair, that :func:`ring.execute.run` walks over a transport.

Direction: rank ``r`` always sends to its right neighbour ``(r + 1) % n`` and
receives from its left neighbour ``(r - 1) % n``.

Reduce-scatter, n - 1 steps. At step ``s`` rank ``r`` sends chunk ``(r - s - 1) % n``
and receives chunk ``(r - s - 2) % n``, which it reduces with its own copy of that
chunk. The chunk a rank receives is the one its left neighbour sent, so each chunk
travels once around the ring picking up one contribution per hop and ends, complete,
on the rank with its own index. With 4 ranks (``send -> recv`` chunk indices)::

    step   rank 0   rank 1   rank 2   rank 3
     0     3 -> 2   0 -> 3   1 -> 0   2 -> 1
     1     2 -> 1   3 -> 2   0 -> 3   1 -> 0
     2     1 -> 0   2 -> 1   3 -> 2   0 -> 3     rank r now owns reduced chunk r

Follow chunk 0: rank 1 sends its raw copy to rank 2 (step 0), rank 2 adds its own
and passes it to rank 3 (step 1), rank 3 adds and passes to rank 0 (step 2), which
adds the last contribution. Every element is reduced exactly once on every rank
except the one that started it.

All-gather, n - 1 steps. At step ``s`` rank ``r`` sends chunk ``(r - s) % n`` and
receives chunk ``(r - s - 1) % n``, copying it into place::

    step   rank 0   rank 1   rank 2   rank 3
     0     0 -> 3   1 -> 0   2 -> 1   3 -> 2
     1     3 -> 2   0 -> 3   1 -> 0   2 -> 1
     2     2 -> 1   3 -> 2   0 -> 3   1 -> 0     every rank holds every chunk

Each step moves one chunk (1/n of the buffer) per rank, so an all-reduce sends
and receives 2(n-1)/n of the buffer per rank: the bandwidth-optimal amount.

Chunks are cut into segments (bounded messages, see ``ring.partition``) so the
receive scratch is bounded and the reduction of one segment can overlap the
transfer of the next.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import zip_longest

from ring.partition import Range, chunk_bounds, segment_bounds


@dataclass(frozen=True)
class Transfer:
    """One message pair: a send to the right neighbour and a receive from the left, posted together.

    ``send``/``recv`` are element ranges of the flat buffer (``None``: nothing that way).
    ``send_from_input``: read the caller's input rather than the output buffer
    (the first reduce-scatter step sends raw, not yet reduced, data).
    ``reduce``: the received elements are combined with the input's elements at the
    same range and written to the output; otherwise they land in the output as is.
    ``send_waits``: the send reads what the previous transfer writes, so it may only be
    posted once that transfer is finished.
    ``peer``: the rank both directions talk to, for the schedules that are not rings
    (``None``: the ring's neighbours). A plan with peers runs in lockstep.
    ``source``: where the receive comes from when that is not ``peer`` (the all-to-all's
    pairwise steps, ``ring.personalized_schedule``).
    """

    send: Range | None
    recv: Range | None
    reduce: bool
    send_from_input: bool = False
    send_waits: bool = False
    peer: int | None = None
    source: int | None = None


class Plan(tuple):
    """A tuple of Transfers that also says whether anything in it can overlap.

    ``lockstep`` is true when every send forwards what the transfer before it
    received (one segment per chunk: small messages, broadcast's chain). Then there
    is nothing to overlap and each transfer can be one blocking exchange.
    """

    lockstep: bool

    def __new__(cls, transfers):
        plan = super().__new__(cls, transfers)
        plan.lockstep = all(t.send_waits for t in plan[1:])
        return plan


def right(rank: int, nranks: int) -> int:
    """The rank this rank sends to."""
    return (rank + 1) % nranks


def left(rank: int, nranks: int) -> int:
    """The rank this rank receives from."""
    return (rank - 1) % nranks


def reduce_scatter_steps(rank: int, nranks: int) -> list[tuple[int, int]]:
    """(send chunk, recv chunk) per reduce-scatter step; see the module table.

    >>> reduce_scatter_steps(0, 4)
    [(3, 2), (2, 1), (1, 0)]
    """
    return [((rank - s - 1) % nranks, (rank - s - 2) % nranks) for s in range(nranks - 1)]


def allgather_steps(rank: int, nranks: int) -> list[tuple[int, int]]:
    """(send chunk, recv chunk) per all-gather step; see the module table.

    >>> allgather_steps(0, 4)
    [(0, 3), (3, 2), (2, 1)]
    """
    return [((rank - s) % nranks, (rank - s - 1) % nranks) for s in range(nranks - 1)]


def _overlaps(a: Range | None, b: Range | None) -> bool:
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1] and a[0] < a[1]


def _segmented(steps, bounds, segment_elems, *, reduce: bool, first_from_input: bool):
    plan: list[Transfer] = []
    for step, (send_chunk, recv_chunk) in enumerate(steps):
        sends = segment_bounds(bounds[send_chunk], segment_elems)
        recvs = segment_bounds(bounds[recv_chunk], segment_elems)
        for send, recv in zip_longest(sends, recvs):
            previous = plan[-1].recv if plan else None
            plan.append(Transfer(send=send, recv=recv, reduce=reduce,
                                 send_from_input=first_from_input and step == 0,
                                 send_waits=_overlaps(send, previous)))
    return Plan(plan)


@lru_cache(maxsize=256)
def reduce_scatter_plan(rank: int, bounds: tuple[Range, ...], segment_elems: int) -> Plan:
    """Transfers of the reduce-scatter half for ``rank``; chunk ``rank`` ends fully reduced in the output.

    >>> reduce_scatter_plan(0, ((0, 1), (1, 2)), 4)[0]
    Transfer(send=(1, 2), recv=(0, 1), reduce=True, send_from_input=True, send_waits=False, peer=None, source=None)
    """
    steps = reduce_scatter_steps(rank, len(bounds))
    return _segmented(steps, bounds, segment_elems, reduce=True, first_from_input=True)


@lru_cache(maxsize=256)
def allgather_plan(rank: int, bounds: tuple[Range, ...], segment_elems: int) -> Plan:
    """Transfers of the all-gather half for ``rank``; expects chunk ``rank`` already in the output.

    >>> allgather_plan(0, ((0, 1), (1, 2)), 4)[0]
    Transfer(send=(0, 1), recv=(1, 2), reduce=False, send_from_input=False, send_waits=False, peer=None, source=None)
    """
    steps = allgather_steps(rank, len(bounds))
    return _segmented(steps, bounds, segment_elems, reduce=False, first_from_input=False)


@lru_cache(maxsize=256)
def broadcast_plan(rank: int, nranks: int, root: int, count: int, segment_elems: int) -> Plan:
    """A pipelined chain along the ring: root -> root+1 -> ... -> root-1, segment by segment.

    While a rank receives segment k from its left it forwards segment k-1 to its right,
    so for large buffers every link is busy at once and the time approaches one
    buffer's transfer time (bus bandwidth = algorithm bandwidth, as nccl-tests counts it).

    >>> [(t.send, t.recv) for t in broadcast_plan(1, 3, root=0, count=8, segment_elems=4)]
    [(None, (0, 4)), ((0, 4), (4, 8)), ((4, 8), None)]
    """
    position = (rank - root) % nranks
    segments = segment_bounds((0, count), segment_elems)
    receives = position > 0
    sends = position < nranks - 1
    if not receives:   # the root has everything already: no one-segment lag
        return Plan(Transfer(send=seg, recv=None, reduce=False) for seg in segments) if sends else Plan(())
    plan = []
    for k in range(len(segments) + (1 if sends else 0)):
        recv = segments[k] if k < len(segments) else None
        send = segments[k - 1] if sends and k >= 1 else None
        plan.append(Transfer(send=send, recv=recv, reduce=False,
                             send_waits=_overlaps(send, plan[-1].recv if plan else None)))
    return Plan(p for p in plan if p.send or p.recv)


def core_size(nranks: int) -> int:
    """The largest power of two <= ``nranks``: the ranks that halve and double (the others fold in).

    >>> [core_size(n) for n in (1, 2, 3, 4, 5, 8, 9)]
    [1, 2, 2, 4, 4, 8, 8]
    """
    return 1 << (nranks.bit_length() - 1)


@lru_cache(maxsize=256)
def halving_plans(rank: int, nranks: int, count: int, segment_elems: int) -> tuple[Plan, Plan, Range]:
    """Rabenseifner's reduce-scatter by recursive halving, for ``rank``: (the transfers that read the
    input, the ones that run in place after them, the range this rank then owns reduced).

    With p = ``core_size(nranks)``, the buffer is cut into p chunks (``chunk_bounds``). A rank
    r >= p first hands its whole input to rank r - p, which reduces it into its own (the fold),
    and then owns nothing. The p core ranks halve: at distance d = p/2, p/4, ..., 1 rank r pairs
    with r ^ d, sends the half of its current chunk range that the partner keeps, and reduces the
    half it keeps; after log2(p) steps core rank r owns chunk r. For 4 ranks (chunks sent ->
    chunks kept):

    =====  ==========  ==========  ==========  ==========
    step   rank 0      rank 1      rank 2      rank 3
    =====  ==========  ==========  ==========  ==========
    d=2    2,3 -> 0,1  2,3 -> 0,1  0,1 -> 2,3  0,1 -> 2,3
    d=1    1 -> 0      0 -> 1      3 -> 2      2 -> 3
    =====  ==========  ==========  ==========  ==========

    Each rank sends (p-1)/p of the buffer, as in the ring, in log2(p) messages instead of p-1.

    >>> first, rest, owned = halving_plans(1, 4, 8, 100)
    >>> [(t.send, t.recv, t.peer) for t in first + rest], owned
    ([((4, 8), (0, 4), 3), ((0, 2), (2, 4), 0)], (2, 4))
    >>> first, rest, owned = halving_plans(4, 5, 8, 100)     # folds into rank 0
    >>> [(t.send, t.recv, t.peer) for t in first], rest, owned
    ([((0, 8), None, 0)], (), (0, 0))
    """
    p = core_size(nranks)
    whole = (0, count)
    if rank >= p:   # hands its input to rank - p, then owns nothing
        return Plan(cut_into_segments([_pair(whole, None, rank - p, from_input=True)], segment_elems)), Plan(()), (0, 0)
    bounds = chunk_bounds(count, p)
    steps = [_pair(None, whole, rank + p, reduce=True)] if rank + p < nranks else []
    lo, hi, distance = 0, p, p // 2
    while distance:
        mid = lo + distance
        keep, give = ((mid, hi), (lo, mid)) if rank & distance else ((lo, mid), (mid, hi))
        steps.append(_pair(_elements(bounds, give), _elements(bounds, keep), rank ^ distance, reduce=True,
                           from_input=not steps))
        lo, hi = keep
        distance //= 2
    # The first step reads the input; the others reduce in place what it left in the output.
    return Plan(cut_into_segments(steps[:1], segment_elems)), Plan(cut_into_segments(steps[1:], segment_elems)), bounds[rank]


@lru_cache(maxsize=256)
def doubling_gather_plan(rank: int, nranks: int, count: int, segment_elems: int) -> Plan:
    """The all-gather half of Rabenseifner's all-reduce: recursive doubling of the owned chunks
    (the halving steps backwards: at d = 1, 2, ..., p/2 rank r sends the chunk range it holds to
    r ^ d and receives the partner's), then the folded ranks r >= p get the whole result from r - p.

    >>> [(t.send, t.recv, t.peer) for t in doubling_gather_plan(1, 4, 8, 100)]
    [((2, 4), (0, 2), 0), ((0, 4), (4, 8), 3)]
    >>> [(t.send, t.recv, t.peer) for t in doubling_gather_plan(4, 5, 8, 100)]
    [(None, (0, 8), 0)]
    """
    p = core_size(nranks)
    whole = (0, count)
    if rank >= p:   # gets the whole result from rank - p
        return Plan(cut_into_segments([_pair(None, whole, rank - p)], segment_elems))
    bounds = chunk_bounds(count, p)
    steps = []
    distance = 1
    while distance < p:   # this rank holds the d chunks from (rank // d) * d; its partner the next or previous d
        mine = (rank // distance) * distance
        theirs = ((rank ^ distance) // distance) * distance
        steps.append(_pair(_elements(bounds, (mine, mine + distance)), _elements(bounds, (theirs, theirs + distance)),
                           rank ^ distance))
        distance *= 2
    if rank + p < nranks:
        steps.append(_pair(whole, None, rank + p))
    return Plan(cut_into_segments(steps, segment_elems))


def _elements(bounds: tuple[Range, ...], chunks: Range) -> Range:
    """The element range of chunks ``chunks[0]`` .. ``chunks[1] - 1``."""
    return bounds[chunks[0]][0], bounds[chunks[1] - 1][1]


def _pair(send: Range | None, recv: Range | None, peer: int, reduce: bool = False,
          from_input: bool = False) -> Transfer:
    """One exchange with ``peer`` (the schedules that are not rings run in lockstep)."""
    return Transfer(send=send, recv=recv, reduce=reduce, send_from_input=from_input, send_waits=True, peer=peer)


def cut_into_segments(transfers: list[Transfer], segment_elems: int) -> list[Transfer]:
    """Cut each transfer into message pairs of at most ``segment_elems`` elements each way."""
    cut = []
    for t in transfers:
        sends = segment_bounds(t.send, segment_elems) if t.send else []
        recvs = segment_bounds(t.recv, segment_elems) if t.recv else []
        for send, recv in zip_longest(sends, recvs):
            cut.append(Transfer(send=send, recv=recv, reduce=t.reduce, send_from_input=t.send_from_input,
                                send_waits=True, peer=t.peer, source=t.source))
    return cut
