"""A whole ring inside one process, one thread per rank: runs the real executor without MPI (tests)."""
from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

from ring.schedule import left, right
from ring.transport.base import TransportError


class InProcessWorld:
    """``n`` ranks that talk through in-memory mailboxes. Sends complete at once (eager)."""

    def __init__(self, nranks: int, timeout: float = 30.0):
        self.size = nranks
        self.timeout = timeout
        self._mailboxes = [queue.Queue() for _ in range(nranks)]
        self._barrier = threading.Barrier(nranks)
        self._gathered: list[Any] = [None] * nranks

    def transport(self, rank: int) -> "InProcessTransport":
        return InProcessTransport(self, rank)


class _PendingRecv:
    def __init__(self, buf):
        self.buf = buf


class InProcessTransport:
    def __init__(self, world: InProcessWorld, rank: int):
        self._world = world
        self.rank = rank
        self.size = world.size
        self._inbox = world._mailboxes[rank]
        self._outbox = world._mailboxes[right(rank, world.size)]

    def send_to_right(self, buf: Any) -> None:
        self._outbox.put(np.array(buf, copy=True).view(np.uint8).reshape(-1))
        return None

    def recv_from_left(self, buf: Any) -> _PendingRecv:
        return _PendingRecv(buf)

    def exchange(self, send: Any | None, recv: Any | None) -> None:
        if send is not None:
            self.send_to_right(send)
        if recv is not None:
            self.wait(self.recv_from_left(recv))

    def wait(self, request: _PendingRecv | None) -> None:
        if request is None:
            return
        try:
            data = self._inbox.get(timeout=self._world.timeout)
        except queue.Empty:
            raise TransportError(f"rank {self.rank}: nothing from rank {left(self.rank, self.size)}") from None
        target = request.buf.view(np.uint8).reshape(-1)
        if data.size != target.size:
            raise TransportError(f"rank {self.rank}: expected {target.size} bytes, got {data.size}")
        target[...] = data

    def allgather_ints(self, values: np.ndarray) -> np.ndarray:
        self._world._gathered[self.rank] = np.asarray(values, dtype=np.int64).copy()
        self.barrier()
        result = np.stack(self._world._gathered)
        self.barrier()   # nobody overwrites a slot before everyone has read it
        return result

    def barrier(self) -> None:
        try:
            self._world._barrier.wait(timeout=self._world.timeout)
        except threading.BrokenBarrierError:
            raise TransportError(f"rank {self.rank}: barrier broken") from None
