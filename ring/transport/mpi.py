"""Point-to-point over MPI (mpi4py), on host memory, raw bytes, no pickling.

Never blocks inside MPI: every wait polls its requests (as MPI's own Wait does)
until they complete, the deadline passes (TransportTimeout), or a peer is known
to be gone (PeerLost). So a rank stuck on a peer that never comes always gets
control back. How a peer is known to be gone, checked every CHECK_INTERVAL
seconds while a wait lasts:

* its farewell arrived: every rank that leaves (its program ended, raised, or
  was interrupted) tells every other rank how many collectives it completed and
  why it left (``farewell``), over a control channel of this communicator;
* its process on this host has ended without one (killed), or, on another host,
  its connection in ``ring.transport.liveness`` closed without a goodbye (killed)
  or went silent (its host unreachable).

The same channel answers the roll call that names, after a timeout, which ranks
are in which call. A long wait backs off from spinning to yielding to short
sleeps, so a rank stuck for minutes does not burn its core.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ring.schedule import left, right
from ring.transport import liveness as liveness_watch
from ring.transport.base import CommunicatorsExhausted, PeerLost, TransportError, TransportTimeout
from ring.transport.mpi_p2p import PointToPoint

_TAG = 7
_CONTROL_TAG = 8
_EXIT_TAG = 9    # what a rank hands rank 0 at exit, after the farewells (the timeline's events)
_HELLO_TAG = 10  # the setup's empty messages across hosts (see _connect_across_hosts)
CHECK_INTERVAL = 0.5       # seconds between looks at the control channel and the local peers' processes
_SPIN_SECONDS = 50e-6      # poll flat out this long (latency), then yield the core between polls
_YIELD_SECONDS = 20e-3     # then yield between polls until the wait is this old, then nap
_NAP_SHARE = 0.01          # a nap is this share of the time waited so far (so it adds at most 1%) ...
_MAX_NAP = 10e-3           # ... and never longer than this
_QUICK_POLLS = 32          # polls before the first look at the clock (about 5 us)
_testall = MPI.Request.Testall
_startall = MPI.Prequest.Startall

# Control messages: kind, a flag, then a number, then text. LEFT: "I left after completing <number>
# collectives, because <text>" (flag: after a failure of the runtime, so probably not the cause);
# ASK: "which call are you in? (I am in <number>)"; HERE: "in <number>".
_CONTROL_BYTES = 512
_LEFT, _ASK, _HERE = 1, 2, 3
_FAILED, _ROOT, _NOT_FINALIZING = 1, 2, 4   # a farewell's flags
_FAREWELL_GRACE = 0.05   # seconds a rank that finds peers dead waits for their farewells, if any
_DEATH_GRACE = 0.5       # seconds a rank whose MPI call failed looks for a peer that died
_SETUP_RECORD_BYTES = 1024
_COLLECTIVE = object()   # (check_peers: a collective is waiting, not a point-to-point call)


class MPITransport:
    """The ring's neighbours on an MPI communicator (use a private duplicate, never the user's).

    Made by :func:`connect`, which also learns where every rank runs, or by :meth:`split`
    for a subset of the ranks. ``names``: how messages name each rank of ``comm`` (the
    world's ranks, for a subset; default: its own ranks). ``watch``: another transport over
    the same ranks or more, whose control channel tells this one of departures (a transport
    used only inside the calls of another, such as the two levels of a hierarchical all-reduce).
    ``liveness``: the watch over the ranks on other hosts (by ``names``), shared by every
    transport made from the first by ``split``; the first closes it.
    """

    def __init__(self, comm: MPI.Comm, hosts: Sequence[str], pids: Sequence[int],
                 names: Sequence[int] | None = None, watch: "MPITransport | None" = None,
                 liveness: liveness_watch.Liveness | None = None, owns_liveness: bool = False):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.hosts, self.pids = list(hosts), list(pids)
        self.names = list(names) if names is not None else list(range(self.size))
        self.watch = watch
        self.liveness, self._owns_liveness = liveness, owns_liveness
        self.deadline = float("inf")
        self.seq = 0   # the call under way (set by the caller with the deadline); peers are judged against it
        self._right = right(self.rank, self.size)
        self._left = left(self.rank, self.size)
        local = [r for r in range(self.size) if hosts[r] == hosts[self.rank]]
        self.local_rank = local.index(self.rank)   # this rank's place among the ranks on its host
        self.local_size = len(local)
        self.spans_hosts = len(local) < self.size   # (the runtime's segments are smaller across hosts)
        self._local_pids = {r: pids[r] for r in local if r != self.rank}
        # More ranks than cores on this host: the peer we wait for may need our core, so give it
        # up at every poll instead of spinning first (MPI libraries do the same when oversubscribed).
        oversubscribed = self.local_size > usable_cores()
        self._spin_seconds = 0.0 if oversubscribed else _SPIN_SECONDS
        # In the background (another thread of this process computes meanwhile): never spin or
        # yield, nap from the first poll on, so the computing thread keeps its core.
        self.background = False
        self._quick_polls = 1 if oversubscribed else _QUICK_POLLS
        self._persistent: dict = {}
        self._inflight: list = []      # (request, peer) posted and not yet waited for, with its buffer
        self._abandoned: list = []     # requests that could not be cancelled, kept with their buffers for good
        self.departed: dict[int, tuple[bool, int, str]] = {}   # rank -> (after a failure?, completed, why)
        self.roots: set[int] = set()        # ranks whose farewell passes on a root cause (see PeerLost)
        self.dead: set[int] = set()         # ranks known dead: never sent anything again
        self.dead_names: dict[int, int] = {}   # rank -> the rank its farewell said died (as names gives it)
        self.unfinalized: set[int] = set()  # ranks whose farewell said they will not call MPI_Finalize
        # Control messages are probed for at each check (twice a second, in long waits only), never
        # awaited by a receive from any source kept posted, which MPICH would match against every
        # message of every call: nothing on the hot path.
        self._control_in = np.zeros(_CONTROL_BYTES, np.uint8)
        self._control_status = MPI.Status()
        self._control_out: list = []   # control messages sent and not yet known complete, with their buffers
        self._heard: dict[int, int] = {}   # roll call: rank -> the call it said it is in
        # A point-to-point wait in the program's thread may poll beside a collective in the
        # engine's: one of them at a time reads the control channel (a probe and its receive).
        self._control_lock = threading.Lock()
        self.p2p = PointToPoint(self)

    def send_to_right(self, buf: Any) -> tuple[MPI.Request, int]:
        try:
            request = self.comm.Isend([buf, MPI.BYTE], self._right, _TAG)
        except MPI.Exception as e:
            raise TransportError(f"send to rank {self.names[self._right]} failed: {_error_text(e)}") from e
        return self._posted(request, self._right, buf, receive=False)

    def recv_from_left(self, buf: Any) -> tuple[MPI.Request, int]:
        try:
            request = self.comm.Irecv([buf, MPI.BYTE], self._left, _TAG)
        except MPI.Exception as e:
            raise TransportError(f"receive from rank {self.names[self._left]} failed: {_error_text(e)}") from e
        return self._posted(request, self._left, buf, receive=True)

    def _posted(self, request: MPI.Request, peer: int, buf: Any, receive: bool) -> tuple[MPI.Request, int]:
        """Remember a posted request until it is waited for (see ``abandon``)."""
        posted = (request, peer)
        self._inflight.append((posted, buf, receive))
        return posted

    def wait(self, request: tuple[MPI.Request, int] | None) -> None:
        if request is None:
            return
        self._wait_all([request[0]], [request[1]])
        for i, (posted, _, _) in enumerate(self._inflight):   # at most a few entries
            if posted is request:
                del self._inflight[i]
                break

    def exchange(self, send: Any | None, recv: Any | None, dest: int | None = None,
                 source: int | None = None, reuse: bool = False) -> None:
        source = self._left if source is None else source
        dest = self._right if dest is None else dest
        if reuse and send is not None and recv is not None:
            self._exchange_again(send, recv, dest, source)
            return
        requests, peers = [], []
        try:
            if recv is not None:
                requests.append(self.comm.Irecv([recv, MPI.BYTE], source, _TAG))
                peers.append(source)
            if send is not None:
                requests.append(self.comm.Isend([send, MPI.BYTE], dest, _TAG))
                peers.append(dest)
            self._wait_all(requests, peers)
        except MPI.Exception as e:
            raise TransportError(f"exchange with ranks {self.names[source]} and {self.names[dest]} failed: "
                                 f"{_error_text(e)}") from e
        except BaseException:
            self.give_up(requests, (send, recv), requests[:1] if recv is not None else [])
            raise

    def _exchange_again(self, send: Any, recv: Any, dest: int, source: int) -> None:
        """exchange() over persistent requests, made once per (buffers, peers): for the latency path,
        whose buffers are the same on every call (about 1 us less per exchange here)."""
        key = (id(send), id(recv), dest, source)
        entry = self._persistent.get(key)
        if entry is None:
            if len(self._persistent) >= 64:
                self._free_persistent()
            try:
                requests = [self.comm.Recv_init([recv, MPI.BYTE], source, _TAG),
                            self.comm.Send_init([send, MPI.BYTE], dest, _TAG)]
            except MPI.Exception as e:
                raise TransportError(f"exchange with ranks {self.names[source]} and {self.names[dest]} failed: "
                                     f"{_error_text(e)}") from e
            entry = self._persistent[key] = (requests, (source, dest), send, recv)   # buffers kept alive: ids stay unique
        requests = entry[0]
        try:
            _startall(requests)
            self._wait_all(requests, entry[1])
        except BaseException:
            # Started and unfinished persistent requests must be cancelled or kept, never freed in
            # flight; forget this entry so that it is not started again (its buffers stay with it).
            self._persistent.pop(key, None)
            self.give_up(requests, entry, requests[:1])
            raise

    def _free_persistent(self) -> None:
        for requests, *_ in self._persistent.values():
            for request in requests:
                request.Free()
        self._persistent.clear()

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        mine = np.frombuffer(data, np.uint8)
        every = np.empty((self.size, mine.size), np.uint8)
        try:
            request = self.comm.Iallgather(mine, every)
        except MPI.Exception as e:
            raise TransportError(f"metadata exchange failed: {_error_text(e)}") from e
        try:
            self._wait_all([request], [r for r in range(self.size) if r != self.rank] or [self.rank])
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

    def roll_call(self, grace: float) -> dict[int, int]:
        """After a timeout: ask every rank which call it is in; return ``{rank: call}`` for the ranks
        that answered within ``grace`` seconds (a rank answers while it waits inside a collective
        on this transport), ranks as ``names`` gives them."""
        self._heard = {}
        if self.liveness is not None:
            self.liveness.ping()
        for peer in range(self.size):
            if peer != self.rank:
                self._control(peer, _ASK, self.seq)
        give_up = time.monotonic() + grace
        while time.monotonic() < give_up and len(self._heard) + len(self.departed) < self.size - 1:
            self._read_control()
            time.sleep(5e-3)
        return {self.names[r]: seq for r, seq in self._heard.items()}

    def unreachable(self) -> list[int]:
        """After a roll call: the ranks (as ``names`` gives them) whose host did not acknowledge
        its ping (see ``ring.transport.liveness``); from then on they count as dead."""
        if self.liveness is None:
            return []
        self.liveness.silent()   # (counts those it finds in ``ended``)
        found = [peer for peer in range(self.size)
                 if self.liveness.ended.get(self.names[peer]) == liveness_watch.UNREACHABLE]
        self.dead.update(found)
        return [self.names[p] for p in found]

    def farewell(self, completed: int, why: str, failed: bool = False, root: bool = False,
                 finalizing: bool = True, dead: int | None = None, patience: float = 1.0) -> None:
        """Tell every other rank that this one is leaving, having completed ``completed``
        collectives, because ``why`` ("": its program ended), and whether it ``failed`` (then it is
        probably not the cause: waiting ranks name a rank that left of its own accord first),
        whether ``why`` is a ``root`` cause to pass on verbatim, and whether it is ``finalizing``.
        Waits at most ``patience`` seconds for the messages to leave (they are small: MPI sends
        them at once)."""
        flag = (_FAILED if failed else 0) | (_ROOT if root else 0) | (0 if finalizing else _NOT_FINALIZING)
        self._note_dead(dead)
        if self.liveness is not None:
            self.liveness.goodbye()
        for peer in range(self.size):
            if peer != self.rank:
                self._control(peer, _LEFT, completed, why, flag=flag, dead=dead)
        give_up = time.monotonic() + patience
        requests = [r for r, _ in self._control_out]
        while requests and not _testall(requests) and time.monotonic() < give_up:
            time.sleep(1e-3)

    def split(self, color: int | None, key: int, watched: bool = False) -> "MPITransport | None":
        """A transport over the ranks that pass the same ``color``, ordered by ``key`` then by rank
        (MPI's Comm_split); None for ``color=None``. Every rank of this transport must call it, and
        all must be known to be here (it blocks inside MPI: there is no nonblocking split), as they
        are after a collective's cross-rank check. ``watched``: the new transport learns of
        departures through this one's control channel (see the class docstring)."""
        try:
            comm = self.comm.Split(MPI.UNDEFINED if color is None else color, key)
        except MPI.Exception as e:
            text = _error_text(e)
            failure = CommunicatorsExhausted if "too many communicators" in text.lower() else TransportError
            raise failure(f"making a communicator for a subset of the ranks failed: {text}") from e
        if comm == MPI.COMM_NULL:
            return None
        inner, outer = comm.Get_group(), self.comm.Get_group()
        mine = MPI.Group.Translate_ranks(inner, list(range(comm.Get_size())), outer)
        inner.Free()
        outer.Free()
        return MPITransport(comm, [self.hosts[r] for r in mine], [self.pids[r] for r in mine],
                            [self.names[r] for r in mine], self if watched else None, self.liveness)

    def farewell_of(self, peer: int, deadline: float) -> str | None:
        """After this rank's own farewell: wait for ``peer``'s; return why it left ("": its program
        ended normally), or None if it died without one or the deadline passed."""
        while peer not in self.departed:
            self._read_control()
            if time.monotonic() >= deadline or peer in self.dead_peers():
                self._read_control()
                break
            time.sleep(1e-3)
        return self.departed[peer][2] if peer in self.departed else None

    def deliver_at_exit(self, data: bytes, deadline: float) -> bool:
        """At exit, after the farewells: hand ``data`` to rank 0 if it left normally (it then
        collects, see collect_at_exit); whether it was delivered by the deadline."""
        if self.farewell_of(0, deadline) != "":
            return False
        message = np.frombuffer(data, np.uint8)
        request = self.comm.Isend([message, MPI.BYTE], 0, _EXIT_TAG)
        while not request.Test():
            if time.monotonic() >= deadline:
                self._abandoned.append(([request], message))
                return False
            time.sleep(1e-3)
        return True

    def collect_at_exit(self, deadline: float) -> list[bytes | None]:
        """Rank 0 at exit, after the farewells: what every other rank that left normally handed it
        (deliver_at_exit), by rank; None for a rank that left after a failure, died, or was late."""
        found: list[bytes | None] = [None] * self.size
        status = MPI.Status()
        for peer in range(1, self.size):
            if self.farewell_of(peer, deadline) != "":
                continue
            while not self.comm.Iprobe(peer, _EXIT_TAG, status):
                if time.monotonic() >= deadline:
                    break
                time.sleep(1e-3)
            else:
                message = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                self.comm.Recv([message, MPI.BYTE], peer, _EXIT_TAG)
                found[peer] = message.tobytes()
        return found

    def close(self, failed: bool = False) -> None:
        """Free this transport's communicator, unless requests on it could not be ended. Control
        messages that arrived unread (the others' farewells) are read first: MPI (UCX) warns of
        messages still unmatched at MPI_Finalize."""
        try:
            self._read_control()
        except MPI.Exception:
            pass
        self.abandon()
        if not self._abandoned:
            self._free_persistent()
            try:
                self.comm.Free()
            except MPI.Exception:
                pass
        if self._owns_liveness:
            self.liveness.goodbye()
            self.liveness.close()

    def _control(self, peer: int, kind: int, number: int, text: str = "", flag: int = 0,
                 dead: int | None = None) -> None:
        if peer in self.dead or (self.liveness is not None and self.names[peer] in self.liveness.ended):
            return   # (over UCX, a message to a dead process crashed the sender)
        message = np.zeros(_CONTROL_BYTES, np.uint8)
        message[0] = kind
        message[1] = flag
        message[4:8] = np.frombuffer(np.int32(-1 if dead is None else dead).tobytes(), np.uint8)
        message[8:16] = np.frombuffer(np.int64(number).tobytes(), np.uint8)
        encoded = text.encode(errors="replace")[:_CONTROL_BYTES - 16]
        message[16:16 + len(encoded)] = np.frombuffer(encoded, np.uint8)
        try:
            self._control_out.append((self.comm.Isend(message, peer, _CONTROL_TAG), message))
        except MPI.Exception:
            pass   # a peer we cannot reach cannot be told either
        self._control_out = [(r, m) for r, m in self._control_out if not r.Test()]

    def _read_control(self) -> None:
        """Take every control message that has arrived: note farewells, answer roll calls."""
        if not self._control_lock.acquire(blocking=False):
            return   # another thread is reading them right now
        try:
            self._read_control_locked()
        finally:
            self._control_lock.release()

    def _read_control_locked(self) -> None:
        while self.comm.Iprobe(MPI.ANY_SOURCE, _CONTROL_TAG, self._control_status):
            peer = self._control_status.Get_source()
            self.comm.Recv(self._control_in, peer, _CONTROL_TAG)   # arrived already: returns at once
            kind, flag = int(self._control_in[0]), int(self._control_in[1])
            number = int(np.frombuffer(self._control_in[8:16].tobytes(), np.int64)[0])
            text = self._control_in[16:].tobytes().rstrip(b"\0").decode(errors="replace")
            if kind == _LEFT:
                self.departed[peer] = (bool(flag & _FAILED), number, text)
                if flag & _ROOT:
                    self.roots.add(peer)
                dead = int(np.frombuffer(self._control_in[4:8].tobytes(), np.int32)[0])
                if dead >= 0:
                    self.dead_names[peer] = dead
                    self._note_dead(dead)
                if flag & _NOT_FINALIZING:
                    self.unfinalized.add(peer)
            elif kind == _ASK:
                self._control(peer, _HERE, self.seq)
            elif kind == _HERE:
                self._heard[peer] = number

    def check_peers(self, expecting: Any = _COLLECTIVE) -> None:
        """Raise PeerLost if a rank this call needs is gone: it left before completing this call,
        or its process on this host ended without a word (and likewise for ``watch``). During a
        point-to-point wait (``expecting`` a set of ranks, or None for any rank; a collective's
        wait passes _COLLECTIVE), a departure of a rank it expects ends it, whatever that rank
        had completed."""
        if self.watch is not None:
            self.watch.check_peers(_COLLECTIVE)
        self._read_control()
        gone = [(failed, completed, peer, why) for peer, (failed, completed, why) in self.departed.items()
                if (completed < self.seq if expecting is _COLLECTIVE else expecting is None or peer in expecting)]
        if gone:
            _, completed, peer, why = min(gone)
            name = self.names[peer]
            if peer in self.roots:   # it failed because a rank died: name that one, as it was seen
                raise PeerLost(name, why, root=why)
            raise PeerLost(name, f"rank {name} left: {why} (after {completed} collective(s))" if why else
                           f"rank {name} ended its program after {completed} collective(s)")
        dead = self.dead_peers()
        if dead:
            time.sleep(_FAREWELL_GRACE)   # a rank that just left after seeing a death may have said so
            self._read_control()
            for peer in dead:
                if peer in self.roots:
                    why = self.departed[peer][2]
                    raise PeerLost(self.names[peer], why, root=why, dead=self.dead_names.get(peer))
            dead = [p for p in dead if p not in self.departed]
            if dead:
                self.dead.update(dead)
                message = self._death_text(dead)
                raise PeerLost(self.names[dead[0]], message, root=f"{message} (seen by rank {self.names[self.rank]})",
                               dead=self.names[dead[0]])

    def _death_text(self, dead: Sequence[int]) -> str:
        """What every rank should hear of the deaths of ``dead``, seen by this rank.

        >>> t = MPITransport.__new__(MPITransport)
        >>> t.names, t.pids, t.hosts = [0, 1, 2, 3], [10, 11, 12, 13], ["a", "a", "b", "b"]
        >>> t.liveness = None
        >>> t._death_text([3])
        "rank 3 is gone: its process (pid 13 on host b) ended without leaving the runtime (killed, or crashed outside Python's control)"
        >>> t._death_text([2, 3])
        "ranks 2, 3 are gone: their processes (pid 12 on host b, pid 13 on host b) ended without leaving the runtime (killed, or crashed outside Python's control)"
        """
        ended = self.liveness.ended if self.liveness is not None else {}
        silent = [p for p in dead if ended.get(self.names[p]) == liveness_watch.UNREACHABLE]
        gone = [p for p in dead if p not in silent]
        parts = []
        if gone:
            names = ", ".join(str(self.names[p]) for p in gone)
            pids = ", ".join(f"pid {self.pids[p]} on host {self.hosts[p]}" for p in gone)
            parts.append((f"rank {names} is gone: its process ({pids})" if len(gone) == 1 else
                          f"ranks {names} are gone: their processes ({pids})") +
                         " ended without leaving the runtime (killed, or crashed outside Python's control)")
        if silent:
            names = ", ".join(str(self.names[p]) for p in silent)
            hosts = ", ".join(dict.fromkeys(self.hosts[p] for p in silent))
            parts.append(f"rank{'s' if len(silent) > 1 else ''} {names} {'are' if len(silent) > 1 else 'is'} "
                         f"unreachable: host {hosts} does not answer (its link or the host is down)")
        return "; ".join(parts)

    def _note_dead(self, name: int | None) -> None:
        """Remember that the rank ``names`` calls ``name`` died (if it is one of this transport's)."""
        if name is not None and name in self.names:
            self.dead.add(self.names.index(name))

    def dead_peers(self) -> list[int]:
        """The ranks that ended without a farewell: on this host, their process has ended (killed);
        on another, their connection closed without a goodbye, or their host went silent."""
        ended = self.liveness.check() if self.liveness is not None else {}
        return [peer for peer in range(self.size) if peer != self.rank and peer not in self.departed and
                (_process_state(self._local_pids[peer]) is not None if peer in self._local_pids
                 else self.names[peer] in ended)]

    def gone_at_exit(self) -> list[int]:
        """At exit: the ranks that will never call MPI_Finalize, as far as this rank knows (dead, or
        said so in their farewell), as ``names`` gives them."""
        self._read_control()
        return sorted(set(self.known_dead()) | {self.names[p] for p in self.unfinalized})

    def known_dead(self) -> list[int]:
        """The ranks known dead (ended without a farewell, here or as a farewell said), as ``names`` gives them."""
        return sorted(self.names[p] for p in set(self.dead_peers()) | self.dead)

    def await_farewells(self, seconds: float) -> None:
        """Wait up to ``seconds`` until every other rank has said farewell or is dead: a launcher may
        end the job as soon as one process ends after a death (MPICH's does), so that the ranks
        still reporting what they saw would be cut short."""
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up:
            self._read_control()
            dead = set(self.dead_peers())
            if all(p == self.rank or p in self.departed or p in dead for p in range(self.size)):
                return
            time.sleep(5e-3)

    def exit_barrier(self) -> list[int]:
        """At exit, before MPI_Finalize (which waits for every rank, for ever if one died): wait
        until every rank is at exit too; return [] then, or as soon as some rank is known never
        to finalize, those ranks (see gone_at_exit), so that this one can leave without it."""
        request = self.comm.Ibarrier()
        started = time.monotonic()
        while not request.Test():
            gone = self.gone_at_exit()
            if gone:
                self._abandoned.append(([request], None))
                return gone
            _pause(time.monotonic() - started, 0.0, background=True)
        return []

    def _wait_all(self, requests: list[MPI.Request], peers: Sequence[int], statuses: list | None = None) -> None:
        """Poll until ``requests`` are done; the first peer still pending is the one named on timeout
        (-1: any rank)."""
        try:
            for _ in range(self._quick_polls):   # a few microseconds, without the clock: the latency path
                if _testall(requests, statuses):
                    return
            started = time.monotonic()
            next_check, notices = started + CHECK_INTERVAL, _notices
            while not _testall(requests, statuses):
                now = time.monotonic()
                _pause(now - started, self._spin_seconds, self.background)
                if now >= next_check or notices != _notices:
                    notices = _notices
                    self.check_peers(_COLLECTIVE)
                    next_check = now + CHECK_INTERVAL
                if now >= self.deadline:
                    pending = [p for r, p in zip(requests, peers) if not r.Test()]
                    peer = (pending or peers)[0]
                    if peer < 0:
                        raise TransportTimeout(-1, now - started, "a message from any rank")
                    raise TransportTimeout(self.names[peer], now - started)
        except MPI.Exception as e:
            self.check_dead(peers)   # (MPI's own error about a dead peer says less than this)
            raise TransportError(self._failure_text(e, requests, peers, statuses)) from e

    check_interval = CHECK_INTERVAL

    def pause(self, waited: float) -> None:
        """Between two polls of a wait in the program's own thread (see _pause)."""
        _pause(waited, self._spin_seconds)

    def check_dead(self, peers: Sequence[int]) -> None:
        """After MPI reported an error: raise PeerLost if one of ``peers`` (-1: any) is gone. A peer
        killed a moment ago may have closed its connections before its process ended: look again
        for up to _DEATH_GRACE seconds before leaving the error to MPI's words."""
        expecting = {p for p in peers if p >= 0} if all(p >= 0 for p in peers) else None
        give_up = time.monotonic() + _DEATH_GRACE
        while True:
            try:
                self.check_peers(expecting)
            except MPI.Exception:
                pass
            if time.monotonic() >= give_up:
                return
            time.sleep(0.02)

    def notices(self) -> int:
        """How many failure notices the launcher has sent this process (see hear_failure_notices)."""
        return _notices

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
                    "about this call's size (is the cross-rank check off?)")
        return f"communication with {peer_text} failed: {_error_text(error)}"


_notices = 0   # failure notices heard from the launcher (see hear_failure_notices)


def hear_failure_notices() -> None:
    """MPICH's launcher, told not to clean up after a failure (``-disable-auto-cleanup``), tells the
    surviving processes that one died by SIGUSR1, whose default action ends them at once, silently,
    before they can say who died. Where the program has no handler of its own (and this is its
    main thread), count the notices instead: a wait looks at its peers at once after one."""
    if (threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1")
            and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL):
        signal.signal(signal.SIGUSR1, _count_notice)


def _count_notice(signum, frame) -> None:
    global _notices
    _notices += 1


def connect(timeout: float, record: bytes, comm: MPI.Comm | None = None) -> tuple[MPITransport, list[bytes]]:
    """Set up the runtime's private communicator, a duplicate of ``comm`` (default: every rank,
    MPI.COMM_WORLD), bounded by ``timeout`` seconds, and exchange ``record`` (at most 1 KiB: the
    settings, or a problem found on this rank).

    Returns the transport and every rank's record. Nothing here blocks inside MPI, so a rank
    that never comes makes the others raise TransportTimeout instead of waiting for ever.
    """
    if len(record) > _SETUP_RECORD_BYTES:
        raise ValueError(f"setup record of {len(record)} bytes; at most {_SETUP_RECORD_BYTES}")
    deadline = time.monotonic() + timeout
    comm, request = (comm or MPI.COMM_WORLD).Idup()   # a private duplicate: our messages never match the user's
    _wait_setup([request], deadline, "make the runtime's communicator", comm)
    liveness = liveness_watch.Liveness()
    host = socket.gethostname().encode()[:200]
    mine = np.zeros(16 + 256 + _SETUP_RECORD_BYTES, np.uint8)
    mine[:16] = np.frombuffer(np.array([os.getpid(), liveness.port], np.int64).tobytes(), np.uint8)
    mine[16:16 + len(host)] = np.frombuffer(host, np.uint8)
    mine[272:272 + len(record)] = np.frombuffer(record, np.uint8)
    every = np.empty((comm.Get_size(), mine.size), np.uint8)
    try:
        _wait_setup([comm.Iallgather(mine, every)], deadline, "exchange the settings", comm, mine, every)
    except TransportError:
        liveness.close()
        raise
    pids, ports = np.frombuffer(every[:, :16].tobytes(), np.int64).reshape(-1, 2).T.tolist()
    hosts = [row[16:272].tobytes().rstrip(b"\0").decode(errors="replace") for row in every]
    records = [row[272:].tobytes().rstrip(b"\0") for row in every]
    rank = comm.Get_rank()
    liveness.join(rank, hosts, ports)
    _connect_across_hosts(comm, rank, hosts, deadline)
    return MPITransport(comm, hosts, pids, liveness=liveness, owns_liveness=True), records


def _connect_across_hosts(comm: MPI.Comm, rank: int, hosts: Sequence[str], deadline: float) -> None:
    """Exchange an empty message with every rank on another host, so that MPI connects to each now,
    while all are alive: a first message to a rank whose host had since gone was seen to block
    inside MPI (libfabric's tcp connecting) for minutes, out of reach of every deadline."""
    others = [peer for peer in range(len(hosts)) if hosts[peer] != hosts[rank]]
    if not others:
        return
    empty = np.zeros(0, np.uint8)
    requests = [comm.Irecv([empty, MPI.BYTE], peer, _HELLO_TAG) for peer in others]
    requests += [comm.Isend([empty, MPI.BYTE], peer, _HELLO_TAG) for peer in others]
    _wait_setup(requests, deadline, "connect to the ranks on other hosts", empty)


def _pause(waited: float, spin_seconds: float, background: bool = False) -> None:
    """Between two polls of a wait that has lasted ``waited`` seconds: nothing while it is younger
    than ``spin_seconds`` (latency), then give up the core (more ranks than cores: the peer we wait
    for may need it), then, past _YIELD_SECONDS, nap for _NAP_SHARE of the time waited so far.
    ``background``: nap from the start (a thread of this process computes on the core)."""
    if background:
        time.sleep(min(waited * _NAP_SHARE, _MAX_NAP))
        return
    if waited < spin_seconds:
        return
    if waited < _YIELD_SECONDS:
        os.sched_yield()
    else:
        time.sleep(min(waited * _NAP_SHARE, _MAX_NAP))


_unfinished_setups: list = []   # requests of a setup that timed out, kept with their buffers for good


def _wait_setup(requests: list[MPI.Request], deadline: float, what: str, *buffers: Any) -> None:
    started = time.monotonic()
    while not _testall(requests):
        now = time.monotonic()
        if now >= deadline:
            # A nonblocking collective cannot be cancelled: keep it, and what it writes into, alive.
            _unfinished_setups.append((requests, buffers))
            raise TransportTimeout(-1, now - started, f"every rank to {what} (a rank has not called "
                                                      "into the runtime yet, or will not)")
        _pause(now - started, 0.0)


def _error_text(error: MPI.Exception) -> str:
    """MPI's error in one line: its class, and the innermost cause from the library's error stack
    (MPICH's strings carry a stack of function names, one per line, that means nothing to users).

    >>> _error_text(MPI.Exception(MPI.ERR_TRUNCATE))
    'Message truncated'
    """
    lines = [line.strip() for line in error.Get_error_string().strip().splitlines() if line.strip()]
    if not lines:
        return f"MPI error {error.Get_error_code()}"
    head = lines[0].split(", error stack:")[0].rstrip(",; ")
    cause = lines[-1].split("): ", 1)[-1].strip() if len(lines) > 1 else ""
    return f"{head} ({cause})" if cause and cause != head else head


MPITransport.error_text = staticmethod(_error_text)


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        return os.cpu_count() or 1


_HAVE_PROC = os.path.isdir("/proc/self")


def _process_state(pid: int) -> str | None:
    """None while ``pid`` runs; else how it ended. A zombie (dead, not yet reaped) counts as ended."""
    try:
        if not _HAVE_PROC:
            os.kill(pid, 0)
            return None
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "has exited"
    except OSError:
        return None   # cannot tell (permissions): the deadline still applies
    return "has exited" if state in (b"Z", b"X") else None
