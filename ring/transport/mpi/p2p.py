"""Point-to-point messages over an MPI transport: every message says what it holds.

A message opens with a 32-byte header (the byte count, the element count and the dtype), so
that the receiver knows what comes before it writes a byte of it. Up to INLINE_BYTES the bytes
ride in the header's own message and are copied into the buffer once the header fits it (one
MPI message, as the latency path wants). Larger ones are two MPI messages to the same rank,
the header, then the bytes, each with its own tag range::

    sender (rank 0)                                receiver (rank 1)
    isend(x: 4 float64, tag 3)                     irecv(y: 8 float64, source=0, tag 3)
      header  [32 B, 4, "<f8"]  --tag HEADER+3-->    header arrives: 32 B of float64, y holds 64 B
      payload [32 B]            --tag PAYLOAD+3->    not received into y: refused, naming both

A receive posts its header's receive at once; once the header is in, it checks the message
against its buffer and only then posts the payload's receive, from the rank the header came
from (so a receive from any rank takes header and payload from the same one). Headers from
one rank are matched in the order they were sent, and their payloads' receives are posted in
that same order (all the headers that are in are taken in posting order), so each payload
meets its own receive. A message that does not fit is still received, into scratch memory
that is kept, so its sender's send completes; the receiver raises. The tag ranges need
MPI_TAG_UB >= PAYLOAD_TAG + base.MAX_P2P_TAG (MPICH: 2**29 - 1; Open MPI: 2**31 - 1).

A message to the rank itself moves its header through MPI like any other (so it takes its place
among receives from any rank) and its bytes by one local copy, into the receive's buffer.

Where the communicator spans hosts over MPICH's UCX network module, a header's receive is not
posted to MPI: each poll matches the receives still without a header, in posting order, to the
messages that have come (a matched probe, then the receive of just that message), which is how MPI
itself matches messages to posted receives. MPICH 5.0.2 over UCX with shared memory (ranks on this
host and on others) loses the matches of a receive from any rank posted to it: once one such
receive took a message from another host, later ones never matched another host's messages (a
receiving rank on 2 x 2 emulated hosts heard one of 50 from each rank of the other host; parameter
servers waited until their timeout). Over libfabric's tcp it is the other way round: posted
receives match every message, and probes missed some of a flood of waiting ones (20 of 30 from a
rank, with three tags' messages queued), so receives are posted there, as on one host.

Waits never block inside MPI and never wait for the runtime's collectives: a program thread
waiting here polls beside the progress engine's thread running a collective on the same
communicator (distinct tags; MPI_THREAD_MULTIPLE). Each wait has its own deadline.
"""
from __future__ import annotations

import os
import re
import struct
import threading
from collections import deque
from typing import Any

import numpy as np
from mpi4py import MPI

from ring.transport.base import Bound, TransportError
from ring.transport.mpi.errors import error_text
from ring.transport.mpi.waiting import wait_for

HEADER_TAG = 64                 # headers use tags HEADER_TAG + tag: never the ring's nor the control channel's
PAYLOAD_TAG = HEADER_TAG + (1 << 15)   # payloads use PAYLOAD_TAG + tag
_HEADER_BYTES = 32
_DTYPE_BYTES = 16
_HEADER = struct.Struct(f"<qq{_DTYPE_BYTES}s")   # byte count, element count, dtype.str (zero-padded)
INLINE_BYTES = 16 << 10         # messages up to this size travel inside their header's message
_QUICK_POLLS = 32               # polls before the first look at the clock (as ring.transport.mpi.transport)


def netmod(environment=os.environ) -> str:
    """The network module MPICH carries messages between hosts with: the one chosen
    (``MPIR_CVAR_CH4_NETMOD``), else the first its build lists ("MPICH Device: ch4:ucx ofi"); "" under
    another MPI."""
    version = MPI.Get_library_version()
    if "MPICH" not in version:
        return ""
    chosen = environment.get("MPIR_CVAR_CH4_NETMOD") or environment.get("MPICH_CH4_NETMOD")
    if chosen:
        return chosen.lower()
    listed = re.search(r"MPICH Device:\s*ch4:(\w+)", version)
    return listed.group(1) if listed else ""


def header(buf: np.ndarray) -> bytes:
    """The header that announces ``buf``: byte count, element count, dtype (numpy's ``dtype.str``).

    >>> describe(header(np.zeros(4)))
    (32, '4 float64')
    """
    return _HEADER.pack(buf.nbytes, buf.size, buf.dtype.str.encode()[:_DTYPE_BYTES])


def describe(message: bytes) -> tuple[int, str]:
    """A header's byte count, and what it holds in words ("4 float64")."""
    nbytes, count, code = _HEADER.unpack(message)
    code = code.rstrip(b"\0").decode(errors="replace")
    try:
        name = np.dtype(code).name
    except TypeError:
        name = code
    return nbytes, f"{count} {name}"


class Posted:
    """One posted send or receive: its MPI requests, and for a receive its header and the source."""

    __slots__ = ("receive", "buf", "peer", "tag", "header", "requests", "source", "problem", "payload")

    def __init__(self, receive: bool, buf: np.ndarray, peer: int | None, tag: int):
        self.receive, self.buf, self.peer, self.tag = receive, buf, peer, tag
        if receive:
            self.header: Any = np.empty(_HEADER_BYTES + INLINE_BYTES, np.uint8)
        elif 0 < buf.nbytes <= INLINE_BYTES:
            self.header = header(buf) + buf.tobytes()
        else:
            self.header = header(buf)
        self.requests: list[MPI.Request] = []
        self.source = peer if peer is not None else -1
        self.problem = ""          # why the message does not fit the buffer ("" while none is known)
        self.payload = not receive   # a receive posts its payload's receive once the header is in

    def done(self) -> bool:
        return self.payload and MPI.Request.Testall(self.requests)


class _Needed:
    """The ranks a point-to-point wait still needs, as its messages stand at each look at the peers
    (``Control.check_peers`` asks ``rank in``): the peer of each message not done yet (a receive from
    any rank whose header came: the rank it came from). While a receive from any rank waits for a
    header, also a rank that left for a reason (an error: the message awaited may have been its), and
    every rank once none other is left to send one. A rank that ended its program after its part is
    not needed: a parameter server's receive from any worker waits on for the others; nor is one whose
    farewell said it sent this rank messages that have not all been received (``Control.sent``).

    >>> class Control: departed, dead, sent = {1: (False, 3, "")}, set(), {}   # rank 1 ended its program
    >>> waiting = Posted(True, np.empty(4), None, 0)                         # a receive from any rank
    >>> 1 in _Needed([waiting], Control, {}, 0, 3), 1 in _Needed([waiting], Control, {}, 0, 2)
    (False, True)
    >>> Control.sent = {1: 5}            # its farewell: 5 messages sent this rank in all, 4 received so far
    >>> 1 in _Needed([waiting], Control, {1: 4}, 0, 2)
    False
    """

    __slots__ = ("posted", "control", "received", "others")

    def __init__(self, posted: list[Posted], control, received: dict[int, int], rank: int, size: int):
        self.posted, self.control, self.received = posted, control, received
        self.others = frozenset(range(size)) - {rank}

    def __contains__(self, rank: int) -> bool:
        control = self.control
        pending = [p for p in self.posted if not p.done()]
        if self._on_its_way(rank, pending):   # (the wait's own bound holds)
            return False
        peers = [p.source if p.source >= 0 else p.peer for p in pending]
        if rank in peers:
            return True
        if None not in peers:
            return False
        failed, _, why = control.departed.get(rank, (False, 0, ""))
        left = {r for r in control.departed if not self._on_its_way(r, pending)}
        return failed or bool(why) or self.others <= left | control.dead

    def _on_its_way(self, rank: int, pending: list[Posted]) -> bool:
        """Whether messages that ``rank``'s farewell said it sent this one are still to be received: fewer
        of their headers were taken than it sent, or a receive holds one's header and waits for its bytes."""
        sent = self.control.sent.get(rank, 0)
        return sent > 0 and (sent > self.received.get(rank, 0)
                             or any(p.receive and p.payload and p.source == rank for p in pending))


class PointToPoint:
    """The point-to-point messages of one MPI transport (``transport``: its comm, names, peers)."""

    def __init__(self, transport):
        self.transport = transport
        self._lock = threading.Lock()        # program threads may post and wait at once
        self._unread: list[Posted] = []      # receives whose header is not in yet, in posting order
        self._posted: list[Posted] = []      # everything posted and not yet waited for (see abandon)
        self._kept: list = []                # messages received into scratch, and abandoned requests
        self._stopped = False                # abandoned after a failure: waits end at once
        self._status = MPI.Status()
        self._outbox: dict[int, deque[Posted]] = {}   # sends to this rank itself, by tag, in posting order
        self.sent_to: dict[int, int] = {}        # rank -> messages posted to it, in all
        self.received_from: dict[int, int] = {}  # rank -> messages from it whose header a receive took, in all
        #: Across hosts over MPICH's UCX, receives whose header no message has matched yet, in posting
        #: order (see the module docstring); None where headers' receives are posted to MPI.
        self._unmatched: list[Posted] | None = [] if transport.control.remote and netmod() == "ucx" else None

    def post(self, buf: np.ndarray, peer: int | None, tag: int, receive: bool) -> Posted:
        """Post a send of ``buf`` to ``peer``, or a receive into it from ``peer`` (None: any rank)."""
        comm, posted = self.transport.comm, Posted(receive, buf, peer, tag)
        try:
            with self._lock:
                if receive and self._unmatched is not None:
                    self._unmatched.append(posted)
                elif receive:
                    source = MPI.ANY_SOURCE if peer is None else peer
                    posted.requests.append(comm.Irecv([posted.header, MPI.BYTE], source, HEADER_TAG + tag))
                    self._unread.append(posted)
                else:
                    self.transport.sending_to(peer, None)
                    posted.requests.append(comm.Isend([posted.header, MPI.BYTE], peer, HEADER_TAG + tag))
                    if buf.nbytes <= INLINE_BYTES:
                        pass   # (the bytes are in the header's message)
                    elif peer == self.transport.rank:   # to itself: copied by the receive
                        posted.payload = False
                        self._outbox.setdefault(tag, deque()).append(posted)
                    elif buf.nbytes:
                        posted.requests.append(comm.Isend([buf, MPI.BYTE], peer, PAYLOAD_TAG + tag))
                    if peer != self.transport.rank:
                        self.sent_to[peer] = self.sent_to.get(peer, 0) + 1
                self._posted.append(posted)
        except MPI.Exception as e:
            name = "any" if peer is None else self.transport.names[peer]
            raise TransportError(f"{'receive from' if receive else 'send to'} rank {name} failed: "
                                 f"{error_text(e)}") from e
        return posted

    def wait(self, posted: list[Posted], bound: Bound) -> list[int]:
        """Wait for ``posted`` until ``bound`` passes; return each one's peer (for a receive from
        any rank: the rank it came from). Raises TransportError if a message does not fit its
        buffer, PeerLost if a rank they expect leaves, TransportTimeout once the bound passes (Stopped:
        the runtime stopped meanwhile)."""
        peers = [p.peer for p in posted]
        transport, control = self.transport, self.transport.control
        try:
            for _ in range(_QUICK_POLLS):   # a few microseconds, without the clock: the latency path
                if self._done(posted):
                    return self._finished(posted)
            expecting = _Needed(posted, control, self.received_from, transport.rank, transport.size)

            def waiting_for() -> int | None:
                pending = [p for p in posted if not p.done()]
                peer = pending[0].peer if pending else peers[0]
                return None if peer is None else transport.names[peer]
            wait_for(lambda: self._done(posted), bound, control, transport.spin_seconds, waiting_for, expecting)
        except MPI.Exception as e:
            control.check_dead([-1 if p is None else p for p in peers], None)
            raise TransportError(f"point-to-point with {_ranks(transport, peers)} failed: "
                                 f"{error_text(_cause(e, posted))}") from e
        return self._finished(posted)

    def sent(self) -> dict[int, int]:
        """How many messages this rank sent each other rank, in all (at exit, its farewell tells them:
        their waits go on until as many have been received; a send MPI has finished may still be on its
        way, behind larger ones across a slow link)."""
        with self._lock:
            return dict(self.sent_to)

    def _done(self, posted: list[Posted]) -> bool:
        """One poll: take the headers that are in; whether every one of ``posted`` is done (raises
        TransportError for a message that does not fit, or once the runtime has stopped)."""
        if self._stopped:
            raise TransportError("the runtime stopped while this rank waited")
        if self._unmatched:
            self._match_headers()
        if self._unread:
            self._read_headers()
        for p in posted:
            if p.problem:
                raise TransportError(p.problem)
            if not p.done():
                return False
        return True

    def _finished(self, posted: list[Posted]) -> list[int]:
        with self._lock:
            done = set(map(id, posted))
            self._posted = [p for p in self._posted if id(p) not in done]
        return [p.source for p in posted]

    def _match_headers(self) -> None:
        """Across hosts over UCX: receive each header that has come into the first receive still
        without one that it matches (in posting order, as MPI matches a message to posted receives:
        one that came between the probes for two receives goes to the earlier one, if it matches both)."""
        with self._lock:
            comm, status, unmatched = self.transport.comm, self._status, self._unmatched
            k = 0
            while k < len(unmatched):
                p = unmatched[k]
                message = comm.Improbe(MPI.ANY_SOURCE if p.peer is None else p.peer, HEADER_TAG + p.tag, status)
                if message is None:
                    k += 1
                    continue
                source = status.Get_source()
                k = next(i for i, q in enumerate(unmatched) if q.tag == p.tag and q.peer in (None, source))
                first = unmatched.pop(k)   # (p, or an earlier receive: then p probes again)
                first.requests.append(message.Irecv([first.header, MPI.BYTE]))
                self._unread.append(first)

    def _read_headers(self) -> None:
        """Take the headers that are in (all at once, then in posting order: see the module
        docstring) and post their payloads' receives, or receive a message that does not fit."""
        with self._lock:
            if not self._unread:
                return
            if len(self._unread) == 1:   # (the common case, without Testsome's lists)
                status = self._status
                if not self._unread[0].requests[0].Test(status):
                    return
                self._take(self._unread.pop(), status.Get_source(), status.Get_count(MPI.BYTE))
                return
            statuses = [MPI.Status() for _ in self._unread]
            headers = [p.requests[0] for p in self._unread]
            arrived = MPI.Request.Testsome(headers, statuses)
            if not arrived:
                return
            taken = set(arrived)
            for k, index in sorted(enumerate(arrived), key=lambda pair: pair[1]):
                self._take(self._unread[index], statuses[k].Get_source(), statuses[k].Get_count(MPI.BYTE))
            self._unread = [p for i, p in enumerate(self._unread) if i not in taken]

    def _take(self, p: Posted, source: int, received: int) -> None:
        """(Holding the lock) the header of ``p`` came from ``source`` (``received`` bytes with it):
        take its bytes into ``p.buf`` if they fit (from the header's message, or by receiving its
        payload), else nowhere (a payload into scratch, kept), noting why they did not fit."""
        p.source = source
        self.received_from[source] = self.received_from.get(source, 0) + 1
        head = p.header[:_HEADER_BYTES].tobytes()
        nbytes = _HEADER.unpack(head)[0]
        target: Any = p.buf
        if head != header(p.buf):   # (the same bytes, count and dtype)
            _, what = describe(head)
            mine = f"{p.buf.size} {p.buf.dtype.name}"
            names = self.transport.names
            p.problem = (f"the message from rank {names[source]} has {nbytes} bytes ({what}), the buffer "
                         f"{p.buf.nbytes} bytes ({mine}); nothing was written into it")
            target = np.empty(nbytes, np.uint8)
        if received > _HEADER_BYTES:   # the bytes came inline
            if not p.problem:
                p.buf.reshape(-1).view(np.uint8)[:] = p.header[_HEADER_BYTES:received]
        elif nbytes and source == self.transport.rank:
            self._copy_from_self(p, target)
        elif nbytes:
            request = self.transport.comm.Irecv([target, MPI.BYTE], source, PAYLOAD_TAG + p.tag)
            if p.problem:
                self._kept.append((request, target))   # completes when it comes; never waited for
            else:
                p.requests.append(request)
        p.payload = True

    def _copy_from_self(self, p: Posted, target: np.ndarray) -> None:
        """(Holding the lock) a message this rank sent itself: copy it from the sender's buffer, the
        next one sent with this tag (headers from one rank arrive in the order sent), and complete
        the send. MPI's own path for it, a large message through the library to itself, was seen to
        stall for seconds when ranks outnumber cores."""
        sender = self._outbox[p.tag].popleft()
        target.reshape(-1).view(np.uint8)[:] = sender.buf.reshape(-1).view(np.uint8)
        sender.payload = True

    def abandon(self) -> None:
        """After a failure: cancel the receives still posted (no late message lands in a buffer the
        program owns again); keep what cannot be cancelled, with its buffers, for good."""
        with self._lock:
            posted, self._posted, self._unread = self._posted, [], []
            if self._unmatched is not None:
                self._unmatched = []
            self._outbox.clear()
            self._stopped = True
        receives = [r for p in posted if p.receive for r in p.requests]
        requests = [r for p in posted for r in p.requests]
        if requests:
            self.transport.give_up(requests, [p.buf for p in posted], receives)


def _cause(error: MPI.Exception, posted: list[Posted]) -> MPI.Exception:
    """MPI's "see the status" error of a call over several requests: the failing request's own."""
    if error.Get_error_class() == MPI.ERR_IN_STATUS:
        for request in (r for p in posted for r in p.requests):
            try:
                request.Test()
            except MPI.Exception as cause:
                return cause
    return error


def _ranks(transport, peers: list[int | None]) -> str:
    named = sorted({"any" if p is None else str(transport.names[p]) for p in peers})
    return f"rank {named[0]}" if len(named) == 1 else f"ranks {', '.join(named)}"
