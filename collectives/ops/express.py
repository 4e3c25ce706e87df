"""The express lane: a small blocking collective of a host array, as a program repeats it (a training
loop's loss, a metric, a few KiB of gradients, a flag broadcast, a row gathered), in one frame
instead of five layers.

The first call of each kind (group, collective, dtype, shape, and the op, root or ``out`` rows) takes
the usual way (``collectives.calls.call``, ``collectives.ops.bodies``) and, where the runtime runs it
by recursive doubling, sets up a :class:`Lane` for the calls that follow: its checks made once, its
signature template, its ``Call`` (the bound of its waits) kept and renumbered, its exchange made ready.
A later call of that kind with no options (``timeout=``, ``name=``, ``compression=``, ``async_op=``;
``algorithm=`` only as the call that set the lane up forced it) from the main thread then runs the
lane: the same engine turn, the same message (the
signature riding on the data: ``ring.doubling``), the same bounded wait and the same errors, only
fewer Python frames (``scripts/call_cost.py`` counts them). Anything else, or a lane that no longer
fits (the settings changed, a timeline records), takes the usual way.

One look fewer: after its message, the usual way looks whether a rank gave the call up (the late
rank's failure of issue 58: it fails too, instead of completing alone). A lane's call whose look
would come within 0.1 ms of the start of the lane's last call (``Call.no_look_until``, the clock
read where the look would be) looks only at the give-ups already on record: it would find no new one.
Every lane's message reaches every member (an agreement), so a member began call k after its call
k-1 ended, which needed this rank's message of k-1, sent after this rank's k-1 began; a member gives k
up by timeout at least that timeout after it began k: after this rank's look, for any timeout over
0.1 ms. (The clock is read at the look, not at the call's start: a rank paused inside its call, by
the system or a signal's handler, after it began and before its message left, lets the others time
out meanwhile, and it looks.) A call after another kind, or after a pause, looks as ever; a give-up
for another cause, a Ctrl-C or a failure on another thread, comes at any moment and races the look on
every path: the next call finds it. Measured: the look was a sixth of a two-rank 8-byte call's time
(docs/performance.md).

    >>> x = np.ones(2, np.float32)                                                   # doctest: +SKIP
    >>> col.allreduce(x)            # sets the lane up                               # doctest: +SKIP
    >>> col.allreduce(x)            # runs it                                        # doctest: +SKIP
"""
from __future__ import annotations

import copy
import functools
import math
from threading import get_ident
from time import monotonic
from typing import Any, Callable, NoReturn

import numpy as np

from collectives.calls import table, timeline
from collectives.calls.progress import MAIN_THREAD, on_behalf
from collectives.calls.interrupts import held, settle
from collectives.calls.call import Call, ended, stopped
from collectives.calls.group_protocol import CallGroup
from collectives.ops import fused
from ring import algorithms, arrays, doubling, execute
from ring.partition import chunk_bounds
from ring.schedule import halving_plans

_KEPT = 4   # memories a direct lane keeps its data's requests for (Lane.move_data)
_MOST_LANES = 64   # kinds of call kept per runtime (a program that keeps making new shapes does not grow it;
# a lane let go may live on as a runtime's ``last_<name>`` until another replaces it: it still works)
# (names the hot path reads often, bound once: a module's attribute costs a lookup each time)
_ndarray, _ieee_floating_point, _restore_floating_point = \
    np.ndarray, arrays.ieee_floating_point, arrays.restore_floating_point


class Lane:
    """What every call of one kind shares: the group, the kind (``x``'s dtype and shape, and ``kind``:
    the op, the root or the ``out`` rows), the signature template, the reused ``call``, whether the
    arithmetic is floating point; each collective's lane adds what it moves (:meth:`move`)."""

    __slots__ = ("group", "runtime", "engine", "control", "dtype", "shape", "kind", "forced", "transport", "template",
                 "call", "floating", "exchange", "incoming", "header", "wider_at", "fused", "data", "data_seen")

    @staticmethod
    def direct_for(call: Call, kind: Any) -> bool:
        """Whether calls of ``kind`` that ``call.algorithm`` carries on two ranks in one message each
        way (:func:`direct`) have a lane too: its own exchange of their messages."""
        return False

    def __init__(self, call: Call, x: np.ndarray, kind: Any, floating: bool):
        self.group, self.template = call.group, call.template
        self.dtype, self.shape, self.kind = x.dtype, x.shape, kind
        self.forced = call.forced   # (the algorithm its calls force, ``algorithm=``; None: the runtime's choice)
        self.transport = call.group.transport   # (a group's, for its whole life; so are these:)
        self.runtime, self.engine, self.control = call.runtime, call.runtime.engine, self.transport.control
        self.call = copy.copy(call)   # (a bound of its own, renewed by each call)
        self.call.background = False
        self.floating = floating
        #: The message's exchange, ``(bound, header, payload, combine, out) -> agreed`` (made at the first
        #: run, in the main thread's buffers: ``ring.doubling``'s run of its steps, or of its one step
        #: over the transport's ready exchange where there is only one, on two ranks).
        self.exchange: Callable | None = None
        self.incoming: np.ndarray | None = None   # where the partner's payload lands, as bytes (with the exchange)
        #: The message's header (the signature, padded) as a template of the call's number, good
        #: below the number ``wider_at`` (``doubling.header_template``).
        self.header, self.wider_at = b"", 0
        #: Its calls as one function (``collectives.ops.fused``), once its exchange is wired on two
        #: ranks (an all-reduce's, a broadcast's or an all-gather's by the doubling).
        self.fused: Callable | None = None
        #: A direct lane's data exchanges made ready, by the memory they serve (the last _KEPT: see
        #: :meth:`move_data`), and where the data of the last _KEPT exchanges made without one lay.
        self.data: dict = {}
        self.data_seen: tuple = (None,) * _KEPT

    def run(self, x: np.ndarray, out: np.ndarray | None = None, _handed: bool = False) -> Any:
        """One call on ``x`` (``out``: where the collective has one): the engine's turn taken at once
        where it is free (else in its place: ``run_now`` hands it over, ``_handed``), then what
        ``_frame`` does around the body, with :meth:`move` as the body. (One frame for all of it:
        this is the hot path of a small call.)"""
        engine = self.engine
        if not _handed and not engine.idle():
            return engine.run_now(self.run, x, out, True)
        try:   # (the turn taken inside the try whose finally hands it back: progress.Engine.turn)
            if not _handed and not engine.take():   # (another thread's, this moment)
                return engine.run_now(self.run, x, out, True)
            call = self.call
            if self.runtime.failure is not None:   # (as the frame begins: collectives.calls.call)
                raise stopped(call.name, self.runtime)
            quiet = _ieee_floating_point() if self.floating else None
            try:   # (from the number on: a Ctrl-C anywhere after it stops the runtime, as the ranks may be out of step)
                seq = call.renew()
                if call.after_a_pause:   # (as the usual frame: a rank that gave this call up fails it here)
                    self.control.check_gave_up(seq, True, call.name)
                if seq >= self.wider_at:
                    self.header, self.wider_at = doubling.header_template(self.template, seq)
                result = self.move(self.header % seq, x, out)
                control, now = self.control, monotonic()
                if now > call.no_look_until or control.departed or control.gave_up:   # (the module's "One look
                    control.check_gave_up(seq, call.lasted_long(now), call.name)      # fewer"; Call.lasted_long)
                held.on = True   # (from here to its end the call holds a Ctrl-C back: interrupts)
            except BaseException as e:
                held.on = True
                ended(call, e)
            finally:
                if quiet is not None:
                    _restore_floating_point(quiet)
            call.in_step = True
            return result
        finally:
            if not _handed:
                engine.end_turn()
            if held.pending:   # (settle's rare case: a Ctrl-C came in the call's books)
                settle(self.call.interrupted)
            held.on = False

    def move(self, header: bytes, x: np.ndarray, out: np.ndarray | None) -> Any:
        """The body of one call whose message begins with ``header`` (its signature: ``doubling.header``):
        the exchange, and what the usual body does after it."""
        raise NotImplementedError

    def agree(self, header: bytes) -> None:
        """The check's exchange alone, before a direct lane's messages (as ``Call.agree``: none where the
        check is off); raise on every rank if the signatures differ."""
        if self.call.runtime.settings.check and \
                not (self.exchange or self._exchange(None, 0))(self.call, header, None, None, None):
            self.disagree(header)

    def move_data(self, send: np.ndarray | None, recv: np.ndarray | None) -> None:
        """A direct call's data: ``send`` to the other of two ranks while ``recv`` comes from it (either
        None: that way nothing), each contiguous. Where they lie where an earlier call's did (a loop's
        arrays, or new ones that numpy placed there), the data goes over MPI's persistent requests for
        that memory (each buffer's address and length): made at the second call there, kept for the
        last _KEPT memories (halving's two exchanges a call, each into a result that a loop holds
        while it makes the next, which alternates between two places), and started only for buffers
        at their very addresses; they hold no array, so a program may drop or resize its arrays as
        before (an all-gather of 32-128 KiB a rank saves about 4 us a call, a broadcast 0.2-0.6, a
        halving all-reduce 1.5: docs/performance.md, "The round of 2026-12-01", evening and night)."""
        transport, kept = self.transport, self.data
        at = transport.span(send), transport.span(recv)   # (the lengths too: halving's two messages of an odd
        # count swap theirs, and a program's arrays may place one call's message where another's other lies)
        ready = kept.get(at)
        if ready is not None:
            ready.run_on(self.call, send, recv)
            return
        peer = 1 - transport.rank
        if at not in self.data_seen:
            self.data_seen = self.data_seen[1:] + (at,)
            transport.exchange(send, recv, self.call, dest=peer, source=peer)
            return
        if len(kept) == _KEPT:   # (the memory made ready longest ago: its requests go)
            kept.pop(next(iter(kept))).release()
        ready = kept[at] = transport.persistent(send, recv, peer, peer, object(), framed=False)   # (a key of its own)
        ready.run_on(self.call, send, recv)

    def disagree(self, header: bytes) -> NoReturn:
        """The error of a call whose ranks' signatures differ, raised on every rank (``Call.disagree``)."""
        self.call.disagree(header[:doubling.SIGNATURE_BYTES])

    def _exchange(self, dtype: np.dtype | None, nbytes: int) -> Callable:
        """Make :attr:`exchange` for a payload of ``nbytes`` of ``dtype`` (None: the header alone)."""
        ready, transport = doubling.prepared(self.transport, dtype, nbytes), self.transport
        step = ready.one_step
        if step is None:
            self.exchange = functools.partial(ready.run, transport)
        else:
            wire = transport.persistent(ready.send, ready.recv, step.send_to, step.recv_from, ready)
            self.exchange = functools.partial(ready.run_wired, wire.run)
            self.wired(ready, wire)
        self.incoming = ready.incoming
        return self.exchange

    def wired(self, ready: doubling.Prepared, wire: Any) -> None:
        """Its exchange is now ``wire``, the transport's ready exchange of ``ready``'s buffers."""


class AllreduceLane(Lane):
    """A small all-reduce by ``op`` of arrays of one ``dtype`` and ``shape`` ("avg" takes
    ``algorithms.allreduce_small``, which scales); or (``halves``, two ranks, where halving or the ring
    carries the call, whose messages there are the same: :meth:`unpack`) a larger one."""

    __slots__ = ("combine", "halves", "prescaled", "averaged")

    def __init__(self, call: Call, x: np.ndarray, op: str):
        super().__init__(call, x, op, floating=x.dtype.kind in "fc")
        halved = call.algorithm != "doubling"
        # ("avg" by doubling is allreduce_small's, which scales; halved, it sums and divides as
        # algorithms._reduce_by does, below)
        self.combine = arrays.ufunc(np, op) if op != "avg" or halved else None
        self.halves = None
        if halved:   # (the range each rank reduces, as the algorithm's schedule gives it)
            segment, rank = call.runtime.segment_elems(x.dtype, self.transport), self.transport.rank
            owned = [slice(*halving_plans(r, 2, x.size, segment)[2]) for r in (0, 1)] \
                if call.algorithm == "halving" else [slice(*chunk) for chunk in chunk_bounds(x.size, 2)]
            self.halves = owned[rank], owned[1 - rank]
            self.prescaled = op == "avg" and x.dtype == np.float16   # (each contribution first)
            self.averaged = op == "avg" and not self.prescaled       # (the sum of its own half, once)

    @staticmethod
    def direct_for(call: Call, kind: Any) -> bool:
        return call.algorithm == "halving" or call.algorithm == "ring"   # (on two ranks the same messages)

    def wired(self, ready: doubling.Prepared, wire: Any) -> None:
        if self.combine is not None and getattr(wire, "holds_requests", False):   # (halves: the check's exchange)
            self.fused = self.runtime.fused_allreduce = fused.two_rank_allreduce(self, ready, wire)

    def move(self, header: bytes, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        result = np.empty(self.shape, x.dtype) if out is None else out   # (x's dtype: equal to the lane's, maybe another object)
        if self.halves is not None:
            self.agree(header)
            return self.unpack(x, result)
        flat_in = x if x.ndim == 1 else x.reshape(-1)
        flat_out = result if result.ndim == 1 else result.reshape(-1)
        if self.combine is None:
            agreed = algorithms.allreduce_small(self.transport, self.call, flat_in, flat_out, self.kind,
                                                self.template % self.call.seq)
        else:
            exchange = self.exchange or self._exchange(self.dtype, x.nbytes)
            agreed = exchange(self.call, header, flat_in, self.combine, flat_out)
        if not agreed:
            self.disagree(header)
        return result

    def unpack(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The rest of a call that halving carries on two ranks (``halves``;
        ``algorithms.allreduce_halving_doubling``), once the check's exchange found the signatures
        alike (:meth:`move`, or the one function's way, ``collectives.ops.fused``): its two messages,
        straight between the arrays: each rank sends the other the half that one reduces, reduces
        its own (its own part first, as the usual way), and sends it back for the other's result.
        An empty half (one element in all) is no message, as in the usual way's plan, which the other
        rank may be running (its call passed ``timeout=``): a message of nothing there was taken for
        the other's real one. Returns ``out`` (``x`` itself: in place)."""
        mine, theirs = self.halves
        source, in_place = x if x.ndim == 1 else x.reshape(-1), out is x
        target = out if out.ndim == 1 else out.reshape(-1)
        if self.prescaled:
            source, in_place = np.true_divide(source, 2, out=target), True
        own, back = target[mine], target[theirs]
        received = arrays.scratch(target, own.size, 0) if in_place else own
        self.move_data(source[theirs] if back.size else None, received if own.size else None)
        self.combine(source[mine], received, out=own)
        if self.averaged:
            arrays.divide_(own, 2)
        self.move_data(own if own.size else None, back if back.size else None)
        return out


class BroadcastLane(Lane):
    """A small broadcast from ``root`` of arrays of one dtype and shape: as ``algorithms.broadcast_small``,
    on two ranks the root's bytes one way and the signature alone back (``doubling.swap``), on more the
    root's bytes and every other rank's zeros combined by bitwise or; or (``direct``, two ranks, where
    the ring carries the call) the check's exchange, then the root's bytes straight from its array
    into the other's."""

    __slots__ = ("from_here", "zeros", "direct", "ends")
    # (``ends``: where its bytes go from, on the root, or come to, elsewhere, in the ready exchange's buffers)

    def __init__(self, call: Call, x: np.ndarray, root: int):
        super().__init__(call, x, root, floating=False)
        self.from_here = self.transport.rank == root
        self.direct = call.algorithm != "doubling"
        self.zeros = np.zeros(x.nbytes, np.uint8) if self.transport.size != 2 else None

    @staticmethod
    def direct_for(call: Call, kind: Any) -> bool:
        return call.algorithm == "ring"

    def wired(self, ready: doubling.Prepared, wire: Any) -> None:
        if self.zeros is None and getattr(wire, "holds_requests", False):   # (direct: the check's exchange)
            if not self.direct:   # (in x's shape: x goes in or comes out in one assignment)
                ends = ready.own if self.from_here else ready.incoming[:self.dtype.itemsize * math.prod(self.shape)]
                self.ends = ends.view(self.dtype).reshape(self.shape)
            self.fused = self.runtime.fused_broadcast = fused.two_rank_broadcast(self, ready, wire)

    def pack(self, x: np.ndarray) -> None:
        """The root's part of a call on two ranks, straight into the ready exchange's buffer (the one
        function's way, ``collectives.ops.fused``): its bytes; the other rank sends the signature alone
        (and so does the root, where the bytes go ``direct``, after the signatures)."""
        if self.from_here and not self.direct:
            self.ends[...] = x

    def unpack(self, x: np.ndarray, out: None) -> np.ndarray:
        """The result of such a call, once the signatures agree: ``x``, where the other rank writes the
        root's bytes as they came with the signature, or (``direct``) as they come now."""
        if self.direct:
            return self._across(x)
        if not self.from_here:
            x[...] = self.ends
        return x

    def _across(self, x: np.ndarray) -> np.ndarray:
        """The root's bytes straight from its ``x`` into the other rank's (``direct``)."""
        mine = (x if x.ndim == 1 else x.reshape(-1)).view(np.uint8)
        if self.from_here:
            self.move_data(mine, None)
        else:
            self.move_data(None, mine)
        return x

    def move(self, header: bytes, x: np.ndarray, out: None) -> np.ndarray:
        if self.direct:
            self.agree(header)
            return self._across(x)
        mine = (x if x.ndim == 1 else x.reshape(-1)).view(np.uint8)
        if self.zeros is None:   # (two ranks)
            if self.from_here:
                agreed = (self.exchange or self._exchange(mine.dtype, mine.nbytes))(self.call, header, mine, None)
            else:
                agreed = (self.exchange or self._exchange(None, 0))(self.call, header, None, None, mine)
        else:
            exchange = self.exchange or self._exchange(mine.dtype, mine.nbytes)
            if self.from_here:
                agreed = exchange(self.call, header, mine, np.bitwise_or, None)
            else:
                agreed = exchange(self.call, header, self.zeros, np.bitwise_or, mine)
        if not agreed:
            self.disagree(header)
        return x


class AllgatherLane(Lane):
    """A small all-gather of arrays of one dtype and shape into ``out`` of ``out_rows`` (-1: a new
    array): the message of ``algorithms.allgather_small``, made once (this rank's counts in place, its
    slot for the data: on two ranks, its own counts and rows alone, ``doubling.swap``); what the
    counts tell afterwards is the usual body's (``finish``), but where every rank brought this one's
    counts (``alike``): then the data gathered is the result. On two ranks where the ring carries the
    call (``direct``), the message is the counts alone, and the rows go straight from ``x`` into the
    other's result, as the ring's one message."""

    __slots__ = ("message", "slot", "gathered", "every", "rows", "finish", "counts", "alike", "whole", "out_shape",
                 "pair", "theirs", "typed_rows", "sending", "mine_first")
    # (``slot`` and ``typed_rows`` are views in x's dtype: a copy between arrays of one dtype moves the
    # bytes as they are, and costs less than the byte views it would take otherwise)
    direct_for = BroadcastLane.direct_for   # (the ring's)

    def __init__(self, call: Call, x: np.ndarray, out_rows: int, finish: Callable):
        super().__init__(call, x, out_rows, floating=False)
        n, rank, rows = self.transport.size, self.transport.rank, x.shape[0]
        self.pair, self.mine_first = n == 2, rank == 0   # (on two ranks: whose rows come first in the result)
        self.finish = finish
        self.whole = (n * rows,) + x.shape[1:]
        self.out_shape = (out_rows,) + x.shape[1:]   # (an ``out`` given: its shape)
        alike = out_rows in (-1, n * rows)
        if self.pair:
            width = x.nbytes if call.algorithm == "doubling" else 0   # (0: the counts alone, direct)
            self.message, slot = algorithms.allgather_message(1, 0, (rows, out_rows), width)
            self.slot = slot.view(x.dtype) if width else None
            self.alike = self.message[:16].tobytes() if alike else None
            return
        self.message, slot = algorithms.allgather_message(n, rank, (rows, out_rows), x.nbytes)
        self.slot = slot.view(x.dtype)
        self.gathered = np.empty(self.message.size, np.uint8)
        self.every, self.rows = algorithms.allgather_parts(self.gathered, n, 2)
        self.typed_rows = self.rows.view(x.dtype)   # (every rank's rows: the result, where the counts are alike)
        self.counts = memoryview(self.gathered)[:self.every.nbytes]
        self.alike = np.array([rows, out_rows] * n, np.int64).tobytes() if alike else None

    def move(self, header: bytes, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        source = x if x.ndim == 1 else x.reshape(-1)
        if self.pair:
            return self._pair(header, x, out, source)
        self.slot[...] = source
        exchange = self.exchange or self._exchange(self.message.dtype, self.message.nbytes)
        if not exchange(self.call, header, self.message, np.bitwise_or, self.gathered):
            self.disagree(header)
        if self.counts.tobytes() == self.alike:   # (what finish would find: every rank's rows, in rank order)
            result = np.empty(self.whole, x.dtype) if out is None else out
            (result if result.ndim == 1 else result.reshape(-1))[...] = self.typed_rows
            return result
        return self.finish(self.call, x, out, source, self.every, self.rows)

    def wired(self, ready: doubling.Prepared, wire: Any) -> None:
        if self.pair and getattr(wire, "holds_requests", False):
            rows = ready.own[16:].view(self.dtype).reshape(self.shape) if self.slot is not None else None   # (direct)
            self.sending = memoryview(ready.own)[:16], self.message[:16].tobytes(), rows
            self.fused = self.runtime.fused_allgather = fused.two_rank_allgather(self, ready, wire)

    def pack(self, x: np.ndarray) -> None:
        """Put the message of a call on two ranks straight into the ready exchange's buffer (the one
        function's way, ``collectives.ops.fused``): this rank's counts, then its rows (but ``direct``:
        they go after the message)."""
        counts, mine, rows = self.sending   # (bytes into a memoryview: less than numpy's copy of 16 bytes)
        counts[:] = mine
        if rows is not None:
            rows[...] = x

    def unpack(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """The result of a call on two ranks, once the exchange has brought the other's counts (and
        rows, by the doubling): the two ranks' rows in rank order, where its counts are this one's
        (``direct``: moved now, :meth:`_across`); else what they tell (:meth:`unalike`)."""
        counts_in, _, theirs = self.theirs
        if counts_in.tobytes() != self.alike:
            return self.unalike(x, out)
        if theirs is None:
            return self._across(x, out)
        result = np.empty(self.whole, x.dtype) if out is None else out
        rows = len(x)   # (two slices assigned along the rows: less than numpy's concatenate, 0.4 us against 0.65)
        if self.mine_first:
            result[:rows], result[rows:] = x, theirs
        else:
            result[:rows], result[rows:] = theirs, x
        return result

    def unalike(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """The rest of a call on two ranks whose exchange brought the other's counts, not equal to
        this one's (rows that differ, an ``out`` of another size): what they tell, as the usual body
        finds it (``finish``)."""
        source = x if x.ndim == 1 else x.reshape(-1)
        counts_in, rows_in, _ = self.theirs
        if self.slot is not None:   # (pair_gathered reads this rank's rows from its message)
            self.slot[...] = source
        theirs = np.concatenate((counts_in, rows_in))
        every, rows = algorithms.pair_gathered(self.transport.rank, self.message, theirs, 2)
        return self.finish(self.call, x, out, source, every, rows if self.slot is not None else None)

    def _pair(self, header: bytes, x: np.ndarray, out: np.ndarray | None, source: np.ndarray) -> np.ndarray:
        """:meth:`move` on two ranks: each sent its own counts (and rows, but ``direct``); where the
        other's counts are this one's, the result is the two ranks' rows in rank order."""
        message, slot = self.message, self.slot
        if slot is not None:
            slot[...] = source
        exchange = self.exchange
        if exchange is None:
            exchange = self._exchange(message.dtype, message.nbytes)
            rows_in = self.incoming[16:message.size]   # (the other's counts, and rows, also in x's dtype)
            counts_in = memoryview(self.incoming[:16])   # (its bytes, compared: 0.1-0.3 us less than an array's)
            self.theirs = counts_in, rows_in, rows_in.view(x.dtype).reshape(x.shape) if slot is not None else None
        if not exchange(self.call, header, message, None):
            self.disagree(header)
        return self.unpack(x, out)

    def _across(self, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
        """The rows of a ``direct`` call whose counts are alike: the ring's one message each way, sent
        from ``x`` as it is and received into the result, this rank's own rows copied into place first
        (then one exchange of the transport, fewer frames than posting and waiting for each message;
        the copy before the messages or while they move measured alike)."""
        source = x if x.ndim == 1 else x.reshape(-1)
        result = np.empty(self.whole, x.dtype) if out is None else out
        flat = result if result.ndim == 1 else result.reshape(-1)
        k = source.size
        mine, theirs = (flat[:k], flat[k:]) if self.mine_first else (flat[k:], flat[:k])
        mine[...] = source
        self.move_data(source, theirs)
        return result


def _open_to(g: CallGroup, x: Any) -> bool:
    """Whether a call on ``x`` may take a lane at all: a host array, from the main thread (not inside
    a done-callback), with no timeline or observer recording, on a group still alive."""
    return type(x) is _ndarray and get_ident() == MAIN_THREAD and not on_behalf \
        and timeline.current is None and execute.observer is None and not g.destroyed


def allreduce_lane(g: CallGroup, x: Any, op: Any, out: Any, algorithm: Any = None) -> AllreduceLane | None:
    """The lane that runs ``allreduce(x, op, out, algorithm=algorithm)`` on ``g`` now, or None: take the
    usual way (which sets one up, :func:`open_lane`, where it can). ``out``: None, ``x`` (writable), or
    a writable array of x's kind apart from x; anything else is for the usual checks to name."""
    if type(x) is not _ndarray or get_ident() != MAIN_THREAD or on_behalf \
            or timeline.current is not None or execute.observer is not None:   # (_open_to's, inline: the
        return None   # hottest path)
    lane = g.runtime.last_allreduce   # (the one that ran last, first: see _kept)
    if lane is None or lane.group is not g or x.dtype is not lane.dtype or x.shape != lane.shape \
            or op is not lane.kind and (type(op) is not str or op != lane.kind):   # (``is``: a loop's literal)
        if type(op) is not str:   # (an op of another type is for the usual checks to name: it may not even hash)
            return None
        lane = _kept(g, "allreduce", x, op)
        if lane is None:
            return None
    if lane.forced != algorithm or g.destroyed:
        return None
    # (the doubling's lane copies a strided x into its message; halving's sends from x itself)
    if lane.halves is not None and not x.flags.c_contiguous:
        return None
    if out is None:
        return lane
    if out is x:
        return lane if x.flags.carray else None   # (writable and contiguous: numpy's "carray")
    if type(out) is _ndarray and out.shape == lane.shape and (out.dtype is lane.dtype or out.dtype == lane.dtype) \
            and out.flags.carray and (x.base is None and out.base is None or not np.may_share_memory(x, out)):
        return lane   # (_writable_apart's, inline: the hottest path)
    return None


def broadcast_lane(g: CallGroup, x: Any, root: Any, algorithm: Any = None) -> BroadcastLane | None:
    """The lane that runs ``broadcast(x, root, algorithm=algorithm)`` on ``g`` now, or None (a strided
    ``x``, one this rank cannot write where it receives: the usual way, which copies or names it)."""
    if type(root) is not int or not _open_to(g, x):
        return None
    lane = g.runtime.last_broadcast
    if lane is None or lane.group is not g or x.dtype is not lane.dtype or x.shape != lane.shape or root != lane.kind:
        lane = _kept(g, "broadcast", x, root)
    if lane is None or lane.forced != algorithm:
        return None
    flags = x.flags
    return lane if flags.c_contiguous and (lane.from_here or flags.writeable) else None


def allgather_lane(g: CallGroup, x: Any, out: Any, algorithm: Any = None) -> AllgatherLane | None:
    """The lane that runs ``allgather(x, out, algorithm=algorithm)`` on ``g`` now, or None. ``out``:
    None, or a writable array of x's dtype whose rows are those of the lane's kind, apart from x."""
    if out is None:
        rows = -1
    elif type(out) is _ndarray and out.ndim:
        rows = out.shape[0]
    else:
        return None
    if not _open_to(g, x):
        return None
    lane = g.runtime.last_allgather
    if lane is None or lane.group is not g or x.dtype is not lane.dtype or x.shape != lane.shape or rows != lane.kind:
        lane = _kept(g, "allgather", x, rows)
    if lane is None or lane.forced != algorithm or not x.flags.c_contiguous:
        return None
    if out is None:
        return lane
    if out is not x and out.shape == lane.out_shape and (out.dtype is lane.dtype or out.dtype == lane.dtype) \
            and _writable_apart(out, x):
        return lane
    return None


def _kept(g: CallGroup, name: str, x: np.ndarray, kind: Any) -> Any:
    """The lane kept for collective ``name`` of ``x`` and ``kind`` on ``g``, or None; remembered as the
    runtime's ``last_<name>``, which the lookups compare first (a loop repeats one kind: comparing
    costs less than looking up)."""
    runtime = g.runtime
    lane = runtime.lanes.get((g, name, x.dtype, x.shape, kind))
    if lane is not None:
        setattr(runtime, "last_" + name, lane)
        setattr(runtime, "fused_" + name, lane.fused)
    return lane


def _writable_apart(out: np.ndarray, x: np.ndarray) -> bool:
    """Whether array ``out`` (not ``x``) is writable and contiguous (numpy's "carray": aligned too), and
    shares no memory with ``x`` (two arrays that own their memory never overlap)."""
    return out.flags.carray and (x.base is None and out.base is None or not np.may_share_memory(x, out))


def open_lane(call: Call, x: np.ndarray, kind: Any, *more: Any) -> None:
    """After ``call``, a collective of host array ``x`` that ran by recursive doubling (or on two ranks
    in one message each way at each step: the ring's broadcast or all-gather, halving's all-reduce:
    :func:`direct`): keep a lane for the calls of its kind that follow (``kind``: the op, the root, or
    the ``out`` rows), where it set no option but ``algorithm=`` (which the lane's calls must force
    alike). ``more``: what the lane needs besides (the all-gather's ``finish``)."""
    g, runtime, lane = call.group, call.runtime, _LANES.get(call.name)
    if lane is None or call.thread or call.call_name or x.dtype.isbuiltin != 1 \
            or not x.flags.c_contiguous or call.window != runtime.settings.timeout or not x.size:
        return
    if call.algorithm != "doubling" and not (lane.direct_for(call, kind) and direct(call, x)):
        return
    if len(runtime.lanes) >= _MOST_LANES:   # (the oldest goes: a loop's kinds, made last, stay)
        del runtime.lanes[next(iter(runtime.lanes))]
    opened = runtime.lanes[(g, call.name, x.dtype, x.shape, kind)] = lane(call, x, kind, *more)
    setattr(runtime, "last_" + call.name, opened)   # (it may replace the one the lookups compare first)


def direct(call: Call, x: np.ndarray) -> bool:
    """Whether ``call`` on ``x`` (each rank's part) ran on two ranks in one message each way at each
    step (its segment is at least ``x``): then its messages are the check's exchange and those, which a
    lane sends straight from and into the caller's arrays (the ring's broadcast and all-gather, halving's
    all-reduce: each lane's ``direct_for``)."""
    transport = call.group.transport
    return transport.size == 2 and x.size <= call.runtime.segment_elems(x.dtype, transport)


_LANES = {"allreduce": AllreduceLane, "broadcast": BroadcastLane, "allgather": AllgatherLane}   # (table.LANED's)
WITH_LANES = table.LANED   # (the collectives that have express lanes: their module functions look for one first)
