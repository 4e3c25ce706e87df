"""Point-to-point over MPI (mpi4py), on host memory, raw bytes, no pickling.

Never blocks inside MPI: every wait polls its requests (as MPI's own Wait does)
until they complete, its call's bound passes (TransportTimeout at the deadline, or Stopped:
the runtime stopped), or a peer is known to be gone (PeerLost). So a rank stuck on
a peer that never comes always gets control back. How a peer is known to be gone,
asked of the transport's control plane every CHECK_INTERVAL seconds while a wait
lasts (``ring.transport.mpi.waiting``, the one poll loop): its farewell arrived, or it died (``ring.transport.mpi.control``; the farewell
and the exit barrier are ``ring.transport.mpi.exits``). A long wait backs off from
spinning to yielding to short sleeps (``ring.transport.host_waits``), so a rank stuck
for minutes does not burn its core. ``ring.transport.mpi.setup`` makes the first
transport; ``split`` makes the others.
"""
from __future__ import annotations

import os
import time
from typing import Any, NoReturn, Sequence

import numpy as np
from mpi4py import MPI

from ring.schedule import left, right
from ring.transport.mpi import liveness as liveness_watch
from ring.transport.base import PIECES_AT, PIECES_BYTES, Bound, TransportError
from ring.transport.mpi.control import Control
from ring.transport.mpi.exits import Exits
from ring.transport.mpi.errors import error_text
from ring.transport.mpi.p2p import PointToPoint
from ring.transport.host_waits import SPIN_SECONDS, usable_cores
from ring.transport.mpi.subsets import Subsets
from ring.transport.mpi.waiting import wait_for

_TAG = 7
_MORE_TAG = 12             # the pieces of a message after its first (Persistent); 8-11: control and setup
_QUICK_POLLS = 32          # polls before the first look at the clock (about 5 us)
_MPICH = MPI.Get_library_version().startswith("MPICH")


def _single_copy_from(environment=os.environ) -> int:
    """The size from which MPICH moves a message to a rank of its host by single copy (CMA: the
    receiver reads the sender's memory, a system call and a handshake each way), below it through
    shared cells, as its settings say (0: never; a value MPICH could not read: its default). On the
    AMD EPYC VM of docs/performance.md the copy costs more than it saves up to about 20 KiB: a
    doubling message of 8-24 KiB (an 8-16 KiB call) goes faster in pieces below it (Persistent).

    >>> _single_copy_from({}), _single_copy_from({"MPIR_CVAR_CH4_CMA_ENABLE": "0"})
    (8192, 0)
    >>> _single_copy_from({"MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD": "24576"})
    24576
    """
    if environment.get("MPIR_CVAR_CH4_CMA_ENABLE", "1") == "0":
        return 0
    try:
        return int(environment.get("MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD", "8192"))
    except ValueError:
        return 8192


_SINGLE_COPY_FROM = _single_copy_from()
#: A piece: a multiple of 64 bytes that one of MPICH's shared cells (8 KiB, its header included) carries
#: eagerly (a piece of 8128 bytes waited for its receive, and took longer than the whole message).
_PIECE_BYTES = 7936
_MOST_READY = 64           # ready exchanges a transport keeps (their buffers with them: Persistent)
_MOST_MEMORY = 256         # exchanges of the caller's memory a transport keeps (no buffer: Persistent)
_MOST_PIECES = 3           # (past about 24 KiB the single copy is as fast: not cut)
#: What follows the count of pieces in a cut message's first: a count in bytes that are not this
#: transport's (a raw message of another collective, the check off) is not taken for one.
_PIECES_MARK = b"pieces"
assert len(_PIECES_MARK) == PIECES_BYTES - 1
#: Open MPI frees a request that fails inside MPI_Testall (a persistent one goes inactive) and keeps its
#: error only in the status: waits keep statuses there, so that the cause can be named (a message longer
#: than expected, say). MPICH keeps the error in the request, and polls without them (0.3 us less a poll).
_KEEP_STATUSES = MPI.Get_library_version().startswith("Open MPI")
_NO_BUFFERS = (None, None)
_testall = MPI.Request.Testall


def _memory(buffer: Any) -> Any:
    """``buffer``'s memory, as MPI's buffer at its address, which does not hold ``buffer`` (None: None)."""
    if buffer is None:
        return None
    view = MPI.buffer(buffer)
    return MPI.buffer.fromaddress(view.address, view.nbytes, readonly=view.readonly)


def _each_done(requests: list[MPI.Request]) -> bool:
    """Whether every one of ``requests`` is done, each tested by itself: one that failed raises its own
    error (a message longer than posted), where Testall without statuses says only that some status
    holds it (MPICH's ``ERR_IN_STATUS``)."""
    for request in requests:
        if not request.Test():
            return False
    return True


class MPITransport(Subsets):
    """The ring's neighbours on an MPI communicator (use a private duplicate, never the user's):
    the data plane, with its ``control`` plane (``ring.transport.mpi.control``: departures, deaths,
    the roll call) and its ``exits`` (the farewell and the exit barrier) beside it.

    Made by ``ring.transport.mpi.setup.connect``, which also learns where every rank runs, or by
    ``split`` or ``subset`` (``ring.transport.mpi.subsets``) for some of the ranks. ``names``: how
    messages name each rank of ``comm`` (the world's ranks, for a subset; default: its own
    ranks). ``watch``: another transport over the same ranks or more, whose control plane tells
    this one of departures (a transport used only inside the calls of another, such as the two
    levels of a hierarchical all-reduce). ``liveness``: the watch over the ranks on other hosts
    (by ``names``), shared by every transport made from the first by ``split``; the first closes it.
    """

    def __init__(self, comm: MPI.Comm, hosts: Sequence[str], pids: Sequence[int],
                 names: Sequence[int] | None = None, watch: "MPITransport | None" = None,
                 liveness: liveness_watch.Liveness | None = None, owns_liveness: bool = False):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.hosts, self.pids = list(hosts), list(pids)
        self.names = list(names) if names is not None else list(range(self.size))
        self.liveness, self._owns_liveness = liveness, owns_liveness
        self.control = Control(comm, self.names, self.hosts, self.pids, liveness,
                               watch.control if watch is not None else None)
        self.exits = Exits(self.control)
        self._right = right(self.rank, self.size)
        self._left = left(self.rank, self.size)
        local = [r for r in range(self.size) if hosts[r] == hosts[self.rank]]
        self.local_rank = local.index(self.rank)   # this rank's place among the ranks on its host
        self.local_size = len(local)
        self.spans_hosts = len(local) < self.size   # (the runtime's segments are smaller across hosts)
        self._remote = self.control.remote   # (the ranks a send is guarded for: see sending_to)
        # MPICH's ranks of this host, which may send a message made ready in pieces (Persistent): the
        # receiver looks whatever its own settings; a sender cuts where MPICH would copy it singly
        self._may_cut = frozenset(r for r in local if r != self.rank) if _MPICH else frozenset()
        self._cuts = self._may_cut if _PIECE_BYTES < _SINGLE_COPY_FROM <= _MOST_PIECES * _PIECE_BYTES \
            else frozenset()
        # More ranks than cores on this host: the peer we wait for may need our core, so give it
        # up at every poll instead of spinning first (MPI libraries do the same when oversubscribed).
        oversubscribed = self.local_size > usable_cores(self.control.local_pids.values())
        self.spin_seconds = 0.0 if oversubscribed else SPIN_SECONDS   # (see host_waits.pause)
        self._quick_polls = 1 if oversubscribed else _QUICK_POLLS
        self._persistent: dict = {}    # ready exchanges with buffers of their own (at most _MOST_READY)
        self._memory_kept: dict = {}   # those of the caller's memory (framed=False; at most _MOST_MEMORY)
        self._inflight: list = []      # (request, peer) posted and not yet waited for, with its buffer
        self._abandoned: list = []     # requests that could not be cancelled, kept with their buffers for good
        self.p2p = PointToPoint(self)

    def send_to_right(self, buf: Any, bound: Bound) -> tuple[MPI.Request, int]:
        if self._right in self._remote:
            self.control.guard(self._right, bound.seq)
        try:
            request = self.comm.Isend([buf, MPI.BYTE], self._right, _TAG)
        except MPI.Exception as e:
            raise TransportError(f"send to rank {self.names[self._right]} failed: {error_text(e)}") from e
        return self._posted(request, self._right, buf, receive=False)

    def recv_from_left(self, buf: Any, bound: Bound) -> tuple[MPI.Request, int]:
        try:
            request = self.comm.Irecv([buf, MPI.BYTE], self._left, _TAG)
        except MPI.Exception as e:
            raise TransportError(f"receive from rank {self.names[self._left]} failed: {error_text(e)}") from e
        return self._posted(request, self._left, buf, receive=True)

    def sending_to(self, peer: int, seq: int | None) -> None:
        """Raise PeerLost, before anything is posted in call ``seq``, if ``peer`` is on another host
        and its process has ended or is ending. Over UCX, MPICH crashes a rank that sends to such a
        peer once it has seen the peer's connection close (see ``Liveness.gone``). A peer on this
        host is never sent anything after its death is known, and MPI's shared memory does not
        crash meanwhile."""
        if peer in self._remote:
            self.control.guard(peer, seq)

    def _posted(self, request: MPI.Request, peer: int, buf: Any, receive: bool) -> tuple[MPI.Request, int]:
        """Remember a posted request until it is waited for (see ``abandon``)."""
        posted = (request, peer)
        self._inflight.append((posted, buf, receive))
        return posted

    def wait(self, request: tuple[MPI.Request, int] | None, bound: Bound) -> None:
        if request is None:
            return
        self._wait_all([request[0]], [request[1]], bound)
        for i, (posted, _, _) in enumerate(self._inflight):   # at most a few entries
            if posted is request:
                del self._inflight[i]
                break

    def exchange(self, send: Any | None, recv: Any | None, bound: Bound, dest: int | None = None,
                 source: int | None = None, reuse: Any = None) -> None:
        source = self._left if source is None else source
        dest = self._right if dest is None else dest
        if reuse is None or send is None or recv is None:
            self._exchange_once(send, recv, bound, dest, source)
            return
        # The latency path: persistent requests, made once per (``reuse``, peers), since its buffers
        # are the same on every call (about 1 us less per exchange here).
        self.persistent(send, recv, dest, source, reuse).run(bound)

    def persistent(self, send: Any, recv: Any, dest: int, source: int, reuse: Any, framed: bool = True) -> Persistent:
        """The exchange of ``send`` with ``dest`` and ``recv`` with ``source``, made ready once under
        ``reuse`` (see :meth:`exchange`) and kept until it fails, is released (``Persistent.release``)
        or the transport closes (_MOST_READY at most: then every kept one is freed, and made again at
        its next run). ``framed=False``: the buffers are the caller's own data (an express lane's arrays), which
        the transport neither cuts nor reads for a count of pieces; either may be None (one way). Its
        requests then refer to the buffers' memory, not to the buffer objects, which it does not hold
        between runs: run it with ``Persistent.run_on``, given the buffers that span that memory then
        (:meth:`span` tells what a buffer spans). Those hold no buffer and are kept apart, up to
        _MOST_MEMORY (the express lanes': 64 kinds of call, each for up to 4 memories): counted with
        the ready exchanges, a loop over 40 kinds of a large two-rank all-reduce made its requests
        again at every call, which took twice the time."""
        key = (reuse, dest, source)
        return self._persistent.get(key) or self._persist(send, recv, dest, source, key, framed)

    @staticmethod
    def span(buffer: Any) -> tuple[int, int]:
        """The memory ``buffer`` (contiguous; None: none) spans: its address and its length in bytes.

        >>> x = np.zeros(4, np.int16); MPITransport.span(x) == (x.ctypes.data, 8), MPITransport.span(None)
        (True, (0, 0))
        """
        if buffer is None:
            return 0, 0
        view = MPI.buffer(buffer)
        return view.address, view.nbytes

    def _exchange_once(self, send: Any | None, recv: Any | None, bound: Bound, dest: int, source: int) -> None:
        """exchange() over requests of its own, for one call."""
        requests, peers = [], []
        try:
            if recv is not None:
                requests.append(self.comm.Irecv([recv, MPI.BYTE], source, _TAG))
                peers.append(source)
            if send is not None:
                if dest in self._remote:
                    self.control.guard(dest, bound.seq)
                requests.append(self.comm.Isend([send, MPI.BYTE], dest, _TAG))
                peers.append(dest)
            self._wait_all(requests, peers, bound)
        except MPI.Exception as e:
            raise TransportError(f"exchange with ranks {self.names[source]} and {self.names[dest]} failed: "
                                 f"{error_text(e)}") from e
        except BaseException:
            self.give_up(requests, (send, recv), requests[:1] if recv is not None else [])
            raise

    def _persist(self, send: Any, recv: Any, dest: int, source: int, key: tuple, framed: bool) -> Persistent:
        """A new ready exchange of ``send`` and ``recv`` with these peers, kept under ``key``."""
        entry = Persistent(self, key, (source, dest), (send, recv), framed)
        entry.make()
        if not framed:   # (the caller's buffers: not held between runs, see run_on)
            entry.buffers = _NO_BUFFERS
        return entry

    def _free_persistent(self, kinds: tuple | None = None) -> None:
        """Release every exchange it keeps (of ``kinds``, its dicts of them: None, both kinds)."""
        for kept in kinds or (self._persistent, self._memory_kept):
            for entry in list(kept.values()):
                entry.release()

    def pieces(self, dest: int, nbytes: int) -> list[tuple[int, int]]:
        """Where a message of ``nbytes`` made ready for ``dest`` is cut (Persistent): at every
        _PIECE_BYTES where MPICH would move it to this rank of its host by single copy, up to
        _MOST_PIECES; none (``[]``: one message) elsewhere.

        >>> transport.pieces(1, 8456), transport.pieces(1, 4360)   # rank 1 on this host, MPICH  # doctest: +SKIP
        ([(0, 7936), (7936, 8456)], [])
        """
        if dest not in self._cuts or not _SINGLE_COPY_FROM <= nbytes <= _MOST_PIECES * _PIECE_BYTES:
            return []
        return [(start, min(start + _PIECE_BYTES, nbytes)) for start in range(0, nbytes, _PIECE_BYTES)]

    def allgather_bytes(self, data: bytes, bound: Bound) -> list[bytes]:
        mine = np.frombuffer(data, np.uint8)
        every = np.empty((self.size, mine.size), np.uint8)
        for peer in self._remote:
            self.control.guard(peer, bound.seq)
        try:
            request = self.comm.Iallgather(mine, every)
        except MPI.Exception as e:
            raise TransportError(f"metadata exchange failed: {error_text(e)}") from e
        try:
            self._wait_all([request], [r for r in range(self.size) if r != self.rank] or [self.rank], bound)
        except BaseException:
            self._abandoned.append(([request], (mine, every)))   # a collective cannot be cancelled: kept
            raise
        return [row.tobytes() for row in every]

    def abandon(self) -> None:
        """After a failed or interrupted call: cancel whatever this rank still has posted, so that no
        late message lands in a buffer the caller owns again. Requests that cannot be cancelled are
        kept, with their buffers, until the process ends (freeing them in flight corrupts memory)."""
        self.p2p.abandon()
        inflight, self._inflight = self._inflight, []
        if inflight:
            self.give_up([request for (request, _), _, _ in inflight], [buf for _, buf, _ in inflight],
                          [request for (request, _), _, receive in inflight if receive])

    def give_up(self, requests: list[MPI.Request], buffers: Any, receives: list[MPI.Request]) -> None:
        """Cancel the ``receives`` among point-to-point ``requests`` that are still pending, and wait
        briefly (0.2 s in all) for all to end; if some do not, keep them all, with ``buffers``, for
        good. Sends are never cancelled: MPI 4 deprecates it, and MPICH crashed cancelling a send
        that a peer had begun to receive before it left (a rank ending with a call in flight)."""
        for request in receives:
            try:
                if request != MPI.REQUEST_NULL and not request.Test():
                    request.Cancel()
            except MPI.Exception:
                pass
        give_up = time.monotonic() + 0.2
        while time.monotonic() < give_up:
            try:
                if _testall(requests):
                    return
            except MPI.Exception:
                break
            time.sleep(1e-3)
        self._abandoned.append((requests, buffers))

    def close(self, failed: bool = False) -> None:
        """Free this transport's communicator, unless requests on it could not be ended. Control
        messages that arrived unread (the others' farewells) are read first: MPI (UCX) warns of
        messages still unmatched at MPI_Finalize."""
        try:
            self.control.read()
        except MPI.Exception:
            pass
        listening = self.control.stop_listening()
        self.abandon()
        if listening is not None:   # (cancelled, or kept with the abandoned, as any receive of this rank's)
            self.give_up([listening[0]], listening[1], [listening[0]])
        if not self._abandoned and not self.exits.kept:
            try:
                if listening is not None:
                    listening[0].Free()
            except MPI.Exception:
                pass
            self._free_persistent()
            try:
                self.comm.Free()
            except MPI.Exception:
                pass
        if self._owns_liveness:
            self.liveness.goodbye()
            self.liveness.close()

    def _wait_all(self, requests: list[MPI.Request], peers: Sequence[int], bound: Bound,
                  statuses: list | None = None) -> None:
        """Poll until ``requests`` are done, or ``bound`` passes (its deadline, or the runtime's stop);
        the first peer still pending is the one named on timeout (-1: any rank)."""
        if statuses is None and _KEEP_STATUSES:
            statuses = [MPI.Status() for _ in requests]
        try:
            for _ in range(self._quick_polls):   # a few microseconds, without the clock: the latency path
                if _each_done(requests) if statuses is None else _testall(requests, statuses):
                    bound.progressed()
                    return

            def waiting_for() -> int:
                pending = [p for r, p in zip(requests, peers) if not r.Test()]
                peer = (pending or peers)[0]
                return None if peer < 0 else self.names[peer]
            statuses = statuses or [MPI.Status() for _ in requests]   # (past the latency path they cost nothing
            # that shows, and a request MPICH completes with an error keeps it only there: see _failure_text)
            wait_for(lambda: _testall(requests, statuses), bound, self.control, self.spin_seconds, waiting_for)
            bound.progressed()
        except MPI.Exception as e:
            self._raise_failure(e, requests, peers, bound, statuses)

    def _raise_failure(self, error: MPI.Exception, requests: list[MPI.Request], peers: Sequence[int], bound: Bound,
                       statuses: list | None = None) -> None:
        """Raise what a wait's MPI ``error`` means: PeerLost where a peer died (MPI's own error about a
        dead peer says less), else a TransportError naming the cause."""
        self.control.check_dead(peers, bound.seq)
        raise TransportError(self._failure_text(error, requests, peers, statuses)) from error

    def _failure_text(self, error: MPI.Exception, requests: list[MPI.Request], peers: Sequence[int],
                      statuses: list | None = None) -> str:
        """What went wrong, in this runtime's words: MPI's "see the status" points at the request
        (or, where they were kept, the status) whose own error is the cause."""
        if error.Get_error_class() == MPI.ERR_IN_STATUS:
            for status, peer in zip(statuses or (), peers):
                code = status.Get_error()
                if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
                    return self._failure_text(MPI.Exception(code), requests, [peer])
            for request, peer in zip(requests, peers):
                try:
                    request.Test()
                except MPI.Exception as cause:
                    return self._failure_text(cause, [request], [peer])
        named = sorted({self.names[p] for p in peers})
        peer_text = f"rank {named[0]}" if len(named) == 1 else f"ranks {named}"
        if error.Get_error_class() == MPI.ERR_TRUNCATE:
            return (f"a message from {peer_text} was longer than this rank expected: the ranks disagree "
                    "about this call (its size, its algorithm or which collective it is; is the cross-rank "
                    "check off?)")
        return f"communication with {peer_text} failed: {error_text(error)}"


class Persistent:
    """One exchange made ready (``MPITransport.persistent``): MPI's persistent requests for the same two
    buffers and the same two peers, started again by every call that repeats it. The transport's
    ``exchange`` runs one it keeps; the express lane (``collectives.ops.express``), whose one-step
    exchange is always the same, holds one and runs it itself.

    A message that MPICH would move to a rank of its host by single copy, and that pieces move faster
    (8-24 KiB: ``MPITransport.pieces``), goes in pieces: its first under the exchange's tag, the others
    under their own, and byte PIECES_AT of its first says how many follow, _PIECES_MARK after it
    (``base.PIECES_AT``: bytes the message's owner leaves free, the count 0 between runs). A receiver
    from a rank of its host reads that byte of every message and receives exactly those pieces,
    whatever its own message was, so that none is left behind for a later call, even where the ranks
    disagree::

        rank 0, 8456 bytes                          rank 1, 8456 bytes
        bytes 257-263 = 1, "pieces"
        send [0, 7936) tag 7                 --->   receive [0, ...) tag 7: byte 257 says 1 more
        send [7936, 8456) tag 12             --->   receive [7936, 15872) tag 12

    >>> wire = transport.persistent(send, recv, 1, 1, reuse=key)      # doctest: +SKIP
    >>> wire.run(call)     # send to rank 1 while receiving from it, within the call's bound  # doctest: +SKIP
    """

    __slots__ = ("transport", "key", "requests", "peers", "buffers", "guarded", "quick_polls", "pieces", "plain",
                 "continued", "more", "waits_on", "framed", "home")

    def __init__(self, transport: MPITransport, key: tuple, peers: tuple[int, int], buffers: tuple,
                 framed: bool = True):
        self.transport, self.key, self.peers, self.framed = transport, key, peers, framed
        self.home = transport._persistent if framed else transport._memory_kept   # (where it is kept, when made)
        self.buffers = buffers   # (kept with the requests: their memory must outlive them)
        self.requests: list | None = None
        self.guarded = peers[1] in transport._remote   # (the hosts are known from the start)
        #: The quick polls that end most small exchanges (none where the statuses are kept: _wait_all's)
        self.quick_polls = range(0 if _KEEP_STATUSES else transport._quick_polls)
        self.pieces: list = []   # where this rank's message is cut ([]: one message; decided by make)
        #: One message each way and no guard: a holder may start and test its two requests itself
        self.plain = not self.guarded
        #: The partner may send its message in pieces (a rank of this host, under MPICH): see :meth:`rest`
        self.continued = framed and peers[0] in transport._may_cut
        self.more: list | None = None   # the receives of the pieces after the first (made at the first that come)
        self.waits_on = list(peers)

    def make(self) -> list:
        """Make the requests, and keep this exchange among its transport's of its kind (freeing every
        one of them first where there are already as many as it keeps: _MOST_READY, _MOST_MEMORY)."""
        transport, (send, recv), (source, dest) = self.transport, self.buffers, self.peers
        home = self.home
        if len(home) >= (_MOST_READY if self.framed else _MOST_MEMORY):
            transport._free_persistent((home,))
        comm = transport.comm
        self.pieces = transport.pieces(dest, len(send)) if self.framed else []
        receiving, sending = recv is not None, send is not None   # (both, but where not framed)
        if not self.framed:   # (their memory, not the objects: see MPITransport.persistent)
            send, recv = _memory(send), _memory(recv)
        self.plain = not self.guarded and not self.pieces and receiving and sending
        self.waits_on = [source] * receiving + [dest] * (max(1, len(self.pieces)) if sending else 0)   # (each
        try:                                                                                            # request's peer)
            sends = [comm.Send_init([send[start:end], MPI.BYTE], dest, _MORE_TAG if start else _TAG)
                     for start, end in self.pieces] or [comm.Send_init([send, MPI.BYTE], dest, _TAG)] * sending
            self.requests = [comm.Recv_init([recv, MPI.BYTE], source, _TAG)] * receiving + sends
        except MPI.Exception as e:
            named = " and ".join(str(transport.names[peer]) for peer in dict.fromkeys(self.waits_on))
            raise TransportError(f"exchange with rank(s) {named} failed: {error_text(e)}") from e
        home[self.key] = self
        return self.requests

    def run(self, bound: Bound) -> None:
        """Send and receive, blocking until both are done or ``bound`` passes (``MPITransport.exchange``)."""
        requests = self.requests
        if requests is None:   # (freed with the others when the transport kept too many)
            requests = self.make()
        if self.guarded:   # (a send to another host: see MPITransport.sending_to)
            self.transport.control.guard(self.peers[1], bound.seq)
        try:
            if self.pieces:
                self._run_in_pieces(bound)
                return
            if not self.plain:   # (one way, or a send guarded above)
                self._run_each(bound)
                return
            receiving, sending = requests   # (started and tested one by one: a third less time than
            receiving.Start()               # Startall and Testall, which convert the list every call)
            sending.Start()
            for _ in self.quick_polls:   # (_wait_all's, inline: a small exchange mostly ends in them)
                if receiving.Test() and sending.Test():   # (a done persistent request tests true)
                    bound.progressed()
                    break
            else:
                self.wait(bound)
            if self.continued and self.buffers[1][PIECES_AT]:
                self.rest(bound)
        except BaseException as e:
            self.failed(e, bound)

    def _run_each(self, bound: Bound) -> None:
        """:meth:`run`'s messages where they are not one each way unguarded (one way, or a send to
        another host): each started, then waited for together (the quick polls first: ``_wait_all``)."""
        for request in self.requests:
            request.Start()
        self.wait(bound)
        if self.continued and self.buffers[1][PIECES_AT]:
            self.rest(bound)

    def _run_in_pieces(self, bound: Bound) -> None:
        """:meth:`run`'s messages where this rank's goes in pieces, how many follow the first said in
        it: the partner's first piece waited for before this rank's others, whose receives the
        partner may post only once it has this rank's first (MPICH hands over a piece near its eager
        limit only to a posted receive)."""
        send, requests, waits_on = self.buffers[0], self.requests, self.waits_on
        send[PIECES_AT:PIECES_AT + PIECES_BYTES] = bytes([len(self.pieces) - 1]) + _PIECES_MARK
        try:
            for request in requests:
                request.Start()
            receiving = requests[0]
            for _ in self.quick_polls:   # (_wait_all's, inline, as run's)
                if receiving.Test():
                    break
            else:
                self.transport._wait_all(requests[:1], waits_on[:1], bound)
            if self.continued and self.buffers[1][PIECES_AT]:
                self.rest(bound)
            for _ in self.quick_polls:
                if _each_done(requests):
                    bound.progressed()
                    return
            self.wait(bound)
        finally:
            send[PIECES_AT:PIECES_AT + PIECES_BYTES] = bytes(PIECES_BYTES)   # (the buffer's other messages go whole)

    #: Its requests are MPI's persistent ones, which a holder may start and test itself where the
    #: exchange is ``plain``, as :meth:`run` does (``collectives.ops.fused``), handing a longer wait to
    #: :meth:`wait`, the partner's pieces to :meth:`rest` and an error to :meth:`failed`.
    holds_requests = True

    def wait(self, bound: Bound) -> None:
        """Wait for its started requests, after the quick polls, until done or ``bound`` passes."""
        self.transport._wait_all(self.requests, self.waits_on, bound)

    def rest(self, bound: Bound) -> None:
        """Once the partner's first piece is in: receive the pieces it said follow (byte PIECES_AT), into
        their places in the receive buffer. A count no sender makes, or without the mark, is not
        from a message of these (the ranks disagree, with the check off): nothing is received for it."""
        recv = self.buffers[1]
        count = recv[PIECES_AT]
        if count >= _MOST_PIECES or bytes(recv[PIECES_AT + 1:PIECES_AT + PIECES_BYTES]) != _PIECES_MARK:
            return
        more = self.more
        if more is None:
            source, comm = self.peers[0], self.transport.comm
            more = self.more = [comm.Recv_init([recv[i * _PIECE_BYTES:(i + 1) * _PIECE_BYTES], MPI.BYTE], source,
                                               _MORE_TAG) for i in range(1, _MOST_PIECES)]
        started = more[:count]
        for request in started:
            request.Start()
        for _ in self.quick_polls:
            if _each_done(started):
                return
        self.transport._wait_all(started, self.waits_on[:1] * count, bound)

    def failed(self, error: BaseException, bound: Bound) -> NoReturn:
        """Raise what ``error``, which ended a run of this exchange, means (MPI's own error: the
        transport's words for it), never starting these requests again."""
        requests = self.requests
        self._forget()
        if isinstance(error, MPI.Exception):
            self.transport._raise_failure(error, requests, self.waits_on, bound)
        raise error

    def _forget(self) -> None:
        """After a failure, or an interruption with the messages in flight: never start these requests
        again (started and unfinished ones must be cancelled or kept, never freed in flight)."""
        transport, requests, more = self.transport, self.requests, self.more or []
        self.home.pop(self.key, None)
        self.requests, self.more = None, None
        receives = requests[:1] if self.peers[0] is not None else []
        transport.give_up(requests + more, self.buffers, receives + more)

    def run_on(self, bound: Bound, send: Any, recv: Any) -> None:
        """:meth:`run` of an exchange made ready for the caller's own buffers (``framed=False``), given
        those that lie at its memory now (the same addresses, not necessarily the same objects), held
        while the messages move: a run that fails keeps them with what MPI could not end."""
        self.buffers = send, recv
        try:
            self.run(bound)
        finally:
            self.buffers = _NO_BUFFERS

    def release(self) -> None:
        """Free its requests, which are not in flight (its runs have ended), and drop it from the
        transport's: its buffers are no longer held. A run after it makes them again."""
        for request in (self.requests or []) + (self.more or []):
            request.Free()
        self.requests, self.more = None, None
        self.home.pop(self.key, None)
