"""The collectives, each composed from plans (``ring.schedule``, ``ring.personalized_schedule``) and the executor.

All take flat, contiguous arrays of one dtype, a transport and the call's ``bound``
(which every wait honours: ``ring.transport.base.Bound``); validation and shapes
are the caller's business (see ``collectives``).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ring import arrays, doubling
from ring.compression import Codec
from ring.execute import run
from ring.partition import bounds_from_counts, chunk_bounds
from ring.personalized_schedule import alltoall_plan, gather_plan, scatter_plan
from ring.schedule import allgather_plan, broadcast_plan, doubling_gather_plan, halving_plans, reduce_scatter_plan
from ring.transport.base import Bound, Transport


def reduce_scatter(transport: Transport, bound: Bound, input: Any, work: Any, op: str, segment_elems: int,
                   codec: Codec | None = None) -> slice:
    """Reduce ``input`` across ranks into ``work``; returns the slice of ``work`` this rank owns.

    After the call ``work[owned]`` holds the reduction of every rank's ``input[owned]``
    (the chunks are split like ``np.array_split``); the rest of ``work`` is scratch.
    ``work`` may be ``input`` itself (in place), or else must not overlap it.

    "avg" on float16 divides each contribution by n before summing, so partial sums
    stay in range wherever the true average is (4 ranks of 30000 give 30000, not inf);
    wider types sum first and divide the owned chunk once, which rounds only once.

    ``codec``: the codec (``ring.compression``) that every message travels in: each hop decodes the
    partial sum it receives, adds its own contribution in ``work``'s dtype and encodes once to
    send it on. The owned chunk is left as summed, not rounded to the wire type. "avg" over a
    float16 wire type pre-scales as float16 data does (float16's range is the wire's).
    """
    bounds = chunk_bounds(work.size, transport.size)
    plan = reduce_scatter_plan(transport.rank, bounds, segment_elems)
    return _reduce_by(transport, bound, (plan,), bounds[transport.rank], input, work, op, codec)


def _reduce_by(transport: Transport, bound: Bound, plans: tuple, owned: tuple[int, int], input: Any, work: Any,
               op: str, codec: Codec | None = None) -> slice:
    """What every reduce-scatter does around its plans (see reduce_scatter): the first plan reads
    ``input``, the others reduce in place what it left in ``work``; "avg" pre-scales (float16 data
    or codec) or divides the ``owned`` range once. Returns that range as a slice."""
    n = transport.size
    xp = arrays.xp_of(work)
    prescale = _prescales(op, work.dtype, codec)
    if prescale:
        xp.true_divide(input, n, out=work)
        input = work
    elif n == 1 and work is not input:
        arrays.copy_(work, input)
    combine = arrays.combiner(xp, op)
    for k, plan in enumerate(plans):
        run(plan, transport, bound, work, input if k == 0 else None, combine, "reduce-scatter", codec)
    if op == "avg" and not prescale and n > 1:
        arrays.divide_(work[slice(*owned)], n)
    return slice(*owned)


def _prescales(op: str, dtype, codec: Codec | None = None) -> bool:
    """float16 "avg" divides each contribution by n before summing (see reduce_scatter), and so
    does "avg" whose partial sums travel in a codec of float16's narrow range (``Codec.narrow_range``)."""
    return op == "avg" and (dtype == np.float16 or (codec is not None and codec.narrow_range))


def allreduce_small(transport: Transport, bound: Bound, input: Any, output: Any, op: str, signature: bytes) -> bool:
    """All-reduce a small host array by recursive doubling (``ring.doubling``), checking ``signature``.

    About log2(n) messages instead of the ring's 2(n-1): the latency path. Returns
    False on every rank, with ``output`` untouched, if any rank's signature differs.
    The same rounding rules as the ring apply to "avg" (float16 pre-scales).
    """
    n = transport.size
    prescale = op == "avg" and input.dtype == np.float16   # (as _prescales says: inline, it runs on every call)
    payload = np.true_divide(input, n, dtype=input.dtype) if prescale else input
    agreed = doubling.agree(transport, bound, signature, payload, arrays.ufunc(np, op), output)
    if agreed and op == "avg" and not prescale and n > 1:
        arrays.divide_(output, n)
    return agreed


def allreduce(transport: Transport, bound: Bound, input: Any, output: Any, op: str, segment_elems: int,
              codec: Codec | None = None) -> None:
    """``output`` = reduction of every rank's ``input``, identical bits on every rank.

    Reduce-scatter leaves each rank one finished chunk; all-gather copies the
    finished chunks around the ring, so every rank ends with the same bytes.

    ``codec``: the codec (``ring.compression``) for every message (see reduce_scatter). The owner
    of each finished chunk rounds it through the wire type, so that its copy is what the others
    decode: every rank still ends with the same bits (re-encoding a decoded value is exact).
    """
    owned = reduce_scatter(transport, bound, input, output, op, segment_elems, codec)
    if codec is not None:
        codec.round_(output[owned])
    bounds = chunk_bounds(output.size, transport.size)
    run(allgather_plan(transport.rank, bounds, segment_elems), transport, bound, output, phase="all-gather",
        codec=codec)


def allreduce_halving_doubling(transport: Transport, bound: Bound,
                               input: Any, output: Any, op: str, segment_elems: int,
                               codec: Codec | None = None) -> None:
    """``allreduce`` by Rabenseifner's algorithm: reduce-scatter by recursive halving, all-gather by
    recursive doubling (``ring.schedule.halving_plans``, ``doubling_gather_plan``). The ring's bytes
    per rank in 2 log2(n) messages instead of 2(n-1), for the sizes where latency still counts; a
    world that is not a power of two first folds its extra ranks in (two more messages of the
    whole buffer). Each chunk is reduced on one rank and copied to the others: identical bits.
    ``codec``: the codec for every message, as in ``allreduce`` (the owner rounds its chunk).
    """
    n, rank = transport.size, transport.rank
    first, rest, owned = halving_plans(rank, n, output.size, segment_elems)
    mine = _reduce_by(transport, bound, (first, rest), owned, input, output, op, codec)
    if codec is not None:
        codec.round_(output[mine])
    run(doubling_gather_plan(rank, n, output.size, segment_elems), transport, bound, output, phase="all-gather",
        codec=codec)


def allreduce_two_level(local: Transport, across: Transport, bound: Bound, input: Any, output: Any, op: str,
                        segment_elems: int, across_segment_elems: int | None = None,
                        codec: Codec | None = None) -> None:
    """``allreduce`` over ranks on several hosts, in two levels (the hierarchical all-reduce of
    Horovod and NCCL): reduce-scatter within each host, all-reduce of each rank's chunk across
    hosts among the ranks with the same place on theirs (``across``), all-gather within each
    host (``local``). Every host must hold the same number of ranks. ``across_segment_elems``:
    the segment across hosts (default: ``segment_elems``). 4 ranks, 2 hosts:

    =======================  ==============  ==============
    step                     host A: 0, 1    host B: 2, 3
    =======================  ==============  ==============
    reduce-scatter (local)   0: A[c0]        2: B[c0]
                             1: A[c1]        3: B[c1]
    all-reduce (across)      0, 2: A[c0] + B[c0];  1, 3: A[c1] + B[c1]
    all-gather (local)       every rank: (A + B)[c0, c1]
    =======================  ==============  ==============

    Only the chunks (1/local size of the data) cross between hosts. "avg" averages within a
    host, then across hosts: the hosts being equal, that is the mean over every rank.

    ``codec``: the codec for the messages across hosts only, where the bytes cost most: within a
    host the data moves as it is (through memory, where encoding would cost more than it saves).
    The across step's ring leaves every rank's chunk rounded alike, and the local all-gather
    copies it: every rank ends with the same bits.
    """
    owned = reduce_scatter(local, bound, input, output, op, segment_elems)
    chunk = output[owned]
    allreduce(across, bound, chunk, chunk, op, across_segment_elems or segment_elems, codec)
    bounds = chunk_bounds(output.size, local.size)
    run(allgather_plan(local.rank, bounds, segment_elems), local, bound, output, phase="all-gather")


def allgather_small(transport: Transport, bound: Bound, counts: tuple[int, ...], data: np.ndarray | None,
                     signature: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """One recursive-doubling exchange that carries the check of ``signature``, every rank's
    ``counts`` (the same number of them on every rank) and, on the guess that every rank brings as
    many bytes as this one, every rank's ``data``: returns (``counts`` per rank, one row each, and
    the ranks' bytes laid end to end), or None on every rank if any rank's signature differs.

    Each rank's message holds its own counts and bytes in its own place and zeros elsewhere, and
    the messages are combined by bitwise or, which is exact for any dtype; on two ranks each
    message is its sender's counts and bytes alone (``doubling.swap``). The counts are always
    right; the bytes only when every rank brought as many as this one (which the counts tell).
    With ``data=None`` this is the all-gather's first step on the ring path: the counts alone.
    """
    n, width = transport.size, 0 if data is None else data.nbytes
    message, slot = allgather_message(1 if n == 2 else n, 0 if n == 2 else transport.rank, counts, width)
    if slot.size:
        slot[...] = data.view(np.uint8)
    if n == 2:   # (one exchange of each rank's own counts and bytes: doubling.swap)
        theirs = np.empty(message.size, np.uint8)
        if not doubling.swap(transport, bound, signature, message, theirs):
            return None
        return pair_gathered(transport.rank, message, theirs, len(counts))
    gathered = np.empty(message.size, np.uint8)   # (not empty_like: a Python function in numpy 2)
    if not doubling.agree(transport, bound, signature, message, np.bitwise_or, gathered):
        return None
    return allgather_parts(gathered, transport.size, len(counts))


def allgather_message(n: int, rank: int, counts: tuple[int, ...], width: int) -> tuple[np.ndarray, np.ndarray]:
    """The message of :func:`allgather_small` from rank ``rank`` of ``n`` with ``counts`` and ``width``
    bytes of data: every rank's counts (int64), then every rank's bytes, zeros but this rank's; and
    this rank's place for its bytes in it.

    >>> message, slot = allgather_message(2, 1, (3, -1), 4)
    >>> message[:32].view(np.int64).tolist(), message.size, slot.size
    ([0, 0, 3, -1], 40, 4)
    """
    k = len(counts)
    head = n * k * 8
    message = np.zeros(head + n * width, np.uint8)
    mine = message[:head].view(np.int64)
    for j, count in enumerate(counts):   # (element by element: a tuple assigned to a row converts slowly)
        mine[rank * k + j] = count
    return message, message[head + rank * width:head + (rank + 1) * width]


def pair_gathered(rank: int, mine: np.ndarray, theirs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`allgather_small` gathered on two ranks from the messages of rank ``rank`` (``mine``)
    and of the other (``theirs``), each its ``k`` counts and its bytes: (both ranks' counts, one row
    each; both ranks' bytes, in rank order), as :func:`allgather_parts` gives them.

    >>> mine, _ = allgather_message(1, 0, (3, -1), 2)
    >>> theirs, _ = allgather_message(1, 0, (1, 4), 2)
    >>> every, data = pair_gathered(1, mine, theirs, 2)
    >>> every.tolist(), data.size
    ([[1, 4], [3, -1]], 4)
    """
    first, second = (mine, theirs) if rank == 0 else (theirs, mine)
    head = k * 8
    every = np.concatenate((first[:head], second[:head])).view(np.int64).reshape(2, k)
    return every, np.concatenate((first[head:], second[head:]))


def allgather_parts(gathered: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`allgather_small` gathered, as (every rank's ``k`` counts, one row each; the bytes):
    views of ``gathered``."""
    head = n * k * 8
    return gathered[:head].view(np.int64).reshape(n, k), gathered[head:]


def allgather(transport: Transport, bound: Bound,
              input: Any, output: Any, counts: list[int], segment_elems: int) -> None:
    """``output`` = every rank's ``input`` laid end to end in rank order; rank r brings ``counts[r]`` elements."""
    bounds = bounds_from_counts(counts)
    start, stop = bounds[transport.rank]
    arrays.copy_(output[start:stop], input)
    run(allgather_plan(transport.rank, bounds, segment_elems), transport, bound, output, phase="all-gather")


def broadcast_small(transport: Transport, bound: Bound, buffer: np.ndarray, root: int, signature: bytes) -> bool:
    """``broadcast`` of a small host buffer by recursive doubling, in the messages that check
    ``signature``: the root brings its bytes, every other rank zeros, and the messages are combined
    by bitwise or (exact for any dtype); on two ranks the root's bytes go one way and the signature
    alone comes back (``doubling.swap``). About log2(n) messages instead of the chain's n-1 after
    the check's. Returns False (``buffer`` untouched) if any rank's signature differs."""
    mine = buffer.view(np.uint8)
    if transport.size == 2:   # (one exchange: the root's bytes one way, the signature alone back)
        return doubling.swap(transport, bound, signature, mine, None) if transport.rank == root \
            else doubling.swap(transport, bound, signature, None, mine)
    if transport.rank == root:   # (its buffer may be read-only: the result it already has goes nowhere)
        return doubling.agree(transport, bound, signature, mine, np.bitwise_or, None)
    return doubling.agree(transport, bound, signature, np.zeros_like(mine), np.bitwise_or, mine)


def broadcast(transport: Transport, bound: Bound, buffer: Any, root: int, segment_elems: int) -> None:
    """Every rank's ``buffer`` becomes ``root``'s, pipelined along the ring from the root."""
    plan = broadcast_plan(transport.rank, transport.size, root, buffer.size, segment_elems)
    run(plan, transport, bound, buffer, phase="broadcast")


def reduce(transport: Transport, bound: Bound, input: Any, work: Any, root: int, op: str, segment_elems: int) -> None:
    """``work`` on ``root`` = the reduction of every rank's ``input`` (elsewhere ``work`` is scratch).

    A reduce-scatter leaves each rank one finished chunk (as in ``allreduce``), and a gather
    brings the chunks to the root instead of to every rank: each rank sends (n-1)/n of the
    buffer, as in the ring, and the root's link is the only one that carries the whole result.
    """
    owned = reduce_scatter(transport, bound, input, work, op, segment_elems)
    bounds = chunk_bounds(work.size, transport.size)
    mine = work if transport.rank == root else work[owned]   # (the root's own chunk is already in place)
    run(gather_plan(transport.rank, root, bounds, segment_elems), transport, bound, mine, phase="gather")


def gather(transport: Transport, bound: Bound,
           input: Any, output: Any, root: int, counts: list[int], segment_elems: int) -> None:
    """``output`` on ``root`` = every rank's ``input`` laid end to end in rank order (rank r brings
    ``counts[r]`` elements); ``output`` is not used elsewhere (None will do)."""
    me = transport.rank
    bounds = bounds_from_counts(counts)
    if me == root:
        arrays.copy_(output[slice(*bounds[me])], input)
    run(gather_plan(me, root, bounds, segment_elems), transport, bound, output if me == root else input, input,
        phase="gather")


def scatter(transport: Transport, bound: Bound,
            input: Any, output: Any, root: int, counts: list[int], segment_elems: int) -> None:
    """``output`` on rank r = elements ``counts[0] + ... + counts[r-1]`` on of ``root``'s ``input``
    (``counts[r]`` of them); ``input`` is not used but on the root."""
    me = transport.rank
    bounds = bounds_from_counts(counts)
    if me == root:
        arrays.copy_(output, input[slice(*bounds[me])])
    run(scatter_plan(me, root, bounds, segment_elems), transport, bound, output, input if me == root else output,
        phase="scatter")


def alltoall(transport: Transport, bound: Bound,
             input: Any, output: Any, sends: tuple, recvs: tuple, segment_elems: int) -> None:
    """Every rank's block for every rank: ``input[sends[j]]`` goes to rank j, and ``output[recvs[j]]``
    receives rank j's block for this one (pairwise exchange: ``ring.personalized_schedule``)."""
    me = transport.rank
    arrays.copy_(output[slice(*recvs[me])], input[slice(*sends[me])])
    run(alltoall_plan(me, sends, recvs, segment_elems), transport, bound, output, input, phase="all-to-all")
