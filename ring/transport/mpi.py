"""Point-to-point over MPI (mpi4py), on host memory, raw bytes, no pickling."""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from ring.schedule import left, right
from ring.transport.base import TransportError

_TAG = 7


class MPITransport:
    """The ring's neighbours on an MPI communicator (use a private duplicate, never the user's)."""

    def __init__(self, comm: MPI.Comm):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._right = right(self.rank, self.size)
        self._left = left(self.rank, self.size)

    def send_to_right(self, buf: Any) -> MPI.Request:
        try:
            return self.comm.Isend([buf, MPI.BYTE], self._right, _TAG)
        except MPI.Exception as e:
            raise TransportError(f"send to rank {self._right} failed: {e}") from e

    def recv_from_left(self, buf: Any) -> MPI.Request:
        try:
            return self.comm.Irecv([buf, MPI.BYTE], self._left, _TAG)
        except MPI.Exception as e:
            raise TransportError(f"receive from rank {self._left} failed: {e}") from e

    def exchange(self, send: Any | None, recv: Any | None) -> None:
        try:
            if send is not None and recv is not None:
                self.comm.Sendrecv([send, MPI.BYTE], self._right, _TAG, [recv, MPI.BYTE], self._left, _TAG)
            elif send is not None:
                self.comm.Send([send, MPI.BYTE], self._right, _TAG)
            elif recv is not None:
                self.comm.Recv([recv, MPI.BYTE], self._left, _TAG)
        except MPI.Exception as e:
            raise TransportError(f"exchange with ranks {self._left} and {self._right} failed: {e}") from e

    def wait(self, request: MPI.Request | None) -> None:
        if request is None:
            return
        try:
            request.Wait()
        except MPI.Exception as e:
            raise TransportError(f"waiting on a neighbour failed: {e}") from e

    def allgather_ints(self, values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.int64)
        gathered = np.empty((self.size, values.size), dtype=np.int64)
        try:
            self.comm.Allgather(values, gathered)
        except MPI.Exception as e:
            raise TransportError(f"metadata exchange failed: {e}") from e
        return gathered

    def barrier(self) -> None:
        try:
            self.comm.Barrier()
        except MPI.Exception as e:
            raise TransportError(f"barrier failed: {e}") from e
