"""Leaving, as the transport sees it: the farewell every rank sends when it ends, the wait for the
others' at exit (so that MPI_Finalize never waits for a rank that died), and what ranks hand
rank 0 at exit (the timeline's events). Over the control plane of ``ring.transport.mpi.control``;
``MPITransport.exits`` is one."""
from __future__ import annotations

import math
import time
from typing import Mapping

import numpy as np
from mpi4py import MPI

from ring.transport.mpi.control import AT_EXIT, EXIT_TAG, FAILED, LEFT, NOT_FINALIZING, ROOT, Control
from ring.transport.host_waits import pause, process_state

_testall = MPI.Request.Testall
_SETTLE_SECONDS = 0.02   # how long the exit barrier reads on once every rank is there (see exit_barrier)
_CLOSED_GRACE_SECONDS = 1.0   # a departed rank's connection closed this long, and no word it came: it ended


class Exits:
    """The exit protocol of one transport's ranks, over its ``control`` plane."""

    def __init__(self, control: Control):
        self.control = control
        self.kept: list = []   # messages handed at exit that did not leave in time, kept with their buffers
        self._closed_since: dict[int, float] = {}   # departed ranks on other hosts: when their connection closed

    def farewell(self, completed: int, why: str, failed: bool = False, root: bool = False,
                 finalizing: bool = True, dead: int | None = None, patience: float = 1.0,
                 sent: Mapping[int, int] | None = None) -> None:
        """Tell every other rank that this one is leaving, having completed ``completed``
        collectives, because ``why`` ("": its program ended), and whether it ``failed`` (then it is
        probably not the cause: waiting ranks name a rank that left of its own accord first),
        whether ``why`` is a ``root`` cause to pass on verbatim, whether it is ``finalizing``, and how
        many point-to-point messages it sent each rank in all (``sent``: that rank's waits go on until
        as many have been received). Waits at most
        ``patience`` seconds for the messages to leave (they are small: MPI sends them at once)."""
        flag = (FAILED if failed else 0) | (ROOT if root else 0) | (0 if finalizing else NOT_FINALIZING)
        c = self.control
        c.note_dead(dead)
        if c.liveness is not None:
            c.liveness.goodbye()
        for peer in range(c.size):
            if peer != c.rank:
                c.send(peer, LEFT, completed, why, flag=flag, dead=dead, count=(sent or {}).get(peer, 0))
        give_up = time.monotonic() + patience
        requests = [r for r, _ in c.outbox]
        while requests and not _testall(requests) and time.monotonic() < give_up:
            time.sleep(1e-3)

    def farewell_of(self, peer: int, deadline: float) -> str | None:
        """After this rank's own farewell: wait for ``peer``'s; return why it left ("": its program
        ended normally), or None if it died without one or the deadline passed."""
        c = self.control
        while peer not in c.departed:
            c.read()
            if time.monotonic() >= deadline or peer in c.dead_peers():
                c.read()
                break
            time.sleep(1e-3)
        return c.departed[peer][2] if peer in c.departed else None

    def deliver_at_exit(self, data: bytes, deadline: float) -> bool:
        """At exit, after the farewells: hand ``data`` to rank 0 if it left normally (it then
        collects, see collect_at_exit); whether it was delivered by the deadline."""
        if self.farewell_of(0, deadline) != "":
            return False
        message = np.frombuffer(data, np.uint8)
        request = self.control.comm.Isend([message, MPI.BYTE], 0, EXIT_TAG)
        while not request.Test():
            if time.monotonic() >= deadline:
                self.kept.append(([request], message))
                return False
            time.sleep(1e-3)
        return True

    def collect_at_exit(self, deadline: float) -> list[bytes | None]:
        """Rank 0 at exit, after the farewells: what every other rank that left normally handed it
        (deliver_at_exit), by rank; None for a rank that left after a failure, died, or was late."""
        comm = self.control.comm
        found: list[bytes | None] = [None] * self.control.size
        status = MPI.Status()
        for peer in range(1, self.control.size):
            if self.farewell_of(peer, deadline) != "":
                continue
            while not comm.Iprobe(peer, EXIT_TAG, status):
                if time.monotonic() >= deadline:
                    break
                time.sleep(1e-3)
            else:
                message = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                comm.Recv([message, MPI.BYTE], peer, EXIT_TAG)
                found[peer] = message.tobytes()
        return found

    def gone_at_exit(self) -> list[int]:
        """At exit: the ranks that will never call MPI_Finalize, as far as this rank knows (dead, said
        so in their farewell, or ended after their farewell: MPI_Finalize keeps a process that calls
        it until every rank has, so one that ended will not), as ``names`` gives them. An end after
        the farewell is seen by the pid on this host, and on another by the liveness connection,
        closed (a rank killed between its farewell and the exit barrier: no launcher says so under
        srun, and the others waited for it for ever)."""
        c = self.control
        c.read()
        ended = {c.names[p] for p in c.departed if self._ended(p)}
        return sorted(set(c.known_dead()) | {c.names[p] for p in c.unfinalized} | ended)

    def not_at_exit(self, gone: list[int]) -> list[int]:
        """The ranks, as ``names`` gives them, not at exit as far as this rank has read, nor ``gone``."""
        c = self.control
        return [c.names[p] for p in range(c.size) if p != c.rank and p not in c.at_exit and c.names[p] not in gone]

    def all_left_well(self) -> bool:
        """After the exit barrier: whether every other rank said in its farewell that its program
        ended normally (no failure, no reason), so that every rank can release what it shares with
        the others the healthy way (NCCL's destroy, where a failed job aborts)."""
        c = self.control
        return all(p in c.departed and not c.departed[p][0] and not c.departed[p][2]
                   for p in range(c.size) if p != c.rank)

    def _ended(self, peer: int) -> bool:
        """Whether ``peer``'s process has ended (or is ending), by its pid here; on another host, by
        its connection, closed before it came to the exit barrier (a rank that passed the barrier
        closes it on its way into MPI_Finalize), for _CLOSED_GRACE_SECONDS, in which its word that
        it came would have surfaced."""
        c = self.control
        if peer in c.local_pids:
            return process_state(c.local_pids[peer]) is not None
        if peer in c.at_exit or peer not in c.remote or c.liveness is None or not c.liveness.gone(c.names[peer]):
            return False
        seen = self._closed_since.setdefault(peer, time.monotonic())
        return time.monotonic() - seen >= _CLOSED_GRACE_SECONDS

    def await_farewells(self, seconds: float) -> None:
        """Wait up to ``seconds`` until every other rank has said farewell or is dead: a launcher may
        end the job as soon as one process ends after a death (MPICH's does), so that the ranks
        still reporting what they saw would be cut short."""
        c = self.control
        give_up = time.monotonic() + seconds
        while time.monotonic() < give_up:
            c.read()
            dead = set(c.dead_peers())
            if all(p == c.rank or p in c.departed or p in dead for p in range(c.size)):
                return
            time.sleep(5e-3)

    def exit_barrier(self, until: float = math.inf, again: bool = False) -> tuple[list[int], list[int]]:
        """At exit, before MPI_Finalize (which waits for every rank, for ever if one died): wait
        until every rank is at exit too; return ``([], [])`` then, or as soon as some rank is known
        never to finalize, ``(those ranks, the others not at exit yet)`` (see gone_at_exit), so that
        this one can leave without it; or, once ``until`` (a ``time.monotonic()`` value) passes,
        ``([], the ranks not at exit)``, as ``names`` gives them. A rank whose runtime failed waits no longer than its
        timeout: a rank stuck in its own code would otherwise hold the whole job at exit for ever.

        A barrier of control messages (each rank tells every other that it is here), not MPI's
        Ibarrier: MPI pairs collectives by their order on a communicator, and a failure can leave
        ranks out of step there. A rank that comes late to a call the others abandoned finds their
        leftover messages disagree with its own, and starts the all-gather that reports a
        disagreement, which they never join; an Ibarrier then paired with that orphan on one rank,
        which went on into MPI_Finalize while the others waited in the barrier for ever.

        ``again``: a second wait after one that returned at ``until``; the others were told already."""
        c = self.control
        for peer in range(c.size):
            if peer != c.rank and not again:
                c.send(peer, AT_EXIT, 0)
        started, everyone_since = time.monotonic(), math.inf
        while True:
            gone = self.gone_at_exit()   # (reads the control channel, so notes the others' AT_EXIT)
            if gone:
                return gone, self.not_at_exit(gone)
            now = time.monotonic()
            if len(c.at_exit) == c.size - 1 and _testall([r for r, _ in c.outbox]):
                # Every rank is here, and has this one's messages; read on a moment for a later word
                # (a rank that will not finalize after all): an arrived message can need several
                # polls to surface behind others in MPI's queue.
                everyone_since = min(everyone_since, now)
                if now - everyone_since >= _SETTLE_SECONDS:
                    return [], []
            if now >= until:
                return [], self.not_at_exit([])
            pause(now - started, 0.0, background=True)
