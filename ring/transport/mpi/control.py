"""The control plane of an MPI transport: how a rank learns that others have left or died, and
how it tells them (``ring.transport.mpi.transport.MPITransport`` holds one; the data plane never reads
its state, it asks: ``check_peers``, ``guard``).

Every rank that leaves (its program ended, raised, or was interrupted) tells every other rank
how many collectives it completed and why it left (``farewell``). A waiting rank looks at the
channel every CHECK_INTERVAL seconds (``check_peers``) and also finds peers that died without
a farewell: on this host, by their process having ended; on another, by their connection in
``ring.transport.mpi.liveness`` closing without a goodbye or going silent. The same channel answers
the roll call that names, after a timeout, which ranks are in which call, and carries what
ranks hand rank 0 at exit (the timeline's events).
"""
from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import numpy as np
from mpi4py import MPI

from ring.transport.mpi import departures, liveness as liveness_watch
from ring.transport.base import ROLL_CALL_GRACE, PeerLost, from_this_call
from ring.transport.mpi.notices import failure_notices
from ring.transport.host_waits import process_state

_CONTROL_TAG = 8
EXIT_TAG = 9    # what a rank hands rank 0 at exit, after the farewells (the timeline's events)
_testall = MPI.Request.Testall

# Control messages: kind, a flag, the dead rank a farewell passes on, a number, a count, then text.
# LEFT: "I left after completing <number> collectives, because <text>" (flag: after a failure of the
# runtime, so probably not the cause; count: point-to-point messages I sent you in all);
# ASK: "which call are you in? (I am in <number>)"; HERE: "in <number>"; AT_EXIT: "I have said every
# farewell and wait for the others before MPI_Finalize" (the exit barrier, ``ring.transport.mpi.exits``);
# GAVE_UP: "my runtime stopped after I completed <number> collectives, because <text>" (flags and the
# dead rank as a farewell's): the process lives on, and makes no further call.
_CONTROL_BYTES = 512
LEFT, _ASK, _HERE, AT_EXIT, GAVE_UP = 1, 2, 3, 4, 5
#: How many tests in a row must find nothing before a read after a pause ends: each moves one
#: arrived message of any communicator into MPICH's queues (0.1-0.4 us each; the other ranks' words
#: at their exit, a few per rank and group, come first).
DRAIN_MISSES = 64
FAILED, ROOT, NOT_FINALIZING = 1, 2, 4   # a farewell's flags
_AFTER_NOTICE_SECONDS, _AFTER_NOTICE_LOOKS = 1.0, 0.02   # see look_again_in
_FAREWELL_GRACE = 0.05   # seconds a rank that finds peers dead waits for their farewells, if any
_DEATH_GRACE = 0.5       # seconds a rank whose MPI call failed looks for a peer that died
COLLECTIVE = object()   # (check_peers: a collective is waiting, not a point-to-point call)


class Control:
    """What one transport's ranks know of each other beside the data: who left (their farewells,
    ``departed``), who died (``dead``), which call each is in (the roll call), over control
    messages on ``comm``. ``names``: how messages name each rank (world ranks); ``hosts`` and
    ``pids``: where each runs; ``liveness``: the watch over the ranks on other hosts;
    ``watch``: the control plane of another transport over the same ranks or more, which hears
    of departures for this one (the two levels of a hierarchical all-reduce).

    Every method that reads the channel takes ``seq``, the collective the caller is in (None:
    none), which is how it answers a roll call and judges a peer that left.
    """

    def __init__(self, comm: MPI.Comm, names: Sequence[int], hosts: Sequence[str], pids: Sequence[int],
                 liveness: liveness_watch.Liveness | None = None, watch: "Control | None" = None):
        self.comm, self.names, self.hosts, self.pids = comm, names, hosts, pids
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.liveness, self.watch = liveness, watch
        self.checked_notices = failure_notices()   # the launcher's notices counted at the last check_peers
        self.noticed_at = -float("inf")            # when check_peers last found a new one
        here = hosts[self.rank]
        self.local_pids = {r: pids[r] for r in range(self.size) if hosts[r] == here and r != self.rank}
        self.remote = frozenset(r for r in range(self.size) if hosts[r] != here)   # ranks on other hosts
        self.departed: dict[int, tuple[bool, int, str]] = {}   # rank -> (after a failure?, completed, why)
        self.gave_up: dict[int, tuple[bool, int, str]] = {}   # rank -> as departed: its runtime stopped (give_up)
        self.roots: set[int] = set()        # ranks whose farewell passes on a root cause (see PeerLost)
        self.dead: set[int] = set()         # ranks known dead: never sent anything again
        self.dead_names: dict[int, int] = {}   # rank -> the rank its farewell said died (as names gives it)
        self.unfinalized: set[int] = set()  # ranks whose farewell said they will not call MPI_Finalize
        #: rank -> how many point-to-point messages its farewell said it had sent this rank in all (its exit
        #: waits for every rank's farewell, moving those still on their way meanwhile)
        self.sent: dict[int, int] = {}
        self.at_exit: set[int] = set()      # ranks waiting in the exit barrier (see exits.exit_barrier)
        # Where every rank is on this host, control messages land in a receive from any rank kept
        # posted (``_incoming``): one test of it moves one arrived message and then looks, where a
        # probe looks first (see _read_locked), so one test tells what two probes did, in a third of
        # their time: every call ends with it (check_gave_up). Messages of the calls pass it by at no
        # cost that shows (measured: a small exchange took as long with it posted as without).
        # Across hosts they are probed for and received: MPICH over UCX, with ranks on this host and on
        # others, loses the matches of a receive from any rank posted to it (see ring.transport.mpi.p2p;
        # every rank of torchrun across two emulated hosts waited at exit for the others' word for ever).
        self._control_in = np.zeros(_CONTROL_BYTES, np.uint8)
        self._control_status = MPI.Status()
        self._incoming: MPI.Prequest | None = None
        if not self.remote:
            self._incoming = comm.Recv_init([self._control_in, MPI.BYTE], MPI.ANY_SOURCE, _CONTROL_TAG)
            self._incoming.Start()
        self.outbox: list = []   # control messages sent and not yet known complete, with their buffers
        self._heard: dict[int, tuple[int, str]] = {}   # roll call: rank -> the call it said it is in, its name
        self._in_call: tuple[int | None, str] = (None, "")   # the call this rank waits in, and its name
        self._asked: tuple[int, float] | None = None   # roll call: (the call, when) of the last question
        # A point-to-point wait in the program's thread may poll beside a collective in the
        # engine's: one of them at a time reads the control channel (a test of its receive, and what it took).
        self._control_lock, self._send_lock = threading.Lock(), threading.Lock()   # (give_up may come from any thread)

    def ask(self, seq: int) -> None:
        """Ask every rank which call it is in, for a roll call in call ``seq`` (see roll_call)."""
        self._heard, self._asked = {}, (seq, time.monotonic())
        if self.liveness is not None:
            self.liveness.ping()
        for peer in range(self.size):
            if peer != self.rank:
                self.send(peer, _ASK, seq)

    def answers_due(self, seq: int, now: float) -> bool:
        """Whether a roll call asked in call ``seq`` still waits for answers at ``now`` (not every rank
        has answered, and ``ROLL_CALL_GRACE`` since the question has not passed): :meth:`roll_call`
        would wait for them."""
        asked = self._asked
        return asked is not None and asked[0] == seq and now < asked[1] + ROLL_CALL_GRACE and not self.all_answered()

    def all_answered(self) -> bool:
        """Whether every other rank has answered the last roll call (or said it left; a rank that did
        both, as a late rank that completed the call and ended its program, counts once)."""
        return len(self._heard.keys() | self.departed.keys()) >= self.size - 1

    def all_here(self, seq: int, name: str) -> bool:
        """Whether every other rank has answered the roll call asked in call ``seq`` from inside that call
        (collective ``name``; "": a rank that did not say): none is absent or in another call, so the
        messages this rank waits for are coming (a rank that came late answers at its call's start,
        and sends them next)."""
        asked, heard = self._asked, self._heard
        return asked is not None and asked[0] == seq and len(heard) >= self.size - 1 \
            and all(from_this_call(answer, seq, name) for answer in heard.values())

    def roll_call(self, seq: int, grace: float = ROLL_CALL_GRACE) -> dict[int, tuple[int, str]]:
        """After a timeout in call ``seq``: which call every rank is in, ``{rank: (call, name)}`` for the
        ranks that answered within ``grace`` seconds of being asked (a rank answers while it waits
        inside a collective on this transport), ranks as ``names`` gives them. A wait of call ``seq``
        that nears its deadline asks ahead (see ``MPITransport._wait_all``), so that the answers are
        in by the time the call times out; otherwise the question goes out now.

        For example, with timeout=3: a wait asks at 2.0 s; the rank that computes elsewhere never
        answers; at 3.0 s the call times out and the roll call returns at once (2.0 + 1.0 s)."""
        if self._asked is None or self._asked[0] != seq:
            self.ask(seq)
        give_up, self._asked = self._asked[1] + grace, None
        while True:   # (reads at least once: answers to a question asked ahead may be in, unread)
            self.read(seq)
            if time.monotonic() >= give_up or self.all_answered():
                break
            time.sleep(5e-3)
        return {self.names[r]: heard for r, heard in self._heard.items()}

    def unreachable(self) -> list[int]:
        """After a roll call: the ranks (as ``names`` gives them) whose host did not acknowledge
        its ping (see ``ring.transport.mpi.liveness``); from then on they count as dead."""
        if self.liveness is None:
            return []
        self.liveness.silent()   # (counts those it finds in ``ended``)
        found = [peer for peer in range(self.size)
                 if self.liveness.ended.get(self.names[peer]) == liveness_watch.UNREACHABLE]
        self.dead.update(found)
        return [self.names[p] for p in found]

    def send(self, peer: int, kind: int, number: int, text: str = "", flag: int = 0,
             dead: int | None = None, count: int = 0) -> None:
        """Send control message ``kind`` to ``peer``, unless it is dead or will take no more (``count``: a
        farewell's point-to-point messages sent ``peer`` in all)."""
        if peer in self.dead or (peer in self.remote and self.liveness is not None
                                 and self.liveness.gone(self.names[peer])):
            return   # (over UCX, a message to a dead process crashes the sender: see Liveness.gone)
        if kind != LEFT and peer in self.unfinalized:
            return   # (it ends as soon as it has every farewell: nothing may follow ours)
        message = np.zeros(_CONTROL_BYTES, np.uint8)
        message[0] = kind
        message[1] = flag
        message[4:8] = np.frombuffer(np.int32(-1 if dead is None else dead).tobytes(), np.uint8)
        message[8:24] = np.frombuffer(np.array([number, count], np.int64).tobytes(), np.uint8)
        encoded = text.encode(errors="replace")[:_CONTROL_BYTES - 24]
        message[24:24 + len(encoded)] = np.frombuffer(encoded, np.uint8)
        with self._send_lock:
            try:
                self.outbox.append((self.comm.Isend(message, peer, _CONTROL_TAG), message))
            except MPI.Exception:
                pass   # a peer we cannot reach cannot be told either
            self.outbox = [(r, m) for r, m in self.outbox if not r.Test()]

    def give_up(self, completed: int, why: str, failed: bool = False, root: bool = False,
                dead: int | None = None) -> None:
        """Tell every other rank that this rank's runtime stopped after it completed ``completed``
        collectives on this transport's group, because of ``why`` (``failed``: another rank's failure
        caused it; ``root``: a rank died, ``dead`` as ``names`` gives it), as a farewell says: a rank that comes to a later call, even after this one's data of that
        call reached it, fails it too, instead of completing alone a call that failed here (see
        ``check_gave_up``), and a rank waiting in one fails at its next look, naming this rank."""
        for peer in range(self.size):
            if peer != self.rank:
                self.send(peer, GAVE_UP, completed, why, (FAILED if failed else 0) | (ROOT if root else 0), dead)

    def read(self, seq: int | None = None, name: str | None = None, misses: int = 2) -> None:
        """Take every control message that has arrived: note farewells, and answer roll calls with
        ``seq``, the collective this rank is in (None: in none, so it does not answer), and its
        ``name`` ("allreduce"; given once a wait, at its start, and kept for that ``seq``). Read until
        ``misses`` tests in a row find nothing (see _read_locked)."""
        if name is not None:
            self._in_call = (seq, name)
        if not self._control_lock.acquire(blocking=False):
            return   # another thread is reading them right now
        try:
            self._read_locked(seq, misses)
        finally:
            self._control_lock.release()

    def _read_locked(self, seq: int | None, enough: int = 2, arrived: bool = False) -> None:
        # MPICH moves one arrived message per test or probe (of any communicator) from shared memory
        # into its queues, and a test of the posted receive looks after that (a probe before: across
        # hosts, a message found takes one probe more): a message of this channel behind k others
        # (the data of a call, another communicator's words) lands at the (k+1)th test. While this
        # rank is in MPI the queue stays short, and two tests in a row that find nothing do; after
        # a pause in the program's own code it may be long (DRAIN_MISSES). ``arrived``: the caller's
        # own test found one, in ``_control_in`` already.
        misses = 0
        while misses < enough:
            if not (arrived or self._arrived()):
                misses += 1
                continue
            arrived, misses = False, 0
            try:
                self._take(self._control_status.Get_source(), seq)
            finally:
                if self._incoming is not None:
                    self._incoming.Start()

    def _arrived(self) -> bool:
        """Whether a control message is in ``_control_in`` now (its sender in ``_control_status``):
        the posted receive's, or one probed for and received (across hosts, or once closed)."""
        incoming = self._incoming
        if incoming is not None:
            return incoming.Test(self._control_status)
        if not self.comm.Iprobe(MPI.ANY_SOURCE, _CONTROL_TAG, self._control_status):
            return False
        self.comm.Recv(self._control_in, self._control_status.Get_source(), _CONTROL_TAG)   # (arrived: at once)
        return True

    def _take(self, peer: int, seq: int | None) -> None:
        """Note the control message in ``_control_in`` from ``peer`` (answering a roll call as in ``seq``)."""
        kind, flag = int(self._control_in[0]), int(self._control_in[1])
        number, count = np.frombuffer(self._control_in[8:24].tobytes(), np.int64).tolist()
        text = self._control_in[24:].tobytes().rstrip(b"\0").decode(errors="replace")
        if kind in (LEFT, GAVE_UP):
            if kind == LEFT:
                self.departed[peer] = (bool(flag & FAILED), number, text)
                self.sent[peer] = count   # (the last farewell's word)
            else:
                self.gave_up.setdefault(peer, (bool(flag & FAILED), number, text))
            if flag & ROOT:
                self.roots.add(peer)
            dead = int(np.frombuffer(self._control_in[4:8].tobytes(), np.int32)[0])
            if dead >= 0:
                self.dead_names[peer] = dead
                self.note_dead(dead)
            if flag & NOT_FINALIZING:
                self.unfinalized.add(peer)
        elif kind == _ASK and seq is not None:
            self.send(peer, _HERE, seq, self._in_call[1] if self._in_call[0] == seq else "")
        elif kind == _HERE:
            self._heard[peer] = (number, text)
        elif kind == AT_EXIT:
            self.at_exit.add(peer)

    def stop_listening(self) -> tuple[MPI.Prequest, np.ndarray] | None:
        """Stop listening: the posted receive and its buffer, for the transport to end as it ends its own
        requests (``MPITransport.close``, which reads what has come first: MPI would warn of a receive
        still posted at MPI_Finalize); None where none is posted (across hosts, or stopped already)."""
        with self._control_lock:
            incoming, self._incoming = self._incoming, None
        return None if incoming is None else (incoming, self._control_in)

    def check_peers(self, seq: int | None, expecting: Any = COLLECTIVE) -> None:
        """Raise PeerLost if a rank that collective ``seq`` needs is gone: it left before completing
        that call, or its process on this host ended without a word (and likewise for ``watch``).
        During a point-to-point wait (``seq`` None, ``expecting`` a set of ranks, or None for any
        rank), a departure of a rank it expects ends it, whatever that rank had completed."""
        if failure_notices() != self.checked_notices:
            self.noticed_at, self.checked_notices = time.monotonic(), failure_notices()
        if self.watch is not None:
            self.watch.check_peers(seq, COLLECTIVE)
        self.read(seq)
        self._raise_if_left(seq, expecting)
        dead = self.dead_peers()
        if dead:
            time.sleep(_FAREWELL_GRACE)   # a rank that just left after seeing a death may have said so
            self.read(seq)
            for peer in dead:
                if peer in self.roots:
                    why = self.departed[peer][2]
                    raise PeerLost(self.names[peer], why, root=why, dead=self.dead_names.get(peer))
            dead = [p for p in dead if p not in self.departed]
            if dead:
                self.dead.update(dead)
                message = self.death_text(dead)
                raise PeerLost(self.names[dead[0]], message, root=f"{message} (seen by rank {self.names[self.rank]})",
                               dead=self.names[dead[0]])
        if expecting is COLLECTIVE:
            self._raise_if_gave_up(seq)

    def check_gave_up(self, seq: int, drain: bool = False, name: str | None = None) -> None:
        """At the end of collective ``seq`` on this rank: raise PeerLost if a rank had given it up (its
        runtime stopped before completing it, or it left), so that a rank that comes late to a call the
        others timed out of fails it too, instead of completing it alone with the data they had sent.
        ``drain``: at the start of a call that came after a pause in the program's own code
        (``Call.after_a_pause``), in which the others' words may have queued up behind other messages:
        read them all (and fail before sending anything: a large call would otherwise wait to hear it),
        answering a roll call among them as in collective ``name`` (a late rank's answer, which tells the
        waiting ranks that it came to their call, not to another of the same number).
        (A rank that completes the call within a message's latency of the others' timeout may still
        succeed: no end of a call can close that window without a round of messages of its own.)"""
        if drain:   # (after a pause: every message that came meanwhile, as _read_locked says)
            self.read(seq, name, misses=DRAIN_MISSES)
        elif self._incoming is None:   # (across hosts: two probes, as _read_locked's rule; read only
            probe = self.comm.Iprobe   # where they find a message)
            if probe(MPI.ANY_SOURCE, _CONTROL_TAG) or probe(MPI.ANY_SOURCE, _CONTROL_TAG):
                self.read(seq)
        elif self._control_lock.acquire(False):   # (one test, as _read_locked's rule; all of them only
            try:                                  # where it finds a message)
                incoming = self._incoming   # (_arrived's, inline: every call's end)
                if incoming is not None and incoming.Test(self._control_status):
                    self._read_locked(seq, arrived=True)
            finally:
                self._control_lock.release()
        if self.departed or self.gave_up:
            self._raise_if_left(seq)
            self._raise_if_gave_up(seq)

    def _raise_if_left(self, seq: int | None, expecting: Any = COLLECTIVE) -> None:
        """PeerLost for a rank whose farewell says it left before collective ``seq`` (a point-to-point
        wait, ``expecting`` ranks: before this wait ended), as ``departures.first_gone`` chooses it; but
        where that rank stopped after another's failure, and a rank gave the call up on its own account
        (its program ending, say), the one that gave up: its farewell may simply not have come yet, and
        the error should name the rank that caused the others' (as ``first_gone`` prefers among farewells)."""
        if expecting is not COLLECTIVE:
            self._raise_first(self.departed, lambda rank, completed: expecting is None or rank in expecting)
            return
        counts = (lambda rank, completed: seq is not None and completed < seq)
        first = departures.first_gone(self.departed, counts)
        if first is not None and self.departed[first[0]][0]:
            self._raise_first({rank: said for rank, said in self.gave_up.items() if not said[0]}, counts, gave_up=True)
        self._raise_first(self.departed, counts)

    def _raise_if_gave_up(self, seq: int | None) -> None:
        """PeerLost for a rank whose runtime stopped before collective ``seq`` (see give_up)."""
        if seq is not None:
            self._raise_first(self.gave_up, lambda rank, completed: completed < seq, gave_up=True)

    def _raise_first(self, said: departures.Said, counts, gave_up: bool = False) -> None:
        found = departures.first_gone(said, counts)
        if found is not None:
            peer, completed, why = found   # (a root: it failed because a rank died, named as it was seen)
            raise departures.lost(self.names[peer], completed, why, gave_up, peer in self.roots,
                                  self.dead_names.get(peer) if gave_up else None)

    def look_again_in(self) -> float:
        """Seconds until a wait should look at the peers again (at most; its own interval otherwise):
        soon, for a moment after a notice. The launcher's notice comes when the dead process has
        closed its connection to it, a few milliseconds before the process has ended where
        ``dead_peers`` sees it: the look at the notice finds nobody dead yet (measured: every
        time, then 0.5 s until the next look)."""
        return _AFTER_NOTICE_LOOKS if time.monotonic() - self.noticed_at < _AFTER_NOTICE_SECONDS else float("inf")

    def guard(self, peer: int, seq: int | None) -> None:
        """Before a message to ``peer``, a rank on another host (see ``MPITransport.sending_to``):
        raise PeerLost if it is known dead or its process has ended or is ending, naming it as every
        rank should hear it (or the root cause, when a farewell gave one)."""
        if peer in self.dead or self.liveness is not None and self.liveness.gone(self.names[peer]):
            self.dead.add(peer)   # (known dead already: a wait that drained after seeing it went on to this send)
            self.check_peers(seq)
            name = self.names[peer]
            if peer in self.departed:   # it said farewell, and its process has ended since
                why = self.departed[peer][2] or "its program ended"
                raise PeerLost(name, f"rank {name} has left the runtime ({why}) and its process has ended: it "
                                     "can be sent nothing more")
            raise PeerLost(name, self.death_text([peer]))

    def death_text(self, dead: Sequence[int]) -> str:
        """What every rank should hear of the deaths of ``dead``, seen by this rank.

        >>> t = Control.__new__(Control)
        >>> t.names, t.pids, t.hosts = [0, 1, 2, 3], [10, 11, 12, 13], ["a", "a", "b", "b"]
        >>> t.liveness = None
        >>> t.death_text([3])
        "rank 3 is gone: its process (pid 13 on host b) ended without leaving the runtime (killed, or crashed outside Python's control)"
        >>> t.death_text([2, 3])
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

    def note_dead(self, name: int | None) -> None:
        """Remember that the rank ``names`` calls ``name`` died (if it is one of this transport's)."""
        if name is not None and name in self.names:
            self.dead.add(self.names.index(name))

    def dead_peers(self) -> list[int]:
        """The ranks that ended without a farewell: on this host, their process has ended (killed);
        on another, their connection closed without a goodbye, or their host went silent."""
        ended = self.liveness.check() if self.liveness is not None else {}
        return [peer for peer in range(self.size) if peer != self.rank and peer not in self.departed and
                (process_state(self.local_pids[peer]) is not None if peer in self.local_pids
                 else self.names[peer] in ended)]

    def known_dead(self) -> list[int]:
        """The ranks known dead (ended without a farewell, here or as a farewell said), as ``names`` gives them."""
        return sorted(self.names[p] for p in set(self.dead_peers()) | self.dead)

    def check_dead(self, peers: Sequence[int], seq: int | None) -> None:
        """After MPI reported an error in call ``seq`` (None: a point-to-point wait): raise PeerLost if
        one of ``peers`` (-1: any) is gone, as ``check_peers`` judges it (in a collective, a rank that
        left after completing it is not gone for it: the error is MPI's own, such as a message longer
        than posted where the check is off). A peer killed a moment ago may have closed its
        connections before its process ended: look again for up to _DEATH_GRACE seconds before
        leaving the error to MPI's words."""
        if seq is not None:
            expecting = COLLECTIVE
        else:
            expecting = {p for p in peers if p >= 0} if all(p >= 0 for p in peers) else None
        give_up = time.monotonic() + _DEATH_GRACE
        while True:
            try:
                self.check_peers(seq, expecting)
            except MPI.Exception:
                pass
            if time.monotonic() >= give_up:
                return
            time.sleep(0.02)

    def notices(self) -> int:
        return failure_notices()
