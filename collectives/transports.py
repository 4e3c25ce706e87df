"""The transports a group's calls run on: the host one (MPI), the two levels of the
hierarchical all-reduce, and the device one for cupy arrays, made on first use."""
from __future__ import annotations

import numpy as np

from collectives.errors import CollectiveError
from ring.transport import device as device_transports
from ring.transport.base import Transport


class GroupTransports:
    """What ``collectives.group.Group`` runs its calls on (``transport``, ``levels``,
    ``device_transport``, and the ``runtime``'s settings), apart from the collectives themselves."""

    def transports(self) -> list:
        """Every transport of this group's calls (host, levels, device)."""
        found = [self.transport, *(self.levels or ())]
        return found + ([self.device_transport] if self.device_transport is not None else [])

    def abandon(self) -> None:
        """After a failed or interrupted call: cancel what this group's transports still have posted."""
        for transport in [self.transport, *(self.levels or ())]:
            transport.abandon()

    def release(self) -> None:
        """Free this group's communicators (every member does it in the same call: see ``destroy``)."""
        self.destroyed = True
        self.runtime.groups.remove(self)
        for transport in reversed(self.transports()):
            transport.close()

    def transport_for(self, x) -> Transport:
        """The transport that carries ``x``: MPI for numpy arrays; for cupy arrays the device
        transport, made on first use (every member must be in this call: collectives agree first)."""
        if isinstance(x, np.ndarray):
            return self.transport
        self.open_device_transport(x.device.id)
        return self.device_transport

    def open_device_transport(self, device: int | None) -> int:
        """Make the transport for cupy arrays on GPU ``device`` (None: GPU ``local_rank % visible
        GPUs``), made current, unless it exists (then ``device`` must be its GPU); return the GPU's
        index. Every member must make it together, as the first collective on a cupy array does
        (see ``ring.transport.device``)."""
        if self.device_transport is None:
            try:
                self.device_transport = device_transports.open_transport(self.transport, device,
                                                                         self.runtime.settings.gpu_transport)
            except device_transports.Unavailable as e:   # the same on every member: still in step
                setting = " (COLLECTIVES_GPU_TRANSPORT=nccl)" if self.runtime.settings.gpu_transport == "nccl" else ""
                raise CollectiveError(f"{e}{setting}") from e
        elif device is not None and device != self.device_transport.gpu:
            raise CollectiveError(f"{self.where()}: an array on GPU {device}, but this rank's collectives "
                                  f"run on GPU {self.device_transport.gpu} (one GPU per rank)")
        return self.device_transport.gpu
