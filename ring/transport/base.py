"""What the ring needs from a network: post a send to the right neighbour, post a
receive from the left one, wait for either. Transports move bytes and do no arithmetic."""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class TransportError(RuntimeError):
    """The network failed underneath a collective (a peer died, a message was cut short)."""


class Transport(Protocol):
    """A rank's view of a ring of ``size`` ranks.

    Messages between two ranks arrive in the order they were posted (MPI's
    non-overtaking rule); the ring schedules rely on nothing more.
    """

    rank: int
    size: int

    def send_to_right(self, buf: Any) -> Any:
        """Start sending ``buf`` (contiguous) to rank ``(rank + 1) % size``; return a request."""

    def recv_from_left(self, buf: Any) -> Any:
        """Start receiving into ``buf`` (contiguous) from rank ``(rank - 1) % size``; return a request."""

    def exchange(self, send: Any | None, recv: Any | None) -> None:
        """Send ``send`` to the right while receiving ``recv`` from the left, blocking until both
        are done (``None``: nothing that way). Same as posting both and waiting, in fewer calls."""

    def wait(self, request: Any) -> None:
        """Block until ``request`` (or ``None``: nothing) is complete."""

    def allgather_ints(self, values: np.ndarray) -> np.ndarray:
        """Every rank's small int64 vector, as a (size, len) array: for metadata only, not tensors."""

    def barrier(self) -> None:
        """Return once every rank has called it."""
