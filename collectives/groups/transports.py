"""The transports a group's calls run on: the host one (MPI), the two levels of the
hierarchical all-reduce, and the device one for cupy arrays, made on first use. A group
holds one :class:`Transports` (``Group.transports``)."""
from __future__ import annotations

import numpy as np

from collectives.errors import CollectiveError
from ring.transport.gpu import device as device_transports
from ring.transport.base import Bound, Transport


class Transports:
    """What one group's calls run on: ``host`` (MPI, numpy arrays), ``levels`` ((within a host,
    across hosts) for the hierarchical all-reduce, or None), ``device`` (cupy arrays: NCCL or
    staged through host memory, made by the first call on a cupy array; None until then).

    ``where``: how messages name this rank of the group (``Group.where``).
    """

    def __init__(self, host: Transport, levels: tuple | None, where):
        self.host = host
        self.levels = levels
        self.device = None
        self._where = where

    def all(self) -> list:
        """Every transport of the group's calls (host, levels, device)."""
        found = [self.host, *(self.levels or ())]
        return found + ([self.device] if self.device is not None else [])

    def abandon(self) -> None:
        """After a failed or interrupted call: cancel what the host transports still have posted."""
        for transport in [self.host, *(self.levels or ())]:
            transport.abandon()

    def close(self, failed: bool = False) -> None:
        """Release every transport, the one the others came from last."""
        for transport in reversed(self.all()):
            transport.close(failed)

    def for_array(self, x, bound: Bound, wanted: str) -> Transport:
        """The transport that carries ``x``: the host one for numpy arrays; for cupy arrays the
        device one, made on first use (``wanted``: COLLECTIVES_GPU_TRANSPORT) within ``bound``
        (every member must be in this call: collectives agree first)."""
        if isinstance(x, np.ndarray):
            return self.host
        self.open_device(x.device.id, bound, wanted)
        return self.device

    def open_device(self, device: int | None, bound: Bound, wanted: str) -> int:
        """Make the transport for cupy arrays on GPU ``device`` (None: GPU ``local_rank % visible
        GPUs``), made current, unless it exists (then ``device`` must be its GPU); return the GPU's
        index. Every member must make it together, as the first collective on a cupy array does
        (see ``ring.transport.gpu.device``)."""
        if self.device is None:
            try:
                self.device = device_transports.open_transport(self.host, device, wanted, bound)
            except device_transports.Unavailable as e:   # the same on every member: still in step
                setting = " (COLLECTIVES_GPU_TRANSPORT=nccl)" if wanted == "nccl" else ""
                raise CollectiveError(f"{e}{setting}") from None   # (the message is the whole story)
        elif device is not None and device != self.device.gpu:
            raise CollectiveError(f"{self._where()}: an array on GPU {device}, but this rank's collectives "
                                  f"run on GPU {self.device.gpu} (one GPU per rank)")
        return self.device.gpu
