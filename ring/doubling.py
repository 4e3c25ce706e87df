"""Recursive doubling: every rank hears from every other in about log2(n) exchanges.

The ring moves the fewest bytes but needs 2(n-1) sequential messages, so for a
few KiB its cost is all latency. Recursive doubling needs only ceil(log2(n))
(+2 when n is not a power of two), so it carries two things:

* the call's *signature* (what every rank thinks this collective is): the
  cross-rank consistency check that runs before any ring moves data;
* small all-reduce payloads, reduced on the way (bitwise identical on every rank,
  because both partners of a pair combine the lower-ranked side first).

The schedule is pure data. With p = the largest power of two <= n, ranks p..n-1
first fold into rank r-p, the p ranks pair up at distances 1, 2, 4, ..., and the
result is folded back out. For n = 5 (p = 4):

    rank | step 0     | step 1     | step 2     | step 3
    -----+------------+------------+------------+--------
      0  | recv 4     | pair 1     | pair 2     | send 4
      1  | pair 0     | pair 3     |            |
      2  | pair 3     | pair 0     |            |
      3  | pair 2     | pair 1     |            |
      4  | send 0     | recv 0     |            |

After step 0, rank 0 holds 0+4; after "pair 1", ranks 0 and 1 hold 0+1+4; after
"pair 2" every rank 0-3 holds everything, and step 3 hands it to rank 4.

On two ranks the schedule is one exchange, so a broadcast or an all-gather need not
combine messages of the whole result's size: :func:`swap` sends each rank's own bytes
(the root's one way, the signature alone back; each rank's own rows).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache, partial
from time import perf_counter
from typing import Any, Callable

import numpy as np

from ring import execute
from ring.schedule import core_size
from ring.transport.base import PIECES_AT, PIECES_BYTES, Bound, Transport

#: Largest signature, in bytes; signatures are padded to this length.
SIGNATURE_BYTES = 256
#: Largest payload a doubling all-reduce may carry (the receive buffer is this big).
MAX_PAYLOAD_BYTES = 256 << 10
#: The header: the signature, an "all agree so far" byte, the transport's bytes (how many pieces of the
#: message follow its first: ``base.PIECES_AT``, never written here), so that the payload is aligned.
_HEADER = SIGNATURE_BYTES + 8
assert PIECES_AT == SIGNATURE_BYTES + 1 and PIECES_AT + PIECES_BYTES == _HEADER


@dataclass(frozen=True)
class Step:
    """One exchange: send this rank's current message and/or receive a peer's.

    ``merge`` says what to do with what was received: "mine_first" / "theirs_first"
    combine it with this rank's value in that operand order; "replace" takes it.
    """
    send_to: int | None
    recv_from: int | None
    merge: str | None


@lru_cache(maxsize=None)
def doubling_steps(rank: int, n: int) -> tuple[Step, ...]:
    """Rank ``rank``'s steps of a recursive-doubling all-reduce on ``n`` ranks (see the module table).

    >>> [(s.send_to, s.recv_from, s.merge) for s in doubling_steps(1, 4)]
    [(0, 0, 'theirs_first'), (3, 3, 'mine_first')]
    """
    p = core_size(n)
    if rank >= p:
        return Step(rank - p, None, None), Step(None, rank - p, "replace")
    steps = []
    if rank + p < n:
        steps.append(Step(None, rank + p, "mine_first"))
    width = 1
    while width < p:
        partner = rank ^ width
        steps.append(Step(partner, partner, "mine_first" if rank < partner else "theirs_first"))
        width *= 2
    if rank + p < n:
        steps.append(Step(rank + p, None, None))
    return tuple(steps)


def agree(transport: Transport, bound: Bound, signature: bytes, payload: Any = None,
          combine: np.ufunc | None = None, out: Any = None, *, _reported: bool = False) -> bool:
    """True on every rank if every rank passed the same ``signature``, False on every rank otherwise.

    With a ``payload`` (a small flat numpy array, at most MAX_PAYLOAD_BYTES), it is
    all-reduced with the ufunc ``combine`` (``np.add``, ``np.bitwise_or``, ...) on the way into
    ``out`` (which may be ``payload``, or None where the result is not wanted); ``out`` is
    written only when the result is True.

    >>> agree(transport, call, b"allreduce float32 x1024")   # (a call is its waits' bound)  # doctest: +SKIP
    True

    Reported to ``ring.execute.observer`` as phase "small" (with a payload) or "check" (the report
    makes the call again, ``_reported``: the latency path, unobserved, is one function call).
    """
    if execute.observer is not None and not _reported:
        started = perf_counter()
        try:
            return agree(transport, bound, signature, payload, combine, out, _reported=True)
        finally:
            execute.observer("check" if payload is None else "small", started, perf_counter(),
                             0 if payload is None else payload.nbytes)
    nbytes = 0 if payload is None else payload.nbytes
    if nbytes > MAX_PAYLOAD_BYTES:
        raise ValueError(f"payload of {nbytes} bytes; at most {MAX_PAYLOAD_BYTES}")
    dtype = None if payload is None else payload.dtype
    try:   # (prepared's lookup, inline: this runs on every small call)
        ready = _per_thread.messages.ready.get((transport.rank, transport.size, dtype, nbytes))
    except AttributeError:
        ready = None
    return (ready or prepared(transport, dtype, nbytes)).run(transport, bound, header(signature), payload, combine,
                                                             out)


def swap(transport: Transport, bound: Bound, signature: bytes, payload: np.ndarray | None,
         into: np.ndarray | None) -> bool:
    """On two ranks, the one exchange of each one's own bytes: this rank's signature and ``payload``
    (bytes; None: the signature alone) to the other, the other's back, and its payload copied into
    ``into`` (bytes, as many as it should bring; None: not wanted). True on both ranks if their
    signatures agree, False on both otherwise (``into`` untouched). Where :func:`agree` would combine
    messages of the whole result's size by bitwise or, a broadcast sends the root's bytes one way
    and the signature alone back, and an all-gather each rank's own rows.

    >>> swap(transport, call, b"broadcast|7|root 0", None, buffer)   # rank 1 of 2   # doctest: +SKIP
    True
    """
    ready = prepared(transport, None if payload is None else payload.dtype, 0 if payload is None else payload.nbytes)
    step = ready.one_step
    wire = partial(transport.exchange, ready.send, ready.recv, dest=step.send_to, source=step.recv_from, reuse=ready)
    return ready.run_wired(wire, bound, header(signature), payload, None, into)


def header(signature: bytes) -> bytes:
    """What a rank that agrees sends ahead of its payload: ``signature`` padded to SIGNATURE_BYTES, and
    the "all agree so far" byte set. Compared as one bytes object (a memoryview compares element by
    element: ten times a copy and a compare). A longer signature makes a longer header, which fails
    the comparison (``signature.template`` keeps signatures short).

    >>> len(header(b"allreduce|7")), header(b"allreduce|7")[-1]
    (257, 1)
    """
    return signature.ljust(SIGNATURE_BYTES, b"\0") + b"\1"


def header_template(template: bytes, seq: int) -> tuple[bytes, int]:
    """For a signature ``template`` (one ``%d``, the call's number): a template of :func:`header` itself
    for every number of as many digits as ``seq``, and the first number with more, which needs
    another (one ``%`` per call instead of the padding's three operations).

    >>> padded, wider_at = header_template(b"allreduce|%d", 42)
    >>> padded % 57 == header(b"allreduce|57"), wider_at
    (True, 100)
    """
    digits = len(str(seq))
    return template + b"\0" * max(0, SIGNATURE_BYTES - (len(template % seq))) + b"\1", 10 ** digits


def prepared(transport: Transport, dtype: np.dtype | None, nbytes: int) -> Prepared:
    """This thread's :class:`Prepared` for a payload of ``nbytes`` of ``dtype`` (None: no payload)
    on ``transport``'s rank and size, made at its first use (at most MAX_PAYLOAD_BYTES)."""
    try:
        messages = _per_thread.messages
    except AttributeError:
        messages = _per_thread.messages = _Messages()
    key = (transport.rank, transport.size, dtype, nbytes)
    return messages.ready.get(key) or messages.prepare(*key)


class Prepared:
    """One kind of exchange made ready (:func:`agree` with a payload of one dtype and size, on one
    rank of n ranks): its steps, and the two message buffers with their headers and the payloads as
    arrays of that dtype. Made once and kept, because making the views costs more than the
    exchange's arithmetic, and because the transport keeps an exchange set up for the very same
    buffer objects (see ``Transport.exchange``); a caller that repeats one kind (the express lane of
    ``collectives.ops.express``) keeps it too, and calls :meth:`run`.

    The receive buffer is always whole: a rank that disagrees may send a longer message, and it
    must land (to be found different), not overflow.
    """

    def __init__(self, send: np.ndarray, recv: memoryview, rank: int, n: int, dtype, nbytes: int):
        self.steps = doubling_steps(rank, n)
        self.final = self.steps[-1] if self.steps else None
        self.send = memoryview(send)[:_HEADER + nbytes]
        self.recv = recv
        self.send_check = memoryview(send)[:SIGNATURE_BYTES + 1]   # this rank's signature, "all agree so far"
        self.recv_header = recv[:_HEADER]
        self.recv_check = recv[:SIGNATURE_BYTES + 1]   # the peer's signature and its "all agree so far" byte
        #: Each step with what it sends and receives (None: nothing), as ``Transport.exchange`` takes them.
        self.moves = tuple((step, self.send if step.send_to is not None else None,
                            self.recv if step.recv_from is not None else None) for step in self.steps)
        self.own = send[_HEADER:_HEADER + nbytes].view(dtype) if dtype is not None else None
        self.received = np.frombuffer(recv, dtype, nbytes // dtype.itemsize, _HEADER) if dtype is not None else None
        self.incoming = np.frombuffer(recv, np.uint8, offset=_HEADER)   # the partner's payload, as bytes, of any size
        #: Where a step that is not the last combines floating-point payloads (None: into ``own``). Never
        #: into one of its inputs: numpy's loop for an output that is one of its inputs may keep the other
        #: input's NaN (sign and payload) where the loop for a third array keeps the first's, and partners
        #: that wrote over different inputs would hold different bits of one sum.
        self.merged = np.empty_like(self.received) if dtype is not None and dtype.kind in "fc" \
            and len(self.steps) > 1 else None
        #: The step, where the schedule is one exchange with one partner (two ranks): see :meth:`run_wired`.
        self.one_step = self.final if len(self.steps) == 1 and self.final.send_to is not None \
            and self.final.recv_from is not None else None
        self.mine_first = self.one_step is not None and self.one_step.merge == "mine_first"

    def run(self, transport: Transport, bound: Bound, agreed_header: bytes, payload: Any = None,
            combine: np.ufunc | None = None, out: Any = None) -> bool:
        """:func:`agree` on ``transport`` (whose rank and size this was made for), unobserved, with the
        signature as its :func:`header`."""
        steps = self.steps
        if not steps:   # a world of one agrees with itself
            if payload is not None and out is not None and out is not payload:
                out[...] = payload
            return True
        self.send_check[:] = agreed_header
        agreeing = 1
        if payload is not None:
            self.own[...] = payload
        final = self.final
        for step, send, recv in self.moves:
            transport.exchange(send, recv, bound, step.send_to, step.recv_from, self)
            if recv is None:
                continue
            if step.merge == "replace":
                self.send_check[SIGNATURE_BYTES] = agreeing = self.recv_header[SIGNATURE_BYTES]
                if payload is not None:
                    self.own[...] = self.received
                continue
            if agreeing and self.recv_check.tobytes() != agreed_header:
                self.send_check[SIGNATURE_BYTES] = agreeing = 0
            elif agreeing and payload is not None:
                last = step is final and out is not None   # (the last step writes where the result belongs)
                target = out if last else self.own if self.merged is None else self.merged
                if step.merge == "mine_first":
                    combine(self.own, self.received, out=target)
                else:
                    combine(self.received, self.own, out=target)
                if last:
                    return True
                if target is not self.own:
                    self.own[...] = target
        if agreeing and payload is not None and out is not None:
            np.copyto(out, self.own)
        return agreeing == 1

    def run_wired(self, wire: Callable[[Bound], None], bound: Bound, agreed_header: bytes, payload: Any,
                  combine: np.ufunc | None, out: Any = None) -> bool:
        """:meth:`run` where the schedule is :attr:`one_step`, over ``wire``: ``wire(bound)`` exchanges
        this one's buffers with the partner (``MPITransport.persistent``'s ``run``, made ready once; or
        the transport's exchange). The hot path of a repeated small call on two ranks (the express
        lane of ``collectives.ops.express``): the same messages and result as :meth:`run`, without
        the steps' loop and the transport's lookup of its exchange. ``payload`` None: the header
        alone goes; ``combine`` None: the pair's way (:func:`swap`), ``out`` takes the partner's
        payload as it came."""
        self.send_check[:] = agreed_header
        if payload is not None:
            self.own[...] = payload
        wire(bound)
        if self.recv_check.tobytes() != agreed_header:
            return False
        if out is not None:
            if combine is None:
                out[...] = self.incoming[:out.nbytes]
            elif self.mine_first:
                combine(self.own, self.received, out=out)   # (out by keyword: numpy 2.4 deprecates a third
            else:                                            # positional argument of maximum and minimum)
                combine(self.received, self.own, out=out)
        return True


class _Messages:
    """This thread's send and receive buffers (2 x 256 KiB, allocated once) and the exchanges
    prepared on them."""

    def __init__(self):
        self._send = np.zeros(_HEADER + MAX_PAYLOAD_BYTES, np.uint8)
        self._recv = np.zeros(_HEADER + MAX_PAYLOAD_BYTES, np.uint8)
        self._whole_recv = memoryview(self._recv)
        self.ready: dict = {}   # (rank, n, dtype, nbytes) -> its Prepared

    def prepare(self, rank: int, n: int, dtype, nbytes: int) -> Prepared:
        """Make the Prepared for these, and keep it."""
        if len(self.ready) >= 64:
            self.ready.clear()
        found = self.ready[(rank, n, dtype, nbytes)] = Prepared(self._send, self._whole_recv, rank, n, dtype, nbytes)
        return found


_per_thread = threading.local()   # (per thread: the in-process test transport runs every rank as a thread)
