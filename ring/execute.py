"""The one loop that walks a plan over a transport."""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ring import arrays
from ring.schedule import Transfer
from ring.transport.base import Transport

Combine = Callable[[Any, Any, Any], None]


def run(plan: Sequence[Transfer], transport: Transport, output: Any, input: Any = None,
        combine: Combine | None = None, segment_elems: int = 0) -> None:
    """Carry out ``plan`` on flat contiguous arrays; ``input`` defaults to ``output`` (in place).

    Received segments that are reduced land in one of two scratch buffers of
    ``segment_elems`` elements, so temporary memory is two segments whatever the
    tensor size. The receive and send of transfer k+1 are posted before transfer k
    is reduced, so the reduction overlaps the next transfer, except where the next
    send forwards what transfer k produces (``send_waits``).
    """
    if not plan:
        return
    if input is None:
        input = output

    def post_recv(k: int):
        t = plan[k]
        if t.recv is None:
            return None
        start, stop = t.recv
        target = arrays.scratch(output, segment_elems, k % 2)[: stop - start] if t.reduce else output[start:stop]
        return transport.recv_from_left(target)

    def post_send(k: int):
        t = plan[k]
        if t.send is None:
            return None
        start, stop = t.send
        return transport.send_to_right((input if t.send_from_input else output)[start:stop])

    recv, send = post_recv(0), post_send(0)
    last = len(plan) - 1
    for k, t in enumerate(plan):
        transport.wait(recv)
        next_recv = next_send = None
        if k < last:
            next_recv = post_recv(k + 1)
            if not plan[k + 1].send_waits:
                next_send = post_send(k + 1)
        if t.reduce and t.recv is not None:
            start, stop = t.recv
            received = arrays.scratch(output, segment_elems, k % 2)[: stop - start]
            combine(output[start:stop], input[start:stop], received)
        if k < last and plan[k + 1].send_waits:
            next_send = post_send(k + 1)
        transport.wait(send)
        recv, send = next_recv, next_send
