"""What the ring needs from a network: post a send to the right neighbour, post a
receive from the left one, exchange with any peer, wait. Transports move bytes and
do no arithmetic.

No wait is unbounded: every transport gives up at its ``deadline`` (a
``time.monotonic()`` value the caller sets per collective) with TransportTimeout,
and reports a peer that is known to have died with PeerLost.
"""
from __future__ import annotations

from typing import Any, Protocol


MAX_P2P_TAG = 30000   # the largest point-to-point tag a program may use (MPI promises 32767; ours start at 64)


class TransportError(RuntimeError):
    """The network failed underneath a collective (a peer died, a message was cut short)."""


class CommunicatorsExhausted(TransportError):
    """MPI has no communicator (context id) left for a new group; it failed alike on every rank."""


class TransportTimeout(TransportError):
    """The deadline passed while waiting on ``peer`` (which may itself be waiting on another)."""

    def __init__(self, peer: int, waited: float, waiting_for: str = ""):
        super().__init__(f"timed out after {waited:.3g} s waiting for {waiting_for or f'rank {peer}'}")
        self.peer = peer
        self.waited = waited


class PeerLost(TransportError):
    """Rank ``peer`` left (its farewell says why) or its process is gone, before this call was done.

    ``message`` says which, in full: ``rank 1 left: uncaught RuntimeError: ... (after 3 collective(s))``.
    ``root``: where a rank died, the root cause as every rank should hear it, naming the rank that
    saw it (``rank 3 is gone: ... (seen by rank 2)``), also when it reached this rank through the
    farewell of a rank that failed because of it; else None.
    """

    def __init__(self, peer: int, message: str, root: str | None = None, dead: int | None = None):
        super().__init__(message)
        self.peer = peer
        self.root = root
        self.dead = dead   # the rank that died, where one did (no message may be sent to it any more)


class Transport(Protocol):
    """A rank's view of a world of ``size`` ranks.

    Messages between two ranks arrive in the order they were posted (MPI's
    non-overtaking rule); the schedules rely on nothing more. A receive buffer may
    be larger than the message that lands in it.
    """

    rank: int
    size: int
    local_rank: int   # this rank's place among the ranks on its host
    local_size: int   # how many ranks share its host
    deadline: float   # time.monotonic() after which every wait raises TransportTimeout
    seq: int          # the collective under way, counted from 1 (set by the caller with the deadline)

    def send_to_right(self, buf: Any) -> Any:
        """Start sending ``buf`` (contiguous) to rank ``(rank + 1) % size``; return a request."""

    def recv_from_left(self, buf: Any) -> Any:
        """Start receiving into ``buf`` (contiguous) from rank ``(rank - 1) % size``; return a request."""

    def exchange(self, send: Any | None, recv: Any | None, dest: int | None = None,
                 source: int | None = None, reuse: Any = None) -> None:
        """Send ``send`` to ``dest`` (default: the right neighbour) while receiving ``recv`` from
        ``source`` (default: the left one), blocking until both are done; ``None``: nothing that way.
        ``reuse``: a key (hashable, the same object whenever it is given these very buffer objects,
        which keep their memory) under which the transport may keep the setup of the exchange with
        these peers; None: a one-off exchange."""

    def wait(self, request: Any) -> None:
        """Block until ``request`` (or ``None``: nothing) is complete."""

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` (the same length on every rank), in rank order: metadata only."""

    def roll_call(self, grace: float) -> dict[int, int]:
        """After a timeout: ``{rank: the call it is in}`` for the ranks heard within ``grace`` seconds."""

    def unreachable(self) -> list[int]:
        """After a roll call: the ranks whose host did not answer it at all (counted dead from then on)."""

    def abandon(self) -> None:
        """After a failed or interrupted call: cancel what is still posted (nothing lands later)."""

    def farewell(self, completed: int, why: str, failed: bool = False, root: bool = False,
                 finalizing: bool = True, dead: int | None = None) -> None:
        """Tell every other rank that this one leaves after ``completed`` collectives, because ``why``
        ("": its program ended); ``failed``: the runtime had already failed here; ``root``: ``why``
        is a root cause to pass on as it is (see PeerLost); ``finalizing``: this process will
        call MPI_Finalize (not after a peer died: see collectives.leaving); ``dead``: the
        rank that died, so that nobody sends it anything (over UCX that crashed the sender)."""

    def close(self, failed: bool = False) -> None:
        """Release the transport's resources (at exit; ``failed``: after a failure, abort instead)."""


class OverHost:
    """Shared by the device transports (NCCL, staged): the host transport they stand on keeps the
    ranks, the deadline, the metadata exchange and the roll call; they only move device buffers."""

    def __init__(self, host: Transport):
        self.host = host
        self.rank, self.size = host.rank, host.size
        self.local_rank, self.local_size = host.local_rank, host.local_size
        self.gpu: int | None = None   # the GPU served (set by ring.transport.device.open_transport)
        self.why_staged = ""          # why this world is not on NCCL, when it is not

    @property
    def deadline(self) -> float:
        return self.host.deadline

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.host.deadline = value

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return self.host.allgather_bytes(data)

    def abandon(self) -> None:
        self.host.abandon()

    def close(self, failed: bool = False) -> None:
        """Nothing of its own to release (the NCCL transport has its communicator)."""
