"""The express lanes' small calls on two ranks, as one function: the hottest path of the runtime (a
training loop's loss, a metric, a flag summed or broadcast, a row gathered), where Python's frames
and attribute lookups cost more than MPI's own call (issue 61: docs/performance.md counts them).

On two ranks (and for rank 1 of three), a small all-reduce by recursive doubling is one exchange
with one partner of the same two buffers every time, and so are a small all-gather (each rank's
counts and rows one way, the other's back) and a small broadcast (the root's bytes one way, the
signature alone back) on two ranks; their lanes (``express.AllreduceLane``, ``AllgatherLane``,
``BroadcastLane``) hold MPI's persistent requests for it (``MPITransport.persistent``).
:func:`two_rank_allreduce`, :func:`two_rank_allgather` and :func:`two_rank_broadcast` make, once per
lane, a function that does in one frame what the lane's call does in five or more
(``express.allreduce_lane``, ``Lane.run``, ``AllreduceLane.move``, ``Prepared.run_wired``,
``Persistent.run``), its objects in local cells: the same checks, the same engine turn, the same
message (the signature in front of the data), the same bounded wait and the same errors. Where the
ring carries a broadcast or an all-gather on two ranks in one message each way, or halving an
all-reduce (the lanes' ``direct``), the exchange it makes is the check's (the all-gather's counts
with it), and the data then goes straight between the arrays as the lane sends it (``lane.unpack``:
one message, or halving's two), before the look: a bench's call of 128 KiB a rank (its caches
emptied by the bench's own work between calls) spent an eighth of its time in the five frames
(``scripts/direct_floor.py``). It sets the
floating-point guard while the partner's message is on its way (the lane, before it sends). The look
for a rank that gave the call up comes after the message, as the lane's (a give-up sent after the
partner's data lands behind it in MPICH's queues: a look before the data moved would miss it), and
as the lane's, not where it would come within 0.1 ms of the start of the lane's last call and no
give-up is on record (``collectives.ops.express``: "One look fewer"). Anything rare goes to the
owner of that case: a turn not free at once (``Lane.run``), a call after a pause
(``Control.check_gave_up``'s drain), a request freed or a send guarded (``Persistent.run``), a wait
past the quick polls or an error (``Persistent.wait``, ``Persistent.failed``), a disagreement
(``Lane.disagree``), an all-gather whose ranks brought other counts (``AllgatherLane.unalike``),
whatever ends the call (``call.ended``). A call it does not serve (another kind, an ``out`` it may
not write), it returns None for: the caller takes the lane's lookup, then the usual way.

    >>> x = np.ones(2, np.float32)                                                   # doctest: +SKIP
    >>> col.allreduce(x); col.allreduce(x)   # the usual way, then the lane, which wires its exchange # doctest: +SKIP
    >>> col.allreduce(x)                     # this function                         # doctest: +SKIP
    array([2., 2.], dtype=float32)
"""
from __future__ import annotations

from threading import get_ident
from time import monotonic
from typing import Any, Callable

import numpy as np

from collectives.calls import timeline
from collectives.calls.call import ended, stopped
from collectives.calls.interrupts import held, settle
from collectives.calls.progress import MAIN_THREAD, OWNER, on_behalf
from ring import arrays, doubling, execute
from ring.transport.base import PIECES_AT

_ndarray = np.ndarray


def two_rank_allreduce(lane: Any, ready: doubling.Prepared, wire: Any) -> Callable:
    """The call of ``lane`` (an ``AllreduceLane`` of the doubling with a ufunc to combine, on two
    ranks) over ``ready``'s buffers and ``wire``, their ``Persistent`` exchange, as one function
    ``(group, x, op, out, algorithm) -> result``, or None where ``lane`` does not serve that call."""
    return _one_function(lane, ready, wire)


def two_rank_allgather(lane: Any, ready: doubling.Prepared, wire: Any) -> Callable:
    """The call of ``lane`` (an ``AllgatherLane`` of the doubling on two ranks: each rank's counts and
    rows one way, the other's back) over ``ready``'s buffers and ``wire``, as one function
    ``(group, x, None, out, algorithm) -> result``, or None where ``lane`` does not serve that call."""
    return _one_function(lane, ready, wire, gathering=True)


def two_rank_broadcast(lane: Any, ready: doubling.Prepared, wire: Any) -> Callable:
    """The call of ``lane`` (a ``BroadcastLane`` of the doubling on two ranks: the root's bytes one way,
    the signature alone back) over ``ready``'s buffers and ``wire``, as one function
    ``(group, x, root, None, algorithm) -> x``, or None where ``lane`` does not serve that call."""
    return _one_function(lane, ready, wire, broadcasting=True)


def _one_function(lane: Any, ready: doubling.Prepared, wire: Any, gathering: bool = False,
                  broadcasting: bool = False) -> Callable:
    """The one function of :func:`two_rank_allreduce`, (``gathering``) :func:`two_rank_allgather` or (``broadcasting``)
    :func:`two_rank_broadcast`: the all-reduce's message and result inline, the others' lanes pack and unpack."""
    group, runtime, call, control = lane.group, lane.runtime, lane.call, lane.control
    engine, dtype, shape, kind, forced = lane.engine, lane.dtype, lane.shape, lane.kind, lane.forced
    turn_lock, turn, name, quick_polls, take_turn, holder, hand_back = engine._lock, engine.turn, call.name, \
        wire.quick_polls, engine.turn.setdefault, engine.turn.get, engine.turn.clear   # (the turn's methods bound once)
    guard, unguard = (arrays.ieee_floating_point, arrays.restore_floating_point) if lane.floating else (None, None)
    send_check, recv_check, own, received = ready.send_check, ready.recv_check, ready.own, ready.received
    incoming, continued = ready.recv, wire.continued   # (the partner may send its message in pieces: wire.rest)
    first, second = (own, received) if ready.mine_first else (received, own)   # (run_wired's order)
    flat, combine = len(shape) == 1, None if gathering or broadcasting else lane.combine
    count = shape[0] if flat else -1
    from_here = broadcasting and lane.from_here
    direct = lane.slot is None if gathering else lane.direct if broadcasting else lane.halves is not None
    pack, unpack = lane.pack if combine is None else None, lane.unpack if combine is None or direct else None
    out_shape, rows_to = (lane.out_shape, lane.kind) if gathering else (None, None)

    def one_call(g: Any, x: Any, op: Any, out: Any, algorithm: Any) -> Any:
        # the lookup's checks (express.*_lane's), for this lane alone (a 1-D shape compared by its parts)
        if type(x) is not _ndarray or g is not group or x.dtype is not dtype or algorithm is not forced \
                or (x.ndim != 1 or len(x) != count if flat else x.shape != shape) \
                or get_ident() != MAIN_THREAD or on_behalf \
                or timeline.current is not None or execute.observer is not None or group.destroyed \
                or direct and not x.flags.c_contiguous:   # (direct: the data goes from and into x itself)
            return None
        if gathering:
            if out is None:
                if rows_to != -1:
                    return None
            elif type(out) is not _ndarray or out.shape != out_shape or out.dtype is not dtype \
                    or not out.flags.carray or out is x \
                    or not (x.base is None and out.base is None or not np.may_share_memory(x, out)):
                return None
        elif broadcasting:   # (``op``: the root)
            if type(op) is not int or op != kind or not (from_here or x.flags.writeable):
                return None
        elif op is not kind:
            return None
        elif out is None:
            out = np.empty(shape, dtype)
        elif out is x:
            if not x.flags.carray:
                return None
        elif type(out) is not _ndarray or out.dtype is not dtype \
                or (out.ndim != 1 or len(out) != count if flat else out.shape != shape) or not out.flags.carray \
                or not (x.base is None and out.base is None or not np.may_share_memory(x, out)):
            return None
        if turn or engine._queue:   # (a call runs or waits for the turn: Lane.run's way, which waits)
            return lane.run(x, out)
        try:   # (engine.take's, inline, inside the try whose finally hands the turn back: progress.Engine.turn)
            if take_turn(OWNER, MAIN_THREAD) != MAIN_THREAD:   # (another thread's, this moment)
                return lane.run(x, out)
            if runtime.failure is not None:
                raise stopped(name, runtime)
            quiet = None
            try:   # (from the number on: a Ctrl-C anywhere after it stops the runtime, as in Lane.run)
                seq = call.renew()   # (the group's counters have one writer: tests/test_layout.py)
                if call.after_a_pause:
                    control.check_gave_up(seq, True, name)
                if seq >= lane.wider_at:
                    lane.header, lane.wider_at = doubling.header_template(lane.template, seq)
                header = lane.header % seq
                send_check[:] = header   # Prepared.run_wired's, inline
                if combine is None:
                    pack(x)
                elif not direct:
                    own[...] = x if flat else x.reshape(-1)
                requests = wire.requests
                if requests is None or not wire.plain:   # (made again after being freed; another host; pieces)
                    quiet = guard() if guard is not None else None
                    wire.run(call)
                else:   # Persistent.run's, inline; a quick exchange leaves the deadline where the call began
                    receiving, sending = requests
                    try:
                        receiving.Start()
                        sending.Start()
                        quiet = guard() if guard is not None else None   # (while the partner's message comes)
                        for _ in quick_polls:
                            if receiving.Test() and sending.Test():
                                break
                        else:
                            wire.wait(call)
                        if continued and incoming[PIECES_AT]:
                            wire.rest(call)
                    except BaseException as e:
                        wire.failed(e, call)
                if direct:   # (the data, once the signatures agree; before the look, which comes after the last message)
                    out = unpack(x, out) if recv_check.tobytes() == header else lane.disagree(header)
                now = monotonic()   # (after the message: MPICH moves a word behind it then; express: "One look fewer")
                if now > call.no_look_until or control.departed or control.gave_up:
                    control.check_gave_up(seq, call.lasted_long(now), name)
                if not direct:
                    if recv_check.tobytes() != header:
                        lane.disagree(header)
                    if combine is None:
                        out = unpack(x, out)
                    else:
                        combine(first, second, out=out if flat else out.reshape(-1))
                held.on = True   # (from here to its end the call holds a Ctrl-C back: interrupts)
            except BaseException as e:
                held.on = True
                ended(call, e)
            finally:
                if quiet is not None:
                    unguard(quiet)
            call.in_step = True
            return out
        finally:
            if holder(OWNER) == MAIN_THREAD:   # engine.end_turn's, inline
                hand_back()
                if engine._queue or engine._closing:
                    with turn_lock:
                        engine._turns.notify_all()
            if held.pending:
                settle(call.interrupted)
            held.on = False

    return one_call
