"""The one loop that walks a plan over a transport."""
from __future__ import annotations

from time import perf_counter
from typing import Any, Callable

from ring import arrays
from ring.compression import Codec
from ring.schedule import Plan, Transfer
from ring.transport.base import Bound, Transport

Combine = Callable[[Any, Any, Any], None]
Observer = Callable[[str, float, float, int], None]

# The scratch slots (``ring.arrays.scratch``) of a compressed plan, apart from the in-place
# receive's 0 and 1: two for receives and two for sends in flight (one transfer's while the
# next one's is posted), and one for a received segment decoded to the data's dtype.
_WIRE_RECV, _WIRE_SEND, _DECODED = 2, 4, 6

#: Told of every plan carried out: ``observer(phase, started, ended, bytes)`` (perf_counter
#: seconds), while a timeline is recorded (see :func:`observe`); None costs nothing.
observer: Observer | None = None


def observe(told: Observer | None) -> None:
    """Tell ``told`` of every plan carried out from now on (None: nobody; ``collectives.calls.timeline``)."""
    global observer
    observer = told


def run(plan: Plan, transport: Transport, bound: Bound, output: Any, input: Any = None,
        combine: Combine | None = None, phase: str = "ring", codec: Codec | None = None) -> None:
    """Carry out ``plan`` on flat contiguous arrays; ``input`` defaults to ``output`` (in place).

    In place means ``input is output``: the very same object. Two distinct arrays must not
    overlap (the callers in ``ring.algorithms`` guarantee both).

    Where received data goes: a segment to be reduced is received straight into its
    place in ``output`` and reduced there while still warm in cache (1.5x faster on
    this project's test machine than through a scratch buffer). In place, that spot
    still holds this rank's own contribution, so the segment lands in one of two
    scratch buffers instead, each as large as the largest transfer: temporary memory
    is at most two segments, whatever the tensor size, and never more than the data.

    Overlap: the receive and send of transfer k+1 are posted before transfer k is
    reduced, except a send that forwards what transfer k produces (``send_waits``).
    A ``lockstep`` plan has nothing to overlap (see ``Plan``), so each transfer is one
    blocking exchange, which costs fewer calls; plans that talk to other peers than the
    ring's neighbours (``Transfer.peer``) are lockstep.

    Every wait is bounded by ``bound``, the call's (see ``ring.transport.base.Bound``).
    ``phase`` names the plan for the ``observer`` ("reduce-scatter", "all-gather", ...).

    ``codec``: the codec (``ring.compression``) for the messages, or None to move the data as it
    is. With one, each segment sent is encoded into a wire-dtype scratch buffer, each segment
    received lands in another and is decoded: into a scratch buffer of the data's dtype that is
    then combined with this rank's own (never rounded) contribution, or, for a transfer that
    does not reduce, straight into its place in ``output``. Temporary memory stays bounded by
    the segment: two wire buffers each way and one decoded segment.
    """
    if not plan:
        return
    if observer is not None:
        started = perf_counter()
        _walk(plan, transport, bound, output, input, combine, codec)
        observer(phase, started, perf_counter(), output.nbytes)
    else:
        _walk(plan, transport, bound, output, input, combine, codec)


def _walk(plan: Plan, transport: Transport, bound: Bound, output: Any, input: Any,
          combine: Combine | None, codec: Codec | None) -> None:
    if input is None:
        input = output
    in_place = input is output

    if plan.lockstep:
        for k, t in enumerate(plan):
            received = _incoming(t, k, output, in_place, codec)
            transport.exchange(_outgoing(t, k, input, output, codec), received, bound, dest=t.peer,
                               source=t.peer if t.source is None else t.source)
            _reduce(t, output, input, received, combine, codec)
        return

    def post_recv(k: int):
        received = _incoming(plan[k], k, output, in_place, codec)
        return received, (transport.recv_from_left(received, bound) if received is not None else None)

    def post_send(k: int):
        sending = _outgoing(plan[k], k, input, output, codec)
        return transport.send_to_right(sending, bound) if sending is not None else None

    received, recv = post_recv(0)
    send = post_send(0)
    for k, t in enumerate(plan):
        transport.wait(recv, bound)
        has_next = k + 1 < len(plan)
        if has_next:
            next_received, next_recv = post_recv(k + 1)
            next_send = None if plan[k + 1].send_waits else post_send(k + 1)
        _reduce(t, output, input, received, combine, codec)
        if has_next and plan[k + 1].send_waits:
            next_send = post_send(k + 1)
        transport.wait(send, bound)
        if has_next:
            received, recv, send = next_received, next_recv, next_send


def _incoming(t: Transfer, k: int, output: Any, in_place: bool, codec: Codec | None):
    """Where transfer ``k`` receives: its place in ``output``, or scratch when that place is still
    needed or the message is encoded."""
    if t.recv is None:
        return None
    start, stop = t.recv
    if codec is not None:
        return arrays.scratch(output, stop - start, _WIRE_RECV + k % 2, codec.wire_dtype)
    if t.reduce and in_place:
        return arrays.scratch(output, stop - start, k % 2)
    return output[start:stop]


def _reduce(t: Transfer, output: Any, input: Any, received: Any, combine: Combine | None,
            codec: Codec | None) -> None:
    """``output[recv] = op(input[recv], received)`` for a reducing transfer that received something;
    with a ``codec``, ``received`` is decoded first (into ``output[recv]`` when not reducing)."""
    if received is None:
        return
    if codec is None:
        if t.reduce:
            start, stop = t.recv
            combine(output[start:stop], input[start:stop], received)
        return
    start, stop = t.recv
    if not t.reduce:
        codec.decode(received, output[start:stop])
        return
    decoded = arrays.scratch(output, stop - start, _DECODED)
    codec.decode(received, decoded)
    combine(output[start:stop], input[start:stop], decoded)   # (this rank's part as it is: not rounded)


def _outgoing(t: Transfer, k: int, input: Any, output: Any, codec: Codec | None):
    """What transfer ``k`` (``t``) sends, or ``None``: with a ``codec``, encoded into scratch."""
    if t.send is None:
        return None
    start, stop = t.send
    data = (input if t.send_from_input else output)[start:stop]
    if codec is None:
        return data
    encoded = arrays.scratch(output, stop - start, _WIRE_SEND + k % 2, codec.wire_dtype)
    codec.encode(data, encoded)
    return encoded
