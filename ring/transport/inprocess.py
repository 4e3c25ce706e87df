"""A whole world inside one process, one thread per rank: runs the real algorithms without MPI (tests)."""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from ring.schedule import left, right
from ring.transport.base import TransportError, TransportTimeout


class InProcessWorld:
    """``n`` ranks that talk through in-memory mailboxes, one per (sender, receiver). Sends complete at once."""

    def __init__(self, nranks: int, timeout: float = 30.0):
        self.size = nranks
        self.timeout = timeout
        self._mailboxes = {(s, d): queue.Queue() for s in range(nranks) for d in range(nranks)}
        self._barrier = threading.Barrier(nranks)
        self._gathered: list[Any] = [None] * nranks
        self._calls: dict[int, int] = {}   # rank -> the call it is in, for the roll call

    def transport(self, rank: int) -> "InProcessTransport":
        return InProcessTransport(self, rank)


class _PendingRecv:
    def __init__(self, buf, source: int):
        self.buf = buf
        self.source = source


class InProcessTransport:
    def __init__(self, world: InProcessWorld, rank: int):
        self._world = world
        self.rank = rank
        self.size = world.size
        self.deadline = float("inf")   # the world's own timeout applies as well
        self.seq = 0
        self.local_rank, self.local_size = rank, world.size   # every rank on one host

    def _send(self, buf: Any, dest: int) -> None:
        self._world._mailboxes[(self.rank, dest)].put(_bytes_of(buf).copy())

    def send_to_right(self, buf: Any) -> None:
        self._send(buf, right(self.rank, self.size))

    def recv_from_left(self, buf: Any) -> _PendingRecv:
        return _PendingRecv(buf, left(self.rank, self.size))

    def exchange(self, send: Any | None, recv: Any | None, dest: int | None = None,
                 source: int | None = None, reuse: Any = None) -> None:
        if send is not None:
            self._send(send, right(self.rank, self.size) if dest is None else dest)
        if recv is not None:
            self.wait(_PendingRecv(recv, left(self.rank, self.size) if source is None else source))

    def wait(self, request: _PendingRecv | None) -> None:
        if request is None:
            return
        patience = min(self._world.timeout, max(0.0, self.deadline - time.monotonic()))
        try:
            data = self._world._mailboxes[(request.source, self.rank)].get(timeout=patience)
        except queue.Empty:
            raise TransportTimeout(request.source, patience) from None
        target = _bytes_of(request.buf)
        if data.size > target.size:
            raise TransportError(f"rank {self.rank}: a {target.size}-byte buffer got {data.size} bytes")
        target[:data.size] = data

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        self._world._gathered[self.rank] = bytes(data)
        self._barrier()
        result = list(self._world._gathered)
        self._barrier()   # nobody overwrites a slot before everyone has read it
        return result

    def roll_call(self, grace: float) -> dict[int, int]:
        calls = self._world._calls
        calls[self.rank] = self.seq
        time.sleep(grace)
        return {r: seq for r, seq in calls.items() if r != self.rank}

    def unreachable(self) -> list[int]:
        return []   # (one process: every rank is reachable)

    def abandon(self) -> None:
        pass   # sends complete at once and receives are only posted while waited for

    def farewell(self, completed: int, why: str, failed: bool = False, root: bool = False,
                 finalizing: bool = True, dead: int | None = None) -> None:
        pass

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
