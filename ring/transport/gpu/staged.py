"""Device arrays over a host transport, staged through host memory.

For cupy arrays where NCCL cannot carry them: NCCL missing, or several ranks
sharing one GPU (NCCL refuses that before 2.30). Each outgoing buffer is copied
to the host and sent by the host transport (MPI); each incoming one lands in
host memory and is copied to its place on the device when it is waited for.
Only bytes move here: the ring's reductions still run on the device, on the
current stream, as with NCCL.

    device send buffer --to_host--> host copy --MPI--> host buffer --copy_from_host--> device receive buffer
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ring import arrays
from ring.transport.base import Bound, OverHost


@dataclass
class _Staged:
    """A pending host request, the host buffer it uses, and (receives) where the bytes go next."""
    request: Any
    host: np.ndarray
    device: Any = None


class StagedTransport(OverHost):
    """The ``Transport`` protocol for device buffers, carried by a host ``Transport``."""

    def send_to_right(self, buf: Any, bound: Bound) -> _Staged:
        staged = arrays.to_host(buf)
        return _Staged(self.host.send_to_right(staged, bound), staged)

    def recv_from_left(self, buf: Any, bound: Bound) -> _Staged:
        staged = np.empty(buf.shape, buf.dtype)
        return _Staged(self.host.recv_from_left(staged, bound), staged, buf)

    def wait(self, request: _Staged | None, bound: Bound) -> None:
        if request is None:
            return
        self.host.wait(request.request, bound)
        if request.device is not None:
            arrays.copy_from_host(request.device, request.host)

    def exchange(self, send: Any | None, recv: Any | None, bound: Bound, dest: int | None = None,
                 source: int | None = None, reuse: Any = None) -> None:
        staged_send = None if send is None else arrays.to_host(send)
        staged_recv = None if recv is None else np.empty(recv.shape, recv.dtype)
        self.host.exchange(staged_send, staged_recv, bound, dest, source)   # fresh host buffers: never reuse
        if recv is not None:
            arrays.copy_from_host(recv, staged_recv)

