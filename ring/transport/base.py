"""What the ring needs from a network: post a send to the right neighbour, post a
receive from the left one, exchange with any peer, wait. Transports move bytes and
do no arithmetic.

No wait is unbounded: every call that may wait takes the :class:`Bound` of the
collective it serves (its deadline, and the runtime's stop) and gives up at it with
TransportTimeout; a peer known to have died is reported with PeerLost. What a
transport knows of its peers (who left, who died, the roll call, the farewells) is
its control plane, apart from the data (``ring.transport.mpi.control``).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol


MAX_P2P_TAG = 30000   # the largest point-to-point tag a program may use (MPI promises 32767; ours start at 64)

#: Where the bytes of a message exchanged with ``reuse`` (``Transport.exchange``) begin that its owner
#: leaves free (``ring.doubling``'s header: after the signature and its "all agree so far" byte, up to
#: the payload): the transport may say there how many more pieces of the message follow its first,
#: and mark it as its own (``ring.transport.mpi.transport.Persistent``). Nothing else writes them;
#: the first is 0 between exchanges.
PIECES_AT = 257
PIECES_BYTES = 7


#: Seconds a roll call (after a timeout: which call is each rank in?) waits for answers after asking;
#: a wait nearing its deadline asks ahead (see ``ring.transport.mpi.control.Control.roll_call``).
ROLL_CALL_GRACE = 1.0


def from_this_call(answer: tuple[int, str], seq: int, name: str) -> bool:
    """Whether a rank's roll-call ``answer`` (the call it is in, and its collective: "" where it did not
    say) places it in call ``seq`` of collective ``name``: a rank in another collective of the same
    number (the check off) is not.

    >>> from_this_call((2, "allreduce"), 2, "allreduce"), from_this_call((2, ""), 2, "allreduce")
    (True, True)
    >>> from_this_call((2, "broadcast"), 2, "allreduce"), from_this_call((3, "allreduce"), 2, "allreduce")
    (False, False)
    """
    return answer[0] == seq and answer[1] in (name, "")


class TransportError(RuntimeError):
    """The network failed underneath a collective (a peer died, a message was cut short)."""


class CommunicatorsExhausted(TransportError):
    """MPI has no communicator (context id) left for a new group; it failed alike on every rank."""


class TransportTimeout(TransportError):
    """The deadline passed while waiting on ``peer`` (which may itself be waiting on another)
    after ``waited`` seconds: for a collective, the time since its last progress (see ``Bound``)."""

    def __init__(self, peer: int, waited: float, waiting_for: str = ""):
        super().__init__(self.words(waited, waiting_for or f"rank {peer}"))
        self.peer = peer
        self.waited = waited

    @staticmethod
    def words(waited: float, what: str) -> str:
        """How a timeout says it: ``words(2.0, "rank 1")`` is "timed out after 2 s waiting for rank 1"."""
        return f"timed out after {waited:.3g} s waiting for {what}"


class Stopped(TransportError):
    """The runtime stopped while this rank waited (another call failed, a ``Work.wait`` ran out,
    Ctrl-C): the wait ended at its next look, before its own deadline (see ``Bound.stop``)."""

    def __init__(self, waited: float):
        super().__init__(f"the runtime stopped while this rank waited ({waited:.3g} s)")


class PeerLost(TransportError):
    """Rank ``peer`` left (its farewell says why) or its process is gone, before this call was done.

    ``message`` says which, in full: ``rank 1 left: uncaught RuntimeError: ... (after 3 collective(s))``.
    ``root``: where a rank died, the root cause as every rank should hear it, naming the rank that
    saw it (``rank 3 is gone: ... (seen by rank 2)``), also when it reached this rank through the
    farewell of a rank that failed because of it; else None. ``said``: the rank said so itself (its
    farewell or give-up, read from the control channel), not a death seen here.
    """

    def __init__(self, peer: int, message: str, root: str | None = None, dead: int | None = None,
                 said: bool = False):
        super().__init__(message)
        self.peer = peer
        self.root = root
        self.dead = dead   # the rank that died, where one did (no message may be sent to it any more)
        self.said = said


class Bound:
    """What bounds the waits of one collective call, given to each: the call's number on its group
    (``seq``, counted from 1: the roll call reports it, and a peer that left is judged against it),
    its deadline (``until``, a ``time.monotonic()`` value), the runtime's ``stop`` (an Event: once
    set, every wait ends at its next look, whatever its deadline) and whether the call runs in the
    ``background`` (another thread of this process computes meanwhile: naps, never spins).

    With a ``window`` (a collective's timeout), the deadline is ``window`` seconds after the call's
    last progress: every wait that completes moves it (:meth:`progressed`), so a large call that
    keeps moving data outlasts its timeout, and one that hears nothing for ``window`` seconds ends;
    and every wait waits ``window`` seconds at least (:meth:`wait_begins`): what the rank computed since
    the last progress is not time it waited. Without one (0), ``until`` is fixed: a whole
    operation's deadline (the setup, point-to-point).

    >>> bound = Bound(3, until=100.0, stop=threading.Event())
    >>> bound.passed(99.0), bound.passed(100.0)
    (False, True)
    >>> bound.stop.set(); bound.passed(0.0)
    True
    >>> moving = Bound(1, until=time.monotonic() + 3.0, stop=threading.Event(), window=3.0)
    >>> moving.until = 0.0; moving.progressed(); moving.passed(time.monotonic() + 2.9)
    False
    >>> moving.until = 0.0; moving.wait_begins(50.0); moving.until
    53.0
    """

    __slots__ = ("seq", "until", "stop", "background", "window")

    def __init__(self, seq: int | None, until: float, stop: threading.Event, background: bool = False,
                 window: float = 0.0):
        self.seq = seq   # (None: no collective, such as a point-to-point wait)
        self.until = until
        self.stop = stop
        self.background = background
        self.window = window

    def passed(self, now: float) -> bool:
        """Whether a wait looking at the clock at ``now`` must give up."""
        return now >= self.until or self.stop.is_set()

    def progressed(self) -> None:
        """A wait of this call completed: with a ``window``, the deadline is ``window`` seconds from now."""
        if self.window:
            self.until = time.monotonic() + self.window

    def wait_begins(self, now: float) -> None:
        """A wait begins at ``now``: with a ``window``, its deadline is ``window`` seconds away at least.
        (A rank that computed for longer than the timeout since the call's last progress, making the
        plan of a call of many small segments, say, has not waited for anyone yet: counting that time
        would fail its wait at once, though every rank is in the call and its data on the way.)"""
        if self.window and self.until < now + self.window:
            self.until = now + self.window

    def expired(self, waited: float, peer: int, waiting_for: str = "") -> TransportError:
        """The error of a wait that gave up after ``waited`` seconds, waiting for ``peer``: the
        runtime's stop if that is what ended it, else the deadline's timeout, which names (with a
        ``window``) the time since the call's last progress, or since the wait began: what ran out."""
        if self.stop.is_set():
            return Stopped(waited)
        if self.window:
            waited = time.monotonic() - (self.until - self.window)
        return TransportTimeout(peer, waited, waiting_for)


def unbounded() -> Bound:
    """A bound that never passes: for the pure tests of the schedules (their world has its own timeout)."""
    return Bound(0, float("inf"), threading.Event())


class Transport(Protocol):
    """A rank's view of a world of ``size`` ranks: the data plane, which moves bytes.

    Messages between two ranks arrive in the order they were posted (MPI's
    non-overtaking rule); the schedules rely on nothing more. A receive buffer may
    be larger than the message that lands in it. Every call that may wait takes the
    ``bound`` of the collective it serves.
    """

    rank: int
    size: int
    local_rank: int   # this rank's place among the ranks on its host
    local_size: int   # how many ranks share its host

    def send_to_right(self, buf: Any, bound: Bound) -> Any:
        """Start sending ``buf`` (contiguous) to rank ``(rank + 1) % size``; return a request."""

    def recv_from_left(self, buf: Any, bound: Bound) -> Any:
        """Start receiving into ``buf`` (contiguous) from rank ``(rank - 1) % size``; return a request."""

    def exchange(self, send: Any | None, recv: Any | None, bound: Bound, dest: int | None = None,
                 source: int | None = None, reuse: Any = None) -> None:
        """Send ``send`` to ``dest`` (default: the right neighbour) while receiving ``recv`` from
        ``source`` (default: the left one), blocking until both are done; ``None``: nothing that way.
        ``reuse``: a key (hashable, the same object whenever it is given these very buffer objects,
        which keep their memory) under which the transport may keep the setup of the exchange with
        these peers, and may send ``send`` in pieces, saying so in PIECES_BYTES bytes at PIECES_AT of
        both buffers (their owner keeps them free); None: a one-off exchange."""

    def wait(self, request: Any, bound: Bound) -> None:
        """Block until ``request`` (or ``None``: nothing) is complete."""

    def allgather_bytes(self, data: bytes, bound: Bound) -> list[bytes]:
        """Every rank's ``data`` (the same length on every rank), in rank order: metadata only."""

    def abandon(self) -> None:
        """After a failed or interrupted call: cancel what is still posted (nothing lands later)."""

    def close(self, failed: bool = False) -> None:
        """Release the transport's resources (at exit; ``failed``: after a failure, abort instead)."""


class MPIOnlyTransport(Transport, Protocol):
    """What ``collectives`` asks of a group's host transport beyond :class:`Transport`: offered by
    the MPI transport alone (``ring.transport.mpi.transport.MPITransport``, which its subsets share),
    so a new host transport must offer these too. The device transports and the in-process one do
    not: they carry a call's data, never a group.
    """

    hosts: list[str]    # each rank's host name, in rank order
    spans_hosts: bool   # its ranks are on more than one host (the runtime's segments are smaller then)
    comm: Any           # its mpi4py communicator (the world's is rebuilt from it after a change)
    control: Any        # its control plane, ring.transport.mpi.control.Control: who left or died, the roll call
    exits: Any          # the farewell and the exit barrier, ring.transport.mpi.exits.Exits
    p2p: Any            # point-to-point sends and receives, ring.transport.mpi.p2p.PointToPoint

    def split(self, color: int | None, key: int, watched: bool = False) -> MPIOnlyTransport | None:
        """A transport over the ranks that pass the same ``color``, ordered by ``key`` (every rank calls)."""

    def subset(self, ranks: Sequence[int]) -> MPIOnlyTransport:
        """A transport over ``ranks`` of this one, in that order, made by those ranks alone."""

    def among(self, peers: Sequence[int], data: bytes, bound: Bound) -> list[bytes]:
        """Exchange ``data`` with each of ``peers``: an agreement among some ranks of this transport."""

    def persistent(self, send: Any, recv: Any, dest: int, source: int, reuse: Any, framed: bool = True) -> Any:
        """``exchange(send, recv, bound, dest, source, reuse)`` made ready once and handed to the caller,
        who repeats it (the express lane): an object whose ``run(bound)`` does that exchange, and
        ``release()`` lets it go. ``framed=False``: the caller's own data (never cut in pieces), one way
        allowed, over the buffers' memory rather than the objects: ``run_on(bound, send, recv)`` with
        the buffers that lie there then."""

    def span(self, buffer: Any) -> tuple[int, int]:
        """The memory contiguous ``buffer`` spans, ``(address, bytes)`` (None: ``(0, 0)``): what an exchange
        of ``persistent(framed=False)`` serves."""


class OverHost:
    """Shared by the device transports (NCCL, staged): the host transport they stand on keeps the
    ranks, the metadata exchange and the control plane; they only move device buffers."""

    def __init__(self, host: Transport):
        self.host = host
        self.rank, self.size = host.rank, host.size
        self.local_rank, self.local_size = host.local_rank, host.local_size
        self.gpu: int | None = None   # the GPU served (set by ring.transport.gpu.device.open_transport)
        self.why_staged = ""          # why this world is not on NCCL, when it is not

    def allgather_bytes(self, data: bytes, bound: Bound) -> list[bytes]:
        return self.host.allgather_bytes(data, bound)

    def abandon(self) -> None:
        self.host.abandon()

    def close(self, failed: bool = False) -> None:
        """Nothing of its own to release (the NCCL transport has its communicator)."""
