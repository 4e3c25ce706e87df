"""A whole world inside one process, one thread per rank: runs the real algorithms without MPI (tests)."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from ring.schedule import left, right
from ring.transport.base import Bound, TransportError, TransportTimeout


class InProcessWorld:
    """``n`` ranks that talk through in-memory mailboxes, one per (sender, receiver). Sends complete at once."""

    def __init__(self, nranks: int, timeout: float = 30.0):
        self.size = nranks
        self.timeout = timeout
        self._mailboxes = {(s, d): queue.Queue() for s in range(nranks) for d in range(nranks)}
        self._barrier = threading.Barrier(nranks)
        self._gathered: list[Any] = [None] * nranks

    def transport(self, rank: int) -> "InProcessTransport":
        return InProcessTransport(self, rank)


class _PendingRecv:
    def __init__(self, buf, source: int):
        self.buf = buf
        self.source = source


class InProcessTransport:
    """The data plane of ``ring.transport.base.Transport``, between the threads of an InProcessWorld
    (no control plane: no rank of it leaves or dies)."""

    def __init__(self, world: InProcessWorld, rank: int):
        self._world = world
        self.rank = rank
        self.size = world.size
        self.local_rank, self.local_size = rank, world.size   # every rank on one host

    def _send(self, buf: Any, dest: int) -> None:
        self._world._mailboxes[(self.rank, dest)].put(_bytes_of(buf).copy())

    def send_to_right(self, buf: Any, bound: Bound) -> None:
        self._send(buf, right(self.rank, self.size))

    def recv_from_left(self, buf: Any, bound: Bound) -> _PendingRecv:
        return _PendingRecv(buf, left(self.rank, self.size))

    def exchange(self, send: Any | None, recv: Any | None, bound: Bound, dest: int | None = None,
                 source: int | None = None, reuse: Any = None) -> None:
        if send is not None:
            self._send(send, right(self.rank, self.size) if dest is None else dest)
        if recv is not None:
            self.wait(_PendingRecv(recv, left(self.rank, self.size) if source is None else source), bound)

    def wait(self, request: _PendingRecv | None, bound: Bound) -> None:
        if request is None:
            return
        now = time.monotonic()
        bound.wait_begins(now)
        patience = min(self._world.timeout, max(0.0, bound.until - now))
        try:
            data = self._world._mailboxes[(request.source, self.rank)].get(timeout=patience)
        except queue.Empty:
            raise TransportTimeout(request.source, patience) from None
        target = _bytes_of(request.buf)
        if data.size > target.size:
            raise TransportError(f"rank {self.rank}: a {target.size}-byte buffer got {data.size} bytes")
        target[:data.size] = data

    def allgather_bytes(self, data: bytes, bound: Bound) -> list[bytes]:
        self._world._gathered[self.rank] = bytes(data)
        self._barrier()
        result = list(self._world._gathered)
        self._barrier()   # nobody overwrites a slot before everyone has read it
        return result

    def abandon(self) -> None:
        pass   # sends complete at once and receives are only posted while waited for

    def close(self, failed: bool = False) -> None:
        pass

    def _barrier(self) -> None:
        try:
            self._world._barrier.wait(timeout=self._world.timeout)
        except threading.BrokenBarrierError:
            raise TransportError(f"rank {self.rank}: barrier broken") from None


def _bytes_of(buf: Any) -> np.ndarray:
    """The bytes of a contiguous array or memoryview, as a flat uint8 array sharing its memory."""
    return np.asarray(memoryview(buf)).reshape(-1).view(np.uint8)
